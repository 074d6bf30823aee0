"""What torch itself says about a failing job (lesson 8): the collective timeouts a process group
gets by default, read from torch's own files; ``GLOO_SOCKET_IFNAME`` at work; the environment
variables (the knobs) that govern a failing job, each looked up in this torch, NCCL's among them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
import torch.distributed as dist

from fsdp_course.dist import default_timeouts as default_timeouts_by_backend

TORCH = Path(torch.__file__).resolve().parent
C10D_HEADERS = TORCH / "include" / "torch" / "csrc" / "distributed" / "c10d"


def default_timeouts() -> list[dict]:
    """The collective timeout a process group gets when ``init_process_group`` is given none:
    gloo from ``torch.distributed.constants`` (Python), NCCL from ``ProcessGroupNCCL.hpp``
    (a CPU build of torch has no NCCL, so its Python constant is None)."""
    rows = []
    for backend, (value, source) in default_timeouts_by_backend().items():
        seconds = value.total_seconds() if value is not None else None
        rows.append({
            "backend": "gloo (and every non-NCCL backend)" if backend == "gloo" else backend,
            "default": f"{seconds / 60:g} min" if seconds else "?",
            "seconds": seconds,
            "source": source,
        })
    return rows


def nccl_error_handling_modes() -> dict:
    """``TORCH_NCCL_ASYNC_ERROR_HANDLING``'s modes, its default and what each mode does, read
    from ``ProcessGroupNCCL.hpp`` (the ``ErrorHandlingMode`` enum, the comment that names the
    default, and the ``SHOULD_CLEAN_UP`` / ``SHOULD_TEAR_DOWN`` macros the watchdog consults)."""
    text = (C10D_HEADERS / "ProcessGroupNCCL.hpp").read_text(errors="replace")
    enum = re.search(r"enum ErrorHandlingMode \{([^}]*)\}", text)
    modes = {int(v): k for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", enum.group(1))} if enum else {}
    default = re.search(r"the default value \((\d+) - (\w+)\)", text)
    macros = dict(re.findall(r"#define (SHOULD_CLEAN_UP|SHOULD_TEAR_DOWN)\(a\) \((.*)\)", text))

    def holds(macro: str, mode: str) -> bool:  # evaluate "a != NoHandling && a != SkipCleanUp"
        return all(mode != other for other in re.findall(r"a != (\w+)", macros.get(macro, "")))

    return {"modes": {v: {"name": name,
                          "aborts the NCCL communicators": holds("SHOULD_CLEAN_UP", name),
                          "tears the process down": holds("SHOULD_TEAR_DOWN", name)}
                      for v, name in modes.items()},
            "default": int(default.group(1)) if default else None}


def gloo_interface_check(names=("no-such-nic0", "lo"), world_size: int = 2) -> list[dict]:
    """``GLOO_SOCKET_IFNAME`` at work: for each name, ``world_size`` gloo ranks (threads of this
    process sharing one store) build their process group as ``init_process_group("gloo")`` does
    (``ProcessGroupGloo`` reads the variable when it is built, to pick the interface it binds
    and connects on), then all-reduce ``rank + 1``. An interface this machine lacks fails with
    gloo's own message."""
    from concurrent.futures import ThreadPoolExecutor
    from datetime import timedelta

    def rank(store, r):
        group = dist.ProcessGroupGloo(store, r, world_size, timedelta(seconds=10))
        x = torch.tensor([float(r + 1)])
        group.allreduce([x]).wait()
        return x.item()

    saved, rows = os.environ.get("GLOO_SOCKET_IFNAME"), []
    try:
        for name in names:
            os.environ["GLOO_SOCKET_IFNAME"] = name
            store = dist.PrefixStore(f"ifname-{name}", dist.HashStore())
            with ThreadPoolExecutor(world_size) as pool:
                futures = [pool.submit(rank, store, r) for r in range(world_size)]
                try:
                    sums = [f.result() for f in futures]
                    result = f"{world_size} ranks connected; all-reduce of rank + 1: {sums}"
                except RuntimeError as exc:
                    result = f"{type(exc).__name__}: {exc}"
            rows.append({"GLOO_SOCKET_IFNAME": name, "result": result})
    finally:
        if saved is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = saved
    return rows


# (variable, what it does, evidence key: what a run of this lesson showed, or None: NCCL only)
KNOBS = [
    ("TORCH_DISTRIBUTED_DEBUG=DETAIL",
     "checks every collective's op and shapes across ranks; names the mismatch",
     "TORCH_DISTRIBUTED_DEBUG"),
    ("TORCH_FR_BUFFER_SIZE (TORCH_NCCL_TRACE_BUFFER_SIZE)",
     "flight recorder: ring buffer of each process's last collectives "
     "({fr_default} entries by default)",
     "TORCH_FR_BUFFER_SIZE"),
    ("GLOO_SOCKET_IFNAME", "the network interface gloo uses", "GLOO_SOCKET_IFNAME"),
    ("NCCL_DEBUG=INFO / WARN",
     "NCCL's own log: topology, rings, transports (NVLink, IB, sockets), errors", None),
    ("NCCL_SOCKET_IFNAME",
     "the network interface NCCL bootstraps and talks on (e.g. eth0, ^docker)", None),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING",
     "what the watchdog does on a timeout or NCCL error: one of four modes "
     "(nccl_error_handling_modes() reads them and the default from the header)", None),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT",
     "write the flight recorder to files when a collective times out", None),
    ("TORCH_NCCL_BLOCKING_WAIT",
     "wait() blocks and raises on timeout instead of the async watchdog", None),
    ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
     "the monitor thread aborts a process whose watchdog is stuck", None),
]


def gpu_knobs(evidence: dict[str, bool] | None = None) -> list[dict]:
    """The table above: each variable looked up in this torch's own files, and "verified here"
    from ``evidence`` (what this lesson's runs showed), "no" for the NCCL-only ones."""
    evidence = evidence or {}
    files = [C10D_HEADERS / "ProcessGroupNCCL.hpp", C10D_HEADERS / "FlightRecorder.hpp",
             TORCH / "distributed" / "distributed_c10d.py",
             TORCH / "nn" / "parallel" / "distributed.py"]
    texts = {f.name: f.read_text(errors="replace") for f in files if f.is_file()}
    fr_default = re.search(r'"TORCH_NCCL_TRACE_BUFFER_SIZE"\}, (\d+)\)',
                           texts.get("FlightRecorder.hpp", ""))
    rows = []
    for variable, does, key in KNOBS:
        does = does.format(fr_default=fr_default.group(1) if fr_default else "?")
        name = variable.split("=")[0].split(" ")[0]
        found = [file for file, text in texts.items() if name in text]
        if key is None:
            verified = "no (NCCL only; no GPU here)"
        else:
            shown = evidence.get(key)
            verified = "yes, in this lesson's runs" if shown else "not shown by this run"
        rows.append({"variable": variable, "what it does": does,
                     "named in torch 2.13": ", ".join(found) or "(NCCL's own variable)",
                     "verified here": verified})
    return rows
