"""Wrap policies (lesson 2): which modules a policy makes FSDP units, and what that costs.

A classic-FSDP wrap policy is a callable ``policy(module, recurse, nonwrapped_numel) -> bool``.
FSDP walks the module tree depth first (``torch.distributed.fsdp.wrap._recursive_wrap``):

    for each module, starting at the root's children:
        if policy(module, recurse=True, nonwrapped_numel=all its parameters):
            visit its children first (they may become units and take their parameters)
            if policy(module, recurse=False, nonwrapped_numel=parameters no child took):
                module becomes an FSDP unit (a flat parameter of those parameters)
    the root module is always a unit: it takes every parameter no other unit took

``policy_units`` replays that walk without any process group, so a notebook or a test can see
what a policy *would* wrap; ``forward_order`` finds the order the units run in. What those
units cost is theory: ``fsdp_course.theory.wrapping``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

# --- which modules a policy wraps ------------------------------------------------------------


def policy_units(model: nn.Module, policy) -> list[tuple[str, nn.Module, int]]:
    """The FSDP units ``policy`` would make of ``model`` (unwrapped), as ``(name, module,
    numel)``: the root first (name ``""``; numel = what no other unit took, possibly 0), then
    the wrapped modules in the order FSDP's walk finishes them (children before parents).

    ``policy=None`` is "no auto-wrap": the root alone. Mirrors ``_recursive_wrap`` (module doc).
    """
    units: list[tuple[str, nn.Module, int]] = []

    def visit(name: str, module: nn.Module, only_children: bool = False) -> int:
        total = sum(p.numel() for p in module.parameters())
        if not policy(module=module, recurse=True, nonwrapped_numel=total):
            return 0
        taken = sum(
            visit(f"{name}.{child_name}" if name else child_name, child)
            for child_name, child in module.named_children()
        )
        if not only_children and policy(
            module=module, recurse=False, nonwrapped_numel=total - taken
        ):
            units.append((name, module, total - taken))
            return total
        return taken

    taken = visit("", model, only_children=True) if policy is not None else 0
    root_numel = sum(p.numel() for p in model.parameters()) - taken
    return [("", model, root_numel), *units]


def is_nested(units: list[tuple[str, nn.Module, int]]) -> bool:
    """True when some non-root unit lies inside another non-root unit (units that hold no
    parameters of their own do not count: FSDP gives them no flat parameter)."""
    names = [name for name, _, numel in units[1:] if numel > 0]
    return any(a != b and a.startswith(b + ".") for a in names for b in names)


def forward_order(model: nn.Module, units: list[tuple[str, nn.Module, int]]) -> list[int]:
    """Numels of the units, root first, the others in the order the forward pass runs them,
    found by running the model once on a tiny input with forward hooks."""
    order: list[str] = []
    hooks = [
        module.register_forward_pre_hook(lambda m, args, name=name: order.append(name))
        for name, module, _ in units[1:]
    ]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 2, dtype=torch.long))
    finally:
        for hook in hooks:
            hook.remove()
    numel = {name: n for name, _, n in units}
    return [units[0][2], *(numel[name] for name in order)]


# --- which units FSDP made -------------------------------------------------------------------


def unit_name(fsdp_path: str) -> str:
    """A unit's name in the unwrapped model: 'blocks.0._fsdp_wrapped_module' -> 'blocks.0';
    the root is '(root)'."""
    parts = [part for part in fsdp_path.split(".") if part != "_fsdp_wrapped_module"]
    return ".".join(parts) or "(root)"


def fsdp_units(model: nn.Module, world_size: int, param_bytes: int = 4) -> list[dict]:
    """The units classic FSDP made, read off the wrapped model (root first): name, wrapped
    class, parameters, and the bytes its flat parameter occupies when all-gathered (every
    rank's shard, padding included)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [
        {
            "unit": unit_name(path),
            "wraps": type(module.module).__name__,
            "numel": module._handle.flat_param._unpadded_unsharded_size.numel(),
            "gathered_bytes": module._handle.flat_param.numel() * world_size * param_bytes,
        }
        for path, module in model.named_modules()
        if isinstance(module, FSDP) and module._handle is not None
    ]
