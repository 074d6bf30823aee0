"""Each lesson's launches, declared once in ``lessons/NN_topic/launches.toml`` and read by the
notebook (``run_lesson(N, "name")``), the tests (``launch(N, "name")``) and the benchmark.

A declaration is a TOML table per launch::

    [two_ranks]
    what = "DDP on 2 ranks: what torchrun sets, the all-reduce"   # one line for humans
    nproc = 2                                                     # NPROC, ranks on this node
    args = ["--steps", "12"]                                      # the launcher's flags
    variants = ["strategy=DDP", "api=classic"]                    # optional: --variants a;b
    env = { COURSE_TIMEOUT_S = "2" }                              # optional: extra variables
    bench = true                                                  # optional: launch/bench.py

The command is ``NPROC=nproc bash launch/lessonN.sh *args --variants "a;b"``. An argument like
``"{ckpt_dir}"`` is a placeholder the caller fills (``run_lesson(4, "main", ckpt_dir=RUN)``): a
path that is the caller's own, such as a checkpoint folder.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
LESSONS = REPO / "lessons"
FILE = "launches.toml"
KEYS = {"what", "nproc", "args", "variants", "env", "bench"}
PLACEHOLDER = re.compile(r"\{(\w+)\}")
NAME = re.compile(r"[a-z][a-z0-9_]*")


class LaunchError(ValueError):
    """A declaration that is wrong, or a name or placeholder that none declares: one line."""


@dataclass(frozen=True)
class Launch:
    """One declared launch of lesson ``lesson``."""

    lesson: int
    name: str
    what: str
    nproc: int
    args: tuple[str, ...]
    env: dict = field(default_factory=dict)
    bench: bool = False
    variants: tuple[str, ...] = ()  # already in args, after --variants; here one by one

    @property
    def placeholders(self) -> list[str]:
        return sorted({m for arg in self.args for m in PLACEHOLDER.findall(arg)})

    def filled(self, **values) -> list[str]:
        """The flags with every ``{placeholder}`` replaced by ``values``."""
        missing = [p for p in self.placeholders if p not in values]
        unused = sorted(set(values) - set(self.placeholders))
        if missing or unused:
            wanted = ", ".join(f"{p}=..." for p in self.placeholders) or "no placeholders"
            raise LaunchError(f"lesson {self.lesson}'s launch {self.name!r} takes {wanted}")
        return [PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), arg) for arg in self.args]

    def command(self, **values) -> str:
        """What a learner types in a terminal for this launch."""
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in self.env.items())
        words = shlex.join(["bash", f"launch/lesson{self.lesson}.sh", *self.filled(**values)])
        return f"{env + ' ' if env else ''}NPROC={self.nproc} {words}"


def lesson_folder(lesson: int, root: Path = LESSONS) -> Path:
    found = sorted(root.glob(f"{lesson:02d}_*/"))
    if len(found) != 1:
        raise LaunchError(f"no single lessons/{lesson:02d}_topic/ folder (found {len(found)})")
    return found[0]


def lesson_launches(lesson: int, root: Path = LESSONS) -> dict[str, Launch]:
    """Every launch ``lessons/NN_topic/launches.toml`` declares, by name, checked."""
    path = lesson_folder(lesson, root) / FILE
    where = f"{path.parent.name}/{FILE}"
    try:
        tables = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise LaunchError(f"lesson {lesson} has no {where}") from None
    except tomllib.TOMLDecodeError as exc:
        raise LaunchError(f"{where}: {exc}") from None
    launches = {}
    for name, table in tables.items():
        problem = _problem(name, table)
        if problem:
            raise LaunchError(f"{where}, launch {name!r}: {problem}")
        args = [*table["args"]]
        if table.get("variants"):
            args += ["--variants", ";".join(table["variants"])]
        launches[name] = Launch(
            lesson,
            name,
            table["what"],
            table["nproc"],
            tuple(args),
            dict(table.get("env", {})),
            table.get("bench", False),
            tuple(table.get("variants", ())),
        )
    return launches


def _problem(name: str, table) -> str | None:
    """What is wrong with one declaration, or None."""
    if not NAME.fullmatch(name):
        return "a name is lower case letters, digits and _"
    if not isinstance(table, dict):
        return "not a table"
    unknown = sorted(set(table) - KEYS)
    if unknown:
        return f"unknown key {', '.join(unknown)} (known: {', '.join(sorted(KEYS))})"
    if not isinstance(table.get("what"), str) or not table["what"].strip():
        return 'needs what = "one line saying what it runs"'
    nproc = table.get("nproc")
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        return "needs nproc = a number of ranks >= 1"
    for key in ("args", "variants"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
            return f"{key} is a list of strings"
    if "args" not in table:
        return "needs args = [...] (an empty list: the script's defaults)"
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        return "env is a table of strings"
    if not isinstance(table.get("bench", False), bool):
        return "bench is true or false"
    return None


def declared(lesson: int, name: str, root: Path = LESSONS) -> Launch:
    """Lesson ``lesson``'s launch ``name``; an unknown name says which names there are."""
    launches = lesson_launches(lesson, root)
    if name not in launches:
        known = ", ".join(launches) or "none"
        raise LaunchError(f"lesson {lesson} declares no launch {name!r} (known: {known})")
    return launches[name]


def is_launch_name(args) -> bool:
    """``run_lesson(N, "name")`` names a declared launch; flags start with "-"."""
    return len(args) >= 1 and isinstance(args[0], str) and bool(NAME.fullmatch(args[0]))
