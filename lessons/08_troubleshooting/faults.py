"""The failures lesson 8 reproduces, each as it happens in real jobs, and what a rank can tell
about itself when one strikes (its flight recorder, its memory budget). The exercise (a learner's
``evaluate`` that stops the job) is checked in ``runs.py``.

- ``uneven-data``: the last rank's data runs out one step early (a shard with fewer batches):
  it leaves the loop and waits at the end, while the others start another step's all-gather.
- ``rank-branch``: a collective inside ``if rank == 0:`` (the global loss, "for logging").
- ``oom``: under a per-rank memory budget, the last rank gets a batch much larger than the
  others (a long-document bucket) and runs out of memory: one rank fails, the others are left
  in a collective.
"""

from __future__ import annotations

import json
import os
import re
import resource
from pathlib import Path

import torch

FAULTS = ("none", "uneven-data", "rank-branch", "oom")


def steps_for_rank(fault: str, fault_step: int, steps: int, rank: int, world_size: int) -> int:
    """How many steps of data this rank has: all of them, except with ``uneven-data``."""
    if fault == "uneven-data" and rank == world_size - 1:
        return min(steps, fault_step)
    return steps


def batch_scale(fault: str, fault_step: int, step: int, rank: int, world_size: int) -> int:
    """``oom``: the last rank's batch at ``fault_step`` is 32 times the usual size."""
    return 32 if fault == "oom" and step == fault_step and rank == world_size - 1 else 1


def node_dies_now(step: int, kill_at: int | None, restart: int) -> bool:
    """``--kill-node-at-step``: true on every worker of the last node (torchrun's GROUP_RANK)
    at that step of the first attempt (``restart`` 0 on every rank); restarted workers live on."""
    last_node = int(os.environ.get("GROUP_RANK", "0")) == int(os.environ.get("GROUP_WORLD_SIZE",
                                                                             "1")) - 1
    return step == kill_at and restart == 0 and last_node


def vm_size_bytes() -> int:
    """This process's virtual address space now (``VmSize`` in /proc/self/status)."""
    match = re.search(r"VmSize:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) * 1024


def limit_memory(budget_mib: float, device: torch.device) -> dict:
    """Give this rank ``budget_mib`` MiB more than it uses now, and not a byte beyond.

    CPU: ``RLIMIT_AS`` = current address space + budget; an allocation past it fails in
    PyTorch's CPU allocator ("DefaultCPUAllocator: can't allocate memory"). GPU: the caching
    allocator's cap, ``torch.cuda.set_per_process_memory_fraction`` (what is allocated now +
    budget), which fails with the usual "CUDA out of memory" message.
    """
    budget = int(budget_mib * 2 ** 20)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        cap = torch.cuda.memory_allocated(device) + budget
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
        return {"kind": "cuda memory fraction", "cap_bytes": cap}
    base = vm_size_bytes()
    resource.setrlimit(resource.RLIMIT_AS, (base + budget, resource.RLIM_INFINITY))
    return {"kind": "RLIMIT_AS", "base_bytes": base, "cap_bytes": base + budget}


def flight_recorder_tail(count: int = 2) -> list[dict]:
    """The last collectives this process recorded, from PyTorch's flight recorder (a ring
    buffer of every collective's name, sequence number, sizes and state; on by default,
    ``TORCH_FR_BUFFER_SIZE`` entries). NCCL dumps it by itself on a timeout with
    ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``; here each rank reads its own."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        entries = json.loads(_dump_fr_trace_json(True, True)).get("entries", [])
    except Exception:  # diagnosis must never mask the real error
        return []
    return [{"seq": e.get("collective_seq_id"), "op": e.get("profiling_name"),
             "sizes": e.get("input_sizes"), "state": e.get("state")} for e in entries[-count:]]


def print_flight_recorder(rank: int) -> None:
    """This rank's last recorded collectives, one whole line each on stderr."""
    for entry in flight_recorder_tail():
        say_rank(rank,
                 f"flight recorder: #{entry['seq']} {entry['op']} sizes {entry['sizes']} "
                 f"{entry['state']}")


def is_collective_error(exc: BaseException) -> bool:
    """A failure of communication (timeout, lost peer, mismatch), not of this rank's own work."""
    text = str(exc).lower()
    return any(word in text for word in ("timed out", "connection", "gloo", "nccl", "mismatch"))


def say_rank(rank: int, line: str) -> None:
    """One whole line on stderr (several ranks share it)."""
    os.write(2, f"[rank {rank}] {line}\n".encode())
