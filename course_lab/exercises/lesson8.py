"""Lesson 8 exercise: a broken job to diagnose and fix.

``lessons/08_troubleshooting/broken_evaluate.py`` is an ``evaluate(model, batch, env)`` that breaks
the training job it is plugged into (it hangs or fails: the learner finds out which, and why,
with the lesson's tools) and the learner writes a fixed one. The checker runs it for real:
``bash launch/lesson8.sh --steps 4 --eval-module FILE`` on 2 ranks, with a short collective
timeout so that a job that still hangs fails within seconds. It passes when the job finishes
and the held-out loss ``evaluate`` returned on rank 0 equals the loss one process computes on
the whole global held-out batch from the same weights.
"""

from __future__ import annotations

import re

from course_lab.learner import save_cell, untouched
from quizzes.exercise import exercise


def _what_failed(output: str) -> str:
    errors = [line for line in output.splitlines() if re.search(r"error: |PROBLEM|Traceback", line)]
    return (errors[0] if errors else (output.strip().splitlines() or ["no output"])[-1])[:300]


@exercise("lesson8", "ex_fix_the_job")
def check_fix_the_job(
    evaluate,
    nproc: int = 2,
    steps: int = 4,
    timeout_s: int = 10,
    tolerance: float = 1e-5,
    launch=None,
) -> tuple[bool, str]:
    """The job with ``evaluate`` plugged in must finish, and ``evaluate`` must return the
    global held-out loss (within ``tolerance``) on rank 0."""
    if not callable(evaluate):
        return False, "evaluate must be a function evaluate(model, batch, env)"
    if untouched(evaluate, 3):
        raise NotImplementedError
    if launch is None:
        from course_lab.notebook import launch_lesson as launch
    run = launch(
        8,
        "--steps",
        str(steps),
        "--log-every",
        str(steps),
        "--eval-module",
        str(save_cell(evaluate, "evaluate")),
        nproc=nproc,
        env={"COURSE_TIMEOUT_S": str(timeout_s)},
        timeout=300,
    )
    if run.returncode != 0 or run.metrics is None:
        return False, (
            f"the job still fails (exit {run.returncode}): {_what_failed(run.stdout)}. "
            "Which collective was each rank in when it stopped?"
        )
    result = run.metrics["results"]["eval"]
    value, reference = result["value"], result["reference"]
    if value is None:
        return False, (
            "the job finished, but evaluate returned None on rank 0: it must return the "
            "held-out loss"
        )
    try:
        value = float(value)
    except (TypeError, ValueError):
        return False, f"evaluate returned {value!r} on rank 0, not a number"
    if abs(value - reference) > tolerance:
        return False, (
            f"the job finished, but the held-out loss is {value:.6f} where one process on "
            f"the global held-out batch gets {reference:.6f}: every rank holds only its "
            "own rows; combine them across ranks"
        )
    return True, (
        f"the job finished on {run.metrics['world_size']} ranks and the held-out loss "
        f"{value:.6f} equals one process on the global batch ({reference:.6f})"
    )
