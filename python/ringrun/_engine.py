"""Handles for the collectives that libringrun's engine runs in the background.

Every collective of the package goes through here, blocking ones included (they submit and
wait), so that one policy decides waiting, interruption and the life of buffers.

Each collective is a named submission to libringrun's engine (ringrun_*_submit, ringrun.h):
the engine negotiates names across ranks (each rank may submit in any order), fuses ready
allreduces and implements join. A submission returns a Handle at once; poll() tests it
without blocking, wait() returns its result or raises its error.

Buffers (pointers as ints, counts in elements) belong to the collective from its submission
until it completes, whatever happens to its Handle meanwhile (see Handle and _live).

Waiting: wait() sleeps on the handle in slices of WAIT_SLICE_S with the GIL released, so that
SIGINT (Ctrl-C) raises KeyboardInterrupt in the waiting thread within one slice. A wait lasts
until the collective completes or fails, as in Horovod (see wait).
"""
import collections
import contextlib
import ctypes
import threading
import time

from . import _lib

WAIT_SLICE_S = 0.05


def init(spin=0, call=None):
    """Starts the names of unnamed collectives afresh (see auto_name), then
    ringrun_init_with_spin(spin) (ringrun.h; RINGRUN_SPIN, when set, still wins), or call() ->
    status when given (another ringrun_init), on a thread of its own, waited for in slices: the
    join waits for every rank, and Ctrl-C interrupts that wait. An interrupted join goes on in
    the library; a later init() waits for it and finds the runtime initialized."""
    _reset_names()
    failed = []
    done = threading.Event()
    if call is None:
        def call():
            return _lib.lib.ringrun_init_with_spin(spin)

    def join():
        try:  # check() reads the message of this thread's call
            _lib.check(call(), "init")
        except BaseException as e:  # noqa: B902 - raised by the caller's thread
            failed.append(e)
        finally:
            done.set()
    threading.Thread(target=join, name="ringrun-init", daemon=True).start()
    while not done.wait(WAIT_SLICE_S):
        pass
    if failed:
        raise failed[0]


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


class Handle:
    """A libringrun handle; `finish(handle)` turns a successful completion into the result.

    The C handle lives in `_holder` (a c_void_p that the submit call writes), which is
    registered in `_live` with the buffers the collective uses before the call is made. So an
    exception at any point (a signal raises at any bytecode) can leak a handle but never free
    a buffer that a pending collective still reads or writes.

    Several threads may poll and wait on one handle: `_lock` makes one of them at a time call
    into the C handle, and the one that sees it complete runs `finish` and releases it."""
    __slots__ = ("_holder", "name", "release_after", "on_failure", "_finish", "_keep", "_done",
                 "_result", "_error", "_lock", "_held")

    def __init__(self, holder, name, finish, keep, held=None):
        self._holder = holder
        self.name, self._finish, self._keep = name, finish, keep
        self._held = held  # its name's entry in _held_names, until waited on or dropped
        # Set by finish when device work enqueued on the caller's stream still reads memory
        # that the handle owns: an object whose query() is True once that work is done.
        self.release_after = None
        self.on_failure = None  # called (under _lock) when the collective fails
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
            if self.on_failure is not None:
                self.on_failure()
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
        _let_go(getattr(self, "_held", None))
        holder = getattr(self, "_holder", None)
        if holder is not None and holder.value and _detached is not None:
            _detached.append(holder)


# id(holder) -> (holder, keep) for every C handle from submission until it is released: the
# buffers a pending collective reads and writes stay referenced whatever happens to its
# Handle. A C handle whose Handle never got made (an exception right after the C call) is
# parked in _detached by _submit and released like a dropped one.
_live = {}

# The names this rank's collectives hold: (process set id, name) -> a token of the Handle that
# holds it, from the submission until that handle is waited on (wait() returns or raises; in
# ringrun.torch, synchronize()) or dropped, and all of them at shutdown. A second collective of
# that name meanwhile is refused (ValueError) before it reaches the engine. The engine alone
# frees a name when its collective completes, which here takes microseconds (Horovod's takes
# at least a cycle of its background loop): a program that submits a name twice in a row would
# then be refused or not by timing, and one rank's Horovod-style duplicate check could pass
# where another's fails, leaving the ranks out of step. Held until synchronize, the answer is
# the same on every rank, every time. Automatic names (".noname.") are unique and not held.
# Read and written without a lock: dict.setdefault, get and pop are atomic, and __del__ (which
# lets go) may run on any thread at any allocation.
_held_names = {}


def _hold(what, name):
    """Takes `name` on the current process set for a submission; None for an automatic name."""
    if not isinstance(name, str) or ".noname." in name:
        return None  # not a name (the call refuses it) or an automatic one
    key, token = (current_set(), name), object()
    if _held_names.setdefault(key, token) is not token:
        raise ValueError(f"{what}: '{name}' is still in flight on this rank, or done and not "
                         "synchronized yet (a name is taken from its submission until its "
                         "handle is synchronized)")
    return key, token


def _let_go(held):
    if held is None or _held_names is None:  # None: at interpreter exit
        return
    key, token = held
    if _held_names.get(key) is token:
        _held_names.pop(key, None)


# Holders of handles dropped while pending. Appended by Handle.__del__, which may run on any
# thread at any allocation (so no lock: deque.append and popleft are atomic); released once
# ringrun_test says they are done (checked at each submission) or after ringrun_shutdown,
# which fails whatever is still pending.
_detached = collections.deque()


def _release_detached(everything=False):
    for _ in range(len(_detached)):
        try:
            holder = _detached.popleft()
        except IndexError:
            return
        if not holder.value:
            continue  # parked twice (by a __del__ and by _submit) and released once
        if everything or _lib.lib.ringrun_test(holder) != _lib.IN_PROGRESS:
            ptr, holder.value = holder.value, None  # forgotten first, as in _complete
            _live.pop(id(holder), None)
            _lib.lib.ringrun_release(ptr)
        else:
            _detached.append(holder)


def before_shutdown(timeout_s=5.0):
    """Called before ringrun_shutdown: waits up to timeout_s for the device copies that still
    read handles' output (see _release_deferred)."""
    _release_deferred(timeout_s)


def after_shutdown():
    """Called once ringrun_shutdown has returned: nothing is pending any more, so the library
    uses no buffer of ours."""
    _release_detached(everything=True)
    _live.clear()
    _held_names.clear()


# Handles whose device output is still read by a copy on a caller's stream: (ptr, waitable),
# released once waitable.query() is True (checked at each submission and before shutdown).
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


def _give_shapes(what, shapes):
    """ringrun_next_shapes(shapes): the shapes (tuples of ints) of the next submission's
    tensors, which the ranks must agree on (ringrun.h)."""
    ndims = (ctypes.c_int * len(shapes))(*[len(s) for s in shapes])
    flat = [int(d) for s in shapes for d in s]
    dims = (ctypes.c_int64 * len(flat))(*flat)
    status = _lib.lib.ringrun_next_shapes(len(shapes), ndims, dims)
    if status != 0:
        raise ValueError(f"{what}: {_lib.error_message() or 'shape refused (%d)' % status}")


# ---- Process sets ------------------------------------------------------------------------------
# The collectives that a thread submits inside `with process_set(id):` run on that process set
# (ringrun_next_process_set before each submit call); elsewhere on the whole job (id 0).

_tls = threading.local()


@contextlib.contextmanager
def process_set(ps_id):
    previous = getattr(_tls, "ps", 0)
    _tls.ps = ps_id
    try:
        yield
    finally:
        _tls.ps = previous


def current_set():
    return getattr(_tls, "ps", 0)


def set_size():
    """The size of the current process set (the job's for 0)."""
    ps = current_set()
    return _lib.lib.ringrun_size() if ps == 0 else _lib.lib.ringrun_process_set_size(ps)


def set_rank():
    """This rank's rank in the current process set (-1: not a member)."""
    ps = current_set()
    return _lib.lib.ringrun_rank() if ps == 0 else _lib.lib.ringrun_process_set_rank(ps)


def _submit(what, call, name, finish=None, keep=(), shapes=None):
    """call(pointer to the C handle) is one ringrun_*_submit; returns its Handle. shapes: the
    shape of each of its tensors, or None (not compared across ranks). It runs on the current
    process set."""
    if _deferred:
        _release_deferred()
    if _detached:
        _release_detached()
    held = _hold(what, name)
    holder = ctypes.c_void_p()
    _live[id(holder)] = (holder, keep)  # before the call: see Handle
    try:
        if shapes is not None:
            _give_shapes(what, shapes)  # taken by the call below, whatever it returns
        ps = current_set()
        if ps:
            _lib.lib.ringrun_next_process_set(ps)  # taken by the call below too
        status = call(ctypes.byref(holder))
        if status == 0:
            return Handle(holder, name, finish, keep, held)
    except BaseException:
        # Raised before the C call (a bad argument), or after it (a signal): nothing to keep,
        # or a collective that runs on, parked until it is done (the engine holds its name
        # until then).
        _let_go(held)
        if holder.value:
            _detached.append(holder)
        else:
            _live.pop(id(holder), None)
        raise
    del _live[id(holder)]
    _let_go(held)
    message = f"{what}: {_lib.error_message() or 'failed (%d)' % status}"
    if status in (_lib.ERR_INVALID_ARGUMENT, _lib.ERR_DUPLICATE_NAME, _lib.ERR_NOT_INITIALIZED):
        raise ValueError(message)
    raise _lib.RingrunError(message)


def poll(h):
    """True once h has completed (never blocks)."""
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


def wait(h):
    """The handle's result; raises what the collective raised. Interruptible by Ctrl-C.

    As Horovod's: waits until the collective completes or fails. A tensor that some rank has
    not submitted is no failure (that rank may be evaluating or saving a checkpoint): the stall
    inspector warns, naming it, and with RINGRUN_STALL_SHUTDOWN_SECONDS ends the job. A dead
    peer or a transfer that stops fails it, within RINGRUN_TIMEOUT_MS. Once it returns or
    raises, the collective's name is free for the next one (see _held_names)."""
    while not h._done:
        with h._lock:  # released between slices, so that pollers and other waiters get a turn
            if h._done:
                break
            status = _lib.lib.ringrun_test(h.ptr)
            if status != _lib.IN_PROGRESS:
                h._complete(status)
                break
            _lib.lib.ringrun_wait_for(h.ptr, int(WAIT_SLICE_S * 1000))
    held, h._held = h._held, None
    _let_go(held)
    if h._error is not None:
        raise_shared(h._error)
    return h._result


# ---- Names of unnamed collectives ------------------------------------------------------------
# The engine names an unnamed submission by counting this rank's unnamed submissions of its kind
# (ringrun.h). A collective that fails where a rank has joined (broadcast, allgather, alltoall,
# reducescatter) is counted by the ranks that submitted it and not by the joined one, so every
# later unnamed collective of that kind would carry different names on different ranks, and
# wait forever. So the package names them itself: "<kind>.noname.j<epoch>.<k>", where the epoch
# counts the joins completed since init and k counts this rank's unnamed submissions of the kind
# in this epoch. Every rank completes a join at once and submits nothing between its join and
# that completion, so after each join every rank starts again from the same names, whatever
# failed before it. (".noname." keeps them out of the engine's response cache, as its own.)
# Each process set counts its own: a set's collectives are submitted by its members only.

_names_lock = threading.Lock()
_names = {"epoch": 0, "counts": collections.Counter()}


def _reset_names():
    with _names_lock:
        _names["epoch"] = 0
        _names["counts"].clear()


def _next_epoch():
    with _names_lock:
        _names["epoch"] += 1
        _names["counts"].clear()


def auto_name(kind, name):
    """name, or the next automatic name of this kind (see above)."""
    if name is not None:
        return name
    ps = current_set()
    with _names_lock:
        k = _names["counts"][ps, kind]
        _names["counts"][ps, kind] = k + 1
        return f"{kind}.noname.j{_names['epoch']}.{k}"


# ---- Collectives ------------------------------------------------------------------------------
# Each returns a Handle; `keep` holds what the collective's buffers belong to until it
# completes. Buffers are host memory unless said otherwise: device memory goes to the engine's
# GPU backend (ringrun.h). An unnamed collective gets its name from auto_name.

def _name(name):
    return name.encode()


def _buffer(nbytes):
    return (ctypes.c_char * max(nbytes, 1))()


def _copy(dst, src, nbytes):
    """memmove that copies nothing for 0 bytes (an empty tensor's pointer may be NULL)."""
    if nbytes:
        ctypes.memmove(dst, src, nbytes)


def _addr(buf):
    return ctypes.addressof(buf)


def check_scales(dtype, prescale, postscale, what):
    if (prescale != 1.0 or postscale != 1.0) and dtype not in _lib.FLOATING:
        raise ValueError(f"{what}: prescale/postscale factors need a floating dtype, not "
                         f"{_lib.DTYPE_NAMES[dtype]}")


def allreduce(send, recv, count, dtype, op, name=None, prescale=1.0, postscale=1.0, keep=(),
              shape=None):
    """recv = postscale * op over ranks of (prescale * send). shape: the tensor's, which every
    rank must give alike (None: not compared); so for the other collectives."""
    name = auto_name("allreduce", name)
    check_scales(dtype, prescale, postscale, f"allreduce '{name}'")
    return _submit(f"allreduce '{name}'", lambda h: _lib.lib.ringrun_allreduce_submit(
        _name(name), send, recv, count, dtype, op, prescale, postscale, 0, h), name, keep=keep,
        shapes=None if shape is None else [shape])


def grouped_allreduce(entries, dtype, op, name=None, prescale=1.0, postscale=1.0, keep=(),
                      shapes=None):
    """entries: [(send, recv, count)], all of one dtype; one submission for the group. shapes:
    one per entry, or None."""
    name = auto_name("grouped_allreduce", name)
    check_scales(dtype, prescale, postscale, f"grouped allreduce '{name}'")
    n = len(entries)
    sends = (ctypes.c_void_p * n)(*[s for s, _, _ in entries])
    recvs = (ctypes.c_void_p * n)(*[r for _, r, _ in entries])
    counts = (ctypes.c_size_t * n)(*[c for _, _, c in entries])
    return _submit(
        f"grouped allreduce '{name}'", lambda h: _lib.lib.ringrun_grouped_allreduce_submit(
            _name(name), n, sends, recvs, counts, dtype, op, prescale, postscale, 0, h),
        name, keep=(keep, sends, recvs, counts), shapes=shapes)


def broadcast(send, recv, count, dtype, root, name=None, keep=(), shape=None):
    """recv becomes root's send. Host memory may have send != recv (copied first); device
    memory needs send == recv."""
    name = auto_name("broadcast", name)
    if recv != send:
        _copy(recv, send, count * _lib.dtype_size(dtype))
    return _submit(f"broadcast '{name}'", lambda h: _lib.lib.ringrun_broadcast_submit(
        _name(name), recv, count, dtype, root, h), name, keep=keep,
        shapes=None if shape is None else [shape])


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


def allgatherv(send, rows, row_elems, dtype, alloc, name=None, keep=(), device_copy=None,
               shape=None):
    """Concatenates every rank's `rows` rows (row_elems elements each) in rank order.
    alloc(rows_per_rank) -> (result, recv_pointer) runs when the handle completes; the
    handle's result is alloc's result. device_copy: for device memory (see _copy_output)."""
    name = auto_name("allgather", name)
    return _submit(
        f"allgather '{name}'", lambda h: _lib.lib.ringrun_allgather_submit(
            _name(name), send, rows, row_elems, dtype, h), name,
        lambda h, n=set_size(): _copy_output(h, n, dtype, alloc, device_copy),
        keep, None if shape is None else [shape])


def alltoallv(send, splits, row_elems, dtype, alloc, name=None, keep=(), device_copy=None,
              shape=None):
    """Rows splits[j] of send (in order) go to rank j. alloc(received_splits) ->
    (result, recv_pointer); the handle's result is alloc's result. device_copy: as for
    allgatherv."""
    name = auto_name("alltoall", name)
    rows = (ctypes.c_size_t * len(splits))(*splits)
    return _submit(
        f"alltoall '{name}'", lambda h: _lib.lib.ringrun_alltoall_submit(
            _name(name), send, rows, row_elems, dtype, h), name,
        lambda h, n=len(splits): _copy_output(h, n, dtype, alloc, device_copy), (keep, rows),
        None if shape is None else [shape])


def reducescatter(send, recv, rows, row_elems, dtype, op, name=None, keep=(), shape=None):
    """Reduces send (rows rows) and leaves this rank's share of rows in recv: rows // size each,
    the first rows % size ranks one more (as Horovod). Host memory when the shares are
    uneven."""
    name = auto_name("reducescatter", name)
    n, me = set_size(), set_rank()
    what = f"reducescatter '{name}'"
    shapes = None if shape is None else [shape]
    if rows % n == 0:
        return _submit(what, lambda h: _lib.lib.ringrun_reducescatter_submit(
            _name(name), send, recv, rows // n * row_elems, dtype, op, h), name, keep=keep,
            shapes=shapes)
    # Uneven shares: the full reduction, then this rank's rows.
    esize = _lib.dtype_size(dtype)
    tmp = _buffer(rows * row_elems * esize)
    q, rem = divmod(rows, n)
    first, mine = me * q + min(me, rem), q + (1 if me < rem else 0)

    def finish(_):
        _copy(recv, _addr(tmp) + first * row_elems * esize, mine * row_elems * esize)
    return _submit(what, lambda h: _lib.lib.ringrun_allreduce_submit(
        _name(name), send, _addr(tmp), rows * row_elems, dtype, op, 1.0, 1.0, 0, h), name,
        finish, (keep, tmp), shapes)


def barrier(name=None):
    return _submit("barrier", _lib.lib.ringrun_barrier_submit, name)


def join(name=None):
    """This rank contributes zeros to the others' allreduces until every rank has joined;
    the handle's result is the rank that joined last. Its completion, successful or not, starts
    a new epoch of automatic names (see auto_name)."""
    def finish(h):
        _next_epoch()
        return _lib.lib.ringrun_handle_last_joined_rank(h.ptr)
    h = _submit("join", _lib.lib.ringrun_join_submit, name, finish)
    h.on_failure = _next_epoch
    return h
