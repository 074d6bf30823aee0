"""Lesson 2's runs (what the lesson is not about): its list flags, the runs they and
``--variants`` plan, loading a policy file, what the theory predicts for a run's units, the time
per step, and the tables it prints.

A list flag is read once, where the config is read: ``--wrap none,size:20000`` arrives in the
config as ``Wraps(("none", "size:20000"))``, already checked; a bad value is argparse's one-line
error (exit 2).
"""

from __future__ import annotations

from torch.distributed.fsdp import BackwardPrefetch

from fsdp_course import theory, wrapping
from fsdp_course.config import list_flag, plan_runs
from fsdp_course.dist import CourseError
from fsdp_course.learner import load_learner
from fsdp_course.measure import MiB
from fsdp_course.report import table, unwatched_ms

WRAPS = ("none", "transformer", "size", "custom")  # size:N = size with threshold N
PREFETCHES = ("pre", "post", "none", "forward", "no-limit")


def _wrap(name: str) -> str:
    kind, colon, threshold = name.partition(":")
    if kind not in WRAPS or (colon and not (kind == "size" and threshold.isdigit())):
        raise ValueError(name)
    return name


Wraps = list_flag("Wraps", item=_wrap,
                  expected=f"choose from {', '.join(WRAPS)} or size:N, several separated by commas")
Prefetches = list_flag("Prefetches", PREFETCHES)


def run_plan(cfg) -> list[tuple]:
    """(config, wrap, prefetch, variant) of every run, in order: each --wrap with each --prefetch,
    then the same for each ``--variants`` entry, on the command line's config with the variant's
    flags changed (each typed like its flag: ``wrap=transformer,prefetch=post,timeline=true``).
    A variant cannot change what the launch loads once (--policy-file, --data). A variant that
    makes no sense is a CourseError (one line, exit 2) before anything runs."""
    configs = plan_runs(cfg, fixed=("variants", "metrics", "policy_file", "data"))
    return [(config, wrap, prefetch, variant) for config, variant in configs
            for wrap in config.wrap for prefetch in config.prefetch]


def load_policy(path: str | None, wraps):
    """The ``policy`` function a ``--policy-file`` defines (None without one); ``wraps``: the
    wrap policies the launch runs."""
    if not path:
        return None
    if "custom" not in wraps:
        raise CourseError("--policy-file is used by --wrap custom; add custom to --wrap")
    return load_learner(path, "--policy-file", "policy(module, recurse, nonwrapped_numel)").policy


def note_one_rank(env) -> None:
    if env.world_size == 1:
        env.print0("one rank: FSDP falls back to NO_SHARD, so nothing is gathered (try NPROC=2)")


def theory_of(planned, unit_numels: list, fsdp_args: dict, world_size: int) -> dict:
    """What ``fsdp_course.theory`` predicts for the units a policy planned (``unit_numels`` in
    forward order, root first) under these FSDP arguments: the all-gather peaks by phase (no
    formula for nested units), the collectives' calls and bytes."""
    nested = wrapping.is_nested(planned)
    backward_prefetch = fsdp_args.get("backward_prefetch", BackwardPrefetch.BACKWARD_PRE)
    peaks = {} if nested else theory.wrapping.gathered_peaks(
        unit_numels, world_size, backward_prefetch=backward_prefetch and backward_prefetch.name,
        forward_prefetch=fsdp_args.get("forward_prefetch", False))
    return {"unit_numels_theory": unit_numels, "nested": nested,
            "units_theory": [{"unit": name or "(root)", "numel": numel}
                             for name, _, numel in planned],
            "gathered_theory": peaks.get("step"), "gathered_theory_by_phase": peaks,
            "collective_calls_theory": theory.wrapping.collective_calls(unit_numels, world_size),
            "collective_bytes_theory": theory.collective_bytes(unit_numels, world_size,
                                                               "FULL_SHARD")}


def step_time(history: list[dict], watched: int) -> dict:
    """ms/step: the median of the steps no instrument watched, step 0 (first-step set-up) left
    out. A run too short to have one (--steps 2) falls back on the watched step, and says so."""
    plain = unwatched_ms(history)
    if plain is not None:
        count = sum(row["step"] > 0 and row["peak_mib"] is None for row in history)
        return {"ms_per_step": plain, "ms_timed": f"median of {count} unwatched steps"}
    return {"ms_per_step": history[watched]["ms"],
            "ms_timed": "the watched step (no unwatched step after step 0: run --steps 3 or more)"}


def print_units(env, cfg, wrap: str, prefetch: str, units: list[dict]) -> None:
    """The run's flags, as a command line would say them, and the units FSDP made."""
    flags = f"--model {cfg.model} --wrap {wrap} --prefetch {prefetch}"
    flags += " --timeline" if cfg.timeline else ""
    env.print0(f"\n== {flags}: {len(units)} FSDP unit(s) ==")
    env.print0(table([{**u, "MiB": round(u["gathered_bytes"] / MiB, 3)} for u in units]))


def print_report(env, run: dict, comm: dict) -> None:
    """The run's all-gather peaks and collectives, measured next to the theory."""
    param_bytes = 4 * run["num_params"]
    theory = run["gathered_theory_by_phase"]
    note = "; nested units: no formula" if run["nested"] else ""
    env.print0("\nall-gathered parameters, peak bytes "
               f"(theory: fsdp_course.theory.wrapping{note}):")
    env.print0(table([{"phase": phase, "measured": run[key], "theory": theory.get(phase, "-"),
                       "MiB": round(run[key] / MiB, 3),
                       "x param bytes": round(run[key] / param_bytes, 3)}
                      for phase, key in (("forward", "gathered_forward"),
                                         ("backward", "gathered_backward"),
                                         ("step", "gathered_peak"))]))
    env.print0(f"\ncollectives in step {run['watched_step']} (payload bytes):")
    env.print0(table([{"collective": kind, "calls": value["calls"],
                       "theory calls": run["collective_calls_theory"].get(kind, 0),
                       "bytes": value["bytes"],
                       "theory bytes": run["collective_bytes_theory"].get(kind, 0),
                       "x param bytes": round(value["bytes"] / param_bytes, 3)}
                      for kind, value in comm.items()] or [{"collective": "(none)"}]))
