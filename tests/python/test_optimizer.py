"""DistributedOptimizer at np=2 (and 3) over shards of a global batch against one process training on the
whole batch (each rank computes the reference itself), plus join and the misuse errors.

Tolerance: float32 training, 5 SGD-momentum steps: parameters agree within 1e-5 (absolute and
relative); with fp16 compression within 2e-3 (the gradients travel with an 11-bit mantissa)."""
import pytest
import torch
import torch.nn as nn

import ringrun.torch as hvd

hvd.init()  # every rank runs this module's tests in the same order

STEPS = 5
GLOBAL_BATCH = 24


def make_model(seed=0, bn=None):
    torch.manual_seed(seed)
    layers = [nn.Linear(6, 16), nn.ReLU()]
    if bn:
        layers.append(bn(16))
    layers += [nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)]
    return nn.Sequential(*layers)


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(GLOBAL_BATCH, 6, generator=g), torch.randint(0, 3, (GLOBAL_BATCH,),
                                                                     generator=g)


def shard(t):
    n, r = hvd.size(), hvd.rank()
    per = t.shape[0] // n
    return t[r * per:(r + 1) * per]


def reference(passes=1, bn=None):
    model = make_model(bn=bn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for s in range(STEPS):
        x, y = data(s)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def distributed(passes=1, bn=None, **kwargs):
    model = make_model(bn=bn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kwargs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for s in range(STEPS):
        x, y = data(s)
        x, y = shard(x), shard(y)
        opt.zero_grad()
        per = x.shape[0] // passes
        for k in range(passes):
            xs, ys = x[k * per:(k + 1) * per], y[k * per:(k + 1) * per]
            (nn.functional.cross_entropy(model(xs), ys) / passes).backward()
        opt.step()
    return model


def assert_same(a, b, tol):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(p, q, rtol=tol, atol=tol), (name, (p - q).abs().max())


@pytest.mark.parametrize("case", ["plain", "bpps2", "fp16", "bf16", "groups_int", "groups_lists",
                                  "predivide", "small_buckets"])
def test_matches_one_process_on_the_whole_batch(case, monkeypatch):
    kwargs, passes, tol = {}, 1, 1e-5
    if case == "bpps2":
        passes = 2
    elif case == "fp16":
        kwargs["compression"], tol = hvd.Compression.fp16, 2e-3
    elif case == "bf16":
        kwargs["compression"], tol = hvd.Compression.bf16, 2e-2
    elif case == "groups_int":
        kwargs["groups"] = 2
    elif case == "predivide":
        kwargs["gradient_predivide_factor"] = 2.0
    elif case == "small_buckets":
        monkeypatch.setenv("RINGRUN_BUCKET_BYTES", "64")
    if case == "groups_lists":
        model = make_model()
        params = list(model.parameters())
        kwargs["groups"] = [[params[0], params[2]], [params[1], params[3]]]
        # groups name the model's tensors; build the same model again for the run
        dist = make_model()
        opt = torch.optim.SGD(dist.parameters(), lr=0.1, momentum=0.9)
        dp = list(dist.parameters())
        opt = hvd.DistributedOptimizer(opt, named_parameters=dist.named_parameters(),
                                       groups=[[dp[0], dp[2]], [dp[1], dp[3]]])
        for s in range(STEPS):
            x, y = data(s)
            opt.zero_grad()
            nn.functional.cross_entropy(dist(shard(x)), shard(y)).backward()
            opt.step()
    else:
        dist = distributed(passes, **kwargs)
    assert_same(dist, reference(), tol)


def test_sync_batch_norm_in_training_matches_batch_norm():
    dist = distributed(bn=hvd.SyncBatchNorm)
    assert_same(dist, reference(bn=nn.BatchNorm1d), 1e-4)


def test_join_with_uneven_batches():
    """Rank r has 2 + 2r batches; a joined rank contributes zeros, Average divides by size."""
    n, r = hvd.size(), hvd.rank()
    batches = [2 + 2 * q for q in range(n)]
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    for s in range(batches[r]):
        x, y = data(s)
        opt.zero_grad()
        nn.functional.cross_entropy(model(shard(x)), shard(y)).backward()
        opt.step()
    last = hvd.join()
    assert last == n - 1
    # A joined rank stops updating; as in Horovod, the last rank to join holds the model.
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    # Reference: at step s, the ranks that still have data contribute their shard's gradient.
    ref = make_model()
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for s in range(max(batches)):
        x, y = data(s)
        per = GLOBAL_BATCH // n
        grads = None
        for q in range(n):
            if s >= batches[q]:
                continue
            ref.zero_grad()
            nn.functional.cross_entropy(ref(x[q * per:(q + 1) * per]),
                                        y[q * per:(q + 1) * per]).backward()
            g = [p.grad.clone() for p in ref.parameters()]
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for p, g in zip(ref.parameters(), grads):
            p.grad = g / n
        ropt.step()
    assert_same(model, ref, 1e-5)
    everyone = hvd.allgather_object([p.detach() for p in model.parameters()])
    for other in everyone[1:]:
        for a, b in zip(other, everyone[0]):
            assert torch.equal(a, b)


def make_opt(**kwargs):
    model = make_model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), **kwargs)
    return model, opt


def backward(model, s=0):
    x, y = data(s)
    nn.functional.cross_entropy(model(shard(x)), shard(y)).backward()


def test_misuse_two_backward_passes_before_step():
    model, opt = make_opt()
    backward(model)
    with pytest.raises(AssertionError, match="more than backward_passes_per_step times"):
        backward(model)
    opt.step()


def test_misuse_zero_grad_while_pending():
    model, opt = make_opt(backward_passes_per_step=2)
    backward(model)
    with pytest.raises(AssertionError, match="zero_grad\\(\\) was called after loss.backward"):
        opt.zero_grad()
    backward(model, 1)
    opt.step()
    opt.zero_grad()


def test_misuse_double_step():
    model, opt = make_opt()
    backward(model)
    opt.step()
    with pytest.raises(AssertionError, match="step\\(\\) was called twice"):
        opt.step()


def test_synchronize_then_skip_synchronize():
    model, opt = make_opt()
    backward(model)
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    with opt.skip_synchronize():
        opt.step()
    backward(model, 1)
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()


def test_constructor_errors():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="backward_passes_per_step must be > 0"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported"):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="must be unique"):
        hvd.DistributedOptimizer(sgd, named_parameters=[named[0], (named[0][0], named[1][1])])
    with pytest.raises(ValueError, match="were not named"):
        hvd.DistributedOptimizer(sgd, named_parameters=named[:1])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(sgd, named_parameters=[p for _, p in named])


def one_step_on_the_whole_batch(s):
    """make_opt's model after one plain SGD step on batch s, in one process."""
    ref = make_model()
    sgd = torch.optim.SGD(ref.parameters(), lr=0.1)
    x, y = data(s)
    nn.functional.cross_entropy(ref(x), y).backward()
    sgd.step()
    return ref


def test_synchronize_skipped_step_then_a_new_backward_is_reduced():
    """synchronize(), no step (e.g. a gradient norm that was too large), then an ordinary
    backward and step(): that step waits for and uses the new averaged gradients."""
    model, opt = make_opt()
    backward(model)
    opt.synchronize()
    opt.zero_grad()
    backward(model, 1)
    opt.step()
    assert_same(model, one_step_on_the_whole_batch(1), 1e-5)
    opt.zero_grad()  # nothing left pending


def test_step_with_a_closure_uses_averaged_gradients():
    model, opt = make_opt()

    def closure():
        opt.zero_grad()
        x, y = data(2)
        loss = nn.functional.cross_entropy(model(shard(x)), shard(y))
        loss.backward()
        return loss
    loss = opt.step(closure)
    assert loss is not None and loss.requires_grad
    assert_same(model, one_step_on_the_whole_batch(2), 1e-5)


def test_load_state_dict_and_set_backward_passes_per_step_forget_pending_passes():
    model, opt = make_opt(backward_passes_per_step=2)
    saved = opt.state_dict()
    backward(model)
    opt.load_state_dict(saved)  # a rollback, as Horovod's: the pass above is forgotten
    opt.zero_grad()
    opt.set_backward_passes_per_step(1)
    assert opt.backward_passes_per_step == 1
    backward(model)  # at 1 pass per step: every bucket starts
    opt.set_backward_passes_per_step(2)  # waits for them, then counts afresh
    opt.zero_grad()
    backward(model)
    backward(model, 1)
    opt.step()
    with pytest.raises(ValueError, match="must be > 0"):
        opt.set_backward_passes_per_step(0)


def test_broadcast_optimizer_state_keeps_the_wrapped_optimizers_groups():
    """An LR scheduler made on the wrapped optimizer must keep steering the distributed one on
    every rank after broadcast_optimizer_state (Horovod sets values in place)."""
    model = make_model()
    base = torch.optim.SGD(model.parameters(), lr=0.1 * (hvd.rank() + 1), momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(base, step_size=1, gamma=0.5)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    assert opt.param_groups[0] is base.param_groups[0]
    backward(model)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    assert hvd.allgather_object(opt.param_groups[0]["lr"]) == [pytest.approx(0.05)] * hvd.size()


@pytest.mark.parametrize("kind", ["sgd", "sparse_adam"])
def test_sparse_gradients_as_dense(kind):
    """An Embedding(sparse=True): reduced dense (sparse_as_dense=True), handed back sparse, as
    Horovod does; the result matches one process on the whole batch."""
    def make():
        torch.manual_seed(3)
        return nn.Embedding(10, 4, sparse=True)

    def optimizer(m):
        if kind == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.5)
        return torch.optim.SparseAdam(list(m.parameters()), lr=0.1)
    idx = torch.arange(2 * hvd.size()) % 10
    ref = make()
    ropt = optimizer(ref)
    dist = make()
    opt = hvd.DistributedOptimizer(optimizer(dist), named_parameters=dist.named_parameters(),
                                   sparse_as_dense=True)
    for step in range(3):
        ropt.zero_grad()
        (ref(idx) * (step + 1)).sum().div(idx.numel()).backward()
        ropt.step()
        opt.zero_grad()
        mine = idx[2 * hvd.rank():2 * hvd.rank() + 2]
        (dist(mine) * (step + 1)).sum().div(mine.numel()).backward()
        opt.synchronize()
        assert dist.weight.grad.is_sparse
        with opt.skip_synchronize():
            opt.step()
    assert torch.allclose(dist.weight, ref.weight, atol=1e-6)
    # Without sparse_as_dense, as Horovod: indices and values allgathered, the gradient stays
    # sparse (uncoalesced), and the step is the same.
    plain = make()
    popt = hvd.DistributedOptimizer(optimizer(plain), named_parameters=plain.named_parameters())
    ref = make()
    ropt = optimizer(ref)
    for step in range(3):
        ropt.zero_grad()
        (ref(idx) * (step + 1)).sum().div(idx.numel()).backward()
        ropt.step()
        popt.zero_grad()
        mine = idx[2 * hvd.rank():2 * hvd.rank() + 2]
        (plain(mine) * (step + 1)).sum().div(mine.numel()).backward()
        popt.synchronize()
        assert plain.weight.grad.is_sparse
        assert plain.weight.grad._nnz() == idx.numel()  # every rank's rows, not coalesced
        with popt.skip_synchronize():
            popt.step()
    assert torch.allclose(plain.weight, ref.weight, atol=1e-6)
