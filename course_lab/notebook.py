"""Helpers the lesson notebooks share: run a lesson through its launcher, show tables and plots.

    from course_lab.notebook import run_lesson, show_table
    metrics = run_lesson(1, "--strategy", "FULL_SHARD", nproc=2)

``run_lesson`` runs exactly what a learner types in a terminal (``bash launch/lessonN.sh``) and
returns the metrics file the script wrote. In JupyterLab the run's log is folded under a
"log" line you can open; the lesson's own tables stay in view. It is the one way the course
runs a lesson from Python: notebooks, exercise checkers and tests all call it.

Under the test suite (``COURSE_RUN_CACHE`` set by ``tests/conftest.py``) a launch with the
same lesson, flags, NPROC and environment runs once per test run and is shared: the notebook's
test and the script's tests assert on the same run instead of starting torchrun twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import html
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from fsdp_course.report import read_metrics, table

REPO = Path(__file__).resolve().parents[1]
RUN_CACHE_ENV = "COURSE_RUN_CACHE"


@dataclass
class LessonRun:
    """A finished launch: exit code, what a learner saw (stdout and stderr as they came),
    stderr alone, and the metrics the script wrote (None when it wrote none)."""
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    metrics: dict | None
    nproc: str | None = None


def launcher(lesson: int) -> Path:
    return REPO / "launch" / f"lesson{lesson}.sh"


def lesson_env(nproc: int | str | None, extra: dict | None = None) -> dict:
    """The environment a launch gets: this interpreter for the ranks, the course importable,
    ``NPROC`` and the caller's extra variables (a value of None removes the variable)."""
    env = dict(os.environ)
    env["PYTHON"] = sys.executable  # the kernel's interpreter runs the ranks too
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if nproc is not None:
        env["NPROC"] = str(nproc)
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


def run_command(args: list[str], env: dict | None = None, echo: bool = True,
                cwd: Path | None = None, timeout: float | None = None) -> LessonRun:
    """Run ``args``; print its output as it comes when ``echo``; return it as a LessonRun
    (``stdout`` holds both streams in the order they came, ``stderr`` stderr alone)."""
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd or REPO,
                            bufsize=1)
    merged: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def pump(stream, also: list[str] | None):
        for line in stream:
            with lock:
                merged.append(line)
                if also is not None:
                    also.append(line)
                if echo:
                    print(line, end="", flush=True)

    readers = [threading.Thread(target=pump, args=(proc.stdout, None), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, errors), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        merged.append(f"[killed after {timeout:g} s]\n")
    for reader in readers:
        reader.join()
    return LessonRun([str(a) for a in args], proc.returncode, "".join(merged), "".join(errors),
                     None)


def _cache_path(lesson: int, args: list[str], nproc, extra: dict | None) -> Path | None:
    root = os.environ.get(RUN_CACHE_ENV)
    if not root:
        return None
    key = json.dumps([lesson, args, str(nproc), sorted((extra or {}).items())], default=str)
    return Path(root) / f"lesson{lesson}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def launch_lesson(lesson: int, *args, nproc: int | str | None = 2, env: dict | None = None,
                  echo: bool = False, timeout: float | None = None) -> LessonRun:
    """``NPROC=nproc bash launch/lessonN.sh *args --metrics FILE``, finished: a LessonRun.

    Never raises for a failed run (``returncode`` says it). Shared within a test run (module doc).
    """
    args = [str(a) for a in args]
    cached = _cache_path(lesson, args, nproc, env)
    if cached is None:
        return _launch(lesson, args, nproc, env, echo, timeout)
    cached.parent.mkdir(parents=True, exist_ok=True)
    with open(cached.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second caller waits for the first one's run
        if cached.is_file():
            run = LessonRun(**json.loads(cached.read_text()))
            if echo:
                print(run.stdout, end="", flush=True)
            return run
        run = _launch(lesson, args, nproc, env, echo, timeout)
        cached.write_text(json.dumps(asdict(run)))
        return run


def _launch(lesson, args, nproc, env, echo, timeout) -> LessonRun:
    with tempfile.TemporaryDirectory(prefix=f"lesson{lesson}-") as tmp:
        metrics = Path(tmp) / "metrics.json"
        command = ["bash", str(launcher(lesson)), *args, "--metrics", str(metrics)]
        run = run_command(command, env=lesson_env(nproc, env), echo=echo, timeout=timeout)
        run.command = ["bash", f"launch/lesson{lesson}.sh", *args]
        run.nproc = None if nproc is None else str(nproc)
        if metrics.is_file():
            run.metrics = read_metrics(metrics)
        return run


def run_lesson(lesson: int, *args, nproc: int | str | None = 2, echo: bool | str = "fold",
               check: bool = True, env: dict | None = None) -> dict | LessonRun:
    """Run lesson ``lesson``'s script with ``args`` on ``nproc`` ranks; return its metrics.

    ``echo``: "fold" (default) shows the log folded under one line in JupyterLab (printed in
    full elsewhere), True prints it as it comes, False shows nothing. ``check=False`` returns
    the finished LessonRun instead (for cells that show a failure: ``returncode``, ``stdout``);
    with ``check=True`` a failed run raises RuntimeError with the last lines of its log.
    """
    live = echo is True
    run = launch_lesson(lesson, *args, nproc=nproc, env=env, echo=live)
    if echo == "fold":
        show_log(run)
    if not check:
        return run
    if run.returncode != 0 or run.metrics is None:
        tail = "".join(run.stdout.splitlines(keepends=True)[-5:])
        raise RuntimeError(f"lesson {lesson} exited with {run.returncode}:\n{tail}")
    return run.metrics


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def show_log(run: LessonRun) -> None:
    """The command, its exit code and its log: folded in JupyterLab, printed elsewhere."""
    # Quoted as a shell needs it: a --variants value holds ";", which would end the command.
    command = (f"NPROC={run.nproc} " if run.nproc else "") + shlex.join(map(str, run.command))
    lines = run.stdout.count("\n")
    summary = f"$ {command}   (exit {run.returncode}, {lines} lines of log)"
    if not _in_notebook():
        print(summary)
        print(run.stdout, end="")
        return
    from IPython.display import HTML, display
    display(HTML(f"<details><summary><code>{html.escape(summary)}</code></summary>"
                 f"<pre>{html.escape(run.stdout)}</pre></details>"))


def show_table(rows: list[dict], columns: list[str] | None = None) -> None:
    """An HTML table in JupyterLab, plain text elsewhere."""
    if not _in_notebook():
        print(table(rows, columns))
        return
    from IPython.display import HTML, display
    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    display(HTML(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return html.escape(str(value))  # text such as reshard_after_forward=<int> is not markup


def mib(num_bytes: float) -> float:
    return round(num_bytes / 2 ** 20, 3)


def compare_prediction(guess, measured: float, unit: str = "", what: str = "the measurement") -> None:
    """Print the learner's prediction next to the measurement, with the gap.

    The notebook asks first (``my_guess = None  # your prediction``), then measures; an
    unanswered prediction (None or ...) says so and shows the measurement anyway."""
    unit = f" {unit}" if unit else ""
    if guess is None or guess is Ellipsis:
        print(f"no prediction given; {what}: {measured:,.6g}{unit}")
        return
    try:
        guess = float(guess)
    except (TypeError, ValueError):
        print(f"your prediction {guess!r} is not a number; {what}: {measured:,.6g}{unit}")
        return
    gap = guess - measured
    rel = f" ({gap / measured:+.1%})" if measured else ""
    print(f"you predicted {guess:,.6g}{unit}; {what}: {measured:,.6g}{unit}; "
          f"gap {gap:+,.6g}{unit}{rel}")
