"""Lesson 5 exercise: migrate lesson 1's classic FSDP training to FSDP2.

The learner writes ``shard(model, mesh)`` in a notebook cell. The checker saves that cell to a
file, runs it for real under torchrun (``bash launch/lesson5.sh --shard-module FILE``), and
compares what the script measured with the classic FSDP run: every parameter a ``Shard(0)``
DTensor with the expected local shapes, one unit per block plus the root, and the same losses.
"""

from __future__ import annotations

import inspect
import linecache
import tempfile
from pathlib import Path

from fsdp_course.theory.fsdp2 import local_shape

from quizzes.exercise import exercise


def _source(fn) -> str:
    """The whole cell (or file) that defined ``fn``, so its imports come along."""
    filename = fn.__code__.co_filename
    lines = linecache.getlines(filename)
    return "".join(lines) if lines else inspect.getsource(fn)


def _untouched(fn) -> bool:
    """The starter raises NotImplementedError before touching its arguments."""
    if "NotImplementedError" not in _source(fn):
        return False
    try:
        fn(None, None)
    except NotImplementedError:
        return True
    except Exception:  # noqa: BLE001 - a real attempt fails on None arguments: run it for real
        return False
    return False


def classic_run(metrics: dict) -> dict:
    runs = [r for r in metrics["results"]["runs"] if r["api"] == "classic"]
    if not runs:
        raise ValueError("the metrics given as `classic` hold no api=classic run")
    return runs[0]


@exercise("lesson5", "ex_shard")
def check_shard(shard, classic: dict, nproc: int | None = None, tolerance: float = 1e-4,
                run=None) -> tuple[bool, str]:
    """``shard(model, mesh)`` must give per-block + root FSDP2 units, Shard(0) placements with
    the right local shapes, and the classic run's losses (within ``tolerance``)."""
    if _untouched(shard):
        raise NotImplementedError
    reference = classic_run(classic)
    cfg = reference["config"]
    nproc = nproc or classic["world_size"]
    with tempfile.TemporaryDirectory(prefix="lesson5-ex-") as tmp:
        path = Path(tmp) / "learner_shard.py"
        path.write_text(_source(shard))
        if run is None:
            from course_lab.notebook import run_lesson as run
        args = ["--shard-module", str(path), "--steps", str(cfg["steps"]),
                "--log-every", str(cfg["steps"]), "--batch-size", str(cfg["batch_size"]),
                "--lr", str(cfg["lr"]), "--seed", str(cfg["seed"])]
        try:
            metrics = run(5, *args, nproc=nproc, echo=False)
        except RuntimeError as exc:  # run_lesson: the script exited non-zero; exc has its tail
            tail = " | ".join(str(exc).strip().splitlines()[-3:])
            return False, f"your shard() failed under torchrun: {tail}"
    mine = metrics["results"]["runs"][0]
    n_layers = cfg["n_layers"]
    if mine["fsdp_units"] != n_layers + 1:
        return False, (f"{mine['fsdp_units']} FSDP units, expected {n_layers + 1}: call fully_shard on "
                       "each of model.blocks (what auto_wrap_policy did) and then on model itself")
    world = metrics["world_size"]
    for row in mine["dtensor"]:
        if row["placements"] != "S(0)":
            return False, (f"{row['name']} has placements {row['placements']}, expected S(0) "
                           "(sharded on dim 0 over the 1-D mesh you were given)")
        want = [local_shape(row["global"], world, r) for r in range(world)]
        if row["local"] != want:
            return False, f"{row['name']}: local shapes {row['local']}, expected {want}"
        if not row.get("full_equal", True):
            return False, f"{row['name']}: full_tensor() differs from the reference weights"
    theirs = [h["loss"] for h in reference["history"]]
    ours = [h["loss"] for h in mine["history"]]
    worst = max((abs(a - b) for a, b in zip(ours, theirs)), default=float("inf"))
    if len(ours) != len(theirs) or worst > tolerance:
        return False, (f"losses differ from the classic run by up to {worst:.2e} (> {tolerance:g}): "
                       "FULL_SHARD is reshard_after_forward=True; no mixed precision")
    return True, (f"{len(mine['dtensor'])} parameters Shard(0) over {world} ranks, "
                  f"{mine['fsdp_units']} units, {len(ours)} losses equal to classic FSDP "
                  f"(max difference {worst:.1e})")

