# Exercise: move lesson 1's classic FSDP setup to FSDP2.
# Lesson 1 did:  FSDP(model, auto_wrap_policy=transformer_auto_wrap_policy({Block}),
#                     sharding_strategy=FULL_SHARD, device_id=env.device)
# FSDP2 has no wrap policy: call fully_shard yourself, on each Block, then on the root.
# The checker writes this cell to a file and runs it for real:
#     bash launch/lesson5.sh --shard-module FILE
from torch.distributed.fsdp import fully_shard


def shard(model, mesh):
    """Shard ``model`` (a GPT, still on the meta device) over ``mesh`` like lesson 1 did."""
    for block in model.blocks:                        # auto_wrap_policy -> one call per block
        fully_shard(block, mesh=mesh, reshard_after_forward=True)   # FULL_SHARD
    fully_shard(model, mesh=mesh, reshard_after_forward=True)       # the root: embeddings, head
