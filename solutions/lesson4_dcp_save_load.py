import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save(path, model, optimizer):
    """DCP writes each key it sees on several ranks once. Model and optimizer are sharded, so
    every rank's part is kept; the RNG state gets a key of its own per rank, so it is too."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rng_key = f"rng_rank{dist.get_rank()}"
    dcp.save(
        {"model": model_sd, "optim": optim_sd, rng_key: torch.get_rng_state()}, checkpoint_id=path
    )


def load(path, model, optimizer):
    """The same structure, sharded as this run is: each rank asks DCP for its own RNG key."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    rng_key = f"rng_rank{dist.get_rank()}"
    state = {"model": model_sd, "optim": optim_sd, rng_key: torch.get_rng_state()}
    dcp.load(state, checkpoint_id=path)  # in place
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    torch.set_rng_state(state[rng_key])
