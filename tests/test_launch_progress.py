"""What a launch cell shows in JupyterLab while the ranks run, and the one line it folds under."""

from __future__ import annotations

import sys

from course_lab import notebook
from course_lab.notebook import LaunchProgress, LessonRun, run_command, short_command
from helpers import lesson_script


class Handle:
    def __init__(self):
        self.shown = []

    def update(self, obj):
        self.shown.append(obj.data)


def progress(monkeypatch, args=("--steps", "3")):
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: Handle())
    return LaunchProgress(6, list(args), 2)


def test_progress_follows_the_ranks_own_lines(monkeypatch):
    p = progress(monkeypatch)
    assert "starting 2 ranks" in p.html() and "<progress" not in p.html()
    p.feed("lesson 6 | 2 ranks | gloo on cpu | steps=3 batch_size=8\n")
    assert "2 ranks up" in p.html()
    p.feed("   0 |          0 |          2 |                2 |          0 |   localhost\n")
    p.feed("   1 |          1 |          2 |                2 |          0 |   localhost\n")
    assert "step" not in p.html().split("ranks up")[1]  # a table of ranks is not a step
    p.feed(" step |    loss |  ms/step | peak MiB/rank |  sent MiB\n")
    p.feed("    0 |  3.2432 |    778.8 |         22.86 |     3.084\n")
    assert "step 1 of 3" in p.html() and "<progress value='1' max='3'" in p.html()
    p.feed("    2 |  2.6930 |    238.4 |         29.03 |         -\n")
    assert "step 3 of 3" in p.html()
    p.feed(" step |    loss |  ms/step | peak MiB/rank |  sent MiB\n")  # the next variant's run
    p.feed("    0 |  3.2432 |    778.8 |         22.86 |     3.084\n")
    assert "run 2, step 1 of 3" in p.html() and "8 lines of log" in p.html()


def test_the_progress_is_redrawn_while_the_command_runs(monkeypatch):
    p = progress(monkeypatch)
    script = (
        "import time\nprint('lesson 6 | 2 ranks | gloo on cpu | steps=2', flush=True)\n"
        "time.sleep(1.2)\nprint(' step |    loss |')\n"
        "print('    1 |  2.0000 |      1.0 |          1.00 |     1.000')"
    )
    run = run_command([sys.executable, "-c", script], echo=False, progress=p)
    assert run.returncode == 0 and run.seconds >= 1.2
    assert any("2 ranks up" in shown for shown in p.handle.shown)


def test_the_folded_header_is_one_short_line():
    variants = ";".join(f"strategy=DDP,d-model={d},n-layers=8,batch-size=2" for d in range(18))
    run = LessonRun(["bash", "launch/lesson7.sh", "--variants", variants], 0, "", "", None, "2")
    line = short_command(run)
    assert line == "NPROC=2 bash launch/lesson7.sh --variants <18 variants>"
    assert len(short_command(LessonRun(["bash", "x.sh", *["--flag"] * 40], 0, "", "", None))) <= 90


def test_the_fold_replaces_the_progress_and_keeps_the_full_command(monkeypatch):
    p = progress(monkeypatch, ["--variants", "a=1;b=2;c=3;d=4;e=5;f=6;g=7;h=8;i=9;j=10;k=11"])
    monkeypatch.setattr(notebook, "in_notebook", lambda: True)
    run = LessonRun(
        [
            "bash",
            "launch/lesson6.sh",
            "--variants",
            "a=1;b=2;c=3;d=4;e=5;f=6;g=7;h=8;i=9;j=10;k=11",
        ],
        0,
        "line\n",
        "",
        None,
        "2",
        seconds=3.0,
    )
    notebook.show_log(run, p)
    fold = p.handle.shown[-1]
    summary = fold[fold.index("<summary>") : fold.index("</summary>")]
    assert "&lt;11 variants&gt;" in summary and "3 s" in summary and "\n" not in summary
    assert "a=1;b=2;c=3" in fold[fold.index("</summary>") :]  # the full command, with the log


def test_lesson8_background_jobs_get_the_same_progress_and_fold(monkeypatch):
    """Lesson 8's background jobs (not run_lesson) draw the same live progress while they run,
    then fold."""
    import os

    jobs = lesson_script(8, "jobs")

    handles = []

    def display(*a, **k):
        handles.append(Handle())
        return handles[-1]

    monkeypatch.setattr("IPython.display.display", display)
    monkeypatch.setattr(jobs, "in_notebook", lambda: True)
    monkeypatch.setattr(notebook, "in_notebook", lambda: True)
    script = (
        "import time\nprint('lesson 8 | 2 ranks | gloo on cpu | steps=2', flush=True)\n"
        "time.sleep(1.5)\nprint(' step |    loss |', flush=True)\n"
        "print('    1 |  2.0000 |      1.0 |          1.00 |     1.000', flush=True)\n"
        "time.sleep(1.5)"
    )
    job = jobs.Job([sys.executable, "-c", script], dict(os.environ), shown={"NPROC": 2})
    assert job.wait(timeout=30) == 0
    shown = handles[0].shown
    assert any("2 ranks up" in s and "NPROC=2" in s for s in shown[:-1])  # live, while it ran
    assert "course-launch-log" in shown[-1] and "exit 0" in shown[-1]  # then the fold
    assert "step 2 of 2" in "".join(shown[:-1])
