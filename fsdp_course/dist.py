"""Process-group setup and teardown, shared by every lesson script.

    with distributed(seed=cfg.seed) as env:
        ...  # env.rank, env.world_size, env.device, env.backend

- Started without torchrun: one line that says how to launch, exit code 2.
- Device and backend from what is there: CUDA + NCCL, else CPU + gloo (``COURSE_DEVICE=cpu``
  forces CPU on a GPU machine).
- Collectives time out after ``COURSE_TIMEOUT_S`` seconds (default 120), so a stuck rank fails
  in bounded time with a message instead of hanging for the default 30 minutes.
- The same seed on every rank, so every rank builds the same initial model.
- Teardown that cannot abort at interpreter exit: barrier -> gc -> destroy_process_group ->
  flush -> ``os._exit``. Left to the interpreter's own shutdown, a gloo worker thread can drop
  the last reference to a tensor while Python is tearing down, and the process dies with
  ``terminate called without an active exception`` (SIGABRT) after a run that had finished.
- Every line a rank prints is written whole (``say``): several ranks share one stream, and a
  line split over two writes lets another rank's line land in its middle.
- A rank whose collective fails because a peer is gone waits a moment before it leaves, so the
  rank that failed first is the one torchrun sees exit first (and reports), and says why.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def say(line: str, stream=None) -> None:
    """Write ``line`` and its newline to ``stream`` (default: ``sys.stderr`` at the time of the
    call) in one write. ``print`` writes the text and the newline separately; with unbuffered
    streams (``PYTHONUNBUFFERED=1``) another rank's line can land between the two. One write of
    under PIPE_BUF bytes (4096 on Linux) to a pipe reaches it whole."""
    _write_whole(line + "\n", sys.stderr if stream is None else stream)


def _write_whole(text: str, stream) -> None:
    stream.flush()  # what was printed before this line comes out before it
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # a StringIO, a notebook's stream: no fd
        stream.write(text)
        stream.flush()
        return
    data = text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
    while data:  # os.write may write less than asked (a signal, a full non-blocking pipe)
        data = data[os.write(fd, data) :]


class CourseError(Exception):
    """An expected failure (bad input, wrong checkpoint): reported as one line, no traceback."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def print0(
        self, *args, sep: str | None = " ", end: str | None = "\n", file=None, flush: bool = True
    ) -> None:
        """Print on rank 0 only: the other ranks stay quiet unless something is wrong. Takes
        ``print``'s arguments and writes the text whole, in one write (see ``say``), so
        ``flush`` changes nothing."""
        if self.is_rank0:
            text = (" " if sep is None else sep).join(map(str, args))
            _write_whole(text + ("\n" if end is None else end), file or sys.stdout)


def launcher_hint(script: str) -> str:
    """The command that runs ``script`` properly, e.g. ``bash launch/lesson1.sh``."""
    match = re.search(r"lessons/(\d+)_[^/]+/", str(Path(script).resolve()))
    if match:
        return f"bash launch/lesson{int(match.group(1))}.sh"
    return f"torchrun --standalone --nproc-per-node=2 {script}"


def require_torchrun(script: str | None = None) -> None:
    """Exit 2 with one line unless this process was started by torchrun."""
    missing = [name for name in TORCHRUN_VARS if name not in os.environ]
    if missing:
        script = script or sys.argv[0]
        say(
            f"{Path(script).name}: this script runs as several processes started by torchrun, "
            f"which sets {', '.join(missing)}; run: {launcher_hint(script)}  "
            f"(or: torchrun --standalone --nproc-per-node=2 {script})"
        )
        sys.exit(2)


def pick_device(local_rank: int) -> tuple[torch.device, str]:
    """CUDA + NCCL when this process can see a GPU for its local rank, else CPU + gloo."""
    want_cpu = os.environ.get("COURSE_DEVICE", "").lower() == "cpu"
    if not want_cpu and torch.cuda.is_available() and local_rank < torch.cuda.device_count():
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def timeout_seconds() -> float:
    raw = os.environ.get("COURSE_TIMEOUT_S", "120")
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if value <= 0:
        # Every rank reads the same setting: rank 0 says it once for all.
        leave_after_rank0(
            int(os.environ.get("RANK", "0")),
            f"COURSE_TIMEOUT_S must be a positive number of seconds, got {raw!r}",
        )
    return value


NCCL_HEADER = "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"


def default_timeouts() -> dict[str, tuple[timedelta | None, str]]:
    """What ``init_process_group`` waits in a collective when given no ``timeout=``, per backend,
    and where this torch defines it: ``{"gloo": (timedelta, source), "nccl": (timedelta or None,
    source)}``. gloo (and every backend but NCCL) uses ``default_pg_timeout``; a torch built with
    NCCL exposes NCCL's as ``default_pg_nccl_timeout``, a CPU-only build sets that to None but
    still ships the C++ header that defines it (``kProcessGroupNCCLDefaultTimeout``)."""
    from torch.distributed import constants

    gloo = (constants.default_pg_timeout, "torch.distributed.constants.default_pg_timeout")
    if constants.default_pg_nccl_timeout is not None:
        source = "torch.distributed.constants.default_pg_nccl_timeout"
        return {"gloo": gloo, "nccl": (constants.default_pg_nccl_timeout, source)}
    header = Path(torch.__file__).parent / NCCL_HEADER
    text = header.read_text() if header.is_file() else ""
    match = re.search(
        r"kProcessGroupNCCLDefaultTimeout\s*=\s*std::chrono::milliseconds\(([\d\s*]+)\)", text
    )
    if not match:
        return {"gloo": gloo, "nccl": (None, "not found in this torch")}
    milliseconds = 1
    for factor in match.group(1).split("*"):
        milliseconds *= int(factor)
    source = f"torch/{NCCL_HEADER} (kProcessGroupNCCLDefaultTimeout = {match.group(1).strip()} ms)"
    return {"gloo": gloo, "nccl": (timedelta(milliseconds=milliseconds), source)}


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


RANK0_GRACE_S = 3.0
JOIN_TIMEOUT_S = 120.0


def leave_after_rank0(rank: int, message: str, code: int = 2) -> None:
    """Exit ``code`` with ``message`` said once, by rank 0, for an error every rank meets alike
    (bad input). The other ranks wait a moment first: torchrun stops all ranks as soon as one
    exits, and rank 0 must have said why by then. If rank 0 never exits (the error was this
    rank's alone), the rank says it itself after the wait."""
    if rank == 0:
        say(message)
    else:
        time.sleep(RANK0_GRACE_S)
        say(f"[rank {rank}] {message}")
    _exit(code)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


LOST_PEER_WAIT_S = 1.0
# What gloo and NCCL say when the other end of a connection is gone (the peer died or left).
LOST_PEER = re.compile(r"by peer|broken pipe|remote process exited", re.IGNORECASE)


def _wait_if_a_peer_is_gone(message: str) -> None:
    """A rank that failed because a peer died or left is a consequence, not the cause: it
    waits a moment, so that the cause leaves first (torchrun reports the first rank to exit
    and stops the others) and its line, not this one, is what the learner reads."""
    if LOST_PEER.search(message):
        time.sleep(LOST_PEER_WAIT_S)


@contextmanager
def distributed(seed: int = 0):
    """Join the process group torchrun prepared; always leave it cleanly (see module doc)."""
    require_torchrun()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = timeout_seconds()
    try:
        # device_id binds NCCL to this GPU eagerly; gloo on CPU needs none. Joining gets at
        # least JOIN_TIMEOUT_S: on a busy machine one rank may import torch many seconds after
        # another, and a short COURSE_TIMEOUT_S (a lesson showing a stuck collective) is
        # about the collectives, not about that wait.
        dist.init_process_group(
            backend=backend,
            timeout=timedelta(seconds=max(timeout, JOIN_TIMEOUT_S)),
            device_id=device if device.type == "cuda" else None,
        )
        # Everyone has fully joined before anyone may leave: a rank that exits early (a bad
        # flag, found by all ranks alike) must not cut a peer's connection mid-handshake.
        dist.barrier()
        if timeout < JOIN_TIMEOUT_S:
            # From here on, collectives of the default group wait COURSE_TIMEOUT_S. (torch has
            # no public setter; this is what init_process_group's timeout would have set.)
            dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout))
    except Exception as exc:  # one line, not a traceback from deep in c10d
        message = f"could not join the process group: {_one_line(exc)}"
        _wait_if_a_peer_is_gone(message)
        say(f"[rank {rank}] error: {message}")
        _exit(1)
    torch.manual_seed(seed)
    if rank != 0:
        # N copies of the same warning teach nothing: rank 0 shows each one once.
        warnings.simplefilter("ignore")
    env = DistEnv(rank, local_rank, world_size, device, backend)
    # What exists now (torch's modules, about 240,000 objects) lives as long as the process:
    # the garbage collector stops walking it (each full collection cost ~0.13 CPU s a rank).
    gc.freeze()
    try:
        yield env
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            leave_after_rank0(rank, str(exc.code))  # sys.exit("message"): bad input
        _exit(exc.code or 0)
    except KeyboardInterrupt:
        _exit(130)
    except CourseError as exc:
        leave_after_rank0(rank, f"error: {exc}")
    except BaseException as exc:  # one readable line instead of N tracebacks
        _fail(rank, exc, timeout)
    # Success: leave together. Without os._exit, gloo worker threads can drop the last tensor
    # reference during interpreter shutdown and abort a run that had finished.
    try:
        dist.barrier()  # a peer stuck in a collective of its own never comes: this times out
        gc.collect()
        dist.destroy_process_group()
    except Exception as exc:  # one line, not a traceback from deep in c10d
        _fail(rank, exc, timeout, "could not leave the process group together: ")
    _exit(0)


def _fail(rank: int, exc: BaseException, timeout: float, what: str = "") -> None:
    """Say what went wrong on this rank in one line (a timeout says which setting bounds it),
    the traceback only with COURSE_DEBUG=1, and exit 1."""
    message = what + _one_line(exc)
    if "timed out" in message.lower() or "timeout" in message.lower():
        message += (
            f"  (a rank waited more than COURSE_TIMEOUT_S={timeout:g} s for a collective"
            " that another rank never joined)"
        )
    _wait_if_a_peer_is_gone(message)
    say(f"[rank {rank}] error: {message}")
    if os.environ.get("COURSE_DEBUG"):
        # Line by line, each marked with its rank: N tracebacks at once stay readable.
        for line in traceback.format_exc().splitlines():
            say(f"[rank {rank}] {line}")
    else:
        say(f"[rank {rank}] (set COURSE_DEBUG=1 for the full traceback)")
    _exit(1)


def mean_over_ranks(value: torch.Tensor) -> float:
    """The mean of a scalar over all ranks (the loss of the global batch). SUM then divide:
    gloo has no AVG reduction."""
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value.item() / dist.get_world_size()
