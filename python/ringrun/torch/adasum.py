"""Adasum (horovod/common/ops/adasum/adasum.h) over ringrun's allgather.

libringrun's engine has no Adasum op, so allreduce(op=Adasum) runs here: each tensor is
allgathered, and every rank combines the size() vectors itself along Horovod's tree. At the
level of distance d (1, 2, 4, ...), the running vector a of each rank r with r & d == 0 is
combined with b, that of rank r + d:

    a <- (1 - dot(a, b) / (2 |a|^2)) a + (1 - dot(a, b) / (2 |b|^2)) b

where a coefficient stays 1 when its squared norm is below sqrt(DBL_MIN); dot products and norms
are accumulated in float64, and each level's result is rounded to the tensor's dtype, as Horovod
stores it. Rank 0's vector at the end is the result, on every rank. Each tensor of a group gets
coefficients of its own, as each tensor of Horovod's fusion buffer does.

Horovod's restrictions hold: floating tensors only (float16, float32, float64), a power-of-two
number of ranks in the process set (on a set, its members' vectors in set order). The cost differs: size() times the tensor's memory and
an allgather, where Horovod's vector-halving distance-doubling exchanges about 2x the tensor.
"""
import math
import sys

import torch

from . import mpi_ops

_DTYPES = (torch.float16, torch.float32, torch.float64)
_SQRT_DBL_MIN = math.sqrt(sys.float_info.min)


def _check(tensors):
    n = mpi_ops._engine.set_size()
    if n & (n - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")
    for t in tensors:
        if t.dtype not in _DTYPES:
            raise ValueError(f"Adasum: tensor type {t.type()} is not supported (float16, float32 "
                             "and float64 are)")


def combine(vectors):
    """Horovod's Adasum tree over a list of size() tensors of one shape and dtype (see above)."""
    vs = list(vectors)
    d = 1
    while d < len(vs):
        for r in range(0, len(vs), 2 * d):
            a, b = vs[r], vs[r + d]
            a64, b64 = a.double().reshape(-1), b.double().reshape(-1)
            dot = float(torch.dot(a64, b64))
            anormsq, bnormsq = float(torch.dot(a64, a64)), float(torch.dot(b64, b64))
            acoeff = 1.0 - dot / anormsq * 0.5 if anormsq >= _SQRT_DBL_MIN else 1.0
            bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq >= _SQRT_DBL_MIN else 1.0
            vs[r] = (acoeff * a.double() + bcoeff * b.double()).to(a.dtype)
        d *= 2
    return vs[0]


def grouped_allreduce_async(inputs, outputs, name, prescale_factor, postscale_factor,
                            single=False):
    """Adasum of each input into its output; a handle of mpi_ops, whose synchronize returns
    the outputs (outputs[0] when single)."""
    _check(inputs)
    n = mpi_ops._engine.set_size()
    sends = [mpi_ops._scaled(t, prescale_factor).reshape(1, -1) for t in inputs]
    handles, _ = mpi_ops._grouped_allgather_async(sends, name)

    def finish(gathered):
        for g, t, o in zip(gathered, inputs, outputs):
            result = combine(list(g.reshape(n, -1).unbind(0))).reshape(t.shape)
            o.copy_(mpi_ops._scaled(result, postscale_factor))
        return outputs[0] if single else list(outputs)
    return mpi_ops._register(handles, finish, (inputs, outputs, sends))


def allreduce_async(tensor, output, name, prescale_factor, postscale_factor):
    return grouped_allreduce_async([tensor], [output], name, prescale_factor, postscale_factor,
                                   single=True)
