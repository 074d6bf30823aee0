"""What the measurements should be, as functions: scripts, notebooks and tests compare against
the same code. One module per topic, each formula with its derivation in its docstring:

- ``sharding``      lessons 0-1: per-rank bytes and collective bytes per strategy; ``padded``
- ``wrapping``      lesson 2: the all-gather peak and collective calls per wrap policy
- ``accumulation``  lesson 3: what ``no_sync`` saves and what it costs
- ``fsdp2``         lesson 5: ``fully_shard``'s per-parameter shards and collectives
- ``precision``     lesson 6: dtypes' precision, bytes per collective in each precision
- ``memory``        lesson 7: the memory planner's per-rank bytes by category (ZeRO too)
- ``decoders``      the planner's Hugging Face models (llama, mistral, qwen2, gpt2) from a
                    config.json: parameter shapes and saved activations
- ``hsdp``          lesson 8: HSDP's bytes within and between nodes

``from fsdp_course import theory`` gives the sharding formulas directly
(``theory.model_state_bytes``); the other topics are ``theory.wrapping`` and so on.
"""

from __future__ import annotations

import importlib

from fsdp_course.theory.sharding import (
    ADAM_STATE_SLOTS,
    STRATEGIES,
    collective_bytes,
    ddp_state_bytes,
    fsdp_unit_numels,
    gathered_peak_bytes,
    model_state_bytes,
    padded,
    ring_sent_bytes,
    shard_group_size,
    shard_numel,
)

# The topics are imported on first use (``theory.precision`` needs torch; the planner's
# formulas do not, so ``python -m fsdp_course.plan`` starts without it).
TOPICS = ("accumulation", "decoders", "fsdp2", "hsdp", "memory", "precision", "wrapping")

__all__ = [
    "ADAM_STATE_SLOTS",
    "STRATEGIES",
    "accumulation",
    "collective_bytes",
    "ddp_state_bytes",
    "decoders",
    "fsdp2",
    "fsdp_unit_numels",
    "gathered_peak_bytes",
    "hsdp",
    "memory",
    "model_state_bytes",
    "padded",
    "precision",
    "ring_sent_bytes",
    "shard_group_size",
    "shard_numel",
    "wrapping",
]


def __getattr__(name: str):
    if name not in TOPICS:
        raise AttributeError(f"module 'fsdp_course.theory' has no attribute {name!r}")
    return importlib.import_module(f"fsdp_course.theory.{name}")
