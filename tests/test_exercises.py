"""Code exercises: checkers register with the quiz engine (quizzes.exercise), which grades the
learner's function without importing any course code."""

from __future__ import annotations

import json

import pytest

import demo_checker  # registers the demo checker (lessondemo, ex_square)
import quizzes
from helpers import use_bank
from quizzes import bank as bankmod
from quizzes.bank import QuizError
from quizzes.exercise import exercise


@pytest.fixture
def quiz_progress_file(tmp_path, monkeypatch):
    path = tmp_path / "progress.json"
    monkeypatch.setenv("FSDP_COURSE_PROGRESS", str(path))
    return path


@pytest.fixture
def quiz_demo_bank(tmp_path, monkeypatch):
    """A one-exercise bank in a temporary folder, graded by demo_checker.check_square."""
    use_bank(demo_checker.BANK, tmp_path / "banks", monkeypatch)
    return "lessondemo"


def test_exercise_not_attempted(quiz_demo_bank, capsys, quiz_progress_file):
    def square(x):
        raise NotImplementedError

    r = quizzes.check_exercise(quiz_demo_bank, "ex_square", square)
    assert r.attempted is False and r.passed is False
    assert capsys.readouterr().out.startswith("not attempted yet: ex_square")
    assert not quiz_progress_file.exists()  # nothing to record yet


def test_exercise_pass_fail_and_error(quiz_demo_bank, capsys, quiz_progress_file):
    r = quizzes.check_exercise(quiz_demo_bank, "ex_square", lambda x: x * x, extra=5)
    assert r.passed and r.attempted and capsys.readouterr().out.startswith("PASS ex_square:")
    r = quizzes.check_exercise(quiz_demo_bank, "ex_square", lambda x: x + x)
    out = capsys.readouterr().out
    assert not r.passed and r.attempted and out.startswith("FAIL ex_square: square(3) returned 6")

    def broken(x):
        raise ValueError("shapes do not match\nsecond line")

    r = quizzes.check_exercise(quiz_demo_bank, "ex_square", broken)
    out = capsys.readouterr().out
    assert (
        not r.passed
        and out == "FAIL ex_square: your function raised ValueError: shapes do not match\n"
    )
    rec = json.loads(quiz_progress_file.read_text())["lessons"]["lessondemo"]["ex_square"]
    assert rec["attempts"] == 3 and rec["correct"] is True and rec["best_score"] == 1.0


def test_registered_checker_is_called_with_the_context(monkeypatch, capsys, quiz_progress_file):
    calls = []

    @exercise("lesson1", "ex_predict_bytes")
    def check_predict_bytes(learner_fn, **context):
        calls.append(context)
        return learner_fn(**context) == 16, "16 bytes per parameter"

    try:
        r = quizzes.check_exercise("lesson1", "ex_predict_bytes", lambda n: 16 * n, n=1)
        assert r.passed and calls == [{"n": 1}]
        assert "PASS ex_predict_bytes: 16 bytes per parameter" in capsys.readouterr().out
        with pytest.raises(QuizError, match="not a code exercise"):
            quizzes.check_exercise("lesson1", "q_zero_mapping", lambda: None)
    finally:
        import importlib

        import course_lab.exercises.lesson1  # put the real checker back

        importlib.reload(course_lab.exercises.lesson1)


def test_unregistered_exercise_is_one_clear_error(quiz_demo_bank, monkeypatch):
    from quizzes import exercise as exmod

    monkeypatch.delitem(exmod._CHECKERS, ("lessondemo", "ex_square"))
    with pytest.raises(QuizError, match="no checker is registered for lessondemo ex_square"):
        quizzes.check_exercise(quiz_demo_bank, "ex_square", lambda x: x * x)


def test_every_code_exercise_of_every_bank_has_a_checker():
    import course_lab.exercises  # noqa: F401 - registers every lesson's checkers
    from quizzes.exercise import registered_checker

    for lesson in bankmod.known_lessons():
        for q in bankmod.load_bank(lesson):
            if q.type == "code":
                assert callable(registered_checker(lesson, q.id)), (lesson, q.id)


def test_quiz_engine_imports_no_course_code():
    import ast
    from pathlib import Path

    for path in Path(quizzes.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                assert not name.startswith(("fsdp_course", "course_lab")), (
                    f"{path.name} imports {name}"
                )
