"""Quiz engine of the fsdp-course: banks per lesson, one grader for notebook, terminal and tests.

Used as:

    quizzes.show("lesson1")                                  # ipywidgets quiz in a notebook
    quizzes.grade("lesson1", "q_zero_mapping", "b")          # -> Result(correct, score, feedback)
    quizzes.check_exercise("lesson1", "ex_predict_bytes", predict_bytes, **context)
    python -m quizzes --help                                 # the terminal version
"""

from .bank import Bank, Question, QuizError, known_lessons, load_bank
from .exercise import check_exercise
from .grading import Result, grade


def show(lesson, lang=None):
    """Display the quiz of `lesson` (imports ipywidgets only when a quiz is shown)."""
    from .widget import show as _show

    return _show(lesson, lang)


__all__ = [
    "Bank",
    "Question",
    "QuizError",
    "Result",
    "check_exercise",
    "grade",
    "known_lessons",
    "load_bank",
    "show",
]
