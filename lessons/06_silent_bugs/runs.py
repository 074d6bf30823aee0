"""Lesson 6's runs (what the lesson is not about): the list flags of parts B and C as the config
reads them, the runs the flags ask for and the checks they need before they start, and the tables
rank 0 prints. What each part builds, trains and compares is in its own module.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from fsdp_course.config import int_at_least, list_flag
from fsdp_course.dist import CourseError
from fsdp_course.report import table

# --bn-batch-sizes "2,8,32" -> (2, 8, 32): BatchNorm in training needs 2 samples to have a variance
BatchSizes = list_flag("BatchSizes", item=int_at_least(2))

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODS = ("scaler", "nocast", "unit")
DEFAULT_SPECS = ("fsdp2:fp32/fp32", "fsdp2:bf16/fp32", "fsdp2:bf16/bf16", "fsdp2:fp32/bf16",
                 "classic:bf16/fp32/fp32", "classic:bf16/fp32/bf16",
                 "fsdp2:bf16/fp32+nocast", "fsdp2:bf16/fp32+nocast+unit",
                 "classic:fp16/fp16/fp32", "classic:fp16/fp16/fp32+scaler",
                 "fsdp2:fp16/fp16+scaler")


@dataclass(frozen=True)
class Spec:
    """One part C variant, ``API:PARAM/REDUCE[/BUFFER][+MOD...]``, as dtypes."""
    label: str
    api: str
    param: torch.dtype
    reduce: torch.dtype
    buffer: torch.dtype | None
    mods: tuple[str, ...]


def default_global_batch(world_size: int, preferred: int = 64) -> int:
    """64 samples per step where they split over the ranks (1, 2, 4, 8), else the nearest multiple
    of the rank count (63 on 3 ranks): every rank count runs with the default flags."""
    return world_size * max(1, round(preferred / world_size))


def parse_spec(text: str) -> Spec:
    bad = (f"{text}: expected API:PARAM/REDUCE[/BUFFER][+MOD...], API fsdp2|classic, "
           f"dtypes {'|'.join(DTYPES)}, MOD {'|'.join(MODS)} (e.g. classic:bf16/fp32/fp32+scaler)")
    api, _, rest = text.partition(":")
    dtypes, *mods = rest.split("+")
    names = dtypes.split("/")
    if api not in ("fsdp2", "classic") or not 2 <= len(names) <= 3 or any(n not in DTYPES
                                                                          for n in names) \
            or any(m not in MODS for m in mods):
        raise argparse.ArgumentTypeError(bad)
    if api == "fsdp2" and len(names) == 3:
        raise argparse.ArgumentTypeError(f"{text}: FSDP2's MixedPrecisionPolicy has no buffer "
                                         "dtype "
                                         "(FSDP2 leaves buffers as they are); give PARAM/REDUCE")
    return Spec(text, api, DTYPES[names[0]], DTYPES[names[1]],
                DTYPES[names[2]] if len(names) == 3 else None, tuple(mods))


def _checked(label: str) -> str:
    parse_spec(label)
    return label


# --precision "a,b" -> ("a", "b"), each checked (the config keeps the names; plan builds Specs)
Specs = list_flag("Specs", item=_checked, fold=None)


def plan(cfg, world_size: int) -> tuple:
    """(init variants, BatchNorm variants, batch-size sweep, precision Specs) the flags ask for,
    checked: only a global batch the learner chose can fail to split (CourseError, one line)."""
    inits = cfg.init if "init" in cfg.parts else ()
    bns, sweep = (cfg.bn, cfg.bn_batch_sizes) if "batchnorm" in cfg.parts else ((), ())
    specs = [parse_spec(s) for s in cfg.precision] if "precision" in cfg.parts else []
    if cfg.global_batch is None:
        cfg.global_batch = default_global_batch(world_size)
    if specs and cfg.global_batch % world_size:
        raise CourseError(f"--global-batch {cfg.global_batch} does not split over "
                          f"{world_size} ranks")
    return inits, bns, sweep, specs


def print_initialisation(env, runs: list[dict]) -> None:
    env.print0("\nA. initialisation: each variant vs one process on the global batch")
    if env.rank == 0:  # one row per variant (rank 0 alone holds the reference)
        print(table([{"variant": r["variant"],
                      "ranks differ before wrap": len(r["before_wrap"]["differ"])
                      if "before_wrap" in r else "-",
                      "after wrap": len(r["after_wrap"]["differ"]),
                      "init diff": r["init_diff"], "loss diff": r["loss_diff"],
                      "final diff": r["final_diff"],
                      "note": r.get("error", "")[:60]} for r in runs]), flush=True)


def print_batchnorm(env, cfg, result: dict) -> None:
    if env.rank == 0:
        print(f"\nB. BatchNorm: {cfg.bn_batch} samples per rank vs one process on the global batch",
              flush=True)
        print(table([{"variant": r["variant"], "output diff": r.get("output_diff", "-"),
                      "grad rel error": r.get("grad_rel_error", "-"),
                      "stats across ranks": r.get("stats_across_ranks", "-"),
                      "stats vs global": r.get("stats_vs_global", "-"),
                      "loss diff": r.get("loss_diff", "-"),
                      "note": r.get("error", "")[:50]} for r in result["runs"]]), flush=True)
        print("\nerror vs samples per rank (one step):", flush=True)
        print(table(result["sweep"]), flush=True)


def print_mixed_precision(env, cfg, result: dict) -> None:
    if env.rank == 0:
        runs = result["runs"]
        print(f"\nC. mixed precision: {env.world_size} ranks, global batch {cfg.global_batch}, "
              "vs one fp32 process", flush=True)
        print(table([{"variant": r["label"], "grad rel error": r.get("grad_rel_error", "-"),
                      "loss diff": r.get("loss_diff", "-"),
                      "all-gather B": r.get("collectives", {}).get("all_gather", {}).get("bytes",
                                                                                         "-"),
                      "reduce B": r.get("collectives", {}).get("reduce_scatter", {}).get("bytes",
                                                                                         "-"),
                      "gathered B": r.get("gathered_bytes", "-"),
                      "note": r.get("error", "")[:60]} for r in runs]), flush=True)
        print("\ndtypes, read from the tensors during step 0:", flush=True)
        print(table([{"variant": r["label"], **r["dtypes"]} for r in runs if "dtypes" in r]),
              flush=True)
