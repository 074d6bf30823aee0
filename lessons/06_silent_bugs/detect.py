"""Lesson 6's measuring tools: they find silent bugs that raise nothing.

- ``compare_across_ranks(tensors)``: a checksum per tensor, all-gathered, compared. Cheap enough
  to keep in a real job (one pass over the weights, one all-gather of 16 bytes per tensor).
  Run it *before* wrapping: afterwards every rank all-gathers the same full parameters by
  construction, so a mixed-up model passes (part A measures both).
- ``slice_origins(full, candidates)``: which elements of a gathered parameter equal which
  rank's own initialisation.
- ``DtypeProbe``: the dtype of every tensor class during one training step, read from the
  tensors themselves (part C's table); ``dtype_name``: how every table writes a dtype.
- ``full_state(model)``: every tensor of a wrapped model, gathered whole, to hold against the
  reference's; ``max_diff`` and ``rel_error(a, b)``: how far they are from it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils._python_dispatch import TorchDispatchMode

from fsdp_course.measure import CommCounter, local_tensor

# Classic FSDP gathers on CPU only without offload (offload_to_cpu crashes on CPU ranks).
FULL = StateDictOptions(full_state_dict=True, cpu_offload=False)


def checksum(t: torch.Tensor) -> torch.Tensor:
    """Two float64 numbers per tensor: the sum, and a position-weighted sum (which also
    catches equal values in a different order)."""
    flat = local_tensor(t).detach().reshape(-1).double()
    weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64, device=flat.device)
    return torch.stack([flat.sum(), (flat * weights).sum()])


def dtype_name(x) -> str:
    """A tensor's dtype (or a dtype) as the tables write it: ``torch.bfloat16`` -> ``bfloat16``."""
    return str(getattr(x, "dtype", x)).replace("torch.", "")


def rel_error(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over all tensors of the dicts (matched by name)."""
    num = sum(((a[k] - b[k]).double() ** 2).sum() for k in b)
    den = sum((b[k].double() ** 2).sum() for k in b)
    return float((num / den).sqrt())


def full_state(model) -> dict:
    """Every parameter and persistent buffer, gathered whole on every rank, by its plain name
    (works for classic FSDP, FSDP2, DDP and plain modules alike)."""
    state = get_model_state_dict(model, options=FULL)
    # FSDP2 hands back DTensors here without cpu_offload: full_tensor() is the whole value.
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in state.items()}


def max_diff(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in b)


def compare_across_ranks(named_tensors) -> dict:
    """Which of ``named_tensors`` (name, tensor) differ between ranks, and what finding out cost.

    Every rank must pass the same names in the same order. Returns ``{"differ": [names],
    "checked": n, "ms": time, "bytes": all-gathered bytes}``."""
    named_tensors = list(named_tensors)
    start = time.perf_counter()
    with CommCounter() as comm:
        mine = torch.stack([checksum(t) for _, t in named_tensors])
        everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, mine)
    ms = (time.perf_counter() - start) * 1e3
    differ = [name for i, (name, _) in enumerate(named_tensors)
              if any(not torch.equal(other[i], everyone[0][i]) for other in everyone[1:])]
    return {"differ": differ, "checked": len(named_tensors), "ms": ms, "bytes": comm.total_bytes}


def model_states(model: nn.Module):
    """(name, tensor) for every parameter and floating-point buffer of ``model``."""
    yield from model.named_parameters()
    yield from ((n, b) for n, b in model.named_buffers() if b.is_floating_point())


def slice_origins(full: torch.Tensor, candidates: list[torch.Tensor]) -> list[tuple[str, int, int]]:
    """Runs ``(who, start, end)`` of the flattened ``full`` tensor: ``who`` is "rank r" where its
    elements equal ``candidates[r]`` only, "all" where every candidate has those very values
    (zeros, ones), "none" where no candidate matches."""
    full = full.detach().reshape(-1)
    matches = torch.stack([full == c.reshape(-1).to(full.device) for c in candidates])
    owner = matches.int().argmax(0)                         # the first candidate that matches
    owner[matches.all(0)] = len(candidates)                 # every one matches
    owner[~matches.any(0)] = len(candidates) + 1            # none matches
    labels = [f"rank {r}" for r in range(len(candidates))] + ["all", "none"]
    cuts = [0, *(torch.nonzero(owner[1:] != owner[:-1]).flatten() + 1).tolist(), full.numel()]
    return [(labels[int(owner[a])], a, b) for a, b in zip(cuts, cuts[1:])]


class DtypeProbe(TorchDispatchMode):
    """Records dtypes during a step: the parameters a module computes with (``gathered``), the
    buffer it reads, the tensors each collective moves (``all_gather`` / ``reduce``)."""

    def __init__(self, module: nn.Module, buffer_owner: nn.Module | None = None, buffer: str = ""):
        super().__init__()
        self.seen: dict[str, str] = {}
        self._hooks = [module.register_forward_pre_hook(self._pre_forward)]
        self.buffer_owner, self.buffer = buffer_owner, buffer

    def _pre_forward(self, module, args):
        self.seen.setdefault("gathered params", dtype_name(module.weight))
        if self.buffer_owner is not None:
            self.seen.setdefault("buffer", dtype_name(getattr(self.buffer_owner, self.buffer)))
        return None  # a pre-hook that returns something replaces the module's inputs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::")[-1]
        if func.namespace == "c10d" and ("allgather" in name or "all_gather" in name):
            self.seen.setdefault("all-gather", _first_dtype(args))
        elif func.namespace == "c10d" and "reduce_scatter" in name:
            self.seen.setdefault("reduce", _first_dtype(args))
        return func(*args, **(kwargs or {}))

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()


def _first_dtype(args) -> str:
    for a in args:
        if torch.is_tensor(a):
            return dtype_name(a)
        if isinstance(a, (list, tuple)):
            found = _first_dtype(a)
            if found:
                return found
    return ""
