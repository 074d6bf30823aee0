"""Estimate one rank's memory for a model too big for this machine, without allocating it.

    python lessons/07_memory/estimate.py                        # 7B-class GPT, 8 ranks, bf16
    python lessons/07_memory/estimate.py --world-size 16 --batch 2 --json

One process plays rank 0 of ``--world-size`` ranks, with three of PyTorch's own tools:

- the "fake" process group (``torch.testing._internal.distributed.fake_pg``): collectives
  return at once without talking to anyone, so ``fully_shard`` can shard over 8 ranks that do
  not exist;
- ``FakeTensorMode``: every tensor has a shape, a dtype and a device but no storage, so a
  model of 7 billion parameters costs only its Python objects;
- ``FSDPMemTracker``: counts the bytes each tensor *would* hold, by category, over one
  training step (forward, backward, optimizer step).

What it counts is tensor bytes, on CPU tensors: the bytes a rank's tensors would hold. A GPU adds
what no tensor shows: the CUDA caching allocator's rounding and reserved segments, the CUDA
context, kernels' workspaces (cuBLAS, attention), NCCL's buffers, and CUDA kernels may save other
tensors for backward than the CPU kernels counted here.

Caveats: build the device mesh *outside* FakeTensorMode; use ``foreach=False`` for the
optimizer (under fake tensors the ``foreach`` and ``fused`` steps report temporaries far larger
than real ones); the optimizer state is created up front, as AdamW's first step would create
it (two fp32 tensors per parameter), so that the measured step is a steady-state one. Nothing
here times anything: fake tensors have no speed.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
import warnings

START = time.perf_counter()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from fsdp_course.model import GPT, ModelConfig, lm_loss  # noqa: E402
from fsdp_course.plan import MODELS  # noqa: E402

warnings.filterwarnings("ignore", message=".*returned a view tensor")


def estimate(shape, world_size: int, batch: int, mixed_precision: bool,
             reshard: bool = True) -> dict:
    """Peak bytes of rank 0 by category (FSDPMemTracker), for one FULL_SHARD step."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    from fsdp_course.measure_fsdp2 import CategoryPeakTracker

    class StepPeakTracker(CategoryPeakTracker):
        def _update_peak_stats(self, peak_state) -> None:
            # Only the step's own peak: the tracker also keeps every module's peak (a loop over
            # all modules after every operator), which this estimate does not read.
            for dev, dev_snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < dev_snap["Total"]:
                    self._peak_mem[dev] = dev_snap["Total"]
                    self._peak_mem_snap[dev] = dict(dev_snap)

    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    mesh = init_device_mesh("cpu", (world_size,))  # outside FakeTensorMode
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if mixed_precision else MixedPrecisionPolicy()
    with FakeTensorMode():
        with torch.device("meta"):
            model = GPT(ModelConfig(shape.vocab, shape.seq, shape.hidden, shape.layers,
                                    shape.heads))
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        model.to_empty(device="cpu")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        for p in model.parameters():  # what AdamW's first step creates
            optimizer.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": torch.zeros_like(p)}
        x = torch.randint(0, shape.vocab, (batch, shape.seq))
        y = torch.randint(0, shape.vocab, (batch, shape.seq))
        tracker = StepPeakTracker(model, optimizer)
        with tracker:
            loss = lm_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        peaks = tracker.category_peaks()
        at_peak = {str(getattr(k, "value", k)): v
                   for snap in tracker.get_tracker_snapshot("peak").values() for k,
                   v in snap.items()}
    dist.destroy_process_group()
    return {"peak": peaks["peak"], "category_max": peaks, "at_peak": at_peak}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="course-gpt-7b", choices=sorted(MODELS))
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1, help="sequences per rank")
    parser.add_argument("--precision", default="bf16-mixed", choices=("fp32", "bf16-mixed"))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.world_size < 1 or args.batch < 1:
        parser.error("--world-size and --batch must be >= 1")
    shape = MODELS[args.model]()
    began = time.perf_counter()
    result = estimate(shape, args.world_size, args.batch, args.precision == "bf16-mixed")
    result.update(model=args.model, num_params=shape.num_params, world_size=args.world_size,
                  batch=args.batch, precision=args.precision,
                  seconds=time.perf_counter() - began,
                  seconds_with_import=time.perf_counter() - START,
                  max_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if args.json:
        print(json.dumps(result))
        return
    gib = 1024 ** 3
    print(f"{args.model}: {shape.num_params / 1e9:.2f}B parameters, rank 0 of {args.world_size}, "
          f"batch {args.batch} x {shape.seq}, {args.precision}")
    for key, value in sorted(result["at_peak"].items(), key=lambda kv: -kv[1]):
        if value:
            print(f"  {key:16s} {value / gib:8.3f} GiB at the peak")
    print(f"peak {result['peak'] / gib:.3f} GiB per rank; estimated in {result['seconds']:.1f} s "
          f"using {result['max_rss_bytes'] / 2 ** 20:.0f} MiB of this machine's memory")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
