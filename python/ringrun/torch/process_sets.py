"""Horovod's process sets (horovod/common/process_sets.py) over libringrun.

libringrun's engine negotiates every collective over the whole job: it has no notion of a
subset of ranks. So the global process set works everywhere, and a ProcessSet of fewer ranks is
made, registered (init(process_sets=...), add_process_set), queried (size, rank, included) and
removed as in Horovod, but a collective on it raises NotImplementedError on every rank that
calls it, before anything is submitted: never a wrong answer, never a hang.

Registration is local to each rank, as the ids are in Horovod's Python: every rank registers the
same sets in the same order (Horovod requires it too), so the ids agree.
"""
import os
import threading

import ringrun


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
        """This rank's index in the set (-1 outside it); None until it is registered."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return ringrun.rank()
        me = ringrun.rank()
        return self.ranks.index(me) if me in self.ranks else -1

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
_next_id = [1]


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
        _next_id[0] = 1
        global_process_set.ranks = list(range(ringrun.size()))
        for ps in process_sets or []:
            if not isinstance(ps, ProcessSet):
                raise ValueError(f"process_sets: {ps!r} is not a ProcessSet")
            _check_ranks(ps.ranks)
            if _known(ps.ranks):
                ps._invalidate()
                continue
            ps.process_set_id = _next_id[0]
            _next_id[0] += 1
            _registered[ps.process_set_id] = ps


def add_process_set(process_set):
    """Registers a new process set (a ProcessSet or a list of ranks) and returns it. As in
    Horovod: needs HOROVOD_DYNAMIC_PROCESS_SETS=1 (or init(process_sets="dynamic")), and a set
    with the same ranks as a registered one is a ValueError. Every rank calls it, in the same
    order."""
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
        process_set.process_set_id = _next_id[0]
        _next_id[0] += 1
        _registered[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Unregisters process_set; False for the global set or one not registered, as in
    Horovod."""
    if not ringrun.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if not _dynamic():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets "
                         "after Horovod initialization.")
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0:
        return False
    with _lock:
        found = _registered.pop(ps_id, None)
    process_set._invalidate()
    return found is not None


def check(process_set, what):
    """Raises unless process_set is the global set: ValueError for one that is not registered,
    NotImplementedError for a registered subset (see the module's docstring)."""
    if process_set is global_process_set:
        return
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{what}: process_set must be a ProcessSet, not {process_set!r}")
    if process_set.process_set_id is None or process_set.process_set_id not in _registered:
        raise ValueError(f"{what}: {process_set} has not been registered (use "
                         "hvd.init(process_sets=[...]) or hvd.add_process_set)")
    raise NotImplementedError(
        f"{what}: {process_set}: ringrun's engine negotiates collectives over the whole job "
        "only; collectives on a subset of ranks are not supported (use global_process_set)")
