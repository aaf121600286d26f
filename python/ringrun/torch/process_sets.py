"""Horovod's process sets (horovod/common/process_sets.py) over libringrun.

A process set is a subset of the job's ranks whose collectives are negotiated among its members
only: libringrun gives each set an engine and connections of its own (ringrun.h, "Process
sets"), as Horovod gives each a controller. So names in different sets never meet, a set's
members never wait for the other ranks, and every collective takes process_set= on host
tensors, with Horovod's semantics: sizes, ranks, Average's divisor and gradients are the set's;
broadcast's root_rank is a rank of the job that is in the set; a rank outside the set that calls
a collective on it gets Horovod's ValueError ("... is not a member of the provided process set").
Device (CUDA) tensors on a set other than the global one are refused with a ValueError
(docs/python.md says why).

Registration is collective, as in Horovod: init(process_sets=[...]) registers the list on every
rank (each rank passes the same list); with HOROVOD_DYNAMIC_PROCESS_SETS=1 (or
init(process_sets="dynamic")), add_process_set and remove_process_set may be called later, by
every rank, in the same order, with the same arguments. They meet through one collective of the
whole job, so the ids agree (1, 2, ... in order of registration, a removed id given again first)
and a rank that passes other arguments makes every rank raise instead of hanging.
"""
import ctypes
import os
import threading

import ringrun
from ringrun import _lib


class ProcessSet:
    """A set of ranks that would run collectives together. Pass it to init(process_sets=...)
    or add_process_set(); process_set_id is set once it is registered."""
    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "(ringrun has no MPI communicators)") from None
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks")
        self.ranks = ranks

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """The number of ranks in the set; None until it is registered."""
        if self.process_set_id is None:
            return None
        return ringrun.size() if self.process_set_id == 0 else len(self.ranks)

    def rank(self):
        """This rank's rank in the set (-1 outside it); None until it is registered."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return ringrun.rank()
        return _lib.lib.ringrun_process_set_rank(self.process_set_id)

    def included(self):
        """Whether this rank is in the set; None when the set has no ranks yet."""
        if self.ranks is None:
            return None
        return ringrun.rank() in self.ranks

    def __str__(self):
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                "mpi_comm=None)")

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_lock = threading.Lock()
_registered = {}  # id -> ProcessSet, the global one excluded


def _register_in_runtime(process_set):
    """ringrun_add_process_set over every rank: sets process_set.process_set_id."""
    ranks = (ctypes.c_int * len(process_set.ranks))(*process_set.ranks)
    out = ctypes.c_int(-1)
    status = _lib.lib.ringrun_add_process_set(ranks, len(process_set.ranks), ctypes.byref(out))
    if status == _lib.ERR_INVALID_ARGUMENT:
        raise ValueError(_lib.error_message())
    _lib.check(status, "add_process_set")
    process_set.process_set_id = out.value
    _registered[out.value] = process_set


def _dynamic():
    return os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") not in ("", "0")


def _check_ranks(ranks):
    n = ringrun.size()
    bad = [r for r in ranks if not 0 <= r < n]
    if bad or len(set(ranks)) != len(ranks):
        raise ValueError(f"process set {ranks}: ranks must be distinct ranks of this job "
                         f"(0..{n - 1})")


def _known(ranks):
    if ranks == global_process_set.ranks:
        return True
    return any(ps.ranks == ranks for ps in _registered.values())


def setup(process_sets):
    """Called by init() once the job is joined: the global set gets every rank, and each set of
    process_sets (a list, or "dynamic") an id; a repeated set is invalidated, as in Horovod."""
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"process_sets={process_sets!r}: a list of ProcessSet or 'dynamic'")
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        process_sets = []
    with _lock:
        for ps in _registered.values():
            ps._invalidate()
        _registered.clear()
        global_process_set.ranks = list(range(ringrun.size()))
        for ps in process_sets or []:
            if not isinstance(ps, ProcessSet):
                raise ValueError(f"process_sets: {ps!r} is not a ProcessSet")
            _check_ranks(ps.ranks)
        for ps in process_sets or []:
            if _known(ps.ranks):
                ps._invalidate()
                continue
            _register_in_runtime(ps)


def add_process_set(process_set):
    """Registers a new process set (a ProcessSet or a list of ranks) and returns it. As in
    Horovod: needs HOROVOD_DYNAMIC_PROCESS_SETS=1 (or init(process_sets="dynamic")), and a set
    with the same ranks as a registered one is a ValueError. Every rank calls it, in the same
    order (a collective of the whole job)."""
    if not ringrun.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if not _dynamic():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after "
                         "Horovod initialization.")
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    _check_ranks(process_set.ranks)
    with _lock:
        if _known(process_set.ranks):
            raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
        _register_in_runtime(process_set)
    return process_set


def remove_process_set(process_set):
    """Unregisters process_set (a collective of the whole job, as add_process_set); False for
    the global set or one not registered, as in Horovod. Its pending collectives fail."""
    if not ringrun.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if not _dynamic():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets "
                         "after Horovod initialization.")
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0:
        return False
    with _lock:
        if _registered.get(ps_id) is not process_set:
            return False
        status = _lib.lib.ringrun_remove_process_set(ps_id)
        if status == _lib.ERR_INVALID_ARGUMENT:
            raise ValueError(_lib.error_message())
        _lib.check(status, "remove_process_set")
        del _registered[ps_id]
    process_set._invalidate()
    return True


def check(process_set, what):
    """process_set's id; ValueError for one that is not registered. (Whether this rank is a
    member is the runtime's to say, at submission, in Horovod's words.)"""
    if process_set is global_process_set:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{what}: process_set must be a ProcessSet, not {process_set!r}")
    if process_set.process_set_id is None or process_set.process_set_id not in _registered:
        raise ValueError(f"{what}: {process_set} has not been registered (use "
                         "hvd.init(process_sets=[...]) or hvd.add_process_set)")
    return process_set.process_set_id


def root_in_set(process_set, root_rank):
    """root_rank (a rank of the job) as a rank of process_set, with Horovod's error when it is
    not in the set."""
    if process_set is global_process_set:
        return root_rank
    if root_rank not in process_set.ranks:
        raise ValueError(f"broadcast received invalid root rank {root_rank} for provided "
                         "process set")
    return process_set.ranks.index(root_rank)
