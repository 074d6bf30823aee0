"""Code exercises: grade the learner's function with the checker registered for it.

The quiz engine knows no lesson code. A checker registers itself where it is written:

    from quizzes.exercise import exercise

    @exercise("lesson1", "ex_predict_bytes")
    def check_predict_bytes(learner_fn, cases) -> tuple[bool, str]: ...

and a notebook, after importing the module that holds it, grades with
``quizzes.check_exercise("lesson1", "ex_predict_bytes", predict_bytes, cases=cases)``.

The notebook must run top to bottom even while exercises are untouched, so nothing here raises
for the learner's own mistakes: an untouched exercise says "not attempted yet", an exception in
the learner's code is one FAIL line, not a traceback wall.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable

from . import progress
from .bank import QuizError, load_bank, normalise_lesson
from .grading import Result

# (lesson, question id) -> checker(learner_fn, **context) -> (passed, message)
_CHECKERS: dict[tuple[str, str], Callable] = {}


def exercise(lesson, qid: str):
    """Register the decorated function as the checker of code exercise ``qid`` of ``lesson``.
    The function itself is returned unchanged (tests may call it directly)."""

    def register(checker: Callable) -> Callable:
        _CHECKERS[(normalise_lesson(lesson), qid)] = checker
        return checker

    return register


def registered_checker(lesson, qid: str) -> Callable:
    key = (normalise_lesson(lesson), qid)
    try:
        return _CHECKERS[key]
    except KeyError:
        raise QuizError(
            f"no checker is registered for {key[0]} {qid}: import the module that "
            "defines it (the lesson's exercise checkers) before grading"
        ) from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _raised_in(fn, exc: BaseException) -> bool:
    """Did the exception pass through the learner's function (rather than the checker's code)?"""
    code = getattr(fn, "__code__", None)
    return code is not None and any(
        f.f_code is code for f, _ in traceback.walk_tb(exc.__traceback__)
    )


def check_exercise(lesson, qid: str, learner_fn, **context) -> Result:
    """Grade a code exercise: prints one PASS / FAIL / 'not attempted yet' line and returns a
    Result (.passed, .attempted). `context` is passed on to the checker."""
    bank = load_bank(lesson)
    q = bank.question(qid)
    if q.type != "code":
        raise QuizError(
            f"{qid} is a {q.type} question, not a code exercise: use quizzes.grade(...)"
        )
    checker = registered_checker(bank.lesson, qid)
    try:
        outcome = checker(learner_fn, **context)
    except NotImplementedError as exc:
        how = str(exc).strip() or (
            "replace the `raise NotImplementedError` in the exercise "
            "cell with your code, then run this cell again"
        )
        message = f"not attempted yet: {qid} ({how})"
        print(message)
        return Result(False, 0.0, message, {}, bank.lesson, qid, attempted=False, printed=True)
    except Exception as exc:  # the learner's bug (or the checker's): one line, never a wall
        who = "your function raised" if _raised_in(learner_fn, exc) else "the checker failed with"
        passed, message = False, f"{who} {_one_line(exc)}"
    else:
        if not (isinstance(outcome, tuple) and len(outcome) == 2):
            raise QuizError(
                f"checker {checker.__module__}.{checker.__name__} must return "
                f"(passed, message), got {outcome!r}"
            )
        passed, message = bool(outcome[0]), str(outcome[1])
    line = f"{'PASS' if passed else 'FAIL'} {qid}: {message}"
    print(line)
    saved = progress.record(
        bank.lesson, progress.Mark(qid, "correct" if passed else "wrong", 1.0 if passed else 0.0)
    )
    if not saved.ok:  # the verdict above stands; say once why it is not kept
        print(f"quizzes: {saved.line()}", file=sys.stderr)
    return Result(
        passed, 1.0 if passed else 0.0, line, {"message": message}, bank.lesson, qid, printed=True
    )
