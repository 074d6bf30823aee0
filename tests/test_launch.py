"""The launchers: bad input gives one line and exit 2, the torchrun command they build, lab.sh's
arguments (dry run, no server started), setup.sh's no-op path, .ci/run."""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import REPO_ROOT, run_cmd

# Every lesson launcher there is (lesson 9 and later included as they come), by number.
LESSONS = sorted(int(p.stem[len("lesson") :]) for p in (REPO_ROOT / "launch").glob("lesson*.sh"))
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {proc.stderr!r}"
    return lines[0]


# --- the files themselves --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "setup.sh",
        "lab.sh",
        "test.sh",
        "bench.sh",
        "_common.sh",
        *[f"lesson{n}.sh" for n in LESSONS],
    ],
)
def test_launcher_syntax(name):
    proc = run_cmd(["bash", "-n", REPO_ROOT / "launch" / name])
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("n", LESSONS)
def test_lesson_launcher_calls_run_lesson(n):
    """The boilerplate lives in _common.sh; a launcher ends by handing over to run_lesson."""
    path = REPO_ROOT / "launch" / f"lesson{n}.sh"
    text = path.read_text()
    assert "_common.sh" in text
    assert text.strip().splitlines()[-1] == f'run_lesson {n} "$@"'
    assert path.stat().st_mode & stat.S_IXUSR


def test_every_lesson_folder_has_its_launcher():
    folders = sorted(
        int(p.name[:2]) for p in (REPO_ROOT / "lessons").glob("[0-9][0-9]_*") if p.is_dir()
    )
    assert folders and LESSONS == folders


def test_ci_run_calls_test_sh():
    path = REPO_ROOT / ".ci" / "run"
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text
    assert "bash launch/test.sh" in text
    assert path.stat().st_mode & stat.S_IXUSR


# --- bad input: exit 2, one line ---------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1.5", ""])
def test_bad_nproc(run_launcher, value):
    proc = run_launcher("lesson0.sh", env={"NPROC": value})
    assert proc.returncode == 2
    assert one_line(proc) == f"lesson0.sh: NPROC must be a positive integer, got '{value}'"


@pytest.mark.parametrize(
    "var,value",
    [
        ("NNODES", "abc"),
        ("NNODES", "0"),
        ("NODE_RANK", "x"),
        ("MASTER_PORT", "99999"),
        ("MASTER_PORT", "port"),
        ("MAX_RESTARTS", "-1"),
    ],
)
def test_bad_env(run_launcher, var, value):
    proc = run_launcher("lesson1.sh", env={"NPROC": "2", var: value})
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith(f"lesson1.sh: {var} must be"), line
    assert f"'{value}'" in line


def test_node_rank_must_be_below_nnodes(run_launcher):
    proc = run_launcher(
        "lesson1.sh", env={"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "127.0.0.1"}
    )
    assert proc.returncode == 2
    assert "NODE_RANK" in one_line(proc)


def test_several_nodes_need_master_addr(run_launcher):
    proc = run_launcher("lesson1.sh", env={"NNODES": "2", "MASTER_ADDR": None})
    assert proc.returncode == 2
    assert "MASTER_ADDR" in one_line(proc)


def test_missing_lesson_script():
    proc = run_cmd(
        ["bash", "-c", 'source launch/_common.sh && run_lesson 42 "$@"', "bash", "--steps", "1"]
    )
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith("lesson42.sh: ") and "lessons/42_*/train.py" in line


@pytest.mark.parametrize("how", ["flag", "env"])
def test_launcher_help(run_launcher, how):
    if how == "flag":
        proc = run_launcher("lesson3.sh", "--launcher-help")
    else:
        proc = run_launcher("lesson3.sh", env={"LAUNCH_HELP": "1"})
    assert proc.returncode == 0
    for var in (
        "NPROC",
        "NNODES",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "MAX_RESTARTS",
        "PYTHON",
    ):
        assert var in proc.stdout


# --- the torchrun command, with a stand-in Python that prints what it was given ----------------


@pytest.fixture
def fake_course(tmp_path):
    """A course root with lessons/07_fake/train.py and a fake interpreter that prints its
    arguments and some environment, then exits 7 (to check the exit code passes through)."""
    root = tmp_path / "course"
    (root / "lessons" / "07_fake").mkdir(parents=True)
    (root / "lessons" / "07_fake" / "train.py").write_text("print('hi')\n")
    fake = tmp_path / "fakepython"
    fake.write_text(
        textwrap.dedent("""\
        #!/usr/bin/env bash
        if [[ "$1" == "-c" ]]; then exit 0; fi   # the launcher's "is torch installed?" probe
        echo "ARGS $*"
        echo "PYTHONPATH=$PYTHONPATH"
        echo "SHARE_STORE=${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-unset}"
        exit 7
        """)
    )
    fake.chmod(0o755)

    def run(*args, env=None):
        env = {
            "PYTHON": str(fake),
            "NNODES": None,
            "NODE_RANK": None,
            "MASTER_ADDR": None,
            "MASTER_PORT": None,
            "MAX_RESTARTS": None,
            "RDZV_ID": None,
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": None,
            **(env or {}),
        }
        script = (
            f'source "{REPO_ROOT}/launch/_common.sh" && COURSE_ROOT="{root}" && run_lesson 7 "$@"'
        )
        return run_cmd(["bash", "-c", script, "bash", *args], env=env, cwd=tmp_path)

    run.root = root
    return run


def args_of(proc) -> list[str]:
    line = next(line for line in proc.stdout.splitlines() if line.startswith("ARGS "))
    return line.split()[1:]


def test_single_node_command(fake_course):
    proc = fake_course("--strategy", "FULL_SHARD", env={"NPROC": "3"})
    assert proc.returncode == 7, proc.stderr  # exit code of the command passes through
    args = args_of(proc)
    assert args[:4] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3"]
    # (no fsdp_course/torchrun.py in this fake course: plain torchrun)
    assert args[-3:] == [
        str(fake_course.root / "lessons/07_fake/train.py"),
        "--strategy",
        "FULL_SHARD",
    ]
    shown = one_line(proc)  # the command, shown once on stderr
    assert (
        shown.startswith("+ ") and "torch.distributed.run --standalone --nproc-per-node=3" in shown
    )
    assert f"PYTHONPATH={fake_course.root}" in proc.stdout  # import fsdp_course works uninstalled
    assert "SHARE_STORE=unset" in proc.stdout


@pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="GPUs: the default is their count"
)
def test_default_nproc_without_gpus_is_2(fake_course):
    proc = fake_course(env={"NPROC": None})
    assert "--nproc-per-node=2" in args_of(proc)


def test_multi_node_command(fake_course):
    proc = fake_course(
        env={
            "NPROC": "2",
            "NNODES": "2",
            "NODE_RANK": "1",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29600",
        }
    )
    args = args_of(proc)
    for expected in [
        "--nnodes=2",
        "--node-rank=1",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29600",
        "--rdzv-id=fsdp-course",
    ]:
        assert expected in args
    assert "--standalone" not in args


def test_uses_the_course_torchrun_wrapper_when_present(fake_course):
    (fake_course.root / "fsdp_course").mkdir()
    (fake_course.root / "fsdp_course" / "torchrun.py").write_text("")
    proc = fake_course(env={"NPROC": "2"})
    assert args_of(proc)[:2] == ["-m", "fsdp_course.torchrun"]


def test_max_restarts(fake_course):
    proc = fake_course(env={"NPROC": "2", "MAX_RESTARTS": "2"})
    assert "--max-restarts=2" in args_of(proc)
    # Restarting with torchrun's shared TCP store keeps the dead workers' addresses ("Gloo
    # connectFullMesh failed"): the launcher gives each attempt its own store.
    assert "SHARE_STORE=1" in proc.stdout


def test_script_help_uses_one_process(fake_course):
    proc = fake_course("--help")
    args = args_of(proc)
    assert "--nproc-per-node=1" in args and args[-1] == "--help"


# --- lab.sh, dry run (no server is started) -----------------------------------------------------


def lab_dry_run(run_launcher, **env):
    proc = run_launcher("lab.sh", env={"LAB_DRY_RUN": "1", "LAB_IP": None, "LAB_PORT": None, **env})
    return proc


def test_lab_refuses_empty_token(run_launcher):
    proc = run_launcher("lab.sh", env={"LAB_TOKEN": "", "LAB_DRY_RUN": "1"})
    assert proc.returncode == 2
    assert "LAB_TOKEN" in one_line(proc)


def test_lab_command(run_launcher):
    proc = lab_dry_run(run_launcher, LAB_TOKEN=None)
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout
    assert "--ip=127.0.0.1" in cmd
    token = re.search(r"--IdentityProvider\.token=(\S+)", cmd)
    assert token and len(token.group(1)) >= 32
    assert ("--allow-root" in cmd) == IS_ROOT
    assert "--no-browser" in cmd
    assert "--LabApp.default_url=/lab/tree/" in cmd
    assert "-m jupyterlab" in cmd
    # a fresh random token each time
    again = re.search(
        r"--IdentityProvider\.token=(\S+)", lab_dry_run(run_launcher, LAB_TOKEN=None).stdout
    )
    assert again.group(1) != token.group(1)


def test_lab_options(run_launcher):
    proc = lab_dry_run(run_launcher, LAB_TOKEN="s3cret", LAB_PORT="9999", LAB_OPEN_BROWSER="1")
    assert proc.returncode == 0, proc.stderr
    assert "--IdentityProvider.token=s3cret" in proc.stdout
    assert "--port=9999" in proc.stdout
    assert "--no-browser" not in proc.stdout
    extra = run_launcher(
        "lab.sh", "--ServerApp.port_retries=0", env={"LAB_DRY_RUN": "1", "LAB_TOKEN": "t0ken"}
    )
    assert extra.stdout.strip().endswith("--ServerApp.port_retries=0")


def test_lab_warns_when_not_loopback(run_launcher):
    proc = lab_dry_run(run_launcher, LAB_IP="0.0.0.0")
    assert proc.returncode == 0
    assert "--ip=0.0.0.0" in proc.stdout
    assert "WARNING" in proc.stderr


def test_lab_bad_port(run_launcher):
    proc = lab_dry_run(run_launcher, LAB_PORT="http")
    assert proc.returncode == 2
    assert "LAB_PORT" in one_line(proc)


# --- test.sh and setup.sh -----------------------------------------------------------------------


def test_test_sh_passes_arguments_to_pytest(run_launcher):
    proc = run_launcher("test.sh", "--version", env={"PYTHON": sys.executable}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "pytest" in (proc.stdout + proc.stderr)


def test_setup_refuses_old_python(tmp_path):
    old = tmp_path / "python3.8"
    old.write_text(
        '#!/usr/bin/env bash\nif [[ "$*" == *platform* ]]; then echo 3.8.10; fi\nexit 1\n'
    )
    old.chmod(0o755)
    proc = run_cmd(
        ["bash", REPO_ROOT / "launch/setup.sh"],
        env={"VENV": tmp_path / "venv", "PYTHON_FOR_VENV": old},
    )
    assert proc.returncode == 2
    assert ">= 3.10" in proc.stderr and "3.8.10" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_setup_refuses_old_torch(tmp_path):
    """A venv whose torch is 2.1: setup stops and says how to upgrade, installing nothing."""
    fake_site = tmp_path / "site"
    dist_info = fake_site / "torch-2.1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.1.0\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        f'#!/usr/bin/env bash\nPYTHONPATH="{fake_site}" exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    proc = run_cmd(["bash", REPO_ROOT / "launch/setup.sh"], env={"VENV": venv})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "torch 2.1.0" in proc.stderr and "pip install --upgrade" in proc.stderr
    assert not (venv / ".fsdp-course-setup.stamp").exists()


def _venv_installs_this_checkout() -> bool:
    """Is the course installed in the running venv this checkout (editable)? Otherwise
    running setup.sh on it would re-point a venv another checkout uses at this one."""
    # -I: neither PYTHONPATH nor the working folder
    probe = run_cmd(
        [sys.executable, "-I", "-c", "import fsdp_course; print(fsdp_course.__file__)"],
        cwd="/",
        timeout=60,
    )
    return probe.returncode == 0 and Path(probe.stdout.strip()).resolve().is_relative_to(
        REPO_ROOT.resolve()
    )


@pytest.mark.skipif(
    sys.prefix == sys.base_prefix, reason="tests are not running in a virtual environment"
)
def test_setup_installs_nothing_when_nothing_changed():
    """Run setup on the venv running the tests (the first run may install the course: that is
    what setup is for); the second run must install nothing and say it is up to date."""
    if not _venv_installs_this_checkout():
        pytest.skip("the venv running the tests installs another checkout of the course")
    env = {"VENV": sys.prefix, "SETUP_QUIET": None, "SETUP_FORCE": None, "TORCH_SPEC": None}
    first = run_cmd(["bash", REPO_ROOT / "launch/setup.sh"], env=env, timeout=900)
    assert first.returncode == 0, first.stdout + first.stderr
    second = run_cmd(["bash", REPO_ROOT / "launch/setup.sh"], env=env, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "up to date" in second.stdout
    assert "install" not in second.stdout.replace("nothing to install", "")
    quiet = run_cmd(["bash", REPO_ROOT / "launch/setup.sh", "--quiet"], env=env, timeout=300)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_bench_with_nothing_selected_writes_nothing(run_launcher):
    before = sorted(p.name for p in REPO_ROOT.iterdir())
    proc = run_launcher("bench.sh", env={"BENCH_ONLY": "no-such-lesson"}, timeout=120)
    assert proc.returncode == 1
    assert "nothing to run" in proc.stderr
    assert sorted(p.name for p in REPO_ROOT.iterdir()) == before


def test_readme_names_every_library_module():
    """The README's map of the house names every module of the two wings (a new one too)."""
    text = (REPO_ROOT / "README.md").read_text()
    block = text[
        text.index("fsdp_course/           the training wing") : text.index(
            "quizzes/               "
        )
    ]
    words = set(re.findall(r"[a-z_0-9]+", block))
    for wing in ("fsdp_course", "course_lab"):
        modules = {p.stem for p in (REPO_ROOT / wing).glob("*.py") if not p.stem.startswith("_")}
        modules |= {p.name for p in (REPO_ROOT / wing).iterdir() if (p / "__init__.py").is_file()}
        assert modules and modules <= words, (wing, sorted(modules - words))


def test_readme_names_the_commands_and_launchers():
    text = (REPO_ROOT / "README.md").read_text()
    for needed in [
        "bash launch/lab.sh",
        "bash launch/test.sh",
        "bash launch/bench.sh",
        *[f"lesson{n}.sh" for n in LESSONS],
    ]:
        assert needed in text, needed
