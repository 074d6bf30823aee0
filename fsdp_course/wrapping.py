"""Wrap policies (lesson 2): which modules a policy makes FSDP units, and what that costs.

A classic-FSDP wrap policy is a callable ``policy(module, recurse, nonwrapped_numel) -> bool``.
FSDP walks the module tree depth first (``torch.distributed.fsdp.wrap._recursive_wrap``):

    for each module, starting at the root's children:
        if policy(module, recurse=True, nonwrapped_numel=all its parameters):
            visit its children first (they may become units and take their parameters)
            if policy(module, recurse=False, nonwrapped_numel=parameters no child took):
                module becomes an FSDP unit (a flat parameter of those parameters)
    the root module is always a unit: it takes every parameter no other unit took

``policy_units`` replays that walk without any process group, so a notebook or a test can see
what a policy *would* wrap. The second half is the theory of the all-gather peak per policy.

The module also holds the lesson 2 exercise model, ``StagedLM``: a language model "you did not
write", whose repeating layer class is not the course's ``Block`` and whose vocabulary is large
enough that the embedding and the output head each outweigh a layer.
"""

from __future__ import annotations


import torch
import torch.nn as nn

from fsdp_course.model import MLP, CausalSelfAttention, ModelConfig

# --- which modules a policy wraps ------------------------------------------------------------


def policy_units(model: nn.Module, policy) -> list[tuple[str, nn.Module, int]]:
    """The FSDP units ``policy`` would make of ``model`` (unwrapped), as ``(name, module,
    numel)``: the root first (name ``""``; numel = what no other unit took, possibly 0), then
    the wrapped modules in the order FSDP's walk finishes them (children before parents).

    ``policy=None`` is "no auto-wrap": the root alone. Mirrors ``_recursive_wrap`` (module doc).
    """
    units: list[tuple[str, nn.Module, int]] = []

    def visit(name: str, module: nn.Module, only_children: bool = False) -> int:
        total = sum(p.numel() for p in module.parameters())
        if not policy(module=module, recurse=True, nonwrapped_numel=total):
            return 0
        taken = sum(visit(f"{name}.{child_name}" if name else child_name, child)
                    for child_name, child in module.named_children())
        if not only_children and policy(module=module, recurse=False,
                                        nonwrapped_numel=total - taken):
            units.append((name, module, total - taken))
            return total
        return taken

    taken = visit("", model, only_children=True) if policy is not None else 0
    root_numel = sum(p.numel() for p in model.parameters()) - taken
    return [("", model, root_numel), *units]


def is_nested(units: list[tuple[str, nn.Module, int]]) -> bool:
    """True when some non-root unit lies inside another non-root unit (units that hold no
    parameters of their own do not count: FSDP gives them no flat parameter)."""
    names = [name for name, _, numel in units[1:] if numel > 0]
    return any(a != b and a.startswith(b + ".") for a in names for b in names)


def forward_order(model: nn.Module, units: list[tuple[str, nn.Module, int]]) -> list[int]:
    """Numels of the units, root first, the others in the order the forward pass runs them,
    found by running the model once on a tiny input with forward hooks."""
    order: list[str] = []
    hooks = [module.register_forward_pre_hook(lambda m, args, name=name: order.append(name))
             for name, module, _ in units[1:]]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 2, dtype=torch.long))
    finally:
        for hook in hooks:
            hook.remove()
    numel = {name: n for name, _, n in units}
    return [units[0][2], *(numel[name] for name in order)]


# --- the theory of the all-gather peak -------------------------------------------------------


# --- the exercise model ---------------------------------------------------------------------


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
