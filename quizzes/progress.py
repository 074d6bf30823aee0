"""Progress file: best result, attempts and last answer time per question, plus settings.

Location: $FSDP_COURSE_PROGRESS, else ~/.fsdp_course/progress.json.

- Every change is read-modify-write under an exclusive lock (``progress.json.lock`` next to it),
  so concurrent writers (20 `grade --record` at once, a notebook and a terminal) lose nothing.
- Writes are atomic (temp file in the same folder, then os.replace): a crash never leaves half a
  file, and a temp file left by a killed writer is removed by the next writer (under the lock,
  any temp file is a dead writer's).
- A file that is not valid UTF-8 JSON of the expected shape is moved aside, never overwritten:
  the learner keeps it and is told where it went (one line on stderr).
- A file written by a newer version of the course is refused, not rewritten.
- Anything that stops progress from being read or saved (a folder at the path, no permission)
  is a ProgressError: one line, and callers still show the results they could not record.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from .bank import LANGS, QuizError

ENV = "FSDP_COURSE_PROGRESS"
VERSION = 1
RECORD_KEYS = {"attempts": int, "best_score": (int, float), "correct": bool, "last_answered": str}


class ProgressError(QuizError):
    """Progress cannot be read or saved; the message is one line that says where and why."""


def progress_path() -> Path:
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else Path.home() / ".fsdp_course" / "progress.json"


def fresh() -> dict:
    return {"version": VERSION, "settings": {}, "lessons": {}}


def _say(line: str) -> None:
    os.write(2, (line + "\n").encode())  # one write per line: several processes share stderr


_warned: set = set()


def _say_once(line: str) -> None:
    if line not in _warned:
        _warned.add(line)
        _say(line)


def _shape_problem(data) -> str | None:
    if not isinstance(data, dict):
        return "top level is not an object"
    if not isinstance(data.get("version", VERSION), int) or isinstance(data.get("version"), bool):
        return "'version' is not an integer"
    if not isinstance(data.get("settings", {}), dict):
        return "'settings' is not an object"
    lessons = data.get("lessons", {})
    if not isinstance(lessons, dict):
        return "'lessons' is not an object"
    for name, qs in lessons.items():
        if not isinstance(qs, dict):
            return f"lesson {name!r} is not an object of question records"
        for qid, rec in qs.items():
            if not isinstance(rec, dict):
                return f"{name}.{qid} is not a record"
            for key, kind in RECORD_KEYS.items():
                value = rec.get(key)
                if key in rec and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                    return f"{name}.{qid}.{key} is {json.dumps(value)}, not a {key} value"
    return None


def _move_aside(path: Path, reason: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():  # two corrupt files in the same second must not overwrite each other
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    try:
        os.replace(path, target)
    except OSError as exc:
        raise ProgressError(f"progress file {path} is unreadable ({reason}) and could not be moved "
                            f"aside ({exc.strerror or exc}); fix or remove it") from None
    _say(f"quizzes: progress file {path} was unreadable ({reason}); moved it to {target} and started fresh")
    return target


def _read(path: Path) -> dict:
    """The progress data at `path` (caller holds the lock when it will write back)."""
    if path.is_dir():
        raise ProgressError(f"progress path {path} is a folder, not a file; set {ENV} to a file path")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return fresh()
    except OSError as exc:
        raise ProgressError(f"cannot read progress file {path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(raw.decode("utf-8"))
        problem = _shape_problem(data)
    except UnicodeDecodeError:
        problem = "not UTF-8 text"
    except (ValueError, RecursionError) as exc:
        problem = f"bad JSON: {str(exc)[:80]}"
    if not problem and data.get("version", VERSION) > VERSION:
        raise ProgressError(f"progress file {path} was written by a newer version of the course "
                            f"(version {data['version']}, this one reads {VERSION}); not reading or changing it")
    if problem:
        _move_aside(path, problem)
        return fresh()
    data.setdefault("version", VERSION)
    data.setdefault("settings", {})
    data.setdefault("lessons", {})
    lang = data["settings"].get("lang")
    if lang is not None and lang not in LANGS:
        _say_once(f"quizzes: progress file {path}: settings.lang {lang!r} is not a language of this "
                  f"course ({', '.join(LANGS)}); ignoring it")
        del data["settings"]["lang"]
    return data


def load() -> dict:
    """The progress data; a missing file is a fresh start, a corrupt one is moved aside.
    ProgressError when the file cannot be used (a folder, no permission, a newer version)."""
    path = progress_path()
    with _locked(path, create=False):
        return _read(path)


@contextlib.contextmanager
def _locked(path: Path, create: bool = True):
    """Exclusive lock on <path>.lock. Readers that will not write (create=False) skip the lock
    when the folder does not exist yet or cannot be written: there is nothing to protect."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        if create:
            path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if not create:
            yield
            return
        raise ProgressError(f"cannot save progress in {path.parent}: {exc.strerror or exc}") from None
    try:
        _lock_fd(fd)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _lock_fd(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: msvcrt locks a byte range; retry until the holder is done
        import msvcrt
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
                return
            except OSError:
                time.sleep(0.05)
    fcntl.flock(fd, fcntl.LOCK_EX)


def _remove_stale_temps(path: Path) -> None:
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def _write(path: Path, data: dict) -> None:
    """Atomic write; caller holds the lock."""
    _remove_stale_temps(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ProgressError(f"cannot save progress in {path.parent}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # leave no temp file behind, whatever went wrong
        if isinstance(exc, OSError):
            raise ProgressError(f"cannot save progress to {path}: {exc.strerror or exc}") from None
        raise


def update(change) -> dict:
    """Apply change(data) under the lock and save; returns the data. ProgressError on failure."""
    path = progress_path()
    with _locked(path):
        data = _read(path)
        change(data)
        _write(path, data)
    return data


def save(data: dict) -> None:
    """Replace the whole file (under the lock)."""
    path = progress_path()
    with _locked(path):
        _write(path, data)


def _count(data: dict, lesson: str, qid: str, score: float, correct: bool) -> dict:
    rec = data["lessons"].setdefault(lesson, {}).setdefault(qid, {"attempts": 0, "best_score": 0.0,
                                                                  "correct": False})
    rec["attempts"] = int(rec.get("attempts", 0)) + 1
    rec["best_score"] = max(float(rec.get("best_score", 0.0)), float(score))
    rec["correct"] = bool(rec.get("correct")) or bool(correct)
    rec["last_answered"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return rec


def record(lesson: str, qid: str, score: float, correct: bool) -> dict | None:
    """Count one attempt; keep the best score. Returns the question's record, or None after one
    line on stderr when it cannot be saved: a learner's result is never lost to a traceback."""
    problem = try_record(lesson, qid, score, correct)
    if problem:
        _say(f"quizzes: {problem}")
        return None
    return _last_record


def record_strict(lesson: str, qid: str, score: float, correct: bool) -> dict:
    """record(), raising ProgressError when it cannot be saved."""
    data = update(lambda d: _count(d, lesson, qid, score, correct))
    return data["lessons"][lesson][qid]


def record_many(lesson: str, results) -> None:
    """Record [(qid, score, correct)] in one locked write (an answers file graded at once)."""
    results = list(results)
    update(lambda d: [_count(d, lesson, qid, score, correct) for qid, score, correct in results])


_last_record = None


def try_record(lesson: str, qid: str, score: float, correct: bool) -> str | None:
    """Record, or return the one-line reason it could not (the caller shows the result anyway)."""
    global _last_record
    try:
        _last_record = record_strict(lesson, qid, score, correct)
    except ProgressError as exc:
        return f"progress not recorded: {exc}"
    return None


def _load_quietly() -> dict:
    """For read-only views (list, progress, the course home, the quiz's language): the data, or
    an empty one after saying once why the file cannot be read."""
    try:
        return load()
    except ProgressError as exc:
        _say_once(f"quizzes: {exc}")
        return fresh()


def get_setting(name: str, default=None):
    return _load_quietly()["settings"].get(name, default)


def set_setting(name: str, value) -> None:
    update(lambda d: d["settings"].__setitem__(name, value))


def lesson_summary(lesson: str, qids) -> dict:
    """answered / correct / best-score sum over the given question ids."""
    qids = list(qids)
    recs = _load_quietly()["lessons"].get(lesson, {})
    got = [recs[q] for q in qids if q in recs]
    return {"answered": len(got), "correct": sum(1 for r in got if r.get("correct")),
            "score": sum(float(r.get("best_score", 0)) for r in got), "total": len(qids)}
