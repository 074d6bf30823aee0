"""Adding a lesson touches only the files README lists ("A new lesson adds ..."): a throwaway
lesson 10 made of exactly those files, in a copy of the course, is found by the course home,
the quiz CLI, the benchmark, its launches' reader and the tests that discover lessons (the
launcher tests, the notebook test, the quiz tests); and every real lesson has those files."""

from __future__ import annotations

import json
import re
import shutil
import sys

import nbformat
import pytest

from helpers import REPO_ROOT, run_cmd

COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", ".pytest_cache", ".ipynb_checkpoints", "runs", "*.egg-info"
)


def readme_lists() -> tuple[list[str], list[str]]:
    """The paths README's "A new lesson adds" list names: (every lesson's, where it has them)."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("A new lesson adds") : text.index("find it by themselves")]
    every, optional = section.split("where the lesson has them")
    paths = [
        [p for p in re.findall(r"`([^`\s]+)`", part) if "/" in p and re.search(r"N|<", p)]
        for part in (every, optional)
    ]
    return paths[0], paths[1]


def for_lesson(path: str, number: int, topic: str) -> str:
    return path.replace("NN_topic", f"{number:02d}_{topic}").replace("lessonN", f"lesson{number}")


def pytest_in(root, *args):
    """pytest, one process, in the copy of the course at ``root``."""
    return run_cmd(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *args],
        env={"PYTHONPATH": str(root), "QUIZZES_BANK_PATH": None},
        cwd=root,
        timeout=300,
    )


def test_readme_lists_the_files_every_lesson_adds():
    every, optional = readme_lists()
    assert every == [
        "lessons/NN_topic/NN_topic.ipynb",
        "lessons/NN_topic/train.py",
        "lessons/NN_topic/launches.toml",
        "launch/lessonN.sh",
        "quizzes/banks/lessonN.json",
        "tests/test_lessonN.py",
    ]
    assert "quizzes/labelled_answers/lessonN.json" in optional
    assert "course_lab/exercises/lessonN.py" in optional


def test_every_lesson_has_the_files_readme_lists():
    every, _ = readme_lists()
    folders = sorted(p for p in (REPO_ROOT / "lessons").glob("[0-9][0-9]_*") if p.is_dir())
    assert len(folders) >= 10
    for folder in folders:
        number, topic = int(folder.name[:2]), folder.name[3:]
        missing = [p for p in every if not (REPO_ROOT / for_lesson(p, number, topic)).is_file()]
        assert not missing, f"{folder.name}: {missing}"


def write_lesson_10(root):
    """Lesson 10, made of the files README lists for every lesson and nothing else."""
    every, _ = readme_lists()
    files = {for_lesson(p, 10, "scaffold"): p for p in every}
    for path, pattern in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if pattern.endswith(".ipynb"):
            nb = nbformat.v4.new_notebook()
            nb.cells = [
                nbformat.v4.new_markdown_cell("# Lesson 10 — A scaffold"),
                nbformat.v4.new_code_cell('print("lesson 10")'),
            ]
            nbformat.write(nb, target)
        elif pattern.endswith("train.py"):
            target.write_text('"""Lesson 10: a scaffold."""\nprint("lesson 10")\n')
        elif pattern.endswith("launches.toml"):
            target.write_text(
                '[script]\nwhat = "the defaults"\nnproc = 2\nargs = []\nbench = true\n\n'
                '[four]\nwhat = "on 4 ranks"\nnproc = 4\nargs = ["--steps", "1"]\n'
            )
        elif pattern == "launch/lessonN.sh":
            text = (REPO_ROOT / "launch" / "lesson0.sh").read_text()
            target.write_text(text.replace('run_lesson 0 "$@"', 'run_lesson 10 "$@"'))
            target.chmod(0o755)
        elif pattern.endswith("lessonN.json"):
            bank = json.loads((REPO_ROOT / pattern.replace("lessonN", "lesson0")).read_text())
            target.write_text(json.dumps({**bank, "lesson": "lesson10"}))
        elif pattern == "tests/test_lessonN.py":
            target.write_text(
                "def test_it_is_collected():\n    assert __file__.endswith('test_lesson10.py')\n"
            )
        else:
            raise AssertionError(f"the scaffold does not know how to write {pattern}")
    return sorted(files)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A copy of the course with lesson 10 added (the files it wrote, the copy)."""
    root = tmp_path_factory.mktemp("course") / "repo"
    shutil.copytree(REPO_ROOT, root, ignore=COPY_IGNORE)
    return write_lesson_10(root), root


def in_copy(root, code: str, *args):
    env = {"PYTHONPATH": str(root), "QUIZZES_BANK_PATH": None}
    proc = run_cmd([sys.executable, "-c", code, *args], env=env, cwd=root, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_scaffold_is_what_readme_lists(course):
    written, _ = course
    assert written == [
        "launch/lesson10.sh",
        "lessons/10_scaffold/10_scaffold.ipynb",
        "lessons/10_scaffold/launches.toml",
        "lessons/10_scaffold/train.py",
        "quizzes/banks/lesson10.json",
        "tests/test_lesson10.py",
    ]


def test_the_course_home_lists_it(course):
    _, root = course
    out = in_copy(
        root,
        "from course_lab.home import lessons\n"
        "print([(les.number, les.link, les.launch, les.title) for les in lessons()][-1])",
    )
    assert out.strip() == (
        "(10, '10_scaffold/10_scaffold.ipynb', 'bash launch/lesson10.sh', 'Lesson 10 — A scaffold')"
    )


def test_the_quiz_cli_lists_it(course):
    _, root = course
    progress = root / "progress.json"
    proc = run_cmd(
        [sys.executable, "-m", "quizzes", "list"],
        env={"PYTHONPATH": str(root), "QUIZZES_BANK_PATH": None, "FSDP_COURSE_PROGRESS": progress},
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^lesson10\s+10\s", proc.stdout, re.M), proc.stdout


def test_the_benchmark_and_run_lesson_read_its_launches(course):
    _, root = course
    out = in_copy(
        root,
        "import sys; sys.path.insert(0, 'launch')\n"
        "from pathlib import Path\n"
        "import bench\n"
        "from course_lab.notebook import lesson_args\n"
        "for kind, name, what, n in bench.find_items(Path('.').resolve(), ['lesson10']):\n"
        "    print(kind, name, n)\n"
        "print(lesson_args(10, ('four',)))\n",
    )
    assert out.splitlines() == [
        "notebook lessons/10_scaffold/10_scaffold.ipynb 10",
        "script lesson10.sh 10",
        "(['--steps', '1'], 4, {})",
    ]


def test_the_tests_that_discover_lessons_collect_it(course):
    """The launcher tests, the notebook test and the quiz tests find lesson 10 themselves, and
    its test file is collected (on the worker of its notebook: tests/conftest.py groups by the
    number in the name)."""
    _, root = course
    files = ["tests/test_launch.py", "tests/test_notebooks.py", "tests/test_quizzes.py"]
    proc = pytest_in(root, "--collect-only", *files, "tests/test_lesson10.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    collected = proc.stdout
    assert "tests/test_launch.py::test_launcher_syntax[lesson10.sh]" in collected
    assert "tests/test_launch.py::test_lesson_launcher_calls_run_lesson[10]" in collected
    assert "[10_scaffold]" in collected
    assert re.search(r"tests/test_quizzes.py::\w+\[lesson10\]", collected), collected
    assert "tests/test_lesson10.py::test_it_is_collected" in collected


def test_its_launcher_passes_the_launcher_tests(course):
    """The launcher tests, run in the copy: nothing outside README's list was needed."""
    _, root = course
    proc = pytest_in(root, "tests/test_launch.py", "-k", "10 or every_lesson_folder")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"\b\d+ passed", proc.stdout) and "failed" not in proc.stdout, proc.stdout
