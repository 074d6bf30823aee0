"""Each lesson's launches.toml (course_lab.launches): every declaration valid, bad ones and
unknown names refused in one line; run_lesson / launch_lesson resolve a name to its flags,
NPROC and environment and hand the launch to COURSE_LAUNCHER; the run cache (tests/run_cache.py)
runs a launch once. No torchrun here: the launches themselves run in the lesson tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import run_cache
from course_lab import notebook
from course_lab.launches import LaunchError, declared, lesson_launches
from course_lab.notebook import LessonRun, launch_lesson, lesson_args
from helpers import REPO_ROOT

LESSONS = sorted(int(p.name[:2]) for p in (REPO_ROOT / "lessons").glob("[0-9][0-9]_*"))


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_lesson_declares_its_launches_and_one_for_the_bench(lesson):
    launches = lesson_launches(lesson)
    benched = [launch for launch in launches.values() if launch.bench]
    # The bench times the launcher's defaults, as README's table says (lessonN.sh, NPROC=2).
    assert [(b.args, b.nproc, b.env) for b in benched] == [((), 2, {})], lesson
    for launch in launches.values():
        assert launch.what and "\n" not in launch.what
        # flags first: run_lesson(N, "name") tells a name from flags by the leading "-"
        assert not launch.args or launch.args[0].startswith("--"), (lesson, launch.name)
        values = {name: f"/tmp/{name}" for name in launch.placeholders}
        assert f"NPROC={launch.nproc} bash launch/lesson{lesson}.sh" in launch.command(**values)


def test_an_unknown_name_is_one_line_listing_the_known_ones():
    with pytest.raises(LaunchError) as exc:
        lesson_args(0, ("two_rank",))
    assert str(exc.value) == (
        "lesson 0 declares no launch 'two_rank' (known: script, two_ranks, one_rank)"
    )


def test_placeholders_are_filled_by_the_caller_and_named_when_missing():
    main = declared(4, "main")
    assert main.placeholders == ["ckpt_dir"]
    with pytest.raises(LaunchError, match=r"^lesson 4's launch 'main' takes ckpt_dir=\.\.\.$"):
        lesson_args(4, ("main",))
    with pytest.raises(LaunchError, match="takes ckpt_dir="):
        lesson_args(4, ("main",), ckpt_dir="/x", out="/y")
    flags, nproc, env = lesson_args(4, ("hang",), ckpt_dir="/tmp/hang")
    assert flags == ["--bug", "rank0-only", "--steps", "1", "--ckpt-dir", "/tmp/hang"]
    assert (nproc, env) == (2, {"COURSE_TIMEOUT_S": "2"})
    assert main.command(ckpt_dir="/tmp/run").startswith(
        "NPROC=2 bash launch/lesson4.sh --ckpt-dir /tmp/run --crash-at-step 8"
    )


def test_names_flags_nproc_and_env_resolve_as_documented():
    flags, nproc, env = lesson_args(1, ("two_ranks",))
    two = declared(1, "two_ranks")
    assert flags == [*two.args] and flags[-2] == "--variants"
    assert flags[-1] == ";".join(two.variants) and len(two.variants) == 4
    assert (nproc, env) == (2, {})
    assert lesson_args(1, ("four_ranks",))[1] == 4
    assert lesson_args(1, ("four_ranks",), nproc=8)[1] == 8  # the caller's NPROC wins
    assert lesson_args(0, ("--steps", 3)) == (["--steps", "3"], 2, None)  # your own flags
    with pytest.raises(LaunchError, match="takes no more flags"):
        lesson_args(0, ("two_ranks", "--steps", "1"))
    with pytest.raises(LaunchError, match="placeholders fill a declared launch"):
        lesson_args(0, ("--steps", "1"), ckpt_dir="/x")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[a]\nnproc = 2\nargs = []\n", "needs what ="),
        ('[a]\nwhat = "x"\nnproc = 0\nargs = []\n', "needs nproc = a number of ranks >= 1"),
        ('[a]\nwhat = "x"\nnproc = 2\n', "needs args = [...]"),
        ('[a]\nwhat = "x"\nnproc = 2\nargs = [1]\n', "args is a list of strings"),
        ('[a]\nwhat = "x"\nnproc = 2\nargs = []\nflags = []\n', "unknown key flags"),
        ('[Two]\nwhat = "x"\nnproc = 2\nargs = []\n', "a name is lower case"),
        ("[a\n", "09_demo/launches.toml: "),
    ],
)
def test_a_bad_declaration_is_one_line_naming_the_file(tmp_path, text, says):
    (tmp_path / "09_demo").mkdir()
    (tmp_path / "09_demo" / "launches.toml").write_text(text)
    with pytest.raises(LaunchError) as exc:
        lesson_launches(9, tmp_path)
    message = str(exc.value)
    assert says in message and "\n" not in message and message.startswith("09_demo/launches.toml")


def test_launch_lesson_hands_the_resolved_launch_to_course_launcher(tmp_path, monkeypatch, capsys):
    """COURSE_LAUNCHER=FILE.py:FUNCTION gets (lesson, flags, NPROC, env, launch); a run it
    returns without calling launch() is still echoed when asked."""
    hook = tmp_path / "hook.py"
    hook.write_text(
        "from course_lab.notebook import LessonRun\n"
        "SEEN = []\n"
        "def fake(lesson, args, nproc, env, launch):\n"
        "    SEEN.append((lesson, args, nproc, env))\n"
        "    return LessonRun(['bash'], 0, f'ran {args}\\n', '', {'ok': SEEN[-1]}, str(nproc))\n"
    )
    monkeypatch.setenv(notebook.LAUNCHER_ENV, f"{hook}:fake")
    run = launch_lesson(4, "hang", ckpt_dir="/tmp/h", echo=True)
    assert run.metrics["ok"] == (
        4,
        ["--bug", "rank0-only", "--steps", "1", "--ckpt-dir", "/tmp/h"],
        2,
        {"COURSE_TIMEOUT_S": "2"},
    )
    assert (
        capsys.readouterr().out
        == "ran ['--bug', 'rank0-only', '--steps', '1', '--ckpt-dir', '/tmp/h']\n"
    )
    monkeypatch.setenv(notebook.LAUNCHER_ENV, f"{hook}")
    with pytest.raises(RuntimeError, match="expected FILE.py:FUNCTION"):
        launch_lesson(0, "two_ranks")


def test_the_run_cache_runs_a_launch_once_per_key(tmp_path, monkeypatch):
    monkeypatch.setenv(run_cache.CACHE_ENV, str(tmp_path))
    calls = []

    def launch():
        calls.append(1)
        return LessonRun(["bash", "launch/lesson0.sh"], 0, "log\n", "", {"m": len(calls)}, "2")

    first = run_cache.cached_launch(0, ["--steps", "12"], 2, None, launch)
    again = run_cache.cached_launch(0, ["--steps", "12"], 2, None, launch)
    other = run_cache.cached_launch(0, ["--steps", "12"], 1, None, launch)
    assert len(calls) == 2 and first == again and other.metrics == {"m": 2}
    assert run_cache.summary(str(tmp_path)) == (
        "torchrun launches: 0 (2 lesson launches shared through the run cache)"
    )


def test_a_shared_run_of_lesson_code_runs_once_under_the_suite(tmp_path, monkeypatch):
    """course_lab.notebook.shared_run (lesson 8's jobs): a plain call without COURSE_SHARER; under
    the suite's run cache once per (name, arguments), every caller getting what JSON holds."""
    calls = []

    def job(flag, timeout_s=1):
        calls.append(flag)
        return {"flag": flag, "path": tmp_path / "out"}  # a Path becomes its text in the cache

    monkeypatch.delenv(run_cache.SHARER_ENV, raising=False)
    assert notebook.shared_run("hang", job, "--fault")["path"] == tmp_path / "out"
    monkeypatch.setenv(run_cache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(run_cache.SHARER_ENV, f"{Path(run_cache.__file__).resolve()}:cached_call")
    first = notebook.shared_run("hang", job, "--fault", timeout_s=10)
    again = notebook.shared_run("hang", job, "--fault", timeout_s=10)
    other = notebook.shared_run("hang", job, "--fault", timeout_s=20)
    assert calls == ["--fault", "--fault", "--fault"]  # the plain call, then two distinct keys
    assert first == again == {"flag": "--fault", "path": str(tmp_path / "out")} and other == first
