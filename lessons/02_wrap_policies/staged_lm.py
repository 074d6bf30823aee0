"""Lesson 2's exercise model, ``StagedLM``: a language model "you did not write".

Its repeating layer class is ``DecoderLayer``, not the course's ``Block``, its layers sit three
containers deep (``body.stages[s].layers[l]``), and its vocabulary is large enough that the
embedding and the output head each outweigh a layer. ``train.py --model staged`` trains it;
the exercise writes a wrap policy for it.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from fsdp_course.model import MLP, CausalSelfAttention, ModelConfig


class DecoderLayer(nn.Module):
    """One layer of ``StagedLM``: pre-norm attention and MLP (the same maths as ``Block``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Stage(nn.Module):
    """A group of layers (models organised in stages, e.g. for pipelining, look like this)."""

    def __init__(self, cfg: ModelConfig, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class Body(nn.Module):
    def __init__(self, cfg: ModelConfig, num_stages: int):
        super().__init__()
        self.stages = nn.ModuleList(Stage(cfg, cfg.n_layers // num_stages)
                                    for _ in range(num_stages))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages:
            x = stage(x)
        return x


class StagedLM(nn.Module):
    """The exercise model: ``embed`` (a large vocabulary), ``body.stages[s].layers[l]``
    (``DecoderLayer``), ``norm``, ``head``. Defaults: 2048 tokens, d_model 128, 2 stages of 2
    layers: the embedding and the head each hold more parameters than one layer."""

    def __init__(self, cfg: ModelConfig, num_stages: int = 2):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.seq_len, cfg.d_model))
        self.body = Body(cfg, num_stages)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)
                    if getattr(module, "bias", None) is not None:
                        nn.init.zeros_(module.bias)
            nn.init.normal_(self.pos, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        return self.head(self.norm(self.body(x)))


STAGED_VOCAB = 2048


def staged_lm(seq_len: int = 64, d_model: int = 128, n_layers: int = 4, n_heads: int = 4,
              vocab_size: int = STAGED_VOCAB) -> StagedLM:
    """The exercise model with the lesson's default sizes (its vocabulary does not depend on
    the data: the data's token ids are all below it)."""
    return StagedLM(ModelConfig(vocab_size, seq_len, d_model, n_layers, n_heads))
