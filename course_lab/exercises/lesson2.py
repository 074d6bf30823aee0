"""Lesson 2 exercise: a wrap policy for ``StagedLM`` (``lessons/02_wrap_policies/staged_lm.py``),
a model whose repeating layer is not the course's ``Block`` and whose embedding and head outweigh
a layer.

Checked in two ways: what the policy wraps (``wrapping.policy_units`` replays FSDP's walk over
the module tree, no process group needed), then a real launch of the lesson script with the
policy (``--wrap custom --policy-file``), whose measured all-gather peak must equal the theory
and be far below the whole model's.
"""

from __future__ import annotations

import dis
import importlib
import inspect
import sys
import textwrap
from pathlib import Path

from fsdp_course import theory, wrapping
from quizzes.exercise import exercise

CONSTANT_TYPES = (int, float, str, bool, type(None))
LESSON_DIR = Path(__file__).resolve().parents[2] / "lessons" / "02_wrap_policies"


def staged_lm_module():
    """The exercise model's module, ``staged_lm`` from lesson 2's folder: the same module
    object the notebook (run in that folder) and the lesson script import by that name."""
    if str(LESSON_DIR) not in sys.path:
        sys.path.append(str(LESSON_DIR))
    return importlib.import_module("staged_lm")


def policy_file(source: str) -> Path:
    """A file holding ``source``, named by its content (course_lab.learner.learner_file)."""
    from course_lab.learner import learner_file

    return learner_file(source, "policy")


def _global_names(code) -> set[str]:
    """Names a function's code (and the code nested in it) reads from the globals."""
    names = {
        ins.argval
        for ins in dis.get_instructions(code)
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")
    }
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _global_names(const)
    return names


def policy_source(fn) -> str:
    """The text of a policy file defining ``policy`` = ``fn``: its source, preceded by an import
    (or a constant) for each global name it uses, so that a notebook function can be handed
    to ``train.py --policy-file``. Raises ValueError for what cannot be written out."""
    if getattr(fn, "__name__", "<lambda>") == "<lambda>" or not inspect.isfunction(fn):
        raise ValueError("write the policy as `def policy(module, recurse, nonwrapped_numel):`")
    header, constants = [], []
    for name in sorted(_global_names(fn.__code__)):
        if name not in fn.__globals__:
            continue  # a builtin (isinstance, ...)
        value = fn.__globals__[name]
        if inspect.ismodule(value):
            header.append(f"import {value.__name__} as {name}")
        elif (
            (inspect.isclass(value) or inspect.isfunction(value))
            and value.__module__ not in (None, "__main__")
            and "." not in value.__qualname__
        ):
            header.append(f"from {value.__module__} import {value.__qualname__} as {name}")
        elif isinstance(value, CONSTANT_TYPES):
            constants.append(f"{name} = {value!r}")
        else:
            raise ValueError(
                f"the policy uses {name!r}, which was defined in the notebook: "
                "import it inside the function, or define it there"
            )
    source = textwrap.dedent(inspect.getsource(fn))
    alias = "" if fn.__name__ == "policy" else f"\npolicy = {fn.__name__}\n"
    return "\n".join(header + constants) + "\n\n\n" + source + alias


@exercise("lesson2", "ex_wrap_policy")
def check_wrap_policy(
    policy, launch: bool = True, nproc: int = 2, steps: int = 2, none_peak: int | None = None
) -> tuple[bool, str]:
    """``policy(module, recurse, nonwrapped_numel) -> bool`` must make every ``DecoderLayer``
    of ``StagedLM`` its own unit (nothing nested inside it), and leave the root unit smaller
    than one layer; with ``launch``, a real run of ``train.py --model staged --wrap custom``
    must measure an all-gather peak equal to the theory. ``none_peak``: the measured peak
    without a policy, for the comparison (computed from the theory when not given)."""
    staged = staged_lm_module()
    model = staged.staged_lm()
    units = wrapping.policy_units(model, policy)  # NotImplementedError: not attempted yet
    names = {name for name, _, numel in units}
    layers = {
        name: sum(p.numel() for p in m.parameters())
        for name, m in model.named_modules()
        if isinstance(m, staged.DecoderLayer)
    }
    missing = [name for name in layers if name not in names]
    if len(units) == 1:
        return False, (
            "your policy wraps nothing: the whole model is one unit. FSDP only looks "
            "inside a module when policy(module, recurse=True, ...) returns True, and "
            "the layers sit three containers deep (print(model))."
        )
    if missing:
        return False, (
            f"{len(missing)} of {len(layers)} DecoderLayers are not units of their own "
            f"(e.g. {missing[0]}): the repeating class of this model is DecoderLayer, "
            "not Block, and FSDP must recurse through body.stages[s].layers to find it."
        )
    if wrapping.is_nested(units):
        inner = [
            n for n, _, k in units[1:] if k and any(n.startswith(layer + ".") for layer in layers)
        ]
        return False, (
            f"units inside units (e.g. {inner[0] if inner else 'a container'}): wrap "
            "each DecoderLayer whole; smaller units inside it only add collectives."
        )
    root = units[0][2]
    if root >= min(layers.values()):
        covered = {id(p) for _, m, _ in units[1:] for p in m.parameters()}
        left = [
            n
            for n, m in model.named_children()
            if sum(p.numel() for p in m.parameters() if id(p) not in covered) >= 100_000
        ]
        return False, (
            f"the root unit keeps {root:,} parameters ({', '.join(left) or 'leftovers'}),"
            f" more than a layer ({min(layers.values()):,}), and the root stays gathered "
            "for the whole step: give the large embedding and output head units of "
            "their own."
        )
    summary = f"{len(units)} units, root {root:,} parameters"
    if not launch:
        return True, summary + " (structure checked; no launch)."

    from course_lab.notebook import run_lesson

    path = policy_file(policy_source(policy))
    print(
        f"launching: NPROC={nproc} bash launch/lesson2.sh --model staged --wrap custom "
        f"--policy-file {path.name} --steps {steps}",
        flush=True,
    )
    try:
        metrics = run_lesson(
            2,
            "--model",
            "staged",
            "--wrap",
            "custom",
            "--policy-file",
            path,
            "--steps",
            steps,
            nproc=nproc,
            echo=False,
        )
    except RuntimeError as exc:
        return False, f"the launch with your policy failed: {exc}"
    run = metrics["results"]["runs"][0]
    world_size = metrics["world_size"]
    made = [u["unit"] for u in run["units"]]
    planned = [name or "(root)" for name, _, numel in units if numel > 0]
    if sorted(made) != sorted(planned):
        return (
            False,
            f"FSDP made the units {made}, not the ones the policy replay predicted {planned}.",
        )
    peak, expected = run["gathered_peak"], run["gathered_theory"]
    if peak != expected:
        return False, f"measured all-gather peak {peak:,} B differs from the theory {expected:,} B."
    whole = none_peak or theory.wrapping.gathered_peaks([run["num_params"]], world_size)["step"]
    return True, (
        f"{summary}; measured all-gather peak {peak:,} B = theory, "
        f"{peak / whole:.0%} of the whole model gathered at once ({whole:,} B with no "
        f"policy) on {world_size} ranks."
    )
