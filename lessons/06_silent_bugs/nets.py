"""Lesson 6's two small models and their generated data (the GPT of part A is the course's).

- ``NormNet``: an MLP with a normalisation layer after each hidden layer (BatchNorm by default),
  trained on generated "blobs" whose features have very different means and scales, so that
  normalising with the wrong statistics visibly changes the model (part B, and the exercise).
- ``RotaryRegressor``: predicts a signal from a position. Its features are cos/sin of
  ``position * inv_freq``, computed in ``forward`` from a float buffer, as rotary position
  embeddings are: a buffer whose dtype matters, and a tensor created inside ``forward`` that
  meets the parameters (part C).

Batches are functions of (seed, step) only, like ``fsdp_course.data``: rank r takes rows
r*B:(r+1)*B of the step's global batch, so a single process that asks for world_size*B rows
sees exactly the union of what the ranks saw.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

NORMS = ("batchnorm", "layernorm", "groupnorm")
MAX_POSITION = 4096  # positions 0 .. 4095: far past 256, the last integer bf16 holds exactly


def make_norm(kind: str, width: int) -> nn.Module:
    if kind == "batchnorm":
        return nn.BatchNorm1d(width)
    if kind == "layernorm":
        return nn.LayerNorm(width)
    if kind == "groupnorm":
        return nn.GroupNorm(8, width)  # per sample, over groups of 16 features: no batch stats
    raise ValueError(f"unknown norm {kind!r}: choose from {', '.join(NORMS)}")


class NormNet(nn.Module):
    """in -> [Linear -> norm -> ReLU] x 2 -> Linear -> classes (about 22k parameters).

    The Linear layers before a norm have no bias: the norm's own shift replaces it. (A bias
    before BatchNorm gets a zero gradient, up to rounding, and Adam turns rounding noise into
    full-size steps: the running means would then drift apart for no reason of this lesson's.)
    """

    def __init__(self, norm: str = "batchnorm", in_dim: int = 32, width: int = 128,
                 classes: int = 10):
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(d, width, bias=False), make_norm(norm, width), nn.ReLU())
            for d in (in_dim, width))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def blobs(step: int, rank: int, world_size: int, batch_size: int, seed: int = 0,
          in_dim: int = 32, classes: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the step's global batch: features with per-feature offsets and
    scales (what BatchNorm is for), labels from a fixed random linear teacher."""
    teacher = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, in_dim, generator=teacher) * 2
    offset = torch.randn(in_dim, generator=teacher) * 3
    scale = torch.rand(in_dim, generator=teacher) * 4 + 0.5
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + 7)
    y = torch.randint(classes, (world_size * batch_size,), generator=g)
    x = (centers[y] + torch.randn(world_size * batch_size, in_dim, generator=g)) * scale + offset
    rows = slice(rank * batch_size, (rank + 1) * batch_size)
    return x[rows], y[rows]


class RotaryRegressor(nn.Module):
    """position -> [cos, sin](position * inv_freq) -> MLP -> one number (about 44k parameters).

    ``cast_features=False`` reproduces the dtype-mismatch bug: the features are made in
    ``forward`` in the buffer's dtype (fp32) and meet low-precision weights.
    """

    def __init__(self, num_freqs: int = 16, width: int = 192, cast_features: bool = True):
        super().__init__()
        self.cast_features = cast_features
        # Rotary-style frequencies 1 ... 1/1000: a buffer, not a parameter (not trained, not
        # sharded by FSDP), and its precision decides the angles at large positions.
        self.register_buffer("inv_freq", 1000.0 ** (-torch.arange(num_freqs) / num_freqs))
        self.inv_freq_fp64 = self.inv_freq.double()  # not a buffer: FSDP never touches it
        self.mlp = nn.Sequential(nn.Linear(2 * num_freqs, width), nn.GELU(),
                                 nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))

    def features(self, positions: torch.Tensor) -> torch.Tensor:
        angles = positions[:, None] * self.inv_freq  # int64 x buffer: the buffer's dtype
        return torch.cat([angles.cos(), angles.sin()], dim=-1)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        features = self.features(positions)
        if self.cast_features:
            # Cast at the boundary: a tensor made in forward has its own dtype, not the
            # parameters' (under mixed precision the weights are bf16 here).
            features = features.to(self.mlp[0].weight.dtype)
        return self.mlp(features).squeeze(-1)


def signal(positions: torch.Tensor) -> torch.Tensor:
    """The target: a fixed mix of slow and fast waves of the position."""
    p = positions.double()
    return (torch.sin(p / 40) + 0.5 * torch.cos(p / 7 + 1) + 0.25 * torch.sin(p / 300)).float()


def positions_batch(step: int, rank: int, world_size: int, batch_size: int, seed: int = 0,
                    max_position: int = MAX_POSITION) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's positions (int64, up to ``max_position``) and targets for the step."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step + 11)
    positions = torch.randint(max_position, (world_size * batch_size,), generator=g)
    mine = positions[rank * batch_size:(rank + 1) * batch_size]
    return mine, signal(mine)


def mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(prediction.float(), target)

