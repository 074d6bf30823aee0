"""Memory per rank (lesson 7): what a training step holds, when, and whether it fits.

Sizes are in bytes, per rank. The model is the course's GPT (``fsdp_course.model``): vocabulary
``V``, sequence ``s``, width ``h``, ``L`` blocks, ``a`` heads; ``b`` sequences per rank; ``N``
ranks; ``P`` parameters. ``e`` is the compute element size: 4 (fp32) or 2 (bf16 mixed
precision, where the sharded master weights, their gradients and Adam stay fp32).

The model is any object with the shape interface of ``GPTShape`` (its parameters' shapes, its
sharding units, its sizes): the course's GPT itself, ``CountedShape`` (a bare parameter count,
``--params``: the state counts exactly that many), or a Hugging Face decoder read from its
config.json (``theory.decoders.DecoderShape``, which brings its own activation formulas).

What a rank holds, by category:

    params, grads, optimizer   the sharded model state: lesson 1's ``model_state_bytes``
                               (classic FSDP), lesson 5's ``state_bytes_theory`` (FSDP2), or a
                               full replica (DDP): 4P + 4P + 8P = 16P with Adam, divided by N
                               where the strategy shards it; DDP's all-reduce buckets are
                               another 4P (a copy of every gradient) unless
                               ``gradient_as_bucket_view=True`` makes the gradients views into them
    gathered                   unsharded parameters held at once (lesson 2's ``gathered_peaks``)
    activations                what the forward leaves alive for backward (below)
    working set                what backward computes with, one block at a time (below)

A step passes three moments, and the peak is the largest of them:

    end of forward   params + optimizer + gathered(held after forward) + activations
    backward         params + optimizer + gathered(backward) + activations + working set
                     (the first block's backward: nearly every activation is still alive)
    optimizer step   params + grads + optimizer + the step's temporaries

(gradients are ``None`` during forward: the course zeroes them with ``set_to_none=True``).
What the model leaves out is stated as the ``allowance``: the allocator's rounding and caching,
CUDA's context and kernels' workspaces on a GPU, fragmentation. The planner adds it on top of
the modelled peak when it says "fits": ``ALLOWANCE_FRACTION`` of the peak, at least
``ALLOWANCE_MIN`` bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fsdp_course.theory import fsdp2 as fsdp2_theory
from fsdp_course.theory.sharding import (
    collective_bytes,
    ddp_state_bytes,
    model_state_bytes,
    padded,
    ring_sent_bytes,
)
from fsdp_course.theory.wrapping import gathered_peaks

STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "DDP")
APIS = ("fsdp2", "classic")
PRECISIONS = {"fp32": 4, "bf16-mixed": 2}  # compute bytes per element
OPTIMIZER_SLOTS = {"adamw": 2, "adam": 2, "sgd-momentum": 1, "sgd": 0}  # fp32 tensors per parameter
ALLOWANCE_FRACTION = 0.10
ALLOWANCE_MIN = 0  # bytes; a GPU adds its CUDA context (~0.5 GiB): pass reserve= to plan()
# What a CPU rank's address space holds beyond its tensors (Python and autograd objects, the
# allocator's rounding): a few MiB in lesson 7's 4-rank runs, which print how far each rank
# grew. The allowance of a run under an address-space limit is at least this much.
CPU_RANK_RESERVE = 8 * 1024**2
GIB = 1024**3


@dataclass(frozen=True)
class GPTShape:
    """The sizes of ``fsdp_course.model.GPT``: vocabulary, sequence length, width, blocks, heads."""

    vocab: int
    seq: int
    hidden: int
    layers: int
    heads: int

    def root_shapes(self) -> list[tuple[int, ...]]:
        """Parameters outside the blocks: token and position embeddings, final norm, head."""
        v, s, h = self.vocab, self.seq, self.hidden
        return [(v, h), (s, h), (h,), (h,), (v, h), (v,)]

    def block_shapes(self) -> list[tuple[int, ...]]:
        """One block: ln1, qkv (3h x h), proj (h x h), ln2, fc (4h x h), proj (h x 4h), biases:
        12 h^2 + 13 h parameters."""
        h = self.hidden
        return [
            (h,),
            (h,),
            (3 * h, h),
            (3 * h,),
            (h, h),
            (h,),
            (h,),
            (h,),
            (4 * h, h),
            (4 * h,),
            (h, 4 * h),
            (h,),
        ]

    def parameter_shapes(self) -> list[tuple[int, ...]]:
        """Every parameter in ``model.parameters()`` order (the order the optimizer walks):
        embeddings, the blocks, final norm, head."""
        root = self.root_shapes()
        return root[:2] + self.block_shapes() * self.layers + root[2:]

    def unit_shapes(self) -> list[list[tuple[int, ...]]]:
        """The sharding units, root first, then one per block (one ``fully_shard`` call or one
        classic FSDP unit each)."""
        return [self.root_shapes()] + [self.block_shapes()] * self.layers

    def buffer_bytes(self) -> int:
        """Each block's causal mask, a bool s x s buffer: not a parameter, so never sharded."""
        return self.layers * self.seq * self.seq

    def unit_numels(self) -> list[int]:
        return [sum(math.prod(s) for s in unit) for unit in self.unit_shapes()]

    def state_shapes(self) -> list[list[int]]:
        """The tensors FSDP2 shards, each split by rows: every parameter's shape."""
        return [list(s) for unit in self.unit_shapes() for s in unit]

    @property
    def num_params(self) -> int:
        return sum(self.unit_numels())


@dataclass(frozen=True)
class CountedShape(GPTShape):
    """A model known by its parameter count ``count`` only (``--params``), planned as exactly
    that many parameters: the sharded state (params, grads, optimizer) and the bytes on the
    wire are counted from ``count``. What needs a layout (activations, the units held
    gathered, the optimizer's per-tensor temporaries) comes from the assumed GPT of the other
    fields (``model_for_params``), whose own count is only close to ``count``."""

    count: int = 0

    @property
    def num_params(self) -> int:
        return self.count

    def unit_numels(self) -> list[int]:
        """The assumed GPT's units scaled to ``count`` in all: one flat tensor each, so rank 0's
        share of a unit is ``ceil(n / N)`` (the real tensors' padding is not known)."""
        assumed = GPTShape.unit_numels(self)
        total = sum(assumed)
        units = [n * self.count // total for n in assumed]
        units[-1] += self.count - sum(units)
        return units

    def state_shapes(self) -> list[list[int]]:
        """One tensor of ``count`` elements: rank 0 holds ``ceil(count / N)`` of each state."""
        return [[self.count]]


def model_for_params(
    num_params: float,
    layers: int = 32,
    vocab: int = 32000,
    seq: int = 2048,
    heads: int | None = None,
    hidden: int | None = None,
) -> CountedShape:
    """The planner's model when only the parameter count is given (``python -m fsdp_course.plan
    --params``, lesson 7's calculator): exactly ``round(num_params)`` parameters, with the layout
    of a GPT of about that size (``scaled_shape``, or the given ``hidden``)."""
    count = int(round(num_params))
    if count < 1:
        raise ValueError(f"a model has at least 1 parameter, got {num_params!r}")
    if hidden is None:
        assumed = scaled_shape(count, layers=layers, vocab=vocab, seq=seq, heads=heads or 32)
        hidden, heads = assumed.hidden, assumed.heads
    return CountedShape(vocab, seq, hidden, layers, heads or max(1, hidden // 128), count)


def scaled_shape(
    num_params: float,
    layers: int = 32,
    hidden: int = 4096,
    heads: int = 32,
    vocab: int = 32000,
    seq: int = 2048,
) -> GPTShape:
    """A GPT with about ``num_params`` parameters when only the count is known: the width
    that gives it at ``layers`` blocks (P ~ 12 L h^2 + 2 V h), rounded to a multiple of
    ``heads``."""
    a, b, c = 12 * layers, 2 * vocab + 13 * layers, -float(num_params)
    h = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    return GPTShape(vocab, seq, max(heads, int(round(h / heads)) * heads), layers, heads)


def checkpointed_blocks(layers: int, ac: str) -> list[int]:
    """Indices of the blocks wrapped in activation checkpointing: ``none`` none, ``full`` all,
    ``every-K`` blocks 0, K, 2K, ... (one block in K, as torchtitan counts): ``ceil(L / K)``."""
    if ac == "none":
        return []
    if ac == "full":
        return list(range(layers))
    if ac.startswith("every-") and ac[6:].isdigit() and int(ac[6:]) >= 1:
        return list(range(0, layers, int(ac[6:])))
    raise ValueError(f"activation checkpointing {ac!r}: none, full or every-K (K >= 1)")


def block_activation_bytes(shape: GPTShape, batch: int, e: int) -> int:
    """What one block saves for backward (counted in torch 2.13's CPU kernels; GPU kernels keep
    the same tensors, flash attention included):

        16 b s h e   ln1 input (1), ln1 output (1), q k v (3, one tensor), attention output
                     (1), ln2 input (1), ln2 output (1), fc output (4), GELU output (4)
      + 4 b s e      mean and 1/std of both LayerNorms
      + 4 b a s      attention's log-sum-exp (fp32): no s x s matrix is kept
      + s^2 e        the causal mask, as the additive float mask attention builds from it
    """
    if hasattr(shape, "block_activation_bytes"):  # another model's own formula (theory.decoders)
        return shape.block_activation_bytes(batch, e)
    b, s, h = batch, shape.seq, shape.hidden
    return 16 * b * s * h * e + 4 * b * s * e + 4 * b * shape.heads * s + s * s * e


def checkpointed_block_bytes(shape: GPTShape, batch: int, e: int) -> int:
    """A checkpointed block keeps only its input, ``b s h e``; the rest is computed again in
    backward (one more forward of the block per step)."""
    if hasattr(shape, "checkpointed_block_bytes"):
        return shape.checkpointed_block_bytes(batch, e)
    return batch * shape.seq * shape.hidden * e


def root_activation_bytes(shape: GPTShape, batch: int, e: int) -> int:
    """What the layers outside the blocks save: the final LayerNorm's input and output
    (2 b s h e) and statistics (2 b s e), the positions (8 s), and the loss's log-softmax
    (4 b s V: ``lm_loss`` computes it in fp32) with its int64 targets (8 b s)."""
    if hasattr(shape, "root_activation_bytes"):
        return shape.root_activation_bytes(batch, e)
    b, s = batch, shape.seq
    return (
        2 * b * s * shape.hidden * e + 2 * b * s * e + 8 * s + 4 * b * s * shape.vocab + 8 * b * s
    )


def activation_bytes(shape: GPTShape, batch: int, e: int, checkpointed: list[int] = ()) -> int:
    """Activations per rank at the end of forward: every block's saved tensors (or only its
    input, if checkpointed) plus the root's."""
    full, kept = block_activation_bytes(shape, batch, e), checkpointed_block_bytes(shape, batch, e)
    blocks = sum(kept if i in checkpointed else full for i in range(shape.layers))
    return blocks + root_activation_bytes(shape, batch, e)


def recompute_time_fraction(shape: GPTShape, checkpointed: int) -> float:
    """Time activation checkpointing adds, as a fraction of a step without it, counted in
    matrix-multiply FLOPs (what dominates on GPUs):

        forward of a block, per token   2 * 12 h^2 (the four Linears) + 2 * 2 s h (scores, and
                                        their product with V)
        forward of the model            L * block + 2 h V (the head)
        a step                          forward + backward = 3 * forward (backward ~ 2x)
        added                           c checkpointed blocks forwarded once more:
                                        c * block / (3 * model)

    Full checkpointing of a model made of blocks costs about a third more.
    """
    block = 2 * 12 * shape.hidden**2 + 4 * shape.seq * shape.hidden
    model = shape.layers * block + 2 * shape.hidden * shape.vocab
    return checkpointed * block / (3 * model)


def working_bytes(shape: GPTShape, batch: int, e: int) -> int:
    """What backward computes with beyond the stored activations, at its largest within a
    block: in the MLP, when the second Linear has produced the gradient of its 4h-wide input
    and the GELU output it saved is not yet freed:

        6 b s h e        the gradient arriving at the block (1), the residual branch's (1),
                         and the MLP's 4h-wide gradient (4)
      + root gradient    the head's and final norm's unsharded gradients (e bytes each), held
                         until the root's gradients are reduced at the very end of backward
    """
    if hasattr(shape, "working_bytes"):
        return shape.working_bytes(batch, e)
    root_grad = e * sum(math.prod(s) for s in shape.root_shapes()[2:])
    return 6 * batch * shape.seq * shape.hidden * e + root_grad


def backward_bytes(
    shape: GPTShape, batch: int, e: int, checkpointed: list[int], grad_shard: int, grad_buffer: int
) -> dict:
    """Activations and gradients alive in backward, at the block where their sum is largest.

    Backward visits the blocks last to first. In block ``i``'s backward are alive: the stored
    activations of the blocks before it (``i`` of them), block ``i``'s full activations (stored,
    or recomputed if checkpointed), the working set, the sharded gradients of the blocks
    already done (``L - 1 - i`` of them), and, with FSDP2, the previous block's unsharded
    gradient while its reduce-scatter completes (``grad_buffer``; classic FSDP reduces it
    before moving on):

        alive(i) = sum_{j<i} stored_j + full + (L-1-i) * grad_shard + [i < L-1] grad_buffer

    Without checkpointing the last block wins (every activation is still there). With it,
    each block further down trades a stored input (b s h e) for a finished gradient shard.
    """
    full = block_activation_bytes(shape, batch, e)
    kept = checkpointed_block_bytes(shape, batch, e)
    best, best_i, prefix = None, 0, 0
    root = (
        shape.backward_root_bytes(batch, e)
        if hasattr(shape, "backward_root_bytes")
        else 8 * shape.seq
    )
    for i in range(shape.layers):
        done = (shape.layers - 1 - i) * grad_shard + (grad_buffer if i < shape.layers - 1 else 0)
        alive = {"activations": prefix + full + root, "grads": done}
        if best is None or sum(alive.values()) > sum(best.values()):
            best, best_i = alive, i
        prefix += kept if i in checkpointed else full
    return {**best, "block": best_i}


def optimizer_temp_bytes(
    shape: GPTShape, world_size: int, strategy: str, api: str, foreach: bool
) -> int:
    """The temporaries of AdamW's step, beyond its state (fp32, this rank's shards).

    ``foreach`` (PyTorch's default on GPUs) updates all tensors at once: ``sqrt`` of every
    second moment is one list of temporaries, the size of the local parameters. The for-loop
    (the default on CPUs) updates one tensor at a time: ``exp_avg_sq.sqrt()`` and its division
    are two temporaries of that tensor, while the previous tensor's ``denom`` is still
    referenced until it is reassigned:  max over consecutive tensors of  prev + 2 * current.
    Classic FSDP's tensors are the flat unit shards; FSDP2's and DDP's are the parameters.
    """
    if api == "classic" and strategy != "DDP":
        sizes = [
            4 * math.ceil(n / (1 if strategy == "NO_SHARD" else world_size))
            for n in shape.unit_numels()
        ]
        return (
            sum(sizes) if foreach else max(prev + 2 * cur for prev, cur in zip([0] + sizes, sizes))
        )
    n = 1 if strategy == "DDP" else world_size
    if foreach:  # the local parameters in all (a model known by its count: exactly its share)
        return sum(
            4 * math.prod(fsdp2_theory.local_shape(list(s), n, 0)) for s in shape.state_shapes()
        )
    sizes = [
        4 * math.prod(fsdp2_theory.local_shape(list(s), n, 0)) for s in shape.parameter_shapes()
    ]
    return max(prev + 2 * cur for prev, cur in zip([0] + sizes, sizes))


def loss_transient_bytes(shape: GPTShape, batch: int, e: int) -> int:
    """Inside ``lm_loss`` at the end of forward: the logits (b s V e) and, with bf16, their
    fp32 copy (4 b s V), both alive while the log-softmax is computed."""
    if hasattr(shape, "loss_transient_bytes"):
        return shape.loss_transient_bytes(batch, e)
    logits = batch * shape.seq * shape.vocab
    return logits * e + (4 * logits if e < 4 else 0)


def sharded_state_bytes(
    shape: GPTShape, world_size: int, strategy: str, api: str, optimizer: str = "adamw"
) -> dict:
    """params, grads, optimizer per rank, with the course's exact layouts (padding included):
    classic FSDP pads each unit's flat parameter (lesson 1), FSDP2 splits every parameter by
    rows (lesson 5: the largest share is rank 0's), DDP holds a full replica."""
    slots = OPTIMIZER_SLOTS[optimizer]
    if strategy == "DDP":
        return ddp_state_bytes(shape.num_params, optim_slots=slots)
    if api == "classic":
        return model_state_bytes(shape.unit_numels(), world_size, strategy, optim_slots=slots)
    return fsdp2_theory.state_bytes_theory(
        shape.state_shapes(), world_size, rank=0, optim_slots=slots
    )


def _block_grad_shard_bytes(shape: GPTShape, world_size: int, strategy: str, api: str) -> int:
    """One block's gradient as this rank keeps it after the reduce-scatter (fp32)."""
    if api == "classic":
        return model_state_bytes([shape.unit_numels()[1]], world_size, strategy)["grads"]
    return fsdp2_theory.state_bytes_theory([list(s) for s in shape.block_shapes()], world_size)[
        "grads"
    ]


def _unit_gathered_bytes(shape: GPTShape, world_size: int, api: str, e: int) -> list[int]:
    """Bytes of each unit once all-gathered: classic pads the flat unit to a multiple of N,
    FSDP2 pads each parameter's first dimension."""
    if api == "classic":
        return [padded(n, world_size) * e for n in shape.unit_numels()]
    return [
        sum(fsdp2_theory.padded_numel(list(s), world_size) for s in unit) * e
        for unit in shape.unit_shapes()
    ]


def gathered_bytes(shape: GPTShape, world_size: int, strategy: str, api: str, e: int) -> dict:
    """Unsharded parameters held at once, at the end of forward and at most in backward.

    FULL_SHARD (reshard after forward): the root stays gathered from forward to backward; a
    block is gathered, used and freed; in backward the next block is gathered while the
    current one computes (prefetch): lesson 2's ``gathered_peaks``:
        end of forward = root;   backward = root + the two largest neighbouring blocks
    SHARD_GRAD_OP (keep after forward): every unit, from its forward until its backward.
    One rank: FSDP2 still copies each unit into unsharded parameters, but with no collective
    there is no prefetch buffer: root + the largest block. Classic FSDP on one rank (it
    switches to NO_SHARD) and NO_SHARD use the parameters in place: nothing, unless bf16
    mixed precision, whose low-precision copy of each unit comes and goes like FULL_SHARD's.
    DDP: nothing.
    """
    units = _unit_gathered_bytes(shape, world_size, api, e)
    root, blocks = units[0], units[1:]
    pairs = [x + y for x, y in zip(blocks, blocks[1:])] or blocks
    one_at_a_time = {"forward_end": root, "backward": root + max(pairs, default=0)}
    if strategy == "DDP":
        return {"forward_end": 0, "backward": 0}
    if api == "classic" and (strategy == "NO_SHARD" or world_size == 1):
        return one_at_a_time if e < 4 else {"forward_end": 0, "backward": 0}
    if strategy == "SHARD_GRAD_OP":
        return {"forward_end": sum(units), "backward": sum(units)}
    if world_size == 1:
        return {"forward_end": root, "backward": root + max(blocks, default=0)}
    if api == "classic":
        peaks = gathered_peaks(shape.unit_numels(), world_size, param_bytes=e)
        return {"forward_end": root, "backward": peaks["backward"]}
    return one_at_a_time


def plan(
    shape: GPTShape,
    batch: int,
    world_size: int,
    strategy: str = "FULL_SHARD",
    api: str = "fsdp2",
    precision: str = "fp32",
    optimizer: str = "adamw",
    ac: str = "none",
    gpu_bytes: float | None = None,
    reserve: int = ALLOWANCE_MIN,
    foreach: bool = True,
) -> dict:
    """Per-rank bytes by category, the three moments of a step, the peak, and the verdict.

        live       params + optimizer + buffers (+ grads for DDP: its all-reduce buckets,
                   4P allocated once and kept; the gradients are views into them only with
                   ``gradient_as_bucket_view=True``, by default a second 4P beside them)
        forward    live + gathered(end of forward) + activations + the loss's transient
        backward   live + gathered(backward) + backward_bytes(...) + working set
        optimizer  params + grads + optimizer + the step's temporaries
                   (``optimizer_temp_bytes``; ``foreach=False`` is the CPU default)
        peak       the largest of the three

    Returns a dict: ``categories`` (params, grads, optimizer: the sharded state; gathered and
    activations at their largest), ``moments`` (each a breakdown that sums to its total),
    ``peak``, ``peak_moment``, ``at_peak`` (the peak's breakdown), ``allowance``, ``needed``
    (peak + allowance), ``wire_bytes``, and with ``gpu_bytes`` also ``fits``.
    """
    check(shape, batch, world_size, strategy, api, precision, optimizer)
    e = PRECISIONS[precision]
    chosen = checkpointed_blocks(shape.layers, ac)
    state = sharded_state_bytes(shape, world_size, strategy, api, optimizer)
    gathered = gathered_bytes(shape, world_size, strategy, api, e)
    stored = activation_bytes(shape, batch, e, chosen)
    ddp = strategy == "DDP"
    grad_shard = 0 if ddp else _block_grad_shard_bytes(shape, world_size, strategy, api)
    grad_buffer = (
        0
        if ddp or api == "classic"
        else 4 * max(_unit_gathered_bytes(shape, world_size, api, 1)[1:])
    )
    backward = backward_bytes(shape, batch, e, chosen, grad_shard, grad_buffer)
    live = {
        "params": state["params"],
        "optimizer": state["optimizer"],
        "grads": state["grads"] if ddp else 0,
        "buffers": shape.buffer_bytes(),
    }
    moments = {
        "forward": {
            **live,
            "gathered": gathered["forward_end"],
            "activations": stored,
            "working": loss_transient_bytes(shape, batch, e),
        },
        "backward": {
            **live,
            "grads": live["grads"] + backward["grads"],
            "gathered": gathered["backward"],
            "activations": backward["activations"],
            "working": working_bytes(shape, batch, e),
        },
        "optimizer_step": {
            **state,
            "buffers": shape.buffer_bytes(),
            "working": optimizer_temp_bytes(shape, world_size, strategy, api, foreach),
        },
    }
    totals = {name: sum(parts.values()) for name, parts in moments.items()}
    peak_moment = max(totals, key=totals.get)
    peak = totals[peak_moment]
    allowance = max(int(ALLOWANCE_FRACTION * peak), reserve)
    result = {
        "model": dict(shape.__dict__),
        "num_params": shape.num_params,
        "batch": batch,
        "world_size": world_size,
        "strategy": strategy,
        "api": api,
        "precision": precision,
        "optimizer": optimizer,
        "activation_checkpointing": ac,
        "checkpointed_blocks": len(chosen),
        "categories": {**state, "gathered": gathered["backward"], "activations": stored},
        "moments": moments,
        "totals": totals,
        "peak": peak,
        "peak_moment": peak_moment,
        "at_peak": moments[peak_moment],
        "backward_block": backward["block"],
        "allowance": allowance,
        "needed": peak + allowance,
        "wire_bytes": wire_bytes(shape, world_size, strategy, api, e),
    }
    if gpu_bytes is not None:
        result["gpu_bytes"] = int(gpu_bytes)
        result["fits"] = peak + allowance <= gpu_bytes
    return result


def check(
    shape: GPTShape,
    batch: int,
    world_size: int,
    strategy: str,
    api: str,
    precision: str,
    optimizer: str,
) -> None:
    """ValueError with one sentence for settings that mean nothing."""
    for name, value in (
        ("layers", shape.layers),
        ("hidden", shape.hidden),
        ("seq", shape.seq),
        ("vocab", shape.vocab),
        ("heads", shape.heads),
        ("batch", batch),
        ("world size", world_size),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if isinstance(shape, GPTShape) and shape.hidden % shape.heads:
        raise ValueError(f"hidden {shape.hidden} must be a multiple of heads {shape.heads}")
    for name, value, choices in (
        ("strategy", strategy, STRATEGIES),
        ("api", api, APIS),
        ("precision", precision, tuple(PRECISIONS)),
        ("optimizer", optimizer, tuple(OPTIMIZER_SLOTS)),
    ):
        if value not in choices:
            raise ValueError(f"unknown {name} {value!r}: choose from {', '.join(choices)}")
    if api == "fsdp2" and strategy == "NO_SHARD":
        raise ValueError("FSDP2 has no NO_SHARD: a replica on every rank is DDP (--strategy DDP)")


def wire_bytes(
    shape: GPTShape, world_size: int, strategy: str, api: str, e: int, reduce_bytes: int = 4
) -> int:
    """Bytes each rank sends per step (ring algorithms), from lesson 1's collective payloads:
    FULL_SHARD all-gathers about 2P (forward and backward) and reduce-scatters P; SHARD_GRAD_OP
    and DDP move about 2P in all; each rank sends (N - 1)/N of an all-gather or reduce-scatter
    payload and 2 (N - 1)/N of an all-reduce. All-gathers move compute-precision parameters
    (``e`` bytes); gradients are reduced in fp32 (the course's mixed-precision setting)."""
    if world_size == 1:
        return 0
    classic_name = "NO_SHARD" if strategy == "DDP" else strategy
    payload = collective_bytes(
        shape.unit_numels(), world_size, classic_name, param_bytes=e, reduce_bytes=reduce_bytes
    )
    return int(sum(ring_sent_bytes(kind, size, world_size) for kind, size in payload.items()))


def zero_stage_bytes(num_params: float, world_size: int, stage: int, k: int = 12) -> dict:
    """The ZeRO paper's accounting (Rajbhandari et al. 2020) for mixed-precision Adam: fp16
    parameters 2Psi, fp16 gradients 2Psi, and K Psi of optimizer state (fp32 master copy,
    momentum, variance: K = 12), each divided by N_d where the stage shards it:

        stage 0 (DDP)        2Psi + 2Psi + K Psi
        stage 1 (P_os)       2Psi + 2Psi + K Psi / N
        stage 2 (P_os+g)     2Psi + (2 + K) Psi / N          ~ SHARD_GRAD_OP (+ the unsharded
                                                                parameters held between
                                                                forward and backward)
        stage 3 (P_os+g+p)   (2 + 2 + K) Psi / N             ~ FULL_SHARD

    FSDP's bf16-mixed split differs (fp32 master weights and gradients, 4 + 4 + 8 = 16 bytes,
    all sharded), but the total per parameter is the same 16.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage {stage!r}: 0, 1, 2 or 3")
    n = world_size
    params = 2 * num_params / (n if stage >= 3 else 1)
    grads = 2 * num_params / (n if stage >= 2 else 1)
    optimizer = k * num_params / (n if stage >= 1 else 1)
    return {
        "params": params,
        "grads": grads,
        "optimizer": optimizer,
        "total": params + grads + optimizer,
    }


def smallest_world_size(
    shape: GPTShape, batch: int, gpu_bytes: float, limit: int = 4096, **settings
) -> int | None:
    """The fewest ranks on which ``plan`` says the model fits (None: not up to ``limit``)."""
    n = 1
    while n <= limit:
        if plan(shape, batch, n, gpu_bytes=gpu_bytes, **settings)["fits"]:
            return n
        n *= 2
    return None
