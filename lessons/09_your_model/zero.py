"""Lesson 9's comparison: DeepSpeed ZeRO-1/2/3 beside FSDP2 and classic FSDP on the same model,
the same data and the same initial weights, in fp32.

Each variant trains ``--compare-steps`` steps with ``torch.optim.AdamW`` (on ZeRO's supported
list, so DeepSpeed compiles no C++ optimizer of its own). One step is watched: the bytes of every
collective (``CommCounter``), and at the end of backward / after the step the bytes this rank
holds by category, counted from the tensors where each library keeps them:

    params     the parameters as stored on this rank (FSDP: DTensor / flat shards; ZeRO-1/2:
               the full flat replica; ZeRO-3: each parameter's partition ``ds_tensor``, plus the
               whole of every parameter it keeps "persistent")
    grads      gradients held at the end of backward (FSDP: sharded ``.grad``; ZeRO: its
               partitioned ``averaged_gradients``)
    optimizer  AdamW's state (exp_avg, exp_avg_sq)
    master     ZeRO's separate fp32 copy of this rank's partition (the tensors AdamW steps);
               FSDP steps the parameters themselves: none

``deepspeed`` is imported only here, and only when a ZeRO variant runs.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from contextlib import nullcontext

import torch

from fsdp_course.dist import mean_over_ranks
from fsdp_course.measure import CommCounter, nbytes, state_bytes
from hf_model import blocks, lm_loss

VARIANTS = ("fsdp2", "classic", "zero1", "zero2", "zero3", "zero3-defaults", "zero2-buckets")
SMALL_BUCKET = 50_000  # elements: ZeRO-2's reduce bucket in the "zero2-buckets" variant


def deepspeed_config(variant: str, batch_size: int) -> dict:
    """The DeepSpeed JSON for a variant (what a ds_config.json file holds). "zero3-defaults"
    leaves DeepSpeed's defaults where the others set what fully_shard does."""
    stage = int(variant[4])
    config = {"train_micro_batch_size_per_gpu": batch_size, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 9}
    if variant == "zero3-defaults":
        return config
    # DeepSpeed clips the gradient norm to 1.0 unless told otherwise; fully_shard clips nothing.
    config["gradient_clipping"] = 0.0
    if stage == 3:
        # DeepSpeed keeps small parameters whole on every rank (the threshold, in elements); on
        # a small model that is all of them. 0 shards every parameter, as fully_shard does.
        config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    if variant == "zero2-buckets":
        config["zero_optimization"]["reduce_bucket_size"] = SMALL_BUCKET
    return config


def no_shm_build() -> None:
    """DeepSpeed's CPU backend builds its shared-memory collectives (``deepspeed_shm_comm``, a C++
    extension: minutes of compiling on the first run) unless its table of compatible ops says
    no. We join with gloo ourselves, so nothing needs it: mark it incompatible. (The table is
    computed on first access by probing every op with the compiler: setting it skips that too.)"""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}


def deepspeed_facts() -> dict:
    """DeepSpeed's version, the defaults this lesson overrides, and what it has JIT-built."""
    from pathlib import Path

    import deepspeed
    from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    built = Path.home() / ".cache" / "torch_extensions"
    zero_defaults = DeepSpeedZeroConfig()
    return {"version": deepspeed.__version__,
            "defaults": {"gradient_clipping": GRADIENT_CLIPPING_DEFAULT,
                         "stage3_param_persistence_threshold":
                             zero_defaults.param_persistence_threshold,
                         "reduce_bucket_size": zero_defaults.reduce_bucket_size,
                         "stage3_max_live_parameters": zero_defaults.max_live_parameters,
                         "stage3_max_reuse_distance": zero_defaults.max_reuse_distance},
            "built_extensions": sorted(p.name for p in built.glob("*/*")) if built.is_dir() else []}


def build_deepspeed(variant, reference, lr, batch_size):
    import deepspeed

    no_shm_build()
    model = copy.deepcopy(reference)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    engine, zero_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=deepspeed_config(variant, batch_size))
    return engine, zero_optimizer


def build_fsdp(variant, reference, mesh, env, lr):
    if variant == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.fsdp import fully_shard

        model = copy.deepcopy(reference)
        for block in blocks(model):
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        set_model_state_dict(model, reference.state_dict(),
                             options=StateDictOptions(full_state_dict=True))
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        block_cls = {type(b) for b in blocks(reference)}
        model = FSDP(copy.deepcopy(reference), device_id=env.device, use_orig_params=True,
                     auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                        transformer_layer_cls=block_cls))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def zero_bytes(variant, engine, zero_optimizer, after: str) -> dict:
    """ZeRO's bytes by category, from where DeepSpeed keeps them (see the module doc)."""
    params = list(engine.module.parameters())
    if variant.startswith("zero3"):
        whole = [p for p in params if p.data.numel()]  # gathered now (persistent ones always)
        out = {"params": sum(nbytes(p.ds_tensor) for p in params)
                         + sum(nbytes(p.data) for p in whole),
               "persistent_params": sum(bool(getattr(p, "ds_persist", False)) for p in params),
               "master": sum(nbytes(t) for t in zero_optimizer.fp32_partitioned_groups_flat)}
    else:
        out = {"params": sum(nbytes(t) for t in zero_optimizer.bit16_groups_flat),
               "master": sum(nbytes(t) for t in zero_optimizer.single_partition_of_fp32_groups)}
    if after == "backward":
        out["grads"] = sum(nbytes(t) for group in zero_optimizer.averaged_gradients.values()
                           for t in group or [])
    else:
        out["optimizer"] = sum(nbytes(v) for s in zero_optimizer.optimizer.state.values()
                               for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    return out


def compare(cfg, env, mesh, reference, data) -> dict:
    """Train every variant of ``cfg.compare`` from ``reference``'s weights on the same batches."""
    runs = []
    for variant in cfg.compare:
        zero = variant.startswith("zero")
        if zero:
            model, optimizer = build_deepspeed(variant, reference, cfg.lr, cfg.batch_size)
        else:
            model, optimizer = build_fsdp(variant, reference, mesh, env, cfg.lr)
        losses, memory, comm = [], {}, CommCounter()
        for step in range(cfg.compare_steps):
            x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len,
                              env.device)
            watch = step == min(1, cfg.compare_steps - 1)
            with comm if watch else nullcontext():
                loss = lm_loss(model(x).logits, y)
                if zero:
                    model.backward(loss)
                    if watch:
                        memory.update(zero_bytes(variant, model, optimizer, "backward"))
                    model.step()
                else:
                    loss.backward()
                    if watch:
                        memory.update(grads=state_bytes(model)["grads"])
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            if watch:
                if zero:
                    memory.update(zero_bytes(variant, model, optimizer, "step"))
                else:
                    held = state_bytes(model, optimizer)
                    memory.update(params=held["params"], optimizer=held["optimizer"], master=0)
            losses.append(mean_over_ranks(loss))
        runs.append({"variant": variant, "losses": losses, "memory": memory,
                     "collectives": comm.summary(), "final": _digest(model, zero),
                     "config": deepspeed_config(variant, cfg.batch_size) if zero else None})
        env.print0(f"{variant:14s} losses " + " ".join(f"{v:.6f}" for v in losses)
                   + " | per-rank bytes " + " ".join(f"{k} {v:,}" for k, v in memory.items()))
    facts = deepspeed_facts() if any(v.startswith("zero") for v in cfg.compare) else {}
    return {"runs": runs, "deepspeed": facts}


def _digest(model, zero: bool) -> str:
    """A fingerprint of the final full weights, by name (collective), to compare variants
    bitwise."""
    if zero:
        import deepspeed

        named = dict(model.module.named_parameters())
        with deepspeed.zero.GatheredParameters(list(named.values())):  # ZeRO-3: whole again
            full = {n: p.detach().clone() for n, p in named.items()}
    else:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    h = hashlib.sha256()
    for name in sorted(full):
        h.update(name.encode() + full[name].float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
