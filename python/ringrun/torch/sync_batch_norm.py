"""SyncBatchNorm (horovod/torch/sync_batch_norm.py): batch statistics over every rank's batch.

Unlike Horovod's, it runs on CPU tensors too (torch 1.13 has batch_norm_stats and its family on
CUDA only, so both devices take the path of _SyncBatchNorm): one allgather of per-channel
statistics in forward, one allreduce of per-channel sums in backward, and the passes over the
batch made by torch's own kernels, in the input's dtype.
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


def _stats_dtype(dtype):
    """Per-channel statistics of 16-bit inputs are kept in float (as torch's own kernels keep
    them); the others in the input's dtype."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _SyncBatchNorm(torch.autograd.Function):
    """Batch normalization with the statistics of every rank's batch.

    Forward: torch.var_mean over this rank's batch, one allgather of (count, mean, var) per
    channel, the job's mean and variance combined from them, then one pass of torch's own
    batch_norm kernel in inference form with those as its statistics (it normalizes, scales and
    shifts in the input's dtype). Backward: torch's native_batch_norm_backward gives this
    rank's per-channel sums of dy and dy * xhat in one pass, one allreduce sums them over the
    job, and the input's gradient is a per-channel a * dy + b * x + c (two passes)."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        input = input.contiguous()
        c = input.shape[1]
        dims = [0] + list(range(2, input.dim()))
        sdt = _stats_dtype(input.dtype)
        x = input if sdt == input.dtype else input.to(sdt)
        var, mean = torch.var_mean(x, dims, unbiased=False)
        count = torch.full((1,), input.numel() // c, dtype=sdt, device=input.device)
        rows = mpi_ops.allgather(torch.cat([count, mean, var]).unsqueeze(0))
        counts, means, vars_ = rows[:, :1], rows[:, 1:1 + c], rows[:, 1 + c:]
        n = counts.sum()
        mean = (counts * means).sum(0) / n
        var = (counts * (vars_ + (means - mean) ** 2)).sum(0) / n
        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * (n / (n - 1)) if n > 1 else var
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype),
                                                    alpha=momentum)
        pdt = input.dtype if weight is None else weight.dtype
        out = torch.batch_norm(input, weight, bias, mean.to(pdt), var.to(pdt), False, 0.0, eps,
                               torch.backends.cudnn.enabled)
        invstd = torch.rsqrt(var + eps)
        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.n, ctx.eps = n, eps
        return out

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        dy = grad_output.contiguous()
        c = input.shape[1]
        # This rank's sum(dy * xhat) and sum(dy), per channel, in one pass of torch's kernel.
        _, sum_dy_xhat, sum_dy = torch.ops.aten.native_batch_norm_backward(
            dy, input, None, None, None, mean, invstd, True, ctx.eps, [False, True, True])
        local = torch.cat([sum_dy.to(mean.dtype), sum_dy_xhat.to(mean.dtype)])
        total = mpi_ops.allreduce(local, op=mpi_ops.Sum)
        mean_dy, mean_dy_xhat = total[:c] / ctx.n, total[c:] / ctx.n
        w = invstd if weight is None else invstd * weight.to(invstd.dtype)
        # grad = w * (dy - mean_dy - xhat * mean_dy_xhat), xhat = (x - mean) * invstd
        a = w
        b = -w * invstd * mean_dy_xhat
        k = -w * mean_dy - b * mean
        shape = [1, c] + [1] * (input.dim() - 2)
        dt = input.dtype
        grad = torch.addcmul(k.to(dt).view(shape), input, b.to(dt).view(shape))
        grad.addcmul_(dy, a.to(dt).view(shape))
        grad_weight = sum_dy_xhat if weight is not None else None
        grad_bias = sum_dy if weight is not None else None
        return grad, grad_weight, grad_bias, None, None, None, None
