"""Lesson 9's runs (what the lesson is not about): its list flags (``--parts``, ``--compare``),
and what rank 0 says about the model before the runs and about the runs after them.
"""

from __future__ import annotations

import zero
from fsdp_course.config import list_flag
from hf_model import block_classes

PARTS = ("train", "checkpoint", "compare")
Parts = list_flag("Parts", PARTS)
Variants = list_flag("Variants", zero.VARIANTS)


def describe_model(env, model) -> dict:
    """The plain model (rank 0 holds it; the others get {}): its class, size, the blocks
    ``fully_shard`` will wrap, its config; rank 0 says the first three."""
    found = {}
    if env.is_rank0:
        found = {"class": type(model).__name__,
                 "num_params": sum(p.numel() for p in model.parameters()),
                 "no_split_modules": list(model._no_split_modules or []),
                 "block_classes": sorted(c.__name__ for c in block_classes(model)),
                 "config": model.config.to_dict()}
    env.print0(f"{found.get('class')}: {found.get('num_params', 0):,} parameters, "
               f"blocks: {found.get('block_classes')}")
    return found


def print_report(env, results: dict) -> None:
    train = results.get("train")
    if train and train["history"]:
        h = train["history"]
        env.print0(f"train: loss {h[0]['loss']:.4f} -> {h[-1]['loss']:.4f} in {len(h)} steps; "
                   f"{len(train['fsdp_units'])} FSDP units; params on this rank "
                   f"{train['local_param_bytes']:,} of {train['full_param_bytes']:,} B; "
                   f"{train['garbage_buffers']} buffers refilled after to_empty")
    ckpt = results.get("checkpoint")
    if ckpt:
        resumed = "bitwise" if ckpt["loaded"]["equal"] else "DIFFERENT"
        env.print0(f"checkpoint: DCP resume {resumed} ({ckpt['loaded']['tensors']} tensors); "
                   f"next step losses {ckpt['next_losses']}; way in: {ckpt['way_in']}")
