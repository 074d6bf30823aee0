"""Lesson 7's instruments: per-rank memory over one training step, and a per-rank memory limit.

``StepMemory`` wraps PyTorch's own trackers, which watch every tensor a step allocates and
frees (a dispatch mode plus weak references to storages):

- FSDP2 (``fully_shard``): ``FSDPMemTracker``, through the course's ``CategoryPeakTracker``
  (a running maximum per category). It knows FSDP2's sharded and unsharded parameters.
- classic FSDP and DDP: the general ``MemTracker``. It does not know classic FSDP's flat
  parameters, so the all-gathered buffers are counted from their storages on the side.

Both keep a timeline: the live bytes by category after every allocation and free, with marks
at the ends of forward, backward and the optimizer step. "Activations" are measured the same
way for every API: the bytes the forward pass leaves alive for backward (the total after
forward minus the total before it), less the gathered parameters still held.

``address_space_limit(budget)`` makes "does not fit" real on a CPU rank: the kernel refuses
this process any address space beyond what it uses now plus ``budget`` bytes, so an
allocation past the budget fails for real, as a GPU's would.
"""

from __future__ import annotations

import resource
from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.distributed._tools.mem_tracker import MemTracker

from fsdp_course.measure import GatheredParamTracker
from fsdp_course.measure_fsdp2 import CATEGORIES, CategoryPeakTracker

# The tracker's category names -> the words of the course's plots. FSDP2's names come from
# fsdp_course.measure_fsdp2.CATEGORIES; MemTracker (classic FSDP, DDP) has its own.
PLOT_GROUPS = {"params": "params", "grads": "grads", "optimizer": "optimizer",
               "gathered": "gathered", "all_gather_buffer": "gathered",
               "unsharded_grads": "grad buffers", "reduce_scatter_buffer": "grad buffers",
               "activations": "activations", "temp": "temp", "buffers": "other",
               "inputs": "other"}
GENERIC = {"Parameter": "params", "Gradient": "grads", "Optstate": "optimizer",
           "Activation": "activations", "Temp": "temp", "Buffer": "other", "Input": "other",
           "Other": "grads"}  # DDP's gradient buckets are registered as "Other" (see below)
SERIES = ("params", "grads", "optimizer", "gathered", "grad buffers", "activations", "temp",
          "other")


class _Timeline:
    """Mixin for a MemTracker: after every allocation or free, the live bytes by series."""

    def _start_timeline(self, names: dict, gathered_now=None) -> None:
        self.names, self.gathered_now = names, gathered_now
        self.samples: list[tuple] = []
        self.marks: list[tuple[str, int]] = []

    def _update_snap(self, *args, **kwargs) -> None:
        super()._update_snap(*args, **kwargs)
        snap = {}
        for dev_snap in self._curr_mem_snap.values():
            for key, value in dev_snap.items():
                series = self.names.get(str(getattr(key, "value", key)))
                if series:
                    snap[series] = snap.get(series, 0) + value
        total = sum(snap.values())
        if self.gathered_now is not None:  # classic FSDP: gathered buffers hide in other series
            snap["gathered"] = self.gathered_now()
        self.samples.append((total, *(snap.get(s, 0) for s in SERIES)))

    def _update_peak_stats(self, peak_state) -> None:
        # Only the step's own peak. MemTracker also keeps every module's peak: a loop over all
        # modules after every operator and a deepcopy at each new local peak, which this lesson
        # does not read and which cost most of the tracker's time.
        for dev, dev_snap in self._curr_mem_snap.items():
            total = dev_snap["Total"]
            if self._peak_mem.get(dev, 0) < total:
                self._peak_mem[dev] = total
                self._peak_mem_snap[dev] = dict(dev_snap)

    def mark(self, name: str) -> None:
        self.marks.append((name, len(self.samples)))

    def total_now(self) -> int:
        return self.samples[-1][0] if self.samples else 0

    def gathered_at(self, index: int) -> int:
        return self.samples[index][1 + SERIES.index("gathered")] if self.samples else 0


class _FSDP2Timeline(_Timeline, CategoryPeakTracker):
    pass


class _GenericTimeline(_Timeline, MemTracker):
    pass


class StepMemory:
    """Track one training step: ``with StepMemory(model, optimizer, api) as mem: ...``, calling
    ``mem.mark("forward")`` / ``("backward")`` / ``("step")`` as the step passes them."""

    def __init__(self, model: nn.Module, optimizer, api: str, ddp_buckets=(), enabled: bool = True,
                 vm_base: int | None = None):
        self.api, self.enabled = api, enabled
        # Under an address-space limit: how far this process grew past ``vm_base``, sampled
        # at each mark (what the limit counts; no tracker runs then).
        self.vm_base, self.vm_growth = vm_base, 0
        if not enabled:
            return
        if api == "fsdp2":
            self.tracker = _FSDP2Timeline(model, optimizer)
            self.tracker._start_timeline({name: PLOT_GROUPS[course] for name,
                                          course in CATEGORIES.items()})
        else:
            self.tracker = _GenericTimeline()
            gathered = classic_gathered(model) if api == "classic" else None
            self.tracker._start_timeline(GENERIC, gathered)
            # Tensors made before the step are tracked only if registered: parameters and
            # optimizer state, and DDP's gradient buckets (allocated when DDP was built).
            self.tracker.track_external(model, optimizer, *ddp_buckets)

    def __enter__(self):
        if self.enabled:
            self.tracker.__enter__()
            self.tracker.mark("start")
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.tracker.__exit__(*exc)
        return False

    def mark(self, name: str) -> None:
        if self.vm_base is not None:
            self.vm_growth = max(self.vm_growth, vm_size() - self.vm_base)
        if self.enabled:
            self.tracker.mark(name)

    def results(self, max_points: int = 300) -> dict:
        """Peak, activations (as defined in the module doc), and the timeline, thinned to at
        most ``max_points`` samples by keeping each bin's largest total (the peak survives)."""
        t = self.tracker
        marks = dict(t.marks)
        before, after = marks["start"] - 1, marks["forward"] - 1
        total = [s[0] for s in t.samples]
        peak_index = max(range(len(total)), key=total.__getitem__)
        base = total[before] if before >= 0 else 0
        activations = total[after] - base - (t.gathered_at(after) - (t.gathered_at(before)
                                                                     if before >= 0 else 0))
        step = max(1, len(total) // max_points)
        keep = sorted({max(range(i, min(i + step, len(total))), key=total.__getitem__)
                       for i in range(0, len(total), step)} | {peak_index})
        return {
            "peak": max(total),
            "activations": activations,
            "at_peak": dict(zip(SERIES, t.samples[peak_index][1:])),
            "peak_phase": next((name for name, i in t.marks if i > peak_index), "step"),
            "series_max": {s: max(row[1 + k] for row in t.samples) for k, s in enumerate(SERIES)},
            "timeline": {"index": keep, "total": [total[i] for i in keep],
                         **{s: [t.samples[i][1 + k] for i in keep] for k, s in enumerate(SERIES)},
                         "marks": {name: i for name, i in t.marks}},
        }


def classic_gathered(model: nn.Module):
    """A function that returns the bytes of classic FSDP's unsharded parameters allocated now:
    the all-gathered flat parameters, and with NO_SHARD (one rank) and bf16 the low-precision
    copy FSDP makes of each unit instead (``_mp_shard``: the whole unit when nothing is
    sharded)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    gathered = GatheredParamTracker(model)
    handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]
    unsharded_copies = [h.flat_param._mp_shard for h in handles
                        if not h.uses_sharded_strategy and hasattr(h.flat_param, "_mp_shard")]

    def now() -> int:
        return gathered.current() + sum(t.untyped_storage().nbytes() for t in unsharded_copies)

    return now


def vm_size() -> int:
    """Bytes of address space this process holds now (``VmSize`` in /proc/self/status)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status (address-space limits need Linux)")


def _libc():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters


def return_freed_memory_at_once() -> None:
    """Make the address space follow the live bytes. glibc's malloc serves a large block from
    its own heap once a block that size has been freed (its threshold adapts), and keeps freed
    heap memory for later: address space the limit would count although no tensor uses it.
    A fixed threshold of 64 KiB gives every tensor larger than that its own mapping, returned
    to the kernel when the tensor is freed. And a thread that finds the heap busy may open an
    arena of its own, reserving 64 MiB of address space at once (glibc's arena size on 64-bit
    Linux), far more than its tensors use: one arena for all threads. Call it before any thread
    starts: memory a thread's arena or the heap already holds would be room the limit does not
    see (called late, DDP trained a step that does not fit in the limit).
    (Linux with glibc; elsewhere nothing changes.)"""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_ARENA_MAX, 1)
        libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)  # fixed, no longer adaptive
        libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)  # give heap tops back early
        libc.malloc_trim(0)


def keep_freed_memory_again() -> None:
    """After the limited runs: large blocks from the heap again, freed memory kept for reuse,
    as glibc does by default once its thresholds have adapted (to at most 32 MiB and twice
    that). A mapping made and zeroed for every large tensor costs CPU time every step, which
    the runs without a limit need not pay."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, 32 * 2 ** 20)
        libc.mallopt(M_TRIM_THRESHOLD, 64 * 2 ** 20)


@contextmanager
def address_space_limit(budget_bytes: int | None):
    """Inside the block this process may grow its address space by ``budget_bytes`` at most
    (``RLIMIT_AS``, the soft limit only, so it can be lifted again afterwards). Past it,
    ``malloc`` fails and PyTorch raises its real allocation error. ``None``: no limit."""
    if not budget_bytes:
        yield None
        return
    return_freed_memory_at_once()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    base = vm_size()
    limit = base + budget_bytes if hard == resource.RLIM_INFINITY else min(hard,
                                                                           base + budget_bytes)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield base
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def ddp_buckets(model) -> dict[int, torch.Tensor]:
    """Registers a DDP communication hook on ``model`` that all-reduces as DDP would and
    remembers each bucket's buffer, so the tracker can be told about memory DDP allocated before
    the tracked step; returns those buffers by bucket index, filled as the model trains."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    buckets: dict[int, torch.Tensor] = {}

    def hook(process_group, bucket):
        # Overwritten every step: DDP rebuilds its buckets after the first one.
        buckets[bucket.index()] = bucket.buffer()
        return default_hooks.allreduce_hook(process_group, bucket)

    model.register_comm_hook(None, hook)
    return buckets


def tensor_devices(model: nn.Module, optimizer) -> dict:
    """Where the first parameter, its gradient and its optimizer state live (offload)."""
    param = next(model.parameters())
    local = param.to_local() if hasattr(param, "to_local") else param
    state = optimizer.state.get(param, {})
    return {"parameter": str(local.device), "gradient": str(param.grad.device)
            if param.grad is not None else "-",
            "optimizer state": ", ".join(sorted({str(v.device) for v in state.values()
                                                 if torch.is_tensor(v) and v.dim() > 0})) or "-"}
