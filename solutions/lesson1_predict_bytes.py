import math


def predict_model_state_bytes(
    unit_param_numels,
    world_size,
    strategy,
    replicas=1,
    mixed_precision=False,
    use_orig_params=False,
):
    """Rank 0's bytes of parameters, gradients and Adam state with classic FSDP.

    Each unit's flat parameter is split over the shard group: all ranks, one (NO_SHARD, or a
    single rank), or the ranks of one replica (HYBRID_SHARD). A rank stores ceil(n / S) elements
    of every unit, padding included; gradients match; Adam keeps two fp32 values per element the
    optimizer sees. Mixed precision changes what is gathered and sent, not this fp32 state.

    use_orig_params=True: every parameter starts on a 16-byte boundary of the compute dtype
    (4 fp32 or 8 bf16 elements), the whole is padded to a multiple of the process group's size,
    and the optimizer sees the original parameters' shards: Adam keeps state only for the real
    elements in rank 0's slice.
    """
    if world_size == 1 or strategy == "NO_SHARD":
        shards = 1
    elif strategy == "HYBRID_SHARD":
        shards = world_size // replicas
    else:
        shards = world_size
    align = 16 // (2 if mixed_precision else 4)
    stored = held = 0
    for numels in unit_param_numels:
        if not use_orig_params:
            per_rank = math.ceil(sum(numels) / shards)
            stored += per_rank
            held += per_rank
            continue
        offset, starts = 0, []
        for numel in numels:
            offset += -offset % align  # pad up to the next aligned start
            starts.append(offset)
            offset += numel
        group = world_size if shards == 1 else shards
        per_rank = math.ceil(offset / group) * group // shards
        stored += per_rank
        held += sum(
            max(0, min(per_rank, start + numel) - start) for start, numel in zip(starts, numels)
        )
    return {"params": 4 * stored, "grads": 4 * stored, "optimizer": 2 * 4 * held}
