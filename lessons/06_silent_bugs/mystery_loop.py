"""A training loop moved from DDP to FSDP2. It runs, the loss falls, nothing warns.
It has one silent bug. Find it with lesson 6's tools, then fix it.

`inspect(where, model)` is lesson 6's detector: call it on every rank wherever you want to
look; rank 0 prints which unsharded tensors differ across ranks (a checksum each), the
BatchNorm statistics, and the dtype of every parameter, gradient and buffer.
The check runs your loop under torchrun and compares it with one process on the global batch:
    bash launch/lesson6.sh --parts exercise --exercise THIS_FILE
"""
import random

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from nets import NormNet

LR = 3e-3


def make_model():
    return NormNet("layernorm")


def seed_everything(seed, rank):
    """A different random stream on each rank: each shuffles and augments its own way."""
    random.seed(seed + rank)
    torch.manual_seed(seed + rank)


def train(env, batches, steps, seed, inspect):
    seed_everything(seed, env.rank)
    model = make_model().to(env.device)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batches(step)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model
