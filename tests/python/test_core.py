"""ringrun's core functions on NumPy arrays and buffer-protocol objects (no torch)."""
import array
import sys

import numpy as np
import pytest

import ringrun

DTYPES = [np.int8, np.uint8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]


@pytest.fixture(scope="module", autouse=True)
def job():
    ringrun.init()
    yield


def test_no_torch_needed():
    assert "torch" not in sys.modules


def test_shape():
    assert 0 <= ringrun.rank() < ringrun.size()
    assert 0 <= ringrun.local_rank() < ringrun.local_size()
    assert 0 <= ringrun.cross_rank() < ringrun.cross_size()


def test_membership_epoch():
    # Not an elastic job: the epoch is 0, and an int that allreduce(Max) can agree on.
    epoch = ringrun.membership_epoch()
    assert epoch == 0 and isinstance(epoch, int)
    agreed = ringrun.allreduce(np.array([epoch], np.int64), op=ringrun.Max)
    assert agreed.tolist() == [0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_collectives(dtype):
    n, r = ringrun.size(), ringrun.rank()
    x = np.full((3, 2), r + 1, dtype)
    assert np.array_equal(ringrun.allreduce(x, op=ringrun.Sum), np.full((3, 2), n * (n + 1) // 2))
    assert np.array_equal(ringrun.allreduce(x, op=ringrun.Max), np.full((3, 2), n))
    y = x.copy()
    ringrun.allreduce_(y, op=ringrun.Min)
    assert np.array_equal(y, np.ones((3, 2)))
    assert np.array_equal(ringrun.broadcast(x, root_rank=n - 1), np.full((3, 2), n))
    g = ringrun.allgather(np.full((r + 1,), r, dtype))
    assert g.tolist() == [q for q in range(n) for _ in range(q + 1)]
    out, splits = ringrun.alltoall(np.full(n, r, dtype))
    assert out.tolist() == list(range(n)) and splits.tolist() == [1] * n
    rs = ringrun.reducescatter(np.ones((2 * n, 2), dtype), op=ringrun.Sum)
    assert rs.shape == (2, 2) and np.all(rs == n)
    ringrun.barrier()


@pytest.mark.parametrize("dtype", [np.int16, np.int32])
def test_integer_average_truncates_as_horovod(dtype):
    n = ringrun.size()
    x = np.array([-1, -2, 1, 2], dtype) * (1 if ringrun.rank() == 0 else 0)
    want = np.array([int(v / n) for v in (-1, -2, 1, 2)], dtype)
    assert np.array_equal(ringrun.allreduce(x, op=ringrun.Average), want)
    rows = np.stack([x] * n)
    assert np.array_equal(ringrun.reducescatter(rows, op=ringrun.Average), want[None])


def test_buffer_protocol():
    n, r = ringrun.size(), ringrun.rank()
    assert ringrun.allreduce(array.array("d", [r, 1.0]), op=ringrun.Sum).tolist() == \
        [n * (n - 1) / 2, float(n)]
    buf = bytearray([r, 7])
    ringrun.broadcast_(buf, root_rank=0)
    assert buf == bytearray([0, 7])
    assert ringrun.allreduce(memoryview(b"\x01\x02"), op=ringrun.Sum).tolist() == [n, 2 * n]
    strided = memoryview(bytearray([1, 9, 2, 9]))[::2]  # not contiguous: copied
    assert ringrun.allreduce(strided, op=ringrun.Sum).tolist() == [n, 2 * n]
    with pytest.raises(ValueError, match="C-contiguous"):
        ringrun.allreduce_(strided)


def test_objects():
    assert ringrun.broadcast_object({"x": ringrun.rank()}, root_rank=0) == {"x": 0}
    assert ringrun.allgather_object(str(ringrun.rank())) == [str(q) for q in range(ringrun.size())]


def test_reducescatter_of_a_scalar_fails_and_the_job_goes_on():
    for scalar in (np.array(1.0, np.float32), np.float32(1.0)):
        with pytest.raises(ValueError, match="Reducescatter does not support scalar inputs"):
            ringrun.reducescatter(scalar, op=ringrun.Sum)
    n = ringrun.size()
    assert np.array_equal(ringrun.reducescatter(np.ones((n, 2), np.float32), op=ringrun.Sum),
                          np.full((1, 2), n))


def test_alltoall_splits_are_integers():
    n = ringrun.size()
    with pytest.raises(ValueError, match="splits must be integers"):
        ringrun.alltoall(np.arange(n, dtype=np.float32), splits=[1.0] * n)
    out, received = ringrun.alltoall(np.arange(n, dtype=np.float32), splits=np.ones(n, np.int32))
    assert received.tolist() == [1] * n


def test_errors():
    with pytest.raises(TypeError, match="not supported"):
        ringrun.allreduce(np.ones(2, np.complex64))
    with pytest.raises(ValueError, match="unknown op"):
        ringrun.allreduce(np.ones(2), op=42)
    with pytest.raises(ValueError, match="writable"):
        ringrun.allreduce_(b"ab")
