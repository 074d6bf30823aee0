"""Lesson 8: the course model under Hugging Face accelerate's FSDP config.

    accelerate launch --config_file lessons/08_troubleshooting/accelerate_fsdp.yaml \\
        lessons/08_troubleshooting/accelerate_fsdp.py --metrics runs/lesson8/accelerate.json

Asks accelerate what it set up. Where accelerate runs FSDP (GPUs), ``accelerator.prepare``
shards the model. Where it does not (CPU ranks: accelerate 1.x enables FSDP only on
accelerator devices), it says so, then applies the same config by hand: accelerate's own
``FullyShardedDataParallelPlugin`` (built from the variables ``accelerate launch`` set) turned
into the course's ``fully_shard`` calls. Either way: per-rank bytes vs the FSDP2 theory.
A script of its own, with its config ``accelerate_fsdp.yaml``: what a learner runs under
``accelerate launch``, beside ``train.py`` (which torchrun runs).
"""

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ecosystem
from fsdp_course.config import TrainConfig, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import CourseError, distributed, mean_over_ranks
from fsdp_course.measure import state_bytes
from fsdp_course.model import GPT, lm_loss
from fsdp_course.report import table, write_metrics
from fsdp_course.theory import fsdp2 as fsdp2_theory


@dataclass
class Config(TrainConfig):
    steps: int = 2
    config: str = field(default=str(Path(__file__).with_name("accelerate_fsdp.yaml")), metadata={
        "help": "accelerate config file (used when not started by accelerate launch)"})


def main() -> None:
    cfg = parse_config(Config, __doc__)
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    with distributed(seed=cfg.seed) as env:
        # --- setup: what does accelerate make of this launch? ---------------------------------
        accelerator = Accelerator()  # after our process group exists: accelerate reuses it
        chose = {"distributed_type": str(accelerator.state.distributed_type),
                 "num_processes": accelerator.state.num_processes,
                 "processes_started": env.world_size}
        if accelerator.state.distributed_type == DistributedType.FSDP:  # GPUs: accelerate shards
            raise CourseError("accelerate runs FSDP here: use accelerator.prepare(model, "
                              "optimizer) "
                              "(this script's CPU path maps the same config by hand)")
        if chose["num_processes"] != env.world_size:
            env.print0(f"PROBLEM DETECTED: accelerate set up {chose['distributed_type']} with "
                       f"num_processes={chose['num_processes']} in each of {env.world_size} "
                       "processes: "
                       f"with accelerator.prepare each would train its own copy, no FSDP, no error")
        # --- model: the course GPT; the plugin accelerate built from the same config ---------
        from_launch = "FSDP_VERSION" in os.environ  # accelerate launch set FSDP_* already
        plugin = (FullyShardedDataParallelPlugin() if from_launch
                  else ecosystem.accelerate_plugin(cfg.config))
        data = load_data(cfg.data, seed=cfg.seed)
        torch.manual_seed(cfg.seed)
        model = GPT(cfg.model_config(data.vocab_size)).to(env.device)
        shapes = [list(p.shape) for p in model.parameters()]
        # --- shard: the plugin's settings as fully_shard calls (ecosystem.ACCELERATE_KEYS) ----
        kwargs = ecosystem.fully_shard_kwargs(plugin)
        targets = ecosystem.wrap_targets(plugin)
        units = [m for m in model.modules() if type(m).__name__ in targets]
        for module in units:
            fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        # --- loop ----------------------------------------------------------------------------
        for step in range(cfg.steps):
            x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len,
                              env.device)
            loss = lm_loss(model(x), y)
            loss.backward()
            held = state_bytes(model, optimizer) if step else None
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            env.print0(f"step {step} | loss {mean_over_ranks(loss):.4f}")
        # --- report ------------------------------------------------------------------------
        held = state_bytes(model,
                           optimizer) | {"grads": held["grads"]} if held else state_bytes(model,
                                                                                          optimizer)
        expected = fsdp2_theory.state_bytes_theory(shapes, env.world_size, env.rank)
        rows = [{"": "measured (rank 0)", **held}, {"": "FSDP2 theory", **expected}]
        env.print0(f"accelerate chose: {chose}")
        env.print0(f"plugin: fsdp_version={plugin.fsdp_version} "
                   f"reshard_after_forward={plugin.reshard_after_forward} "
                   f"wrap={targets} state_dict_type={plugin.state_dict_type} -> "
                   f"fully_shard({kwargs}) "
                   f"on {len(units)} {'/'.join(targets)} modules + the root")
        env.print0(table(rows))
        write_metrics(cfg.metrics, "lesson8-accelerate", env, cfg, [], {
            "accelerate": chose, "units": len(units) + 1,
            "kwargs": {k: str(v) for k, v in kwargs.items()},
            "state_dict_type": str(plugin.state_dict_type), "measured": held, "theory": expected})


if __name__ == "__main__":
    main()
