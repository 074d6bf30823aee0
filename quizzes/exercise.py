"""Code exercises: run the checker named in the bank against the learner's function.

The notebook must run top to bottom even while exercises are untouched, so nothing here raises
for the learner's own mistakes: an untouched exercise says "not attempted yet", an exception in
the learner's code is one FAIL line, not a traceback wall.
"""
from __future__ import annotations

import importlib
import traceback

from . import progress
from .bank import QuizError, load_bank
from .grading import Result


def load_checker(path: str):
    module_name, _, func_name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
        return getattr(module, func_name)
    except (ImportError, AttributeError) as exc:
        raise QuizError(f"cannot load checker {path!r}: {exc}") from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _raised_in(fn, exc: BaseException) -> bool:
    """Did the exception pass through the learner's function (rather than the checker's code)?"""
    code = getattr(fn, "__code__", None)
    return code is not None and any(f.f_code is code for f, _ in traceback.walk_tb(exc.__traceback__))


def check_exercise(lesson, qid: str, learner_fn, **context) -> Result:
    """Grade a code exercise: prints one PASS / FAIL / 'not attempted yet' line and returns a
    Result (.passed, .attempted). `context` is passed on to the checker."""
    bank = load_bank(lesson)
    q = bank.question(qid)
    if q.type != "code":
        raise QuizError(f"{qid} is a {q.type} question, not a code exercise: use quizzes.grade(...)")
    checker = load_checker(q.secret["checker"])
    try:
        outcome = checker(learner_fn, **context)
    except NotImplementedError:
        message = (f"not attempted yet: {qid} (replace the `raise NotImplementedError` in the "
                   "exercise cell with your code, then run this cell again)")
        print(message)
        return Result(False, 0.0, message, {}, bank.lesson, qid, attempted=False, printed=True)
    except Exception as exc:  # the learner's bug (or the checker's): one line, never a wall
        who = "your function raised" if _raised_in(learner_fn, exc) else "the checker failed with"
        passed, message = False, f"{who} {_one_line(exc)}"
    else:
        if not (isinstance(outcome, tuple) and len(outcome) == 2):
            raise QuizError(f"checker {q.secret['checker']} must return (passed, message), got {outcome!r}")
        passed, message = bool(outcome[0]), str(outcome[1])
    line = f"{'PASS' if passed else 'FAIL'} {qid}: {message}"
    print(line)
    progress.record(bank.lesson, qid, 1.0 if passed else 0.0, passed)
    return Result(passed, 1.0 if passed else 0.0, line, {"message": message}, bank.lesson, qid,
                  printed=True)
