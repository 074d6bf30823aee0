# Exercise: shard a transformers model of any family (Qwen2 in the check).
# The checker writes this cell to a file and runs it for real:
#     bash launch/lesson9.sh --family qwen2 --parts train --shard-module FILE
from torch.distributed.fsdp import fully_shard


def shard(model, mesh):
    """Every decoder layer its own FSDP unit, then the root. The block classes come from the
    model itself: ``_no_split_modules`` names them (Qwen2DecoderLayer here), as accelerate's
    auto wrap reads them; nothing here names a family."""
    names = set(model._no_split_modules)
    for module in list(model.modules()):
        if type(module).__name__ in names:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the rest: embeddings, final norm, head
