"""FSDP2 (lesson 5): how ``fully_shard`` splits each parameter (``Shard(0)``), the per-rank
bytes that follow, and the bytes of each collective per step.
"""

from __future__ import annotations

import math

from fsdp_course.theory.sharding import ADAM_STATE_SLOTS, padded


def local_rows(dim0: int, world_size: int, rank: int) -> int:
    """Rows of a parameter's dim 0 in ``rank``'s *local tensor* under ``Shard(0)``
    (``p.to_local().shape[0]``):

        c = ceil(dim0 / N);   rows(rank) = max(0, min(c, dim0 - rank * c))

    (``torch.chunk`` semantics: every rank gets ``c`` rows except the last ones, which get what
    is left, possibly 0.) That is the view DTensor hands out, not what the rank stores: see
    ``stored_rows``.
    """
    chunk = math.ceil(dim0 / world_size)
    return max(0, min(chunk, dim0 - rank * chunk))


def stored_rows(dim0: int, world_size: int) -> int:
    """Rows every rank *stores* for a ``Shard(0)`` parameter: ``ceil(dim0 / N)``, rank 0's
    chunk, on every rank.

    ``FSDPParam._init_sharded_param`` (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``)
    allocates each rank's shard padded to chunk 0's size ("pre-pad the sharded parameter to
    avoid padding before all-gather"), keeps it as ``_sharded_param_data``, and gives the
    DTensor a narrowed view of its first ``local_rows`` rows. So the padding is stored on
    every rank whose chunk is short, and the all-gather sends the padded shards as they are.
    Classic FSDP pads too, once per unit (one flat parameter); FSDP2 once per parameter.
    """
    return math.ceil(dim0 / world_size)


def stored_param_bytes(shapes: list[list[int]], world_size: int, param_bytes: int = 4) -> int:
    """Bytes one rank's parameter shards take in storage: ``sum padded_numel(shape, N) / N``
    (the same on every rank, see ``stored_rows``)."""
    return sum(padded_numel(s, world_size) // world_size for s in shapes) * param_bytes


def local_shape(shape: list[int], world_size: int, rank: int) -> list[int]:
    """The local shape of a ``Shard(0)`` DTensor parameter on ``rank``; 0-dim stays 0-dim."""
    if not shape:
        return []
    return [local_rows(shape[0], world_size, rank), *shape[1:]]


def padded_numel(shape: list[int], world_size: int) -> int:
    """Elements of one parameter as FSDP2 all-gathers it: dim 0 padded to ``N * ceil(d0 / N)``."""
    rest = math.prod(shape[1:])
    return padded(shape[0], world_size) * rest if shape else 1


def state_bytes_theory(
    shapes: list[list[int]],
    world_size: int,
    rank: int = 0,
    param_bytes: int = 4,
    optim_slots: int = ADAM_STATE_SLOTS,
) -> dict:
    """Per-rank bytes of sharded parameters, gradients and Adam state with ``fully_shard``.

        local  = sum over parameters of numel(local_shape(shape, N, rank))
        params = grads = 4 * local;  optimizer = 2 * 4 * local   (fp32 master, grads, Adam)

    The 4 is ``param_bytes``, the 2 ``optim_slots``.
    """
    local = sum(math.prod(local_shape(s, world_size, rank)) for s in shapes)
    return {
        "params": local * param_bytes,
        "grads": local * param_bytes,
        "optimizer": optim_slots * local * param_bytes,
    }


def reshard_per_group(reshard_after_forward, groups: int, world_size: int) -> list:
    """What each group (the root first) does after forward, as ``fully_shard`` settles it
    (``_get_post_forward_mesh_info`` in ``_fully_shard/_fsdp_init.py``, ``_lazy_init`` in
    ``_fsdp_state.py``): True (reshard over all N ranks), False (keep it whole), or an int g
    (reshard over groups of g ranks).

        None     -> FSDP2's default: the root False, every other group True
        int 1    -> False (fully_shard warns: resharding to world size 1 keeps it whole)
        int N    -> True
        a list   -> one value per group, each read the same way
    """
    values = (
        list(reshard_after_forward)
        if isinstance(reshard_after_forward, (list, tuple))
        else [reshard_after_forward] * groups
    )
    settled = []
    for index, value in enumerate(values):
        if value is None:
            value = index != 0
        elif value is not True and value is not False:
            value = False if value == 1 else True if value == world_size else int(value)
        settled.append(value)
    return settled


def collective_bytes_theory(
    group_shapes: list[list[list[int]]],
    world_size: int,
    reshard_after_forward=True,
    root_reshards: bool = False,
    param_bytes: int = 4,
    reduce_bytes: int = 4,
) -> dict:
    """Payload bytes per step with ``fully_shard`` (``group_shapes[0]``: the root's own
    parameters, then one list of shapes per block).

        G(g)           = sum over the group's parameters of padded_numel(shape, N)
        all_gather     = sum G(g) in forward
                         + G(g) again in backward for every group resharded after forward
        reduce_scatter = sum G(g) (each gradient once)

    ``reshard_after_forward``: one value for every group or a list (root first), read by
    ``reshard_per_group``. For one value other than None, ``root_reshards`` says whether the
    root reshards too (True when the script passes the same value to ``fully_shard(model)``);
    None is FSDP2's default, where the root never does. A group resharded over g < N ranks
    (an int) is all-gathered again in backward within its group of g: the same payload G(g),
    but each rank sends (g-1)/g of it instead of (N-1)/N, over the fastest links when the g
    ranks share a node.
    """
    if world_size == 1:
        return {}
    sizes = [sum(padded_numel(s, world_size) for s in group) for group in group_shapes]
    if isinstance(reshard_after_forward, (list, tuple)) or reshard_after_forward is None:
        per_group = reshard_per_group(reshard_after_forward, len(sizes), world_size)
    else:
        per_group = reshard_per_group(
            [reshard_after_forward if root_reshards else False]
            + [reshard_after_forward] * (len(sizes) - 1),
            len(sizes),
            world_size,
        )
    regathered = sum(size for size, value in zip(sizes, per_group) if value is not False)
    return {
        "all_gather": (sum(sizes) + regathered) * param_bytes,
        "reduce_scatter": sum(sizes) * reduce_bytes,
    }


def held_after_forward_bytes(
    group_shapes: list[list[list[int]]],
    world_size: int,
    reshard_after_forward=None,
    rank: int = 0,
    param_bytes: int = 4,
) -> int:
    """Parameter bytes ``rank`` holds between forward and backward (what the model has
    registered then): per group, its local shard (True), the whole group (False), or its
    local shard over a group of g ranks (an int g: ``local_rows`` with g, at rank % g).
    The rank's own shard stays stored as well; with False or an int this is on top of it."""
    per_group = reshard_per_group(reshard_after_forward, len(group_shapes), world_size)
    held = 0
    for shapes, value in zip(group_shapes, per_group):
        ranks = world_size if value is True else 1 if value is False else value
        held += sum(math.prod(local_shape(s, ranks, rank % ranks)) for s in shapes)
    return held * param_bytes
