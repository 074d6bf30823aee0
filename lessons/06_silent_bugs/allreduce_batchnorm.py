"""BatchNorm whose statistics are those of the global batch, on any device (lesson 6, part B).

Under data parallelism (DDP, FSDP) a plain ``nn.BatchNorm`` normalises each rank's micro-batch
with that micro-batch's own mean and variance, and updates its running statistics from it: the
model then differs from one trained on the global batch, and the running statistics differ
from rank to rank. ``nn.SyncBatchNorm`` fixes that on GPUs, but refuses CPU tensors. This
module does the same thing in a few lines, with a differentiable all-reduce, so it runs on
CPU ranks (gloo) and GPUs (NCCL) alike:

    model = convert_allreduce_batchnorm(model)   # before wrapping, like convert_sync_batchnorm

Forward, per BatchNorm layer: all-reduce (sum, count) -> global mean; all-reduce the sum of
squared deviations -> global (biased) variance; normalise with them; update the running
statistics with the unbiased variance of the global batch, as ``nn.BatchNorm`` would on one
process. Backward: the functional ``all_reduce`` (``torch.distributed._functional_collectives``,
which torch 2.13 names as the replacement of the deprecated ``torch.distributed.nn.functional``
one) has an autograd formula that all-reduces the incoming gradients, so every rank gets the
gradient of the global batch's statistics. Two small all-reduces per layer and step, forward
and backward: that is the price of synchronised statistics.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import _functional_collectives as funcol
from torch.nn.modules.batchnorm import _BatchNorm


class AllReduceBatchNorm(_BatchNorm):
    """``nn.BatchNorm1d/2d/3d`` with global-batch statistics in training (see module doc)."""

    def _check_input_dim(self, x: torch.Tensor) -> None:
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (batch, channels, ...), got {x.dim()}D")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(x)  # eval, or one process: plain BatchNorm
        dims = [0, *range(2, x.dim())]  # every dim but the channels
        shape = [1, -1] + [1] * (x.dim() - 2)
        local_count = x.numel() // x.shape[1]
        # One all-reduce for the sums and the count, one for the squared deviations: two
        # passes, as precise as BatchNorm's own variance (no E[x^2] - E[x]^2 cancellation).
        sums = all_reduce(torch.cat([x.sum(dims), x.new_tensor([local_count])]))
        count = sums[-1]
        mean = sums[:-1] / count
        centered = x - mean.view(shape)
        var = all_reduce((centered * centered).sum(dims)) / count
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count.detach())
        y = centered * torch.rsqrt(var + self.eps).view(shape)
        if self.affine:
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y

    @torch.no_grad()
    def _update_running_stats(self, mean, var, count) -> None:
        self.num_batches_tracked.add_(1)
        # momentum=None means a cumulative average, as in nn.BatchNorm.
        factor = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
        unbiased = var * count / (count - 1).clamp(min=1)
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """Sum over all ranks, differentiable (its backward sums the gradients over all ranks)."""
    return funcol.all_reduce(t, "sum", dist.group.WORLD).wait()


def convert_allreduce_batchnorm(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm in ``module`` by an ``AllReduceBatchNorm`` with the same
    parameters and buffers (what ``nn.SyncBatchNorm.convert_sync_batchnorm`` does)."""
    if isinstance(module, _BatchNorm) and not isinstance(module, AllReduceBatchNorm):
        new = AllReduceBatchNorm(module.num_features, module.eps, module.momentum,
                                 module.affine, module.track_running_stats,
                                 device=module.running_mean.device
                                 if module.running_mean is not None else None)
        new.load_state_dict(module.state_dict())
        new.train(module.training)
        return new
    for name, child in module.named_children():
        module.add_module(name, convert_allreduce_batchnorm(child))
    return module
