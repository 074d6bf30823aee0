"""A tiny checker for the quiz engine's own tests (tests/test_exercises.py), and a template.

A checker is called as checker(learner_fn, **context) and returns (passed, message). It lets
NotImplementedError from the learner's function propagate: that is how "not attempted yet" is
detected. The course's real checkers live with the notebooks, in course_lab/exercises/.
"""

from quizzes.exercise import exercise

# The bank its exercise belongs to, in the plain form ``python -m quizzes unseal`` prints
# (helpers.use_bank seals it into a temporary bank folder).
BANK = {
    "lesson": "lessondemo",
    "title": {"en": "Demo", "zh": "演示"},
    "questions": [
        {
            "id": "ex_square",
            "type": "code",
            "prompt": {"en": "Write square(x).", "zh": "编写 square(x)。"},
            "secret": {},
        }
    ],
}


@exercise("lessondemo", "ex_square")
def check_square(learner_fn, **context):
    """Demo exercise: learner_fn(x) must return x * x."""
    for x in (0, 3, -2, context.get("extra", 7)):
        got = learner_fn(x)
        if got != x * x:
            return False, f"square({x}) returned {got!r}, expected {x * x}"
    return True, "square() is right for 0, 3, -2 and 7"
