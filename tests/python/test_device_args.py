"""The CPU-testable parts of ringrun.torch's CUDA path: how a grouped allreduce is split,
the device-memory description handed to torch, byte views and device checks (the deferred
release of handles whose device output is still being copied: test_handles.py). The CUDA
collectives themselves are checked by tests/gpu/torch_cuda_check.py (scripts/gpu-check.sh)."""
import types

import pytest
import torch

import ringrun.torch as hvd
from ringrun import _lib
from ringrun.torch import mpi_ops

F32, F64 = _lib.FLOAT32, _lib.FLOAT64


def test_groups_split_by_dtype_in_order():
    keys = [(F64, "cpu"), (F32, "cpu"), (F64, "cpu")]
    assert mpi_ops._groups(keys, "g") == [((F32, "cpu"), [1], "g.float32"),
                                          ((F64, "cpu"), [0, 2], "g.float64")]


def test_groups_one_group_keeps_the_name():
    assert mpi_ops._groups([(F32, "cuda:0")] * 3, "g") == [((F32, "cuda:0"), [0, 1, 2], "g")]
    assert mpi_ops._groups([(F32, "cpu"), (F64, "cpu")], None) == [
        ((F32, "cpu"), [0], None), ((F64, "cpu"), [1], None)]


def test_groups_name_the_device_when_devices_differ():
    keys = [(F32, "cuda:0"), (F32, "cpu"), (F64, "cuda:0")]
    assert [(idx, name) for _, idx, name in mpi_ops._groups(keys, "g")] == [
        ([1], "g.float32.cpu"), ([0], "g.float32.cuda:0"), ([2], "g.float64.cuda:0")]


def test_cuda_array_interface_describes_bytes():
    assert mpi_ops._cuda_array(0x7f0000001000, 24) == {
        "shape": (24,), "typestr": "|u1", "data": (0x7f0000001000, False), "strides": None,
        "version": 2}
    assert mpi_ops._DeviceBytes(64, 8).__cuda_array_interface__["data"] == (64, False)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
                                   torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_byte_view_covers_every_byte(dtype):
    t = torch.arange(12).reshape(3, 4).to(dtype)
    b = mpi_ops._byte_view(t)
    assert b.dtype == torch.uint8 and b.numel() == t.numel() * t.element_size()
    assert b.data_ptr() == t.data_ptr()
    copy = torch.zeros_like(t)
    mpi_ops._byte_view(copy).copy_(b)
    assert torch.equal(copy, t)


def test_prepare_device_ignores_host_tensors():
    mpi_ops._prepare_device(torch.ones(2), torch.ones(3, dtype=torch.float64))
    mpi_ops._prepare_device()


def _fake_cuda_tensor(index=0):
    return types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", index))


def test_prepare_device_refuses_mixed_devices():
    with pytest.raises(ValueError, match="one device"):
        mpi_ops._prepare_device(_fake_cuda_tensor(), torch.ones(2))
    with pytest.raises(ValueError, match="one device"):
        mpi_ops._prepare_device(_fake_cuda_tensor(0), _fake_cuda_tensor(1))


def test_cpu_collectives_unchanged_after_device_helpers():
    hvd.init()
    n = hvd.size()
    assert torch.equal(hvd.allreduce(torch.ones(3), op=hvd.Sum), torch.full((3,), float(n)))


def test_grouped_allreduce_prepares_each_group_on_its_own(monkeypatch):
    """A grouped allreduce of tensors on several devices is one submission per (dtype,
    device): the one-device check and the stream ordering apply to each group, not to all."""
    hvd.init()
    calls = []
    monkeypatch.setattr(mpi_ops, "_prepare_device", lambda *ts: calls.append(ts))
    a, b, c = torch.ones(2), torch.ones(3, dtype=torch.float64), torch.ones(4)
    outs = hvd.grouped_allreduce([a, b, c], op=hvd.Sum)
    assert [len(ts) for ts in calls] == [4, 2]  # float32: a and c in and out; float64: b
    assert calls[0][0] is a and calls[0][1] is c and calls[1][0] is b
    assert all(torch.equal(o, t * hvd.size()) for o, t in zip(outs, (a, b, c)))
