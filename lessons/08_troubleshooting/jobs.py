"""Lesson 8's jobs (notebook and tests): launch one the way a learner would, watch it, wait for it,
time the line that names its failure; as a hung job whose ranks are dumped, on two agents as two
nodes, in the background as in another terminal, through SLURM. Every output line is kept with
its arrival time; ``diagnosis.py`` reads what the lines, the stacks and torchrun's report say.

Every launch prints its command; every time is measured from the job's own output lines.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from course_lab.kernel import in_notebook
from course_lab.notebook import REPO, LaunchProgress, LessonRun, lesson_env, shared_run, show_log
from diagnosis import dump_stack, root_cause, waiting_line, worker_pids

LESSON_DIR = Path(__file__).resolve().parent
SCRIPT = LESSON_DIR / "train.py"
STEP_LINE = re.compile(r"^\s+(\d+) \|")


class Job:
    """A launch running in the background; every output line is kept with its arrival time."""

    def __init__(self, command: list[str], env: dict, echo: bool = False,
                 shown: dict | None = None):
        self.command, self.echo = command, echo
        self.lines: list[tuple[float, str]] = []
        self.start = time.monotonic()
        words = [f"{k}={v}" for k, v in (shown or {}).items()]
        words += [str(Path(c).relative_to(REPO)) if str(c).startswith(str(REPO) + "/") else str(c)
                  for c in command]
        self.words = words
        # In JupyterLab the same live progress and folded log as run_lesson's launches (under
        # the cell that started the job, also when it runs in the background); a line elsewhere.
        self.progress = (LaunchProgress(8, [], None, command=words)
                         if in_notebook() and not echo else None)
        if self.progress is None:
            print("+ " + " ".join(words), flush=True)
        self.folded = False
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=REPO, bufsize=1,
                                     start_new_session=True)
        if getattr(_STARTING, "event", None) is not None:  # started by background(): it may go on
            _STARTING.event.set()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if self.progress is not None:  # the elapsed time moves while a hung job prints nothing
            threading.Thread(target=self._tick, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic() - self.start, line.rstrip("\n")))
            if self.progress is not None:
                self.progress.feed(line)
            if self.echo:
                print(line, end="", flush=True)

    def _tick(self):
        while self.proc.poll() is None and not self.folded:
            self.progress.draw()
            time.sleep(1)

    def wait(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
        if self.progress is not None and not self.folded:
            self.folded = True
            show_log(LessonRun(self.words, self.proc.returncode, self.output + "\n", "", None,
                               seconds=round(time.monotonic() - self.start, 1)), self.progress)
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

# --- broken jobs: wait, dump, time the line that names the cause --------------------------------

def hang_and_dump(*args, timeout_s: int = 8, settle_s: float = 0.5, env: dict | None = None,
                  nproc: int = 2) -> dict:
    """Launch a job that hangs; ``py-spy dump`` each rank until two rounds of stacks agree (the
    ranks have stopped moving); then let the collective timeout end the job. Returns the stacks,
    the line each rank waits on, and the times (seconds from the last step line the job printed)."""
    job = launch(*args, nproc=nproc, env={"COURSE_TIMEOUT_S": timeout_s, **(env or {})})
    stacks, previous, stuck_at = {}, None, None
    deadline = time.monotonic() + 120
    while job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(settle_s)
        pids = worker_pids(job.proc.pid)
        if len(pids) < nproc or job.last_step_time() is None:
            continue
        current = {rank: dump_stack(pid) for rank, pid in sorted(pids.items())}
        # the same waiting line on every rank as the last look: nobody moves
        if previous and {r: waiting_line(s) for r, s in current.items()} == previous:
            stuck_at, stacks = time.monotonic() - job.start, current
            break
        previous = {r: waiting_line(s) for r, s in current.items()}
    code = job.wait(timeout=timeout_s + 60)
    hang_start = job.last_step_time()
    failed = job.first(r"error: ")
    return {"returncode": code, "output": job.output,
            "stacks": {str(r): s for r, s in stacks.items()},
            "waiting": {str(rank): waiting_line(s) for rank, s in stacks.items()},
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


def run_and_diagnose(*args, pattern: str, env: dict | None = None, nproc: int = 2,
                     plain_torchrun: bool = False, timeout: float = 180) -> dict:
    """Start a job (through the course's launcher, or plain torchrun), wait for it, and time
    the line that names the cause (see ``diagnose``)."""
    job = (torchrun if plain_torchrun else launch)(*args, nproc=nproc, env=env)
    result = diagnose(job, pattern, timeout)
    if plain_torchrun:
        result["root_cause"] = root_cause(result["output"])
    return result


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

# --- a run shared between the notebook and the tests ---------------------------------------------

def shared(name: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, run once per test run under the test suite (the notebook's test and
    tests/test_lesson8.py then read the same run: course_lab.notebook.shared_run); a plain call
    otherwise."""
    return shared_run(name, fn, *args, **kwargs)


# --- jobs started together, as in several terminals ----------------------------------------------

_POOL = []  # one thread pool, made on first use
_STARTING = threading.local()  # in a background thread: the Event its first Job sets once started


def background(name: str, fn, *args, **kwargs):
    """``shared(name, fn, *args, **kwargs)`` in a background thread, like a job started in another
    terminal; returns a Future (``.result()`` waits for it and returns what ``shared`` returned).
    Returns once the job's command is printed (or its run came from the cache), so the command
    shows under the cell that started it."""
    from concurrent.futures import ThreadPoolExecutor

    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=4, thread_name_prefix="lesson8-job"))
    started = threading.Event()

    def job():
        _STARTING.event = started
        try:
            return shared(name, fn, *args, **kwargs)
        finally:
            _STARTING.event = None
            started.set()

    # In the caller's context: Jupyter then files the job's printed command under the calling cell.
    future = _POOL[0].submit(contextvars.copy_context().run, job)
    started.wait(timeout=60)
    return future


def slurm_demo(state: str = "/tmp/slurm-course-lab") -> str:
    """Start the two-node local SLURM cluster, submit lesson 8's HSDP run with sbatch --wait,
    stop the cluster; return the job's log (needs root and Debian's SLURM packages)."""
    script = REPO / "launch" / "slurm" / "local_cluster.sh"
    started = subprocess.run(
        ["bash", str(script), "start", state], capture_output=True, text=True, timeout=60)
    if started.returncode != 0:
        return f"the local cluster did not start: {started.stderr.strip()}"
    env = lesson_env(None, {"SLURM_CONF": started.stdout.strip().split("=", 1)[1],
                            "MASTER_PORT": free_port()})
    try:
        log = Path(state) / "job.out"
        subprocess.run(["sbatch", "--wait", f"--output={log}", f"--chdir={REPO}",
                        str(REPO / "launch" / "slurm" / "lesson.sbatch"), "8", "--replicas", "2",
                        "--steps", "2"], env=env, capture_output=True, text=True, timeout=300)
        return log.read_text() if log.is_file() else "no job log"
    finally:
        subprocess.run(["bash", str(script), "stop", state], capture_output=True, timeout=30)
