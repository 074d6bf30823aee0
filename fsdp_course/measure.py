"""Measurement: bytes per rank by category, and calls and bytes of each collective.

Everything here is counted from the tensors themselves, so it works the same on CPU ranks with
gloo and on GPUs with NCCL. (On GPUs, ``torch.cuda.max_memory_allocated`` adds the allocator's
view.) PyTorch's own tools are used where they fit: lesson 5 measures FSDP2 with
``FSDPMemTracker``, which does not understand classic FSDP's flat parameters; and
``CommDebugMode`` counts collectives but not their bytes, hence ``CommCounter`` below, a
dispatch mode over the same c10d operators that records both.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

MiB = 1024**2


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this rank stores: a DTensor's local shard, else ``t`` itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else local_tensor(t).numel() * t.element_size()


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Bytes this rank holds for parameters, gradients and optimizer state.

    Parameters as the wrapper exposes them: classic FSDP's flat-parameter shards (padding
    included), FSDP2's DTensor local shards, DDP's full replica. Gradients are counted where
    they are (call after backward, before ``zero_grad``). Optimizer state counts every tensor
    in ``optimizer.state`` except 0-dim step counters.
    """
    params = list(model.parameters())
    opt_bytes = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            opt_bytes += sum(
                nbytes(v) for v in state.values() if torch.is_tensor(v) and v.dim() > 0
            )
    return {
        "params": sum(nbytes(p) for p in params),
        "grads": sum(nbytes(p.grad) for p in params),
        "optimizer": opt_bytes,
    }


def op_name(func) -> str:
    """'c10d::_allgather_base_' -> the collective it performs, in the course's words."""
    name = func.name().split("::")[-1].lower()
    if "allgather" in name or "all_gather" in name:
        return "all_gather"
    if "reduce_scatter" in name:
        return "reduce_scatter"
    if "allreduce" in name or "all_reduce" in name:
        return "all_reduce"
    if "broadcast" in name:
        return "broadcast"
    return name.strip("_")


def tensors_in(x):
    """Every tensor in ``x``: a tensor, or lists and tuples of them, nested."""
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, (list, tuple)):
        for item in x:
            yield from tensors_in(item)


def payload_bytes(kind: str, args) -> int:
    """The logical size of a collective: the *full* tensor it gathers, scatters or reduces.

    all_gather: the output (every rank's shard together); reduce_scatter: the input (before it
    is scattered); all_reduce / broadcast: the tensor. With a ring algorithm each rank sends
    about (N-1)/N of this for all_gather and reduce_scatter, 2(N-1)/N for all_reduce.
    """
    if kind in ("all_gather", "reduce_scatter"):
        # Both the tensor and the list-of-lists forms put the full-size side first or second;
        # the larger of the first two arguments is the full tensor either way.
        sizes = [sum(t.numel() * t.element_size() for t in tensors_in(a)) for a in args[:2]]
        return max(sizes)
    return sum(t.numel() * t.element_size() for t in tensors_in(args[0]))


# c10d ops that are no collective with a payload: waiting on one, and barriers
UNCOUNTED_C10D_OPS = ("wait", "barrier", "monitored_barrier")


class CommCounter(TorchDispatchMode):
    """Counts calls and payload bytes of each collective issued inside ``with counter:``.

    It sees collectives that go through PyTorch's dispatcher (FSDP, FSDP2, DTensor,
    ``torch.distributed`` calls). DDP's reducer calls the backend directly, so DDP models
    register ``counter.ddp_comm_hook`` instead (lesson 0).
    """

    def __init__(self):
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self.calls = defaultdict(int)
        self.bytes = defaultdict(int)
        self.ddp_buckets = []  # (address, bytes) of each DDP bucket seen by ddp_comm_hook

    def record(self, kind: str, num_bytes: int) -> None:
        self.calls[kind] += 1
        self.bytes[kind] += num_bytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d" and func.name().split("::")[-1] not in UNCOUNTED_C10D_OPS:
            kind = op_name(func)
            self.record(kind, payload_bytes(kind, args))
        return func(*args, **(kwargs or {}))

    def ddp_comm_hook(self, process_group, bucket):
        """A DDP communication hook: count the bucket, then all-reduce it as DDP would."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        buffer = bucket.buffer()
        self.record("all_reduce", buffer.numel() * buffer.element_size())
        self.ddp_buckets.append((buffer.data_ptr(), buffer.numel() * buffer.element_size()))
        return default_hooks.allreduce_hook(process_group, bucket)

    def ddp_bucket_memory(self, model: nn.Module) -> dict:
        """DDP's gradient buckets this step (call after backward): their bytes, and how many of
        the model's gradients lie inside them. By default (``gradient_as_bucket_view=False``)
        none do: the buckets are a second copy of every gradient, kept between steps."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        inside = sum(
            any(start <= g.data_ptr() < start + size for start, size in self.ddp_buckets)
            for g in grads
        )
        return {
            "bytes": sum(size for _, size in self.ddp_buckets),
            "grads_inside": inside,
            "grads": len(grads),
        }

    def summary(self) -> dict:
        return {
            kind: {"calls": self.calls[kind], "bytes": self.bytes[kind]}
            for kind in sorted(self.calls)
        }

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def fsdp_flat_params(model: nn.Module) -> list:
    """Classic FSDP's flat parameters (one per wrapped unit); empty for any other model."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle.flat_param for m in FSDP.fsdp_modules(model) if m._handle is not None]


def _gathered_buffers(flat_params):
    """The full-size working copies classic FSDP all-gathers into (empty storage when freed)."""
    for flat_param in flat_params:
        for attr in ("_full_param_padded", "_full_prec_full_param_padded"):
            buffer = getattr(flat_param, attr, None)
            if buffer is not None:
                yield buffer


class GatheredParamTracker(TorchDispatchMode):
    """Peak bytes of unsharded (all-gathered) parameters held at once, for classic FSDP.

    Classic FSDP all-gathers each unit's flat parameter into ``_full_param_padded`` and frees
    it by resizing its storage to zero, so we add up the storages that are currently allocated.
    Only after collectives: a buffer's storage grows just before the all-gather that fills it
    and shrinks between operators, so the sum is at its largest right after an all-gather, and
    checking there alone gives the same peak for a fraction of the cost of checking after
    every operator. The running maximum is the all-gather peak of the step.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.flat_params = fsdp_flat_params(model)
        self.peak = 0

    def current(self) -> int:
        return sum(b.untyped_storage().nbytes() for b in _gathered_buffers(self.flat_params))

    def __enter__(self):
        # What is already gathered counts too: a phase may start with units held from before
        # (backward starts with the root FULL_SHARD kept after forward) and gather nothing.
        self.peak = max(self.peak, self.current())
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "c10d":
            self.peak = max(self.peak, self.current())
        return out


@contextmanager
def activation_bytes(model: nn.Module):
    """Bytes of tensors autograd saves for backward during the block (activations).

    Weights saved by matmuls are not activations: storages of ``model``'s parameters and of
    classic FSDP's gathered flat parameters are skipped. Each storage is counted once.
    Yields a dict whose ``"bytes"`` fills in as the forward runs.
    """
    result = {"bytes": 0}
    seen = {local_tensor(p).untyped_storage().data_ptr() for p in model.parameters()}
    flat_params = fsdp_flat_params(model)

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            return t
        if ptr in {b.untyped_storage().data_ptr() for b in _gathered_buffers(flat_params)}:
            # Not remembered: FULL_SHARD frees this buffer after the unit's forward, and the
            # allocator may hand its address to a later activation, which must be counted.
            return t
        seen.add(ptr)
        result["bytes"] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield result


def flat_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Like ``state_bytes``, but for classic FSDP counts what is *stored*: each unit's sharded
    flat parameter and its gradient, padding included, whatever ``use_orig_params`` says.

    With ``use_orig_params=True`` ``model.parameters()`` yields the original parameters as views
    into the flat shard without its padding (alignment and world-size padding), so
    ``state_bytes`` would undercount the memory; the optimizer, which holds those views, keeps
    state for real elements only, and that is what ``optimizer`` counts. Not classic FSDP:
    ``state_bytes``.
    """
    flat_params = fsdp_flat_params(model)
    if not flat_params:
        return state_bytes(model, optimizer)
    result = state_bytes(model, optimizer)
    result["params"] = sum(nbytes(p) for p in flat_params)
    result["grads"] = sum(nbytes(p.grad) for p in flat_params)
    return result
