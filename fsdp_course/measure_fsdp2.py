"""Measurement for FSDP2 (``fully_shard``): memory by category, what each rank stores, who
holds what after forward, and which group each collective ran over.

- ``CategoryPeakTracker``: PyTorch's ``FSDPMemTracker`` plus a running maximum per category.
  The tracker's own "peak" snapshot is the breakdown at the moment the *total* peaked, where
  the all-gather or gradient buffers can read 0; the running maxima say how large each
  category ever got.
- ``MemoryProbe``: per-rank bytes by category over one step, in the same columns for FSDP2 and
  classic FSDP (which ``FSDPMemTracker`` does not understand).
- ``dtensor_rows``: what a DTensor parameter looks like on every rank: placements, global and
  local shapes, the bytes its storage really takes, ``full_tensor()`` against a reference.
- ``GroupCommCounter``: ``CommCounter`` that also records the size of the group each
  collective ran over (``reshard_after_forward=2`` all-gathers over 2 ranks in backward).
- ``resharding``: what each unit keeps after forward, read from FSDP's own state.

Used by lesson 5's script; lesson 7 measures memory with ``CategoryPeakTracker`` too.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

from fsdp_course.measure import CommCounter, local_tensor, op_name, state_bytes, tensors_in

# FSDPMemTracker's category names -> the course's words (the same as lesson 1's table).
CATEGORIES = {
    "Sharded Param": "params",
    "Sharded Grad": "grads",
    "OptState": "optimizer",
    "Unsharded Param": "gathered",
    "Unsharded Grad": "unsharded_grads",
    "All Gather": "all_gather_buffer",
    "Reduce Scatter": "reduce_scatter_buffer",
    "Activation": "activations",
    "Temp": "temp",
    "Buffer": "buffers",
    "Inputs": "inputs",
}
SUM_KEYS = ("params", "grads", "optimizer", "gathered", "activations")


class CategoryPeakTracker(FSDPMemTracker):
    """``FSDPMemTracker`` that also keeps the largest value each category reached:

        tracker = CategoryPeakTracker(model, optimizer)
        with tracker:
            ...one training step...
        tracker.category_peaks()  # {"params": ..., "gathered": ..., "activations": ..., ...}

    ``category_peaks`` gives bytes per category of ``CATEGORIES``, and ``peak``.
    """

    def __init__(self, mod: nn.Module, optm: torch.optim.Optimizer | None = None):
        super().__init__(mod, optm)
        self.running_max: dict[str, int] = {}

    def _fsdp_state_pre_forward(self, fsdp_mod, orig_fsdp_state_pre_fw):
        # FSDPMemTracker refuses a second forward of the root in one tracked region (gradient
        # accumulation runs several): forget the per-module stats of the previous forward
        # first. The per-category and total peaks are kept.
        inner = super()._fsdp_state_pre_forward(fsdp_mod, orig_fsdp_state_pre_fw)
        if fsdp_mod is not self._root_mod:
            return inner

        def forget_previous_forward(*args, **kwargs):
            if fsdp_mod in self.memory_tracking and not self._mod_tracker.is_bw:
                self.reset_mod_stats()
            return inner(*args, **kwargs)

        return forget_previous_forward

    def _update_snap(self, *args, **kwargs) -> None:  # called on every allocation / free
        super()._update_snap(*args, **kwargs)
        for dev_snap in self._curr_mem_snap.values():
            for key, value in dev_snap.items():
                name = str(getattr(key, "value", key))
                if value > self.running_max.get(name, 0):
                    self.running_max[name] = value

    def category_peaks(self) -> dict[str, int]:
        """Bytes: the running maximum of each category, and ``peak`` (the total's maximum)."""
        peaks = {course: self.running_max.get(name, 0) for name, course in CATEGORIES.items()}
        peaks["peak"] = max(self._peak_mem.values(), default=0)
        return peaks


def is_fsdp2(model: nn.Module) -> bool:
    """An FSDP2 model, or a ``torch.compile`` wrapper around one."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule) or isinstance(
        getattr(model, "_orig_mod", None), FSDPModule
    )


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters ``model`` has registered right now, as this rank holds them.

    Between forward and backward this says what ``reshard_after_forward`` kept: FSDP2 registers
    the sharded parameters (True), the unsharded ones (False), or copies resharded over a
    smaller group (an int) -- the last two on top of the rank's own shard."""
    return sum(local_tensor(p).numel() * p.element_size() for p in model.parameters())


class MemoryProbe:
    """Per-rank bytes by category over one step, in the same columns for both APIs.

    FSDP2: ``CategoryPeakTracker`` (PyTorch's FSDPMemTracker). Classic FSDP, which that tracker
    does not understand: lesson 1's counters (``state_bytes`` of the tensors, the gathered flat
    parameters' storages, the tensors autograd saved). ``enabled=False``: measures nothing.
    """

    def __init__(self, model: nn.Module, optimizer, enabled: bool = True):
        self.model, self.optimizer, self.enabled = model, optimizer, enabled
        self.fsdp2 = is_fsdp2(model)
        self.peaks: dict[str, int] = {}
        self._stack = ExitStack()

    def __enter__(self):
        if not self.enabled:
            return self
        if self.fsdp2:
            self.tracker = self._stack.enter_context(
                CategoryPeakTracker(self.model, self.optimizer)
            )
        else:
            from fsdp_course.measure import GatheredParamTracker, activation_bytes

            self.gathered = self._stack.enter_context(GatheredParamTracker(self.model))
            self.activations = self._stack.enter_context(activation_bytes(self.model))
        return self

    def after_forward(self) -> None:
        """Call between the first forward and its backward: the parameter bytes held then (FSDP2;
        classic FSDP registers its flat parameters, which say nothing here)."""
        if self.enabled and self.fsdp2 and "held_after_forward" not in self.peaks:
            self.peaks["held_after_forward"] = parameter_bytes(self.model)

    def before_zero_grad(self) -> None:
        """Count parameters, gradients and optimizer state from the tensors while gradients
        exist (both APIs, so the columns compare; FSDPMemTracker's own optimizer category also
        holds step() temporaries: kept as ``optimizer_step``)."""
        if self.enabled:
            self.state = state_bytes(self.model, self.optimizer)

    def __exit__(self, *exc):
        self._stack.close()
        if not self.enabled or exc[0] is not None:
            return False
        if self.fsdp2:
            self.peaks.update(self.tracker.category_peaks())
            self.peaks["optimizer_step"] = self.peaks["optimizer"]
            self.peaks.update(self.state)
        else:
            self.peaks.update(self.state)
            self.peaks.update(gathered=self.gathered.peak, activations=self.activations["bytes"])
            self.peaks["peak"] = sum(self.peaks[k] for k in SUM_KEYS)
        self.peaks["sum"] = sum(self.peaks.get(k, 0) for k in SUM_KEYS)
        return False


def placements_str(t: torch.Tensor) -> str:
    placements = getattr(t, "placements", None)
    return "(plain tensor)" if placements is None else ", ".join(map(str, placements))


def dtensor_rows(model: nn.Module, reference: nn.Module | None = None) -> list[dict]:
    """One row per parameter: placements, global shape, and for every rank its local shape and
    the bytes its local tensor's storage really takes (``stored``: FSDP2 pre-pads every rank's
    shard to rank 0's size and hands out a narrowed view, see ``theory.fsdp2.stored_rows``);
    ``full_equal``: ``full_tensor()`` equals the same parameter of ``reference``.

    Collective: every rank must call it (``full_tensor()`` all-gathers; local shapes are
    exchanged with ``all_gather_object``).
    """
    ref = dict(reference.named_parameters()) if reference is not None else {}
    mine, rows = [], []
    for name, p in model.named_parameters():
        local = local_tensor(p)
        mine.append((list(local.shape), local.untyped_storage().nbytes()))
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        row = {
            "name": name,
            "placements": placements_str(p),
            "global": list(p.shape),
            "element_size": p.element_size(),
        }
        same = ref.get(name.replace("_orig_mod.", ""))  # a torch.compile wrapper's prefix
        if same is not None:
            row["full_equal"] = bool(
                torch.equal(full.detach().to(same.dtype).cpu(), same.detach().cpu())
            )
        rows.append(row)
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, mine)
    for i, row in enumerate(rows):
        row["local"] = [theirs[i][0] for theirs in every_rank]
        row["stored"] = [theirs[i][1] for theirs in every_rank]
    return rows


def causal_mask_errors(model: nn.Module) -> int:
    """How many attention ``mask`` buffers differ from the causal (lower-triangular) mask.
    A model built on the meta device and only ``to_empty()``-ed has garbage there."""
    bad = 0
    for module in model.modules():
        mask = getattr(module, "mask", None)
        if isinstance(mask, torch.Tensor) and mask.dim() == 2:
            want = torch.ones_like(mask, dtype=torch.bool).tril()
            # Compare the raw bytes: uninitialised bool memory may hold values other than 0 / 1.
            if not torch.equal(mask.view(torch.uint8), want.view(torch.uint8)):
                bad += 1
    return bad


class GroupCommCounter(CommCounter):
    """``CommCounter`` that also splits each collective by the size of its group.

    An all-gather's output is its group's inputs side by side, and a reduce-scatter's input
    its outputs: the ratio of the two sizes is the number of ranks that took part. Calls and
    payload bytes per group size: ``by_group()`` -> {"all_gather": {4: {...}, 2: {...}}}.
    """

    def reset(self) -> None:
        super().reset()
        self.groups: dict[str, dict[int, dict[str, int]]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = op_name(func) if func.namespace == "c10d" else None
        if kind in ("all_gather", "reduce_scatter"):
            sizes = [sum(t.numel() * t.element_size() for t in tensors_in(a)) for a in args[:2]]
            if min(sizes) > 0:
                slot = self.groups.setdefault(kind, {}).setdefault(
                    round(max(sizes) / min(sizes)), {"calls": 0, "bytes": 0}
                )
                slot["calls"] += 1
                slot["bytes"] += max(sizes)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def by_group(self) -> dict:
        """{"all_gather": {"4": {"calls": 5, "bytes": ...}, "2": {...}}, "reduce_scatter": ...}"""
        return {
            kind: {str(g): dict(v) for g, v in sorted(groups.items())}
            for kind, groups in self.groups.items()
        }


def resharding(model: nn.Module) -> list[dict]:
    """For each FSDP2 unit, what it keeps after forward, as FSDP decided (read after the first
    forward: the root's default is settled there): ``keeps`` "shard" (resharded over all N
    ranks: True), "whole" (not resharded: False), or "1/g" (resharded over groups of g)."""
    from torch.distributed.fsdp import FSDPModule

    units = []
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        for group in module._get_fsdp_state()._fsdp_param_groups:
            info, size = group.post_forward_mesh_info, group.mesh_info.shard_mesh_size
            if info is None:
                keeps = "whole"
            elif info.shard_mesh_size == size:
                keeps = "shard"
            else:
                keeps = f"1/{info.shard_mesh_size}"
            units.append({"unit": name.replace("_orig_mod.", "") or "(root)", "keeps": keeps})
    return units
