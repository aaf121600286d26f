"""ringrun.torch with CUDA tensors (run by scripts/gpu-check.sh under ringrun at np=1 and np=2,
the ranks sharing the machine's GPUs). Every collective on device tensors, with values checked,
once on the default stream and once on a non-default stream: inputs are produced on the
caller's current stream after a delay (a collective that did not follow that stream would read
them too early) and results are read on that stream with no device-wide synchronization. Then
DistributedOptimizer on a CUDA model (after broadcast_parameters and broadcast_optimizer_state)
against one CPU process trained on the whole batch: plain, and with fp16 compression and a
gradient_predivide_factor. Scaled allreduce and reducescatter against a model of Horovod's GPU
arithmetic, exactly.
Exit 0 on success, 1 on a wrong value, 77 when this torch has no CUDA."""
import sys

import torch

if not torch.cuda.is_available():
    print("torch has no CUDA here (Debian's python3-torch is CPU-only): SKIP")
    sys.exit(77)

import ringrun.torch as hvd  # noqa: E402 - after the skip: no job is needed to skip

hvd.init()
n, r = hvd.size(), hvd.rank()
dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
torch.cuda.set_device(dev)
assert hvd.nccl_built(), "this libringrun has no NCCL backend"
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INTS = (torch.uint8, torch.int8, torch.int32, torch.int64)
failures = []
checked = [0]


def produced(fill, shape, dtype):
    """A tensor filled on the current stream after ~10 ms of device work on it."""
    x = torch.empty(shape, dtype=dtype, device=dev)
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(20_000_000)
    return x.fill_(fill)


def same(what, got, want, tol=0.0):
    """got (device) against want (a number or CPU tensor), read on the current stream."""
    checked[0] += 1
    g = got.detach().cpu().to(torch.float64)  # a copy ordered on the current stream
    w = torch.as_tensor(want, dtype=torch.float64)
    try:
        ok = torch.allclose(g, w.expand_as(g), rtol=tol, atol=tol)
    except RuntimeError:  # shapes that do not match
        ok = False
    if not ok:
        failures.append(f"{what}: got {g.flatten()[:6].tolist()} {tuple(g.shape)}, "
                        f"want {w.flatten()[:6].tolist()} {tuple(w.shape)}")


def tol(dtype):
    return {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)


def collectives(where):
    tri = n * (n + 1) / 2
    for dtype in FLOATS + INTS:
        d, t = f"{where} {dtype}", tol(dtype)
        x = produced(r + 1, (1 << 16,), dtype)
        same(f"{d} allreduce Sum", hvd.allreduce(x, op=hvd.Sum), tri, t)
        same(f"{d} allreduce Max", hvd.allreduce(x, op=hvd.Max), n, t)
        same(f"{d} allreduce Min", hvd.allreduce(x, op=hvd.Min), 1, t)
        prod = 1
        for q in range(n):
            prod *= q + 1
        same(f"{d} allreduce Product", hvd.allreduce(x, op=hvd.Product), prod, t)
        avg = (n + 1) / 2 if dtype.is_floating_point else (n * (n + 1) // 2) // n
        same(f"{d} allreduce Average", hvd.allreduce(x, op=hvd.Average), avg, t)
        if dtype.is_floating_point:
            same(f"{d} allreduce Sum pre/postscale",
                 hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0),
                 2 * tri, t)
            same(f"{d} allreduce Average prescale",
                 hvd.allreduce(x, op=hvd.Average, prescale_factor=2.0), n + 1, t)
        y = produced(r + 1, (1000,), dtype)
        h = hvd.allreduce_async_(y, op=hvd.Sum, name=f"{where}.inplace.{dtype}")
        while not hvd.poll(h):
            pass
        out = hvd.synchronize(h)
        assert out is y
        same(f"{d} allreduce_async_", y, tri, t)

        # allgather: rank q gives q + 1 rows of 3 valued q; and equal blocks.
        g = hvd.allgather(produced(r, (r + 1, 3), dtype))
        same(f"{d} allgather ragged", g,
             torch.tensor([[q] * 3 for q in range(n) for _ in range(q + 1)]), t)
        g = hvd.allgather(produced(r, (2, 5), dtype))
        same(f"{d} allgather equal", g,
             torch.tensor([[q] * 5 for q in range(n) for _ in (0, 1)]), t)

        b = hvd.broadcast(produced(r, (4096,), dtype), root_rank=n - 1)
        same(f"{d} broadcast", b, n - 1, t)
        b = produced(r + 5, (33, 2), dtype)
        hvd.broadcast_(b, root_rank=0)
        same(f"{d} broadcast_", b, 5, t)
        b = hvd.synchronize(hvd.broadcast_async(produced(r, (7,), dtype), root_rank=n - 1))
        same(f"{d} broadcast_async", b, n - 1, t)

        # alltoall with splits: rank j gets j + 1 rows valued r + 10 j from rank r.
        send = torch.cat([produced(r + 10 * j, (j + 1, 2), dtype) for j in range(n)])
        got, splits = hvd.alltoall(send, splits=[j + 1 for j in range(n)])
        same(f"{d} alltoall splits", got,
             torch.tensor([[q + 10 * r] * 2 for q in range(n) for _ in range(r + 1)]), t)
        assert splits.tolist() == [r + 1] * n, splits
        got = hvd.alltoall(produced(r, (2 * n, 3), dtype))
        same(f"{d} alltoall equal", got,
             torch.tensor([[q] * 3 for q in range(n) for _ in (0, 1)]), t)

        rs = hvd.reducescatter(produced(r + 1, (2 * n, 3), dtype), op=hvd.Sum)
        same(f"{d} reducescatter even", rs, torch.full((2, 3), tri), t)
        rs = hvd.reducescatter(produced(r + 1, (2 * n + 1, 3), dtype), op=hvd.Sum)
        same(f"{d} reducescatter uneven", rs, torch.full((2 + (1 if r == 0 else 0), 3), tri), t)

    # int16: NCCL has no 16-bit integer, so reductions are refused by name (as in Horovod);
    # the collectives that only copy move it.
    x = produced(r - 3, (5,), torch.int16)
    for op in (hvd.Sum, hvd.Average):
        checked[0] += 1
        try:
            hvd.allreduce(x, op=op, name=f"{where}.int16.{op}")
            failures.append(f"{where} int16 allreduce {op} on CUDA was not refused")
        except hvd.HorovodInternalError as e:
            if "int16" not in str(e):
                failures.append(f"{where} int16 refusal does not name int16: {e}")
    same(f"{where} int16 broadcast", hvd.broadcast(x, root_rank=n - 1), n - 4)
    same(f"{where} int16 allgather", hvd.allgather(x),
         torch.tensor([q - 3 for q in range(n) for _ in range(5)]))

    xs = [produced(r + 1, (5,), torch.float32), produced(r + 1, (3,), torch.float16),
          produced(r + 1, (4,), torch.int32), produced(r + 1, (70000,), torch.float32)]
    for i, o in enumerate(hvd.grouped_allreduce(xs, op=hvd.Sum, name=f"{where}.group")):
        same(f"{where} grouped_allreduce {i}", o, tri, tol(o.dtype))
    hvd.grouped_allreduce_(xs[:2] + xs[3:], op=hvd.Average)
    for i, o in enumerate(xs[:2] + xs[3:]):
        same(f"{where} grouped_allreduce_ {i}", o, (n + 1) / 2, tol(o.dtype))

    a = produced(1.0, (4,), torch.float32).requires_grad_()
    hvd.allreduce(a, op=hvd.Sum).sum().backward()
    same(f"{where} allreduce autograd", a.grad, n)
    a = produced(1.0, (r + 1, 2), torch.float32).requires_grad_()
    hvd.allgather(a).sum().backward()
    same(f"{where} allgather autograd", a.grad, 1.0)  # averaged, as Horovod's

    # one group per device: host and device tensors in one grouped allreduce
    mixed = hvd.grouped_allreduce([produced(r + 1, (5,), torch.float32),
                                   torch.full((3,), float(r + 1))], op=hvd.Sum)
    same(f"{where} grouped_allreduce cpu+cuda (cuda)", mixed[0], tri)
    same(f"{where} grouped_allreduce cpu+cuda (cpu)", mixed[1], tri)

    # SyncBatchNorm on the device against BatchNorm2d on the whole batch (CPU)
    torch.manual_seed(5)
    whole = torch.randn(4 * n, 3, 4, 4)
    sbn, bn = hvd.SyncBatchNorm(3).to(dev), torch.nn.BatchNorm2d(3)
    mine = whole[4 * r:4 * (r + 1)].to(dev)
    same(f"{where} SyncBatchNorm forward", sbn(mine), bn(whole)[4 * r:4 * (r + 1)].detach(), 1e-4)
    same(f"{where} SyncBatchNorm running_mean", sbn.running_mean, bn.running_mean, 1e-5)
    hvd.barrier()


def train(compression, predivide):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ref.load_state_dict(model.state_dict())
    model.to(dev)
    with torch.no_grad():  # broadcast_parameters must undo this on every rank but the root
        for p in model.parameters():
            p.add_(r)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   compression=compression, gradient_predivide_factor=predivide)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(8 * n, 32, generator=g)
        opt.zero_grad()
        model(x[8 * r:8 * (r + 1)].to(dev)).pow(2).mean().backward()
        opt.step()
        ropt.zero_grad()
        ref(x).pow(2).mean().backward()
        ropt.step()
    what = f"DistributedOptimizer {compression.__name__} predivide={predivide}"
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        same(f"{what} {name}", p, q.detach(),
             1e-5 if compression is hvd.Compression.none else 2e-3)


def optimizer_state_stays_on_each_ranks_device():
    """Adam's moments on CUDA, broadcast from rank 0: they arrive on each rank's own device."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2).to(dev)
    # capturable: "step" lives on the device too, and Adam refuses a host one
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1), capturable=True)
    model(torch.ones(2, 8, device=dev)).sum().backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    model(torch.ones(2, 8, device=dev)).sum().backward()
    checked[0] += 1
    try:
        opt.step()
    except Exception as e:  # noqa: B902 - reported with the other failures
        failures.append(f"capturable Adam step after broadcast_optimizer_state: {e}")
    for p in model.parameters():
        for name in ("exp_avg", "exp_avg_sq"):
            checked[0] += 1
            if opt.state[p][name].device != p.device:
                failures.append(f"broadcast_optimizer_state: {name} on "
                                f"{opt.state[p][name].device}, its parameter on {p.device}")
    checked[0] += 1
    if opt.param_groups[0]["lr"] != 0.01:
        failures.append(f"broadcast_optimizer_state: lr {opt.param_groups[0]['lr']}, want 0.01")


def inputs_of(q, dtype, shape):
    """Rank q's input to the scaled collectives: values with many distinct low bits."""
    k = torch.arange(shape[0] * shape[1], dtype=torch.float64).reshape(shape)
    return ((k % 97) * 0.37 + q * 1.3 + 0.011 * k).to(dtype)


def scaled_as_horovod(where):
    """Allreduce and reducescatter with factors against Horovod's GPU arithmetic: each factor
    rounded to the tensor's dtype and applied once, the prescale before a Sum and the postscale
    (divided by size() for Average) after it, each product rounded once. Exact at np <= 2, where
    NCCL's sum of two values is one rounding whatever its order."""
    if n > 2:
        return

    def rd(x, dtype):
        return x.to(dtype).to(torch.float64)

    for dtype in FLOATS:
        shape = (4 * n + 1, 9)  # uneven shares for reducescatter
        for op in (hvd.Sum, hvd.Average):
            pre, post = 0.1, 3.3
            post_n = post / n if op == hvd.Average else post
            scaled = [rd(inputs_of(q, dtype, shape).double() * float(rd(torch.tensor(pre),
                      dtype)), dtype) for q in range(n)]
            total = rd(sum(scaled), dtype)
            want = rd(total * float(rd(torch.tensor(post_n), dtype)), dtype)
            x = inputs_of(r, dtype, shape).to(dev)
            d = f"{where} {dtype} op {op}"
            same(f"{d} allreduce scaled as Horovod",
                 hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post), want)
            rows, rem = divmod(shape[0], n)
            first = r * rows + min(r, rem)
            mine = want[first:first + rows + (1 if r < rem else 0)]
            same(f"{d} reducescatter scaled as Horovod",
                 hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post), mine)


side = torch.cuda.Stream(device=dev)
scaled_as_horovod("default stream")
optimizer_state_stays_on_each_ranks_device()
collectives("default stream")
with torch.cuda.stream(side):
    collectives("side stream")
    train(hvd.Compression.none, 1.0)
    train(hvd.Compression.fp16, 2.0)
train(hvd.Compression.fp16, 2.0)
if failures:
    print("\n".join(failures))
    print(f"rank {r}: {len(failures)} of {checked[0]} CUDA checks failed")
    sys.exit(1)
print(f"rank {r}: ringrun.torch CUDA checks passed ({checked[0]} checks, np={n})")
