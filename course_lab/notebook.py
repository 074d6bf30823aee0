"""Helpers the lesson notebooks share: run a lesson through its launcher, show tables and plots.

    from course_lab.notebook import run_lesson, show_table
    metrics = run_lesson(1, "two_ranks")                      # declared in its launches.toml
    metrics = run_lesson(1, "--strategy", "FULL_SHARD", nproc=2)   # your own flags

``run_lesson`` runs exactly what a learner types in a terminal (``bash launch/lessonN.sh``) and
returns the metrics file the script wrote. A lesson's own launches are declared once, by name, in
``lessons/NN_topic/launches.toml`` (course_lab.launches), which the notebook, the tests and the
benchmark all read. In JupyterLab the cell shows the launch while it runs (the full command,
ranks up, step k of n from rank 0's metric lines, elapsed time), then folds its log under one
short line you can open; the lesson's own tables stay in view. It is the one way the course
runs a lesson from Python: notebooks, exercise checkers and tests all call it.

``COURSE_LAUNCHER=FILE.py:FUNCTION`` hands every launch to ``FUNCTION(lesson, args, nproc, env,
launch)``, which returns a LessonRun (``launch()`` runs it): the test suite's run cache
(tests/run_cache.py) shares one launch between a notebook's kernel and the tests that way.
``COURSE_SHARER`` does the same for ``shared_run``, a named run of lesson code that is more than
one launch (lesson 8's jobs).
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from course_lab.kernel import in_notebook
from course_lab.launches import LaunchError, declared, is_launch_name
from fsdp_course.report import read_metrics, table

REPO = Path(__file__).resolve().parents[1]
LAUNCHER_ENV = "COURSE_LAUNCHER"
SHARER_ENV = "COURSE_SHARER"


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
    seconds: float | None = None


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


def run_command(
    args: list[str],
    env: dict | None = None,
    echo: bool = True,
    cwd: Path | None = None,
    timeout: float | None = None,
    progress: LaunchProgress | None = None,
) -> LessonRun:
    """Run ``args``; print its output as it comes when ``echo``; return it as a LessonRun
    (``stdout`` holds both streams in the order they came, ``stderr`` stderr alone).
    ``progress`` sees every line and is redrawn from this thread while the command runs."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(a) for a in args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd or REPO,
        bufsize=1,
    )
    merged: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def pump(stream, also: list[str] | None):
        for line in stream:
            with lock:
                merged.append(line)
                if also is not None:
                    also.append(line)
                if progress is not None:
                    progress.feed(line)
                if echo:
                    print(line, end="", flush=True)

    readers = [
        threading.Thread(target=pump, args=(proc.stdout, None), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, errors), daemon=True),
    ]
    for reader in readers:
        reader.start()
    deadline = None if timeout is None else started + timeout
    while True:
        # Short waits, so the progress is redrawn here (display updates belong to the cell's
        # own thread) and the elapsed time moves even when no line comes.
        wait = 0.5 if progress is not None else None
        if deadline is not None:
            wait = max(0.0, min(wait or deadline, deadline - time.monotonic()))
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
                merged.append(f"[killed after {timeout:g} s]\n")
                break
            with lock:
                progress.draw()
    for reader in readers:
        reader.join()
    return LessonRun(
        [str(a) for a in args],
        proc.returncode,
        "".join(merged),
        "".join(errors),
        None,
        seconds=round(time.monotonic() - started, 1),
    )


def lesson_args(lesson: int, args, nproc=None, env: dict | None = None, **fill):
    """(flags, NPROC, environment) of a launch: ``args`` are flags, or the name of a launch
    declared in the lesson's launches.toml (its nproc unless ``nproc`` is given, its env under
    ``env``, its ``{placeholders}`` filled from ``fill``)."""
    if is_launch_name(args):
        if len(args) > 1:
            raise LaunchError(
                f"a declared launch takes no more flags: {args[0]!r} then {args[1]!r}"
            )
        launch = declared(lesson, args[0])
        flags = launch.filled(**fill)
        return flags, launch.nproc if nproc is None else nproc, {**launch.env, **(env or {})}
    if fill:
        raise LaunchError(f"{', '.join(fill)}: placeholders fill a declared launch, not flags")
    return [str(a) for a in args], 2 if nproc is None else nproc, env


def launch_lesson(
    lesson: int,
    *args,
    nproc: int | str | None = None,
    env: dict | None = None,
    echo: bool = False,
    timeout: float | None = None,
    progress: LaunchProgress | None = None,
    **fill,
) -> LessonRun:
    """``NPROC=nproc bash launch/lessonN.sh *args --metrics FILE``, finished: a LessonRun.
    ``args``: flags (``nproc`` defaults to 2), or a declared launch's name (lesson_args).

    Never raises for a failed run (``returncode`` says it). Handed to ``COURSE_LAUNCHER`` when
    it is set (module doc).
    """
    args, nproc, env = lesson_args(lesson, args, nproc, env, **fill)
    launched = []

    def launch() -> LessonRun:
        launched.append(_launch(lesson, args, nproc, env, echo, timeout, progress))
        return launched[-1]

    hook = _hook(LAUNCHER_ENV)
    if hook is None:
        return launch()
    run = hook(lesson, args, nproc, env, launch)
    if echo and not launched:  # the launcher had it already: show the log all the same
        print(run.stdout, end="", flush=True)
    return run


_HOOKS: dict = {}


def _hook(variable: str):
    """The function an environment variable names (``FILE.py:FUNCTION``), or None."""
    spec = os.environ.get(variable)
    if not spec:
        return None
    if spec not in _HOOKS:
        path, _, name = spec.rpartition(":")
        found = importlib.util.spec_from_file_location(f"course_hook_{len(_HOOKS)}", path)
        if not path.endswith(".py") or found is None or not Path(path).is_file():
            raise RuntimeError(f"{variable}={spec}: expected FILE.py:FUNCTION")
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        _HOOKS[spec] = getattr(module, name)
    return _HOOKS[spec]


def shared_run(name: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``: a run of lesson code that is not one launch (lesson 8's jobs:
    several launches, a py-spy dump). Handed to ``COURSE_SHARER`` when it is set (under the test
    suite: run once, the notebook's test and the lesson's tests read the same result); a plain
    call otherwise."""
    hook = _hook(SHARER_ENV)
    if hook is None:
        return fn(*args, **kwargs)
    return hook(name, fn, args, kwargs)


def _launch(lesson, args, nproc, env, echo, timeout, progress=None) -> LessonRun:
    with tempfile.TemporaryDirectory(prefix=f"lesson{lesson}-") as tmp:
        metrics = Path(tmp) / "metrics.json"
        command = ["bash", str(launcher(lesson)), *args, "--metrics", str(metrics)]
        run = run_command(
            command, env=lesson_env(nproc, env), echo=echo, timeout=timeout, progress=progress
        )
        run.command = ["bash", f"launch/lesson{lesson}.sh", *args]
        run.nproc = None if nproc is None else str(nproc)
        if metrics.is_file():
            run.metrics = read_metrics(metrics)
        return run


def run_lesson(
    lesson: int,
    *args,
    nproc: int | str | None = None,
    echo: bool | str = "fold",
    check: bool = True,
    env: dict | None = None,
    **fill,
) -> dict | LessonRun:
    """Run lesson ``lesson``'s script on ``nproc`` ranks; return its metrics. ``args``: the name
    of a launch its launches.toml declares (``run_lesson(4, "main", ckpt_dir=RUN)`` fills its
    ``{ckpt_dir}``), or flags of your own (``nproc`` then defaults to 2).

    ``echo``: "fold" (default) shows the log folded under one line in JupyterLab (printed in
    full elsewhere), True prints it as it comes, False shows nothing. ``check=False`` returns
    the finished LessonRun instead (for cells that show a failure: ``returncode``, ``stdout``);
    with ``check=True`` a failed run raises RuntimeError with the last lines of its log.
    """
    args, nproc, env = lesson_args(lesson, args, nproc, env, **fill)
    live = echo is True
    progress = None
    if echo == "fold" and in_notebook():
        progress = LaunchProgress(lesson, args, nproc)
    run = launch_lesson(lesson, *args, nproc=nproc, env=env, echo=live, progress=progress)
    if echo == "fold":
        show_log(run, progress)
    if not check:
        return run
    if run.returncode != 0 or run.metrics is None:
        tail = "".join(run.stdout.splitlines(keepends=True)[-5:])
        raise RuntimeError(f"lesson {lesson} exited with {run.returncode}:\n{tail}")
    return run.metrics


def short_command(run: LessonRun, width: int = 90) -> str:
    """The command on one short line: a long flag value (a --variants list) is summarised."""
    parts = [f"NPROC={run.nproc}"] if run.nproc else []
    for arg in map(str, run.command):
        if len(arg) > 40 and ";" in arg:
            parts.append(f"<{arg.count(';') + 1} variants>")
        elif len(arg) > 40:
            parts.append(shlex.quote(arg[:30] + "…"))
        else:
            parts.append(shlex.quote(arg))
    text = " ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


def show_log(run: LessonRun, progress: LaunchProgress | None = None) -> None:
    """The command, its exit code and its log: folded in JupyterLab (under one short line; the
    full command opens with the log), printed elsewhere. ``progress``: the live display the
    launch drew, replaced by the folded log."""
    # Quoted as a shell needs it: a --variants value holds ";", which would end the command.
    command = (f"NPROC={run.nproc} " if run.nproc else "") + shlex.join(map(str, run.command))
    lines = run.stdout.count("\n")
    if not in_notebook():
        print(f"$ {command}   (exit {run.returncode}, {lines} lines of log)")
        print(run.stdout, end="")
        return
    from IPython.display import HTML, display

    took = f", {run.seconds:.0f} s" if run.seconds is not None else ""
    mark = "&#10003;" if run.returncode == 0 else "&#10007;"
    colour = "#15803d" if run.returncode == 0 else "#b91c1c"
    summary = (
        f"<span style='color:{colour}'>{mark}</span> <code>$ {html.escape(short_command(run))}"
        f"</code> <span style='color:#6b7280'>(exit {run.returncode}{took}, {lines} lines of log"
        " - click to open)</span>"
    )
    fold = HTML(
        f"<details class='course-launch-log'><summary>{summary}</summary>"
        f"<pre style='white-space:pre-wrap'>$ {html.escape(command)}\n\n"
        f"{html.escape(run.stdout)}</pre></details>"
    )
    if progress is not None and progress.handle is not None:
        progress.handle.update(fold)
    else:
        display(fold)


# fsdp_course.report.MetricLogger's header and rows: " step |    loss |  ms/step | ..." then
# "    3 |  2.6930 |    238.4 | ..." (a run's rows follow its own header).
METRICS_HEADER = re.compile(r"^\s*step \|\s+loss \|")
STEP_LINE = re.compile(r"^\s*(\d+) \|\s+(?:-?\d+\.\d{4}|nan|inf|-inf) \|")
HEADER_LINE = re.compile(r"^lesson \d+ \| (\d+) ranks \|")


class LaunchProgress:
    """A launch as it runs, in JupyterLab: which launch, ranks up, step k of n from rank 0's
    metric lines (a bar), runs finished, elapsed time, the last line of the log."""

    def __init__(self, lesson: int, args: list[str], nproc, command: list[str] | None = None):
        from IPython.display import HTML, display

        self.lesson, self.nproc = lesson, nproc
        self.args = args
        self.command = command  # the words to show, for a launch that is not launch/lessonN.sh
        self.started = time.monotonic()
        self.lines = 0
        self.ranks = None
        self.steps = None
        self.step = None
        self.runs = 0
        self.in_metrics = False  # a metric header seen: rows of other tables are not steps
        self.last = ""
        self.handle = display(HTML(self.html()), display_id=True)

    def feed(self, line: str) -> None:
        self.lines += 1
        text = line.rstrip()
        if text:
            self.last = text
        header = HEADER_LINE.match(text)
        if header:
            self.ranks = int(header.group(1))
            found = re.search(r"\bsteps=(\d+)", text)
            self.steps = int(found.group(1)) if found else None
            return
        if METRICS_HEADER.match(text):
            if self.in_metrics:
                self.runs += 1  # a new run (a --variants entry, a restarted attempt) began
            self.in_metrics = True
            return
        step = STEP_LINE.match(text) if self.in_metrics else None
        if step:
            self.step = int(step.group(1))

    def html(self) -> str:
        elapsed = time.monotonic() - self.started
        words = self.command or ["bash", f"launch/lesson{self.lesson}.sh", *self.args]
        command = short_command(
            LessonRun(words, 0, "", "", None, None if self.nproc is None else str(self.nproc))
        )
        if self.ranks is None:
            state = f"starting {self.nproc or ''} ranks (torchrun, then torch in each process)"
        else:
            state = f"{self.ranks} ranks up"
        bar = ""
        if self.step is not None:
            total = max(self.steps or 0, self.step + 1)
            run = f"run {self.runs + 1}, " if self.runs else ""
            state += f"; {run}step {self.step + 1} of {total}"
            bar = (
                f"<progress value='{self.step + 1}' max='{total}' "
                "style='width:16em;vertical-align:middle'></progress> "
            )
        return (
            f"<div class='course-launch-progress'><b>running</b> <code>{html.escape(command)}"
            f"</code><br>{bar}{html.escape(state)} &middot; {elapsed:.0f} s &middot; "
            f"{self.lines} lines of log<br><code style='color:#6b7280'>"
            f"{html.escape(self.last[:120])}</code></div>"
        )

    def draw(self) -> None:
        from IPython.display import HTML

        if self.handle is not None:
            self.handle.update(HTML(self.html()))


def show_table(rows: list[dict], columns: list[str] | None = None) -> None:
    """An HTML table in JupyterLab, plain text elsewhere."""
    if not in_notebook():
        print(table(rows, columns))
        return
    from IPython.display import HTML, display

    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in rows
    )
    display(HTML(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return html.escape(str(value))  # text such as reshard_after_forward=<int> is not markup


def mib(num_bytes: float) -> float:
    return round(num_bytes / 2**20, 3)


def compare_prediction(guess, measured, unit: str = "", what: str = "the measurement") -> None:
    """The learner's prediction next to the measurement, with the gap.

    ``guess`` is what ``course_lab.predict.predict`` returned in the cell that asked (in
    JupyterLab the measurement stays hidden until a guess is locked in there), or a plain value
    (None: not given) for a notebook that still asks with ``my_guess = None``."""
    from course_lab.predict import Prediction, gap_line

    if isinstance(guess, Prediction):
        guess.reveal(measured, unit, what)
    else:
        print(gap_line(guess, measured, unit, what))
