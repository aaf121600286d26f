"""Horovod's PyTorch API over libringrun: `import ringrun.torch as hvd`.

Names, arguments and semantics follow horovod.torch; docs/python.md lists the differences.
A Horovod name that ringrun does not provide raises NotSupportedError (an AttributeError and a
NotImplementedError) that says so.
"""
from .compression import Compression
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .mpi_ops import (Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min,
                      Product, ProcessSet, Sum, add_process_set, allgather, allgather_async, allreduce, allreduce_,
                      allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                      broadcast, broadcast_, broadcast_async, broadcast_async_, ccl_built,
                      cross_rank, cross_size, cuda_built, ddl_built, global_process_set,
                      gloo_built, gloo_enabled, grouped_allgather, grouped_allgather_async,
                      grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
                      grouped_allreduce_async_, grouped_reducescatter,
                      grouped_reducescatter_async, init, is_initialized, join, local_rank,
                      local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, poll,
                      rank, reducescatter, reducescatter_async, remove_process_set, rocm_built,
                      shutdown, size, sparse_allreduce_async, start_timeline, stop_timeline,
                      synchronize)
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm
from . import elastic  # noqa: E402 - after the names it uses


class NotSupportedError(NotImplementedError, AttributeError):
    """A Horovod name that ringrun.torch does not provide."""


# horovod.torch names that ringrun.torch does not provide, and why.
_MISSING = {
    "mpi_lib": "ringrun has no MPI library",
    "mpi_lib_v2": "ringrun has no MPI library",
}


def __getattr__(name):
    if name in _MISSING:
        raise NotSupportedError(f"ringrun.torch does not provide horovod.torch.{name}: "
                                f"{_MISSING[name]}")
    raise AttributeError(f"module 'ringrun.torch' has no attribute '{name}'")
