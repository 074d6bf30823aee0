"""Time every lesson notebook and each lesson's benchmarked launches (those its
lessons/NN_topic/launches.toml marks ``bench = true``: the launcher's defaults), and measure what
the course's instruments cost (launch/overhead.py); print a table. Run it with
`bash launch/bench.sh`.

Everything runs in a temporary copy of the repository, so nothing is written into the repo
(metrics files, checkpoints, executed notebooks, quiz progress). Environment:
  BENCH_ONLY=lesson1   only lesson 1 (comma-separated list; also matches part of a name)
  BENCH_KEEP=1         keep the temporary folder (kept anyway when something failed)
  NPROC                processes per lesson script (default: the launch's declared nproc)
Exit status 1 when something failed or a notebook ran past its budget.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from course_lab.launches import Launch, lesson_launches  # the repository, above

NOTEBOOK_BUDGET_S = 60.0  # the course's promise: each notebook under a minute on 2 CPU cores
CELL_TIMEOUT_S = 600
SCRIPT_TIMEOUT_S = 900
COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "__pycache__",
    "*.egg-info",
    ".ipynb_checkpoints",
    ".pytest_cache",
    "runs",
    "checkpoints",
    "metrics*.json",
)


def children_cpu_seconds() -> float:
    """User + system CPU seconds of every finished child process and their children (the
    kernel waits for torchrun, torchrun for its ranks). Unlike wall time it hardly depends on
    what else the machine is doing, so it compares runs made on a busy machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def selected(kind: str, name: str, number: int | None, only: list[str]) -> bool:
    if not only:
        return True
    for want in only:
        m = re.fullmatch(r"lesson(\d+)", want)
        if m and number is not None and int(m.group(1)) == number:
            return True
        if not m and want in f"{kind}:{name}":
            return True
    return False


def find_items(root: Path, only: list[str]) -> list[tuple[str, str, Path | Launch, int | None]]:
    """Each lesson's notebook, then the launches its launches.toml marks for the bench, named
    by the command (``lesson1.sh`` for the launcher's defaults)."""
    items = []
    for lesson_dir in sorted(p for p in (root / "lessons").glob("[0-9][0-9]_*") if p.is_dir()):
        n = int(lesson_dir.name[:2])
        for nb in sorted(lesson_dir.glob("*.ipynb")):
            items.append(("notebook", nb.relative_to(root).as_posix(), nb, n))
        if (lesson_dir / "launches.toml").is_file():
            for launch in lesson_launches(n, root / "lessons").values():
                if launch.bench:
                    name = " ".join([f"lesson{n}.sh", *launch.args])
                    items.append(("script", name, launch, n))
    return [it for it in items if selected(it[0], it[1], it[3], only)]


def slowest_cells(nb, count: int = 3) -> str:
    """The notebook's slowest code cells as 'cell 12 20.1 s, cell 5 8.3 s' (from the timing
    nbclient records in each cell's metadata), so a slow notebook says where its time goes."""
    from datetime import datetime

    timed = []
    for index, cell in enumerate(nb.cells):
        stamps = cell.get("metadata", {}).get("execution", {})
        start, end = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
        if cell.cell_type == "code" and start and end:
            seconds = (
                datetime.fromisoformat(end.replace("Z", "+00:00"))
                - datetime.fromisoformat(start.replace("Z", "+00:00"))
            ).total_seconds()
            timed.append((seconds, index))
    return ", ".join(f"cell {i} {s:.1f} s" for s, i in sorted(timed, reverse=True)[:count])


def run_notebook(path: Path, log: Path, tmp: Path) -> tuple[bool, str]:
    import nbformat
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # IPC sockets in the temporary folder: no TCP ports, no "running over TCP" warning.
    km = KernelManager(kernel_name="python3", transport="ipc", ip=str(tmp / "kernel-ipc"))
    client = NotebookClient(
        nb,
        km=km,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
        return True, ""
    except Exception as exc:  # CellExecutionError, timeouts, dead kernels: all count as failure
        message = str(exc)
        return False, message
    finally:
        nbformat.write(nb, log.with_suffix(".ipynb"))
        print(f"bench:   slowest {slowest_cells(nb)}", file=sys.stderr, flush=True)
        if km.has_kernel:  # a kernel we made is ours to stop (nbclient leaves a given km alone)
            km.shutdown_kernel(now=False)


def run_script(root: Path, launch: Launch, log: Path, workdir: Path) -> tuple[bool, str]:
    launcher = root / "launch" / f"lesson{launch.lesson}.sh"
    args = launch.filled(**{name: workdir / name for name in launch.placeholders})
    env = {**os.environ, "NPROC": os.environ.get("NPROC") or str(launch.nproc), **launch.env}
    with open(log, "w") as out:
        try:
            proc = subprocess.run(
                ["bash", str(launcher), *args],
                cwd=workdir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=SCRIPT_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return False, f"timed out after {SCRIPT_TIMEOUT_S} s"
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        return False, f"exit {proc.returncode}: " + " / ".join(tail)
    return True, ""


def instrumentation_overhead(root: Path, workdir: Path) -> str | None:
    """launch/overhead.py under torchrun: ms per step with and without the course's
    instruments (its one summary line), or None when it failed."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsdp_course.torchrun",
            "--standalone",
            f"--nproc-per-node={os.environ.get('NPROC', '2')}",
            str(root / "launch" / "overhead.py"),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=SCRIPT_TIMEOUT_S,
    )
    lines = [
        line for line in proc.stdout.splitlines() if line.startswith("instrumentation overhead")
    ]
    return lines[-1] if proc.returncode == 0 and lines else None


def main() -> int:
    repo = Path(__file__).resolve().parent.parent
    only = [w.strip() for w in os.environ.get("BENCH_ONLY", "").split(",") if w.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="fsdp-course-bench-"))
    root = tmp / "repo"
    shutil.copytree(repo, root, ignore=COPY_IGNORE)
    logs = tmp / "logs"
    logs.mkdir()
    work = tmp / "work"
    work.mkdir()

    # The copy runs with this interpreter, imports its own fsdp_course, keeps quiz progress
    # and Jupyter's runtime files in the temporary folder.
    os.environ["PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    os.environ["FSDP_COURSE_PROGRESS"] = str(tmp / "progress.json")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(tmp / "jupyter-runtime")
    os.environ.setdefault("MPLBACKEND", "Agg")

    items = find_items(root, only)
    want_overhead = selected("script", "overhead.py", None, only)
    if not items and not want_overhead:
        print(
            f"bench: nothing to run (BENCH_ONLY={os.environ.get('BENCH_ONLY', '')!r})",
            file=sys.stderr,
        )
        shutil.rmtree(tmp, ignore_errors=True)
        return 1

    rows, failures = [], []
    for kind, name, what, _ in items:  # what: the notebook's path, or the Launch
        print(f"bench: {kind} {name} ...", file=sys.stderr, flush=True)
        log = logs / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".log")
        start, cpu_start = time.perf_counter(), children_cpu_seconds()
        if kind == "notebook":
            ok, why = run_notebook(what, log, tmp)
            budget = NOTEBOOK_BUDGET_S
        else:
            ok, why = run_script(root, what, log, work)
            budget = None
        seconds = time.perf_counter() - start
        cpu = children_cpu_seconds() - cpu_start
        if not ok:
            status = "FAIL"
            failures.append(
                f"{kind} {name}: {why.strip().splitlines()[-1] if why.strip() else 'failed'}"
            )
        elif budget is not None and seconds > budget:
            status = "SLOW"
            failures.append(f"{kind} {name}: {seconds:.1f} s, over its {budget:.0f} s budget")
        else:
            status = "yes"
        budget_text = "-" if budget is None else f"{budget:.0f}"
        rows.append((kind, name, f"{seconds:.1f}", f"{cpu:.1f}", budget_text, status))

    if want_overhead:
        print("bench: instrumentation overhead ...", file=sys.stderr, flush=True)
        overhead = instrumentation_overhead(root, work)
        rows.append(
            ("overhead", "launch/overhead.py", "-", "-", "-", "yes" if overhead else "FAIL")
        )
        if not overhead:
            failures.append("overhead: launch/overhead.py failed")
    else:
        overhead = None

    total = sum(float(r[2]) for r in rows if r[2] != "-")
    total_cpu = sum(float(r[3]) for r in rows if r[3] != "-")
    header = ("kind", "name", "seconds", "cpu s", "budget", "ok")
    table = [
        header,
        *rows,
        ("total", "", f"{total:.1f}", f"{total_cpu:.1f}", "", "yes" if not failures else "no"),
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print(
            " | ".join(
                cell.ljust(w) if j < 2 else cell.rjust(w)
                for j, (cell, w) in enumerate(zip(row, widths))
            )
        )
        if i == 0 or i == len(table) - 2:
            print("-+-".join("-" * w for w in widths))

    if overhead:
        print(f"\n{overhead}")
    if failures:
        print("\nproblems:", file=sys.stderr)
        for line in failures:
            print(f"  {line}", file=sys.stderr)
    if failures or os.environ.get("BENCH_KEEP") == "1":
        print(f"bench: logs and executed notebooks in {logs}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
