"""A learner's code, loaded by a lesson script.

An exercise's notebook cell is saved to a file (``course_lab.learner.save_cell``) and handed to
the lesson script with a flag (``--eval-module FILE``); the script loads it with one call:

    learner = load_learner(cfg.eval_module, "--eval-module", "evaluate(model, batch, env)")
    evaluate = learner.evaluate

Whatever is wrong with the file is a ``CourseError``: one line, and the script exits 2.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from fsdp_course.dist import CourseError


def load_learner(path, flag: str, *functions: str) -> ModuleType:
    """The module in the learner's file at ``path`` (given on the command line as ``flag``),
    checked to define every function in ``functions``, each written as its signature
    (``"evaluate(model, batch, env)"``) so that the error can name it. A CourseError, one line,
    when the file does not exist, when running it raises (the exception's type and first
    line), or when a function is missing."""
    file = Path(path)
    if not file.is_file():
        raise CourseError(f"{flag} {path}: no such file")
    name = f"learner_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import does: dataclasses and pickle look a module up here
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the learner's code: one line, not a traceback
        del sys.modules[name]
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CourseError(
            f"{flag} {path}: {type(exc).__name__}{': ' + first if first else ''}"
        ) from None
    for signature in functions:
        if not callable(getattr(module, signature.split("(")[0], None)):
            raise CourseError(f"{flag} {path}: defines no function {signature}")
    return module
