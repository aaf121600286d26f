"""ringrun: collectives between the ranks of a ringrun job, from Python.

    import ringrun, numpy as np
    ringrun.init()
    total = ringrun.allreduce(np.ones(4, np.float32), op=ringrun.Sum)

Core functions work on NumPy arrays and on anything with the buffer protocol (bytes,
bytearray, array.array, memoryview). Horovod's PyTorch API is ringrun.torch.
Failures raise ringrun.RingrunError carrying the runtime's message.
"""
import atexit
import ctypes
import os
import pickle

try:  # as Horovod: cloudpickle pickles lambdas and local classes; pickle reads its output
    import cloudpickle as _pickler
except ImportError:
    _pickler = pickle

import numpy as np

from . import _engine, _lib, _rendezvous
from ._lib import RingrunError

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
           "cross_size", "cross_rank", "membership_epoch", "allreduce", "allreduce_", "allgather", "broadcast",
           "broadcast_", "alltoall", "reducescatter", "barrier", "join", "broadcast_object",
           "allgather_object", "Sum", "Average", "Min", "Max", "Product", "RingrunError"]

Sum, Average, Min, Max, Product = _lib.SUM, _lib.AVERAGE, _lib.MIN, _lib.MAX, _lib.PRODUCT
_OP_NAMES = {Sum: "Sum", Average: "Average", Min: "Min", Max: "Max", Product: "Product"}

_initialized = False


def init():
    """Joins the job that ringrun described in the environment; under torchrun (RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, and no RINGRUN_RANK), the job that torch's
    store at MASTER_ADDR:MASTER_PORT gathers. A single process is a job of size 1; a process
    that another launcher started as one of several, with no way to join the others, fails
    (RingrunError naming the launcher). A second call while initialized does nothing. Ctrl-C
    interrupts the wait for the other ranks."""
    global _initialized
    if _initialized:
        return
    # A Python rank computes on its own threads while libringrun's engine waits for peers: a
    # waiting engine that spins takes the core that this rank or a peer on the same host needs
    # (on 2 cores, np=2 trained 1.5-3x slower with spinning). So it sleeps, unless RINGRUN_SPIN
    # says otherwise.
    contract = _rendezvous.torchrun_contract(os.environ)
    if contract is None:
        _engine.init(spin=0)
    else:
        _rendezvous.join_torchrun(contract, 0, lambda call: _engine.init(call=call))
    _initialized = True


def shutdown():
    """Leaves the job; safe when not initialized. Collectives still pending fail with an
    error, as in Horovod. Their handles stay usable: waiting on one returns its result or
    raises its error."""
    global _initialized
    if not _initialized:
        return
    _initialized = False
    _engine.before_shutdown()
    _lib.lib.ringrun_shutdown()
    _engine.after_shutdown()


atexit.register(shutdown)


def is_initialized():
    return _initialized


def membership_epoch():
    """The membership epoch of an elastic job (ringrun --min-np/--max-np): a counter that the
    launcher raises when the job's host set changed and a new generation is pending, as the
    last init() received it; 0 when it never changed, and in jobs that are not elastic. Safe
    before init() and after shutdown(). Compare it across ranks with allreduce(..., op=Max) to
    agree on whether hosts were updated."""
    value = ctypes.c_uint64(0)
    _lib.check(_lib.lib.ringrun_membership_epoch(ctypes.byref(value)), "membership_epoch")
    return value.value


def _shape_value(fn, what):
    if not _initialized:
        raise ValueError(f"ringrun.{what}() before ringrun.init()")
    return fn()


def size():
    return _shape_value(_lib.lib.ringrun_size, "size")


def rank():
    return _shape_value(_lib.lib.ringrun_rank, "rank")


def local_size():
    return _shape_value(_lib.lib.ringrun_local_size, "local_size")


def local_rank():
    return _shape_value(_lib.lib.ringrun_local_rank, "local_rank")


def cross_size():
    return _shape_value(_lib.lib.ringrun_cross_size, "cross_size")


def cross_rank():
    return _shape_value(_lib.lib.ringrun_cross_rank, "cross_rank")


# ---- NumPy and buffer-protocol collectives ---------------------------------------------------

_NP_DTYPES = {np.dtype(np.int8): _lib.INT8, np.dtype(np.uint8): _lib.UINT8,
              np.dtype(np.int16): _lib.INT16, np.dtype(np.int32): _lib.INT32,
              np.dtype(np.int64): _lib.INT64,
              np.dtype(np.float16): _lib.FLOAT16, np.dtype(np.float32): _lib.FLOAT32,
              np.dtype(np.float64): _lib.FLOAT64}


def _as_array(x, writable=False):
    """A C-contiguous ndarray viewing x when possible (needed for in-place results)."""
    if isinstance(x, np.ndarray):
        arr = x
    else:
        try:
            view = memoryview(x)
        except TypeError:
            arr = np.asarray(x)
        else:
            if not view.c_contiguous:  # a strided view: numpy follows its strides
                arr = np.asarray(view)
            elif view.ndim:
                arr = np.frombuffer(view.cast("B"), dtype=np.dtype(view.format)).reshape(
                    view.shape)
            else:
                arr = np.frombuffer(view.cast("B"), dtype=np.dtype(view.format))
    if arr.dtype not in _NP_DTYPES:
        supported = ", ".join(str(d) for d in _NP_DTYPES)
        raise TypeError(f"ringrun: dtype {arr.dtype} is not supported (supported: {supported})")
    if writable:
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            raise ValueError("ringrun: an in-place collective needs a writable, C-contiguous buffer")
    else:
        arr = np.ascontiguousarray(arr)
    return arr


def _ndim(x):
    """x's number of dimensions (0 for a NumPy scalar or a 0-d buffer), which _as_array does
    not keep for a 0-d x."""
    if isinstance(x, np.ndarray):
        return x.ndim
    try:
        return memoryview(x).ndim
    except TypeError:
        return np.ndim(x)


def _ptr(arr):
    return arr.ctypes.data


def _check_op(op, dtype):
    if op not in _OP_NAMES:
        raise ValueError(f"ringrun: unknown op {op!r} (supported: Sum, Average, Min, Max, Product)")


def _truncating_average(out, n):
    """Integer Average as Horovod computes it: the Sum times 1/n in double, truncated toward
    zero (-7 / 2 is -3)."""
    np.copyto(out, (out.astype(np.float64) * (1.0 / n)).astype(out.dtype), casting="unsafe")


def _reduce_into(arr, out, op, name):
    """out = op over ranks of arr. Integer Average truncates (see _truncating_average)."""
    _check_op(op, arr.dtype)
    dtype = _NP_DTYPES[arr.dtype]
    integer_average = op == Average and dtype not in _lib.FLOATING
    c_op = Sum if integer_average else op
    _engine.wait(_engine.allreduce(_ptr(arr), _ptr(out), arr.size, dtype, c_op, name,
                                   keep=(arr, out)))
    if integer_average:
        _truncating_average(out, size())
    return out


def allreduce(x, op=Average, name=None):
    """A new array: op over ranks of x, elementwise (same shape and dtype on every rank)."""
    arr = _as_array(x)
    return _reduce_into(arr, np.empty_like(arr), op, name)


def allreduce_(x, op=Average, name=None):
    """In place on a writable buffer; returns it as an ndarray view."""
    arr = _as_array(x, writable=True)
    return _reduce_into(arr, arr, op, name)


def broadcast(x, root_rank=0, name=None):
    """A new array holding root_rank's x."""
    arr = _as_array(x)
    out = np.empty_like(arr)
    _engine.wait(_engine.broadcast(_ptr(arr), _ptr(out), arr.size, _NP_DTYPES[arr.dtype],
                                   root_rank, name, keep=(arr, out)))
    return out


def broadcast_(x, root_rank=0, name=None):
    arr = _as_array(x, writable=True)
    _engine.wait(_engine.broadcast(_ptr(arr), _ptr(arr), arr.size, _NP_DTYPES[arr.dtype],
                                   root_rank, name, keep=(arr,)))
    return arr


def _rows(arr):
    arr = arr.reshape(1) if arr.ndim == 0 else arr
    return arr, arr.shape[0], int(np.prod(arr.shape[1:], dtype=np.int64))


def allgather(x, name=None):
    """Every rank's x concatenated on the first dimension, in rank order (first dimensions
    may differ between ranks; the others must match)."""
    arr, rows, row_elems = _rows(_as_array(x))

    def alloc(counts):
        out = np.empty((sum(counts),) + arr.shape[1:], arr.dtype)
        return out, _ptr(out)
    return _engine.wait(_engine.allgatherv(_ptr(arr), rows, row_elems, _NP_DTYPES[arr.dtype],
                                           alloc, name, keep=(arr,)))


def alltoall(x, splits=None, name=None):
    """Rows of x go to the ranks in order: splits[j] rows to rank j (equal shares without
    splits). Returns (received rows concatenated in rank order, received splits)."""
    arr, rows, row_elems = _rows(_as_array(x))
    n = size()
    if splits is None:
        if rows % n:
            raise ValueError(f"alltoall: first dimension {rows} is not divisible by size {n}; "
                             "pass splits")
        splits = [rows // n] * n
    given = np.asarray(splits)
    if given.ndim != 1 or given.dtype.kind not in "iu":
        raise ValueError(f"alltoall: splits must be integers, one per rank (got {splits!r})")
    splits = given.tolist()
    if len(splits) != n or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"alltoall: splits {splits} must have {n} non-negative entries "
                         f"summing to the first dimension {rows}")

    def alloc(received):
        out = np.empty((sum(received),) + arr.shape[1:], arr.dtype)
        return (out, np.array(received, np.int64)), _ptr(out)
    return _engine.wait(_engine.alltoallv(_ptr(arr), splits, row_elems, _NP_DTYPES[arr.dtype],
                                          alloc, name, keep=(arr,)))


def reducescatter(x, op=Average, name=None):
    """op over ranks of x, scattered on the first dimension: each rank gets rows // size rows,
    the first rows % size ranks one more. A scalar (0-dimensional) x is a ValueError, as in
    Horovod."""
    if _ndim(x) == 0:
        raise ValueError("Reducescatter does not support scalar inputs")
    arr, rows, row_elems = _rows(_as_array(x))
    _check_op(op, arr.dtype)
    n, me = size(), rank()
    q, rem = divmod(rows, n)
    out = np.empty((q + (1 if me < rem else 0),) + arr.shape[1:], arr.dtype)
    dtype = _NP_DTYPES[arr.dtype]
    integer_average = op == Average and dtype not in _lib.FLOATING
    _engine.wait(_engine.reducescatter(_ptr(arr), _ptr(out), rows, row_elems, dtype,
                                       Sum if integer_average else op, name, keep=(arr, out)))
    if integer_average:
        _truncating_average(out, n)
    return out


def barrier():
    """Returns once every rank has called it."""
    _engine.wait(_engine.barrier())


def join():
    """This rank has run out of work: until every rank has joined, it contributes zeros to the
    other ranks' allreduces (Average still divides by size()). Returns the rank that joined
    last."""
    return _engine.wait(_engine.join())


def _pickle(obj):
    """(bytes, None), or (None, why) when obj cannot be pickled. cloudpickle, when installed,
    takes what pickle cannot (lambdas, local classes), as in Horovod."""
    try:
        return (_pickler.dumps(obj), None)
    except Exception as e:  # noqa: B902 - every rank must learn of it, not only this one
        return (None, f"{type(e).__name__}: {e}")


def broadcast_object(obj, root_rank=0, name=None):
    """root_rank's obj (pickled), on every rank. If root cannot pickle it, every rank raises
    (root its own error, the others RingrunError naming it) instead of waiting on root. On a
    process set (ringrun.torch), root_rank is the set's rank."""
    me = _engine.set_rank()
    data, why = _pickle(obj) if me == root_rank else (None, None)
    if data is not None:
        payload = np.frombuffer(data, np.uint8)
    elif why is not None:
        payload = np.frombuffer(why.encode("utf-8", "replace"), np.uint8)
    else:
        payload = None
    # The size, negative when what follows is root's error message.
    length = np.array([0 if payload is None else (payload.size if why is None
                                                  else -payload.size)], np.int64)
    length = broadcast_(length, root_rank, name=f"{name}.sz" if name else None)
    n = int(length[0])
    buf = payload.copy() if payload is not None else np.empty(abs(n), np.uint8)
    broadcast_(buf, root_rank, name=f"{name}.t" if name else None)
    if n < 0:
        if me == root_rank:
            _pickler.dumps(obj)  # raises root's own error, with its traceback
        raise RingrunError(f"broadcast_object: rank {root_rank} could not pickle the object: "
                           f"{buf.tobytes().decode('utf-8', 'replace')}")
    return obj if me == root_rank else pickle.loads(buf.tobytes())


def allgather_object(obj, name=None):
    """A list of every rank's obj (pickled), in rank order. If a rank cannot pickle its obj,
    every rank raises, naming it."""
    data, why = _pickle(obj)
    failed = data is None
    payload = np.frombuffer(why.encode("utf-8", "replace") if failed else data, np.uint8)
    sizes = allgather(np.array([-payload.size if failed else payload.size], np.int64),
                      name=f"{name}.sz" if name else None)
    gathered = allgather(payload, name=f"{name}.t" if name else None)
    out, errors, off = [], [], 0
    for q, s in enumerate(sizes.tolist()):
        chunk = gathered[off:off + abs(s)].tobytes()
        off += abs(s)
        if s < 0:
            errors.append(f"rank {q}: {chunk.decode('utf-8', 'replace')}")
        else:
            out.append(chunk)
    if errors:
        if failed:
            _pickler.dumps(obj)  # this rank's own error, with its traceback
        raise RingrunError("allgather_object: could not pickle the object on " + "; ".join(errors))
    return [pickle.loads(c) for c in out]
