"""Lesson 8's lab bench (notebook and tests): launch a job the way a learner would, watch it,
and diagnose it with the real tools: the ranks' messages, ``py-spy dump`` of every rank,
torchrun's root-cause report, two agents as two nodes, SLURM.

Every launch prints its command; every time is measured from the job's own output lines.
"""

from __future__ import annotations

import contextvars
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

from course_lab.notebook import REPO, LaunchProgress, LessonRun, _in_notebook, lesson_env, show_log

LESSON_DIR = Path(__file__).resolve().parent
SCRIPT = LESSON_DIR / "train.py"
STEP_LINE = re.compile(r"^\s+(\d+) \|")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


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
                         if _in_notebook() and not echo else None)
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
    return ANSI.sub("", result.stdout + result.stderr)  # py-spy colours its output


def waiting_line(stack: str, prefer: str = "train.py") -> dict:
    """The innermost frame of the main thread (where it waits), and the innermost frame in
    ``prefer`` (the line of the learner's own script that called it)."""
    main = stack.split("\nThread ")[1] if "\nThread " in stack else stack
    frames = re.findall(r"^\s+(\S+) \(([^)]+)\)$", main, flags=re.M)
    ours = next(((fn, where) for fn, where in frames if prefer in where), None)
    return {"innermost": " ".join(frames[0]) if frames else "?",
            "script_line": " ".join(ours) if ours else "?"}


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


def own_collectives(output: str) -> dict[str, dict]:
    """From ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` messages: the collective each rank says IT is
    running (``Rank N is running collective: CollectiveFingerPrint(SequenceNumber=S, OpType=OP``).
    The other side of each message ("but Rank M is running ...") is the checker's own exchange
    of fingerprints, not the peer's training collective."""
    found = re.findall(r"\[rank (\d+)\] error: .*?Rank \1 is running collective: "
                       r"CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+)", output)
    return {rank: {"sequence": int(seq), "op": op} for rank, seq, op in found}


def _report_entry(body: str) -> dict:
    """One failure of torchrun's report as fields; ``exception``: its traceback's last line."""
    fields = dict(re.findall(r"^\s{2}(\w+)\s*: (.*)$", body, flags=re.M))
    after = body.split("traceback :", 1)[-1].splitlines()
    # not the report's ---- separator
    traceback_lines = [line.strip() for line in after if line.strip().strip("-")]
    fields["exception"] = traceback_lines[-1] if traceback_lines else ""
    return fields


def root_cause(output: str) -> dict:
    """torchrun's 'Root Cause (first observed failure)' section, field by field, with the error
    file it names; ``others``: the report's other failures (the echoes)."""
    head, found, tail = output.partition("Root Cause (first observed failure):")
    if not found:
        return {}
    fields = _report_entry(tail.split("=====", 1)[0])
    error_file = fields.get("error_file", "")
    if error_file and Path(error_file).is_file():
        fields["error_file_json"] = json.loads(Path(error_file).read_text())
    others = head.rpartition("Failures:")[2]
    fields["others"] = [_report_entry(b) for b in re.split(r"^\[\d+\]:$", others, flags=re.M)[1:]]
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


# --- what torch itself says: default timeouts, the GPU-only knobs -------------------------------

TORCH = Path(__import__("torch").__file__).resolve().parent
C10D_HEADERS = TORCH / "include" / "torch" / "csrc" / "distributed" / "c10d"


def _header_constant(header: str, name: str) -> str | None:
    """``constexpr auto NAME = std::chrono::milliseconds(EXPR);`` -> EXPR, from torch's headers."""
    path = C10D_HEADERS / header
    if not path.is_file():
        return None
    match = re.search(rf"{name}\s*=\s*std::chrono::milliseconds\(([^)]*)\)", path.read_text())
    return match.group(1).strip() if match else None


def default_timeouts() -> list[dict]:
    """The collective timeout a process group gets when ``init_process_group`` is given none:
    gloo from ``torch.distributed.constants`` (Python), NCCL from ``ProcessGroupNCCL.hpp``
    (a CPU build of torch has no NCCL, so its Python constant is None)."""
    from torch.distributed import constants

    nccl_ms = _header_constant("ProcessGroupNCCL.hpp", "kProcessGroupNCCLDefaultTimeout")
    nccl = constants.default_pg_nccl_timeout
    header_s = eval(nccl_ms, {}) / 1000 if nccl_ms else None
    nccl_s = nccl.total_seconds() if nccl is not None else header_s
    return [
        {"backend": "gloo (and every non-NCCL backend)",
         "default": str(constants.default_pg_timeout),
         "seconds": constants.default_pg_timeout.total_seconds(),
         "source": "torch/distributed/constants.py: default_pg_timeout"},
        {"backend": "nccl", "default": f"{nccl_s / 60:g} min" if nccl_s else "?", "seconds": nccl_s,
         "source": "ProcessGroupNCCL.hpp: kProcessGroupNCCLDefaultTimeout = "
                   f"milliseconds({nccl_ms})"},
    ]


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

    import torch
    import torch.distributed as dist

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


# --- a run shared between the notebook and the tests ---------------------------------------------

def shared(name: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, run once per test run when ``COURSE_RUN_CACHE`` is set (the
    notebook's test and tests/test_lesson8.py then read the same run); a plain call otherwise."""
    import fcntl
    import hashlib

    root = os.environ.get("COURSE_RUN_CACHE")
    if not root:
        return fn(*args, **kwargs)
    key = json.dumps([name, args, sorted(kwargs.items())], default=str)
    path = Path(root) / f"lesson8-{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return json.loads(path.read_text())
        result = json.loads(json.dumps(fn(*args, **kwargs), default=str))  # as the cache holds it
        path.write_text(json.dumps(result))
        return result


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
