"""Run a lesson script under torchrun through its launcher and return its metrics (for tests).

A thin wrapper over ``course_lab.notebook.launch_lesson``, the one way the course runs a
lesson from Python; within a test run, the same launch (lesson, flags, NPROC, environment) is
shared with the notebook's test (see tests/conftest.py).
"""

from __future__ import annotations

from course_lab.notebook import LessonRun, launch_lesson


def launch(
    lesson: int, *args, nproc: int = 2, tmp=None, env: dict | None = None, timeout: int = 600
) -> tuple[LessonRun, dict | None]:
    """``NPROC=nproc bash launch/lessonN.sh args``; returns (finished run, metrics or None).
    ``tmp`` is accepted for older callers and unused: the metrics file lives in a temporary
    folder of its own."""
    run = launch_lesson(lesson, *args, nproc=nproc, env=env, timeout=timeout)
    return run, run.metrics


def ok(run) -> None:
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
