"""Hugging Face decoder models, read from their ``config.json`` (``python -m fsdp_course.plan
--hf-config``, lesson 9): every parameter's shape, hence the exact count, and what a training
step saves for backward, so the memory planner (``memory.plan``) plans them as it plans the
course's GPT.

The layouts follow the modeling code of ``transformers`` 5.23 (``models/<family>/modeling_*.py``):

    llama, mistral, qwen2   embed_tokens (V, h); per decoder layer: q_proj (a d, h), k_proj and
                            v_proj (k d, h), o_proj (h, a d), gate_proj and up_proj (I, h),
                            down_proj (h, I), two RMSNorm weights (h); the final norm (h);
                            lm_head (V, h) unless tied to the embedding. ``a`` heads, ``k``
                            key/value heads (grouped-query attention when k < a), head dim ``d``
                            (``head_dim``, else h / a). Biases: llama's ``attention_bias`` (q, k,
                            v, o) and ``mlp_bias``; qwen2 always on q, k, v (not o); mistral none.
    gpt2                    wte (V, h), wpe (n_positions, h): learned positions; per block:
                            ln_1 and ln_2 (weight and bias, h each), c_attn (h, 3h) + 3h,
                            c_proj (h, h) + h, c_fc (h, I) + I, c_proj (I, h) + h (``Conv1D``
                            stores its weight as in x out); ln_f; lm_head tied by default.

A field the config leaves out takes the default of the family's config class (``tie_word_
embeddings``, ``num_key_value_heads``: llama the number of heads, mistral 8, qwen2 32;
``n_inner``: 4h); the sizes themselves must be there. Only ``json`` is needed: the planner
starts without torch or transformers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FAMILIES = ("llama", "mistral", "qwen2", "gpt2")
ROTARY = ("llama", "mistral", "qwen2")
# gpt2's names for the common sizes (its config's attribute_map): either spelling is read.
ALIASES = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
    "n_positions": "max_position_embeddings",
}
KV_HEADS_DEFAULT = {"llama": None, "mistral": 8, "qwen2": 32}  # None: as many as the heads
# I-wide tensors the MLP's activation function saves for backward (counted in tests/test_plan.py):
# torch's SiLU and GELU keep their input; gpt2's "gelu_new" is written out in Python and keeps
# four intermediate tensors.
ACTIVATION_SAVES = {"silu": 1, "gelu": 1, "gelu_pytorch_tanh": 1, "gelu_new": 4}


class ConfigError(ValueError):
    """A config the planner cannot read: one sentence naming the field."""


@dataclass(frozen=True)
class DecoderShape:
    """One decoder-only model from ``transformers``, as ``memory.plan`` needs it."""

    family: str
    vocab: int
    seq: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    positions: int = 0  # learned position embeddings (gpt2); 0: rotary
    activation: str = "silu"

    # --- parameters -------------------------------------------------------------------
    def _linear(self, out: int, inp: int, bias: bool) -> list[tuple[int, ...]]:
        return [(out, inp), (out,)] if bias else [(out, inp)]

    def block_shapes(self) -> list[tuple[int, ...]]:
        """One decoder layer's parameters, in ``parameters()`` order."""
        h, i = self.hidden, self.intermediate
        if self.family == "gpt2":
            return [
                (h,),
                (h,),
                (h, 3 * h),
                (3 * h,),
                (h, h),
                (h,),
                (h,),
                (h,),
                (h, i),
                (i,),
                (i, h),
                (h,),
            ]
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return (
            self._linear(q, h, self.qkv_bias)
            + self._linear(kv, h, self.qkv_bias)
            + self._linear(kv, h, self.qkv_bias)
            + self._linear(h, q, self.o_bias)
            + self._linear(i, h, self.mlp_bias)
            + self._linear(i, h, self.mlp_bias)
            + self._linear(h, i, self.mlp_bias)
            + [(h,), (h,)]
        )

    def _root_parts(self) -> tuple[list, list]:
        """Parameters outside the layers: those before them (embeddings), those after (the
        final norm, the head unless tied: a tied head is the embedding, counted once)."""
        v, h = self.vocab, self.hidden
        if self.family == "gpt2":
            before, norm = [(v, h), (self.positions, h)], [(h,), (h,)]
        else:
            before, norm = [(v, h)], [(h,)]
        return before, norm + ([] if self.tied else [(v, h)])

    def root_shapes(self) -> list[tuple[int, ...]]:
        before, after = self._root_parts()
        return before + after

    def parameter_shapes(self) -> list[tuple[int, ...]]:
        before, after = self._root_parts()
        return before + self.block_shapes() * self.layers + after

    def unit_shapes(self) -> list[list[tuple[int, ...]]]:
        """``fully_shard`` on each decoder layer, then on the root (what lesson 9 does)."""
        return [self.root_shapes()] + [self.block_shapes()] * self.layers

    def unit_numels(self) -> list[int]:
        return [sum(math.prod(s) for s in unit) for unit in self.unit_shapes()]

    def state_shapes(self) -> list[list[int]]:
        return [list(s) for unit in self.unit_shapes() for s in unit]

    @property
    def num_params(self) -> int:
        return sum(self.unit_numels())

    def buffer_bytes(self) -> int:
        """The rotary embedding's ``inv_freq`` and ``original_inv_freq`` (d/2 fp32 each)."""
        return 2 * 4 * (self.head_dim // 2) if self.family in ROTARY else 0

    # --- activations (what autograd saves; tests/test_plan.py counts them) ----------------
    def _norm_bytes(self, batch: int, e: int) -> int:
        """A norm and the Linear after it. RMSNorm (upcast to fp32 inside): its fp32 input
        (the input itself in fp32), the normalized tensor and the output in the compute dtype,
        and 1/rms (fp32). LayerNorm: input and output, mean and 1/std (compute dtype)."""
        bs = batch * self.seq
        if self.family == "gpt2":
            return bs * self.hidden * 2 * e + 2 * bs * e
        return bs * self.hidden * (4 + 2 * e) + 4 * bs

    def _attention_bytes(self, batch: int, e: int) -> int:
        """``scaled_dot_product_attention`` without a mask (causal, no dropout: the flash
        kernel) keeps q, k, v, its output (the o-projection's input) and the fp32 log-sum-exp:
        no s x s matrix. Rotary: q and k after the rotation; with grouped-query attention k and
        v at k heads (``enable_gqa``). gpt2: q, k, v are views of the fused qkv output (kept
        whole, 3 b s h e); the kernel keeps two of them as contiguous copies (2 b s h e)."""
        bs = batch * self.seq
        lse = 4 * batch * self.heads * self.seq
        if self.family == "gpt2":
            return 6 * bs * self.hidden * e + lse
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * bs * q * e + 2 * bs * kv * e + lse

    def _mlp_bytes(self, batch: int, e: int) -> int:
        """Gated (rotary families): the gate output (SiLU's input), SiLU's output, the up
        output, their product (down_proj's input): 4 b s I e. gpt2: what the activation saves
        (``ACTIVATION_SAVES``) and c_proj's input."""
        bsi = batch * self.seq * self.intermediate * e
        if self.family == "gpt2":
            return (ACTIVATION_SAVES[self.activation] + 1) * bsi
        return 4 * bsi

    def block_activation_bytes(self, batch: int, e: int) -> int:
        return (
            2 * self._norm_bytes(batch, e)
            + self._attention_bytes(batch, e)
            + self._mlp_bytes(batch, e)
        )

    def checkpointed_block_bytes(self, batch: int, e: int) -> int:
        """A checkpointed layer keeps its input, ``b s h e``."""
        return batch * self.seq * self.hidden * e

    def root_activation_bytes(self, batch: int, e: int) -> int:
        """Outside the layers: the token ids (int64, b s), gpt2's position ids (s) or the
        rotary cos and sin (2 s d e, shared by every layer), the final norm, and the loss
        (transformers' ``ForCausalLMLoss``: log-softmax of the fp32 logits, 4 b s V, the int64
        targets, 8 b s, and a 4-byte count)."""
        bs = batch * self.seq
        positions = 8 * self.seq if self.family == "gpt2" else 2 * self.seq * self.head_dim * e
        return 8 * bs + positions + self._norm_bytes(batch, e) + 4 * bs * self.vocab + 8 * bs + 4

    def backward_root_bytes(self, batch: int, e: int) -> int:
        """Root activations still alive while the layers run backward: ids and positions."""
        positions = 8 * self.seq if self.family == "gpt2" else 2 * self.seq * self.head_dim * e
        return 8 * batch * self.seq + positions

    def working_bytes(self, batch: int, e: int) -> int:
        """Backward's working set within a layer, as the GPT's (``memory.working_bytes``): the
        gradient arriving and the residual branch's (2 b s h e), the MLP's widest gradients
        (gated: the product's and its two factors', 3 b s I e; gpt2: 1 b s I e), and the
        root's unsharded gradients (final norm, untied head). The plan's peak as a whole is
        checked against FSDPMemTracker on a real step in tests/test_plan.py."""
        bs = batch * self.seq
        wide = 1 if self.family == "gpt2" else 3
        _, after = self._root_parts()
        return (
            2 * bs * self.hidden * e
            + wide * bs * self.intermediate * e
            + e * sum(math.prod(s) for s in after)
        )

    def loss_transient_bytes(self, batch: int, e: int) -> int:
        """The logits (b s V e) and, in bf16, ``ForCausalLMLoss``'s fp32 copy of them."""
        logits = batch * self.seq * self.vocab
        return logits * e + (4 * logits if e < 4 else 0)

    def describe(self) -> str:
        attention = f"{self.heads} heads of {self.head_dim}"
        if self.kv_heads != self.heads:
            attention += f", {self.kv_heads} key/value heads (grouped-query)"
        biases = (
            "biases everywhere"
            if self.family == "gpt2"
            else ", ".join(
                n
                for n, on in (
                    ("q/k/v biases", self.qkv_bias),
                    ("o bias", self.o_bias),
                    ("MLP biases", self.mlp_bias),
                )
                if on
            )
            or "no biases"
        )
        positions = f"learned positions {self.positions}" if self.positions else "rotary positions"
        return (
            f"{self.family}: {self.layers} layers, hidden {self.hidden}, {attention}, MLP "
            f"{self.intermediate} ({self.activation}), vocab {self.vocab}, embeddings "
            f"{'tied' if self.tied else 'untied'}, {biases}, {positions}; seq {self.seq}"
        )


def _field(cfg: dict, name: str, default=None, kind=int, required: bool = True):
    """The config's value of ``name`` (or its gpt2 alias), checked; ConfigError names it."""
    spellings = [
        name,
        *[a for a, b in ALIASES.items() if b == name],
        *[b for a, b in ALIASES.items() if a == name],
    ]
    for key in spellings:
        if key in cfg and cfg[key] is not None:
            value = cfg[key]
            break
    else:
        if required:
            raise ConfigError(f"cannot read {name!r}: the config has no such field")
        return default
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"cannot read {name!r}: expected true or false, got {value!r}")
        return value
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigError(f"cannot read {name!r}: expected a whole number >= 1, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"cannot read {name!r}: expected a string, got {value!r}")
    return value


def from_hf_config(cfg: dict, seq: int | None = None) -> DecoderShape:
    """The model a ``config.json`` describes (its dict), at ``seq`` tokens per sequence
    (default: the model's maximum, at most 2048). ConfigError: one sentence naming the field."""
    if not isinstance(cfg, dict):
        raise ConfigError("cannot read the config: expected a JSON object")
    family = _field(cfg, "model_type", kind=str)
    if family not in FAMILIES:
        raise ConfigError(
            f"cannot read 'model_type' {family!r}: the planner knows {', '.join(FAMILIES)}"
        )
    if family == "gpt2":
        if _field(cfg, "add_cross_attention", False, bool, required=False):
            raise ConfigError(
                "cannot read 'add_cross_attention' true: a decoder-only gpt2 has none"
            )
        hidden, heads = _field(cfg, "n_embd"), _field(cfg, "n_head")
        if hidden % heads:
            raise ConfigError(
                f"cannot read 'n_head' {heads}: n_embd {hidden} is not a multiple of it"
            )
        positions = _field(cfg, "n_positions")
        activation = _field(cfg, "activation_function", "gelu_new", str, required=False)
        values = dict(
            vocab=_field(cfg, "vocab_size"),
            hidden=hidden,
            layers=_field(cfg, "n_layer"),
            heads=heads,
            kv_heads=heads,
            head_dim=hidden // heads,
            intermediate=_field(cfg, "n_inner", 4 * hidden, required=False),
            tied=_field(cfg, "tie_word_embeddings", True, bool, required=False),
            qkv_bias=True,
            o_bias=True,
            mlp_bias=True,
            positions=positions,
        )
        most = positions
    else:
        hidden, heads = _field(cfg, "hidden_size"), _field(cfg, "num_attention_heads")
        kv_default = KV_HEADS_DEFAULT[family] or heads
        kv_heads = _field(cfg, "num_key_value_heads", kv_default, required=False)
        if heads % kv_heads:
            raise ConfigError(
                f"cannot read 'num_key_value_heads' {kv_heads}: "
                f"num_attention_heads {heads} is not a multiple of it"
            )
        head_dim = _field(cfg, "head_dim", None, required=False)
        if head_dim is None:
            if hidden % heads:
                raise ConfigError(
                    f"cannot read 'head_dim': absent, and hidden_size {hidden} is not "
                    f"a multiple of num_attention_heads {heads}"
                )
            head_dim = hidden // heads
        activation = _field(cfg, "hidden_act", "silu", str, required=False)
        bias = family == "llama" and _field(cfg, "attention_bias", False, bool, required=False)
        values = dict(
            vocab=_field(cfg, "vocab_size"),
            hidden=hidden,
            layers=_field(cfg, "num_hidden_layers"),
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=_field(cfg, "intermediate_size"),
            tied=_field(cfg, "tie_word_embeddings", False, bool, required=False),
            qkv_bias=bias or family == "qwen2",
            o_bias=bias,
            mlp_bias=family == "llama" and _field(cfg, "mlp_bias", False, bool, required=False),
        )
        most = _field(cfg, "max_position_embeddings", 2048, required=False)
    if activation not in ACTIVATION_SAVES or (family in ROTARY) != (activation == "silu"):
        name = "activation_function" if family == "gpt2" else "hidden_act"
        known = ["silu"] if family in ROTARY else [a for a in ACTIVATION_SAVES if a != "silu"]
        raise ConfigError(
            f"cannot read {name!r} {activation!r}: the planner knows {', '.join(known)}"
        )
    seq = seq or min(most, 2048)
    if family == "gpt2" and seq > most:
        raise ConfigError(f"cannot plan seq {seq}: 'n_positions' is {most} (learned positions)")
    return DecoderShape(family=family, seq=seq, activation=activation, **values)


def notes(cfg: dict, shape: DecoderShape) -> list[str]:
    """What the plan assumes that this config contradicts, one sentence each: dropout, and a
    sliding window shorter than the sequence (attention then needs a mask)."""
    found = [n for n in [dropout_note(cfg)] if n]
    # transformers' default window is 4096 (MistralConfig; Qwen2Config with use_sliding_window)
    window = (
        cfg.get("sliding_window", 4096)
        if (shape.family == "mistral" or cfg.get("use_sliding_window"))
        else None
    )
    if isinstance(window, int) and window < shape.seq:
        found.append(
            f"note: activations assume causal attention without a mask; this config's sliding "
            f"window ({window}) is shorter than seq {shape.seq}, so attention gets a mask"
        )
    return found


def dropout_note(cfg: dict) -> str | None:
    """The activations assume no dropout (large-model training turns it off); a config with
    dropout gets this sentence."""
    fields = ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout")
    on = [f"{f} {cfg[f]}" for f in fields if isinstance(cfg.get(f), (int, float)) and cfg[f] > 0]
    if cfg.get("model_type") == "gpt2" and not any(f in cfg for f in fields[:3]):
        on = ["attn_pdrop, resid_pdrop, embd_pdrop 0.1 (gpt2's defaults)"]
    if not on:
        return None
    return (
        f"note: activations assume dropout off; this config has {', '.join(on)}: each dropout "
        f"then keeps a mask, and attention on CPU falls back to a kernel that keeps s x s weights"
    )
