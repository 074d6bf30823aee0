# The job hung: rank 0's evaluate ran a forward (FSDP all-gathers the parameters of every unit)
# that no other rank joined; the others went on training, and their collectives no longer met
# rank 0's (py-spy: rank 0 in an all-gather inside evaluate, the others further on;
# TORCH_DISTRIBUTED_DEBUG=DETAIL names the mismatch). Rule: every rank calls every collective.
import torch

from fsdp_course.dist import mean_over_ranks
from fsdp_course.model import lm_loss


def evaluate(model, batch, env):
    """The loss on the whole held-out batch (every rank's rows), on every rank."""
    x, y = batch
    with torch.no_grad():
        loss = lm_loss(model(x), y)  # every rank: FSDP's forward all-gathers
    return mean_over_ranks(loss)  # every rank: the mean over all ranks' equal-sized rows
