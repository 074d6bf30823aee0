"""Lesson 8's runs (what the lesson is not about): the layouts a run refuses before it starts, the
checks against one process on the global batch (the step's gradients, the exercise's held-out
loss), the bytes the theory expects per link, and the report rank 0 prints.
"""

from __future__ import annotations

import logging
import os

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from fsdp_course.dist import CourseError, mean_over_ranks
from fsdp_course.model import GPT, lm_loss
from fsdp_course.report import table
from fsdp_course.theory import fsdp2, hsdp

EVAL_SEED_OFFSET = 100_000  # held-out batches: steps no training batch ever uses


def validate(cfg, env) -> None:
    """Bad layouts: one line (CourseError), never a stack trace from DeviceMesh."""
    if cfg.replicas > 1 and cfg.tp > 1:
        raise CourseError("--replicas and --tp together (3-D) are not part of this lesson: "
                          "pick one")
    for name, value in (("--replicas", cfg.replicas), ("--tp", cfg.tp)):
        if value < 1 or env.world_size % value:
            raise CourseError(f"{name} {value} must divide the world size {env.world_size}")
    if cfg.kill_node_at_step is not None:
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) < 1 or not cfg.ckpt_every:
            raise CourseError("--kill-node-at-step needs MAX_RESTARTS=1 and --ckpt-every N: "
                              "the job must restart and find a checkpoint")


def one_process_copy(model, cfg, vocab_size: int, device=None) -> GPT:
    """A plain GPT holding the sharded model's weights, gathered whole (collective: every rank
    calls it; works after a resume and on a TP x FSDP mesh too)."""
    # Gathering TP x FSDP shards logs a warning per tensor ("2 sequential all_gather"): noise here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    reference = GPT(cfg.model_config(vocab_size)).to(device)
    reference.load_state_dict(full)
    return reference


def grad_check(model, data, cfg, env, step: int) -> dict:
    """This step's gradients of the sharded model vs one process on the whole global batch,
    from the same weights."""
    reference = one_process_copy(model, cfg, data.vocab_size, env.device)
    dp_size, dp_rank = env.world_size // cfg.tp, env.rank // cfg.tp
    x, y = data.batch(step, 0, 1, cfg.batch_size * dp_size, cfg.seq_len, env.device)
    reference_loss = lm_loss(reference(x), y)
    reference_loss.backward()
    x, y = data.batch(step, dp_rank, dp_size, cfg.batch_size, cfg.seq_len, env.device)
    loss = lm_loss(model(x), y)
    loss.backward()
    worst = 0.0
    for p, q in zip(model.parameters(), reference.parameters()):
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        worst = max(worst, (grad - q.grad).abs().max().item())
    model.zero_grad(set_to_none=True)
    return {"step": step, "max_abs_diff": worst, "params": len(list(reference.parameters())),
            # tensor-parallel partners hold the same loss
            "loss": mean_over_ranks(loss), "reference_loss": reference_loss.item()}


# --- the exercise: a learner's evaluate(model, batch, env), called by every rank ------------------

def eval_batch(data, step: int, env, cfg):
    """This rank's rows of the held-out batch after ``step`` (all ranks' rows: the global one)."""
    return data.batch(EVAL_SEED_OFFSET + step, env.rank, env.world_size, cfg.batch_size,
                      cfg.seq_len)


def compare_eval(value, model, data, cfg, env) -> dict:
    """The exercise's result: what ``evaluate`` returned on rank 0 after the last evaluated step,
    next to one process's loss on the whole held-out batch (collective: every rank calls it)."""
    last = max(s for s in range(cfg.steps) if s % 2 == 1)
    reference = one_process_copy(model, cfg, data.vocab_size)
    x, y = data.batch(EVAL_SEED_OFFSET + last, 0, 1, cfg.batch_size * env.world_size, cfg.seq_len)
    with torch.no_grad():
        result = {"value": value, "step": last, "reference": lm_loss(reference(x), y).item()}
    env.print0(f"held-out loss: yours {value}, one process on the global batch "
               f"{result['reference']:.6f}")
    return result


# --- the report ---------------------------------------------------------------------------------

def theory_for(cfg, world_size: int, shapes) -> dict:
    """The payload bytes per link the measured step should show (``fsdp_course.theory``)."""
    if cfg.replicas > 1:
        return hsdp.hsdp_collective_bytes(shapes, cfg.replicas, world_size // cfg.replicas)
    if cfg.tp > 1:  # the all-reduces tensor parallelism adds (FSDP's own bytes shrink by tp)
        return {"intra": {"all_reduce": hsdp.tp_mlp_all_reduce_bytes(
            cfg.batch_size, cfg.seq_len, cfg.d_model, cfg.n_layers)}, "inter": {}}
    return {"intra": fsdp2.collective_bytes_theory(shapes, world_size), "inter": {}}


def scope_rows(collectives: dict, theory: dict | None) -> list[dict]:
    """Rows 'link | collective | calls | group | measured bytes | theory bytes'."""
    rows = []
    for scope in ("intra", "inter"):
        for kind, entry in sorted(collectives.get(scope, {}).items()):
            rows.append({"link": f"{scope}-node", "collective": kind, "calls": entry["calls"],
                         "group": entry["group_size"], "bytes": entry["bytes"],
                         "theory": (theory or {}).get(scope, {}).get(kind, "")})
    return rows


def print_report(env, results: dict) -> None:
    if "bitwise" in results:
        env.print0("restarted run vs uninterrupted run: bitwise equal = "
                   f"{results['bitwise']['equal']} "
                   f"({results['bitwise']['tensors']} tensors)")
    if "grad_check" in results:
        check = results["grad_check"]
        env.print0(f"step {check['step']} gradients vs one process on the global batch: "
                   f"max |diff| = {check['max_abs_diff']:.2e} over {check['params']} parameters; "
                   f"loss {check['loss']:.6f} vs {check['reference_loss']:.6f}")
    env.print0("\nbytes per collective in one step, by link (payload; theory from "
               "fsdp_course.theory):")
    env.print0(table(scope_rows(results["collectives"], results.get("theory"))))
    if "flat" in results:
        env.print0("\nthe same step with plain FSDP over all ranks (a 1-D mesh across the nodes):")
        env.print0(table(scope_rows(results["flat"]["collectives"], results["flat"]["theory"])))
