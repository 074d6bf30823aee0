"""Lesson 6: the silent bugs. Each runs without an error, the loss falls, and the model is wrong.

A. parameters initialised differently on each rank (initialisation.py)
B. BatchNorm statistics under FSDP (batchnorm.py)
C. mixed precision: which dtype each tensor has, and what that costs (mixed_precision.py)

Every variant is compared with a single-process run on the global batch (the reference). All
variants of the chosen parts run in one launch (each torchrun start costs seconds).

    bash launch/lesson6.sh                                   # all parts, all variants, 2 ranks
    bash launch/lesson6.sh --parts init --init per-rank-seed,ddp,broadcast
    bash launch/lesson6.sh --parts batchnorm --bn batchnorm,allreduce-bn --bn-batch-sizes 2,8,32
    NPROC=4 bash launch/lesson6.sh --parts precision --precision fsdp2:fp32/fp32,fsdp2:fp32/bf16
    bash launch/lesson6.sh --parts exercise --exercise my_loop.py     # the exercise, checked
    torchrun --standalone --nproc-per-node=2 lessons/06_silent_bugs/train.py   # the same
"""

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import batchnorm
import exercise
import initialisation
import mixed_precision
import runs
from fsdp_course.config import TrainConfig, describe, list_flag, list_help, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import distributed
from fsdp_course.learner import load_learner
from fsdp_course.report import write_metrics

PARTS = ("init", "batchnorm", "precision", "exercise")
HERE = Path(__file__).resolve().parent
# FSDP2 initialises DTensor shards with the local generator on CPU (part A measures what that
# does); the warning says as much, once per parameter.
warnings.filterwarnings("ignore", message="DTensor random operators")
warnings.filterwarnings("ignore", message=".*returned a view tensor")  # the GPT's logits: harmless


@dataclass
class Config(TrainConfig):
    steps: int = field(default=6, metadata={"help": "optimizer steps per variant"})
    d_model: int = field(default=64, metadata={"help": "part A's GPT width"})
    n_layers: int = field(default=2, metadata={"help": "part A's GPT blocks"})
    seq_len: int = field(default=32, metadata={"help": "part A's tokens per sequence"})
    log_every: int = field(default=100, metadata={"help": "print a metric line every N steps"})
    parts: tuple = field(default=PARTS, metadata={
        "parse": list_flag("Parts", PARTS), "help": list_help("parts to run", PARTS)})
    init: tuple = field(default=initialisation.INIT_VARIANTS, metadata={
        "parse": list_flag("Inits", initialisation.INIT_VARIANTS),
        "help": list_help("part A variants", initialisation.INIT_VARIANTS)})
    bn: tuple = field(default=batchnorm.BN_VARIANTS, metadata={
        "parse": list_flag("Norms", batchnorm.BN_VARIANTS),
        "help": list_help("part B variants", batchnorm.BN_VARIANTS)})
    bn_batch: int = field(default=8, metadata={"help": "part B: samples per rank per step"})
    bn_batch_sizes: tuple = field(default=(2, 4, 8, 16, 32), metadata={
        "parse": runs.BatchSizes,
        "help": "part B: per-rank batch sizes of the error sweep (one plain-BatchNorm step each)"})
    precision: tuple = field(default=runs.DEFAULT_SPECS, metadata={
        "parse": runs.Specs,
        "help": "part C: comma-separated API:PARAM/REDUCE[/BUFFER][+MOD...], API fsdp2|classic, "
                "dtypes fp32|bf16|fp16, BUFFER classic only, MOD scaler|nocast|unit "
                "(a GradScaler; features not cast: the dtype-mismatch bug; the MLP its own unit)"})
    precision_steps: int = field(default=20,
                                 metadata={"help": "part C: optimizer steps per variant"})
    global_batch: int | None = field(default=None, metadata={
        "help": "part C: samples per step over all ranks (default: 64, or the nearest multiple of "
                "the rank count; fixed, so N=2 and N=4 are comparable)"})
    exercise: str | None = field(default=None, metadata={
        "help": "the exercise: a .py file defining train(env, batches, steps, seed, inspect) "
                "(default: mystery_loop.py, the loop with the bug)"})


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup: the flags were checked by the config; what needs the world size, here ------
        inits, bns, sweep, specs = runs.plan(cfg, env.world_size)
        loop = load_learner(cfg.exercise or HERE / "mystery_loop.py", "--exercise",
                            "train(env, batches, steps, seed, inspect)"
                            ) if "exercise" in cfg.parts else None
        env.print0(f"lesson 6 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"{describe(cfg)}")
        results = {}

        if inits:  # --- A: initialisation across ranks ------------------------------------------
            data = load_data(cfg.data, seed=cfg.seed)
            model_cfg = cfg.model_config(data.vocab_size)
            ref = (initialisation.reference(cfg, env, data, model_cfg) if env.rank == 0
                   else {"init": {}})
            measured = [initialisation.run(v, cfg, env, data, model_cfg, ref) for v in inits]
            results["init"] = {"runs": measured, "reference_losses": ref.get("losses")}
            runs.print_initialisation(env, measured)
        if bns or sweep:  # --- B: BatchNorm ---------------------------------------------------
            results["batchnorm"] = batchnorm.run_all(bns, sweep, cfg, env)
            runs.print_batchnorm(env, cfg, results["batchnorm"])
        if specs:  # --- C: mixed precision ------------------------------------------------------
            results["precision"] = mixed_precision.run_all(specs, cfg, env)
            runs.print_mixed_precision(env, cfg, results["precision"])
        if loop is not None:  # --- the exercise ---------------------------------------------------
            results["exercise"] = exercise.run(loop, cfg, env)

        # --- report ----------------------------------------------------------------------------
        write_metrics(cfg.metrics, "lesson6", env, cfg, [], results)


if __name__ == "__main__":
    main()
