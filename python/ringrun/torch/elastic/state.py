"""The state that elastic training keeps across resets (horovod/common/elastic.py and
horovod/torch/elastic/state.py): State, ObjectState, TorchState and TorchState's handlers.

Every State method that talks to other ranks (sync, check_host_updates, commit, and save where
a handler gathers) is collective: every rank calls it at the same point of the program, as
Horovod requires. save and restore are otherwise local copies.

Where ringrun differs from Horovod (docs/elastic.md, "Python: ringrun.torch.elastic"):
- check_host_updates decides with an allreduce (MAX) of the launcher's membership epoch,
  not with a broadcast from rank 0, so every rank raises together even when only some saw the
  change or rank 0 is the one leaving (horovod#3494);
- ObjectState commits copies (copy.deepcopy) of its attributes, so restore() undoes changes
  made in place (a list appended to) as well; an object that cannot be copied is kept by
  reference, as Horovod keeps them all;
- sync() broadcasts the live values from rank 0 and then commits them on every rank;
- TorchState also handles LR schedulers (their state_dict), and an ElasticSampler's
  processed indices are the union of every rank's.
"""
import copy
import queue

import torch

from .. import functions, mpi_ops
from . import _hosts
from .sampler import ElasticSampler

_AGREE_NAME = "ringrun.elastic.agree"
_CHECK_NAME = "ringrun.elastic.check_host_updates"


def _max_over_ranks(values, name):
    """Elementwise maximum over the ranks of a list of non-negative ints."""
    t = torch.tensor(values, dtype=torch.int64)
    return [int(v) for v in mpi_ops.allreduce_(t, op=mpi_ops.Max, name=name).tolist()]


class _HostMessages:
    """Horovod's State._host_messages, the queue of its driver's host-update notices, which
    Horovod's elastic test programs poll on rank 0 (`while state._host_messages.empty()`). Here
    a view of the launcher's membership epoch: not empty while this rank has heard of a change
    that the job has not acted on yet (check_host_updates acts on it)."""

    def __init__(self, state):
        self._state = state

    def qsize(self):
        return 0 if self.empty() else 1

    def empty(self):
        return _hosts.membership_epoch() <= getattr(self._state, "_last_epoch", 0)

    def get_nowait(self):
        if self.empty():
            raise queue.Empty()
        return (_hosts.membership_epoch(), None)

    def get(self, block=True, timeout=None):
        return self.get_nowait()

    def put(self, item, block=True, timeout=None):
        """Notices come from the launcher, through the membership epoch: nothing to keep."""


class State:
    """What elastic.run keeps in sync between the ranks; subclasses say how to save, restore
    and sync it.

    Args:
        bcast_object: broadcasts an object from rank 0 (default: ringrun.torch's
            broadcast_object).
        get_rank: this rank (default: ringrun.torch's rank).
    """

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or functions.broadcast_object
        self._rank = get_rank or mpi_ops.rank
        self._reset_callbacks = []
        self._last_epoch = 0   # the membership epoch that the last reset answered
        self._joined = False   # has taken part in elastic.run's agreement
        self._host_messages = _HostMessages(self)

    def register_reset_callbacks(self, callbacks):
        """Adds functions that elastic.run calls after each reset (ringrun.torch is initialized
        again, with the new size and rank), before the state is synchronized: to scale the
        learning rate by the new size(), for example."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        """Called by elastic.run after each reset: reset(), then the registered callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res=None):
        """Horovod's driver notification. In ringrun the runtime counts host changes
        (ringrun.membership_epoch()), which check_host_updates reads: nothing to do here."""

    def commit(self):
        """save(), then check_host_updates(). Collective.

        A commit copies the state (a model's state_dict stays on its device), so commit every
        few batches rather than every batch: a failure redoes the batches since the last
        commit."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank when the launcher changed the job's hosts
        since the last reset; returns otherwise. Collective: every rank calls it at the same
        point (commit does). One allreduce of 8 bytes, so a change that only some ranks have
        seen yet is acted on by all of them together."""
        latest = _max_over_ranks([max(_hosts.membership_epoch(), 0)], _CHECK_NAME)[0]
        if latest > self._last_epoch:
            self._last_epoch = latest
            # skip_sync: the ranks that trained on hold the same state; a rank that needs it
            # (a newcomer) still gets it, as elastic.run asks every rank before syncing.
            raise mpi_ops.HostsUpdatedInterrupt(skip_sync=True)

    def save(self):
        """Commits the state: restore() goes back to it."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last commit, undoing what changed since."""
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state rank 0's. Collective."""
        raise NotImplementedError()

    def reset(self):
        """Adapts the state to the job's new size and ranks, after a reset and before sync."""

    # ---- elastic.run's side ---------------------------------------------------------------

    def _agree(self, skip_sync):
        """At every entry into run's function, on every rank: whether to sync (a rank asks for
        it unless it has taken part before and skip_sync says so), and the membership epoch
        that this generation answers (the highest that a rank of the last one acted on; a new
        rank knows none). Returns whether to sync."""
        joined = getattr(self, "_joined", False)
        need = 0 if (joined and skip_sync) else 1
        epoch = getattr(self, "_last_epoch", 0) if joined else 0
        need, epoch = _max_over_ranks([need, epoch], _AGREE_NAME)
        self._joined, self._last_epoch = True, epoch
        return bool(need)

    def _before_reset(self):
        """Notes the latest membership epoch this rank has seen before it leaves the
        generation: a change seen after it is acted on at the next check (at worst one reset
        more), never lost."""
        try:
            seen = _hosts.membership_epoch()
        except Exception:  # noqa: B902 - a broken runtime: what check_host_updates saw stands
            seen = 0
        self._last_epoch = max(getattr(self, "_last_epoch", 0), seen)


def _copy(value):
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: B902 - what cannot be copied is kept by reference, as Horovod
        return value


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and kept as attributes of the
    same names (state.epoch, state.batch, ...). Synced by pickling them from rank 0.

    Args:
        bcast_object, get_rank: as State's (Horovod's order; both optional).
        kwargs: the attributes and their first values (the first commit).
    """

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = {k: _copy(v) for k, v in kwargs.items()}
        for k, v in kwargs.items():
            setattr(self, k, v)
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {k: _copy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        for k, v in self._saved_state.items():
            setattr(self, k, _copy(v))

    def sync(self):
        if self._saved_state:
            live = self._bcast_object({k: getattr(self, k) for k in self._saved_state})
            for k, v in live.items():
                setattr(self, k, v)
            ObjectState.save(self)


class StateHandler:
    """How TorchState saves, restores and syncs one attribute of a type (the registry below
    maps types to handlers). sync is collective; reset is called after each reset."""

    def __init__(self, value):
        self.value = value

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass

    def set_value(self, value):
        """The attribute was given a new object: it is committed as it is."""
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A value with state_dict() and load_state_dict(): commits a copy of its state_dict (on
    the value's device)."""

    def __init__(self, value):
        super().__init__(value)
        self.save()

    def save(self):
        self._saved_state_dict = copy.deepcopy(self.value.state_dict())

    def restore(self):
        # Modules copy into their tensors and optimizers copy what they load; schedulers take
        # the dict's objects (lists), which must stay the commit's.
        saved = self._saved_state_dict
        self.value.load_state_dict(copy.deepcopy(saved) if self._restore_copy else saved)

    _restore_copy = False


class ModelStateHandler(_StateDictHandler):
    """A torch.nn.Module; synced by broadcasting its parameters and buffers from rank 0."""

    def sync(self):
        functions.broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    """A torch.optim.Optimizer (a DistributedOptimizer too); synced with
    broadcast_optimizer_state from rank 0."""

    def sync(self):
        functions.broadcast_optimizer_state(self.value, root_rank=0)


class LRSchedulerStateHandler(_StateDictHandler):
    """A learning-rate scheduler; synced by broadcasting its state_dict from rank 0."""
    _restore_copy = True

    def sync(self):
        self.value.load_state_dict(functions.broadcast_object(self.value.state_dict()))


class SamplerStateHandler(StateHandler):
    """An ElasticSampler: its epoch and processed indices. save and sync first make every
    rank's processed indices the union of all ranks' (an allgather_object); sync then commits
    rank 0's. restore and sync partition the rest of the epoch again, and so does reset (for
    the new size, also when the reset does not sync)."""

    def __init__(self, sampler):
        super().__init__(sampler)
        self._saved_sampler_state = copy.deepcopy(self.value.state_dict())

    def _union(self):
        parts = functions.allgather_object(self.value._gathered(),
                                           name="ringrun.elastic.sampler")
        return self.value._merge(parts)

    def save(self):
        self._saved_sampler_state = copy.deepcopy(self._union())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self._saved_sampler_state))

    def sync(self):
        self._union()
        self.value.load_state_dict(functions.broadcast_object(self.value.state_dict()))
        self._saved_sampler_state = copy.deepcopy(self.value.state_dict())

    def reset(self):
        self.value.reset()


def _scheduler_types():
    sched = torch.optim.lr_scheduler
    base = getattr(sched, "LRScheduler", None) or getattr(sched, "_LRScheduler")
    return (base, sched.ReduceLROnPlateau)


_handler_registry = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (_scheduler_types(), LRSchedulerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry():
    """The (type, handler class) pairs TorchState tries in order for each attribute."""
    return _handler_registry


def set_handler_registry(registry):
    global _handler_registry
    _handler_registry = registry


def _get_handler(value):
    for handler_type, handler_cls in _handler_registry:
        if isinstance(value, handler_type):
            return handler_cls(value)
    return None


def _get_handlers(kwargs):
    handlers, rest = {}, {}
    for k, v in kwargs.items():
        handler = _get_handler(v)
        if handler is not None:
            handlers[k] = handler
        else:
            rest[k] = v
    return handlers, rest


def _sync_order(handler):
    # Models last: broadcast_optimizer_state steps an optimizer that has no state yet (a new
    # rank's), which moves the parameters under weight decay; the models' broadcast then
    # makes them rank 0's again.
    return 1 if isinstance(handler, ModelStateHandler) else 0


class TorchState(ObjectState):
    """The state of PyTorch training: models, optimizers, LR schedulers and ElasticSamplers
    (given as any keyword arguments) are handled by type (get_handler_registry()); every
    other keyword argument is a plain object, as in ObjectState. All are attributes of the
    state: state.model, state.optimizer, state.epoch, ...

    Args:
        model: optional torch.nn.Module.
        optimizer: optional torch.optim.Optimizer.
        kwargs: more attributes.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, kwargs = _get_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=functions.broadcast_object, get_rank=mpi_ops.rank,
                         **kwargs)

    def save(self):
        # The handlers that gather first: a gather that fails leaves the whole commit as it was.
        handlers = sorted(self._handlers.values(),
                          key=lambda h: 0 if isinstance(h, SamplerStateHandler) else 1)
        for handler in handlers:
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in sorted(self._handlers.values(), key=_sync_order):
            handler.sync()
        super().sync()
        for handler in self._handlers.values():
            if not isinstance(handler, SamplerStateHandler):  # sync() has committed it
                handler.save()

    def reset(self):
        for handler in self._handlers.values():
            getattr(handler, "reset", lambda: None)()

    def __setattr__(self, name, value):
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)
