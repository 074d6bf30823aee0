"""What lesson 2's script needs and is not about: its list flags (parsed once, by the config),
the runs its flags and ``--variants`` ask for, loading a policy file, the time per step, and the
tables it prints.

A list flag is a type argparse calls on the text: ``--wrap none,size:20000`` arrives in the
config as ``Wraps(("none", "size:20000"))``, already checked; a bad value is argparse's one-line
error (exit 2).
"""

from __future__ import annotations

import argparse

from fsdp_course.config import with_variant
from fsdp_course.dist import CourseError
from fsdp_course.learner import load_learner
from fsdp_course.measure import MiB
from fsdp_course.report import table, unwatched_ms

WRAPS = ("none", "transformer", "size", "custom")  # size:N = size with threshold N
PREFETCHES = ("pre", "post", "none", "forward", "no-limit")


class _Names(tuple):
    """Comma-separated names, each checked by ``check`` (subclasses), kept in order."""

    def __new__(cls, text=()):
        if not isinstance(text, str):  # names already checked (dataclasses.asdict copies them)
            return super().__new__(cls, text)
        names = tuple(item.strip().lower() for item in text.split(",") if item.strip())
        bad = [name for name in names if not cls.check(name)] or ([] if names else [text])
        if bad:
            raise argparse.ArgumentTypeError(f"{bad[0]!r}: {cls.expected}")
        return super().__new__(cls, names)

    def __str__(self) -> str:
        return ",".join(self)


class Wraps(_Names):
    expected = f"choose from {', '.join(WRAPS)} or size:N, several separated by commas"

    @staticmethod
    def check(name: str) -> bool:
        kind, colon, threshold = name.partition(":")
        return kind in WRAPS and (not colon or (kind == "size" and threshold.isdigit()))


class Prefetches(_Names):
    expected = f"choose from {', '.join(PREFETCHES)}, several separated by commas"

    @staticmethod
    def check(name: str) -> bool:
        return name in PREFETCHES


def run_plan(cfg) -> list[tuple]:
    """(config, wrap, prefetch, variant) of every run, in order: each --wrap with each --prefetch,
    then the same for each ``--variants`` entry, on the command line's config with the variant's
    flags changed (each typed like its flag: ``wrap=transformer,prefetch=post,timeline=true``).
    A variant cannot change what the launch loads once (--policy-file, --data). A variant that
    makes no sense is a CourseError (one line, exit 2) before anything runs."""
    configs = [(cfg, None)]
    for changes in cfg.variants or ():
        try:
            variant = with_variant(cfg, changes, fixed=("variants", "metrics", "policy_file", "data"))
        except ValueError as exc:
            raise CourseError(str(exc)) from None
        configs.append((variant, str(changes)))
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
    env.print0(f"\nall-gathered parameters, peak bytes (theory: fsdp_course.theory.wrapping{note}):")
    env.print0(table([{"phase": phase, "measured": run[key], "theory": theory.get(phase, "-"),
                       "MiB": round(run[key] / MiB, 3), "x param bytes": round(run[key] / param_bytes, 3)}
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
