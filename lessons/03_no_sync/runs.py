"""Lesson 3's runs (what the lesson is not about): its list flags, the runs they and
``--variants`` plan, and the tables it prints.

A list flag is read once, where the config is read: ``--accum 1,2,4`` arrives in the config as
``Counts((1, 2, 4))``, already checked; a bad value is argparse's one-line error (exit 2).
"""

from __future__ import annotations

import dataclasses
import itertools

import torch.distributed as dist

from fsdp_course import theory
from fsdp_course.config import int_at_least, list_flag, plan_runs
from fsdp_course.dist import CourseError
from fsdp_course.measure import MiB
from fsdp_course.report import table, unwatched_ms

APIS = ("fsdp1", "fsdp2")
BUGS = ("none", "no-sync-last")
# What a variant may change: the runs' own flags. The model, data and seed stay the command line's,
# so that runs with the same micro-batch sizes share one big-batch reference.
VARIANT_FLAGS = ("accum", "no_sync", "api", "bug", "last_batch_size", "steps", "batch_size")
VARIANTS_HELP = ("more runs after the list flags' combinations, ';' between them: each the command "
                 "line "
                 f"with some of {', '.join(f.replace('_', '-') for f in VARIANT_FLAGS)} set to one "
                 "value")


Counts = list_flag("Counts", item=int_at_least(1),
                   expected="whole numbers of 1 or more, e.g. 4 or 1,2,4,8")
Sizes = list_flag("Sizes", item=int_at_least(0),
                  expected="whole numbers of 0 or more, e.g. 1 or 0,1")
Switches = list_flag("Switches", item=lambda text: {"on": True, "off": False}[text],
                     expected="on, off, or on,off", show=lambda value: "on" if value else "off")
Apis = list_flag("Apis", APIS, expected=f"{', '.join(APIS)}, or both separated by a comma")
Bugs = list_flag("Bugs", BUGS, expected=f"{', '.join(BUGS)}, or both separated by a comma")


def check_flags(cfg) -> None:
    """Flag combinations the script cannot run: CourseError, one line."""
    if "no-sync-last" in cfg.bug and True not in cfg.no_sync:
        raise CourseError("--bug no-sync-last is about no_sync: add on to --no-sync")
    if cfg.loop_file and (tuple(cfg.bug) != ("none",) or tuple(cfg.api) != ("fsdp1",)):
        raise CourseError("--loop-file: the exercise is written for classic FSDP (--api fsdp1), "
                          "and your loop decides where to sync (no --bug)")


def planned_runs(cfg) -> list[tuple]:
    """(config, api, micro-batch sizes, no_sync, bug) for every run: the command line's
    combinations, then each ``--variants`` entry's (the command line with its changes). All are
    checked before anything runs: CourseError, one line, for a bad variant or combination."""
    fixed = tuple(f.name for f in dataclasses.fields(cfg) if f.name not in VARIANT_FLAGS)
    runs = []
    for config, variant in plan_runs(cfg, fixed):  # a bad variant: already one line naming its flag
        try:
            check_flags(config)
            runs += [(config, *run) for run in combinations(config)]
        except CourseError as exc:
            raise CourseError(str(exc) if variant is None
                              else f"--variants {variant}: {exc}") from None
    return runs


def combinations(cfg) -> list[tuple]:
    """(api, micro-batch sizes, no_sync, bug) for every combination of the list flags that shows
    something: the bug is no_sync on the last micro-batch too, so it needs no_sync on; a short
    last micro-batch is about the loss scaling of the lesson's own loop (no_sync on, no bug)."""
    runs = []
    for api, no_sync, accum, bug, last in itertools.product(cfg.api, cfg.no_sync, cfg.accum,
                                                            cfg.bug,
                                                            cfg.last_batch_size):
        sizes = (cfg.batch_size,) * (accum - 1) + (last or cfg.batch_size,)
        short = len(set(sizes)) > 1
        if (no_sync or bug == "none") and (not short or (no_sync and bug == "none")):
            runs.append((api, sizes, no_sync, bug))
    if not runs:
        raise CourseError("--last-batch-size: a short last micro-batch runs with --no-sync on and "
                          "no --bug")
    return runs


def print_header(env, api: str, sizes: list[int], no_sync: bool, bug: str,
                 loop_file: str | None) -> None:
    skip = "no_sync()" if api == "fsdp1" else "gradient sync off"
    which = "all" if bug != "none" else "all but the last of"
    what = (f"{skip} on {which} {len(sizes)} micro-batches" if no_sync
            else "sync on every micro-batch")
    uneven = f" of {' + '.join(map(str, sizes))} sequences" if len(set(sizes)) > 1 else ""
    env.print0(f"\n== {api}, K={len(sizes)}: "
               f"{what}{uneven}{', your accumulate()' if loop_file else ''} ==")


def report_run(env, run: dict, check: dict, held_between: dict, held_after: dict,
               collectives: dict, history: list, tolerance: float) -> dict:
    """One run's result, its check printed: ``run`` (what ran), every rank's step-0 check and
    gradients held, the step's collective bytes and gradients held against theory, and the loss
    and time history."""
    per_rank = [None] * env.world_size
    dist.all_gather_object(per_rank, {"rank": env.rank, **check, "held_between": dict(held_between),
                                      "held_after": held_after, "step_error": run["step_error"]})
    padded, accum, no_sync = run["padded_numel"], run["accum"], run["no_sync"]
    result = {
        **run, "ranks": per_rank, "grads_equal": all(r["equal"] for r in per_rank),
        "collectives": collectives,
        "reduce_bytes": collectives.get("reduce_scatter", {}).get("bytes", 0),
        "reduce_bytes_theory": theory.accumulation.reduce_bytes_per_step(padded, accum, no_sync,
                                                                         world_size=env.world_size),
        "gather_bytes": collectives.get("all_gather", {}).get("bytes", 0),
        **{f"held_between_{kind}": max(r["held_between"][kind] for r in per_rank)
           for kind in held_between},
        "held_theory": theory.accumulation.held_grad_bytes_theory(run["num_params"], padded,
                                                                  env.world_size,
                                                                  no_sync) if accum > 1 else 0,
        "ms_per_step": unwatched_ms(history), "history": history,
        "loss_first": history[0]["loss"], "loss_last": history[-1]["loss"],
    }
    print_check(env, result, run["micro_batch_sizes"], tolerance)
    return result


def held_mib(held: dict) -> float:
    return round((held["sharded"] + held["unsharded"]) / MiB, 3)


def print_check(env, result: dict, sizes: list[int], tolerance: float) -> None:
    """Every rank's step-0 gradient against the big batch, and what the bug did."""
    env.print0("step-0 gradient vs one process on the same micro-batches "
               f"({' + '.join(map(str, sizes))} "
               f"sequences per rank) as one batch (equal: rel err <= {tolerance:g}):")
    env.print0(table([{"rank": r["rank"], "grad after K": r["held"], "rel err": r["rel_err"],
                       "scale": round(r["scale"], 4), "equal": "yes" if r["equal"] else "NO",
                       "step moved params": "yes" if r["step_changed_params"] else "NO",
                       "grad MiB between micro-batches": held_mib(r["held_between"])}
                      for r in result["ranks"]]))
    if result["step_error"]:
        env.print0(f"optimizer.step() failed on every rank: {result['step_error']}\n"
                   "  -> no reduce-scatter ever ran: each rank's gradient still has the flat "
                   "parameter's full length (b) while the parameter is the rank's shard (a), and "
                   "it holds only that rank's own micro-batches (rel err above, a different one on "
                   "each rank). AdamW had applied its weight decay before failing.")
    elif result["bug"] != "none":
        env.print0("no error, and yet: no parameter has a .grad (the unsharded gradients were "
                   "never "
                   "reduce-scattered), so optimizer.step() changed nothing, at every step.")


def print_summary(env, runs: list[dict]) -> None:
    env.print0("\nper optimizer step (payload bytes; theory: fsdp_course.theory.accumulation):")
    bugs = any(r["bug"] != "none" for r in runs)  # a bug column only where a run has one
    uneven = any(len(set(r["micro_batch_sizes"])) > 1 for r in runs)  # ... sizes where they differ
    env.print0(table([{"api": r["api"], "K": r["accum"], "no_sync": Switches.show(r["no_sync"]),
                       **({"bug": r["bug"]} if bugs else {}),
                       **({"sequences": "+".join(map(str, r["micro_batch_sizes"]))} if uneven
                          else {}),
                       "reduce_scatter": r["reduce_bytes"], "theory": r["reduce_bytes_theory"],
                       "all_gather": r["gather_bytes"],
                       "grads held MiB/rank": round((r["held_between_unsharded"]
                                                     + r["held_between_sharded"]) / MiB, 3),
                       "theory MiB": round(r["held_theory"] / MiB, 3),
                       "grads equal": "yes" if r["grads_equal"] else "NO"} for r in runs]))
