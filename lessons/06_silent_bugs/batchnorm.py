"""Part B: BatchNorm under FSDP.

Each rank normalises its own micro-batch with that micro-batch's statistics: the model is not
the one a single process trains on the global batch, and the running statistics differ from
rank to rank. Each variant is trained with FSDP2 and compared with that single-process run.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, fully_shard
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel as DDP

from allreduce_batchnorm import convert_allreduce_batchnorm
from detect import dtype_name, rel_error
from fsdp_course.dist import mean_over_ranks
from fsdp_course.measure import local_tensor
from nets import NormNet, blobs

BN_VARIANTS = ("batchnorm", "ddp", "syncbn", "allreduce-bn", "layernorm", "groupnorm")
BUGS = ("batchnorm", "ddp")
NORM_OF = {"batchnorm": "batchnorm", "ddp": "batchnorm", "syncbn": "batchnorm",
           "allreduce-bn": "batchnorm",
           "layernorm": "layernorm", "groupnorm": "groupnorm"}


def running_stats(model: nn.Module) -> dict:
    return {n: b.detach().clone() for n, b in model.named_buffers() if "running_" in n}


def full_grads(model: nn.Module) -> dict:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for n, p in model.named_parameters()}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|: a difference on the scale of the statistic itself."""
    return ((a - b).abs().max() / b.abs().max()).item()


def max_over_ranks(value: float, device) -> float:
    t = torch.tensor(value, dtype=torch.float64, device=device)  # NCCL reduces GPU tensors only
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def reference(norm: str, cfg, env, batch: int, steps: int) -> dict:
    """One process, the global batch (world_size x batch samples), the same seed."""
    torch.manual_seed(cfg.seed)
    model = NormNet(norm)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    out = {"losses": []}
    for step in range(steps):
        x, y = blobs(step, 0, 1, batch * env.world_size, cfg.seed)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        if step == 0:
            out.update(logits=logits.detach(), grads=full_grads(model))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out["losses"].append(loss.item())
    out.update(stats=running_stats(model),
               params={n: p.detach().clone() for n, p in model.named_parameters()})
    return out


def build(variant: str, cfg, env) -> nn.Module:
    torch.manual_seed(cfg.seed)  # the same init on every rank (part A)
    model = NormNet(NORM_OF[variant]).to(env.device)
    if variant == "syncbn":      # GPUs: all-gathers mean/var/count in forward (CPU: refused)
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if variant == "allreduce-bn":  # the same idea in a few lines: allreduce_batchnorm.py
        model = convert_allreduce_batchnorm(model)
    if variant == "ddp":  # for contrast: DDP broadcasts rank 0's buffers before every forward
        return DDP(model)
    # --- shard: each layer its own FSDP2 unit, then the root (the head) -------------------------
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def train(variant: str, cfg, env, batch: int, steps: int, ref: dict) -> dict:
    model = build(variant, cfg, env)
    inner = model.module if isinstance(model, DDP) else model  # DDP prefixes names with module.
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    rows = slice(env.rank * batch, (env.rank + 1) * batch)  # this rank's rows of the global batch
    result = {"variant": variant, "bug": variant in BUGS, "batch_per_rank": batch, "losses": []}
    for step in range(steps):
        x, y = blobs(step, env.rank, env.world_size, batch, cfg.seed)
        try:
            logits = model(x.to(env.device))
        except ValueError as exc:  # SyncBatchNorm on CPU tensors
            return {**result, "error": f"{type(exc).__name__}: {exc}"}
        loss = F.cross_entropy(logits, y.to(env.device))
        loss.backward()
        if step == 0:
            diff = (logits.detach().cpu() - ref["logits"][rows]).abs().max().item()
            result["output_diff"] = max_over_ranks(diff, env.device)
            result["grad_rel_error"] = rel_error({k: v.cpu() for k, v in full_grads(inner).items()},
                                                 ref["grads"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        result["losses"].append(mean_over_ranks(loss))
    result["loss_diff"] = max(abs(a - b) for a, b in zip(result["losses"], ref["losses"]))
    stats = running_stats(inner)
    if stats:  # gather every rank's running statistics; compare them with each other and the ref
        everyone = [None] * env.world_size
        dist.all_gather_object(everyone, {k: v.cpu() for k, v in stats.items()})
        result["stats_across_ranks"] = max(relative(s[k], everyone[0][k]) for s in everyone
                                           for k in s)
        result["stats_vs_global"] = max(relative(s[k], ref["stats"][k]) for s in everyone
                                        for k in s)
        result["running_mean_rank0"] = everyone[0]["layers.0.1.running_mean"][:4].tolist()
        result["running_mean_rank1"] = everyone[-1]["layers.0.1.running_mean"][:4].tolist()
        result["running_mean_global"] = ref["stats"]["layers.0.1.running_mean"][:4].tolist()
    if variant == "batchnorm":
        result["layout"] = layout(model)
    return result


def layout(model: nn.Module) -> list[dict]:
    """What FSDP did with each parameter and buffer of the first layer: sharded or not."""
    rows = []
    for kind, named in (("parameter", model.layers[0].named_parameters()),
                        ("buffer", model.layers[0].named_buffers())):
        for name, t in named:
            rows.append({"name": f"layers.0.{name}", "kind": kind, "class": type(t).__name__,
                         "global shape": list(t.shape), "local shape": list(local_tensor(t).shape),
                         "dtype": dtype_name(t)})
    return rows


def classic_mixed_precision(cfg, env) -> list[dict]:
    """Classic FSDP, MixedPrecision(bf16 params and reduction) with and without an auto-wrap
    policy, buffers in bf16 (``buffer_dtype``) or left alone: the dtypes BatchNorm and Linear
    really compute with, read in their forward, and the error forward raised, if any.

    With a policy FSDP adds its own pre-hook to each BatchNorm (``_override_module_mixed_precision``
    in ``torch/distributed/fsdp/_common_utils.py``) that casts the input to fp32, and a post-hook
    that casts the output back. A hook registered before wrapping runs before FSDP's and sees the
    input as it arrives; one registered after wrapping runs after it and sees what BatchNorm
    computes with. Both are recorded."""
    rows = []
    for policy, buffer_dtype in ((ModuleWrapPolicy({nn.Sequential}), torch.bfloat16),
                                 (None, torch.bfloat16), (None, None)):
        torch.manual_seed(cfg.seed)
        model = NormNet("batchnorm").to(env.device)
        arriving, computed = {}, {}
        # returns None: a pre-hook's return value replaces args
        def record(seen, module, args, name):
            seen.setdefault(name, (dtype_name(module.weight), dtype_name(args[0])))

        watched = {name: module for name, module in model.named_modules()
                   if isinstance(module, (nn.Linear, _BatchNorm)) and name.startswith("layers.0")}
        for name, module in watched.items():  # before FSDP exists: runs before its hooks
            module.register_forward_pre_hook(
                lambda m, args, name=name, seen=arriving: record(seen, m, args, name))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = FSDP(model, auto_wrap_policy=policy, device_id=env.device,
                         mixed_precision=MixedPrecision(param_dtype=torch.bfloat16,
                                                        reduce_dtype=torch.bfloat16,
                                                        buffer_dtype=buffer_dtype))
            for name, module in watched.items():  # after FSDP's own hooks: what forward receives
                module.register_forward_pre_hook(
                    lambda m, args, name=name, seen=computed: record(seen, m, args, name))
            try:
                model(blobs(0, env.rank, env.world_size, 8, cfg.seed)[0].to(env.device))
                error = ""
            except RuntimeError as exc:  # bf16 weights with fp32 running statistics: refused
                error = f"{type(exc).__name__}: {exc}"
        said = [str(w.message).split(".")[0] for w in caught
                if "mixed precision" in str(w.message).lower()]
        bn = next(m for m in model.modules() if isinstance(m, _BatchNorm))
        for name, (weight, inputs) in arriving.items():
            rows.append({"auto_wrap_policy": "ModuleWrapPolicy" if policy else "none",
                         "buffer_dtype": dtype_name(buffer_dtype), "module": name,
                         "weight dtype in forward": weight, "input as it arrives": inputs,
                         "input it computes with": computed[name][1],
                         "running_mean": dtype_name(bn.running_mean),
                         "warning": said[0] if said else "", "error": error})
    return rows


def sweep(sizes: list[int], cfg, env) -> list[dict]:
    """One step per per-rank batch size: plain BatchNorm vs the all-reduce one."""
    rows = []
    for batch in sizes:
        ref = reference("batchnorm", cfg, env, batch, steps=1)
        for variant in ("batchnorm", "allreduce-bn"):
            r = train(variant, cfg, env, batch, 1, ref)
            rows.append({"variant": variant, "batch_per_rank": batch,
                         "global_batch": batch * env.world_size,
                         "grad_rel_error": r["grad_rel_error"], "output_diff": r["output_diff"],
                         "stats_across_ranks": r["stats_across_ranks"],
                         "stats_vs_global": r["stats_vs_global"]})
    return rows


def run_all(variants: list[str], sizes: list[int], cfg, env) -> dict:
    refs = {norm: reference(norm, cfg, env, cfg.bn_batch, cfg.steps)
            for norm in {NORM_OF[v] for v in variants}}
    runs = [train(v, cfg, env, cfg.bn_batch, cfg.steps, refs[NORM_OF[v]]) for v in variants]
    return {"runs": runs, "sweep": sweep(sizes, cfg, env),
            "classic_mixed_precision": classic_mixed_precision(cfg, env)}
