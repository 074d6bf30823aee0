"""Lesson 3 exercise: the gradient-accumulation loop ``accumulate(model, micro_batches, loss_fn)``
for classic FSDP, when the micro-batches do not all hold the same number of sequences (the
last micro-batch of an epoch is usually short): one step beyond the lesson's loop, which
divides each loss by K and is measured wrong there.

Checked in two stages:

1. In this process, on a stand-in model with a ``no_sync()`` that records which backward passes
   ran inside it: quick, specific feedback (and "not attempted yet" while the cell is untouched).
2. For real: the function is written to a file and run by ``bash launch/lesson3.sh --loop-file``
   under torchrun on FSDP-wrapped ranks; the script compares the accumulated gradient with one
   process that ran the same micro-batches as one big batch, and counts the reduce-scatter
   bytes. Both must be right: equal gradients, and one reduce-scatter per optimizer step.

The launch's loop file is named by its content, so the same function is the same launch (the
test suite runs it once and shares it with the notebook's check).
"""

from __future__ import annotations

import inspect
import textwrap
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn as nn

from quizzes.exercise import exercise

# Written above the learner's function in the file the script loads.
PREAMBLE = "import torch\nfrom contextlib import nullcontext\n\n"
DRY_RUN_SIZES = (3, 3, 3, 1)  # samples per micro-batch in the in-process stage


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


def _dry_run(learner_fn, sizes=DRY_RUN_SIZES) -> str | None:
    """None when the loop behaves on the stand-in model, else why not."""
    gen = torch.Generator().manual_seed(1)
    micro_batches = [
        (torch.randn(n, 4, generator=gen), torch.randn(n, 1, generator=gen)) for n in sizes
    ]
    model = RecordingModel()
    loss_fn = nn.functional.mse_loss
    learner_fn(model, micro_batches, loss_fn)

    flags = model.backward_in_no_sync
    if len(flags) != len(sizes):
        return (
            f"your loop ran backward {len(flags)} time(s) for {len(sizes)} micro-batches; run "
            "forward, loss and backward once per micro-batch."
        )
    if flags[-1]:
        return (
            "the last micro-batch ran its backward inside no_sync(): its gradients are never "
            "reduce-scattered (the lesson's pitfall). Sync on the last micro-batch."
        )
    if not any(flags):
        return (
            f"no backward ran inside model.no_sync(): every micro-batch reduce-scatters "
            f"({len(sizes)}x the bytes). Wrap all but the last in it."
        )
    if not all(flags[:-1]):
        skipped = [i for i, f in enumerate(flags[:-1]) if not f]
        return (
            f"micro-batch(es) {skipped} ran backward outside no_sync(): every micro-batch "
            "but the last should skip the sync."
        )
    got = model.linear.weight.grad
    if got is None:
        return "no gradient after your loop: call loss.backward() for each micro-batch."
    big_batch = RecordingModel()
    loss_fn(
        big_batch(torch.cat([x for x, _ in micro_batches])),
        torch.cat([y for _, y in micro_batches]),
    ).backward()
    want = big_batch.linear.weight.grad
    if torch.allclose(got, want, rtol=1e-5, atol=1e-7):
        return None
    rel_err = ((got - want).abs().max() / want.abs().max()).item()
    equal_weights = RecordingModel()
    for x, y in micro_batches:
        (loss_fn(equal_weights(x), y) / len(sizes)).backward()
    if torch.allclose(got, equal_weights.linear.weight.grad, rtol=1e-5, atol=1e-7):
        return (
            f"your gradient is the one {len(sizes)} equal micro-batches would give (each loss / "
            f"{len(sizes)}), but these hold {', '.join(map(str, sizes))} samples: compare with "
            f"one batch of all {sum(sizes)} (rel err {rel_err:.1%})."
        )
    scale = ((got * want).sum() / (want * want).sum()).item()
    return (
        f"the gradient differs from the one of a single batch holding all {sum(sizes)} samples "
        f"(rel err {rel_err:.1%}, scale {scale:.3f})."
    )


def loop_file(source: str) -> Path:
    """A file holding ``source``, named by its content (course_lab.learner.learner_file)."""
    from course_lab.learner import learner_file

    return learner_file(source, "accumulate")


@exercise("lesson3", "ex_accumulate")
def check_accumulate(
    learner_fn, accum: int = 4, batch_size: int = 4, last_batch_size: int = 1, nproc: int = 2
) -> tuple[bool, str]:
    """``accumulate(model, micro_batches, loss_fn)`` must leave the gradient of ONE batch holding
    every micro-batch (whatever their sizes), reduce-scattered once: no_sync() on all
    micro-batches but the last."""
    problem = _dry_run(learner_fn)  # raises NotImplementedError while untouched
    if problem:
        return False, problem

    from course_lab.notebook import launch_lesson

    path = loop_file(PREAMBLE + textwrap.dedent(inspect.getsource(learner_fn)))
    done = launch_lesson(
        3,
        "--api",
        "fsdp1",
        "--accum",
        accum,
        "--batch-size",
        batch_size,
        "--last-batch-size",
        last_batch_size,
        "--steps",
        1,
        "--loop-file",
        path,
        nproc=nproc,
    )
    if done.returncode != 0 or done.metrics is None:
        tail = " | ".join(done.stdout.strip().splitlines()[-3:])
        return False, (
            f"your loop failed under torchrun (exit {done.returncode}): {tail}  "
            "(it runs from a file of its own: import what it needs inside it)"
        )
    run = done.metrics["results"]["runs"][0]
    errors = [r["rel_err"] for r in run["ranks"] if r["rel_err"] is not None]
    worst = max(errors) if errors else None
    sizes = " + ".join(map(str, run["micro_batch_sizes"]))
    if not run["grads_equal"]:
        return False, (
            f"under torchrun on {nproc} ranks, micro-batches of {sizes} sequences, the "
            f"accumulated gradient differs from the one-big-batch reference (worst rel "
            f"err {worst})."
        )
    if run["reduce_bytes"] != run["reduce_bytes_theory"]:
        return False, (
            f"gradients are right, but {run['reduce_bytes']:,} reduce-scatter bytes per "
            f"step instead of {run['reduce_bytes_theory']:,}: some micro-batches synced."
        )
    return True, (
        f"under torchrun on {nproc} ranks, micro-batches of {sizes} sequences: gradients "
        f"equal the one-big-batch reference on every rank (worst rel err {worst:.1e}), "
        f"and {run['reduce_bytes']:,} reduce-scatter bytes per step (one sync, not {accum})."
    )
