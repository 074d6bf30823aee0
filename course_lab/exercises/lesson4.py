"""Lesson 4 exercise: DCP save / load functions that give every rank its own RNG state back.

The checker runs the learner's two functions for real: it writes them into a module and runs
``lessons/04_checkpointing/train.py --ckpt-module MODULE --save DIR --reload --rng per-rank``:
every rank draws from its own random stream, trains, saves with ``save``, then loads with
``load`` into a fresh model (another initialisation, another RNG state). The script fingerprints
the full model, the optimizer state and each rank's RNG state after the save and after the load
(one SHA-256 per tensor); the exercise passes when they are all equal.
"""

from __future__ import annotations

import hashlib
import inspect
import shutil
import tempfile
import textwrap
from pathlib import Path

from quizzes.exercise import exercise

HEADER = '''"""Written by course_lab.exercises.lesson4 from the notebook's exercise cell."""
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, get_state_dict,
                                                     set_model_state_dict,
                                                     set_optimizer_state_dict, set_state_dict)
'''


def module_source(save, load) -> str:
    """The module the ranks import: the usual DCP imports, then the two functions' source."""
    parts = []
    for fn, name in ((save, "save"), (load, "load")):
        if not callable(fn):
            raise TypeError(f"{name} must be a function (path, model, optimizer)")
        source = textwrap.dedent(inspect.getsource(fn))
        if "raise NotImplementedError" in source:
            raise NotImplementedError(
                f"write {name}() in the exercise cell, then run this cell again"
            )
        parts.append(source if fn.__name__ == name else f"{source}\n{name} = {fn.__name__}\n")
    return HEADER + "\n\n" + "\n\n".join(parts)


def _last_error(output: str) -> str:
    lines = [line for line in output.splitlines() if "error" in line.lower()]
    return (
        lines[0] if lines else output.strip().splitlines()[-1] if output.strip() else "no output"
    )[:300]


def _run(args: list[str], nproc: int) -> tuple[dict | None, str]:
    from course_lab.notebook import launch_lesson

    run = launch_lesson(4, *args, nproc=nproc)
    if run.returncode != 0 or run.metrics is None:
        return None, _last_error(run.stdout)
    return run.metrics, run.stdout


def _hint(saved: dict, reloaded: dict, different: list[str]) -> str:
    states = [k for k in different if k.startswith("rng.")]
    if states and len(states) == len(different):
        borrowed = [
            f"{k[4:].replace('rank', 'rank ')} came back with {o[4:].replace('rank', 'rank ')}'s"
            for k in states
            for o in saved
            if o.startswith("rng.") and o != k and saved[o] == reloaded[k]
        ]
        if borrowed:
            return (
                f"model and optimizer came back, but {'; '.join(borrowed)} random-number "
                "generator state"
            )
        return (
            "model and optimizer came back, but not the random-number generator state of "
            + ", ".join(k[4:].replace("rank", "rank ") for k in states)
        )
    if all(k.startswith("optim.") for k in different):
        return (
            "the model came back but the optimizer state did not: save and load the "
            "optimizer too (get_state_dict(model, optimizer) gives both)"
        )
    if all(k.startswith("model.") for k in different):
        return "the optimizer came back but the model did not: did load() call set_state_dict?"
    return (
        "the model and optimizer did not come back as saved: load must fill the state dict in "
        "place (dcp.load) and then hand it to set_state_dict(model, optimizer, ...)"
    )


@exercise("lesson4", "ex_dcp_save_load")
def check_dcp_save_load(save, load=None, ranks: int = 2, steps: int = 3) -> tuple[bool, str]:
    """``save(path, model, optimizer)`` then ``load(path, model, optimizer)`` on ``ranks`` ranks,
    each with its own RNG stream: model, optimizer state and every rank's RNG state must come
    back bitwise."""
    if load is None:
        return False, "pass both functions: check_exercise(..., save, load=load)"
    source = module_source(save, load)
    # A folder named by the functions' source: the same functions make the same launch, which a
    # test run shares between the notebook and the tests (the run cache, tests/run_cache.py).
    work = (
        Path(tempfile.gettempdir())
        / f"lesson4-ex-{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    )
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        (work / "learner_ckpt.py").write_text(source)
        run, out = _run(
            [
                "--ckpt-module",
                work / "learner_ckpt.py",
                "--save",
                work / "checkpoint",
                "--reload",
                "--rng",
                "per-rank",
                "--steps",
                str(steps),
                "--ckpt-dir",
                work / "unused",
            ],
            ranks,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if run is None:
        return False, f"save or load failed on {ranks} ranks: {out}"
    results = run["results"]
    verdict = results["equal_reloaded"]
    if not verdict["equal"]:
        n = len(verdict["different"])
        return False, (
            f"{n}{'+' if n == 10 else ''} of {verdict['tensors']} fingerprints differ after the "
            f"load (e.g. {verdict['different'][:2]}): "
            f"{_hint(results['saved'], results['reloaded'], verdict['different'])}"
        )
    return True, (
        f"saved and loaded on {ranks} ranks, each with its own random stream: all "
        f"{verdict['tensors']} fingerprints (model, optimizer state, every rank's RNG) bitwise "
        "equal."
    )
