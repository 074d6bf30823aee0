"""Lesson 6 exercise: find the silent bug in a training loop, fix it.

The notebook's exercise cell holds ``lessons/06_silent_bugs/mystery_loop.py`` (a loop moved from
DDP to FSDP2, with one silent bug). The learner finds the bug with the lesson's detector
(``inspect(where, model)``) and fixes it. The checker saves the cell to a file named by its text
(the same loop, from a cell or a file, is the same launch: a test run starts it once), runs it
for real under torchrun (``bash launch/lesson6.sh --parts exercise --exercise FILE``) and
compares the trained model with one process trained on the global batch.
"""

from __future__ import annotations

from pathlib import Path

from course_lab.learner import cell_source, save_cell
from quizzes.exercise import exercise

REPO = Path(__file__).resolve().parents[2]
MYSTERY = REPO / "lessons" / "06_silent_bugs" / "mystery_loop.py"


def _normalised(source: str) -> list[str]:
    return [line.rstrip() for line in source.strip().splitlines() if line.strip()]


@exercise("lesson6", "ex_find_the_bug")
def check_find_the_bug(train, nproc: int = 2, steps: int = 6, run=None) -> tuple[bool, str]:
    """``train(env, batches, steps, seed, inspect)`` must train the model one process would
    train on the global batch (every parameter within the script's tolerance)."""
    source = cell_source(train)
    if _normalised(source) == _normalised(MYSTERY.read_text()):
        # the loop exactly as given: not attempted yet
        raise NotImplementedError(
            "the loop is still exactly as given: find the bug with inspect(), "
            "fix it in the cell, then run this check again"
        )
    from course_lab.notebook import run_lesson

    run = run or run_lesson
    path = save_cell(train, "train")
    try:
        metrics = run(
            6,
            "--parts",
            "exercise",
            "--exercise",
            str(path),
            "--steps",
            str(steps),
            nproc=nproc,
            echo=False,
        )
    except RuntimeError as exc:  # run_lesson: the script exited non-zero; exc has its tail
        tail = " | ".join(line for line in str(exc).strip().splitlines()[-3:] if line.strip())
        return False, f"your loop failed under torchrun: {tail}"
    result = metrics["results"]["exercise"]
    seen = "; ".join(
        f"inspect({f['where']!r}): {len(f['differ'])} of {f['checked']} unsharded tensors "
        f"differ across ranks"
        for f in result["findings"]
    )
    if not result["matches_reference"]:
        return False, (
            f"after {result['steps']} steps on {metrics['world_size']} ranks your model differs "
            f"from one process on the global batch by up to {result['param_diff']:.3g} "
            f"(tolerance {result['tolerance']:g}). "
            + (
                f"What inspect saw: {seen}."
                if seen
                else "Call inspect(where, model) in your loop to look (e.g. before fully_shard)."
            )
        )
    return True, (
        f"after {result['steps']} steps on {metrics['world_size']} ranks your model equals one "
        f"process on the global batch (max difference {result['param_diff']:.1e})"
        + (f"; {seen}" if seen else "")
    )
