"""Horovod's tensor collectives (horovod/torch/mpi_ops.py) over libringrun.

Asynchronous calls return an int handle for poll() and synchronize(); the tensors involved stay
referenced until synchronize() returns the output. Runtime failures raise HorovodInternalError
with the runtime's message.
"""
import functools
import inspect
import itertools
import threading
import warnings

import torch

import ringrun

from .. import _engine, _lib
from . import process_sets as _ps
from .compression import Compression
from .process_sets import (ProcessSet, add_process_set, global_process_set,  # noqa: F401
                           remove_process_set)

# ---- Process functions -----------------------------------------------------------------------


class HorovodInternalError(RuntimeError):
    """A collective failed in the runtime (a peer died, the timeout passed, ...). Inside
    ringrun.torch.elastic.run, the state goes back to its last commit and the job re-forms."""


class HostsUpdatedInterrupt(RuntimeError):
    """The launcher changed the job's hosts (ringrun.torch.elastic: State.check_host_updates
    raises it on every rank at once). Inside elastic.run the job re-forms without going back
    to the last commit; skip_sync: the state need not be broadcast again, unless a rank needs
    it (elastic.run decides that with every rank)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts were updated")
        self.skip_sync = skip_sync


def init(comm=None, process_sets=None):
    """Joins the ringrun job. comm (MPI communicators, or a subset of ranks) is not supported.
    process_sets: None, a list of ProcessSet, or "dynamic" (as Horovod's; see
    process_sets.py for what a set other than the global one can do)."""
    if comm is not None and not (isinstance(comm, (list, tuple)) and not comm):
        raise ValueError("ringrun.torch.init: comm= (an MPI communicator or a list of ranks) is "
                         "not supported; ringrun runs every rank of the job")
    if ringrun.is_initialized():
        return  # a second call does nothing; registered process sets stay
    try:
        ringrun.init()
    except _lib.RingrunError as e:
        raise HorovodInternalError(str(e)) from None
    _ps.setup(process_sets)


shutdown = ringrun.shutdown
is_initialized = ringrun.is_initialized


def _shape_fn(name):
    core = getattr(ringrun, name)

    def fn():
        if not ringrun.is_initialized():
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        return core()
    fn.__name__ = name
    fn.__doc__ = core.__doc__
    return fn


size, rank = _shape_fn("size"), _shape_fn("rank")
local_size, local_rank = _shape_fn("local_size"), _shape_fn("local_rank")
cross_size, cross_rank = _shape_fn("cross_size"), _shape_fn("cross_rank")


def nccl_built():
    """As Horovod's: the NCCL version that libringrun was built with (NCCL_VERSION_CODE, e.g.
    22809 for 2.28.9), or 0 without NCCL. CUDA tensors go through NCCL."""
    return _lib.lib.ringrun_nccl_version()


def cuda_built():
    """True when libringrun has its GPU backend (which comes with NCCL)."""
    return nccl_built() != 0


def mpi_built():
    return False


def gloo_built():
    return False


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Creates a timeline file at `file_path` and begins recording, as Horovod's: rank 0
    writes `file_path`, rank r > 0 `t.<r>.json` beside `t.json`; the name given to ringrun's
    `--timeline-filename` goes to the one file the launcher writes (docs/engine.md, "Timeline").
    mark_cycles: a CYCLE_START mark per engine cycle. Needs HOROVOD_TIMELINE (DYNAMIC, or a file)
    at init. Safe while collectives are in flight; returns once the engine has switched.

    Raises a `ValueError` if Horovod is not initialized or the timeline is not enabled.
    """
    rc = _lib.lib.ringrun_start_timeline(str(file_path).encode("utf-8"), int(bool(mark_cycles)))
    _timeline_result(rc, "start_timeline")


def stop_timeline():
    """Stops the active timeline recording and closes the file (nothing to do without one).

    Raises a `ValueError` if Horovod is not initialized.
    """
    _timeline_result(_lib.lib.ringrun_stop_timeline(), "stop_timeline")


def _timeline_result(rc, what):
    if rc == _lib.ERR_NOT_INITIALIZED:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    if rc == _lib.ERR_INVALID_ARGUMENT:
        raise ValueError(f"{what}: {_lib.error_message()}")
    _lib.check(rc, what)


def mpi_enabled():
    return False


def gloo_enabled():
    return False


def mpi_threads_supported():
    """Always False: ringrun does not use MPI (its own collectives are thread-safe)."""
    if not ringrun.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return False


# ---- Ops, dtypes, handles ----------------------------------------------------------------------

Sum, Average, Min, Max, Product = (ringrun.Sum, ringrun.Average, ringrun.Min, ringrun.Max,
                                   ringrun.Product)
Adasum = 100  # not an engine op: allreduce runs it in Python (adasum.py)
_OPS = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product",
        Adasum: "Adasum"}

_DTYPES = {torch.int8: _lib.INT8, torch.uint8: _lib.UINT8, torch.int16: _lib.INT16,
           torch.int32: _lib.INT32, torch.int64: _lib.INT64, torch.float16: _lib.FLOAT16,
           torch.bfloat16: _lib.BFLOAT16, torch.float32: _lib.FLOAT32,
           torch.float64: _lib.FLOAT64}


def _dtype(tensor):
    d = _DTYPES.get(tensor.dtype)
    if d is None:
        raise ValueError("Tensor type %s is not supported." % tensor.type())
    return d


def _check_dtype(tensor):
    _dtype(tensor)


def _check_op(op):
    if op not in _OPS:
        raise ValueError(f"unknown op {op!r}; supported ops: Average, Sum, Adasum, Min, Max, "
                         "Product")


def _reserve(kind, name):
    """name, or this rank's next automatic name of kind (_engine.auto_name), taken before any
    check of the arguments: a call that one rank refuses still takes its name there, so the
    names of later unnamed collectives stay the same on every rank."""
    return _engine.auto_name(kind, name)


def _check_process_set(process_set, what="collective"):
    """process_set's id (ValueError when it is not registered)."""
    return _ps.check(process_set, what)


def _on_set(what):
    """Runs the decorated collective (which has a process_set parameter) on its process set:
    the collectives it submits on this thread go to that set's engine (_engine.process_set), and
    _engine.set_size()/set_rank() are the set's. The global set changes nothing (a collective
    called with it inside another's keeps that one: sparse_allreduce_async's parts)."""
    def wrap(fn):
        index = list(inspect.signature(fn).parameters).index("process_set")

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if "process_set" in kwargs:
                ps = kwargs["process_set"]
            else:
                ps = args[index] if len(args) > index else global_process_set
            if ps is global_process_set:
                return fn(*args, **kwargs)
            with _engine.process_set(_ps.check(ps, what)):
                return fn(*args, **kwargs)
        return call
    return wrap


def handle_average_backwards_compatibility(op, average):
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in "
                      "v1.0", DeprecationWarning)
        return Average if average else Sum
    return Average


# ---- CUDA tensors ------------------------------------------------------------------------------
# A device submission reads its buffers after the work enqueued before it on the legacy default
# stream (ringrun.h). torch's other streams are non-blocking (the default stream does not follow
# them), so before submitting, the default stream waits for the caller's current stream
# (cudaStreamWaitEvent, no host wait): the collective reads what the caller's stream produced,
# and writes outputs only after the caller's earlier work (the caching allocator may hand out a
# block that earlier work on that stream still reads). The handle completes once the result is
# in device memory, so after synchronize() every stream sees it. Results that the C API returns
# in memory the handle owns (allgather, alltoall) are copied into a new tensor on the current
# stream, and the handle is released once that copy has run.


def _prepare_device(*tensors):
    """Orders CUDA tensors' submission after the caller's current stream (see above)."""
    devices = {t.device for t in tensors if t.is_cuda}
    if not devices:
        return
    if len(devices) > 1 or len(devices) != len({t.device for t in tensors}):
        raise ValueError("the tensors of one collective must be on one device, not "
                         f"{sorted(str(d) for d in {t.device for t in tensors})}")
    for d in devices:
        current, default = torch.cuda.current_stream(d), torch.cuda.default_stream(d)
        if current.cuda_stream != default.cuda_stream:
            default.wait_stream(current)


def _cuda_array(ptr, nbytes):
    """nbytes of device memory at ptr as a __cuda_array_interface__ (v2: no stream to wait for;
    the memory is ready when this is used)."""
    return {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "strides": None,
            "version": 2}


class _DeviceBytes:
    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = _cuda_array(ptr, nbytes)


def _byte_view(tensor):
    """A contiguous tensor's bytes as a 1-D uint8 view."""
    return tensor.reshape(-1).view(torch.uint8)


def _device_copier(out):
    """device_copy for _engine.allgatherv/alltoallv: out[0] (set by alloc) gets the handle's
    device output, on the current stream; returns the event that says when the copy is done."""
    def copy(_recv, data, nbytes):
        dst = out[0]
        _byte_view(dst).copy_(torch.as_tensor(_DeviceBytes(data, nbytes), device=dst.device))
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(dst.device))
        return done
    return copy


class _Pending:
    """What a handle id stands for. `lock` makes one synchronize at a time wait and run finish;
    `outcome` is (result, error) once one has, for a synchronize on another thread that came
    in meanwhile."""
    __slots__ = ("handles", "finish", "keep", "lock", "outcome")

    def __init__(self, handles, finish, keep):
        self.handles, self.finish, self.keep = handles, finish, keep
        self.lock = threading.Lock()
        self.outcome = None


_handle_map = {}
_handle_lock = threading.Lock()
_handle_ids = itertools.count(1)


def _register(handles, finish, keep=()):
    h = next(_handle_ids)
    with _handle_lock:
        _handle_map[h] = _Pending(handles, finish, keep)
    return h


def _internal(fn):
    try:
        return fn()
    except _lib.RingrunError as e:
        raise HorovodInternalError(str(e)) from None


def poll(handle):
    """True once the operation behind handle has completed (synchronize() then returns at once)."""
    with _handle_lock:
        p = _handle_map.get(handle)
    if p is None:
        raise ValueError(f"handle {handle} was not created or has been synchronized")
    return all(_engine.poll(h) for h in p.handles)


def synchronize(handle):
    """Waits for an asynchronous operation and returns its output."""
    with _handle_lock:
        p = _handle_map.get(handle)
    if p is None:
        raise ValueError(f"handle {handle} was not created or has been synchronized")
    with p.lock:
        if p.outcome is None:
            try:
                results = _internal(lambda: [_engine.wait(h) for h in p.handles])
                p.outcome = (p.finish(results), None)
            except Exception as e:  # noqa: B902 - raised below, here and to concurrent callers
                p.outcome = (None, e)
            finally:
                # Also when interrupted (KeyboardInterrupt): the handles still pending are
                # dropped with p, and the engine keeps their buffers until they complete.
                with _handle_lock:
                    _handle_map.pop(handle, None)
    result, error = p.outcome
    if error is not None:
        _engine.raise_shared(error)
    return result


def _submit(make):
    try:
        return make()
    except _lib.RingrunError as e:
        raise HorovodInternalError(str(e)) from None


# ---- allreduce -------------------------------------------------------------------------------


def _int_scaled(t, factor):
    """t * factor as Horovod scales an integer buffer (ScaleBuffer: output = factor * input, in
    double, converted back truncating toward zero). A new tensor unless factor is 1."""
    if factor == 1.0:
        return t
    return (t.to(torch.float64) * factor).to(t.dtype)


def _reduction(tensor, output, op, prescale, postscale, n):
    """How one tensor is reduced: (send, recv, dtype code, engine op, engine prescale, engine
    postscale, after). The engine reduces send into recv; after(), when not None, runs once it
    has and leaves the result in output.

    Floating tensors go to the engine as they are, with their op and factors, except CUDA
    tensors with factors, which are scaled here as Horovod's GPU path does. Integer tensors
    (the engine takes no factors and no Average for them) get Horovod's answers: each factor is
    applied as Horovod's ScaleBuffer applies it (_int_scaled), prescale before a Sum and
    postscale after it, and Average is that Sum with the postscale factor divided by the job's
    size, so it truncates toward zero."""
    if tensor.dtype.is_floating_point:
        if not tensor.is_cuda or (prescale == 1.0 and postscale == 1.0):
            return (tensor, output, _dtype(tensor), op, float(prescale), float(postscale), None)
        # Horovod's GPU arithmetic (_scaled), each factor applied once around a Sum, where the
        # engine's device path would fold both into one factor before the sum.
        send = _scaled(tensor, prescale)
        factor = postscale / n if op == Average else postscale

        def after_device():
            if factor != 1.0:
                output.copy_(_scaled(output, factor))
        return (send, output, _dtype(send), Sum if op == Average else op, 1.0, 1.0,
                after_device)
    _check_dtype(tensor)
    send = _int_scaled(tensor, prescale)
    factor = postscale / n if op == Average else postscale

    def after():
        if factor != 1.0:
            output.copy_(_int_scaled(output, factor))
    return (send, output, _dtype(send), Sum if op == Average else op, 1.0, 1.0, after)


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor):
    _check_op(op)
    _check_dtype(tensor)
    if not output.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    tensor = tensor.contiguous()
    if op == Adasum:
        from . import adasum
        return adasum.allreduce_async(tensor, output, name, prescale_factor, postscale_factor)
    n = _engine.set_size()  # now: finish may run after shutdown
    send, recv, d, c_op, pre, post, after = _reduction(tensor, output, op, prescale_factor,
                                                       postscale_factor, n)
    _prepare_device(tensor, output, send, recv)  # after _reduction, which may scale on the device
    h = _submit(lambda: _engine.allreduce(send.data_ptr(), recv.data_ptr(), send.numel(), d,
                                          c_op, name, pre, post, keep=(send, recv),
                                          shape=tuple(tensor.shape)))

    def finish(_):
        if after is not None:
            after()
        return output
    return _register([h], finish, (tensor, output, send, recv))


@_on_set("allreduce")
def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    """Starts averaging (or op) of tensor over all ranks into a new tensor; returns a handle."""
    name = _reserve("allreduce", name)
    op = handle_average_backwards_compatibility(op, average)
    _check_process_set(process_set, "allreduce")
    return _allreduce_async(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format),
                            name, op, prescale_factor, postscale_factor)


@_on_set("allreduce")
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce_async."""
    name = _reserve("allreduce", name)
    op = handle_average_backwards_compatibility(op, average)
    _check_process_set(process_set, "allreduce")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor)


class HorovodAllreduce(torch.autograd.Function):
    """allreduce with a gradient: the gradient is allreduced with the same op and factors."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op = average, op
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        ctx.process_set = process_set
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                           postscale_factor, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, average=ctx.average, op=ctx.op,
                          prescale_factor=ctx.prescale_factor,
                          postscale_factor=ctx.postscale_factor,
                          process_set=ctx.process_set), None, None, None, None, None, None)


@_on_set("allreduce")
def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Averages (or op) tensor over all ranks; returns a new tensor. Differentiable."""
    compressed, ctx = compression.compress(tensor)
    out = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor,
                                 postscale_factor, process_set)
    return compression.decompress(out, ctx)


@_on_set("allreduce")
def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    """In-place allreduce; returns tensor."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


# ---- grouped allreduce -----------------------------------------------------------------------


def _grouped_allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor):
    _check_op(op)
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    for t, o in zip(tensors, outputs):
        _check_dtype(t)
        if not o.is_contiguous():
            raise ValueError("Tensor is required to be contiguous.")
        if o.device != t.device:
            raise ValueError(f"grouped_allreduce: an output on {o.device} for a tensor on "
                             f"{t.device}")
    inputs = [t.contiguous() for t in tensors]
    if op == Adasum:
        from . import adasum
        return adasum.grouped_allreduce_async(inputs, outputs, name, prescale_factor,
                                              postscale_factor)
    n = _engine.set_size()  # now: finish may run after shutdown
    plans = [_reduction(t, o, op, prescale_factor, postscale_factor, n)
             for t, o in zip(inputs, outputs)]
    keys = [(p[2], str(t.device)) for p, t in zip(plans, inputs)]
    handles = []
    for (d, _), idx, group_name in _groups(keys, name):
        group = [plans[i] for i in idx]
        _prepare_device(*[p[0] for p in group], *[p[1] for p in group])  # one device
        _, _, _, c_op, pre, post, _ = group[0]
        entries = [(p[0].data_ptr(), p[1].data_ptr(), p[0].numel()) for p in group]
        shapes = [tuple(inputs[i].shape) for i in idx]
        handles.append(_submit(lambda: _engine.grouped_allreduce(
            entries, d, c_op, group_name, pre, post, keep=plans, shapes=shapes)))

    def finish(_):
        for p in plans:
            if p[6] is not None:
                p[6]()
        return list(outputs)
    return _register(handles, finish, (inputs, outputs, plans))


def _groups(keys, name):
    """Splits a grouped allreduce into one collective per (dtype, device) key: [(key, indices,
    name)] in key order. With several groups, each name gets the dtype (and, when the devices
    differ, the device) as a suffix."""
    by_key = {}
    for i, k in enumerate(keys):
        by_key.setdefault(k, []).append(i)
    several_devices = len({dev for _, dev in by_key}) > 1
    groups = []
    for (d, dev), idx in sorted(by_key.items()):
        group_name = name
        if name is not None and len(by_key) > 1:
            group_name = f"{name}.{_lib.DTYPE_NAMES[d]}" + (f".{dev}" if several_devices else "")
        groups.append(((d, dev), idx, group_name))
    return groups


@_on_set("grouped_allreduce")
def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    """Starts one fused allreduce of a list of tensors into new tensors; returns a handle."""
    name = _reserve("grouped_allreduce", name)
    op = handle_average_backwards_compatibility(op, average)
    _check_process_set(process_set, "grouped_allreduce")
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _grouped_allreduce_async(list(tensors), outputs, name, op, prescale_factor,
                                    postscale_factor)


@_on_set("grouped_allreduce")
def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    name = _reserve("grouped_allreduce", name)
    op = handle_average_backwards_compatibility(op, average)
    _check_process_set(process_set, "grouped_allreduce")
    return _grouped_allreduce_async(list(tensors), list(tensors), name, op, prescale_factor,
                                    postscale_factor)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        average, op, pre, post, ps = ctx.args
        grads = grouped_allreduce(list(grad_outputs), average=average, op=op, prescale_factor=pre,
                                  postscale_factor=post, process_set=ps)
        return (None, None, None, None, None, None, *grads)


@_on_set("grouped_allreduce")
def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one fused collective; returns new tensors."""
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor,
                                         process_set, *[t for t, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


@_on_set("grouped_allreduce")
def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


# ---- allgather ---------------------------------------------------------------------------------


def _rows(tensor):
    t = tensor.contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    row_elems = 1
    for s in t.shape[1:]:
        row_elems *= s
    return t, t.shape[0], row_elems


def _allgather_async(tensor, name):
    """The engine handle of an allgather, and the list that gets every rank's rows once it
    completes."""
    dtype = _dtype(tensor)
    t, rows, row_elems = _rows(tensor)
    _prepare_device(t)
    counts_out, out = [], []

    def alloc(counts):
        counts_out.extend(counts)
        out.append(torch.empty((sum(counts),) + tuple(t.shape[1:]), dtype=t.dtype,
                               device=t.device))
        return out[0], out[0].data_ptr()
    copy = _device_copier(out) if t.is_cuda else None
    h = _submit(lambda: _engine.allgatherv(t.data_ptr(), rows, row_elems, dtype, alloc, name,
                                           keep=(t,), device_copy=copy, shape=tuple(t.shape)))
    return h, counts_out


@_on_set("allgather")
def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's tensor on the first dimension; returns a handle."""
    name = _reserve("allgather", name)
    _check_process_set(process_set, "allgather")
    h, _ = _allgather_async(tensor, name)
    return _register([h], lambda results: results[0])


def _gather_grad(grads, counts_per_tensor, process_set):
    """The gradient of allgather, as Horovod's: the Average-allreduce of the output's
    gradients over the set, sliced to this rank's rows."""
    reduced = grouped_allreduce([g.contiguous() for g in grads], op=Average,
                                process_set=process_set)
    me = process_set.rank()
    return [g.narrow(0, sum(c[:me]), c[me]) for g, c in zip(reduced, counts_per_tensor)]


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        name = _reserve("allgather", name)
        _check_process_set(process_set, "allgather")
        h, counts = _allgather_async(tensor, name)
        out = synchronize(_register([h], lambda results: results[0]))
        ctx.counts = list(counts)
        ctx.process_set = process_set
        return out

    @staticmethod
    def backward(ctx, grad_output):
        # Averaged over the set's ranks, as current Horovod does (older versions summed).
        grad = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        me = ctx.process_set.rank()
        return grad.narrow(0, sum(ctx.counts[:me]), ctx.counts[me]), None, None


@_on_set("allgather")
def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's tensor concatenated on the first dimension (first dimensions may differ).
    Differentiable."""
    return HorovodAllgather.apply(tensor, name, process_set)


def _member_names(name, n):
    """The names of a group's members, as the engine names a grouped allreduce's: None (each
    gets an automatic name) or "<name>.<i>of<n>"."""
    return [None if name is None else f"{name}.{i}of{n}" for i in range(n)]


def _grouped_allgather_async(tensors, name):
    if not tensors:
        raise ValueError("grouped_allgather needs at least one tensor")
    for t in tensors:
        _check_dtype(t)
    parts = [_allgather_async(t, nm) for t, nm in zip(tensors, _member_names(name, len(tensors)))]
    return [h for h, _ in parts], [c for _, c in parts]


@_on_set("grouped_allgather")
def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts allgathers of a list of tensors; synchronize() returns the list of results.
    Each member is its own submission, named "<name>.<i>of<n>"."""
    name = _reserve("grouped_allgather", name)
    _check_process_set(process_set, "grouped_allgather")
    handles, _ = _grouped_allgather_async(list(tensors), name)
    return _register(handles, list)


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        name = _reserve("grouped_allgather", name)
        _check_process_set(process_set, "grouped_allgather")
        handles, counts = _grouped_allgather_async(list(tensors), name)
        outs = synchronize(_register(handles, list))
        ctx.counts = [list(c) for c in counts]
        ctx.process_set = process_set
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None, *_gather_grad(grad_outputs, ctx.counts, ctx.process_set))


@_on_set("grouped_allgather")
def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers each tensor of a list; returns the list of results. Differentiable."""
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ---- broadcast ---------------------------------------------------------------------------------


def _broadcast_async(tensor, output, root_rank, name):
    dtype = _dtype(tensor)
    if not output.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    n = size()
    if not 0 <= root_rank < n:
        raise ValueError(f"root_rank {root_rank} is not a rank of this job (size {n})")
    tensor = tensor.contiguous()
    if tensor.is_cuda and output.data_ptr() != tensor.data_ptr():
        output.copy_(tensor)  # on the current stream; the device broadcast runs in place
        tensor = output
    _prepare_device(tensor, output)
    h = _submit(lambda: _engine.broadcast(tensor.data_ptr(), output.data_ptr(), tensor.numel(),
                                          dtype, root_rank, name, keep=(tensor, output),
                                          shape=tuple(tensor.shape)))
    return _register([h], lambda _: output, (tensor, output))


@_on_set("broadcast")
def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    name = _reserve("broadcast", name)
    _check_process_set(process_set, "broadcast")
    return _broadcast_async(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format),
                            _ps.root_in_set(process_set, root_rank), name)


@_on_set("broadcast")
def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    name = _reserve("broadcast", name)
    _check_process_set(process_set, "broadcast")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return _broadcast_async(tensor, tensor, _ps.root_in_set(process_set, root_rank), name)


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output.contiguous(), op=Average,
                         process_set=ctx.process_set)  # as Horovod's
        if rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


@_on_set("broadcast")
def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's tensor, as a new tensor on every rank. Differentiable."""
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


@_on_set("broadcast")
def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---- alltoall, reducescatter, barrier, join ---------------------------------------------------


def _split_list(splits):
    """splits as a list of ints, checked as Horovod checks them: a tensor must be 1-D int32;
    anything else becomes torch.tensor(splits, dtype=torch.int32). None, or no entries: equal
    shares."""
    if splits is None:
        return None
    if not torch.is_tensor(splits):
        splits = torch.tensor(splits, dtype=torch.int32)
    if splits.dim() != 1:
        raise ValueError("alltoall expects a 1D splits tensor")
    if splits.dtype != torch.int32:
        raise ValueError("alltoall expects splits to contain 32-bit integer elements.")
    return splits.tolist() or None


def _alltoall_async(tensor, splits, name):
    """A handle whose result is (output, received_splits) whether or not splits were given;
    received_splits is int32, on the device of splits when they were a tensor (as Horovod)."""
    dtype = _dtype(tensor)
    split_list = _split_list(splits)
    splits_device = splits.device if torch.is_tensor(splits) else torch.device("cpu")
    t, rows, row_elems = _rows(tensor)
    n = _engine.set_size()
    if split_list is None:
        if rows % n:
            raise ValueError(f"alltoall: the first dimension ({rows}) is not divisible by the "
                             f"number of ranks ({n}); pass splits")
        split_list = [rows // n] * n
    if len(split_list) != n or sum(split_list) != rows or min(split_list) < 0:
        raise ValueError(f"alltoall: splits {split_list} must have {n} non-negative entries that "
                         f"sum to the first dimension ({rows})")

    _prepare_device(t)
    out = []

    def alloc(received):
        out.append(torch.empty((sum(received),) + tuple(t.shape[1:]), dtype=t.dtype,
                               device=t.device))
        received = torch.tensor(received, dtype=torch.int32).to(splits_device)
        return (out[0], received), out[0].data_ptr()
    copy = _device_copier(out) if t.is_cuda else None
    return _submit(lambda: _engine.alltoallv(t.data_ptr(), split_list, row_elems, dtype, alloc,
                                             name, keep=(t,), device_copy=copy,
                                             shape=tuple(t.shape)))


@_on_set("alltoall")
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    name = _reserve("alltoall", name)
    _check_process_set(process_set, "alltoall")
    h = _alltoall_async(tensor, splits, name)
    return _register([h], lambda results: results[0] if splits is not None else results[0][0])


class HorovodAlltoall(torch.autograd.Function):
    """The gradient of an alltoall is the alltoall of the output's gradient back, with the
    received splits as splits (as Horovod's)."""
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        name = _reserve("alltoall", name)
        _check_process_set(process_set, "alltoall")
        output, received = synchronize(_register([_alltoall_async(tensor, splits, name)],
                                                 lambda results: results[0]))
        ctx.received, ctx.ps_id = received, _engine.current_set()
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *_received_grad):
        with _engine.process_set(ctx.ps_id):  # autograd's thread: the forward's set again
            grad, _ = synchronize(_register(
                [_alltoall_async(grad_output.contiguous(), ctx.received, None)],
                lambda results: results[0]))
        return grad, None, None, None


@_on_set("alltoall")
def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters rows of tensor to the ranks (splits[j] rows to rank j; equal shares without
    splits) and gathers what they sent. Returns the received tensor, and with splits also the
    received splits (as Horovod). Differentiable."""
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


def _scaled(t, factor):
    """t * factor as Horovod scales a buffer (ScaleBuffer). On the CPU, 16-bit floats are widened
    to float, multiplied by the factor as a float and rounded once; the other floating dtypes
    multiply in their own, integers as _int_scaled. On a CUDA device Horovod's kernels round the
    factor to t's dtype and multiply in it (__hmul for 16-bit floats): a product of two values of
    t's dtype is exact in torch's float arithmetic, so t * (the factor rounded to t's dtype),
    rounded once, is that product."""
    if factor == 1.0:
        return t
    if not t.dtype.is_floating_point:
        return _int_scaled(t, factor)
    if t.is_cuda:
        return t * torch.tensor(factor, dtype=t.dtype).item()
    if t.dtype in (torch.float16, torch.bfloat16):
        return (t.float() * factor).to(t.dtype)
    return t * factor


def _reducescatter_async(tensor, name, op, prescale_factor, postscale_factor):
    """(engine handle, finish(results) -> this rank's share) of one reducescatter."""
    _check_op(op)
    if op == Adasum:
        raise NotImplementedError("reducescatter does not support Adasum (neither does Horovod)")
    _check_dtype(tensor)
    if tensor.dim() == 0:
        raise ValueError("Reducescatter does not support scalar inputs")  # Horovod's words
    t, rows, row_elems = _rows(tensor)
    n, me = _engine.set_size(), _engine.set_rank()
    q, rem = divmod(rows, n)
    first, mine = me * q + min(me, rem), q + (1 if me < rem else 0)
    # As Horovod: Average is a Sum whose postscale factor is divided by size(), and each factor
    # is applied once, around the Sum (_scaled), integers truncating.
    c_op = Sum if op == Average else op
    postscale = postscale_factor / n if op == Average else postscale_factor
    t = _scaled(t, prescale_factor)
    dtype = _dtype(t)
    if t.is_cuda and rem:
        # Uneven shares on the device: the full reduction, then this rank's rows (a view).
        out = torch.empty_like(t)
        _prepare_device(t, out)
        h = _submit(lambda: _engine.allreduce(t.data_ptr(), out.data_ptr(), rows * row_elems,
                                              dtype, c_op, name, keep=(t, out),
                                              shape=tuple(t.shape)))
        shard = out.narrow(0, first, mine)
    else:
        out = torch.empty((mine,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        _prepare_device(t, out)
        h = _submit(lambda: _engine.reducescatter(t.data_ptr(), out.data_ptr(), rows, row_elems,
                                                  dtype, c_op, name, keep=(t, out),
                                                  shape=tuple(t.shape)))
        shard = out

    def finish(_):
        return _scaled(shard, postscale)
    return h, finish, (t, out)


@_on_set("reducescatter")
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter (see reducescatter); returns a handle. Arguments in Horovod's
    order (no compression)."""
    name = _reserve("reducescatter", name)
    _check_process_set(process_set, "reducescatter")
    h, finish, keep = _reducescatter_async(tensor, name, op, prescale_factor, postscale_factor)
    return _register([h], finish, keep)


def _scatter_grad(grads, op, scale, process_set):
    """The gradient of reducescatter as Horovod computes it: the output's gradient times the
    set's size for Sum (not for Average), times both scale factors, then allgathered."""
    if op not in (Sum, Average):
        raise NotImplementedError("the gradient of reducescatter is implemented for Sum and "
                                  "Average")
    factor = scale * (process_set.size() if op == Sum else 1)
    return grouped_allgather([g * factor if factor != 1.0 else g for g in grads],
                             process_set=process_set)


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.scale, ctx.process_set = op, prescale_factor * postscale_factor, process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                               postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        return (_scatter_grad([grad_output], ctx.op, ctx.scale, ctx.process_set)[0], None, None,
                None, None, None)


@_on_set("reducescatter")
def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """op over ranks of tensor, scattered on the first dimension: each rank gets rows // size
    rows and the first rows % size ranks one more. Differentiable (Sum and Average), with
    Horovod's gradient (docs/python.md)."""
    _check_process_set(process_set, "reducescatter")
    compressed, cctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor,
                                     postscale_factor)
    return compression.decompress(out, cctx)


def _grouped_reducescatter_async(tensors, name, op, prescale_factor, postscale_factor):
    if not tensors:
        raise ValueError("grouped_reducescatter needs at least one tensor")
    parts = [_reducescatter_async(t, nm, op, prescale_factor, postscale_factor)
             for t, nm in zip(tensors, _member_names(name, len(tensors)))]
    return _register([h for h, _, _ in parts],
                     lambda results: [f(r) for (_, f, _), r in zip(parts, results)],
                     [k for _, _, k in parts])


@_on_set("grouped_reducescatter")
def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducescatters of a list of tensors; synchronize() returns the list of shares.
    Each member is its own submission, named "<name>.<i>of<n>"."""
    name = _reserve("grouped_reducescatter", name)
    _check_process_set(process_set, "grouped_reducescatter")
    return _grouped_reducescatter_async(list(tensors), name, op, prescale_factor,
                                        postscale_factor)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.scale, ctx.process_set = op, prescale_factor * postscale_factor, process_set
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (None, None, None, None, None,
                *_scatter_grad(grad_outputs, ctx.op, ctx.scale, ctx.process_set))


@_on_set("grouped_reducescatter")
def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of each tensor of a list; returns the list of shares. Differentiable."""
    _check_process_set(process_set, "grouped_reducescatter")
    pairs = [compression.compress(t) for t in tensors]
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                             postscale_factor, *[t for t, _ in pairs])
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, pairs)]


# ---- sparse ------------------------------------------------------------------------------------


@_on_set("sparse_allreduce")
def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's reduction of a sparse tensor: every rank's indices and values allgathered
    ("<name>.indices", "<name>.values"), values divided by size() for Average. Returns a
    function that waits and returns the reduced (uncoalesced) sparse tensor, as Horovod's."""
    name = _reserve("sparse_allreduce", name)
    _check_process_set(process_set, "sparse_allreduce")
    if op not in (Sum, Average):
        raise NotImplementedError("sparse_allreduce_async supports Sum and Average")
    t = tensor
    ih = allgather_async(t._indices().transpose(0, 1).contiguous(),
                         name=None if name is None else f"{name}.indices",
                         process_set=process_set)
    vh = allgather_async(t._values().contiguous(),
                         name=None if name is None else f"{name}.values", process_set=process_set)
    n = _engine.set_size()

    def handle():
        values = synchronize(vh)
        indices = synchronize(ih)
        if op == Average:
            values = values / n
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(),
                                       dtype=values.dtype, device=t.device)
    return handle


# ---- barrier, join -----------------------------------------------------------------------------


@_on_set("barrier")
def barrier(process_set=global_process_set):
    """Returns once every rank has called it."""
    _check_process_set(process_set, "barrier")
    _internal(lambda: _engine.wait(_engine.barrier()))


def join(device=-1):
    """This rank has no more data: until every rank has joined, it contributes zeros to the
    other ranks' allreduces. Returns the rank that joined last."""
    return _internal(lambda: _engine.wait(_engine.join()))
