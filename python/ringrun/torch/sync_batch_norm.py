"""SyncBatchNorm (horovod/torch/sync_batch_norm.py): batch statistics over every rank's batch.

Unlike Horovod's, it runs on CPU tensors too: the statistics are per-channel sums reduced with
one allreduce in forward and one in backward.
"""
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from . import mpi_ops


class SyncBatchNorm(_BatchNorm):
    """Applies synchronous batch normalization over the ranks' batches (a drop-in for
    torch.nn.BatchNorm1d/2d/3d). Arguments as torch.nn.BatchNorm*."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _run_bn(self, input, exponential_average_factor):
        return torch.nn.functional.batch_norm(
            input, self.running_mean, self.running_var, self.weight, self.bias,
            self.training or not self.track_running_stats, exponential_average_factor, self.eps)

    def forward(self, input):
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked = self.num_batches_tracked + 1
            if self.momentum is None:
                exponential_average_factor = 1.0 / float(self.num_batches_tracked)
            else:
                exponential_average_factor = self.momentum
        else:
            exponential_average_factor = 0.0 if self.momentum is None else self.momentum
        if not self.training or mpi_ops.size() == 1:
            return self._run_bn(input, exponential_average_factor)
        return _SyncBatchNorm.apply(input, self.weight, self.bias, self.running_mean,
                                    self.running_var, self.eps, exponential_average_factor)


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        input = input.contiguous()
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        x = input.to(torch.float64) if input.dtype != torch.float64 else input
        count = torch.tensor([input.numel() // c], dtype=torch.float64, device=input.device)
        stats = torch.cat([count, x.sum(dims), (x * x).sum(dims)])
        stats = mpi_ops.allreduce(stats, op=mpi_ops.Sum, name=None)
        n = stats[0]
        mean = stats[1:1 + c] / n
        var = (stats[1 + c:] / n - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            unbiased = var * n / (n - 1) if n > 1 else var
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        shape = [1, c] + [1] * (input.dim() - 2)
        xhat = (x - mean.view(shape)) * invstd.view(shape)
        out = xhat
        if weight is not None:
            out = out * weight.to(torch.float64).view(shape) + bias.to(torch.float64).view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.n, ctx.dims, ctx.shape, ctx.dtype = n, dims, shape, input.dtype
        return out.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        xhat, invstd, weight = ctx.saved_tensors
        dims, shape, n = ctx.dims, ctx.shape, ctx.n
        dy = grad_output.contiguous().to(torch.float64)
        local = torch.cat([dy.sum(dims), (dy * xhat).sum(dims)])
        c = xhat.shape[1]
        grad_weight = local[c:].to(ctx.dtype) if weight is not None else None
        grad_bias = local[:c].to(ctx.dtype) if weight is not None else None
        total = mpi_ops.allreduce(local, op=mpi_ops.Sum)
        sum_dy, sum_dy_xhat = total[:c].view(shape), total[c:].view(shape)
        scale = invstd.view(shape)
        if weight is not None:
            scale = scale * weight.to(torch.float64).view(shape)
        grad_input = scale * (dy - sum_dy / n - xhat * sum_dy_xhat / n)
        return grad_input.to(ctx.dtype), grad_weight, grad_bias, None, None, None, None
