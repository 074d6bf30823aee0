"""Lesson 8's lab bench (notebook and tests): launch a job the way a learner would, watch it,
and diagnose it with the real tools: the ranks' messages, ``py-spy dump`` of every rank,
torchrun's root-cause report, two agents as two nodes, SLURM.

Every launch prints its command; every time is measured from the job's own output lines.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from course_lab.notebook import REPO, lesson_env

LESSON_DIR = Path(__file__).resolve().parent
SCRIPT = LESSON_DIR / "train.py"
STEP_LINE = re.compile(r"^\s+(\d+) \|")


class Job:
    """A launch running in the background; every output line is kept with its arrival time."""

    def __init__(self, command: list[str], env: dict, echo: bool = False, shown: dict | None = None):
        self.command, self.echo = command, echo
        self.lines: list[tuple[float, str]] = []
        self.start = time.monotonic()
        words = [f"{k}={v}" for k, v in (shown or {}).items()]
        words += [str(Path(c).relative_to(REPO)) if str(c).startswith(str(REPO) + "/") else str(c)
                  for c in command]
        print("+ " + " ".join(words), flush=True)
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=REPO, bufsize=1, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.start, line.rstrip("\n")))
            if self.echo:
                print(line, end="", flush=True)

    def wait(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode

    def kill(self):
        """Stop the whole job (its own session: agent and workers), never anything else."""
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def first(self, pattern: str) -> tuple[float, str] | None:
        """(seconds since launch, line) of the first line matching ``pattern``."""
        for t, line in list(self.lines):
            if re.search(pattern, line):
                return t, line
        return None

    def last_step_time(self) -> float | None:
        steps = [t for t, line in list(self.lines) if STEP_LINE.match(line)]
        return steps[-1] if steps else None


def launch(*args, nproc: int = 2, env: dict | None = None, echo: bool = False,
           launcher: str | None = None) -> Job:
    """``NPROC=nproc bash launch/lesson8.sh args`` (or ``launch/<launcher>``) in the background."""
    command = ["bash", str(REPO / "launch" / (launcher or "lesson8.sh")), *map(str, args)]
    return Job(command, lesson_env(nproc, env), echo=echo, shown={"NPROC": nproc, **(env or {})})


def torchrun(*args, nproc: int = 2, env: dict | None = None) -> Job:
    """Plain ``torchrun`` (``python -m torch.distributed.run``) without the course's wrapper, so
    its own failure report is printed as on any cluster."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={nproc}", str(SCRIPT.relative_to(REPO)), *map(str, args)]
    return Job(command, lesson_env(nproc, env), shown=env)


# --- hangs: find the workers, dump their stacks --------------------------------------------------

def worker_pids(root_pid: int) -> dict[int, int]:
    """{rank: pid} of the torchrun workers below ``root_pid`` (read from /proc: RANK in their
    environment), as a learner would find them with ``ps`` on each node."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(kv.split(b"=", 1) for kv in environ if b"=" in kv)
        if b"RANK" in env and b"TORCHELASTIC_RUN_ID" in env and b"LOCAL_RANK" in env:
            found[int(env[b"RANK"])] = pid
    return found


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise FileNotFoundError("py-spy is not installed: pip install py-spy")
    return found


def dump_stack(pid: int) -> str:
    """``py-spy dump --pid PID``: the Python stack of every thread of a live process."""
    result = subprocess.run([py_spy(), "dump", "--pid", str(pid)], capture_output=True, text=True,
                            timeout=20)
    return result.stdout + result.stderr


def waiting_line(stack: str, prefer: str = "train.py") -> dict:
    """The innermost frame of the main thread (where it waits), and the innermost frame in
    ``prefer`` (the line of the learner's own script that called it)."""
    main = stack.split("\nThread ")[1] if "\nThread " in stack else stack
    frames = re.findall(r"^\s+(\S+) \(([^)]+)\)$", main, flags=re.M)
    ours = next(((fn, where) for fn, where in frames if prefer in where), None)
    return {"innermost": " ".join(frames[0]) if frames else "?",
            "script_line": " ".join(ours) if ours else "?"}


def hang_and_dump(*args, timeout_s: int = 8, settle_s: float = 1.0, env: dict | None = None,
                  nproc: int = 2) -> dict:
    """Launch a job that hangs; once every rank's stack has stopped changing, ``py-spy dump``
    each rank; then let the collective timeout end the job. Returns the stacks, the line each
    rank waits on, and the times (seconds from the last step line the job printed)."""
    job = launch(*args, nproc=nproc, env={"COURSE_TIMEOUT_S": timeout_s, **(env or {})})
    stacks, previous, stuck_at = {}, None, None
    deadline = time.monotonic() + 120
    while job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(settle_s)
        pids = worker_pids(job.proc.pid)
        if len(pids) < nproc or job.last_step_time() is None:
            continue
        current = {rank: waiting_line(dump_stack(pid)) for rank, pid in sorted(pids.items())}
        if current == previous:  # two dumps alike, a second apart: nobody moves
            stuck_at = time.monotonic() - job.start
            stacks = {rank: dump_stack(pid) for rank, pid in sorted(pids.items())}
            break
        previous = current
    code = job.wait(timeout=timeout_s + 60)
    hang_start = job.last_step_time()
    failed = job.first(r"error: ")
    return {"returncode": code, "output": job.output, "stacks": stacks,
            "waiting": {rank: waiting_line(s) for rank, s in stacks.items()},
            "hang_start_s": hang_start,
            "stacks_after_s": None if stuck_at is None else round(stuck_at - hang_start, 2),
            "failed_after_s": None if failed is None else round(failed[0] - hang_start, 2),
            "timeout_s": timeout_s}


def diagnose(job: Job, pattern: str, timeout: float = 120) -> dict:
    """Wait for ``job``; how long after its last step line did a line matching ``pattern``
    (the one that names the cause) appear?"""
    code = job.wait(timeout)
    found = job.first(pattern)
    start = job.last_step_time() or 0.0
    return {"returncode": code, "output": job.output, "line": found[1] if found else None,
            "diagnosed_after_s": round(found[0] - start, 2) if found else None,
            "wall_s": round(job.lines[-1][0], 1) if job.lines else None}


def root_cause(output: str) -> dict:
    """torchrun's 'Root Cause (first observed failure)' section, field by field."""
    section = output.split("Root Cause (first observed failure):", 1)
    if len(section) < 2:
        return {}
    fields = dict(re.findall(r"^\s+(\w+)\s+: (.*)$", section[1], flags=re.M))
    error_file = fields.get("error_file", "")
    if error_file and Path(error_file).is_file():
        fields["error_file_json"] = json.loads(Path(error_file).read_text())
    return fields


# --- two agents on this machine as two nodes ----------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(*args, nproc: int = 2, env: dict | None = None, timeout: float = 300,
              metrics: str | Path | None = None) -> dict:
    """``NNODES=2 NODE_RANK=0|1 MASTER_ADDR=127.0.0.1 bash launch/lesson8.sh args`` twice, the
    way two terminals (or two hosts) would run it. Returns both outputs and the metrics."""
    port, run_id = free_port(), f"lesson8-{uuid.uuid4().hex[:8]}"
    metrics = Path(metrics or Path(os.environ.get("TMPDIR", "/tmp")) / f"{run_id}.json")
    jobs = []
    for node in (0, 1):
        node_env = {"NNODES": 2, "NODE_RANK": node, "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port, "RDZV_ID": run_id, **(env or {})}
        jobs.append(launch(*args, "--metrics", metrics, nproc=nproc, env=node_env))
    codes = [job.wait(timeout) for job in jobs]
    data = json.loads(metrics.read_text()) if metrics.exists() else None
    return {"returncodes": codes, "outputs": [job.output for job in jobs], "metrics": data,
            "wall_s": round(max(job.lines[-1][0] for job in jobs if job.lines), 1)}
