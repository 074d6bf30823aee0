"""Checkers for the notebooks' exercises, one module per lesson (``lessonN.py``).

Each checker registers itself with the quiz engine (``@exercise("lessonN", "ex_...")``), is
called by ``quizzes.check_exercise`` as ``checker(learner_fn, **context)`` and returns
``(passed, message)``; the message says why an answer is wrong, not only that it is.
Importing this package registers every lesson's checkers: a new ``lessonN.py`` is found by itself.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    if _module.name.startswith("lesson"):
        importlib.import_module(f"{__name__}.{_module.name}")
