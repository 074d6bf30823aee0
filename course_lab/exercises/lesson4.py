"""Lesson 4 exercise: save / load functions with DCP that survive a change of world size.

The checker runs the learner's two functions for real: it writes them into a module, has
``lessons/04_checkpointing/train.py --ckpt-module MODULE`` save a trained model and its
optimizer on ``save_ranks`` ranks, and load that checkpoint on ``load_ranks`` ranks; the script
fingerprints the full model and optimizer state after the save and after the load (one SHA-256
per tensor), and the exercise passes when they are equal.
"""

from __future__ import annotations

import inspect
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
            raise NotImplementedError(name)
        parts.append(source if fn.__name__ == name else f"{source}\n{name} = {fn.__name__}\n")
    return HEADER + "\n\n" + "\n\n".join(parts)


def _last_error(output: str) -> str:
    lines = [l for l in output.splitlines() if "error" in l.lower()]
    return (lines[0] if lines else output.strip().splitlines()[-1] if output.strip() else "no output")[:300]


def _run(args: list[str], nproc: int) -> tuple[dict | None, str]:
    from course_lab.notebook import launch_lesson

    run = launch_lesson(4, *args, nproc=nproc)
    if run.returncode != 0 or run.metrics is None:
        return None, _last_error(run.stdout)
    return run.metrics, run.stdout


def _hint(different: list[str]) -> str:
    if all(k.startswith("optim.") for k in different):
        return ("the model came back but the optimizer state did not: save and load the "
                "optimizer too (get_state_dict(model, optimizer) gives both)")
    if all(k.startswith("model.") for k in different):
        return "the optimizer came back but the model did not: did load() call set_state_dict?"
    return ("nothing came back as saved: load must fill the state dict in place (dcp.load) "
            "and then hand it to set_state_dict(model, optimizer, ...)")


@exercise("lesson4", "ex_dcp_save_load")
def check_dcp_save_load(save, load=None, save_ranks: int = 2, load_ranks: int = 3,
                        steps: int = 3) -> tuple[bool, str]:
    """``save(path, model, optimizer)`` on ``save_ranks`` ranks, then ``load(path, model,
    optimizer)`` on ``load_ranks`` ranks: the loaded model and optimizer state must equal the
    saved ones, bitwise."""
    if load is None:
        return False, "pass both functions: check_exercise(..., save, load=load)"
    source = module_source(save, load)
    with tempfile.TemporaryDirectory(prefix="lesson4-ex-") as tmp:
        module = Path(tmp) / "learner_ckpt.py"
        module.write_text(source)
        ckpt_dir = Path(tmp) / "checkpoint"
        saved, out = _run(["--ckpt-module", str(module), "--save", str(ckpt_dir), "--steps", str(steps),
                           "--ckpt-dir", str(Path(tmp) / "unused")],
                          save_ranks)
        if saved is None:
            return False, f"saving on {save_ranks} ranks failed: {out}"
        loaded, out = _run(["--ckpt-module", str(module), "--load", str(ckpt_dir),
                            "--ckpt-dir", str(Path(tmp) / "unused")],
                           load_ranks)
        if loaded is None:
            return False, (f"saved on {save_ranks} ranks, but loading on {load_ranks} ranks failed: "
                           f"{out} (a checkpoint that only loads on the world size that wrote it is "
                           "the LOCAL_STATE_DICT / per-rank torch.save trap)")
    verdict = loaded["results"].get("equal_to_saved")
    if verdict is None:
        return False, "the load run found no fingerprint of the save: did save() write into the directory it was given?"
    if not verdict["equal"]:
        return False, (f"loaded on {load_ranks} ranks, but {len(verdict['different'])}+ tensors differ from "
                       f"what was saved on {save_ranks} (e.g. {verdict['different'][:2]}): {_hint(verdict['different'])}")
    return True, (f"saved on {save_ranks} ranks, loaded on {load_ranks}: all {verdict['tensors']} tensors "
                  "(model and optimizer state) bitwise equal.")
