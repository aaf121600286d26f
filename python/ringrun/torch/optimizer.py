"""DistributedOptimizer (horovod/torch/optimizer.py) over libringrun.

Gradients are averaged in buckets, as DDP does: each parameter's gradient lives in a view of
one flat buffer per bucket (grads become those views), so a bucket is one allreduce with no
packing copy. A hook on each parameter's gradient accumulator counts backward passes; when
every gradient of a bucket is final, the bucket's allreduce starts while backward goes on with
earlier layers. Buckets start in a fixed order (reverse parameter order, which is the order
backward produces them), the same on every rank; step() waits for them.

Buckets: `groups` (Horovod's argument) fixes them explicitly; otherwise parameters are packed
in reverse order up to RINGRUN_BUCKET_BYTES (default 4 MiB) per bucket, per dtype and device.
"""
import contextlib
import itertools
import os
import threading
import warnings

import torch

from .. import _engine
from . import mpi_ops
from .compression import Compression

DEFAULT_BUCKET_BYTES = 4 << 20
# Optimizers made so far, which name their reductions: counted per process set, since a rank
# outside a set takes no number on it, and per registration of the set, since remove_process_set
# frees its id for the next add_process_set (whose optimizers count from 0 on every rank again).
# process set id -> (the set registered under it, its counter).
_instances = {}


def _next_instance(process_set_id, process_set):
    entry = _instances.get(process_set_id)
    if entry is None or entry[0] is not process_set:
        entry = _instances[process_set_id] = (process_set, itertools.count())
    return next(entry[1])


class _Bucket:
    def __init__(self, index, params):
        self.index = index
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.flat = torch.zeros(self.numel, dtype=params[0].dtype, device=params[0].device)
        self.views, off = {}, 0
        for p in params:
            self.views[p] = self.flat[off:off + p.numel()].view_as(p)
            off += p.numel()
        self.ready = 0
        self.handle = None
        self.wire = None
        self.ctx = None
        self.sparse = {}  # p -> sparse_dim, for gradients that arrived sparse (sparse_as_dense)
        self.gathered = {}  # p -> the wait of its sparse allreduce (without sparse_as_dense)
        self.after = None  # what the reduction leaves to do once the engine is done


def _auto_buckets(params, cap):
    by_key, order = {}, []
    for p in reversed(params):
        key = (p.dtype, p.device)
        if key not in by_key:
            by_key[key] = []
            order.append(key)
        by_key[key].append(p)
    buckets = []
    for key in order:
        current, nbytes = [], 0
        for p in by_key[key]:
            current.append(p)
            nbytes += p.numel() * p.element_size()
            if nbytes >= cap:
                buckets.append(current)
                current, nbytes = [], 0
        if current:
            buckets.append(current)
    return buckets


def _split_by_key(group):
    out = {}
    for p in group:
        out.setdefault((p.dtype, p.device), []).append(p)
    return list(out.values())


class _DistributedOptimizer(torch.optim.Optimizer):
    _ringrun_distributed = True  # step() reduces (see functions._initialize_state)

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1,
                 op=mpi_ops.Average, gradient_predivide_factor=1.0, groups=None,
                 sparse_as_dense=False, process_set_id=0, included=True,
                 process_set=mpi_ops.global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._process_set_id = process_set_id  # the gradients' reductions run on it
        # A rank outside the process set reduces nothing: as in Horovod, it registers no hooks
        # and its step() is the wrapped optimizer's, on its own gradients.
        self._included = included

        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", v)
                                for i, group in enumerate(self.param_groups)
                                for j, v in enumerate(group["params"])]
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        names = [k for k, _ in named_parameters]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError("Parameter names in named_parameters must be unique. Found "
                             "duplicates: %s" % ", ".join(dups))
        all_ids = {id(v) for group in self.param_groups for v in group["params"]}
        named_ids = {id(v) for _, v in named_parameters}
        unnamed = all_ids - named_ids
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model parameters "
                             "were not named. Python object ids: %s"
                             % ", ".join(str(i) for i in unnamed))
        self._parameter_names = {v: k for k, v in named_parameters}
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self._lock = threading.Lock()
        self._synchronized = False
        self._should_synchronize = True
        self._stepped_without_backward = False
        self._instance = _next_instance(process_set_id, process_set) if included else None

        params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        if not included:
            params = []
        self._buckets = self._make_buckets(params, groups)
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._allreduce_delay = {p: backward_passes_per_step for p in params}
        self._next_launch = 0
        self._grad_accs = []
        for p in params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_hook(p))
            self._grad_accs.append(acc)

    def _make_buckets(self, params, groups):
        known = set(params)
        lists = []
        if groups is not None:
            if isinstance(groups, int):
                if groups > 0:
                    k, rem = divmod(len(params), groups)
                    start = 0
                    for g in range(groups):
                        end = start + k + (1 if g < rem else 0)
                        if end > start:
                            lists.append(params[start:end])
                        start = end
            elif isinstance(groups, list) and all(isinstance(g, (list, tuple)) for g in groups):
                seen = set()
                for g in groups:
                    members = []
                    for p in g:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups should be a non-negative integer or a list "
                                             "of list of torch.Tensor.")
                        if p in seen:
                            raise ValueError("a parameter appears in more than one group")
                        if p in known:
                            seen.add(p)
                            members.append(p)
                    if members:
                        lists.append(members)
            else:
                raise ValueError("groups should be a non-negative integer or a list of list of "
                                 "torch.Tensor.")
        grouped = {p for g in lists for p in g}
        rest = [p for p in params if p not in grouped]
        cap = int(os.environ.get("RINGRUN_BUCKET_BYTES", DEFAULT_BUCKET_BYTES))
        # Explicit groups first (reverse order, as backward produces them), then the rest.
        lists = [sub for g in reversed(lists) for sub in _split_by_key(g)]
        lists += _auto_buckets(rest, cap)
        return [_Bucket(i, ps) for i, ps in enumerate(lists)]

    def _make_hook(self, p):
        def hook(*ignore):
            with self._lock:
                if self._allreduce_delay[p] <= 0:
                    raise AssertionError(
                        "Gradients were computed more than backward_passes_per_step times before "
                        "call to step(). Increase backward_passes_per_step to accumulate "
                        "gradients locally.")
                self._allreduce_delay[p] -= 1
                self._stepped_without_backward = False
                self._synchronized = False  # new gradients: the next step() reduces them
                if self._allreduce_delay[p] == 0:
                    b = self._bucket_of[p]
                    b.ready += 1
                    if b.ready == len(b.params):
                        self._launch_ready()
        return hook

    def _launch_ready(self):
        while (self._next_launch < len(self._buckets)
               and self._buckets[self._next_launch].ready == len(self._buckets[self._next_launch].params)):
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    def _launch(self, b):
        with _engine.process_set(self._process_set_id):  # any thread: autograd's hooks too
            self._launch_on_set(b)

    def _launch_on_set(self, b):
        for p in b.params:
            view = b.views[p]
            g = p.grad
            if g is None:
                view.zero_()
                p.grad = view
            elif g.is_sparse:  # before data_ptr(): a sparse tensor has none
                if not self.sparse_as_dense:
                    # As Horovod: every rank's indices and values, allgathered. Its slot in
                    # the bucket travels as zeros.
                    view.zero_()
                    b.gathered[p] = mpi_ops.sparse_allreduce_async(
                        g, f"DistributedOptimizer{self._instance}.sparse."
                        f"{self._parameter_names[p]}", self.op)
                    continue
                b.sparse[p] = g.sparse_dim()
                view.copy_(g.to_dense())
                p.grad = view
            elif g.data_ptr() != view.data_ptr():
                view.copy_(g)
                p.grad = view
        wire, ctx = self._compression.compress(b.flat)
        b.wire, b.ctx = wire, ctx
        f = self.gradient_predivide_factor
        pre, post = (1.0 / f, f) if f != 1.0 else (1.0, 1.0)
        op = mpi_ops.Sum if self.op == mpi_ops.Adasum else self.op  # Adasum: at size() 1 only
        send, recv, dtype, op, pre, post, b.after = mpi_ops._reduction(
            wire, wire, op, pre, post, _engine.set_size())
        mpi_ops._prepare_device(send, recv)
        b.handle = mpi_ops._submit(lambda: _engine.allreduce(
            send.data_ptr(), recv.data_ptr(), send.numel(), dtype, op,
            f"DistributedOptimizer{self._instance}.bucket{b.index}", pre, post,
            keep=(send, recv)))

    def synchronize(self):
        """Waits for every gradient's allreduce (starting those not started: gradients that were
        not computed count as zeros), and leaves the averaged gradients in p.grad."""
        with self._lock:
            for b in self._buckets[self._next_launch:]:
                b.ready = len(b.params)
            self._launch_ready()
        try:
            for b in self._buckets:
                if b.handle is not None:
                    mpi_ops._internal(lambda: _engine.wait(b.handle))
                    b.handle = None
                    if b.after is not None:
                        b.after()
                    if b.wire is not b.flat:
                        b.flat.copy_(self._compression.decompress(b.wire, b.ctx))
                    b.wire = b.ctx = b.after = None
                    for p, wait in b.gathered.items():
                        p.grad = mpi_ops._internal(wait)
                    b.gathered = {}
                    # Horovod's sparse_as_dense: reduced dense, handed back sparse (SparseAdam
                    # and other sparse-only optimizers refuse a dense gradient).
                    for p, sparse_dim in b.sparse.items():
                        p.grad = b.views[p].to_sparse(sparse_dim)
                    b.sparse = {}
        finally:
            with self._lock:
                for b in self._buckets:
                    b.ready = 0
                for p in self._allreduce_delay:
                    self._allreduce_delay[p] = self.backward_passes_per_step
                self._next_launch = 0
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """A context in which step() does not synchronize (after a manual synchronize())."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _pending(self):
        bpps = self.backward_passes_per_step
        return any(d != bpps for d in self._allreduce_delay.values())

    def _reset(self, failures="raise"):
        """Waits for the buckets in flight (their allreduces are on the wire and write the
        buckets) and forgets the backward passes counted so far. Every bucket is waited for
        even when one fails; then the first failure is raised, unless failures="drop" (a
        rollback: the gradients are forgotten anyway)."""
        first = None
        try:
            for b in self._buckets:
                waits = []
                if b.handle is not None:
                    h, b.handle = b.handle, None
                    waits.append(lambda h=h: _engine.wait(h))
                gathered, b.gathered = b.gathered, {}
                waits.extend(gathered.values())
                for wait in waits:
                    try:
                        mpi_ops._internal(wait)
                    except mpi_ops.HorovodInternalError as e:
                        first = first or e
        finally:
            with self._lock:
                for b in self._buckets:
                    b.ready, b.wire, b.ctx, b.sparse, b.after = 0, None, None, {}, None
                    b.gathered = {}
                for p in self._allreduce_delay:
                    self._allreduce_delay[p] = self.backward_passes_per_step
                self._next_launch = 0
            self._synchronized = False
            self._stepped_without_backward = False
        if first is not None and failures == "raise":
            raise first

    def set_backward_passes_per_step(self, passes):
        """As Horovod's: a new number of local passes per step, counted from now."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = passes
        self._reset()

    def load_state_dict(self, *args, **kwargs):
        """As Horovod's: a rollback also forgets the gradients of passes since the last step,
        and the failures of their reductions (elastic.run restores the state after one)."""
        self._reset(failures="drop")
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    def step(self, closure=None):
        loss = None
        if closure is not None:
            # Before synchronize: the closure's backward produces the gradients that this step
            # averages (torch's optimizers would run it inside their step, after it).
            with torch.enable_grad():
                loss = closure()
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(). The gradients are already "
                              "averaged: ringrun does not reduce them again.")
            else:
                if self._stepped_without_backward and self._included and not self._pending():
                    raise AssertionError(
                        "optimizer.step() was called twice without a backward pass in between; "
                        "the gradients would be averaged again. Call loss.backward() before each "
                        "step().")
                self.synchronize()
        self._synchronized = False
        self._stepped_without_backward = True
        out = super(self.__class__, self).step()
        return loss if closure is not None else out

    def zero_grad(self, *args, **kwargs):
        if self._pending():
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """Horovod's Adasum optimizer: once a parameter's gradients of backward_passes_per_step
    passes are in, the wrapped optimizer steps that parameter alone, and the change it made is
    combined over the ranks with Adasum (adasum.py); step() waits and applies each combined
    change to the parameter's value before the local step."""
    _ringrun_distributed = True

    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is None:
            named_parameters = [(f"allreduce.noname.{i}", p) for i, p in enumerate(params)]
        named_parameters = list(named_parameters)
        if any(not isinstance(p, tuple) for p in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, parameter), "
                             "usually produced by model.named_parameters().")
        self._parameter_names = {v: k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._instance = _next_instance(0, mpi_ops.global_process_set)
        self._delay = {}
        self._handles = {}
        self._starts = {}
        self._grad_accs = []
        for p in params:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                self._delay[p] = backward_passes_per_step
                self._starts[p] = torch.zeros_like(p, requires_grad=False)
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(p))
                self._grad_accs.append(acc)

    def _start(self, p):
        """The wrapped optimizer's step on p alone; p then holds the change, reduced with
        Adasum in place."""
        start = self._starts[p]
        stashed = [g["params"] for g in self.param_groups]
        for g in self.param_groups:
            g["params"] = [p] if any(p is q for q in g["params"]) else []
        try:
            start.copy_(p.data)
            super(self.__class__, self).step()
            p.data.sub_(start)
        finally:
            for g, ps in zip(self.param_groups, stashed):
                g["params"] = ps
        wire, ctx = self._compression.compress(p.data)
        name = f"DistributedAdasumOptimizer{self._instance}.{self._parameter_names.get(p)}"
        return mpi_ops.allreduce_async_(wire, name=name, op=mpi_ops.Adasum), ctx

    def _make_hook(self, p):
        def hook(*ignore):
            if self._delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients "
                    "locally.")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._handles[p] = self._start(p)
        return hook

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def synchronize(self):
        pass

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum "
                             "optimizer.")

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in self._delay:  # in the same order on every rank
            if p not in self._handles:
                self._handles[p] = self._start(p)
        try:
            for p, (h, ctx) in self._handles.items():
                delta = self._compression.decompress(mpi_ops.synchronize(h), ctx)
                start = self._starts[p]
                start.add_(delta.data)
                p.data.copy_(start)
                self._delay[p] = self.backward_passes_per_step
        finally:
            self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize(). This is "
                                 "prohibited as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=mpi_ops.Average,
                         gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=mpi_ops.global_process_set):
    """Wraps a torch optimizer so that step() applies gradients averaged over every rank (of
    process_set; on a rank outside it, as in Horovod, step() is the wrapped optimizer's on the
    rank's own gradients).

    Arguments as Horovod's: named_parameters (names for the gradients), compression
    (Compression.none, .fp16, .bf16), backward_passes_per_step (local accumulation passes per
    step), op (Average, Sum, Min, Max, Product), gradient_predivide_factor (Average only: divide
    by it before the sum and multiply after), groups (an int, or lists of parameters that are
    reduced together). op=Adasum at size() > 1 is Horovod's Adasum optimizer (see
    _DistributedAdasumOptimizer)."""
    mpi_ops._check_op(op)
    ps_id = mpi_ops._check_process_set(process_set, "DistributedOptimizer")
    included = ps_id == 0 or bool(process_set.included())
    if op == mpi_ops.Adasum and ps_id != 0:
        raise NotImplementedError("DistributedOptimizer: op=Adasum on a process set other than "
                                  "the global one is not supported")
    if gradient_predivide_factor != 1.0 and op != mpi_ops.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == mpi_ops.Adasum and mpi_ops.size() > 1:
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression,
                   backward_passes_per_step)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
               op, gradient_predivide_factor, groups, sparse_as_dense, ps_id, included,
               process_set)
