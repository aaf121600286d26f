"""The asynchronous layer: handles for collectives that complete in the background.

Everything that talks to other ranks goes through here, blocking calls included (they submit
and wait), so that one policy decides order, waiting and interruption.

Today's implementation runs libringrun's blocking C calls on one worker thread, in submission
order. Consequences, stated in docs/python.md:
  - every rank must submit its collectives in the same order (names are checked for duplicates
    in flight but are not negotiated across ranks);
  - grouped allreduce packs its tensors into one buffer per dtype, so a group costs one
    collective.
When libringrun's engine (named, negotiated handles) is available, this module is the only one
that changes: the functions below keep their signatures.

Waiting: wait() sleeps on the handle in slices of WAIT_SLICE_S with the GIL released, so that
SIGINT (Ctrl-C) raises KeyboardInterrupt in the waiting thread. On the blocking path the C
call is bounded by the collective timeout (RINGRUN_TIMEOUT_MS); with the engine a wait lasts
until the collective completes or fails, as in Horovod (see _native_wait).
"""
import collections
import os
import ctypes
import struct
import threading
import time

from ringrun import _lib

WAIT_SLICE_S = 0.05


class Handle:
    """One submitted collective. `keep` holds the buffers alive until completion."""
    __slots__ = ("name", "_fn", "_keep", "_done", "_result", "_error")

    def __init__(self, name, fn, keep):
        self.name, self._fn, self._keep = name, fn, keep
        self._done = threading.Event()
        self._result = None
        self._error = None


class _Worker:
    def __init__(self):
        self._cv = threading.Condition()
        self._queue = collections.deque()  # guarded by _cv
        self._in_flight = {}               # name -> Handle, guarded by _cv
        self._closed = False               # guarded by _cv
        self._thread = threading.Thread(target=self._run, name="ringrun-engine", daemon=True)
        self._thread.start()

    def submit(self, name, fn, keep):
        h = Handle(name, fn, keep)
        with self._cv:
            if self._closed:
                raise ValueError("ringrun is not initialized (call init() first)")
            if name is not None:
                if name in self._in_flight:
                    raise ValueError(f"a collective named '{name}' is already in flight; names of "
                                     "pending collectives must be unique")
                self._in_flight[name] = h
            self._queue.append(h)
            self._cv.notify()
        return h

    def _run(self):
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                h = self._queue.popleft()
            try:
                h._result = h._fn()
            except BaseException as e:  # noqa: B902 - delivered to the waiter
                h._error = e
            with self._cv:
                if h.name is not None and self._in_flight.get(h.name) is h:
                    del self._in_flight[h.name]
            h._fn = None
            h._keep = None
            h._done.set()

    def close(self, timeout_s):
        """Runs what is queued (bounded by the collective timeout), then stops the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout_s)
        with self._cv:
            pending = list(self._queue)
            self._queue.clear()
        for h in pending:
            h._error = _lib.RingrunError(f"collective '{h.name}' was pending at shutdown")
            h._done.set()


_worker = None
_worker_lock = threading.Lock()


def start():
    global _worker
    with _worker_lock:
        if _worker is None:
            _rounds[0] = 0
            _worker = _Worker()


def stop(timeout_s=5.0):
    global _worker
    _release_deferred(timeout_s)
    with _worker_lock:
        w, _worker = _worker, None
    if w is not None:
        w.close(timeout_s)


def submit(fn, name=None, keep=()):
    """Queues fn (runs on the worker thread; returns the handle's result)."""
    w = _worker
    if w is None:
        raise ValueError("ringrun is not initialized (call init() first)")
    return w.submit(name, fn, keep)


def raise_shared(error):
    """Raises `error`, which other threads may raise too, as an exception of its own: every
    raise adds the raising frames to the traceback of the object raised, so one object raised
    by several threads would collect all their frames. The clone is made without calling
    __init__ (which may format its arguments again): same type, args, attributes, traceback and
    chain. A type that cannot be made that way is raised as it is."""
    clone = None
    try:
        clone = type(error).__new__(type(error), *error.args)  # sets args, runs no __init__
        attrs = getattr(error, "__dict__", None)
        if attrs:
            clone.__dict__.update(attrs)
            if isinstance(attrs.get("__notes__"), list):
                clone.__notes__ = list(attrs["__notes__"])
        clone.__cause__, clone.__context__ = error.__cause__, error.__context__
        clone.__suppress_context__ = error.__suppress_context__
    except Exception:  # noqa: B902 - checked below, outside this handler
        clone = None
    if clone is None:
        raise error
    raise clone.with_traceback(error.__traceback__)


def _worker_wait(h):
    while not h._done.wait(WAIT_SLICE_S):
        pass
    if h._error is not None:
        raise_shared(h._error)
    return h._result


# ---- Collectives over raw buffers (pointers as ints, counts in elements). -------------------
# Each returns a Handle whose buffers belong to the collective until it completes.

# ---- Join and the control round ------------------------------------------------------------
# Without the engine's negotiation, join needs every collective to announce itself: before each
# one, all ranks allreduce (MAX) a small descriptor [joined, kind, count, dtype, op, the two
# scale factors' bits, mark] and its negation. A joined rank learns what the others run and
# takes part (zeros for allreduce); the active ranks learn that someone joined, and that every
# active rank submitted the same collective (max == -min of each field), so that a mismatch is
# an error, not a wrong result. One 160-byte allreduce per collective: a few microseconds on
# shared memory.

_ALLREDUCE, _BROADCAST, _ALLGATHER, _ALLTOALL, _REDUCESCATTER, _BARRIER = range(1, 7)
_KIND_NAMES = {_ALLREDUCE: "allreduce", _BROADCAST: "broadcast", _ALLGATHER: "allgather",
               _ALLTOALL: "alltoall", _REDUCESCATTER: "reducescatter", _BARRIER: "barrier"}
_FIELDS = 10  # joined, kind, count, dtype, op, prescale (2 fields), postscale (2), mark
_COMPARED = ((1, "collective"), (2, "element count"), (3, "dtype"), (4, "op"),
             (5, "prescale factor"), (6, "prescale factor"), (7, "postscale factor"),
             (8, "postscale factor"))
_LOW = -(1 << 62)
_rounds = [0]  # control rounds since start(); the worker thread is the only user


def _control_round(values):
    msg = (ctypes.c_int64 * (2 * _FIELDS))(*values, *[_LOW if v == _LOW else -v for v in values])
    _lib.check(_lib.lib.ringrun_allreduce(_addr(msg), _addr(msg), 2 * _FIELDS, _lib.INT64,
                                          _lib.MAX), "control round")
    _rounds[0] += 1
    return list(msg)


def _bits(factor):
    """A scale factor's IEEE bits as two non-negative fields (so that negating them is exact)."""
    b = struct.unpack("<Q", struct.pack("<d", float(factor) + 0.0))[0]  # -0.0 == 0.0
    return [b >> 32, b & 0xFFFFFFFF]


def _announce(kind, count, dtype, op, name, prescale=1.0, postscale=1.0):
    """Runs before every collective of an active rank (worker thread)."""
    if _lib.lib.ringrun_size() <= 1:
        return
    m = _control_round([0, kind, count, dtype, op, *_bits(prescale), *_bits(postscale), _LOW])
    what = f"{_KIND_NAMES[kind]} '{name}'"
    for i, field in _COMPARED:
        if m[i] != -m[_FIELDS + i]:
            if field.endswith("factor"):
                # The round gives each half's maximum and minimum, maybe from different ranks:
                # only this rank's own factor can be named.
                mine = prescale if field.startswith("pre") else postscale
                shown = f"differs between ranks; this rank passed {mine}"
            else:
                shown = f"differs: {m[i]} against {-m[_FIELDS + i]}"
            raise _lib.RingrunError(
                f"{what}: ranks submitted different collectives ({field} {shown}); every "
                "rank must submit the same collectives in the same order")
    if m[0] == 1 and kind not in (_ALLREDUCE, _BARRIER):
        raise _lib.RingrunError(f"{what}: a rank has joined; until every rank joins only "
                                "allreduce and barrier can run")


def join(name=None):
    """This rank contributes zeros to the others' allreduces until every rank has joined;
    the handle's result is the rank that joined last."""
    def fn():
        n, me = _lib.lib.ringrun_size(), _lib.lib.ringrun_rank()
        if n <= 1:
            return me
        mark = _rounds[0] * n + me
        while True:
            m = _control_round([1] + [_LOW] * (_FIELDS - 2) + [mark])
            kind, count, dtype, op = m[1], m[2], m[3], m[4]
            if kind == _LOW:
                return m[_FIELDS - 1] % n
            if any(m[i] != -m[_FIELDS + i] for i, _ in _COMPARED):
                continue  # active ranks disagree: they raise; nothing to take part in
            if kind == _ALLREDUCE:
                zeros = _buffer(count * _lib.dtype_size(dtype))
                _lib.check(_lib.lib.ringrun_allreduce(_addr(zeros), _addr(zeros), count, dtype,
                                                      op), "join: allreduce of a joined rank")
            elif kind == _BARRIER:
                _lib.check(_lib.lib.ringrun_barrier(), "join: barrier")
    return submit(fn, name)


def _buffer(nbytes):
    return (ctypes.c_char * max(nbytes, 1))()


def _copy(dst, src, nbytes):
    """memmove that copies nothing for 0 bytes (an empty tensor's pointer may be NULL)."""
    if nbytes:
        ctypes.memmove(dst, src, nbytes)


def _addr(buf):
    return ctypes.addressof(buf)


def _scale(ptr, count, dtype, factor):
    """ptr[i] *= factor on host memory of a floating dtype (the fallback's pre/postscale)."""
    if factor == 1.0 or count == 0:
        return
    import numpy as np
    if dtype == _lib.BFLOAT16:
        bits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint16)), (count,))
        wide = (bits.astype(np.uint32) << 16).view(np.float32) * np.float32(factor)
        w = wide.view(np.uint32)
        bits[:] = ((w + 0x7FFF + ((w >> 16) & 1)) >> 16).astype(np.uint16)
        return
    ctype = {_lib.FLOAT16: ctypes.c_uint16, _lib.FLOAT32: ctypes.c_float,
             _lib.FLOAT64: ctypes.c_double}[dtype]
    arr = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctype)), (count,))
    if dtype == _lib.FLOAT16:
        arr = arr.view(np.float16)
    arr *= arr.dtype.type(factor)


def _check_scales(dtype, prescale, postscale, what):
    if (prescale != 1.0 or postscale != 1.0) and dtype not in _lib.FLOATING:
        raise ValueError(f"{what}: prescale/postscale factors need a floating dtype, not "
                         f"{_lib.DTYPE_NAMES[dtype]}")


def allreduce(send, recv, count, dtype, op, name=None, prescale=1.0, postscale=1.0, keep=()):
    """recv = postscale * op over ranks of (prescale * send). Host memory only."""
    _check_scales(dtype, prescale, postscale, f"allreduce '{name}'")
    esize = _lib.dtype_size(dtype)

    def fn():
        what = f"allreduce '{name}'"
        _announce(_ALLREDUCE, count, dtype, op, name, prescale, postscale)
        src = send
        if prescale != 1.0:
            if recv != send:
                _copy(recv, send, count * esize)
            src = recv
            _scale(recv, count, dtype, prescale)
        _lib.check(_lib.lib.ringrun_allreduce(src, recv, count, dtype, op), what)
        _scale(recv, count, dtype, postscale)
    return submit(fn, name, keep)


def grouped_allreduce(entries, dtype, op, name=None, prescale=1.0, postscale=1.0, keep=()):
    """entries: [(send, recv, count)], all of one dtype; one collective for the group."""
    _check_scales(dtype, prescale, postscale, f"grouped allreduce '{name}'")
    esize = _lib.dtype_size(dtype)

    def fn():
        total = sum(c for _, _, c in entries)
        _announce(_ALLREDUCE, total, dtype, op, name, prescale, postscale)
        fused = _buffer(total * esize)
        base, off = _addr(fused), 0
        for s, _, c in entries:
            _copy(base + off, s, c * esize)
            off += c * esize
        _scale(base, total, dtype, prescale)
        _lib.check(_lib.lib.ringrun_allreduce(base, base, total, dtype, op),
                   f"grouped allreduce '{name}'")
        _scale(base, total, dtype, postscale)
        off = 0
        for _, r, c in entries:
            _copy(r, base + off, c * esize)
            off += c * esize
    return submit(fn, name, keep)


def broadcast(send, recv, count, dtype, root, name=None, keep=()):
    n = _lib.lib.ringrun_size()
    if n > 0 and not 0 <= root < n:  # at submission, as the engine; n < 0: not initialized
        raise ValueError(f"broadcast '{name}': broadcast: root {root} is not a rank of a job "
                         f"of size {n}")
    esize = _lib.dtype_size(dtype)

    def fn():
        _announce(_BROADCAST, count, dtype, root, name)
        if recv != send:
            _copy(recv, send, count * esize)
        _lib.check(_lib.lib.ringrun_broadcast(recv, count, dtype, root), f"broadcast '{name}'")
    return submit(fn, name, keep)


def _host_only(device_copy, what):
    if device_copy is not None:
        raise NotImplementedError(f"{what} of device memory needs libringrun's engine "
                                  "(RINGRUN_PY_ENGINE=0 runs host memory only)")


def _gather_counts(value, what):
    n = _lib.lib.ringrun_size()
    mine = (ctypes.c_int64 * 1)(value)
    counts = (ctypes.c_int64 * n)()
    _lib.check(_lib.lib.ringrun_allgather(_addr(mine), _addr(counts), 1, _lib.INT64), what)
    return list(counts)


def allgatherv(send, rows, row_elems, dtype, alloc, name=None, keep=(), device_copy=None):
    """Concatenates every rank's `rows` rows (row_elems elements each) in rank order.
    alloc(rows_per_rank) -> (result, recv_pointer) runs on the worker thread. Host memory only
    (device_copy: see _native_allgatherv)."""
    _host_only(device_copy, "allgather")
    esize = _lib.dtype_size(dtype)

    def fn():
        what = f"allgather '{name}'"
        _announce(_ALLGATHER, row_elems, dtype, 0, name)
        counts = _gather_counts(rows, what)
        result, recv = alloc(counts)
        if len(set(counts)) == 1:
            _lib.check(_lib.lib.ringrun_allgather(send, recv, rows * row_elems, dtype), what)
            return result
        block = max(counts) * row_elems * esize
        padded = _buffer(block * len(counts))
        mine = _buffer(block)
        _copy(_addr(mine), send, rows * row_elems * esize)
        _lib.check(_lib.lib.ringrun_allgather(_addr(mine), _addr(padded), block, _lib.UINT8), what)
        off = 0
        for r, c in enumerate(counts):
            _copy(recv + off, _addr(padded) + r * block, c * row_elems * esize)
            off += c * row_elems * esize
        return result
    return submit(fn, name, keep)


def alltoallv(send, splits, row_elems, dtype, alloc, name=None, keep=(), device_copy=None):
    """Rows splits[j] of send (in order) go to rank j. alloc(received_splits) ->
    (result, recv_pointer). The handle's result is alloc's result. Host memory only."""
    _host_only(device_copy, "alltoall")
    esize = _lib.dtype_size(dtype)
    n = len(splits)

    def fn():
        what = f"alltoall '{name}'"
        _announce(_ALLTOALL, row_elems, dtype, 0, name)
        me = _lib.lib.ringrun_rank()
        mine = (ctypes.c_int64 * n)(*splits)
        matrix = (ctypes.c_int64 * (n * n))()
        _lib.check(_lib.lib.ringrun_allgather(_addr(mine), _addr(matrix), n, _lib.INT64), what)
        received = [matrix[src * n + me] for src in range(n)]
        result, recv = alloc(received)
        widest = max(matrix) if n else 0
        if all(v == widest for v in matrix):
            _lib.check(_lib.lib.ringrun_alltoall(send, recv, widest * row_elems, dtype), what)
            return result
        block = widest * row_elems * esize
        out = _buffer(block * n)
        inp = _buffer(block * n)
        off = 0
        for j in range(n):
            _copy(_addr(out) + j * block, send + off, splits[j] * row_elems * esize)
            off += splits[j] * row_elems * esize
        _lib.check(_lib.lib.ringrun_alltoall(_addr(out), _addr(inp), block, _lib.UINT8), what)
        off = 0
        for j in range(n):
            _copy(recv + off, _addr(inp) + j * block, received[j] * row_elems * esize)
            off += received[j] * row_elems * esize
        return result
    return submit(fn, name, keep)


def reducescatter(send, recv, rows, row_elems, dtype, op, name=None, keep=()):
    """Reduces send (rows rows) and leaves this rank's share of rows in recv: rows // size each,
    the first rows % size ranks one more (as Horovod)."""
    esize = _lib.dtype_size(dtype)

    def fn():
        what = f"reducescatter '{name}'"
        _announce(_REDUCESCATTER, rows * row_elems, dtype, op, name)
        n, me = _lib.lib.ringrun_size(), _lib.lib.ringrun_rank()
        if rows % n == 0:
            _lib.check(_lib.lib.ringrun_reducescatter(send, recv, rows // n * row_elems, dtype, op),
                       what)
        else:
            tmp = _buffer(rows * row_elems * esize)
            _lib.check(_lib.lib.ringrun_allreduce(send, _addr(tmp), rows * row_elems, dtype, op),
                       what)
            q, rem = divmod(rows, n)
            first = me * q + min(me, rem)
            mine = q + (1 if me < rem else 0)
            _copy(recv, _addr(tmp) + first * row_elems * esize, mine * row_elems * esize)
    return submit(fn, name, keep)


def barrier(name=None):
    def fn():
        _announce(_BARRIER, 0, 0, 0, name)
        _lib.check(_lib.lib.ringrun_barrier(), "barrier")
    return submit(fn, name)


# ---- libringrun's engine -------------------------------------------------------------------
# When the library has the engine (ringrun_*_submit), the collectives above are replaced by
# submissions to it: named tensors negotiated across ranks (any order on each rank), fused
# allreduces, join in the runtime. RINGRUN_PY_ENGINE=0 keeps the blocking-call path above.

class NativeHandle:
    """A libringrun handle; `finish(handle)` turns a successful completion into the result.

    The C handle lives in `_holder` (a c_void_p that the submit call writes), which is
    registered in `_live` with the buffers the collective uses before the call is made. So an
    exception at any point (a signal raises at any bytecode) can leak a handle but never free
    a buffer that a pending collective still reads or writes.

    Several threads may poll and wait on one handle: `_lock` makes one of them at a time call
    into the C handle, and the one that sees it complete runs `finish` and releases it."""
    __slots__ = ("_holder", "name", "release_after", "_finish", "_keep", "_done", "_result",
                 "_error", "_lock")

    def __init__(self, holder, name, finish, keep):
        self._holder = holder
        self.name, self._finish, self._keep = name, finish, keep
        # Set by finish when device work enqueued on the caller's stream still reads memory
        # that the handle owns: an object whose query() is True once that work is done.
        self.release_after = None
        self._done = False
        self._result = self._error = None
        self._lock = threading.Lock()

    @property
    def ptr(self):
        return self._holder.value

    def _complete(self, status):
        """Under _lock, once ringrun_test has returned `status` (not IN_PROGRESS)."""
        if status == 0:
            try:
                self._result = self._finish(self) if self._finish else None
            except BaseException as e:  # noqa: B902 - delivered to the waiter
                self._error = e
        else:
            msg = _lib.lib.ringrun_handle_message(self.ptr).decode("utf-8", "replace")
            self._error = _lib.RingrunError(msg or f"collective '{self.name}' failed ({status})")
        # Forgotten before it is freed: a signal raising in between leaks it, never frees twice.
        holder, ptr = self._holder, self.ptr
        holder.value = None
        _live.pop(id(holder), None)
        if self.release_after is not None:
            _release_when_done(ptr, self.release_after)
        else:
            _lib.lib.ringrun_release(ptr)
        self.release_after = None
        self._keep = self._finish = None
        self._done = True

    def __del__(self):
        # Dropped before it completed (an interrupted wait, a synchronize that raised for
        # another part of the same operation, or never waited on): the collective still runs,
        # and _live still holds its buffers. Parked here, it is released once done.
        holder = getattr(self, "_holder", None)
        if holder is not None and holder.value and _detached is not None:
            _detached.append(holder)


# id(holder) -> (holder, keep) for every C handle from submission until it is released: the
# buffers a pending collective reads and writes stay referenced whatever happens to its
# NativeHandle. A handle whose NativeHandle never got made (an exception right after the C
# call) is parked in _detached by _native_submit and released like a dropped one.
_live = {}

# Holders of handles dropped while pending. Appended by NativeHandle.__del__, which may run
# on any thread at any allocation (so no lock: deque.append and popleft are atomic); released
# once ringrun_test says they are done (checked at each submission) or after ringrun_shutdown,
# which fails whatever is still pending.
_detached = collections.deque()


def _release_detached(everything=False):
    for _ in range(len(_detached)):
        try:
            holder = _detached.popleft()
        except IndexError:
            return
        if not holder.value:
            continue  # parked twice (by a __del__ and by _native_submit) and released once
        if everything or _lib.lib.ringrun_test(holder) != _lib.IN_PROGRESS:
            ptr, holder.value = holder.value, None  # forgotten first, as in _complete
            _live.pop(id(holder), None)
            _lib.lib.ringrun_release(ptr)
        else:
            _detached.append(holder)


def after_shutdown():
    """Called once ringrun_shutdown has returned: nothing is pending any more, so the library
    uses no buffer of ours."""
    _release_detached(everything=True)
    _live.clear()


# Handles whose device output is still read by a copy on a caller's stream: (ptr, waitable),
# released once waitable.query() is True (checked at each submission and at stop()).
_deferred = []
_deferred_lock = threading.Lock()


def _release_when_done(ptr, waitable):
    with _deferred_lock:
        _deferred.append((ptr, waitable))


def _finished(waitable):
    """A query that fails (the device has failed) counts as finished: nothing reads any more."""
    try:
        return waitable.query()
    except Exception:  # noqa: B902 - e.g. a CUDA error surfaced by the event
        return True


def _release_deferred(deadline_s=None):
    """Releases the deferred handles whose copies have finished. With deadline_s, waits up to
    that long for the others; a handle still read after it is left unreleased (leaked rather
    than freed under a running copy)."""
    end = None if deadline_s is None else time.monotonic() + deadline_s
    while True:
        with _deferred_lock:
            done, pending = [], []
            for d in _deferred:
                (done if _finished(d[1]) else pending).append(d)
            _deferred[:] = pending
            left = len(pending)
        for ptr, _ in done:
            _lib.lib.ringrun_release(ptr)
        if not left or end is None or time.monotonic() >= end:
            return left
        time.sleep(0.001)


def _native_submit(what, call, name, finish=None, keep=()):
    if _deferred:
        _release_deferred()
    if _detached:
        _release_detached()
    holder = ctypes.c_void_p()
    _live[id(holder)] = (holder, keep)  # before the call: see NativeHandle
    try:
        status = call(ctypes.byref(holder))
        if status == 0:
            return NativeHandle(holder, name, finish, keep)
    except BaseException:
        # Raised before the C call (a bad argument), or after it (a signal): nothing to keep,
        # or a collective that runs on, parked until it is done.
        if holder.value:
            _detached.append(holder)
        else:
            _live.pop(id(holder), None)
        raise
    del _live[id(holder)]
    message = f"{what}: {_lib.error_message() or 'failed (%d)' % status}"
    if status in (_lib.ERR_INVALID_ARGUMENT, _lib.ERR_DUPLICATE_NAME, _lib.ERR_NOT_INITIALIZED):
        raise ValueError(message)
    raise _lib.RingrunError(message)


def _native_poll(h):
    if h._done:
        return True
    if not h._lock.acquire(blocking=False):
        return h._done  # another thread is testing or waiting on it: never block here
    try:
        if h._done:
            return True
        status = _lib.lib.ringrun_test(h.ptr)
        if status == _lib.IN_PROGRESS:
            return False
        h._complete(status)
        return True
    finally:
        h._lock.release()


def _native_wait(h):
    """As Horovod's: until the collective completes or fails. A tensor that some rank has not
    submitted is no failure (that rank may be evaluating or saving a checkpoint): the stall
    inspector warns, naming it, and with RINGRUN_STALL_SHUTDOWN_SECONDS ends the job. A dead
    peer or a transfer that stops fails it, within RINGRUN_TIMEOUT_MS."""
    while not h._done:
        with h._lock:  # released between slices, so that pollers and other waiters get a turn
            if h._done:
                break
            status = _lib.lib.ringrun_test(h.ptr)
            if status != _lib.IN_PROGRESS:
                h._complete(status)
                break
            _lib.lib.ringrun_wait_for(h.ptr, int(WAIT_SLICE_S * 1000))
    if h._error is not None:
        raise_shared(h._error)
    return h._result


def _name(name):
    return name.encode() if name is not None else None


def _native_allreduce(send, recv, count, dtype, op, name=None, prescale=1.0, postscale=1.0,
                      keep=()):
    _check_scales(dtype, prescale, postscale, f"allreduce '{name}'")
    return _native_submit(f"allreduce '{name}'", lambda h: _lib.lib.ringrun_allreduce_submit(
        _name(name), send, recv, count, dtype, op, prescale, postscale, 0, h), name, keep=keep)


def _native_grouped_allreduce(entries, dtype, op, name=None, prescale=1.0, postscale=1.0,
                              keep=()):
    _check_scales(dtype, prescale, postscale, f"grouped allreduce '{name}'")
    n = len(entries)
    sends = (ctypes.c_void_p * n)(*[s for s, _, _ in entries])
    recvs = (ctypes.c_void_p * n)(*[r for _, r, _ in entries])
    counts = (ctypes.c_size_t * n)(*[c for _, _, c in entries])
    return _native_submit(
        f"grouped allreduce '{name}'", lambda h: _lib.lib.ringrun_grouped_allreduce_submit(
            _name(name), n, sends, recvs, counts, dtype, op, prescale, postscale, 0, h),
        name, keep=(keep, sends, recvs, counts))


def _native_broadcast(send, recv, count, dtype, root, name=None, keep=()):
    """Host memory may have send != recv (copied first); device memory needs send == recv."""
    if recv != send:
        _copy(recv, send, count * _lib.dtype_size(dtype))
    return _native_submit(f"broadcast '{name}'", lambda h: _lib.lib.ringrun_broadcast_submit(
        _name(name), recv, count, dtype, root, h), name, keep=keep)


def _copy_output(h, n, dtype, alloc, device_copy):
    """The handle's output into alloc's buffer (n: the job's size at submission; the handle
    stays valid after ringrun_shutdown, ringrun_size does not). Device output (device_copy
    given) is copied by device_copy(recv, data, nbytes), which returns what says when the copy
    is done; the handle is released after it."""
    rows = (ctypes.c_size_t * n)()
    _lib.check(_lib.lib.ringrun_handle_rows(h.ptr, rows, n), f"'{h.name}': rows")
    data, count = ctypes.c_void_p(), ctypes.c_size_t()
    _lib.check(_lib.lib.ringrun_handle_output(h.ptr, ctypes.byref(data), ctypes.byref(count)),
               f"'{h.name}': output")
    result, recv = alloc(list(rows))
    nbytes = count.value * _lib.dtype_size(dtype)
    if nbytes:
        if device_copy is None:
            _copy(recv, data.value, nbytes)
        else:
            h.release_after = device_copy(recv, data.value, nbytes)
    return result


def _native_allgatherv(send, rows, row_elems, dtype, alloc, name=None, keep=(),
                       device_copy=None):
    """device_copy: for device memory (the result is device memory that the handle owns)."""
    return _native_submit(
        f"allgather '{name}'", lambda h: _lib.lib.ringrun_allgather_submit(
            _name(name), send, rows, row_elems, dtype, h), name,
        lambda h, n=_lib.lib.ringrun_size(): _copy_output(h, n, dtype, alloc, device_copy),
        keep)


def _native_alltoallv(send, splits, row_elems, dtype, alloc, name=None, keep=(),
                      device_copy=None):
    rows = (ctypes.c_size_t * len(splits))(*splits)
    return _native_submit(
        f"alltoall '{name}'", lambda h: _lib.lib.ringrun_alltoall_submit(
            _name(name), send, rows, row_elems, dtype, h), name,
        lambda h, n=len(splits): _copy_output(h, n, dtype, alloc, device_copy), (keep, rows))


def _native_reducescatter(send, recv, rows, row_elems, dtype, op, name=None, keep=()):
    n, me = _lib.lib.ringrun_size(), _lib.lib.ringrun_rank()
    what = f"reducescatter '{name}'"
    if rows % n == 0:
        return _native_submit(what, lambda h: _lib.lib.ringrun_reducescatter_submit(
            _name(name), send, recv, rows // n * row_elems, dtype, op, h), name, keep=keep)
    # Uneven shares: the full reduction, then this rank's rows.
    esize = _lib.dtype_size(dtype)
    tmp = _buffer(rows * row_elems * esize)
    q, rem = divmod(rows, n)
    first, mine = me * q + min(me, rem), q + (1 if me < rem else 0)

    def finish(_):
        _copy(recv, _addr(tmp) + first * row_elems * esize, mine * row_elems * esize)
    return _native_submit(what, lambda h: _lib.lib.ringrun_allreduce_submit(
        _name(name), send, _addr(tmp), rows * row_elems, dtype, op, 1.0, 1.0, 0, h), name,
        finish, (keep, tmp))


def _native_barrier(name=None):
    return _native_submit("barrier", _lib.lib.ringrun_barrier_submit, name)


def _native_join(name=None):
    return _native_submit("join", _lib.lib.ringrun_join_submit, name,
                          lambda h: _lib.lib.ringrun_handle_last_joined_rank(h.ptr))


# ---- Waiting on any handle ------------------------------------------------------------------

def poll(h):
    """True once h has completed (never blocks)."""
    if isinstance(h, NativeHandle):
        return _native_poll(h)
    return h._done.is_set()


def wait(h):
    """The handle's result; raises what the collective raised. Interruptible by Ctrl-C."""
    if isinstance(h, NativeHandle):
        return _native_wait(h)
    return _worker_wait(h)


def run(fn, name=None, keep=()):
    """fn on the worker thread, waited for."""
    return wait(submit(fn, name, keep))


USING_ENGINE = _lib.HAS_ENGINE and os.environ.get("RINGRUN_PY_ENGINE", "1") != "0"
if USING_ENGINE:
    allreduce = _native_allreduce  # noqa: F811
    grouped_allreduce = _native_grouped_allreduce  # noqa: F811
    broadcast = _native_broadcast  # noqa: F811
    allgatherv = _native_allgatherv  # noqa: F811
    alltoallv = _native_alltoallv  # noqa: F811
    reducescatter = _native_reducescatter  # noqa: F811
    barrier = _native_barrier  # noqa: F811
    join = _native_join  # noqa: F811
