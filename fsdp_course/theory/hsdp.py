"""Meshes beyond one dimension (lesson 8): HSDP across nodes (which collective runs over which
link, and how many bytes), and a data x tensor mesh (what tensor parallelism adds).

A job of ``R`` nodes with ``S`` ranks each lays its device mesh out as ``(R, S)``, names
``("replicate", "shard")``. torchrun numbers ranks node by node (rank = node * S + local_rank),
so a row of the mesh is one node: the ``shard`` groups never leave a node, the ``replicate``
groups join the same local rank of every node. ``fully_shard(mesh=...)`` on that mesh is HSDP:
parameters ``(Replicate(), Shard(0))``.
"""

from __future__ import annotations

from fsdp_course.theory.fsdp2 import collective_bytes_theory, padded_numel


def node_of_rank(rank: int, ranks_per_node: int) -> int:
    """The node (torchrun's group rank) that holds ``rank``: ``rank // ranks_per_node``."""
    return rank // ranks_per_node


def hsdp_collective_bytes(
    group_shapes: list[list[list[int]]],
    replicas: int,
    shards: int,
    reshard_after_forward: bool = True,
    root_reshards: bool = False,
    param_bytes: int = 4,
    reduce_bytes: int = 4,
) -> dict:
    """Payload bytes per step of HSDP on an ``(replicas, shards)`` mesh, split by link.

    ``group_shapes``: the root's own parameter shapes first, then one list per block (as
    ``theory.fsdp2.collective_bytes_theory`` takes them).

        intra-node (the shard group of S ranks): exactly FSDP2 on S ranks
            all_gather, reduce_scatter = collective_bytes_theory(group_shapes, S)
        inter-node (the replicate group of R ranks): after the reduce-scatter each rank holds
            its gradient shard, padded: G_S(g) / S elements per group, all-reduced across the
            R replicas (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce)
            all_reduce = sum_g G_S(g) / S * reduce_bytes    with G_S(g) = sum padded_numel(shape, S)

    So the slow links carry about P / S (times 2(R-1)/R per rank with a ring all-reduce),
    while the all-gathers (about 2 P) and the reduce-scatter (P) stay on the fast ones.
    """
    intra = (
        collective_bytes_theory(
            group_shapes, shards, reshard_after_forward, root_reshards, param_bytes, reduce_bytes
        )
        if shards > 1
        else {}
    )
    inter = {}
    if replicas > 1:
        shard_elems = sum(
            padded_numel(s, shards) // shards for group in group_shapes for s in group
        )
        inter = {"all_reduce": shard_elems * reduce_bytes}
    return {"intra": intra, "inter": inter}


def flat_collective_bytes(
    group_shapes: list[list[list[int]]],
    nodes: int,
    ranks_per_node: int,
    reshard_after_forward: bool = True,
    root_reshards: bool = False,
    param_bytes: int = 4,
    reduce_bytes: int = 4,
) -> dict:
    """The same model with plain ``fully_shard`` over all ``nodes * ranks_per_node`` ranks (a
    1-D mesh): every group spans every node, so with ``nodes > 1`` every collective crosses the
    slow links: about 2 P all-gathered + P reduce-scattered. Not every byte travels between
    nodes (a ring over ranks numbered node by node has ``nodes`` of its ``world`` edges between
    nodes), but every rank's share passes each edge in lockstep, so the slowest edge paces
    the whole collective; the payload is counted under ``"inter"`` in that sense.
    """
    world = nodes * ranks_per_node
    payload = collective_bytes_theory(
        group_shapes, world, reshard_after_forward, root_reshards, param_bytes, reduce_bytes
    )
    return {"intra": {}, "inter": payload} if nodes > 1 else {"intra": payload, "inter": {}}


def tp_mlp_all_reduce_bytes(
    rows: int, seq_len: int, d_model: int, n_layers: int, act_bytes: int = 4
) -> int:
    """Payload all-reduced per step by Megatron-style tensor parallelism of each block's MLP
    (``fc`` column-wise, ``proj`` row-wise), for ``rows`` sequences on one tensor-parallel group.

        forward:  proj's partial sums are all-reduced: one [rows, seq, d_model] tensor per block
        backward: fc's input gradient (each rank holds a slice of the hidden units) is
                  all-reduced: one more [rows, seq, d_model] tensor per block
        total = 2 * n_layers * rows * seq_len * d_model * act_bytes

    These are activations, so they grow with the batch, not with the model: tensor parallelism
    talks in every layer and belongs on the fastest links (within a node).
    """
    return 2 * n_layers * rows * seq_len * d_model * act_bytes
