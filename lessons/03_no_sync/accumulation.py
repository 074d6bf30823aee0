"""Measuring gradient accumulation with FSDP (lesson 3): the gradient bytes a rank holds between
micro-batches, the one-big-batch reference, and the comparison of every rank's gradient with
it. What the measurements should be (bytes saved, memory held): ``fsdp_course.theory.accumulation``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

from fsdp_course.measure import nbytes

# --- measurement -------------------------------------------------------------------------------

def _fsdp2_params(model: nn.Module):
    """FSDP2's per-parameter records (``FSDPParam``), one per original parameter."""
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        group = get_state()._fsdp_param_group
        if group is not None:
            yield from group.fsdp_params


def held_grad_bytes(model: nn.Module) -> dict:
    """Bytes of gradients this rank holds right now, counted from the tensors:
    ``{"sharded": ..., "unsharded": ...}``.

    Classic FSDP keeps a unit's gradient in its flat parameter's ``.grad``: the shard's size
    after a reduce-scatter, the full unsharded size while ``no_sync()`` skips it. FSDP2 keeps
    sharded gradients on the DTensor parameters and, while gradient sync is off, unsharded
    ones on its private unsharded parameters.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    sharded = unsharded = 0
    for module in FSDP.fsdp_modules(model):
        handle = module._handle
        if handle is None or handle.flat_param.grad is None:
            continue
        flat_param = handle.flat_param
        if flat_param.grad.numel() == flat_param.numel():
            sharded += nbytes(flat_param.grad)
        else:
            unsharded += nbytes(flat_param.grad)
    for fsdp_param in _fsdp2_params(model):
        for grad in (getattr(getattr(fsdp_param, "_unsharded_param", None), "grad", None),
                     fsdp_param.unsharded_accumulated_grad):
            unsharded += nbytes(grad)
        sharded += nbytes(fsdp_param.sharded_param.grad)
    return {"sharded": sharded, "unsharded": unsharded}


def counting(loss_fn, model: nn.Module, held: dict):
    """``loss_fn``, which first records in ``held`` the most gradient bytes of each kind that
    ``model`` holds: it runs between one micro-batch's backward and the next."""
    def counting_loss(logits, targets):
        for kind, value in held_grad_bytes(model).items():
            held[kind] = max(held[kind], value)
        return loss_fn(logits, targets)
    return counting_loss


def _fsdp1_unit_prefixes(model: nn.Module):
    """(FQN prefix in the unwrapped model, flat parameter) for each classic FSDP unit."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for name, module in model.named_modules():
        if isinstance(module, FSDP) and module._handle is not None:
            clean = ".".join(part for part in name.split(".") if part != "_fsdp_wrapped_module")
            yield (clean + "." if clean else ""), module._handle.flat_param


def big_batch_reference(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]],
                        loss_fn=None) -> nn.Module:
    """A copy of ``model`` (unwrapped, before sharding) holding the gradient of ONE batch made
    of ``batches`` (every rank's micro-batches of a step, ``(x, y)`` each): its mean loss counts
    every sequence once. What accumulation over micro-batches must reproduce."""
    from fsdp_course.model import lm_loss

    reference = copy.deepcopy(model)
    x, y = (torch.cat(parts) for parts in zip(*batches))
    (loss_fn or lm_loss)(reference(x), y).backward()
    return reference


@torch.no_grad()
def compare_with_reference(model: nn.Module, reference: nn.Module, rank: int,
                           world_size: int) -> dict:
    """Compare the gradient this rank holds with the reference's (an unwrapped model that ran
    the same data as one big batch), on the part of it this rank owns.

    Returns ``{"held": "sharded" | "unsharded" | "none", "max_abs_diff", "max_abs_ref",
    "rel_err", "scale"}``: ``rel_err = max|g - g_ref| / max|g_ref|`` and ``scale`` the
    least-squares factor ``<g, g_ref> / <g_ref, g_ref>`` (K when each micro-batch's loss was not
    divided by K; far from 1 when ranks never averaged). Gradients of the wrong size (classic
    FSDP's unsharded ``.grad`` after ``no_sync``) are compared with the whole reference.
    """
    ref = dict(reference.named_parameters())
    pairs, kinds = [], set()
    for prefix, flat_param in _fsdp1_unit_prefixes(model):
        full = torch.cat([ref[prefix + fqn].grad.flatten() for fqn in flat_param._fqns])
        if flat_param.grad is None:
            kinds.add("none")
            continue
        if flat_param.grad.numel() == flat_param.numel():  # the rank's shard of the padded flat
            shard = flat_param.numel()
            padded = torch.nn.functional.pad(full, (0, shard * world_size - full.numel()))
            pairs.append((flat_param.grad, padded[rank * shard:(rank + 1) * shard]))
            kinds.add("sharded")
        else:
            pairs.append((flat_param.grad[:full.numel()], full))
            kinds.add("unsharded")
    for fsdp_param in _fsdp2_params(model):
        sharded = fsdp_param.sharded_param
        ref_grad = ref[fsdp_param._param_fqn].grad
        if sharded.grad is None:
            kinds.add("none")
            continue
        from torch.distributed.tensor import distribute_tensor
        # Every rank computed the same reference: shard it locally, no communication.
        mine = distribute_tensor(ref_grad, sharded.device_mesh, sharded.placements,
                                 src_data_rank=None).to_local()
        pairs.append((sharded.grad.to_local(), mine))
        kinds.add("sharded")
    if not pairs:
        return {"held": "none", "max_abs_diff": None, "max_abs_ref": None, "rel_err": None,
                "scale": 0.0}
    got = torch.cat([g.flatten().float() for g, _ in pairs])
    want = torch.cat([r.flatten().float() for _, r in pairs])
    diff = (got - want).abs().max().item()
    ref_max = want.abs().max().item()
    return {
        "held": "unsharded" if "unsharded" in kinds
        else ("none" if "none" in kinds and len(kinds) == 1
                                                          else "sharded"),
        "missing": "none" in kinds,
        "max_abs_diff": diff, "max_abs_ref": ref_max, "rel_err": diff / ref_max,
        "scale": (got @ want).item() / (want @ want).item(),
    }
