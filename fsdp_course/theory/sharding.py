"""Sharding strategies (lessons 0 and 1): per-rank bytes and bytes per collective.

Sizes are in bytes; ``P`` is the parameter count. Classic FSDP flattens each wrapped unit's
parameters into one flat parameter of ``n`` elements, pads it to a multiple of the shard count
``S`` (``padded(n, S) = S * ceil(n / S)``) and gives each rank ``ceil(n / S)`` elements.
"""

from __future__ import annotations

import math

import torch.nn as nn

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
ADAM_STATE_SLOTS = 2  # exp_avg and exp_avg_sq, each the size of the parameter (fp32)


def fsdp_unit_numels(model: nn.Module, block_cls: type) -> list[int]:
    """Numels of the units transformer auto-wrap makes: the root (all parameters outside the
    blocks) first, then one per ``block_cls`` instance. Call on the unwrapped model."""
    blocks = [sum(p.numel() for p in m.parameters()) for m in model.modules()
              if isinstance(m, block_cls)]
    total = sum(p.numel() for p in model.parameters())
    return [total - sum(blocks), *blocks]


def shard_numel(numel: int, shards: int) -> int:
    """Elements one rank stores of a flat parameter: ``ceil(numel / shards)`` (padding included)."""
    return math.ceil(numel / shards)


def padded(numel: int, shards: int) -> int:
    """``numel`` rounded up to a multiple of ``shards``: ``shards * ceil(numel / shards)``, the
    size a sharded tensor has once all-gathered (every shard is equal, the last one padded)."""
    return shards * shard_numel(numel, shards)


def shard_group_size(strategy: str, world_size: int, replicas: int = 1) -> int:
    """Ranks a parameter is split over: all of them, one (NO_SHARD), or those of one replica
    (HYBRID_SHARD with ``replicas`` groups: shards within a group, replicates across groups)."""
    if strategy == "NO_SHARD":
        return 1
    if strategy == "HYBRID_SHARD":
        return world_size // replicas
    return world_size


def model_state_bytes(unit_numels: list[int], world_size: int, strategy: str,
                      replicas: int = 1, param_bytes: int = 4,
                      optim_slots: int = ADAM_STATE_SLOTS) -> dict:
    """Per-rank bytes of parameters, gradients and optimizer state after backward.

        S      = shard_group_size(strategy, world_size, replicas)
        local  = sum over units of ceil(n_u / S)
        params = local * param_bytes;  grads = local * param_bytes
        optimizer = optim_slots * local * param_bytes        (Adam: 2 fp32 slots)

    FULL_SHARD and SHARD_GRAD_OP both shard all three (ZeRO-3 and ZeRO-2 differ in what they
    keep *during* forward/backward, not in the sharded state): about 16 P / N with Adam.
    NO_SHARD (and DDP) keep all three in full on every rank: 16 P. Mixed precision does not
    change these: the sharded master copy, its gradient and Adam's state stay fp32.
    """
    shards = 1 if world_size == 1 else shard_group_size(strategy, world_size, replicas)
    local = sum(shard_numel(n, shards) for n in unit_numels)
    return {"params": local * param_bytes, "grads": local * param_bytes,
            "optimizer": optim_slots * local * param_bytes}


def ddp_state_bytes(num_params: int, param_bytes: int = 4,
                    optim_slots: int = ADAM_STATE_SLOTS) -> dict:
    """DDP: a full replica on every rank, whatever the world size: 4P + 4P + 8P = 16 P bytes."""
    return {"params": num_params * param_bytes, "grads": num_params * param_bytes,
            "optimizer": optim_slots * num_params * param_bytes}


def collective_bytes(unit_numels: list[int], world_size: int, strategy: str, replicas: int = 1,
                     param_bytes: int = 4, reduce_bytes: int = 4) -> dict:
    """Payload bytes per training step, by collective, for classic FSDP (root unit first).

        padded(n) = S * ceil(n / S)             (the all-gathered size of a unit)
        FULL_SHARD:     all_gather = sum padded(n) in forward + the same again in backward,
                        except the root, which stays gathered from forward to backward
                        -> about 2 P; reduce_scatter = sum padded(n) -> P
        SHARD_GRAD_OP:  all_gather = sum padded(n) once (kept until backward) -> P;
                        reduce_scatter -> P
        NO_SHARD / DDP: all_reduce of every gradient -> P
        HYBRID_SHARD:   FULL_SHARD within a group of S ranks, then all_reduce of each
                        gradient shard across the replicas -> sum ceil(n / S)

    all_gather moves ``param_bytes`` per element (2 with bf16 mixed precision),
    reduce_scatter / all_reduce ``reduce_bytes``.
    """
    if world_size == 1:
        return {}
    shards = shard_group_size(strategy, world_size, replicas)
    padded_numels = [padded(n, shards) for n in unit_numels]
    if strategy == "NO_SHARD":
        return {"all_reduce": sum(unit_numels) * reduce_bytes}
    if strategy == "SHARD_GRAD_OP":
        gathered = sum(padded_numels)
    else:  # the root is not gathered again in backward
        gathered = sum(padded_numels) + sum(padded_numels[1:])
    result = {"all_gather": gathered * param_bytes,
              "reduce_scatter": sum(padded_numels) * reduce_bytes}
    if strategy == "HYBRID_SHARD" and replicas > 1:
        result["all_reduce"] = sum(shard_numel(n, shards) for n in unit_numels) * reduce_bytes
    return result


def gathered_peak_bytes(unit_numels: list[int], world_size: int, strategy: str,
                        replicas: int = 1, param_bytes: int = 4) -> int:
    """Peak bytes of unsharded parameters held at once (beyond the sharded state).

        FULL_SHARD:    root + 2 * largest block: the root stays gathered for the whole step,
                       and backward prefetches the next block while the current one computes
        SHARD_GRAD_OP: every unit, padded: all stay gathered from forward until backward
        NO_SHARD:      0 (parameters are never sharded, so nothing is gathered)
    """
    if world_size == 1 or strategy == "NO_SHARD":
        return 0
    shards = shard_group_size(strategy, world_size, replicas)
    unit_bytes = [padded(n, shards) * param_bytes for n in unit_numels]
    if strategy == "SHARD_GRAD_OP":
        return sum(unit_bytes)
    blocks = sorted(unit_bytes[1:], reverse=True)
    return unit_bytes[0] + sum(blocks[:2])


def ring_sent_bytes(kind: str, payload: int, world_size: int) -> float:
    """Bytes each rank sends for a collective with a ring algorithm (what NCCL uses for large
    messages): all_gather and reduce_scatter (N-1)/N of the payload, all_reduce 2(N-1)/N."""
    factor = 2 if kind == "all_reduce" else 1
    return factor * payload * (world_size - 1) / world_size
