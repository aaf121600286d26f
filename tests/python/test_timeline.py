"""Horovod's timeline from the program (start_timeline, stop_timeline), run at np=2 with
HOROVOD_TIMELINE=DYNAMIC: nothing is written until the program starts it; a start while a
collective is in flight; what lies between start and stop, and only that, in each rank's file
(rank 0's is the path named, rank r's t.<r>.json beside t.json); CYCLE_START marks when asked;
and Horovod's answers to a stop without a start, a start without HOROVOD_TIMELINE, and calls
before init."""
import json
import os
import shutil
import tempfile

import pytest
import torch

import ringrun.torch as hvd

hvd.init()  # every rank runs this module's tests in the same order


def shared_dir():
    d = tempfile.mkdtemp(prefix="ringrun-timeline-") if hvd.rank() == 0 else None
    return hvd.broadcast_object(d, 0, name="timeline.dir")


def mine(path):
    """This rank's file of a timeline started at `path`."""
    if hvd.rank() == 0:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.{hvd.rank()}{ext}"


def tensors(events):
    return {e.get("args", {}).get("tensor") for e in events} - {None}


def test_dynamic_timeline_holds_what_lies_between_start_and_stop():
    assert os.environ.get("HOROVOD_TIMELINE") == "DYNAMIC"
    d = shared_dir()
    path = os.path.join(d, "timeline.json")
    hvd.allreduce(torch.ones(2), name="tl.before")
    assert not os.path.exists(mine(path))  # DYNAMIC: nothing until started
    # Rank 0 starts with a collective in flight, which rank 1 submits only after rank 0 started
    # (tl.started completes then): the start waits for neither.
    if hvd.rank() == 0:
        handle = hvd.allreduce_async(torch.ones(2), name="tl.inflight")
        hvd.start_timeline(path, mark_cycles=True)
        hvd.allreduce(torch.ones(1), name="tl.started")
    else:
        hvd.allreduce(torch.ones(1), name="tl.started")
        hvd.start_timeline(path, mark_cycles=True)
        handle = hvd.allreduce_async(torch.ones(2), name="tl.inflight")
    assert torch.equal(hvd.synchronize(handle), torch.ones(2))
    for i in range(3):
        hvd.allreduce(torch.ones(2), name=f"tl.during{i}")
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(2), name="tl.after")
    with open(mine(path)) as f:
        events = json.load(f)  # strict JSON once stopped
    names = tensors(events)
    assert {"tl.inflight", "tl.during0", "tl.during1", "tl.during2"} <= names
    assert "tl.before" not in names and "tl.after" not in names
    kinds = {e["name"] for e in events}
    assert {"NEGOTIATE", "ALLREDUCE", "CYCLE_START"} <= kinds
    assert all(e.get("ts", 0) >= 0 for e in events)
    hvd.barrier()
    if hvd.rank() == 0:
        shutil.rmtree(d)


def test_restart_truncates_and_marks_cycles_only_when_asked():
    d = shared_dir()
    path = os.path.join(d, "t.json")
    hvd.start_timeline(path)  # mark_cycles defaults to False, as Horovod's
    hvd.allreduce(torch.ones(1), name="tl.first")
    hvd.start_timeline(path)  # the file open: goes on writing it
    hvd.allreduce(torch.ones(1), name="tl.second")
    hvd.stop_timeline()
    hvd.stop_timeline()  # none open: does nothing, as Horovod's
    with open(mine(path)) as f:
        events = json.load(f)
    assert {"tl.first", "tl.second"} <= tensors(events)
    assert "CYCLE_START" not in {e["name"] for e in events}
    hvd.start_timeline(path, True)  # a new start truncates
    hvd.allreduce(torch.ones(1), name="tl.third")
    hvd.stop_timeline()
    with open(mine(path)) as f:
        events = json.load(f)
    assert "tl.third" in tensors(events) and "tl.first" not in tensors(events)
    assert "CYCLE_START" in {e["name"] for e in events}
    with pytest.raises(RuntimeError, match="(?i)no such file"):  # the open failure, named
        hvd.start_timeline(os.path.join(d, "no", "such", "dir.json"))
    hvd.barrier()
    if hvd.rank() == 0:
        shutil.rmtree(d)


def test_start_needs_horovod_timeline_and_init():
    """Run last: it shuts down and joins again without HOROVOD_TIMELINE."""
    hvd.shutdown()
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.start_timeline("t.json")
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.stop_timeline()
    saved = os.environ.pop("HOROVOD_TIMELINE")
    try:
        hvd.init()
        with pytest.raises(ValueError, match="HOROVOD_TIMELINE=DYNAMIC"):
            hvd.start_timeline(os.path.join(tempfile.gettempdir(), "never.json"))
        hvd.stop_timeline()  # Horovod's stop without a timeline succeeds
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()
    finally:
        os.environ["HOROVOD_TIMELINE"] = saved
