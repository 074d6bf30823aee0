"""Progress file: best result, attempts and last answer time per question, plus settings.

Location: $FSDP_COURSE_PROGRESS, else ~/.fsdp_course/progress.json. Writes are atomic (temp
file in the same folder, then os.replace) so a crash never leaves half a file. A file that is
not valid JSON or not the expected shape is moved aside, never overwritten: the learner keeps
it and is told where it went.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ENV = "FSDP_COURSE_PROGRESS"
VERSION = 1


def progress_path() -> Path:
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else Path.home() / ".fsdp_course" / "progress.json"


def fresh() -> dict:
    return {"version": VERSION, "settings": {}, "lessons": {}}


def _shape_problem(data) -> str | None:
    if not isinstance(data, dict):
        return "top level is not an object"
    if not isinstance(data.get("settings", {}), dict):
        return "'settings' is not an object"
    lessons = data.get("lessons", {})
    if not isinstance(lessons, dict):
        return "'lessons' is not an object"
    for name, qs in lessons.items():
        if not isinstance(qs, dict) or not all(isinstance(v, dict) for v in qs.values()):
            return f"lesson {name!r} is not an object of question records"
    return None


def _move_aside(path: Path, reason: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():  # two corrupt files in the same second must not overwrite each other
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    os.replace(path, target)
    print(f"quizzes: progress file {path} was unreadable ({reason}); moved it to {target} "
          "and started fresh", file=sys.stderr)
    return target


def load() -> dict:
    """The progress data; a missing file is a fresh start, a corrupt one is moved aside."""
    path = progress_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return fresh()
    try:
        data = json.loads(text)
        problem = _shape_problem(data)
    except ValueError as exc:
        problem = f"bad JSON: {exc}"
    if problem:
        _move_aside(path, problem)
        return fresh()
    data.setdefault("version", VERSION)
    data.setdefault("settings", {})
    data.setdefault("lessons", {})
    return data


def save(data: dict) -> None:
    path = progress_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # leave no temp file behind, whatever went wrong
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def record(lesson: str, qid: str, score: float, correct: bool) -> dict:
    """Count one attempt; keep the best score. Returns the question's record."""
    data = load()
    rec = data["lessons"].setdefault(lesson, {}).setdefault(qid, {"attempts": 0, "best_score": 0.0,
                                                                  "correct": False})
    rec["attempts"] = int(rec.get("attempts", 0)) + 1
    rec["best_score"] = max(float(rec.get("best_score", 0.0)), float(score))
    rec["correct"] = bool(rec.get("correct")) or bool(correct)
    rec["last_answered"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    save(data)
    return rec


def get_setting(name: str, default=None):
    return load()["settings"].get(name, default)


def set_setting(name: str, value) -> None:
    data = load()
    data["settings"][name] = value
    save(data)


def lesson_summary(lesson: str, qids) -> dict:
    """answered / correct / best-score sum over the given question ids."""
    qids = list(qids)
    recs = load()["lessons"].get(lesson, {})
    got = [recs[q] for q in qids if q in recs]
    return {"answered": len(got), "correct": sum(1 for r in got if r.get("correct")),
            "score": sum(float(r.get("best_score", 0)) for r in got), "total": len(qids)}
