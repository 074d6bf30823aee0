"""Lesson 9 exercise: shard a ``transformers`` model of a family the lesson did not use.

The learner writes ``shard(model, mesh)``. The checker saves the cell to a file and runs it for
real on a Qwen2 model built from its config (``bash launch/lesson9.sh --family qwen2 --parts
train --shard-module FILE``), then reads what the script measured: one FSDP unit per decoder
layer plus the root, every parameter a DTensor sharded on dim 0, this rank holding about 1/N
of the parameter bytes, and the loss falling.
"""

from __future__ import annotations

from course_lab.learner import save_cell, untouched
from quizzes.exercise import exercise

FAMILY = "qwen2"
STEPS = 4


def launch_args(path: str, main: dict) -> list[str]:
    """The exercise's launch: the notebook's sizes, a Qwen2 model, the learner's shard()."""
    cfg = main["config"]
    return [
        "--family",
        FAMILY,
        "--parts",
        "train",
        "--steps",
        str(STEPS),
        "--log-every",
        str(STEPS),
        "--seed",
        str(cfg["seed"]),
        "--shard-module",
        path,
    ]


@exercise("lesson9", "ex_shard")
def check_shard(shard, main: dict, nproc: int | None = None, run=None) -> tuple[bool, str]:
    if untouched(shard, 2):
        raise NotImplementedError
    if run is None:
        from course_lab.notebook import run_lesson as run
    path = save_cell(shard, "shard")
    try:
        metrics = run(
            9, *launch_args(str(path), main), nproc=nproc or main["world_size"], echo=False
        )
    except RuntimeError as exc:  # the script exited non-zero; exc has its last lines
        tail = " | ".join(str(exc).strip().splitlines()[-3:])
        return False, f"your shard() failed under torchrun: {tail}"
    world, results = metrics["world_size"], metrics["results"]
    train = results["train"]
    blocks, units = train["num_blocks"], train["fsdp_units"]
    if "" not in units:
        return (
            False,
            f"the root is not an FSDP unit (units: {units}): fully_shard the model itself last",
        )
    if train["block_units"] != blocks or len(units) != blocks + 1:
        return False, (
            f"{len(units)} FSDP units, {train['block_units']} of them decoder layers; "
            f"{results['class']} has {blocks} decoder layers: one unit each, then the root"
        )
    if train["dtensor_params"] != train["num_tensors"] or train["placements"] != [
        "(Shard(dim=0),)"
    ]:
        return False, (
            f"{train['dtensor_params']} of {train['num_tensors']} parameters sharded, placements "
            f"{train['placements']}: every parameter should be Shard(0) over the mesh you were "
            "given"
        )
    share = train["local_param_bytes"] / train["full_param_bytes"]
    if share > 1 / world + 0.02:
        return False, f"rank 0 holds {share:.0%} of the parameter bytes on {world} ranks"
    losses = [h["loss"] for h in train["history"]]
    if not losses or losses[-1] >= losses[0]:
        return False, f"the losses did not fall: {losses}"
    return True, (
        f"{results['class']} ({results['num_params']:,} parameters): {len(units)} FSDP units "
        f"({blocks} {'/'.join(results['block_classes'])} + the root), all Shard(0), rank 0 holds "
        f"{share:.1%} of the parameter bytes on {world} ranks; "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    )
