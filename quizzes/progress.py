"""Progress file: per question the attempts, the grader's best result, the learner's own mark
on an answer the grader was unsure of, and the last answer time; plus settings.

One way to record: ``record(lesson, Mark(qid, verdict, score, graded_by), ...)`` returns a
``Saved`` (the records, or the one-line reason they could not be saved: ``saved.line(lang)``).

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
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .bank import LANGS, QuizError
from .i18n import msg

ENV = "FSDP_COURSE_PROGRESS"
VERDICTS = ("correct", "wrong", "unsure")  # as grading.Result.verdict
GRADED_BY = ("grader", "self")
VERSION = 1
# Every key is optional; "verdict", "graded_by" and "self_correct" came later (a record without
# them was graded by the grader, which is how a file from before them reads).
RECORD_KEYS = {
    "attempts": int,
    "best_score": (int, float),
    "correct": bool,
    "last_answered": str,
    "verdict": str,
    "graded_by": str,
    "self_correct": bool,
}


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
                if key in rec and (
                    not isinstance(value, kind) or (kind is int and isinstance(value, bool))
                ):
                    return f"{name}.{qid}.{key} is {json.dumps(value)}, not a {key} value"
            for key, allowed in (("verdict", VERDICTS), ("graded_by", GRADED_BY)):
                if key in rec and rec[key] not in allowed:
                    return (
                        f"{name}.{qid}.{key} is {json.dumps(rec[key])}, "
                        f"not one of {', '.join(allowed)}"
                    )
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
        raise ProgressError(
            f"progress file {path} is unreadable ({reason}) and could not be moved "
            f"aside ({exc.strerror or exc}); fix or remove it"
        ) from None
    _say(
        f"quizzes: progress file {path} was unreadable ({reason}); "
        f"moved it to {target} and started fresh"
    )
    return target


def _read(path: Path) -> dict:
    """The progress data at `path` (caller holds the lock when it will write back)."""
    if path.is_dir():
        raise ProgressError(
            f"progress path {path} is a folder, not a file; set {ENV} to a file path"
        )
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
        raise ProgressError(
            f"progress file {path} was written by a newer version of the course "
            f"(version {data['version']}, this one reads {VERSION}); not reading or changing it"
        )
    if problem:
        _move_aside(path, problem)
        return fresh()
    data.setdefault("version", VERSION)
    data.setdefault("settings", {})
    data.setdefault("lessons", {})
    lang = data["settings"].get("lang")
    if lang is not None and lang not in LANGS:
        _say_once(
            f"quizzes: progress file {path}: settings.lang {lang!r} is not a language of this "
            f"course ({', '.join(LANGS)}); ignoring it"
        )
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
        raise ProgressError(
            f"cannot save progress in {path.parent}: {exc.strerror or exc}"
        ) from None
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
        raise ProgressError(
            f"cannot save progress in {path.parent}: {exc.strerror or exc}"
        ) from None
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


@dataclass(frozen=True)
class Mark:
    """One result to record.

    graded_by "grader": an attempt the grader judged (verdict correct / wrong / unsure); it
    counts an attempt and keeps the best score. graded_by "self": the learner's own mark on their
    last answer, made against the key-idea checklist after an "unsure" (verdict correct or
    wrong); it counts no new attempt and leaves the machine's score alone."""

    qid: str
    verdict: str
    score: float = 0.0
    graded_by: str = "grader"

    def __post_init__(self):
        if self.graded_by not in GRADED_BY:
            raise ValueError(f"graded_by must be one of {GRADED_BY}, got {self.graded_by!r}")
        allowed = (
            ("correct", "wrong") if self.graded_by == "self" else ("correct", "wrong", "unsure")
        )
        if self.verdict not in allowed:
            raise ValueError(
                f"a {self.graded_by} mark's verdict is one of {allowed}, got {self.verdict!r}"
            )

    @classmethod
    def of(cls, qid: str, result) -> Mark:
        """The grader's mark for a grading.Result (or anything with .verdict and .score)."""
        return cls(qid, result.verdict, float(result.score))


@dataclass
class Saved:
    """What record() did: the question records as saved, or the one-line reason nothing was."""

    records: dict = field(default_factory=dict)
    problem: str | None = None  # ProgressError's text, English

    @property
    def ok(self) -> bool:
        return self.problem is None

    def line(self, lang: str = "en") -> str:
        """The status line for the learner: empty when saved, else "progress not recorded: why"."""
        return "" if self.ok else msg("not_recorded", lang, why=self.problem)


def _apply(data: dict, lesson: str, mark: Mark, when: str) -> dict:
    rec = (
        data["lessons"]
        .setdefault(lesson, {})
        .setdefault(mark.qid, {"attempts": 0, "best_score": 0.0, "correct": False})
    )
    if mark.graded_by == "grader":
        rec["attempts"] = int(rec.get("attempts", 0)) + 1
        rec["best_score"] = max(float(rec.get("best_score", 0.0)), float(mark.score))
        rec["correct"] = bool(rec.get("correct")) or mark.verdict == "correct"
    else:
        rec["attempts"] = max(int(rec.get("attempts", 0)), 1)
        rec["self_correct"] = mark.verdict == "correct"  # the learner may revise their own mark
    rec["verdict"], rec["graded_by"] = mark.verdict, mark.graded_by
    rec["last_answered"] = when
    return rec


def record(lesson: str, *marks: Mark) -> Saved:
    """Record marks of one lesson in one locked write. Never raises for the file: a learner's
    result is shown whether or not it could be saved, so the caller shows Saved.line(lang)."""
    if not all(isinstance(m, Mark) for m in marks):
        raise TypeError(
            "progress.record(lesson, Mark(qid, verdict, score), ...): every result is a Mark"
        )
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        data = update(lambda d: [_apply(d, lesson, m, when) for m in marks])
    except ProgressError as exc:
        return Saved(problem=str(exc))
    return Saved(records={m.qid: data["lessons"][lesson][m.qid] for m in marks})


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
    """Over the given question ids: answered, correct (graded correct by the quiz at least once),
    self_assessed (never graded correct, marked right by the learner against the key ideas),
    score (sum of the grader's best scores) and total."""
    qids = list(qids)
    recs = _load_quietly()["lessons"].get(lesson, {})
    got = [recs[q] for q in qids if q in recs]
    return {
        "answered": len(got),
        "correct": sum(1 for r in got if r.get("correct")),
        "self_assessed": sum(1 for r in got if not r.get("correct") and r.get("self_correct")),
        "score": sum(float(r.get("best_score", 0)) for r in got),
        "total": len(qids),
    }
