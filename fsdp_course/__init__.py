"""The small library every lesson's ``train.py`` imports.

It hides only what no lesson is about: process-group setup and teardown, device and backend
choice, seeding, the toy model and its data, measurement and reporting. What a lesson teaches
(``FullyShardedDataParallel(...)``, ``fully_shard(...)``, wrap policies, ``no_sync()``, state
dicts) stays in the lesson's own script.
"""

from fsdp_course.config import parse_config
from fsdp_course.data import TextData, load_data
from fsdp_course.dist import DistEnv, distributed
from fsdp_course.measure import CommCounter, GatheredParamTracker, activation_bytes, state_bytes
from fsdp_course.model import GPT, Block, ModelConfig
from fsdp_course.report import MetricLogger, read_metrics, write_metrics

__all__ = [
    "Block", "CommCounter", "DistEnv", "GPT", "GatheredParamTracker", "MetricLogger",
    "ModelConfig", "TextData", "activation_bytes", "distributed", "load_data", "parse_config",
    "read_metrics", "state_bytes", "write_metrics",
]
