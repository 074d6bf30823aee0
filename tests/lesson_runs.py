"""Run a lesson script under torchrun through its launcher and return its metrics (for tests).

A thin wrapper over ``course_lab.notebook.launch_lesson``, the one way the course runs a
lesson from Python: ``launch(1, "two_ranks")`` runs the launch lessons/01_*/launches.toml
declares, the one the notebook runs (within a test run they share it: tests/run_cache.py);
``launch(1, "--strategy", "HYBRID_SHARD", nproc=2)`` runs a test's own flags.
"""

from __future__ import annotations

from course_lab.notebook import LessonRun, launch_lesson


def launch(
    lesson: int,
    *args,
    nproc: int | None = None,
    env: dict | None = None,
    timeout: int = 600,
    **fill,
) -> tuple[LessonRun, dict | None]:
    """``NPROC=nproc bash launch/lessonN.sh args``; returns (finished run, metrics or None).
    ``args``: a declared launch's name (``fill`` fills its placeholders), or flags (``nproc``
    defaults to 2)."""
    run = launch_lesson(lesson, *args, nproc=nproc, env=env, timeout=timeout, **fill)
    return run, run.metrics


def ok(run) -> None:
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
