"""Lesson 8's scale-out plumbing: which node each rank is on, the device meshes, a collective
counter that splits bytes into intra-node and inter-node, the tensor-parallel plan, and the DCP
checkpoint a restarted job resumes from.

torchrun numbers ranks node by node; each worker also gets ``GROUP_RANK`` (its agent's node
index) and ``LOCAL_WORLD_SIZE``. Two agents on one machine are two "nodes" to torchrun, with
the same rendezvous and rank layout as two real hosts.
"""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh

from fsdp_course import checkpoint as ckpt
from fsdp_course.measure import CommCounter, op_name, payload_bytes
from fsdp_course.model import lm_loss


def gather_ints(env, value: int) -> list[int]:
    """``value`` of every rank, in rank order (an all-gather: every rank calls it)."""
    mine = torch.tensor([value], device=env.device)
    every = [torch.zeros_like(mine) for _ in range(env.world_size)]
    dist.all_gather(every, mine)
    return [int(v.item()) for v in every]


def node_of_every_rank(env) -> list[int]:
    """GROUP_RANK of every rank: the node each rank runs on."""
    return gather_ints(env, int(os.environ.get("GROUP_RANK", "0")))


def build_mesh(env, replicas: int, tp: int):
    """The mesh FSDP shards over (and the tensor-parallel one, if any).

    replicas > 1: HSDP, (replicas, shards) = (nodes, ranks per node): replicate across the
        rows, shard within a row; a row is one node because torchrun numbers ranks node by node.
    tp > 1: (data, tensor): FSDP over "dp", tensor parallelism over "tp" (neighbouring ranks,
        the same node, as tensor parallelism talks in every layer).
    else: 1-D over all ranks (plain FSDP).
    Returns (mesh, fsdp_mesh, tp_mesh or None).
    """
    if replicas > 1:
        mesh = init_device_mesh(env.device.type, (replicas, env.world_size // replicas),
                                mesh_dim_names=("replicate", "shard"))
        return mesh, mesh, None
    if tp > 1:
        mesh = init_device_mesh(env.device.type, (env.world_size // tp, tp),
                                mesh_dim_names=("dp", "tp"))
        return mesh, mesh["dp"], mesh["tp"]
    mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("shard",))
    return mesh, mesh, None


def tensor_parallel_mlp(model, tp_mesh) -> None:
    """Megatron's MLP split on every block: ``fc`` column-wise (each rank computes a slice of
    the hidden units), ``proj`` row-wise (partial sums, all-reduced): one all-reduce per MLP in
    forward and one in backward. Attention stays replicated: the course model fuses q, k, v in
    one Linear, and a column split of that would cut across q/k/v instead of across heads."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in model.blocks:
        parallelize_module(block.mlp, tp_mesh, {"fc": ColwiseParallel(), "proj": RowwiseParallel()})


FUNCTIONAL = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
              "reduce_scatter_tensor": "reduce_scatter"}


def _group_ranks(args) -> list[int] | None:
    from torch.distributed.distributed_c10d import _resolve_process_group

    for arg in args:
        if isinstance(arg, str) and not arg.isalpha():  # a functional collective's group name
            try:
                return dist.get_process_group_ranks(_resolve_process_group(arg))
            except (RuntimeError, ValueError, KeyError):
                continue
        if isinstance(arg, torch.ScriptObject):
            try:
                return dist.get_process_group_ranks(dist.ProcessGroup.unbox(arg))
            except RuntimeError:  # another custom class (ReduceOp, Work)
                continue
    return None


class ScopedCommCounter(CommCounter):
    """``CommCounter`` that also files each collective under the link it uses: ``intra``
    (every rank of its group on one node) or ``inter`` (the group spans nodes). It also sees
    the functional collectives DTensor uses for tensor parallelism (``_c10d_functional``).
    Payload as ``CommCounter`` counts it: the full tensor gathered, scattered or reduced."""

    def __init__(self, node_of_rank: list[int]):
        self.node_of_rank = node_of_rank
        super().__init__()

    def reset(self) -> None:
        super().reset()
        self.scoped: dict[str, dict[str, dict[str, int]]] = {"intra": {}, "inter": {}}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::")[-1].split(".")[0]
        if func.namespace == "c10d" and name not in ("wait", "barrier", "monitored_barrier"):
            self._file(op_name(func), payload_bytes(op_name(func), args), args)
        elif func.namespace == "_c10d_functional" and name in FUNCTIONAL:
            kind, tensor = FUNCTIONAL[name], args[0]
            size = tensor.numel() * tensor.element_size()
            self._file(kind, size * args[1] if kind == "all_gather" else size, args)
            self.record(kind, size)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _file(self, kind: str, num_bytes: int, args) -> None:
        ranks = _group_ranks(args) or list(range(len(self.node_of_rank)))
        scope = "intra" if len({self.node_of_rank[r] for r in ranks}) == 1 else "inter"
        entry = self.scoped[scope].setdefault(kind,
                                              {"calls": 0, "bytes": 0, "group_size": len(ranks)})
        entry["calls"] += 1
        entry["bytes"] += num_bytes

    def bytes_by_scope(self) -> dict:
        return {scope: {kind: v["bytes"] for kind, v in kinds.items()}
                for scope, kinds in self.scoped.items()}


def group_shapes(model) -> list[list[list[int]]]:
    """Parameter shapes grouped as fully_shard groups them: the root's own first, then one list
    per block (the layout ``theory.fsdp2.collective_bytes_theory`` takes)."""
    blocks = [[list(p.shape) for p in block.parameters()] for block in model.blocks]
    in_blocks = {id(p) for block in model.blocks for p in block.parameters()}
    root = [list(p.shape) for p in model.parameters() if id(p) not in in_blocks]
    return [root, *blocks]


def placements_table(model) -> list[dict]:
    """The DTensor placements, mesh and local shape on this rank of the root's parameters and
    the first block's (the other blocks repeat the first)."""
    rows = []
    for name, param in model.named_parameters():
        if hasattr(param, "placements") and (name.startswith("blocks.0.")
                                             or not name.startswith("blocks.")):
            rows.append({"name": name, "placements": ", ".join(map(str, param.placements)),
                         "mesh": str(param.device_mesh.mesh.tolist()),
                         "global": list(param.shape), "local": list(param.to_local().shape)})
    return rows


def nothing():
    from contextlib import nullcontext

    return nullcontext()


def validate(cfg, env) -> None:
    """Bad layouts: one line (CourseError), never a stack trace from DeviceMesh."""
    from fsdp_course.dist import CourseError

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


def grad_check(model, data, cfg, env, step: int) -> dict:
    """This step's gradients of the sharded model vs one process on the whole global batch,
    from the same weights (gathered from the shards: works after a resume too)."""
    import logging

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from fsdp_course.model import GPT

    # Gathering TP x FSDP shards logs a warning per tensor ("2 sequential all_gather"): noise here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    reference = GPT(cfg.model_config(data.vocab_size)).to(env.device)
    reference.load_state_dict(full)
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
    from fsdp_course.dist import mean_over_ranks  # tensor-parallel partners hold the same loss

    return {"step": step, "max_abs_diff": worst, "params": len(list(reference.parameters())),
            "loss": mean_over_ranks(loss), "reference_loss": reference_loss.item()}


def measure_flat(cfg, env, reference, data, nodes, mesh, shapes) -> dict:
    """One step of plain fully_shard over all ranks (1-D mesh), bytes split by link."""
    from torch.distributed.fsdp import fully_shard

    from fsdp_course.theory import hsdp

    flat_mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("all",))
    model = copy.deepcopy(reference)
    for block in model.blocks:
        fully_shard(block, mesh=flat_mesh)
    fully_shard(model, mesh=flat_mesh)
    counter = ScopedCommCounter(nodes)
    x, y = data.batch(0, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
    with counter:
        lm_loss(model(x), y).backward()
    per_node = env.world_size // len(set(nodes))
    return {"collectives": counter.scoped,
            "theory": hsdp.flat_collective_bytes(shapes, len(set(nodes)), per_node)}


def theory_for(cfg, world_size: int, shapes) -> dict:
    """The payload bytes per link the measured step should show (``fsdp_course.theory``)."""
    from fsdp_course.theory import fsdp2, hsdp

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


def save_checkpoint(root, model, optimizer, step, env):
    model_sd, optim_sd = get_state_dict(model, optimizer)  # this rank's DTensor shards
    # written to a temporary folder, renamed into place once all ranks wrote
    with ckpt.atomic_dir(ckpt.step_dir(root, step), env.is_rank0) as tmp:
        dcp.save({"model": model_sd, "optim": optim_sd, "step": step}, checkpoint_id=tmp)


def load_checkpoint(path, model, optimizer) -> int:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return state["step"]


def print_report(env, results: dict) -> None:
    from fsdp_course.report import table

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
