"""Beyond one machine (lesson 8): which node each rank is on, the device meshes (FSDP, HSDP, data x
tensor), the tensor-parallel plan, a collective counter that splits bytes into intra-node and
inter-node, plain FSDP over all nodes for contrast, and the DCP checkpoint a restarted job
resumes from.

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
