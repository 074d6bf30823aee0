"""Sharding strategies (lessons 0 and 1): per-rank bytes and bytes per collective.

Sizes are in bytes; ``P`` is the parameter count. Classic FSDP flattens each wrapped unit's
parameters into one flat parameter of ``n`` elements, pads it to a multiple of the shard count
``S`` (``padded(n, S) = S * ceil(n / S)``) and gives each rank ``ceil(n / S)`` elements.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the formulas run without torch
    import torch.nn as nn

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
ADAM_STATE_SLOTS = 2  # exp_avg and exp_avg_sq, each the size of the parameter (fp32)


def fsdp_unit_numels(model: nn.Module, block_cls: type) -> list[int]:
    """Numels of the units transformer auto-wrap makes: the root (all parameters outside the
    blocks) first, then one per ``block_cls`` instance. Call on the unwrapped model."""
    blocks = [
        sum(p.numel() for p in m.parameters()) for m in model.modules() if isinstance(m, block_cls)
    ]
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


def model_state_bytes(
    unit_numels: list[int],
    world_size: int,
    strategy: str,
    replicas: int = 1,
    param_bytes: int = 4,
    optim_slots: int = ADAM_STATE_SLOTS,
) -> dict:
    """Per-rank bytes of parameters, gradients and optimizer state after backward.

        S      = shard_group_size(strategy, world_size, replicas)
        local  = sum over units of ceil(n_u / S)
        params = local * param_bytes;  grads = local * param_bytes
        optimizer = optim_slots * local * param_bytes        (Adam: 2 fp32 slots)

    FULL_SHARD and SHARD_GRAD_OP both shard all three (ZeRO-3 and ZeRO-2 differ in what they
    keep *during* forward/backward, not in the sharded state): about 16 P / N with Adam.
    NO_SHARD (and DDP) keep all three in full on every rank: 16 P (DDP's gradient buckets, 4 P
    more unless ``gradient_as_bucket_view=True``, are not model state). Mixed precision does not
    change these: the sharded master copy, its gradient and Adam's state stay fp32.
    """
    shards = 1 if world_size == 1 else shard_group_size(strategy, world_size, replicas)
    local = sum(shard_numel(n, shards) for n in unit_numels)
    return {
        "params": local * param_bytes,
        "grads": local * param_bytes,
        "optimizer": optim_slots * local * param_bytes,
    }


def ddp_state_bytes(
    num_params: int, param_bytes: int = 4, optim_slots: int = ADAM_STATE_SLOTS
) -> dict:
    """DDP: a full replica on every rank, whatever the world size: 4P + 4P + 8P = 16 P bytes of
    model state. Its all-reduce buckets come on top (4 P, a copy of every gradient, kept between
    steps), unless ``DDP(gradient_as_bucket_view=True)`` makes the gradients views into them."""
    return {
        "params": num_params * param_bytes,
        "grads": num_params * param_bytes,
        "optimizer": optim_slots * num_params * param_bytes,
    }


def collective_bytes(
    unit_numels: list[int],
    world_size: int,
    strategy: str,
    replicas: int = 1,
    param_bytes: int = 4,
    reduce_bytes: int = 4,
) -> dict:
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

    One rank: classic FSDP runs every strategy as NO_SHARD (torch/distributed/fsdp/
    _init_utils.py: "FSDP is switching to use `NO_SHARD` ... since the world size is 1"), so
    nothing is gathered and each gradient is all-reduced over the one rank -> P.
    """
    if world_size == 1:
        strategy = "NO_SHARD"
    shards = shard_group_size(strategy, world_size, replicas)
    padded_numels = [padded(n, shards) for n in unit_numels]
    if strategy == "NO_SHARD":
        return {"all_reduce": sum(unit_numels) * reduce_bytes}
    if strategy == "SHARD_GRAD_OP":
        gathered = sum(padded_numels)
    else:  # the root is not gathered again in backward
        gathered = sum(padded_numels) + sum(padded_numels[1:])
    result = {
        "all_gather": gathered * param_bytes,
        "reduce_scatter": sum(padded_numels) * reduce_bytes,
    }
    if strategy == "HYBRID_SHARD" and replicas > 1:
        result["all_reduce"] = sum(shard_numel(n, shards) for n in unit_numels) * reduce_bytes
    return result


def gathered_peak_bytes(
    unit_numels: list[int], world_size: int, strategy: str, replicas: int = 1, param_bytes: int = 4
) -> int:
    """Peak bytes of unsharded parameters held at once (beyond the sharded state).

        FULL_SHARD:    root + 2 * largest block: the root stays gathered for the whole step,
                       and backward prefetches the next block while the current one computes
        SHARD_GRAD_OP: every unit, padded: all stay gathered from forward until backward
        NO_SHARD:      0 (parameters are never sharded, so nothing is gathered)

    HYBRID_SHARD counts as FULL_SHARD over one replica's ranks; one rank gathers nothing.
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


# --- where each element lives: the layout of one flat parameter ------------------------------


def shard_ranges(numel: int, shards: int) -> list[dict]:
    """Which elements of a flat parameter of ``numel`` elements each rank stores.

    FSDP splits with ``torch.chunk`` and pads every chunk to the first one's size
    (``FlatParamHandle._get_shard``), so every rank stores ``c = ceil(numel / shards)`` elements:

        rank r holds elements [r*c, min((r+1)*c, numel))   and   c - (that many) padding zeros

    All shards are equal; padding is needed only when ``shards`` does not divide ``numel``, and
    then it sits at the end: on the last rank, or on the last few when ``c`` is large compared
    with ``numel`` (10 elements on 4 ranks: 3, 3, 3, 1 real + 2 padding).
    """
    chunk = shard_numel(numel, shards)
    ranges = []
    for rank in range(shards):
        start, stop = min(rank * chunk, numel), min((rank + 1) * chunk, numel)
        ranges.append(
            {"rank": rank, "start": start, "stop": stop, "padding": chunk - (stop - start)}
        )
    return ranges


def shard_diagram(numel: int, shards: int) -> str:
    """A text drawing of ``shard_ranges``: one line per rank, ``p<i>`` a real element, ``·``
    padding."""
    ranges = shard_ranges(numel, shards)
    width = len(f"p{numel - 1}")
    lines = [
        f"flat parameter of {numel} elements on {shards} ranks: padded to "
        f"{padded(numel, shards)}, {shard_numel(numel, shards)} per rank"
    ]
    for r in ranges:
        cells = [f"p{i}".ljust(width) for i in range(r["start"], r["stop"])] + [
            "·".ljust(width)
        ] * r["padding"]
        note = f"   {r['padding']} padding" if r["padding"] else ""
        lines.append(f"rank {r['rank']}  [ {' '.join(cells)} ]{note}")
    return "\n".join(lines)


def fsdp_unit_param_numels(model: nn.Module, block_cls: type) -> list[list[int]]:
    """For each unit transformer auto-wrap makes (the root first, then one per ``block_cls``),
    the sizes of its parameters in the order FSDP flattens them: ``named_modules()`` order, each
    module's own parameters (``recurse=False``), parameters of wrapped blocks left to their
    unit, a shared parameter once. Call on the unwrapped model. The sums are
    ``fsdp_unit_numels``."""
    blocks = [m for m in model.modules() if isinstance(m, block_cls)]
    in_blocks = {id(p) for b in blocks for p in b.parameters()}

    def own(root: nn.Module, skip: set) -> list[int]:
        seen, numels = set(skip), []
        for module in root.modules():
            for p in module.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    numels.append(p.numel())
        return numels

    return [own(model, in_blocks), *[own(b, set()) for b in blocks]]


ALIGNMENT_BYTES = 16  # use_orig_params: FSDP starts every parameter on a 16-byte boundary


def alignment_numel(compute_bytes: int) -> int:
    """Elements per 16 bytes in the dtype forward/backward compute in (``_get_aligned_numel``
    in ``torch/distributed/fsdp/_flat_param.py``): 4 for fp32, 8 for bf16 mixed precision."""
    return ALIGNMENT_BYTES // compute_bytes


def flat_param_layout(param_numels: list[int], align: int = 0) -> tuple[list[tuple[int, int]], int]:
    """Where each parameter starts in a unit's flat parameter, and the flat length before the
    padding to a multiple of the shard count.

    ``use_orig_params=False`` (``align=0``): the parameters are laid end to end.
    ``use_orig_params=True``: before each parameter whose offset is not a multiple of ``align``
    elements, FSDP inserts padding up to the next multiple (``_init_flat_param_and_metadata``):

        offset = 0
        for each parameter n:  offset = align * ceil(offset / align);  place n;  offset += n

    Returns ([(start, numel) per parameter], flat length).
    """
    offset, spans = 0, []
    for numel in param_numels:
        if align and offset % align:
            offset += align - offset % align
        spans.append((offset, numel))
        offset += numel
    return spans, offset


def unit_storage_numel(
    param_numels: list[int],
    shards: int,
    world_size: int,
    use_orig_params: bool = False,
    align: int = 4,
) -> int:
    """Elements one rank stores of one unit's flat parameter (its gradient has the same size).

        use_orig_params=False:  ceil(n / S)                          n = sum of the parameters
        use_orig_params=True:   L = flat length with alignment padding (flat_param_layout),
                                padded to a multiple of the process group's size W
                                (S when sharded, N for NO_SHARD), then L_W / S on each rank

    ``shards`` is S, ``world_size`` N; ``align`` is counted in elements.
    """
    if not use_orig_params:
        return shard_numel(sum(param_numels), shards)
    _, length = flat_param_layout(param_numels, align)
    group = world_size if shards == 1 else shards
    return padded(length, group) // shards


def unit_flat_numels(
    unit_param_numels: list[list[int]],
    world_size: int,
    strategy: str,
    replicas: int = 1,
    use_orig_params: bool = False,
    compute_bytes: int = 4,
) -> list[int]:
    """Each unit's flat-parameter length as FSDP builds it, for ``collective_bytes`` and
    ``gathered_peak_bytes`` (which pad it to the shard count themselves):

        use_orig_params=False:  the sum of the unit's parameters
        use_orig_params=True:   S * unit_storage_numel (alignment padding and the padding to a
                                multiple of the group included: what is gathered and reduced)
    """
    if not use_orig_params:
        return [sum(u) for u in unit_param_numels]
    shards = 1 if world_size == 1 else shard_group_size(strategy, world_size, replicas)
    align = alignment_numel(compute_bytes)
    return [
        shards * unit_storage_numel(u, shards, world_size, True, align) for u in unit_param_numels
    ]


def unit_real_numel(
    param_numels: list[int],
    shards: int,
    rank: int,
    world_size: int,
    use_orig_params: bool = False,
    align: int = 4,
) -> int:
    """Elements of real parameters (no padding of any kind) in ``rank``'s shard of one unit:
    with ``use_orig_params=True`` the optimizer sees the original parameters' shards, so this is
    what Adam keeps state for."""
    spans, _ = flat_param_layout(param_numels, align if use_orig_params else 0)
    if shards == 1:
        return sum(param_numels)
    size = unit_storage_numel(param_numels, shards, world_size, use_orig_params, align)
    lo, hi = rank * size, (rank + 1) * size
    return sum(max(0, min(hi, start + n) - max(lo, start)) for start, n in spans)


def rank_state_bytes(
    unit_param_numels: list[list[int]],
    world_size: int,
    strategy: str,
    replicas: int = 1,
    rank: int = 0,
    use_orig_params: bool = False,
    compute_bytes: int = 4,
    param_bytes: int = 4,
    optim_slots: int = ADAM_STATE_SLOTS,
) -> dict:
    """``rank``'s bytes of parameters, gradients and Adam state: ``model_state_bytes`` for
    every ``use_orig_params`` setting (``rank`` counts within the shard group).

        S = shard_group_size(strategy, N, replicas)
        params = grads = param_bytes * sum over units of unit_storage_numel(unit)
        optimizer: use_orig_params=False  optim_slots * params   (Adam's state is shaped like the
                                                                   flat shard, padding included)
                   use_orig_params=True   optim_slots * param_bytes * sum of unit_real_numel
                                          (the optimizer holds the original parameters' shards:
                                           no padding, and not the same on every rank)

    Alignment counts elements of the compute dtype (``compute_bytes``: 2 with bf16 mixed
    precision, see ``alignment_numel``); the stored shard itself stays fp32.
    """
    shards = 1 if world_size == 1 else shard_group_size(strategy, world_size, replicas)
    align = alignment_numel(compute_bytes)
    stored = sum(
        unit_storage_numel(u, shards, world_size, use_orig_params, align) for u in unit_param_numels
    )
    if use_orig_params:
        held = sum(
            unit_real_numel(u, shards, rank % shards, world_size, True, align)
            for u in unit_param_numels
        )
    else:
        held = stored
    return {
        "params": stored * param_bytes,
        "grads": stored * param_bytes,
        "optimizer": optim_slots * held * param_bytes,
    }


# --- reduce-scatter averages --------------------------------------------------------------------


def gradient_divide_factors(data_parallel_size: int) -> tuple[float, float]:
    """How classic FSDP turns the reduce-scatter's *sum* into an *average* over the ``D`` ranks
    that each computed a gradient on their part of the global batch (all N ranks; with
    HYBRID_SHARD, shard group size x replicas, which is N again).
    ``_init_utils._init_process_group_state`` sets:

        pre  = start at f = 1 and double f while D % f == 0 and D / f > f
               (``DefaultState._get_gradient_predivide_factor``): 2, 2, 2, 4 for D = 2, 3, 4, 8
        post = D / pre

    Each rank divides its gradient by ``pre`` before the reduce-scatter (or all-reduce) and the
    reduced shard by ``post`` after it (``_runtime_utils._reduce_grad``; a factor of 1 is skipped):
    sum(g_r / pre) / post = sum(g_r) / D, the mean. The division is split so that low-precision
    gradients neither overflow in the sum (part of it comes before) nor underflow (not all of it
    comes before).
    """
    factor = 1
    while data_parallel_size % factor == 0 and data_parallel_size / factor > factor:
        factor *= 2
    return float(factor), data_parallel_size / factor
