"""The package's handle bookkeeping (ringrun._engine) against a fake of libringrun's C calls:
no ringrun job and no ringrun_init. What a Handle does from submission to release, with the
failures, drops and signals that can come in between."""
import ctypes
import gc
import os
import threading
import time
import traceback
import weakref

import pytest

import ringrun
from ringrun import _engine, _lib

IN_PROGRESS = _lib.IN_PROGRESS


class FakeLib:
    """The C calls that _engine makes. Submissions hand out new handles, pending until a test
    sets status[ptr]; every call on a handle checks that it was not released."""

    def __init__(self):
        self.status = {}      # ptr -> what ringrun_test returns
        self.messages = {}    # ptr -> ringrun_handle_message
        self.released = []
        self.submitted = []   # (what, name, args)
        self.refuse = None    # (status, message): the next submission fails so
        self.error = b""      # ringrun_error_message
        self.calls = {"test": 0, "wait_for": 0, "init": []}
        self.size, self.rank = 2, 0
        self._next = 0x1000

    def _live(self, ptr):
        ptr = ptr.value if isinstance(ptr, ctypes.c_void_p) else ptr
        assert ptr in self.status, f"unknown handle {ptr:#x}"
        assert ptr not in self.released, f"handle {ptr:#x} used after its release"
        return ptr

    def _submit(self, what, name, ref, *args):
        self.submitted.append((what, name, args))
        if self.refuse:
            (status, self.error), self.refuse = self.refuse, None
            return status
        ptr, self._next = self._next, self._next + 16
        self.status[ptr] = IN_PROGRESS
        ref._obj.value = ptr  # what the C call writes through its ringrun_handle*
        return 0

    def ringrun_allreduce_submit(self, name, send, recv, count, dtype, op, pre, post, flags, h):
        return self._submit("allreduce", name, h, send, recv, count, dtype, op, pre, post)

    def ringrun_barrier_submit(self, h):
        return self._submit("barrier", None, h)

    def ringrun_test(self, ptr):
        self.calls["test"] += 1
        return self.status[self._live(ptr)]

    def ringrun_wait_for(self, ptr, timeout_ms):
        self.calls["wait_for"] += 1
        ptr = self._live(ptr)
        end = time.monotonic() + timeout_ms / 1000
        while self.status[ptr] == IN_PROGRESS and time.monotonic() < end:
            time.sleep(0.001)
        return self.status[ptr]

    def ringrun_handle_message(self, ptr):
        return self.messages.get(self._live(ptr), b"")

    def ringrun_release(self, ptr):
        self.released.append(self._live(ptr))

    def ringrun_error_message(self):
        return self.error

    def ringrun_size(self):
        return self.size

    def ringrun_rank(self):
        return self.rank

    def ringrun_dtype_size(self, dtype):
        return {_lib.FLOAT32: 4, _lib.FLOAT64: 8}[dtype]

    def ringrun_init_with_spin(self, spin):
        self.calls["init"].append(spin)
        return 0

    def ringrun_shutdown(self):
        pass


@pytest.fixture
def fake(monkeypatch):
    lib = FakeLib()
    monkeypatch.setattr(_lib, "lib", lib)
    monkeypatch.setattr(_engine, "_live", {})
    monkeypatch.setattr(_engine, "_detached", _engine.collections.deque())
    monkeypatch.setattr(_engine, "_deferred", [])
    yield lib
    gc.collect()  # handles dropped by the test park themselves before the fakes go


class Buffer:
    """Stands for a tensor that a collective reads and writes."""


def allreduce(name="t", keep=()):
    return _engine.allreduce(64, 128, 4, _lib.FLOAT32, _lib.SUM, name, keep=keep)


def test_a_handle_completes_once_and_is_released_once(fake):
    buf = Buffer()
    finished = []
    h = _engine._submit("allreduce 'f'", lambda ref: fake.ringrun_allreduce_submit(
        b"f", 0, 0, 1, _lib.FLOAT32, _lib.SUM, 1.0, 1.0, 0, ref), "f",
        finish=lambda h: finished.append(h) or "result", keep=(buf,))
    ptr = h.ptr
    assert _engine._live[id(h._holder)][1] == (buf,)
    assert not _engine.poll(h) and not finished
    fake.status[ptr] = 0
    assert _engine.poll(h)
    assert finished == [h] and fake.released == [ptr]
    assert h.ptr is None and h._keep is None and not _engine._live
    tests = fake.calls["test"]
    assert _engine.wait(h) == "result" and _engine.poll(h)
    assert fake.calls["test"] == tests and finished == [h]  # the C handle is not asked again


def test_a_failure_raises_the_handles_message_in_each_wait(fake):
    h = allreduce()
    fake.status[h.ptr], fake.messages[h.ptr] = 4, b"rank 1 (node2) is gone"
    raised = []
    for _ in range(2):
        with pytest.raises(_lib.RingrunError, match=r"rank 1 \(node2\) is gone") as e:
            _engine.wait(h)
        raised.append(e.value)
    assert raised[0] is not raised[1]  # each wait raises an exception of its own
    assert len(fake.released) == 1


def test_a_failing_finish_is_the_handles_error(fake):
    def finish(_):
        raise KeyError("no rows")
    h = _engine._submit("x", lambda ref: fake.ringrun_barrier_submit(ref), "x", finish)
    fake.status[h.ptr] = 0
    with pytest.raises(KeyError, match="no rows"):
        _engine.wait(h)
    assert len(fake.released) == 1 and not _engine._live


def test_wait_sleeps_in_slices_until_another_thread_completes_it(fake):
    h = allreduce()
    threading.Timer(0.15, lambda: fake.status.__setitem__(h.ptr, 0)).start()
    t0 = time.monotonic()
    _engine.wait(h)
    assert time.monotonic() - t0 >= 0.1
    assert fake.calls["wait_for"] >= 2  # slices of WAIT_SLICE_S, not one long C wait


def test_poll_never_blocks_while_another_thread_holds_the_handle(fake):
    h = allreduce()
    fake.status[h.ptr] = 0
    with h._lock:  # another thread is testing or waiting on it
        tests = fake.calls["test"]
        assert _engine.poll(h) is False and fake.calls["test"] == tests
    assert _engine.poll(h) is True


def test_a_dropped_pending_handle_keeps_its_buffers_until_it_completes(fake):
    buf = Buffer()
    alive = weakref.ref(buf)
    h = allreduce(keep=(buf,))
    ptr = h.ptr
    del h, buf
    gc.collect()
    assert [holder.value for holder in _engine._detached] == [ptr]
    assert alive() is not None  # the collective still runs into it
    later = [allreduce("next")]  # each submission releases the parked handles that are done
    assert alive() is not None and fake.released == [] and len(_engine._detached) == 1
    fake.status[ptr] = 0
    later.append(allreduce("after"))
    gc.collect()
    assert fake.released == [ptr] and not _engine._detached and alive() is None


def test_an_exception_right_after_the_c_call_parks_the_handle(fake, monkeypatch):
    """A signal may raise between the C call's return and the end of making the Handle: the
    collective runs on, so its buffers stay, and its C handle is released once, when done."""
    class Interrupted(_engine.Handle):
        def __init__(self, *args):
            super().__init__(*args)
            raise KeyboardInterrupt
    buf = Buffer()
    alive = weakref.ref(buf)
    with monkeypatch.context() as patch:
        patch.setattr(_engine, "Handle", Interrupted)
        with pytest.raises(KeyboardInterrupt):
            allreduce("lost", keep=(buf,))
    del buf
    gc.collect()
    lost = {holder.value for holder in _engine._detached}  # parked by _submit and by __del__
    assert len(lost) == 1 and alive() is not None
    fake.status[lost.pop()] = 0
    _engine._release_detached()
    gc.collect()
    assert len(fake.released) == 1 and not _engine._detached and not _engine._live
    assert alive() is None


def test_an_exception_before_the_c_call_keeps_nothing(fake):
    def call(_):
        raise TypeError("bad argument")
    with pytest.raises(TypeError):
        _engine._submit("x", call, "x", keep=(Buffer(),))
    assert not _engine._live and not _engine._detached


@pytest.mark.parametrize("status,error", [(_lib.ERR_INVALID_ARGUMENT, ValueError),
                                          (_lib.ERR_DUPLICATE_NAME, ValueError),
                                          (_lib.ERR_NOT_INITIALIZED, ValueError),
                                          (7, _lib.RingrunError)])
def test_a_refused_submission_raises_the_librarys_message(fake, status, error):
    fake.refuse = (status, b"the reason")
    with pytest.raises(error, match="allreduce 'r': the reason"):
        allreduce("r")
    assert not _engine._live and not _engine._detached


def test_after_shutdown_releases_every_parked_handle(fake):
    h = allreduce()
    ptr = h.ptr
    del h
    gc.collect()
    _engine.after_shutdown()  # ringrun_shutdown failed whatever was pending
    assert fake.released == [ptr] and not _engine._live and not _engine._detached


def test_reducescatter_of_uneven_shares_copies_this_ranks_rows(fake):
    """5 rows over 2 ranks: rank 1 gets rows 3 and 4 of the full reduction."""
    fake.rank = 1
    recv = (ctypes.c_double * 2)()
    h = _engine.reducescatter(0, ctypes.addressof(recv), 5, 1, _lib.FLOAT64, _lib.SUM, "rs")
    what, _, (send, tmp, count, *_) = fake.submitted[-1]
    assert what == "allreduce" and count == 5
    ctypes.memmove(tmp, (ctypes.c_double * 5)(0, 1, 2, 3, 4), 5 * 8)  # the reduction's result
    fake.status[h.ptr] = 0
    _engine.wait(h)
    assert list(recv) == [3.0, 4.0]


class _Copy:
    """Stands for the CUDA event recorded after a copy out of a handle's device output."""

    def __init__(self):
        self.done = False

    def query(self):
        return self.done


def test_handle_with_a_pending_copy_is_released_after_it(fake):
    copy = _Copy()

    def finish(h):
        h.release_after = copy
        return "result"
    h = _engine._submit("g", lambda ref: fake.ringrun_barrier_submit(ref), "g", finish)
    ptr = h.ptr
    fake.status[ptr] = 0
    assert _engine.wait(h) == "result" and h.ptr is None and fake.released == []
    assert _engine._release_deferred() == 1 and fake.released == []
    copy.done = True
    assert _engine._release_deferred() == 0 and fake.released == [ptr]
    assert _engine._release_deferred() == 0 and fake.released == [ptr]


def test_handle_without_device_output_is_released_at_once(fake):
    h = allreduce()
    fake.status[h.ptr] = 0
    _engine.wait(h)
    assert len(fake.released) == 1 and _engine._deferred == []


def test_release_deferred_waits_until_its_deadline_then_leaks(fake):
    done, stuck = _Copy(), _Copy()
    done.done = True
    fake.status.update({1: 0, 2: 0})
    _engine._release_when_done(1, stuck)
    _engine._release_when_done(2, done)
    assert _engine._release_deferred(deadline_s=0.02) == 1
    assert fake.released == [2]  # the handle still read by a copy is not freed
    stuck.done = True
    assert _engine._release_deferred(deadline_s=0.02) == 0 and fake.released == [2, 1]


def test_a_failing_query_counts_as_finished(fake):
    class Failed:
        def query(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    fake.status[7] = 0
    _engine._release_when_done(7, Failed())
    assert _engine._release_deferred() == 0 and fake.released == [7]


def test_raise_shared_clones_without_calling_init():
    class Formatted(Exception):
        def __init__(self, n):
            super().__init__(f"bad {n}")
            self.n = n
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise Formatted(3)
    except Formatted as e:
        original = e
    original.__notes__ = ["a note"]
    raised = []
    for _ in range(2):
        try:
            _engine.raise_shared(original)
        except Formatted as e:
            raised.append(e)
    a, b = raised
    assert a is not b and a is not original
    assert str(a) == "bad 3" and a.n == 3  # __init__ not run again on "bad 3"
    assert isinstance(a.__context__, KeyError)
    a.__notes__.append("only on a")
    assert original.__notes__ == ["a note"] == b.__notes__
    depth = len(traceback.extract_tb(original.__traceback__))
    assert len(traceback.extract_tb(b.__traceback__)) == len(traceback.extract_tb(a.__traceback__))
    assert len(traceback.extract_tb(original.__traceback__)) == depth


def test_init_sleeps_by_default_and_leaves_the_environment_alone(fake):
    before = dict(os.environ)
    ringrun.init()
    try:
        assert fake.calls["init"] == [0]
        assert dict(os.environ) == before
    finally:
        ringrun.shutdown()
    assert not ringrun.is_initialized()


def test_init_raises_the_librarys_message(fake, monkeypatch):
    def refuse(spin):
        fake.error = b"RINGRUN_RANK and RINGRUN_SIZE disagree"
        return _lib.ERR_INVALID_ARGUMENT
    monkeypatch.setattr(fake, "ringrun_init_with_spin", refuse)
    with pytest.raises(_lib.RingrunError, match="init: RINGRUN_RANK and RINGRUN_SIZE disagree"):
        ringrun.init()
    assert not ringrun.is_initialized()


def test_the_real_library_refuses_a_bad_spin_before_joining():
    assert _lib.lib.ringrun_init_with_spin(2) == _lib.ERR_INVALID_ARGUMENT
    assert "spin 2 is not -1, 0 or 1" in _lib.error_message()
    assert _lib.lib.ringrun_size() == -1  # not initialized


def test_nccl_built_is_the_librarys_nccl_version():
    mpi_ops = pytest.importorskip("ringrun.torch.mpi_ops")
    version = _lib.lib.ringrun_nccl_version()
    assert mpi_ops.nccl_built() == version and mpi_ops.cuda_built() == (version != 0)
    expected = os.environ.get("RINGRUN_EXPECT_NCCL")  # this build's RINGRUN_HAVE_NCCL
    if expected is not None:
        assert (version != 0) == (expected == "1"), version
    if version:
        assert version >= 21000, version  # NCCL_VERSION_CODE of 2.10 or later


def test_nccl_built_follows_the_library(fake, monkeypatch):
    mpi_ops = pytest.importorskip("ringrun.torch.mpi_ops")
    for version in (22809, 0):
        monkeypatch.setattr(fake, "ringrun_nccl_version", lambda v=version: v, raising=False)
        assert mpi_ops.nccl_built() == version and mpi_ops.cuda_built() == bool(version)
