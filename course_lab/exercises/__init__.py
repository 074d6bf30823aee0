"""Checkers for the notebooks' exercises, one module per lesson.

Each checker is called by ``quizzes.check_exercise`` as ``checker(learner_fn, **context)`` and
returns ``(passed, message)``; the message says why an answer is wrong, not only that it is.
"""

from fsdp_course.exercises.lesson1 import check_predict_bytes

__all__ = ["check_predict_bytes"]
