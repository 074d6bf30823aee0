"""FSDP2 (lesson 5): how ``fully_shard`` splits each parameter (``Shard(0)``), the per-rank
bytes that follow, and the bytes of each collective per step.
"""

from __future__ import annotations

import math

from fsdp_course.theory.sharding import ADAM_STATE_SLOTS, padded


def local_rows(dim0: int, world_size: int, rank: int) -> int:
    """Rows of a parameter's dim 0 that ``rank`` holds under ``Shard(0)``.

        c = ceil(dim0 / N);   rows(rank) = max(0, min(c, dim0 - rank * c))

    (``torch.chunk`` semantics: every rank gets ``c`` rows except the last ones, which get what
    is left, possibly 0; classic FSDP instead pads one flat parameter per unit.)
    """
    chunk = math.ceil(dim0 / world_size)
    return max(0, min(chunk, dim0 - rank * chunk))


def local_shape(shape: list[int], world_size: int, rank: int) -> list[int]:
    """The local shape of a ``Shard(0)`` DTensor parameter on ``rank``; 0-dim stays 0-dim."""
    if not shape:
        return []
    return [local_rows(shape[0], world_size, rank), *shape[1:]]


def padded_numel(shape: list[int], world_size: int) -> int:
    """Elements of one parameter as FSDP2 all-gathers it: dim 0 padded to ``N * ceil(d0 / N)``."""
    rest = math.prod(shape[1:])
    return padded(shape[0], world_size) * rest if shape else 1


def state_bytes_theory(shapes: list[list[int]], world_size: int, rank: int = 0,
                       param_bytes: int = 4, optim_slots: int = ADAM_STATE_SLOTS) -> dict:
    """Per-rank bytes of sharded parameters, gradients and Adam state with ``fully_shard``.

        local  = sum over parameters of numel(local_shape(shape, N, rank))
        params = grads = 4 * local;  optimizer = 2 * 4 * local   (fp32 master, grads, Adam)
    """
    local = sum(math.prod(local_shape(s, world_size, rank)) for s in shapes)
    return {"params": local * param_bytes, "grads": local * param_bytes,
            "optimizer": optim_slots * local * param_bytes}


def collective_bytes_theory(group_shapes: list[list[list[int]]], world_size: int,
                            reshard_after_forward: bool | int = True, root_reshards: bool = False,
                            param_bytes: int = 4, reduce_bytes: int = 4) -> dict:
    """Payload bytes per step with ``fully_shard`` (``group_shapes[0]``: the root's own
    parameters, then one list of shapes per block).

        G(g)           = sum over the group's parameters of padded_numel(shape, N)
        all_gather     = sum G(g) in forward
                         + sum G(g) again in backward for every group that resharded after
                           forward (reshard_after_forward=True; the root does not by default,
                           FSDP2 keeps it because backward starts with it right away)
        reduce_scatter = sum G(g) (each gradient once)

    reshard_after_forward=False: nothing is gathered twice. An int (a smaller group) gathers
    again in backward within that group only (payload counted the same way; with 1 there is
    no communication at all in backward).
    """
    if world_size == 1:
        return {}
    sizes = [sum(padded_numel(s, world_size) for s in group) for group in group_shapes]
    gathered = sum(sizes)
    regathered = sizes[1:] + (sizes[:1] if root_reshards else [])
    if reshard_after_forward is True:
        gathered += sum(regathered)
    elif reshard_after_forward is not False and reshard_after_forward > 1:
        gathered += sum(regathered) * reshard_after_forward // world_size
    return {"all_gather": gathered * param_bytes, "reduce_scatter": sum(sizes) * reduce_bytes}
