"""Helpers the lesson notebooks share: run a lesson through its launcher, show tables and plots.

    from course_lab.notebook import run_lesson, show_table
    metrics = run_lesson(1, "--strategy", "FULL_SHARD", nproc=2)

``run_lesson`` runs exactly what a learner types in a terminal (``bash launch/lessonN.sh``),
streams its output into the cell, and returns the metrics file the script wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from fsdp_course.report import read_metrics, table

REPO = Path(__file__).resolve().parents[1]


def launcher(lesson: int) -> Path:
    return REPO / "launch" / f"lesson{lesson}.sh"


def _env(nproc: int | str | None, extra: dict | None) -> dict:
    env = dict(os.environ)
    env["PYTHON"] = sys.executable  # the kernel's interpreter runs the ranks too
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if nproc is not None:
        env["NPROC"] = str(nproc)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def run_command(args: list[str], env: dict | None = None, echo: bool = True,
                cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``args``, printing its output as it comes (stderr merged), and return the result."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=cwd or REPO, bufsize=1)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if echo:
            print(line, end="", flush=True)
    proc.wait()
    return subprocess.CompletedProcess(args, proc.returncode, "".join(lines), "")


def run_lesson(lesson: int, *args: str, nproc: int | str | None = 2, echo: bool = True,
               check: bool = True, env: dict | None = None) -> dict | subprocess.CompletedProcess:
    """``NPROC=nproc bash launch/lessonN.sh *args --metrics FILE``; returns the metrics.

    With ``check=False`` returns the finished process instead (for cells that show a failure:
    its ``returncode`` and ``stdout``).
    """
    with tempfile.TemporaryDirectory(prefix=f"lesson{lesson}-") as tmp:
        metrics = Path(tmp) / "metrics.json"
        command = ["bash", str(launcher(lesson)), *map(str, args)]
        if check:
            command += ["--metrics", str(metrics)]
        result = run_command(command, env=_env(nproc, env), echo=echo)
        if not check:
            return result
        if result.returncode != 0:
            tail = "".join(result.stdout.splitlines(keepends=True)[-5:])
            raise RuntimeError(f"lesson {lesson} exited with {result.returncode}:\n{tail}")
        return read_metrics(metrics)


def show_table(rows: list[dict], columns: list[str] | None = None) -> None:
    """An HTML table in JupyterLab, plain text elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        print(table(rows, columns))
        return
    if get_ipython() is None:
        print(table(rows, columns))
        return
    columns = columns or list(rows[0])
    head = "".join(f"<th>{c}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    display(HTML(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def mib(num_bytes: float) -> float:
    return round(num_bytes / 2 ** 20, 3)
