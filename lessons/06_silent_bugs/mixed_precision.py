"""Part C: mixed precision. Which dtype each tensor has, what it costs, and what goes wrong.

A variant is ``API:PARAM/REDUCE[/BUFFER][+MOD...]``: the dtypes of the gathered parameters
(compute), of the gradient reduction and (classic FSDP only) of the buffers, as in
``MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)`` / ``MixedPrecisionPolicy(param_dtype,
reduce_dtype)``. Modifiers: ``scaler`` (a gradient scaler: ShardedGradScaler for classic FSDP,
torch.amp.GradScaler for FSDP2), ``nocast`` (the model does not cast the features it makes in
forward: the dtype-mismatch bug), ``unit`` (the MLP is its own FSDP unit, which casts its inputs).
``runs.parse_spec`` reads a variant into the ``runs.Spec`` that ``build`` takes.
Each variant trains RotaryRegressor and is compared with one fp32 process on the global batch.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from detect import DtypeProbe, dtype_name, rel_error
from fsdp_course.dist import mean_over_ranks
from fsdp_course.measure import CommCounter, local_tensor
from nets import MAX_POSITION, RotaryRegressor, mse, positions_batch

# default 2000: here the scale grows often enough to overflow in a short run
SCALER_GROWTH_INTERVAL = 4


def build(spec, cfg, env) -> nn.Module:
    torch.manual_seed(cfg.seed)
    model = RotaryRegressor(cast_features="nocast" not in spec.mods).to(env.device)
    if spec.api == "fsdp2":
        # --- FSDP2: compute in param_dtype, reduce in reduce_dtype; buffers are not its business --
        policy = MixedPrecisionPolicy(param_dtype=spec.param, reduce_dtype=spec.reduce)
        if "unit" in spec.mods:  # its own unit: FSDP2 casts the MLP's inputs to param_dtype
            fully_shard(model.mlp, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model
    # --- classic: MixedPrecision also casts floating-point buffers to buffer_dtype ---------------
    policy = MixedPrecision(param_dtype=spec.param, reduce_dtype=spec.reduce,
                            buffer_dtype=spec.buffer,
                            # non-root units cast only if asked
                            cast_forward_inputs="unit" in spec.mods)
    return FSDP(model, mixed_precision=policy, device_id=env.device, use_orig_params=True,
                auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}) if "unit" in spec.mods else None)


def reference(cfg, env) -> dict:
    """One fp32 process on the global batch: losses, step-0 gradients and features."""
    torch.manual_seed(cfg.seed)
    model = RotaryRegressor()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    out = {"losses": []}
    for step in range(cfg.precision_steps):
        positions, target = positions_batch(step, 0, 1, cfg.global_batch, cfg.seed)
        loss = mse(model(positions), target)
        loss.backward()
        if step == 0:
            out["grads"] = {n: p.grad.clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out["losses"].append(loss.item())
    return out


def full_grads(model: nn.Module) -> dict:
    """Every parameter's whole gradient (after the reduce), fp32 on the CPU, by its plain name."""
    if isinstance(model, FSDP):  # classic: gather the shards (use_orig_params=True keeps names)
        with FSDP.summon_full_params(model, with_grads=True):
            return {n: p.grad.float().cpu() for n, p in model.module.named_parameters()}
    return {n: p.grad.full_tensor().float().cpu() for n, p in model.named_parameters()}


def train(spec, cfg, env, ref: dict) -> dict:
    start = time.perf_counter()
    model = build(spec, cfg, env)
    inner = model.module if isinstance(model, FSDP) else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    scaler = None
    # classic: the shard-aware scaler; FSDP2: the plain one takes DTensors
    if "scaler" in spec.mods:
        # It starts at 2**16 and doubles after every GROWTH_INTERVAL clean steps: until a step
        # overflows (inf/nan in some gradient), which it skips, halving the scale.
        kind = ShardedGradScaler if spec.api == "classic" else torch.amp.GradScaler
        scaler = kind(env.device.type, growth_interval=SCALER_GROWTH_INTERVAL)
    batch = cfg.global_batch // env.world_size
    result = {"label": spec.label, "api": spec.api, "losses": [], "scales": [], "skipped": 0}
    gathered = {}

    def count_gathered(module, args):  # the unsharded weights the forward really uses
        gathered[id(module)] = sum(t.numel() * t.element_size() for t in (module.weight,
                                                                          module.bias))

    for layer in inner.mlp:
        if isinstance(layer, nn.Linear):
            layer.register_forward_pre_hook(count_gathered)
    for step in range(cfg.precision_steps):
        positions, target = positions_batch(step, env.rank, env.world_size, batch, cfg.seed)
        positions, target = positions.to(env.device), target.to(env.device)
        probe = DtypeProbe(inner.mlp[0], inner, "inv_freq") if step == 0 else nullcontext()
        with CommCounter() as comm, probe:
            try:
                prediction = model(positions)
            except RuntimeError as exc:  # the dtype-mismatch bug: record its real message
                if "nocast" not in spec.mods:
                    raise
                return {**result, "error": f"{type(exc).__name__}: {exc}"}
            loss = mse(prediction, target)
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.unscale_(optimizer)  # the true gradients (inf where the scaled ones overflowed)
        if step == 0:
            result.update(step0(model, ref, prediction), collectives=comm.summary(),
                          gathered_bytes=sum(gathered.values()), angle_error=angle_error(inner))
            result["dtypes"].update(probe.seen)
            probe.remove()
        if scaler:
            before = scaler.get_scale()
            scaler.step(optimizer)  # skipped if any rank found inf/nan
            scaler.update()
            result["scales"].append(scaler.get_scale())
            result["skipped"] += scaler.get_scale() < before  # a skipped step halves the scale
        else:
            optimizer.step()
        if step == 0:
            state = next(iter(optimizer.state.values()), {})
            exp_avg = dtype_name(local_tensor(state["exp_avg"])) if state else "-"
            result["dtypes"]["optimizer state"] = exp_avg
        optimizer.zero_grad(set_to_none=True)
        result["losses"].append(mean_over_ranks(loss))
    result["loss_diff"] = max(abs(a - b) for a, b in zip(result["losses"], ref["losses"]))
    result["seconds"] = time.perf_counter() - start
    return result


@torch.no_grad()
def angle_error(model: RotaryRegressor) -> float:
    """Largest error in radians of ``position * inv_freq`` as this model computes it now (its
    buffer in whatever dtype FSDP left it), against float64, over every position it sees."""
    positions = torch.arange(MAX_POSITION, device=model.inv_freq.device)
    angles = positions[:, None] * model.inv_freq  # as forward does it: in the buffer's dtype
    exact = positions[:, None].double() * model.inv_freq_fp64.to(positions.device)
    return (angles.double() - exact).abs().max().item()


def step0(model: nn.Module, ref: dict, prediction: torch.Tensor) -> dict:
    """Step 0's gradients (after the reduce) against the fp32 process, and the dtypes."""
    grads = full_grads(model)
    # (classic FSDP: a rank's shard may hold no element of a parameter: its grad is None)
    grad = next(p.grad for p in model.parameters() if p.grad is not None)
    return {"grad_rel_error": rel_error(grads, ref["grads"]),
            "grad_zeros": int(sum(((g == 0) & (ref["grads"][n] != 0)).sum() for n,
                                  g in grads.items())),
            "grad_numel": sum(g.numel() for g in grads.values()),
            "dtypes": {"sharded params": dtype_name(local_tensor(next(model.parameters()))),
                       "grads": dtype_name(local_tensor(grad)), "output": dtype_name(prediction)}}


def run_all(specs: list, cfg, env) -> dict:
    ref = reference(cfg, env)
    runs = [train(spec, cfg, env, ref) for spec in specs]
    return {"runs": runs, "reference_losses": ref["losses"]}
