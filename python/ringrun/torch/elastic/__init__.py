"""Horovod's elastic training API for PyTorch (horovod.torch.elastic), over ringrun.

    import ringrun.torch as hvd
    hvd.init()
    ...
    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, epoch=0)
    train(state)

run re-forms the job when a rank fails (HorovodInternalError: back to the last commit) or the
launcher changes the hosts (HostsUpdatedInterrupt), and calls the function again with the
state synchronized. docs/elastic.md ("Python: ringrun.torch.elastic") has the contract.
"""
import functools
import os

from .. import mpi_ops
from ..mpi_ops import HorovodInternalError, HostsUpdatedInterrupt
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

# Set by HOROVOD_RANK ... after each reset, as Horovod's core does.
_SHAPE_VARIABLES = {"HOROVOD_RANK": "rank", "HOROVOD_SIZE": "size",
                    "HOROVOD_LOCAL_RANK": "local_rank", "HOROVOD_LOCAL_SIZE": "local_size",
                    "HOROVOD_CROSS_RANK": "cross_rank", "HOROVOD_CROSS_SIZE": "cross_size"}


def _can_reform():
    """Whether a reset can form a new generation: in an elastic job (the launcher sets
    HOROVOD_ELASTIC=1, as horovodrun does), or in a process started without a launcher (a job
    of one). In a fixed job the launcher ends every rank at the first failure."""
    if os.environ.get("HOROVOD_ELASTIC") == "1":
        return True
    try:
        return "RINGRUN_RANK" not in os.environ and mpi_ops.size() == 1
    except ValueError:  # not initialized
        return False


def _reset():
    """Leaves the generation and joins the next: ringrun.torch's shutdown(), then init(),
    which takes the new rank and size from the job service."""
    mpi_ops.shutdown()
    mpi_ops.init()
    for variable, fn in _SHAPE_VARIABLES.items():
        if variable in os.environ:
            os.environ[variable] = str(getattr(mpi_ops, fn)())


def run_fn(func, reset):
    """run's loop, with the reset given (elastic.run passes _reset)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                if state._agree(skip_sync):
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError as e:
                if not _can_reform():
                    if hasattr(e, "add_note"):  # Python 3.11
                        e.add_note("ringrun.torch.elastic.run: not reset, as this job cannot "
                                   "re-form (elastic jobs set HOROVOD_ELASTIC=1)")
                    raise
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                if not _can_reform():
                    raise
                skip_sync = e.skip_sync
            state._before_reset()
            reset()
            state.on_reset()
    return wrapper


def run(func):
    """Decorates the training function, whose first argument is a State: the call runs it
    after synchronizing the state, and again after each reset, until it returns.

    On HorovodInternalError (a rank failed): state.restore(), then a reset. On
    HostsUpdatedInterrupt (state.commit() or check_host_updates() saw that the launcher changed
    the hosts): a reset, keeping the state as it is. A reset is ringrun.torch's shutdown() and
    init() (the new generation's rank and size), then state.on_reset() (the reset callbacks).
    Before each call, every rank agrees whether to sync: it does when a rank restored, is new,
    or was interrupted with skip_sync False. The launcher limits the resets (--reset-limit).

    As in Horovod, no collective may run before the decorated function is called: a rank that
    joins later would meet the others in the state's sync, not in that collective."""
    return run_fn(func, lambda: _reset())


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HorovodInternalError", "HostsUpdatedInterrupt"]
