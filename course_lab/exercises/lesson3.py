"""Lesson 3 exercise: write the gradient-accumulation loop ``accumulate(model, micro_batches,
loss_fn)`` for classic FSDP.

Checked in two stages:

1. In this process, on a stand-in model with a ``no_sync()`` that records which backward passes
   ran inside it: quick, specific feedback (and "not attempted yet" while the cell is untouched).
2. For real: the function is written to a file and run by ``bash launch/lesson3.sh --loop-file``
   under torchrun on FSDP-wrapped ranks; the script compares the accumulated gradient with one
   process that ran the same micro-batches as one big batch, and counts the reduce-scatter
   bytes. Both must be right: equal gradients, and one reduce-scatter per optimizer step.
"""

from __future__ import annotations

import inspect
import tempfile
import textwrap
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn as nn

from quizzes.exercise import exercise

# Written above the learner's function in the file the script loads.
PREAMBLE = "import torch\nfrom contextlib import nullcontext\n\n"


class RecordingModel(nn.Module):
    """A tiny linear model with classic FSDP's ``no_sync()`` API that records, for every
    backward pass, whether it ran inside ``no_sync()``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 1)
        self.in_no_sync = False
        self.backward_in_no_sync: list[bool] = []

    @contextmanager
    def no_sync(self):
        self.in_no_sync = True
        try:
            yield
        finally:
            self.in_no_sync = False

    def forward(self, x):
        out = self.linear(x)
        if out.requires_grad:
            out.register_hook(self._record)
        return out

    def _record(self, grad):
        self.backward_in_no_sync.append(self.in_no_sync)
        return grad


def _dry_run(learner_fn, accum: int) -> str | None:
    """None when the loop behaves on the stand-in model, else why not."""
    gen = torch.Generator().manual_seed(1)
    micro_batches = [(torch.randn(3, 4, generator=gen), torch.randn(3, 1, generator=gen))
                     for _ in range(accum)]
    model = RecordingModel()
    loss_fn = nn.functional.mse_loss
    learner_fn(model, micro_batches, loss_fn)

    reference = RecordingModel()
    x = torch.cat([x for x, _ in micro_batches])
    y = torch.cat([y for _, y in micro_batches])
    loss_fn(reference(x), y).backward()

    flags = model.backward_in_no_sync
    if len(flags) != accum:
        return (f"your loop ran backward {len(flags)} time(s) for {accum} micro-batches; run "
                "forward, loss and backward once per micro-batch.")
    if flags[-1]:
        return ("the last micro-batch ran its backward inside no_sync(): its gradients are never "
                "reduce-scattered (the lesson's pitfall). Sync on the last micro-batch.")
    if not any(flags):
        return (f"no backward ran inside model.no_sync(): the gradients are right but every "
                f"micro-batch reduce-scatters ({accum}x the bytes). Wrap all but the last in it.")
    if not all(flags[:-1]):
        skipped = [i for i, f in enumerate(flags[:-1]) if not f]
        return (f"micro-batch(es) {skipped} ran backward outside no_sync(): every micro-batch "
                "but the last should skip the sync.")
    got, want = model.linear.weight.grad, reference.linear.weight.grad
    if got is None:
        return "no gradient after your loop: call loss.backward() for each micro-batch."
    scale = (got * want).sum() / (want * want).sum()
    if torch.allclose(got, want, rtol=1e-5, atol=1e-7):
        return None
    if abs(scale.item() - accum) < 1e-3 * accum:
        return (f"the gradient is {accum}x the big batch's: the backward passes add up, so divide "
                f"each micro-batch's loss by the number of micro-batches ({accum}).")
    return (f"the gradient differs from the big batch's (scale {scale.item():.3f}): average the "
            "loss over micro-batches, loss_fn(model(x), y) / len(micro_batches).")


@exercise("lesson3", "ex_accumulate")
def check_accumulate(learner_fn, accum: int = 4, nproc: int = 2,
                     timeout: float = 300) -> tuple[bool, str]:
    """``accumulate(model, micro_batches, loss_fn)`` must leave the gradient of the mean loss over
    all micro-batches, reduce-scattered once: no_sync() on all micro-batches but the last."""
    problem = _dry_run(learner_fn, accum)  # raises NotImplementedError while untouched
    if problem:
        return False, problem

    from course_lab.notebook import launch_lesson

    source = textwrap.dedent(inspect.getsource(learner_fn))
    with tempfile.TemporaryDirectory(prefix="lesson3-exercise-") as tmp:
        loop_file = Path(tmp) / "my_accumulate.py"
        loop_file.write_text(PREAMBLE + source)
        done = launch_lesson(3, "--api", "fsdp1", "--accum", accum, "--steps", 1,
                             "--batch-size", 4, "--loop-file", loop_file, nproc=nproc)
        if done.returncode != 0 or done.metrics is None:
            tail = " | ".join(done.stdout.strip().splitlines()[-3:])
            return False, (f"your loop failed under torchrun (exit {done.returncode}): {tail}  "
                           "(it runs from a file of its own: import what it needs inside it)")
        run = done.metrics["results"]["runs"][0]
    worst = max(r["rel_err"] for r in run["ranks"] if r["rel_err"] is not None) \
        if any(r["rel_err"] is not None for r in run["ranks"]) else None
    if not run["grads_equal"]:
        return False, (f"under torchrun on {nproc} ranks the accumulated gradient differs from the "
                       f"one-big-batch reference (worst rel err {worst}).")
    sync_every = run["reduce_bytes"] != run["reduce_bytes_theory"]
    if sync_every:
        return False, (f"gradients are right, but {run['reduce_bytes']:,} reduce-scatter bytes per "
                       f"step instead of {run['reduce_bytes_theory']:,}: some micro-batches synced.")
    return True, (f"under torchrun on {nproc} ranks, K={accum}: gradients equal the one-big-batch "
                  f"reference on every rank (worst rel err {worst:.1e}), and "
                  f"{run['reduce_bytes']:,} reduce-scatter bytes per step (one sync, not {accum}).")
