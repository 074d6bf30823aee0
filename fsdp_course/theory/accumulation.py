"""Gradient accumulation with FSDP (lesson 3): what ``no_sync`` saves, what it costs, and how to
check that K micro-batches give the gradient of one big batch.

Sizes are in bytes; ``P`` is the parameter count, ``N`` the world size, ``K`` the micro-batches
per optimizer step. With FULL_SHARD (classic FSDP or FSDP2), per optimizer step:

    all-gather payload      ~ K * 2 * 4P      every micro-batch gathers the parameters for its
                                              forward and again for its backward: no_sync does
                                              not change this
    reduce-scatter payload    K * 4P_pad      syncing every micro-batch
                              1 * 4P_pad      with no_sync() / set_requires_gradient_sync(False)
                                              on all but the last micro-batch
    saved by no_sync          (K - 1) * 4P_pad; each rank sends (N - 1)/N of it (ring)
    gradients held between    4P  (unsharded)  with no_sync: every rank keeps the whole gradient
    micro-batches, per rank   4P_pad / N       syncing every micro-batch: its shard only
    cost of no_sync           4P - 4P_pad / N  ~ 4P (N - 1) / N, the same whatever K is

``P_pad`` is ``P`` padded as the API shards it: classic FSDP pads each unit's flat parameter
to a multiple of N; FSDP2 pads each parameter's first dimension to a multiple of N.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsdp_course.theory.sharding import padded

if TYPE_CHECKING:  # annotations only: the formulas run without torch
    import torch.nn as nn


def fsdp1_padded_numel(unit_numels: list[int], world_size: int) -> int:
    """Classic FSDP: ``sum over units of N * ceil(n_unit / N)`` (the all-gathered flat size)."""
    return sum(padded(n, world_size) for n in unit_numels)


def fsdp2_padded_numel(model: nn.Module, world_size: int) -> int:
    """FSDP2 (``Shard(0)`` per parameter): ``sum over parameters of N * ceil(d0 / N) * rest``,
    where ``d0`` is the parameter's first dimension. Call on the unwrapped model."""
    total = 0
    for p in model.parameters():
        rest = p.numel() // p.shape[0] if p.dim() else 1
        rows = p.shape[0] if p.dim() else 1
        total += padded(rows, world_size) * rest
    return total


def reduce_bytes_per_step(
    padded_numel: int, accum: int, no_sync: bool, grad_bytes: int = 4, world_size: int = 2
) -> int:
    """Reduce-scatter payload per optimizer step: ``grad_bytes * P_pad * (1 if no_sync else K)``.

    On one rank there is no reduce-scatter: classic FSDP runs as NO_SHARD there
    (torch/distributed/fsdp/_init_utils.py) and all-reduces the same bytes instead, and FSDP2
    copies the gradient into its shard (``foreach_reduce`` in
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py: ``if world_size > 1``) -> 0.
    """
    if world_size == 1:
        return 0
    return grad_bytes * padded_numel * (1 if no_sync else accum)


def reduce_bytes_saved(num_params: int, accum: int, world_size: int, grad_bytes: int = 4) -> dict:
    """What ``no_sync`` saves per optimizer step (padding ignored):

        payload = (K - 1) * grad_bytes * P
        sent    = payload * (N - 1) / N     bytes each rank sends less (ring reduce-scatter)

    Returned as ``payload`` and ``sent_per_rank``.
    """
    payload = (accum - 1) * grad_bytes * num_params
    return {"payload": payload, "sent_per_rank": payload * (world_size - 1) / world_size}


def held_grad_bytes_theory(
    num_params: int, padded_numel: int, world_size: int, no_sync: bool, grad_bytes: int = 4
) -> int:
    """Gradient bytes one rank holds between micro-batches (K >= 2):

        no_sync:      grad_bytes * P               the unsharded gradient, kept until the last
                                                   micro-batch reduce-scatters it
        sync always:  grad_bytes * P_pad / N       the rank's shard, accumulated in place

    The difference is what no_sync costs in memory, the same whatever K is.
    """
    if no_sync:
        return grad_bytes * num_params
    return grad_bytes * padded_numel // world_size
