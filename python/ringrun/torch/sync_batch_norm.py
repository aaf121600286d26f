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


def _channel_sums(dy, x, mean, invstd, eps):
    """Per channel: sum(dy * (x - mean) * invstd) and sum(dy), in one pass of torch's own
    native_batch_norm_backward (which accumulates in double on CPU)."""
    _, dot, total = torch.ops.aten.native_batch_norm_backward(
        dy, x, None, None, None, mean, invstd, True, eps, [False, True, True])
    return dot, total


class _SyncBatchNorm(torch.autograd.Function):
    """Batch normalization with the statistics of every rank's batch.

    Forward: this rank's per-channel sum(x) and sum(x * x) in one pass of torch's
    native_batch_norm_backward (dy = x, mean 0, invstd 1), one allreduce of (count, sums) over
    the job, the mean and variance from them (per channel, in float64), then one pass of
    torch's batch_norm kernel in inference form with those as its statistics: it normalizes,
    scales and shifts in the input's dtype. Backward: the same reduction kernel for this rank's
    sum(dy) and sum(dy * xhat), one allreduce, and the input's gradient as a per-channel
    a * dy + b * x + k (two passes)."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, momentum):
        input = input.contiguous()
        c = input.shape[1]
        sdt = torch.float32 if input.dtype in (torch.float16, torch.bfloat16) else input.dtype
        zero = torch.zeros(c, dtype=sdt, device=input.device)
        sq, sm = _channel_sums(input, input, zero, torch.ones_like(zero), eps)
        count = torch.full((1,), input.numel() // c, dtype=torch.float64, device=input.device)
        total = mpi_ops.allreduce(torch.cat([count, sm.double(), sq.double()]), op=mpi_ops.Sum)
        n = total[0]
        mean = total[1:1 + c] / n
        var = (total[1 + c:] / n - mean * mean).clamp_min(0)
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
        ctx.save_for_backward(input, weight, mean.to(sdt), invstd.to(sdt))
        ctx.n, ctx.eps = n, eps
        return out

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        dy = grad_output.contiguous()
        c = input.shape[1]
        sum_dy_xhat, sum_dy = _channel_sums(dy, input, mean, invstd, ctx.eps)
        total = mpi_ops.allreduce(torch.cat([sum_dy.double(), sum_dy_xhat.double()]),
                                  op=mpi_ops.Sum)
        mean_dy, mean_dy_xhat = total[:c] / ctx.n, total[c:] / ctx.n
        m, inv = mean.double(), invstd.double()
        w = inv if weight is None else inv * weight.double()
        # grad = w * (dy - mean_dy - xhat * mean_dy_xhat), xhat = (x - mean) * invstd
        b = -w * inv * mean_dy_xhat
        k = -w * mean_dy - b * m
        shape = [1, c] + [1] * (input.dim() - 2)
        dt = input.dtype
        grad = torch.addcmul(k.to(dt).view(shape), input, b.to(dt).view(shape))
        grad.addcmul_(dy, w.to(dt).view(shape))
        if weight is None:
            return grad, None, None, None, None, None, None
        return (grad, sum_dy_xhat.to(weight.dtype), sum_dy.to(weight.dtype), None, None, None,
                None)
