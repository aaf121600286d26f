"""Horovod's answers, by the categories of Horovod's own PyTorch tests: int16 and every other
dtype with every op, integer Average and scaling, the grouped and sparse collectives and their
gradients, Adasum and its restrictions, Horovod's signatures, process sets, join and failures
that must not desynchronize later collectives, and the optimizer-state broadcast of parameters
without gradients. Run at np=2, 3 and 4."""
import inspect
import os
import sys

import pytest
import torch
import torch.nn as nn

import ringrun.torch as hvd
from ringrun.torch import mpi_ops

hvd.init()  # every rank runs this module's tests in the same order

INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def ints(rank, dtype, n=12):
    """Values of each sign (uint8: non-negative), small enough that a product of 4 fits."""
    base = torch.arange(n, dtype=torch.int64) % 5 - (0 if dtype == torch.uint8 else 2)
    return (base * (rank + 1) + rank).to(dtype)


def trunc_scaled(t, factor):
    """Horovod's ScaleBuffer of an integer tensor: factor * value in double, truncated."""
    return torch.tensor([int(factor * float(v)) for v in t.tolist()], dtype=t.dtype)


def reference(op, dtype, pre=1.0, post=1.0):
    n = hvd.size()
    xs = [trunc_scaled(ints(r, dtype), pre).to(torch.int64) for r in range(n)]
    stack = torch.stack(xs)
    if op in (hvd.Sum, hvd.Average):
        out = stack.sum(0)
    elif op == hvd.Min:
        out = stack.min(0).values
    elif op == hvd.Max:
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    out = out.to(dtype)  # wraps as the dtype's own sum does
    return trunc_scaled(out, post / n if op == hvd.Average else post)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", OPS)
def test_integer_allreduce_every_op(dtype, op):
    x = ints(hvd.rank(), dtype)
    assert torch.equal(hvd.allreduce(x, op=op), reference(op, dtype))
    y = x.clone()
    hvd.allreduce_(y, op=op)
    assert torch.equal(y, reference(op, dtype))


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average, hvd.Max])
def test_integer_scaling_as_horovod(dtype, op):
    """prescale before the reduction and postscale after it, each in double and truncated;
    Average is postscale / size(), so it truncates toward zero."""
    pre, post = 1.5, 0.7
    x = ints(hvd.rank(), dtype)
    out = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
    assert torch.equal(out, reference(op, dtype, pre, post))
    out = hvd.grouped_allreduce([x, x[:5]], op=op, prescale_factor=pre, postscale_factor=post)
    assert torch.equal(out[0], reference(op, dtype, pre, post))
    assert torch.equal(out[1], reference(op, dtype, pre, post)[:5])


def test_integer_average_truncates_toward_zero():
    n = hvd.size()
    x = torch.tensor([-1, -2, 1, 2], dtype=torch.int32) * (1 if hvd.rank() == 0 else 0)
    out = hvd.allreduce(x, op=hvd.Average)
    want = torch.tensor([int(v / n) for v in (-1, -2, 1, 2)], dtype=torch.int32)
    assert torch.equal(out, want), (out, want)


def test_int16_moves_and_wraps():
    n, r = hvd.size(), hvd.rank()
    x = torch.arange(2 * (r + 1), dtype=torch.int16).reshape(r + 1, 2) + 1000 * r
    gathered = hvd.allgather(x)
    want = torch.cat([torch.arange(2 * (j + 1), dtype=torch.int16).reshape(j + 1, 2) + 1000 * j
                      for j in range(n)])
    assert torch.equal(gathered, want)
    b = hvd.broadcast(torch.full((3,), -7 - r, dtype=torch.int16), root_rank=n - 1)
    assert torch.equal(b, torch.full((3,), -7 - (n - 1), dtype=torch.int16))
    a = hvd.alltoall(torch.full((n, 2), r, dtype=torch.int16))
    assert torch.equal(a, torch.arange(n, dtype=torch.int16).repeat_interleave(2).reshape(n, 2))
    big = torch.full((4,), 30000, dtype=torch.int16)  # the sum wraps, as int16 arithmetic
    assert torch.equal(hvd.allreduce(big, op=hvd.Sum), (big.to(torch.int64) * n).to(torch.int16))
    rs = hvd.reducescatter(torch.full((2 * n, 3), 3, dtype=torch.int16), op=hvd.Average)
    assert rs.dtype == torch.int16 and torch.equal(rs, torch.full((2, 3), 3, dtype=torch.int16))


def wrap16(v):
    return (v + 32768) % 65536 - 32768


def test_int16_sum_and_average_exact_at_the_limits():
    """int16 sums wrap at the type's limits, and Average is that wrapped Sum times 1/size() in
    double, truncated toward zero (Horovod's HOROVOD_INT16 on the CPU)."""
    n, r = hvd.size(), hvd.rank()
    mine = [-32768, 32767, -7, 7, 3, -32767] if r == 0 else [-1, 1, 0, 0, r, -2]
    x = torch.tensor(mine, dtype=torch.int16)
    columns = [[-32768, 32767, -7, 7, 3, -32767]] + [[-1, 1, 0, 0, q, -2] for q in range(1, n)]
    sums = [wrap16(sum(c)) for c in zip(*columns)]
    out = hvd.allreduce(x, op=hvd.Sum, name="int16.limits.sum")
    assert out.dtype == torch.int16 and out.tolist() == sums, (out, sums)
    averages = [int(s * (1.0 / n)) for s in sums]
    out = hvd.allreduce(x, op=hvd.Average, name="int16.limits.average")
    assert out.dtype == torch.int16 and out.tolist() == averages, (out, averages)
    assert x.tolist() == mine  # the input untouched


def test_int16_is_its_own_dtype():
    """int16 travels as int16: a rank passing int32 for the same tensor is a dtype mismatch
    that names both, and the job goes on."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(hvd.HorovodInternalError, match="int16") as e:
        hvd.allreduce(torch.ones(3, dtype=torch.int16 if r == 0 else torch.int32), op=hvd.Sum,
                      name="int16.vs.int32")
    assert "int32" in str(e.value)
    assert hvd.allreduce(torch.ones(2, dtype=torch.int16), op=hvd.Sum).tolist() == [n, n]


@pytest.mark.parametrize("dtype", INTS + [torch.float32])
def test_reducescatter_integer_average_and_scaling(dtype):
    n, r = hvd.size(), hvd.rank()
    x = torch.stack([ints(r, dtype)] * (2 * n))
    out = hvd.reducescatter(x, op=hvd.Average, prescale_factor=1.5, postscale_factor=0.7)
    if dtype.is_floating_point:
        want = torch.stack([ints(j, dtype) * 1.5 for j in range(n)]).sum(0) * (0.7 / n)
        assert torch.allclose(out, torch.stack([want] * 2), atol=1e-5)
    else:
        want = reference(hvd.Average, dtype, 1.5, 0.7)
        assert torch.equal(out, torch.stack([want] * 2))


# ---- grouped and sparse ------------------------------------------------------------------------


def test_grouped_allgather_values_names_and_grads():
    n, r = hvd.size(), hvd.rank()
    a = torch.full((r + 1, 2), float(r), requires_grad=True)
    b = torch.full((2, 3), float(r), dtype=torch.float64, requires_grad=True)
    outs = hvd.grouped_allgather([a, b], name="ga")
    assert torch.equal(outs[0], torch.cat([torch.full((j + 1, 2), float(j)) for j in range(n)]))
    assert torch.equal(outs[1], torch.cat([torch.full((2, 3), float(j), dtype=torch.float64)
                                           for j in range(n)]))
    (outs[0].sum() * (r + 1) + outs[1].sum()).backward()
    # As Horovod: the Average-allreduce of the output's gradients, sliced to this rank's rows.
    assert torch.allclose(a.grad, torch.full((r + 1, 2), (n + 1) / 2))
    assert torch.equal(b.grad, torch.ones(2, 3, dtype=torch.float64))
    h = hvd.grouped_allgather_async([torch.ones(1, dtype=torch.int16) * r, torch.ones(2) * r])
    got = hvd.synchronize(h)
    assert torch.equal(got[0], torch.arange(n, dtype=torch.int16))
    assert torch.equal(got[1], torch.arange(n, dtype=torch.float32).repeat_interleave(2))


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_grouped_reducescatter_values_and_horovods_grads(op):
    n, r = hvd.size(), hvd.rank()
    a = torch.full((2 * n, 2), float(r + 1), requires_grad=True)
    b = torch.full((n + 1,), float(r + 1), dtype=torch.float64, requires_grad=True)
    outs = hvd.grouped_reducescatter([a, b], op=op, prescale_factor=2.0)
    total = 2.0 * n * (n + 1) / 2 / (n if op == hvd.Average else 1)
    assert torch.allclose(outs[0], torch.full((2, 2), total))
    assert outs[1].shape == (2 if r == 0 else 1,)
    assert torch.allclose(outs[1], torch.full(outs[1].shape, total, dtype=torch.float64))
    (outs[0].sum() + outs[1].sum()).backward()
    scale = 2.0 * (n if op == hvd.Sum else 1)  # Horovod's gradient, see docs/python.md
    assert torch.allclose(a.grad, torch.full((2 * n, 2), scale))
    assert torch.allclose(b.grad, torch.full((n + 1,), scale, dtype=torch.float64))
    h = hvd.grouped_reducescatter_async([torch.ones(n, dtype=torch.int32)], "grs", hvd.Sum)
    assert torch.equal(hvd.synchronize(h)[0], torch.full((1,), n, dtype=torch.int32))


def test_sparse_allreduce_async_as_horovod():
    n, r = hvd.size(), hvd.rank()
    sp = torch.sparse_coo_tensor([[r, r + 1]], [1.0, float(r)], (n + 1,))
    for op in (hvd.Sum, hvd.Average):
        wait = hvd.sparse_allreduce_async(sp, f"sparse.{op}", op)
        out = wait()
        assert out.is_sparse and out._nnz() == 2 * n
        dense = torch.stack([torch.sparse_coo_tensor([[j, j + 1]], [1.0, float(j)],
                                                     (n + 1,)).to_dense() for j in range(n)])
        want = dense.sum(0) / (n if op == hvd.Average else 1)
        assert torch.allclose(out.to_dense(), want)


# ---- Adasum ------------------------------------------------------------------------------------


def adasum_reference(vectors):
    """Adasum of two vectors, applied pairwise along a binary tree (Horovod's definition)."""
    vs = [v.double() for v in vectors]
    while len(vs) > 1:
        nxt = []
        for a, b in zip(vs[::2], vs[1::2]):
            dot = float(a @ b)
            ca = 1 - dot / (2 * float(a @ a)) if float(a @ a) > 0 else 1.0
            cb = 1 - dot / (2 * float(b @ b)) if float(b @ b) > 0 else 1.0
            nxt.append(ca * a + cb * b)
        vs = nxt
    return vs[0]


def test_adasum_and_its_restrictions():
    n, r = hvd.size(), hvd.rank()
    if n & (n - 1):
        with pytest.raises(NotImplementedError, match="non-power of 2"):
            hvd.allreduce(torch.ones(3), op=hvd.Adasum)
        return
    gen = torch.Generator().manual_seed(11)
    xs = [torch.randn(17, generator=gen, dtype=torch.float64) for _ in range(n)]
    out = hvd.allreduce(xs[r], op=hvd.Adasum)
    assert torch.allclose(out, adasum_reference(xs), atol=1e-12)
    # Parallel vectors of equal length combine to one of them (|a| == |b|, a == b).
    same = hvd.allreduce(torch.ones(4), op=hvd.Adasum)
    assert torch.allclose(same, torch.ones(4))
    # Orthogonal ones add up.
    orth = hvd.allreduce(torch.eye(n)[r], op=hvd.Adasum)
    assert torch.allclose(orth, torch.ones(n))
    ys = hvd.grouped_allreduce([xs[r].float(), torch.zeros(3)], op=hvd.Adasum)
    assert torch.allclose(ys[0].double(), adasum_reference([x.float() for x in xs]), atol=1e-5)
    assert torch.equal(ys[1], torch.zeros(3))
    with pytest.raises(ValueError, match="Adasum.*not supported"):
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.reducescatter(torch.ones(2 * n), op=hvd.Adasum)


def test_adasum_optimizer_agrees_on_every_rank():
    n, r = hvd.size(), hvd.rank()
    if n & (n - 1):
        pytest.skip("Adasum needs a power-of-two size")
    torch.manual_seed(5)
    model = nn.Linear(4, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        opt.zero_grad()
        torch.manual_seed(100 + r)
        model(torch.randn(3, 4)).pow(2).sum().backward()
        opt.step()
    mine = [p.detach() for p in model.parameters()]
    for p, q in zip(mine, before):
        assert not torch.equal(p, q)
        everyone = hvd.allgather(p.unsqueeze(0))
        assert all(torch.equal(everyone[0], e) for e in everyone)


# ---- signatures --------------------------------------------------------------------------------

_PS, _C = "process_set", "compression"
# horovod/torch/mpi_ops.py's parameter lists, in order.
HOROVOD_SIGNATURES = {
    "allreduce": ["tensor", "average", "name", _C, "op", "prescale_factor", "postscale_factor",
                  _PS],
    "allreduce_async": ["tensor", "average", "name", "op", "prescale_factor",
                        "postscale_factor", _PS],
    "allreduce_": ["tensor", "average", "name", "op", "prescale_factor", "postscale_factor", _PS],
    "allreduce_async_": ["tensor", "average", "name", "op", "prescale_factor",
                         "postscale_factor", _PS],
    "grouped_allreduce": ["tensors", "average", "name", _C, "op", "prescale_factor",
                          "postscale_factor", _PS],
    "grouped_allreduce_async": ["tensors", "average", "name", "op", "prescale_factor",
                                "postscale_factor", _PS],
    "sparse_allreduce_async": ["tensor", "name", "op", _PS],
    "allgather": ["tensor", "name", _PS],
    "allgather_async": ["tensor", "name", _PS],
    "grouped_allgather": ["tensors", "name", _PS],
    "grouped_allgather_async": ["tensors", "name", _PS],
    "broadcast": ["tensor", "root_rank", "name", _PS],
    "broadcast_async": ["tensor", "root_rank", "name", _PS],
    "broadcast_": ["tensor", "root_rank", "name", _PS],
    "broadcast_async_": ["tensor", "root_rank", "name", _PS],
    "alltoall": ["tensor", "splits", "name", _PS],
    "alltoall_async": ["tensor", "splits", "name", _PS],
    "reducescatter": ["tensor", "name", _C, "op", _PS, "prescale_factor", "postscale_factor"],
    "reducescatter_async": ["tensor", "name", "op", _PS, "prescale_factor", "postscale_factor"],
    "grouped_reducescatter": ["tensors", "name", _C, "op", _PS, "prescale_factor",
                              "postscale_factor"],
    "grouped_reducescatter_async": ["tensors", "name", "op", _PS, "prescale_factor",
                                    "postscale_factor"],
    "join": ["device"],
    "barrier": [_PS],
    "init": ["comm", "process_sets"],
    "start_timeline": ["file_path", "mark_cycles"],
    "stop_timeline": [],
    "broadcast_parameters": ["params", "root_rank"],
    "broadcast_optimizer_state": ["optimizer", "root_rank", "model"],
    "broadcast_object": ["obj", "root_rank", "name", _PS],
    "DistributedOptimizer": ["optimizer", "named_parameters", _C, "backward_passes_per_step",
                             "op", "gradient_predivide_factor", "num_groups", "groups",
                             "sparse_as_dense", _PS],
}


@pytest.mark.parametrize("fn", sorted(HOROVOD_SIGNATURES))
def test_horovods_signature(fn):
    params = list(inspect.signature(getattr(hvd, fn)).parameters)
    assert params == HOROVOD_SIGNATURES[fn]


def test_reducescatter_async_positional_as_horovod():
    n = hvd.size()
    h = hvd.reducescatter_async(torch.ones(2 * n), "rs.positional", hvd.Sum,
                                hvd.global_process_set, 2.0, 0.5)
    assert torch.equal(hvd.synchronize(h), torch.full((2,), float(n)))


def test_nccl_built_is_horovods():
    v = hvd.nccl_built()
    assert type(v) is int and v >= 0


# ---- process sets ------------------------------------------------------------------------------


def test_process_sets():
    n, r = hvd.size(), hvd.rank()
    g = hvd.global_process_set
    assert g.process_set_id == 0 and g.size() == n and g.rank() == r and g.included()
    assert g.ranks == list(range(n))
    os.environ.pop("HOROVOD_DYNAMIC_PROCESS_SETS", None)
    with pytest.raises(ValueError, match="HOROVOD_DYNAMIC_PROCESS_SETS=1"):
        hvd.add_process_set([0])
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    try:
        with pytest.raises(ValueError, match="duplicate"):
            hvd.add_process_set(list(range(n)))
        with pytest.raises(ValueError, match="ranks of this job"):
            hvd.add_process_set([0, n])
        ps = hvd.add_process_set(hvd.ProcessSet(range(n - 1, 0, -1)))  # all ranks but 0
        assert ps.ranks == list(range(1, n)) and ps.process_set_id == 1 and ps.size() == n - 1
        assert ps.included() == (r > 0) and ps.rank() == r - 1
        with pytest.raises(ValueError, match="duplicate"):
            hvd.add_process_set(list(range(1, n)))
        # Rank 0 is not a member: every collective on the set says so, in Horovod's words,
        # before anything is submitted; the members are not held up by it.
        calls = [lambda: hvd.allreduce(torch.ones(2), process_set=ps),
                 lambda: hvd.allgather(torch.ones(2), process_set=ps),
                 lambda: hvd.broadcast(torch.ones(2), 1, process_set=ps),
                 lambda: hvd.alltoall(torch.ones(n - 1), process_set=ps),
                 lambda: hvd.reducescatter(torch.ones(n - 1), process_set=ps),
                 lambda: hvd.grouped_allreduce([torch.ones(2)], process_set=ps),
                 lambda: hvd.grouped_allgather([torch.ones(2)], process_set=ps),
                 lambda: hvd.grouped_reducescatter([torch.ones(n - 1)], process_set=ps),
                 lambda: hvd.barrier(process_set=ps)]
        if r == 0:
            for call in calls:
                with pytest.raises(ValueError, match="Rank 0 is not a member of the provided "
                                                     "process set"):
                    call()
        else:
            for call in calls:
                call()
        with pytest.raises(ValueError, match="invalid root rank 0 for provided process set"):
            hvd.broadcast(torch.ones(2), 0, process_set=ps)
        assert hvd.remove_process_set(ps) is True and ps.process_set_id is None
        assert hvd.remove_process_set(ps) is False
        assert hvd.remove_process_set(hvd.global_process_set) is False
        with pytest.raises(ValueError, match="not been registered"):
            hvd.allreduce(torch.ones(2), process_set=ps)
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=g),
                           torch.full((2,), float(n)))
        # Removed, its id is given again.
        again = hvd.add_process_set([n - 1])
        assert again.process_set_id == 1
        assert hvd.remove_process_set(again) is True
    finally:
        os.environ.pop("HOROVOD_DYNAMIC_PROCESS_SETS", None)


def _every_op_on(ps, tag):
    """Every collective on ps, checked against what its members hold (a member's rank in the
    job is its value). Non-members return at once."""
    if not ps.included():
        return
    k, me, members = ps.size(), ps.rank(), ps.ranks
    r = hvd.rank()
    x = torch.full((3,), float(r + 1))
    assert torch.equal(hvd.allreduce(x, op=hvd.Sum, name=f"{tag}.ar", process_set=ps),
                       torch.full((3,), float(sum(m + 1 for m in members))))
    avg = hvd.allreduce(x, op=hvd.Average, process_set=ps, prescale_factor=2.0)
    assert torch.allclose(avg, torch.full((3,), 2.0 * sum(m + 1 for m in members) / k))
    ints_avg = hvd.allreduce(torch.full((2,), r + 1, dtype=torch.int32), op=hvd.Average,
                             process_set=ps)
    assert ints_avg.tolist() == [int(sum(m + 1 for m in members) / k)] * 2
    if k & (k - 1) == 0:  # Adasum over the members' vectors, in set order
        from ringrun.torch import adasum
        want = adasum.combine([torch.full((3,), float(m + 1)) for m in members])
        assert torch.equal(hvd.allreduce(x, op=hvd.Adasum, process_set=ps), want)
    grouped = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, name=f"{tag}.gar", process_set=ps)
    assert torch.equal(grouped[1], 2 * torch.full((3,), float(sum(m + 1 for m in members))))
    gathered = hvd.allgather(torch.full((me + 1, 2), float(r)), name=f"{tag}.ag", process_set=ps)
    assert gathered[:, 0].tolist() == [float(m) for i, m in enumerate(members)
                                       for _ in range(i + 1)]
    ga = hvd.grouped_allgather([torch.full((1,), float(r)), torch.full((2,), float(r))],
                               process_set=ps)
    assert ga[0].tolist() == [float(m) for m in members]
    root = members[-1]  # a rank of the job, as Horovod's root_rank
    assert torch.equal(hvd.broadcast(torch.full((2,), float(r)), root, name=f"{tag}.bc",
                                     process_set=ps), torch.full((2,), float(root)))
    y = torch.full((2,), float(r))
    hvd.broadcast_(y, members[0], process_set=ps)
    assert torch.equal(y, torch.full((2,), float(members[0])))
    sent = torch.arange(k, dtype=torch.float32) + 10 * r  # row j goes to the set's rank j
    got = hvd.alltoall(sent, process_set=ps)
    assert got.tolist() == [float(10 * m + me) for m in members]
    got, splits = hvd.alltoall(torch.ones(k, 2) * r, splits=torch.ones(k, dtype=torch.int32),
                               process_set=ps)
    assert splits.tolist() == [1] * k and got[:, 0].tolist() == [float(m) for m in members]
    rs = hvd.reducescatter(torch.ones(2 * k + 1, 2), op=hvd.Sum, process_set=ps)
    assert rs.shape[0] == 2 + (1 if me < 1 else 0) and torch.all(rs == float(k))
    grs = hvd.grouped_reducescatter([torch.ones(k), torch.ones(2 * k)], op=hvd.Average,
                                    process_set=ps)
    assert [t.tolist() for t in grs] == [[1.0], [1.0, 1.0]]
    hvd.barrier(process_set=ps)
    assert hvd.broadcast_object({"from": root}, root, process_set=ps) == {"from": root}
    assert hvd.allgather_object(r, process_set=ps) == members
    # Gradients are reduced over the set (Horovod's: allreduce's is the allreduce of the
    # output's gradient with the same op).
    w = torch.ones(2, requires_grad=True)
    hvd.allreduce(w * (r + 1), op=hvd.Average, process_set=ps).sum().backward()
    assert torch.equal(w.grad, torch.full((2,), float(r + 1)))
    w = torch.ones(k * 2, requires_grad=True)
    hvd.alltoall(w * 1.0, process_set=ps).sum().backward()
    assert torch.equal(w.grad, torch.ones(k * 2))
    w = torch.ones(1, 2, requires_grad=True)
    hvd.allgather(w, process_set=ps).sum().backward()
    assert torch.equal(w.grad, torch.ones(1, 2))


def _ones_under_optimizer(lr, process_set):
    """(model, optimizer): a 2 -> 1 linear layer without bias, its weights 1, under a
    DistributedOptimizer of SGD(lr) on process_set."""
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                   named_parameters=model.named_parameters(),
                                   process_set=process_set)
    return model, opt


def test_process_sets_every_op_overlapping_and_interleaved():
    """Two overlapping sets registered at init (and dynamically), every op on each, the same
    names in both, interleaved with the job's own collectives and with each other."""
    n, r = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("needs two overlapping proper subsets")
    a = hvd.ProcessSet(range(0, n - 1))      # all but the last rank
    b = hvd.ProcessSet([0, n - 1])           # overlaps a in rank 0
    hvd.shutdown()
    hvd.init(process_sets=[a, b])
    try:
        assert (a.process_set_id, b.process_set_id) == (1, 2)
        for step in range(2):
            _every_op_on(a, "same")
            assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n
            _every_op_on(b, "same")
            # Asynchronous, the same name in both sets and in the job, completed out of order.
            handles = []
            if a.included():
                handles.append((hvd.allreduce_async(torch.ones(2), name="shared", op=hvd.Sum,
                                                    process_set=a), a.size()))
            if b.included():
                handles.append((hvd.allreduce_async(torch.ones(2), name="shared", op=hvd.Sum,
                                                    process_set=b), b.size()))
            handles.append((hvd.allreduce_async(torch.ones(2), name="shared", op=hvd.Sum), n))
            for h, k in reversed(handles):
                assert hvd.synchronize(h).tolist() == [float(k)] * 2
        # DistributedOptimizer on a set averages gradients over its members only.
        if a.included():
            model, opt = _ones_under_optimizer(1.0, a)
            model(torch.full((1, 2), float(r + 1))).sum().backward()
            opt.step()
            mean = sum(m + 1 for m in a.ranks) / a.size()
            assert torch.allclose(model.weight, torch.full((1, 2), 1.0 - mean))
        # Dynamic: a set of one rank, whose collectives wait for no other.
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        c = hvd.add_process_set([n - 1])
        assert c.process_set_id == 3
        if c.included():
            assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=c).item() == 1
        # Removed ids are given again first, in the order they were freed (Horovod's queue).
        assert hvd.remove_process_set(b) and hvd.remove_process_set(c)
        d = hvd.add_process_set([n - 1, 0])
        assert d.process_set_id == 2
        _every_op_on(d, "same")
        assert hvd.remove_process_set(d) and hvd.remove_process_set(a)
        # Ranks that disagree fail on every rank, and the job goes on.
        with pytest.raises(ValueError, match="passed other arguments"):
            hvd.add_process_set([0, 1] if r == 0 else [0, n - 1])
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n
    finally:
        os.environ.pop("HOROVOD_DYNAMIC_PROCESS_SETS", None)
        hvd.shutdown()
        hvd.init()


def test_distributed_optimizer_on_a_set_made_on_every_rank():
    """As in Horovod, a rank outside a DistributedOptimizer's process set may make it too: it
    reduces nothing, and its step() is the wrapped optimizer's on its own gradients, step after
    step, while the members average theirs over the set."""
    n, r = hvd.size(), hvd.rank()
    evens = list(range(0, n, 2))
    os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
    ps = hvd.add_process_set(evens)
    try:
        model, opt = _ones_under_optimizer(0.5, ps)
        grad = sum(m + 1 for m in evens) / len(evens) if r in evens else r + 1
        for step in range(1, 3):
            opt.zero_grad()
            model(torch.full((1, 2), float(r + 1))).sum().backward()
            opt.step()
            assert torch.equal(model.weight, torch.full((1, 2), 1.0 - step * 0.5 * grad))
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n
    finally:
        hvd.remove_process_set(ps)
        os.environ.pop("HOROVOD_DYNAMIC_PROCESS_SETS", None)


# ---- failures, join, and names -----------------------------------------------------------------


def test_a_failed_collective_while_a_rank_has_joined_does_not_desynchronize():
    """Rank 0 joins first; the others' broadcast, allgather, alltoall and reducescatter then
    fail (unnamed and named). After the join, every rank's unnamed collectives match again."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks")
    if r == 0:
        assert hvd.join() != 0 or n == 1
    else:
        failing = [lambda: hvd.broadcast(torch.ones(2), 1),
                   lambda: hvd.allgather(torch.ones(2)),
                   lambda: hvd.alltoall(torch.ones(n)),
                   lambda: hvd.reducescatter(torch.ones(n)),
                   lambda: hvd.broadcast(torch.ones(2), 1, name="named.while.joined")]
        for call in failing:
            with pytest.raises(hvd.HorovodInternalError):
                call()
        # An allreduce still runs, rank 0 contributing zeros.
        assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum),
                           torch.full((2,), float(n - 1)))
        hvd.join()
    for _ in range(2):
        assert torch.equal(hvd.broadcast(torch.full((2,), float(r)), 1), torch.ones(2))
        assert torch.equal(hvd.allgather(torch.full((1,), float(r))), torch.arange(n * 1.0))
        assert torch.equal(hvd.alltoall(torch.full((n,), float(r))), torch.arange(n * 1.0))
        assert torch.equal(hvd.reducescatter(torch.ones(n), op=hvd.Sum), torch.full((1,), n * 1.))
    assert torch.equal(hvd.broadcast(torch.full((2,), float(r)), 1, name="named.while.joined"),
                       torch.ones(2))


@pytest.mark.parametrize("case", ["dtype", "op", "trailing", "root", "collective"])
def test_arguments_that_differ_between_ranks_fail_on_every_rank(case):
    """Horovod's error cases: every rank raises, and the job goes on."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks")
    name = f"differ.{case}"
    with pytest.raises(hvd.HorovodInternalError):
        if case == "dtype":
            hvd.allreduce(torch.ones(3, dtype=torch.float32 if r else torch.float64), name=name)
        elif case == "op":
            hvd.allreduce(torch.ones(3), name=name, op=hvd.Sum if r else hvd.Max)
        elif case == "trailing":
            hvd.allgather(torch.ones(2, 2 + r), name=name)
        elif case == "root":
            hvd.broadcast(torch.ones(3), root_rank=0 if r else 1, name=name)
        elif r:
            hvd.allreduce(torch.ones(3), name=name)
        else:
            hvd.allgather(torch.ones(3), name=name)
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))


def test_an_argument_refused_on_one_rank_keeps_the_names_aligned():
    """A call refused before submission on some ranks still takes its automatic name there,
    so the next unnamed collectives pair up as they should."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks")
    h = name = None
    if r == 0:
        h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum)  # the other ranks refuse theirs
        name = mpi_ops._handle_map[h].handles[0].name
    else:
        with pytest.raises(ValueError, match="not supported"):
            hvd.allreduce_async(torch.ones(2, dtype=torch.bool), op=hvd.Sum)
    out = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Sum)
    assert torch.equal(out, torch.full((3,), n * (n - 1) / 2))
    name = hvd.broadcast_object(name, 0)
    if r == 0:
        assert torch.equal(hvd.synchronize(h), torch.full((2,), float(n)))
    else:  # the refused tensor, submitted under its name, for rank 0's to complete
        hvd.allreduce(torch.ones(2), name=name, op=hvd.Sum)


def test_a_mismatch_fails_everywhere_and_later_collectives_run():
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(hvd.HorovodInternalError, match="mismatch|differ|count|shape"):
        hvd.allreduce(torch.ones(2 + r))  # unnamed: the same automatic name everywhere
    with pytest.raises(hvd.HorovodInternalError):
        hvd.broadcast(torch.ones(3 + r), 0)
    assert torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))
    assert torch.equal(hvd.broadcast(torch.full((1,), float(r)), 0), torch.zeros(1))


@pytest.mark.parametrize("case", ["allreduce", "grouped", "broadcast", "reducescatter",
                                  "allgather", "alltoall"])
def test_shapes_that_differ_with_the_same_count_fail_on_every_rank(case):
    """Horovod's "Mismatched ... tensor shapes": allreduce, broadcast and reducescatter need one
    shape on every rank, allgather and alltoall the same dimensions after the first. The odd
    ranks send the transposed shape; every rank raises, naming both shapes and their ranks, and
    the job goes on."""
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks")
    mine = (3, 2) if r % 2 else (2, 3)
    name = f"shape.{case}"
    if case == "allreduce":  # a kept name: the same shape twice, then another on odd ranks
        for _ in range(2):
            assert torch.equal(hvd.allreduce(torch.ones(2, 3), name=name, op=hvd.Sum),
                               torch.full((2, 3), float(n)))
    calls = {
        "allreduce": lambda s: hvd.allreduce(torch.ones(s), name=name),
        "grouped": lambda s: hvd.grouped_allreduce([torch.ones(4), torch.ones(s)], name=name),
        "broadcast": lambda s: hvd.broadcast(torch.ones(s), 0, name=name),
        "reducescatter": lambda s: hvd.reducescatter(torch.ones((n * s[0], s[1])), name=name),
        "allgather": lambda s: hvd.allgather(torch.ones((1,) + s), name=name),
        "alltoall": lambda s: hvd.alltoall(torch.ones((n,) + s), name=name),
    }
    lead = {"reducescatter": lambda s: (n * s[0], s[1]), "allgather": lambda s: (1,) + s,
            "alltoall": lambda s: (n,) + s}.get(case, lambda s: s)
    even, odd = (lead(s) for s in ((2, 3), (3, 2)))
    want = (r"disagree on the shape: ranks? 0[0-9, ]* sent \(%s\); ranks? 1[0-9, ]* sent \(%s\)"
            % (", ".join(map(str, even)), ", ".join(map(str, odd))))
    with pytest.raises(hvd.HorovodInternalError, match=want):
        calls[case](mine)
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))


def test_an_allgather_of_rows_that_differ_across_ranks_still_runs():
    """Only the first dimension may differ between ranks: the number of dimensions may not."""
    n, r = hvd.size(), hvd.rank()
    out = hvd.allgather(torch.full((r + 1, 2, 2), float(r)), name="shape.rows")
    assert out.shape == (n * (n + 1) // 2, 2, 2)
    if n > 1:
        with pytest.raises(hvd.HorovodInternalError, match="disagree on the shape"):
            hvd.allgather(torch.ones((1, 4) if r % 2 else (1, 2, 2)), name="shape.ndims")


# ---- optimizer state ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_broadcast_optimizer_state_before_any_gradient(kind):
    """A new optimizer, parameters that never had a gradient, one that needs none: Horovod
    initializes the state with a zero-gradient step, then broadcasts it."""
    torch.manual_seed(9 + hvd.rank())
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    model[1].bias.requires_grad_(False)
    if kind == "sgd":
        base = torch.optim.SGD(model.parameters(), lr=0.1 * (hvd.rank() + 1), momentum=0.9)
    else:
        base = torch.optim.Adam(model.parameters(), lr=0.01 * (hvd.rank() + 1))
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    assert all(p.grad is None for p in model.parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    states = hvd.allgather_object(opt.state_dict())
    assert len(states[0]["state"]) == 3  # every parameter that requires a gradient
    for s in states[1:]:
        assert s["param_groups"] == states[0]["param_groups"]
        for k, v in s["state"].items():
            for name, t in v.items():
                assert torch.equal(torch.as_tensor(t), torch.as_tensor(states[0]["state"][k][name]))
    x = torch.randn(5, 3)
    model(x).sum().backward()
    opt.step()  # and training goes on


def test_broadcast_object_with_the_global_process_set():
    got = hvd.broadcast_object({"r": hvd.rank()}, 0, None, hvd.global_process_set)
    assert got == {"r": 0}


def test_init_with_process_sets():
    """Last: it leaves the job and joins it again, as Horovod's init(process_sets=...)."""
    n = hvd.size()
    hvd.shutdown()
    subset, whole = hvd.ProcessSet([0]), hvd.ProcessSet(range(n))
    hvd.init(process_sets=[subset, whole])
    assert subset.process_set_id == 1 and subset.size() == 1
    assert whole.process_set_id is None  # the global set's ranks: invalidated, as Horovod's
    hvd.init()  # a second call changes nothing
    assert subset.process_set_id == 1
    if hvd.rank() == 0:
        assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=subset),
                           torch.ones(1))
    else:
        with pytest.raises(ValueError, match=f"Rank {hvd.rank()} is not a member"):
            hvd.allreduce(torch.ones(1), process_set=subset)
    assert torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n)))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
