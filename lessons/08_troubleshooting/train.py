"""Lesson 8: when it breaks, and beyond one machine (FSDP2 on 1-D, HSDP and data x tensor meshes).

    bash launch/lesson8.sh                                        # healthy: fully_shard on 2 ranks
    COURSE_TIMEOUT_S=6 bash launch/lesson8.sh --fault uneven-data # a rank skips a collective: hang
    TORCH_DISTRIBUTED_DEBUG=DETAIL bash launch/lesson8.sh --fault uneven-data   # names the mismatch
    COURSE_TIMEOUT_S=6 bash launch/lesson8.sh --fault rank-branch # collective under `if rank == 0`
    bash launch/lesson8.sh --fault oom --memory-limit-mib 48      # one rank's batch is too big: OOM
    # two "nodes" on this machine, HSDP: replicate across nodes, shard within (run both lines):
    NNODES=2 NODE_RANK=0 MASTER_ADDR=127.0.0.1 bash launch/lesson8.sh --replicas 2 --compare-flat
    NNODES=2 NODE_RANK=1 MASTER_ADDR=127.0.0.1 bash launch/lesson8.sh --replicas 2 --compare-flat
    # node 1's workers killed at step 5; both nodes restart from the last checkpoint:
    MAX_RESTARTS=1 NPROC=1 NNODES=2 NODE_RANK=0|1 MASTER_ADDR=127.0.0.1 bash launch/lesson8.sh \
        --replicas 2 --ckpt-every 2 --kill-node-at-step 5
    NPROC=4 bash launch/lesson8.sh --tp 2                         # 2-D mesh: FSDP x tensor parallel
    COURSE_TIMEOUT_S=10 bash launch/lesson8.sh --steps 4 \
        --eval-module lessons/08_troubleshooting/broken_evaluate.py

While a job hangs, `py-spy dump --pid PID` on each rank's process shows where it waits.
"""

import contextlib
import copy
import os
import shutil
import signal
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the lesson's own modules
import faults
import runs
import scale
from fsdp_course import checkpoint as ckpt
from fsdp_course.config import TrainConfig, describe, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import distributed, mean_over_ranks
from fsdp_course.learner import load_learner
from fsdp_course.measure import MiB, state_bytes
from fsdp_course.model import GPT, lm_loss
from fsdp_course.report import MetricLogger, write_metrics

# The model returns logits that are a view: harmless here (nothing writes into them in place).
warnings.filterwarnings("ignore", message=".*returned a view tensor")


@dataclass
class Config(TrainConfig):
    steps: int = 6
    d_model: int = 64  # small: here the failures and the layouts are the point, not the model
    n_layers: int = 2
    log_every: int = 1
    fault: str = field(default="none", metadata={
        "choices": faults.FAULTS, "help": "reproduce a failure"})
    fault_step: int = field(default=3, metadata={"help": "the step at which the fault strikes"})
    memory_limit_mib: float = field(default=0, metadata={
        "help": "per-rank memory budget over what is used after step 0 (0: none)"})
    replicas: int = field(default=1, metadata={
        "help": "HSDP: (replicas, ranks/replicas) mesh; use the number of nodes"})
    compare_flat: bool = field(default=False, metadata={
        "help": "also measure one step of plain FSDP over all ranks"})
    tp: int = field(default=1, metadata={"help": "tensor-parallel degree: a (data, tensor) mesh"})
    ckpt_every: int = field(default=0, metadata={"help": "DCP checkpoint every N steps (0: never)"})
    ckpt_dir: str = field(default="runs/lesson8/ckpt", metadata={"help": "where checkpoints go"})
    kill_node_at_step: int | None = field(default=None, metadata={
        "help": "the last node's workers SIGKILL themselves once, at this step"})
    eval_module: str | None = field(default=None, metadata={
        "help": "a .py file with evaluate(model, batch, env), run every 2 steps"})


def build(cfg, reference, fsdp_mesh, tp_mesh):
    # --- model: a copy of the reference, so every rank and every layout starts identical ------
    model = copy.deepcopy(reference)
    if tp_mesh is not None:  # tensor parallelism first: fully_shard then shards the TP shards
        scale.tensor_parallel_mlp(model, tp_mesh)
    # --- shard: one unit per block, then the root; the mesh decides FSDP / HSDP / 2-D --------
    for block in model.blocks:
        fully_shard(block, mesh=fsdp_mesh)
    fully_shard(model, mesh=fsdp_mesh)
    # --- optimizer: after sharding, so it holds the DTensor shards ---------------------------
    return model, torch.optim.AdamW(model.parameters(), lr=cfg.lr)


def train(cfg, env, data, model, optimizer, start, counter=None, logger=None, save=True,
          evaluate=None, restart=0):
    """The loop, with the lesson's faults where real jobs meet them; returns the last eval."""
    dp_size, dp_rank = env.world_size // cfg.tp, env.rank // cfg.tp  # TP partners: same batch
    my_steps = faults.steps_for_rank(cfg.fault, cfg.fault_step, cfg.steps, env.rank, env.world_size)
    loss_value, eval_value = float("nan"), None
    for step in range(start, my_steps):  # uneven-data: the last rank's data ends early (BUG)
        # not in the reference
        if save and faults.node_dies_now(step, cfg.kill_node_at_step, restart):
            os.kill(os.getpid(), signal.SIGKILL)  # a node dies: every worker of the last agent
        rows = cfg.batch_size * faults.batch_scale(cfg.fault, cfg.fault_step, step, env.rank,
                                                   env.world_size)
        x, y = data.batch(step, dp_rank, dp_size, rows, cfg.seq_len, env.device)
        start_time = time.perf_counter()
        watched = counter is not None and step == start  # bytes are counted in the first step only
        with counter if watched else contextlib.nullcontext():
            loss = lm_loss(model(x), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cfg.fault == "rank-branch" and step == cfg.fault_step:
            if env.is_rank0:  # BUG: a collective only rank 0 calls ("the global loss, for the log")
                loss_value = mean_over_ranks(loss)
        else:
            loss_value = mean_over_ranks(loss)
        if logger is not None:
            logger.log(step, loss_value, (time.perf_counter() - start_time) * 1e3,
                       sum(state_bytes(model, optimizer).values()) / MiB,
                       counter.total_bytes / MiB if watched else None, last=step == cfg.steps - 1)
        if evaluate is not None and step % 2 == 1:  # the exercise: every rank calls it
            eval_value = evaluate(model, runs.eval_batch(data, step, env, cfg), env)
            env.print0(f"      held-out loss after step {step}: {eval_value}")
        if save and cfg.ckpt_every and (step + 1) % cfg.ckpt_every == 0:
            scale.save_checkpoint(cfg.ckpt_dir, model, optimizer, step + 1, env)
    return eval_value


@record  # writes this rank's exception into torchrun's error file: the root-cause report names it
def run(cfg, env):
    # --- setup -------------------------------------------------------------------------------
    ckpt.quiet_state_dict_warnings()
    runs.validate(cfg, env)
    nodes = scale.node_of_every_rank(env)
    # Each agent counts only its own workers' failures: a node restarted because ANOTHER node
    # failed can read 0. Restarted or not is decided by all ranks together.
    restart_counts = scale.gather_ints(env, int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    restart = max(restart_counts)
    mesh, fsdp_mesh, tp_mesh = scale.build_mesh(env, cfg.replicas, cfg.tp)
    env.print0(f"lesson 8 | {env.world_size} ranks on {len(set(nodes))} node(s) {nodes} | "
               f"{env.backend} | mesh {tuple(mesh.shape)} {mesh.mesh_dim_names} | attempt "
               f"{restart} | {describe(cfg)}")
    data = load_data(cfg.data, seed=cfg.seed)
    torch.manual_seed(cfg.seed)
    reference = GPT(cfg.model_config(data.vocab_size)).to(env.device)
    model, optimizer = build(cfg, reference, fsdp_mesh, tp_mesh)
    results = {"nodes": nodes, "restart_count": restart, "restart_counts": restart_counts,
               "mesh": {"shape": list(mesh.shape), "names": list(mesh.mesh_dim_names)},
               "placements": scale.placements_table(model)}

    # --- checkpoint: a restarted job resumes from the newest complete checkpoint ------------------
    start = 0
    if restart > 0 and ckpt.latest(cfg.ckpt_dir):
        start = scale.load_checkpoint(ckpt.latest(cfg.ckpt_dir), model, optimizer)
        env.print0(f"resumed from {ckpt.latest(cfg.ckpt_dir)} (step {start})")
    elif cfg.ckpt_every and env.is_rank0:  # a fresh run: forget the checkpoints of earlier runs
        shutil.rmtree(cfg.ckpt_dir, ignore_errors=True)
    dist.barrier()  # every rank calls it (whatever the branch above did) before anyone saves
    results["resumed_from"] = start

    # --- loop --------------------------------------------------------------------------------
    counter, logger = scale.ScopedCommCounter(nodes), MetricLogger(env, cfg.log_every)
    results["grad_check"] = runs.grad_check(model, data, cfg, env, start)
    if cfg.memory_limit_mib:
        results["memory_limit"] = faults.limit_memory(cfg.memory_limit_mib, env.device)
    evaluate = load_learner(cfg.eval_module, "--eval-module", "evaluate(model, batch, env)"
                            ).evaluate if cfg.eval_module else None
    eval_value = train(cfg, env, data, model, optimizer, start, counter, logger, evaluate=evaluate,
                       restart=restart)
    dist.barrier()  # every rank has finished training before the report
    if evaluate is not None:  # the exercise: rank 0's value vs one process on the global batch
        results["eval"] = runs.compare_eval(eval_value, model, data, cfg, env)

    # --- report ------------------------------------------------------------------------------
    results["collectives"] = counter.scoped
    shapes = scale.group_shapes(reference)
    results["theory"] = runs.theory_for(cfg, env.world_size, shapes)  # fsdp_course.theory
    if cfg.compare_flat:
        results["flat"] = scale.measure_flat(cfg, env, reference, data, nodes, mesh, shapes)
    if cfg.ckpt_every:  # the same run, uninterrupted, in this process: bitwise equal?
        fresh, fresh_opt = build(cfg, reference, fsdp_mesh, tp_mesh)
        train(cfg, env, data, fresh, fresh_opt, 0, save=False)
        results["bitwise"] = ckpt.compare_fingerprints(ckpt.fingerprint(model, optimizer),
                                                       ckpt.fingerprint(fresh, fresh_opt))
    runs.print_report(env, results)
    write_metrics(cfg.metrics, "lesson8", env, cfg, logger.history, results)


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        try:
            run(cfg, env)
        except RuntimeError as exc:
            if faults.is_collective_error(exc):  # which collective was this rank last waiting in?
                faults.print_flight_recorder(env.rank)
            raise


if __name__ == "__main__":
    main()
