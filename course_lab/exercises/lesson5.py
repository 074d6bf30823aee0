"""Lesson 5 exercise: lesson 1's FULL_SHARD on FSDP2, minus the all-gather it wastes.

The learner writes ``shard(model, mesh)`` in a notebook cell. The checker saves that cell to a
file, runs it for real under torchrun (``bash launch/lesson5.sh --shard-module FILE``) with the
flags of the notebook's main launch, and compares what the script measured with that launch:
one FSDP2 unit per block plus the root, ``Shard(0)`` placements, classic FULL_SHARD's losses,
all-gather bytes per step equal to the goal, and a peak of gathered parameters no higher than
FSDP2's default run.

The goal, in bytes: every unit is gathered once in forward; in backward every block is gathered
again except the last one, which backward needs first, and the root, which FULL_SHARD never
frees (``theory.fsdp2.collective_bytes_theory`` with one ``reshard_after_forward`` per unit).
"""

from __future__ import annotations

import math

from course_lab.learner import save_cell, untouched
from fsdp_course.theory.fsdp2 import collective_bytes_theory, local_shape
from quizzes.exercise import exercise


def _run(metrics: dict, label: str) -> dict:
    for run in metrics["results"]["runs"]:
        if run["label"] == label:
            return run
    raise ValueError(
        f"the metrics given as `main` hold no run {label!r} (the notebook's main launch)"
    )


def unit_shapes(rows: list[dict], n_layers: int) -> list[list[list[int]]]:
    """Global shapes per unit from the DTensor rows: the root's own parameters, then each block."""
    root = [r["global"] for r in rows if not r["name"].startswith("blocks.")]
    return [root] + [
        [r["global"] for r in rows if r["name"].startswith(f"blocks.{i}.")] for i in range(n_layers)
    ]


def goal_all_gather_bytes(rows: list[dict], n_layers: int, world_size: int) -> int:
    keep = [False] + [True] * (n_layers - 1) + [False]  # root, blocks 0..L-2, the last block
    return collective_bytes_theory(unit_shapes(rows, n_layers), world_size, keep)["all_gather"]


@exercise("lesson5", "ex_shard")
def check_shard(
    shard, main: dict, nproc: int | None = None, tolerance: float = 1e-4, run=None
) -> tuple[bool, str]:
    """``shard(model, mesh)`` must give per-block + root FSDP2 units with Shard(0) placements,
    classic FULL_SHARD's losses, the goal's all-gather bytes, and no higher gathered peak."""
    if untouched(shard, 2):
        raise NotImplementedError
    classic, default = _run(main, "classic raf=default"), _run(main, "fsdp2 raf=default")
    cfg = default["config"]
    args = [
        "--shard-module",
        str(save_cell(shard, "shard")),
        "--steps",
        str(cfg["steps"]),
        "--log-every",
        str(cfg["log_every"]),
        "--batch-size",
        str(cfg["batch_size"]),
        "--lr",
        str(cfg["lr"]),
        "--seed",
        str(cfg["seed"]),
    ]
    if run is None:
        from course_lab.notebook import run_lesson as run
    try:
        metrics = run(5, *args, nproc=nproc or main["world_size"], echo=False)
    except RuntimeError as exc:  # run_lesson: the script exited non-zero; exc has its tail
        tail = " | ".join(str(exc).strip().splitlines()[-3:])
        return False, f"your shard() failed under torchrun: {tail}"
    mine, world, n_layers = metrics["results"]["runs"][0], metrics["world_size"], cfg["n_layers"]
    if mine["fsdp_units"] != n_layers + 1:
        return False, (
            f"{mine['fsdp_units']} FSDP units; lesson 1's classic run had "
            f"{classic['fsdp_units']} (one per Block, and the root)"
        )
    for row in mine["dtensor"]:
        want = [local_shape(row["global"], world, r) for r in range(world)]
        if row["placements"] != "S(0)" or row["local"] != want:
            return False, (
                f"{row['name']}: placements {row['placements']}, local shapes "
                f"{row['local']}; expected S(0) over the 1-D mesh you were given, {want}"
            )
    theirs, ours = [h["loss"] for h in classic["history"]], [h["loss"] for h in mine["history"]]
    worst = max((abs(a - b) for a, b in zip(ours, theirs)), default=float("inf"))
    if len(ours) != len(theirs) or worst > tolerance:
        return False, (
            f"losses differ from classic FULL_SHARD's by up to {worst:.2e} (> {tolerance:g}): "
            "the migration must not change the math"
        )
    param_bytes = 4 * sum(math.prod(r["global"]) for r in mine["dtensor"])
    measured = mine["collectives"]["all_gather"]["bytes"]
    goal = goal_all_gather_bytes(mine["dtensor"], n_layers, world)
    if measured != goal:
        return False, (
            f"your run all-gathered {measured:,} B per step ({measured / param_bytes:.3f} P, "
            f"P = {param_bytes:,} B of parameters); the goal is {goal:,} B "
            f"({goal / param_bytes:.3f} P): {measured - goal:+,} B. Count, unit by unit, the "
            "all-gathers in forward and in backward"
        )
    peak, limit = mine["memory"]["gathered"], default["memory"]["gathered"]
    if peak > limit:
        return False, (
            f"the all-gather bytes are right, but your run held up to {peak:,} B of "
            f"gathered parameters at once, FSDP2's default {limit:,} B: the unit you "
            "keep stays gathered for longer than it needs to"
        )
    return True, (
        f"{len(mine['dtensor'])} parameters Shard(0) over {world} ranks, {mine['fsdp_units']} "
        f"units; all-gather {measured:,} B per step ({measured / param_bytes:.3f} P) against "
        f"FULL_SHARD's {classic['collectives']['all_gather']['bytes']:,} B; gathered peak "
        f"{peak:,} B (default {limit:,} B); losses equal to classic (max difference {worst:.1e})"
    )
