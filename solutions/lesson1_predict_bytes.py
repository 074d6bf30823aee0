import math


def predict_model_state_bytes(unit_numels, world_size, strategy, mixed_precision=False):
    """Per-rank bytes of parameters, gradients and Adam state after backward (classic FSDP).

    Every unit's flat parameter is padded to a multiple of the shard count and split evenly;
    NO_SHARD (or a single rank) keeps everything. Mixed precision changes what is gathered and
    sent, not the fp32 sharded state, so it does not appear in the formula.
    """
    shards = 1 if strategy == "NO_SHARD" else world_size
    local = sum(math.ceil(n / shards) for n in unit_numels)
    return {"params": 4 * local, "grads": 4 * local, "optimizer": 2 * 4 * local}
