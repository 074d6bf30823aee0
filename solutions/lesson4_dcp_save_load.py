import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save(path, model, optimizer):
    """Every rank writes only its own shards (and DCP a .metadata index of who holds what)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)  # sharded, keyed by parameter name
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)


def load(path, model, optimizer):
    """Ask for the state dict *this* run's sharding has; DCP reads the slices each rank needs,
    whatever the world size of the save, then set_state_dict puts them into the model."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)  # in place
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
