"""What the course's instruments cost: ms per training step with and without them.

The lesson scripts measure memory and traffic with ``CommCounter``, ``GatheredParamTracker``,
``activation_bytes`` and ``state_bytes``; they slow a step down, so lessons 1, 2, 3 and 5 let them
watch one step and report ms/step as the median of the others (``report.unwatched_ms``). This
shows what that buys. It trains lesson 1's setting (classic FSDP, FULL_SHARD, one unit per block)
and alternates plain steps with instrumented ones, so both see the same machine.

    torchrun --standalone --nproc-per-node=2 launch/overhead.py     # bash launch/bench.sh runs it
"""

import functools
import statistics
import time
from contextlib import ExitStack

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from fsdp_course.config import TrainConfig, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import distributed
from fsdp_course.measure import CommCounter, GatheredParamTracker, activation_bytes, state_bytes
from fsdp_course.model import GPT, Block, lm_loss


def step(model, optimizer, x, y, instrumented: bool) -> float:
    start = time.perf_counter()
    with ExitStack() as stack:
        if instrumented:
            stack.enter_context(CommCounter())
            stack.enter_context(GatheredParamTracker(model))
            stack.enter_context(activation_bytes(model))
        loss = lm_loss(model(x), y)
        loss.backward()
        if instrumented:
            state_bytes(model, optimizer)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    cfg = parse_config(TrainConfig, __doc__)
    with distributed(seed=cfg.seed) as env:
        data = load_data(cfg.data, seed=cfg.seed)
        model = FSDP(
            GPT(cfg.model_config(data.vocab_size)),
            auto_wrap_policy=functools.partial(
                transformer_auto_wrap_policy, transformer_layer_cls={Block}
            ),
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            device_id=env.device,
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        times = {False: [], True: []}
        for i in range(2 * cfg.steps + 2):
            x, y = data.batch(i, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
            instrumented = i % 2 == 1
            ms = step(model, optimizer, x, y, instrumented)
            if i >= 2:  # the first two steps warm up the allocator and the gloo buffers
                times[instrumented].append(ms)
        plain, watched = statistics.median(times[False]), statistics.median(times[True])
        env.print0(
            f"instrumentation overhead | {env.world_size} ranks | {cfg.steps} steps each | "
            f"plain {plain:.1f} ms/step | instrumented {watched:.1f} ms/step | "
            f"overhead {watched - plain:+.1f} ms ({(watched - plain) / plain:+.0%})"
        )


if __name__ == "__main__":
    main()
