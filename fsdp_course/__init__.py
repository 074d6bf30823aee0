"""The small library every lesson's ``train.py`` imports.

It hides only what no lesson is about: process-group setup and teardown, device and backend
choice, seeding, the toy model and its data, measurement and reporting. What a lesson teaches
(``FullyShardedDataParallel(...)``, ``fully_shard(...)``, wrap policies, ``no_sync()``, state
dicts) stays in the lesson's own script.
"""

from __future__ import annotations

import importlib

# Each name from the module that defines it, imported on first use: a tool that needs none of
# torch (``python -m fsdp_course.plan``, the quizzes) does not pay the seconds a torch import
# costs by importing this package.
_HOMES = {
    "parse_config": "config",
    "TextData": "data",
    "load_data": "data",
    "DistEnv": "dist",
    "distributed": "dist",
    "CommCounter": "measure",
    "GatheredParamTracker": "measure",
    "activation_bytes": "measure",
    "state_bytes": "measure",
    "GPT": "model",
    "Block": "model",
    "ModelConfig": "model",
    "MetricLogger": "report",
    "read_metrics": "report",
    "write_metrics": "report",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'fsdp_course' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fsdp_course.{_HOMES[name]}"), name)
