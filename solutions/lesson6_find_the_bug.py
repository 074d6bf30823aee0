"""A training loop moved from DDP to FSDP2. It runs, the loss falls, nothing warns.
It has one silent bug. Find it with lesson 6's tools, then fix it.

Found: inspect("before fully_shard", model) printed that the weights differ across ranks.
seed_everything(seed + rank) ran BEFORE the model was built, so every rank drew its own
initial weights; fully_shard then kept each rank's own rows: a model no single process has.
(Under DDP this never showed: DDP(model) broadcasts rank 0's weights.)
Fixed: build the model from the same seed on every rank, then seed each rank its own way.
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
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = make_model().to(env.device)
    inspect("before fully_shard", model)  # 0 tensors differ across ranks now
    seed_everything(seed, env.rank)  # per-rank streams only after the model exists
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
