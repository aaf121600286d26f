"""ringrun.torch.elastic on every rank of a real job (one process, or ringrun -np 2): commit,
restore and sync of each State kind, run's loop through failures and host updates (with the
reset replaced by a counter), check_host_updates against a fake membership epoch (at np=2 only
one rank sees the change, and both raise), ElasticSampler's partitions over changing sizes
(size and rank faked, no collectives), and the real reset (shutdown, init: the same ranks join
again) in training that must end where one process ends."""
import copy
import queue
import random

import pytest
import torch
import torch.nn.functional as F

import ringrun
import ringrun.torch as hvd
from ringrun.torch import elastic
from ringrun.torch.elastic import _hosts
from ringrun.torch.elastic import sampler as sampler_module
from ringrun.torch.elastic import state as state_module

hvd.init()  # every rank runs this module's tests in the same order


def needs(n):
    return pytest.mark.skipif(hvd.size() != n, reason=f"needs {n} ranks")


def model_and_optimizer(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optimizer


def train_step(model, optimizer, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    optimizer.zero_grad()
    F.mse_loss(model(x), x[:, :2]).backward()
    optimizer.step()


def snapshot(model, optimizer):
    return copy.deepcopy((model.state_dict(), optimizer.state_dict()["state"]))


def assert_same(a, b):
    (ma, oa), (mb, ob) = a, b
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    assert oa.keys() == ob.keys()
    for k in oa:
        assert all(torch.equal(oa[k][n], ob[k][n]) for n in oa[k])


# ---- names -----------------------------------------------------------------------------------


def test_names_as_horovod():
    for name in ("run", "State", "ObjectState", "TorchState", "ElasticSampler",
                 "HostsUpdatedInterrupt", "HorovodInternalError"):
        assert hasattr(elastic, name), name
    assert hvd.HorovodInternalError is elastic.HorovodInternalError
    assert hvd.HostsUpdatedInterrupt is elastic.HostsUpdatedInterrupt
    assert issubclass(hvd.HostsUpdatedInterrupt, RuntimeError)
    assert hvd.HostsUpdatedInterrupt(True).skip_sync and not hvd.HostsUpdatedInterrupt(False).skip_sync
    assert callable(state_module.get_handler_registry)


# ---- ObjectState -------------------------------------------------------------------------------


def test_object_state_commit_restore():
    state = elastic.ObjectState(epoch=0, history=[])
    state.epoch = 3
    state.history.append("a")
    state.restore()
    assert state.epoch == 0 and state.history == []  # the list changed in place too
    state.epoch = 4
    state.history.append("b")
    state.commit()
    state.epoch, state.history = 9, None
    state.restore()
    assert state.epoch == 4 and state.history == ["b"]
    state.history.append("c")  # the restored list is a copy: the commit stays as it was
    state.restore()
    assert state.history == ["b"]


def test_object_state_horovod_signature():
    state = elastic.ObjectState(hvd.broadcast_object, hvd.rank, batch=1)
    assert state.batch == 1
    state.sync()
    assert state.batch == 1


def test_object_state_sync_takes_rank_0s_live_values():
    state = elastic.ObjectState(value=-1)
    state.value = 100 + hvd.rank()  # not committed: sync broadcasts what is live
    state.sync()
    assert state.value == 100
    state.value = 5
    state.restore()  # sync committed rank 0's value on every rank
    assert state.value == 100


def test_uncopyable_object_kept_by_reference():
    class NoCopy:
        def __deepcopy__(self, memo):
            raise TypeError("no copies")

    thing = NoCopy()
    state = elastic.ObjectState(thing=thing)
    state.commit()
    state.restore()
    assert state.thing is thing


# ---- TorchState --------------------------------------------------------------------------------


def test_torch_state_commit_restore_model_and_optimizer():
    model, optimizer = model_and_optimizer()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = elastic.TorchState(model, optimizer, epoch=0)
    assert state.model is model and state.optimizer is optimizer and state.epoch == 0
    train_step(model, optimizer, 1)
    state.epoch = 1
    state.commit()
    committed = snapshot(model, optimizer)
    train_step(model, optimizer, 2)
    train_step(model, optimizer, 3)
    state.epoch = 2
    assert not torch.equal(model.weight, committed[0]["weight"])
    state.restore()
    assert_same(snapshot(model, optimizer), committed)
    assert state.epoch == 1
    # Training goes on from the commit as if the two steps had not been taken.
    train_step(model, optimizer, 2)
    model2, optimizer2 = model_and_optimizer()
    train_step(model2, optimizer2, 1)
    train_step(model2, optimizer2, 2)
    assert torch.equal(model.weight, model2.weight)


def test_restore_after_a_failed_reduction_in_flight():
    """A HorovodInternalError while a DistributedOptimizer's buckets are in flight: restore
    (load_state_dict) forgets them instead of raising their failure again."""
    model, optimizer = model_and_optimizer()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = elastic.TorchState(model, optimizer)
    before = snapshot(model, optimizer)

    def failed():
        raise hvd.HorovodInternalError("peer gone")
    optimizer._buckets[0].gathered = {model.weight: failed}
    optimizer._allreduce_delay[model.weight] = 0
    state.restore()
    assert_same(snapshot(model, optimizer), before)
    assert not optimizer._pending()
    train_step(model, optimizer, 1)  # usable again
    # Elsewhere the failure is raised, once every bucket has been waited for.
    waited = []
    optimizer._buckets[0].gathered = {model.weight: failed, model.bias: lambda: waited.append(1)}
    with pytest.raises(hvd.HorovodInternalError, match="peer gone"):
        optimizer.set_backward_passes_per_step(1)
    assert waited == [1] and not optimizer._pending()


def test_torch_state_new_model_is_committed():
    model, optimizer = model_and_optimizer()
    state = elastic.TorchState(model, optimizer)
    other, _ = model_and_optimizer(seed=5)
    state.model = other
    with torch.no_grad():
        other.weight.add_(1.0)
    state.restore()
    torch.manual_seed(5)
    assert torch.equal(other.weight, torch.nn.Linear(4, 2, dtype=torch.float64).weight)


def test_torch_state_lr_scheduler():
    model, optimizer = model_and_optimizer()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    state = elastic.TorchState(model, optimizer, scheduler=scheduler)
    optimizer.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    state.restore()
    assert scheduler.last_epoch == 0
    state.sync()
    assert scheduler.last_epoch == 0


def test_torch_state_sync_from_rank_0():
    model, optimizer = model_and_optimizer(seed=10 + hvd.rank())  # different on every rank
    if hvd.rank() == 0:
        train_step(model, optimizer, 1)  # rank 0 alone has momentum (a local step)
    state = elastic.TorchState(model, optimizer, step=10 * hvd.rank())
    state.sync()
    mine = snapshot(model, optimizer)
    everyone = hvd.allgather_object(mine)
    for other in everyone:
        assert_same(other, everyone[0])
    assert state.step == 0
    state.restore()  # sync committed it
    assert_same(snapshot(model, optimizer), mine)


def test_handler_registry_replaceable():
    calls = []

    class Counter:
        n = 0

    class CounterHandler(state_module.StateHandler):
        def save(self):
            calls.append("save")
            self.saved = self.value.n

        def restore(self):
            self.value.n = self.saved

        def sync(self):
            calls.append("sync")

    old = state_module.get_handler_registry()
    state_module.set_handler_registry(old + [(Counter, CounterHandler)])
    try:
        counter = Counter()
        state = elastic.TorchState(counter=counter)
        counter.n = 3
        state.commit()
        counter.n = 7
        state.restore()
        assert counter.n == 3
        state.sync()
        assert "sync" in calls
    finally:
        state_module.set_handler_registry(old)


# ---- check_host_updates ------------------------------------------------------------------------


@pytest.fixture
def epoch(monkeypatch):
    """A fake ringrun.membership_epoch(): set value[rank] to what that rank reads."""
    value = {}
    monkeypatch.setattr(ringrun, "membership_epoch", lambda: value.get(hvd.rank(), 0),
                        raising=False)
    return value


def test_membership_epoch(monkeypatch):
    # A fixed host set: the launcher never raises the epoch.
    assert _hosts.membership_epoch() == 0
    monkeypatch.setattr(ringrun, "membership_epoch", lambda: 4)
    assert _hosts.membership_epoch() == 4


def test_check_host_updates(epoch):
    state = elastic.ObjectState(x=0)
    state.check_host_updates()  # nothing changed
    epoch[0] = 1
    with pytest.raises(hvd.HostsUpdatedInterrupt) as info:
        state.check_host_updates()
    assert info.value.skip_sync
    state.check_host_updates()  # acted on: no second interrupt for the same change
    epoch[0] = 3
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.commit()
    assert state._last_epoch == 3


def test_host_messages_as_horovods_tests_poll_them(epoch):
    """Horovod's elastic test programs wait on rank 0 with `state._host_messages.empty()`."""
    state = elastic.ObjectState(x=0)
    assert state._host_messages.empty() and state._host_messages.qsize() == 0
    with pytest.raises(queue.Empty):
        state._host_messages.get_nowait()
    epoch[hvd.rank()] = 2
    assert not state._host_messages.empty() and state._host_messages.qsize() == 1
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.check_host_updates()
    assert state._host_messages.empty()  # acted on


@needs(2)
def test_check_host_updates_when_only_one_rank_saw_it(epoch):
    """horovod#3494's split cannot happen: the rank that did not see the change raises too."""
    state = elastic.ObjectState(x=0)
    epoch[1] = 1  # only rank 1 (not the broadcast root) sees it
    with pytest.raises(hvd.HostsUpdatedInterrupt):
        state.check_host_updates()
    epoch[0] = 1
    state.check_host_updates()  # rank 0 sees it later: already acted on
    assert state._last_epoch == 1


# ---- run -------------------------------------------------------------------------------------


class Recorder:
    """A reset that records, in place of shutdown and init."""

    def __init__(self, monkeypatch, on_reset=None):
        self.resets = 0
        self.on_reset = on_reset
        monkeypatch.setattr(elastic, "_reset", self)
        monkeypatch.setenv("HOROVOD_ELASTIC", "1")

    def __call__(self):
        self.resets += 1
        if self.on_reset:
            self.on_reset()


class CountingState(elastic.ObjectState):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.syncs = 0

    def sync(self):
        self.syncs += 1
        super().sync()


def test_run_restores_and_resets_after_a_failure(monkeypatch):
    recorder = Recorder(monkeypatch)
    state = CountingState(step=0, log=[])
    callbacks = []
    state.register_reset_callbacks([lambda: callbacks.append(state.step)])
    failed, ran = [], []

    @elastic.run
    def train(state, steps, failing_step):
        while state.step < steps:
            ran.append(state.step)
            state.log.append(state.step)
            state.step += 1
            if state.step % 2 == 0:
                state.commit()
            if state.step == failing_step and not failed:
                failed.append(True)
                raise hvd.HorovodInternalError("a rank failed")
        return "done"

    assert train(state, 6, failing_step=5) == "done"
    assert recorder.resets == 1 and callbacks == [4]  # restored to the step-4 commit first
    assert ran == [0, 1, 2, 3, 4, 4, 5]  # only step 4 (since the commit) ran again
    assert state.log == [0, 1, 2, 3, 4, 5]  # the log of step 4's first run was rolled back
    assert state.syncs == 2  # at the start, and after the restore


def test_run_host_update_skips_the_sync(monkeypatch, epoch):
    recorder = Recorder(monkeypatch)
    state = CountingState(step=0)

    @elastic.run
    def train(state):
        while state.step < 4:
            state.step += 1
            if state.step == 2:
                epoch[hvd.size() - 1] = 1  # the last rank sees the launcher's change
            state.commit()

    train(state)
    assert recorder.resets == 1 and state.step == 4
    assert state.syncs == 1  # no rank needed one after the interrupt
    assert state._last_epoch == 1


def test_run_interrupt_with_sync(monkeypatch):
    recorder = Recorder(monkeypatch)
    state = CountingState(step=0)

    @elastic.run
    def train(state):
        state.step += 1
        if state.step == 1:
            raise hvd.HostsUpdatedInterrupt(skip_sync=False)

    train(state)
    assert recorder.resets == 1 and state.syncs == 2 and state.step == 2


def test_run_new_rank_forces_the_sync(monkeypatch):
    """A rank that enters run for the first time while the others come back from an interrupt
    with skip_sync: every rank syncs (horovod#3494's other half)."""
    Recorder(monkeypatch)
    state = CountingState(step=0)
    state._agree(skip_sync=False)  # this state has been in a generation before
    if hvd.rank() == hvd.size() - 1:
        state = CountingState(step=0)  # the last rank is new
    assert state._agree(skip_sync=True)


def test_run_epoch_seen_after_leaving_is_not_lost(monkeypatch, epoch):
    """A change the launcher makes while the ranks re-form (after they left the generation) is
    acted on at the next check, not absorbed by the reset."""
    state = CountingState(step=0)
    Recorder(monkeypatch, on_reset=lambda: epoch.update({r: 2 for r in range(hvd.size())}))
    seen = []

    @elastic.run
    def train(state):
        seen.append(state._last_epoch)
        if len(seen) == 1:
            epoch.update({r: 1 for r in range(hvd.size())})
            state.check_host_updates()
        if len(seen) == 2:
            state.check_host_updates()  # 2 > 1: one more reset
        return len(seen)

    assert train(state) == 3
    assert seen == [0, 1, 2]


def test_run_in_a_fixed_job_does_not_reset(monkeypatch):
    recorder = Recorder(monkeypatch)
    monkeypatch.delenv("HOROVOD_ELASTIC")
    monkeypatch.setenv("RINGRUN_RANK", str(hvd.rank()))
    state = CountingState(step=0)

    @elastic.run
    def train(state):
        raise hvd.HorovodInternalError("a rank failed")

    with pytest.raises(hvd.HorovodInternalError) as info:
        train(state)
    assert recorder.resets == 0
    assert "cannot re-form" in " ".join(info.value.__notes__)


def test_reset_callback_runs_before_the_sync(monkeypatch):
    Recorder(monkeypatch)
    order = []

    class Ordered(CountingState):
        def sync(self):
            order.append("sync")
            super().sync()

    state = Ordered(step=0)
    state.register_reset_callbacks([lambda: order.append("callback")])

    @elastic.run
    def train(state):
        if not state.step:
            state.step = 1
            raise hvd.HostsUpdatedInterrupt(skip_sync=False)

    train(state)
    assert order == ["sync", "callback", "sync"]


# ---- ElasticSampler -----------------------------------------------------------------------------


class FakeJob:
    """size() and rank() as ElasticSampler reads them, for one simulated rank at a time."""

    def __init__(self, monkeypatch):
        self.size, self.rank = 1, 0
        monkeypatch.setattr(sampler_module.mpi_ops, "size", lambda: self.size)
        monkeypatch.setattr(sampler_module.mpi_ops, "rank", lambda: self.rank)

    def samplers(self, size, states, dataset, **kwargs):
        """One sampler per rank of a job of `size`, each loaded with the state states[rank]
        (or a new one)."""
        out = []
        self.size = size
        for r in range(size):
            self.rank = r
            s = sampler_module.ElasticSampler(dataset, **kwargs)
            if states is not None:
                s.load_state_dict(copy.deepcopy(states))
            out.append(s)
        return out


def horovod_order(n, seed, epoch):
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    return order


def test_sampler_partition_is_horovods(monkeypatch):
    job = FakeJob(monkeypatch)
    dataset = list(range(23))
    samplers = job.samplers(3, None, dataset, seed=4)
    shares = [list(iter(s)) for s in samplers]
    order = horovod_order(23, 4, 0)
    padded = order + order[:1]  # 24 = 3 * 8
    assert shares == [padded[r::3] for r in range(3)]
    assert all(len(s) == 8 for s in samplers)
    unshuffled = job.samplers(2, None, list(range(5)), shuffle=False)
    assert [list(iter(s)) for s in unshuffled] == [[0, 2, 4], [1, 3, 0]]


def test_sampler_repartitions_what_is_left_over_a_new_size(monkeypatch):
    job = FakeJob(monkeypatch)
    dataset = list(range(60))
    order = horovod_order(60, 0, 0)
    seen = []
    # 2 ranks take 3 batches of 4 each (24 samples), then the job goes on with 3 ranks.
    samplers = job.samplers(2, None, dataset)
    batches = [list(iter(s)) for s in samplers]
    for b in range(3):
        for r, s in enumerate(samplers):
            seen += batches[r][4 * b:4 * b + 4]
            s.record_batch(b, 4)
    assert sorted(seen) == sorted(order[:24])  # one batch of every rank: a stretch of order
    committed = samplers[0].state_dict()
    assert committed == dict(epoch=0, processed_num=24, processed_indices=set())
    samplers = job.samplers(3, committed, dataset)
    rest = [list(iter(s)) for s in samplers]
    assert sorted(i for share in rest for i in share) == sorted(order[24:])
    assert not set(seen) & {i for share in rest for i in share}
    # ... and with 1 rank after 2 batches of 4 on each of the 3.
    for s in samplers:
        s.record_batch(0, 4)
        s.record_batch(1, 4)
    samplers = job.samplers(1, samplers[0].state_dict(), dataset)
    assert list(iter(samplers[0])) == order[48:]


def test_sampler_record_indices_union_and_prefix(monkeypatch):
    job = FakeJob(monkeypatch)
    dataset = list(range(10))
    order = horovod_order(10, 0, 0)
    a, b = job.samplers(2, None, dataset)
    a.record_indices([order[0], order[5]])
    b.record_indices([order[1]])
    parts = [a._gathered(), b._gathered()]
    for s in (a, b):
        merged = s._merge(parts)
    # order[0] and order[1] make a prefix; order[5] stays an extra index.
    assert merged == dict(epoch=0, processed_num=2, processed_indices={order[5]})
    assert a.processed_indices == {order[0], order[1], order[5]} and a.processed_num == 2
    (c,) = job.samplers(1, merged, dataset)
    assert list(iter(c)) == [i for i in order[2:] if i != order[5]]
    # Batches counted after extra indices: the counted stretch skips them.
    c.record_batch(0, 4)  # order[2], order[3], order[4], order[6]
    assert c.state_dict() == dict(epoch=0, processed_num=7, processed_indices=set())


def test_sampler_loads_horovods_state_dicts(monkeypatch):
    job = FakeJob(monkeypatch)
    dataset = list(range(8))
    order = horovod_order(8, 0, 3)
    (s,) = job.samplers(1, dict(epoch=3, processed_num=5), dataset)
    assert list(iter(s)) == order[5:]
    (s,) = job.samplers(1, dict(epoch=3, processed_indices={order[0], order[7]}), dataset)
    assert list(iter(s)) == order[1:7]
    assert s.state_dict() == dict(epoch=3, processed_num=1, processed_indices={order[7]})


def test_sampler_set_epoch(monkeypatch):
    job = FakeJob(monkeypatch)
    (s,) = job.samplers(1, None, list(range(12)), seed=2)
    s.record_batch(0, 6)
    s.set_epoch(1)
    assert s.state_dict() == dict(epoch=1, processed_num=0, processed_indices=set())
    assert list(iter(s)) == horovod_order(12, 2, 1)


def test_sampler_whole_epoch_over_changing_sizes(monkeypatch):
    """Each index exactly once in an epoch processed by 2, then 3, then 1, then 4 ranks, a
    reset after every two global batches of 12."""
    job = FakeJob(monkeypatch)
    dataset = list(range(96))
    state, done = None, []
    for size in (2, 3, 1, 4):
        samplers = job.samplers(size, state, dataset)
        shares = [list(iter(s)) for s in samplers]
        per_rank = 12 // size
        for b in range(2):
            for r, s in enumerate(samplers):
                done += shares[r][b * per_rank:(b + 1) * per_rank]
                s.record_batch(b, per_rank)
        state = samplers[0].state_dict()
    assert sorted(done) == list(range(96))
    assert state["processed_num"] == 96


def test_sampler_state_handler_commits_the_union():
    """On the real job: each rank records other indices; the commit keeps all of them."""
    dataset = list(range(20))
    sampler = elastic.ElasticSampler(dataset, shuffle=False)
    state = elastic.TorchState(sampler=sampler)
    sampler.record_indices([hvd.rank()])
    state.commit()
    sampler.record_indices([19])  # not committed
    state.restore()
    assert sampler.processed_indices == set(range(hvd.size()))
    assert sorted(i for i in sampler.remaining_indices) == list(range(hvd.size(), 20))
    state.sync()
    assert sampler.state_dict()["processed_num"] == hvd.size()


# ---- a real reset --------------------------------------------------------------------------------


def load_example():
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "elastic",
                        "pytorch_synthetic_elastic.py")
    spec = importlib.util.spec_from_file_location("pytorch_synthetic_elastic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def can_init_again():
    """shutdown() then init() joins again: a process without a launcher (a job of one), or
    ringrun's ranks, which join the job again through its service."""
    import os
    return "RINGRUN_RANK" not in os.environ or "RINGRUN_JOB_SERVICE" in os.environ


@pytest.mark.skipif(not can_init_again(), reason="needs shutdown() and init() to join again")
def test_real_resets_redo_only_the_steps_since_the_commit(monkeypatch, capsys):
    """The example's model in elastic.run with the real reset (shutdown, init): a
    HorovodInternalError at step 13 (last commit at step 10; with several ranks, a real one
    from a collective whose shapes differ) makes steps 11-13 run again; a
    host change that the last rank alone sees at step 27 interrupts every rank at the step-30
    commit and redoes nothing. The final parameters are those of one process taking the same
    batches (bit for bit with one rank, to 1e-12 with more)."""
    example = load_example()
    monkeypatch.setattr("sys.argv", ["example", "--epochs", "2"])
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    args = example.parse_args()
    example.reference(args)
    want = capsys.readouterr().out.strip()

    dataset = example.make_dataset(args)
    model, optimizer = example.make_model(args)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)
    steps, failed, resets = [], [], []
    last = hvd.size() - 1
    monkeypatch.setattr(ringrun, "membership_epoch", raising=False,
                        value=lambda: int(hvd.rank() == last and bool(failed) and steps[-1] >= 27))

    @elastic.run
    def train(state):
        per_rank = args.global_batch // hvd.size()
        while state.epoch < args.epochs:
            loader = torch.utils.data.DataLoader(dataset, batch_size=per_rank,
                                                 sampler=state.sampler)
            for x, y in loader:
                state.optimizer.zero_grad()
                F.mse_loss(state.model(x), y).backward()
                state.optimizer.step()
                state.sampler.record_batch(state.batch, per_rank)
                state.batch += 1
                state.step += 1
                steps.append(state.step)
                if state.step == 13 and not failed:
                    failed.append(True)
                    if hvd.size() == 1:
                        raise hvd.HorovodInternalError("simulated")
                    # A real failure: the ranks disagree on a shape, and every rank raises.
                    hvd.allreduce(torch.zeros(1 + hvd.rank()), name="test_elastic.mismatch")
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            state.epoch, state.batch = state.epoch + 1, 0
            state.sampler.set_epoch(state.epoch)
            state.commit()

    state = elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, step=0)
    state.register_reset_callbacks([lambda: resets.append((hvd.is_initialized(), hvd.size()))])
    train(state)
    assert resets == [(True, last + 1)] * 2
    assert steps == list(range(1, 14)) + list(range(11, 41))
    got = example.final_line(model, dataset)
    if hvd.size() == 1:
        assert got == want
    else:
        def numbers(line):
            loss, params = line.split(" params=")
            return [float(loss.split("=")[1])] + [float(v) for v in params.strip("[]").split(",")]
        assert max(abs(a - b) for a, b in zip(numbers(got), numbers(want))) < 1e-12
