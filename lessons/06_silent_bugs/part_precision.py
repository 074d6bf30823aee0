"""Part C: mixed precision. Which dtype each tensor has, what it costs, and what goes wrong.

A variant is ``API:PARAM/REDUCE[/BUFFER][+MOD...]``: the dtypes of the gathered parameters
(compute), of the gradient reduction and (classic FSDP only) of the buffers, as in
``MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)`` / ``MixedPrecisionPolicy(param_dtype,
reduce_dtype)``. Modifiers: ``scaler`` (a gradient scaler: ShardedGradScaler for classic FSDP,
torch.amp.GradScaler for FSDP2), ``nocast`` (the model does not cast the features it makes in
forward: the dtype-mismatch bug), ``unit`` (the MLP is its own FSDP unit, which casts its inputs).
Each variant trains RotaryRegressor and is compared with one fp32 process on the global batch.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from detect import DtypeProbe
from fsdp_course.config import list_flag
from fsdp_course.dist import mean_over_ranks
from fsdp_course.measure import CommCounter, local_tensor
from fsdp_course.report import table
from nets import MAX_POSITION, RotaryRegressor, mse, positions_batch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MODS = ("scaler", "nocast", "unit")
# default 2000: here the scale grows often enough to overflow in a short run
SCALER_GROWTH_INTERVAL = 4
DEFAULT_SPECS = ("fsdp2:fp32/fp32", "fsdp2:bf16/fp32", "fsdp2:bf16/bf16", "fsdp2:fp32/bf16",
                 "classic:bf16/fp32/fp32", "classic:bf16/fp32/bf16",
                 "fsdp2:bf16/fp32+nocast", "fsdp2:bf16/fp32+nocast+unit",
                 "classic:fp16/fp16/fp32", "classic:fp16/fp16/fp32+scaler",
                 "fsdp2:fp16/fp16+scaler")


@dataclass(frozen=True)
class Spec:
    label: str
    api: str
    param: torch.dtype
    reduce: torch.dtype
    buffer: torch.dtype | None
    mods: tuple[str, ...]


def default_global_batch(world_size: int, preferred: int = 64) -> int:
    """64 samples per step where they split over the ranks (1, 2, 4, 8), else the nearest multiple
    of the rank count (63 on 3 ranks): every rank count runs with the default flags."""
    return world_size * max(1, round(preferred / world_size))


def parse_spec(text: str) -> Spec:
    bad = (f"{text}: expected API:PARAM/REDUCE[/BUFFER][+MOD...], API fsdp2|classic, "
           f"dtypes {'|'.join(DTYPES)}, MOD {'|'.join(MODS)} (e.g. classic:bf16/fp32/fp32+scaler)")
    api, _, rest = text.partition(":")
    dtypes, *mods = rest.split("+")
    names = dtypes.split("/")
    if api not in ("fsdp2", "classic") or not 2 <= len(names) <= 3 or any(n not in DTYPES
                                                                          for n in names) \
            or any(m not in MODS for m in mods):
        raise argparse.ArgumentTypeError(bad)
    if api == "fsdp2" and len(names) == 3:
        raise argparse.ArgumentTypeError(f"{text}: FSDP2's MixedPrecisionPolicy has no buffer "
                                         "dtype "
                                         "(FSDP2 leaves buffers as they are); give PARAM/REDUCE")
    return Spec(text, api, DTYPES[names[0]], DTYPES[names[1]],
                DTYPES[names[2]] if len(names) == 3 else None, tuple(mods))


def _checked(label: str) -> str:
    parse_spec(label)
    return label


# --precision "a,b" -> ("a", "b"), each checked (the config keeps the names; main builds Specs)
Specs = list_flag("Specs", item=_checked, fold=None)


def build(spec: Spec, cfg, env) -> nn.Module:
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


def train(spec: Spec, cfg, env, ref: dict) -> dict:
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


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


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


def rel_error(a: dict, b: dict) -> float:
    num = sum(((a[k] - b[k]).double() ** 2).sum() for k in b)
    return float((num / sum((b[k].double() ** 2).sum() for k in b)).sqrt())


def run_all(specs: list[Spec], cfg, env) -> dict:
    ref = reference(cfg, env)
    runs = [train(spec, cfg, env, ref) for spec in specs]
    if env.rank == 0:
        print(f"\nC. mixed precision: {env.world_size} ranks, global batch {cfg.global_batch}, "
              "vs one fp32 process", flush=True)
        print(table([{"variant": r["label"], "grad rel error": r.get("grad_rel_error", "-"),
                      "loss diff": r.get("loss_diff", "-"),
                      "all-gather B": r.get("collectives", {}).get("all_gather", {}).get("bytes",
                                                                                         "-"),
                      "reduce B": r.get("collectives", {}).get("reduce_scatter", {}).get("bytes",
                                                                                         "-"),
                      "gathered B": r.get("gathered_bytes", "-"),
                      "note": r.get("error", "")[:60]} for r in runs]), flush=True)
        print("\ndtypes, read from the tensors during step 0:", flush=True)
        print(table([{"variant": r["label"], **r["dtypes"]} for r in runs if "dtypes" in r]),
              flush=True)
    return {"runs": runs, "reference_losses": ref["losses"]}
