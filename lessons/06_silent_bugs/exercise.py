"""The exercise: run a learner's training loop under torchrun, compare it with the reference.

The loop is ``train(env, batches, steps, seed, inspect) -> model`` in a .py file (the notebook
cell, saved). The reference is one process on the global batch, with the model and learning
rate of ``mystery_loop.py`` as it was meant to be: the same seed, the same data.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mystery_loop
from detect import compare_across_ranks, dtype_name, full_state, max_diff
from fsdp_course.dist import CourseError
from nets import blobs

BATCH = 8  # samples per rank per step
TOLERANCE = 1e-4  # fp32 on both sides: equal up to rounding, which Adam amplifies a little


def inspector(env, findings: list):
    """``inspect(where, model)``: what lesson 6's detectors see at that point of the loop."""
    def inspect(where: str, model) -> dict:
        plain = [(n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]
                 if not hasattr(t, "to_local")]  # sharded (DTensor) rows differ by design
        found = {"where": where, "sharded": sum(hasattr(p, "to_local") for p in model.parameters()),
                 **compare_across_ranks(plain),
                 "running stats": [n for n, _ in plain if "running_" in n],
                 "dtypes": sorted({f"{kind} {dtype_name(t)}" for kind, ts in (
                     ("params", model.parameters()), ("buffers", model.buffers()),
                     ("grads", [p.grad for p in model.parameters() if p.grad is not None]))
                     for t in ts})}
        findings.append(found)
        differ = found["differ"]
        names = f": {', '.join(differ[:4])}" if differ else ""
        skipped = (f" ({found['sharded']} sharded parameters not compared)" if found["sharded"]
                   else "")
        env.print0(f"[inspect {where}] {len(differ)} of {found['checked']} unsharded tensors "
                   "differ "
                   f"across ranks{names}{skipped}; BatchNorm statistics: "
                   f"{len(found['running stats']) or 'none'}; dtypes: {', '.join(found['dtypes'])}")
        return found
    return inspect


def reference(steps: int, seed: int, world_size: int) -> dict:
    torch.manual_seed(seed)
    model = mystery_loop.make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=mystery_loop.LR)
    losses = []
    for step in range(steps):
        x, y = blobs(step, 0, 1, BATCH * world_size, seed)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "final": model.state_dict()}


def run(module, cfg, env) -> dict:
    """Train the learner's loop on this rank's rows; compare the result with the reference."""
    findings: list = []

    def batches(step: int):
        x, y = blobs(step, env.rank, env.world_size, BATCH, cfg.seed)
        return x.to(env.device), y.to(env.device)

    model = module.train(env, batches, cfg.steps, cfg.seed, inspector(env, findings))
    if not isinstance(model, torch.nn.Module):
        raise CourseError(f"train() returned {type(model).__name__}, not the trained model")
    final = full_state(model)
    ref = reference(cfg.steps, cfg.seed, env.world_size)
    diff = max_diff({k: v.cpu() for k, v in final.items()}, ref["final"])
    result = {"param_diff": diff, "steps": cfg.steps, "findings": findings, "tolerance": TOLERANCE,
              "matches_reference": diff < TOLERANCE}
    env.print0(f"\nexercise: after {cfg.steps} steps, max |parameter - reference| = {diff:.3g} "
               f"({'matches' if diff < TOLERANCE else 'differs from'} one process on the global "
               "batch; "
               f"tolerance {TOLERANCE:g})")
    return result
