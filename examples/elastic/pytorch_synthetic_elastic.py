"""Elastic training with Horovod's API (ringrun.torch.elastic): the job goes on when ranks
leave or join, from the last commit.

    ringrun -np 2 /usr/bin/python3 examples/elastic/pytorch_synthetic_elastic.py
    /usr/bin/python3 examples/elastic/pytorch_synthetic_elastic.py --reference
    # 4 ranks on two "hosts"; worker 3 dies at step 23, the job goes on with 2 ranks:
    ringrun -np 4 --min-np 2 -H localhost:2,127.0.0.1:2 \
        /usr/bin/python3 examples/elastic/pytorch_synthetic_elastic.py --kill-worker 3

A least-squares model in float64 on a synthetic data set made from a fixed seed. Each step
takes one global batch of --global-batch samples, split evenly over the ranks by an
ElasticSampler (so the ranks' averaged gradient is the gradient of the whole batch), in the
order Horovod's ElasticSampler gives: the epoch's indices shuffled with seed + epoch. The
learning rate is not scaled with the size, so whatever the number of ranks, and however it
changes, the parameters follow the same path as one process taking the same batches, up to
float64 rounding: --reference is that process (plain torch, no ringrun) and prints the same
final line to compare.

The state (model, optimizer, sampler, epoch, batch) is committed every --batches-per-commit
batches and at the end of each epoch. A failed rank sends the others back to the last commit;
a host change takes effect at the next commit. A reset callback prints the new size.
"""
import argparse
import os
import random
import signal
import time

import torch
import torch.nn.functional as F

import ringrun.torch as hvd

FEATURES = 8


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=240, help="samples in the data set")
    p.add_argument("--global-batch", type=int, default=12,
                   help="samples per step over all ranks (a multiple of the size)")
    p.add_argument("--batches-per-commit", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--kill-worker", type=int, default=-1,
                   help="this worker (RINGRUN_WORKER_ID, its rank at the start) kills itself "
                   "with SIGKILL at --kill-at, to show a reset")
    p.add_argument("--kill-at", type=int, default=23,
                   help="the step (batches since the start, all epochs) of --kill-worker's death")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="seconds each step sleeps after its update (to watch hosts come and go "
                   "while it trains); the parameters do not depend on it")
    p.add_argument("--log-steps", action="store_true",
                   help="rank 0 prints 'step N size=S t=T' after each step (T: time.time()), "
                   "and --kill-worker prints 'kill step N t=T' just before its death")
    p.add_argument("--reference", action="store_true",
                   help="train in this process alone, without ringrun, on the same batches")
    return p.parse_args()


def make_dataset(args):
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, FEATURES, generator=g, dtype=torch.float64)
    w = torch.linspace(-1.0, 1.0, FEATURES, dtype=torch.float64)
    y = (x @ w + 0.3 + 0.01 * torch.randn(args.samples, generator=g, dtype=torch.float64))
    return torch.utils.data.TensorDataset(x, y.unsqueeze(1))


def make_model(args):
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(FEATURES, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return model, optimizer


def final_line(model, dataset):
    x, y = dataset.tensors
    with torch.no_grad():
        loss = F.mse_loss(model(x), y).item()
    params = [repr(v) for p in model.parameters() for v in p.detach().flatten().tolist()]
    return f"final loss={loss!r} params=[{', '.join(params)}]"


def reference(args):
    """One process, the batches in the order that ElasticSampler deals them."""
    dataset = make_dataset(args)
    model, optimizer = make_model(args)
    x_all, y_all = dataset.tensors
    for epoch in range(args.epochs):
        order = list(range(len(dataset)))
        random.Random(args.seed + epoch).shuffle(order)
        for start in range(0, len(order), args.global_batch):
            idx = torch.tensor(order[start:start + args.global_batch])
            optimizer.zero_grad()
            F.mse_loss(model(x_all[idx]), y_all[idx]).backward()
            optimizer.step()
    print(final_line(model, dataset), flush=True)


def main():
    args = parse_args()
    if args.reference:
        return reference(args)
    hvd.init()
    dataset = make_dataset(args)
    model, optimizer = make_model(args)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=args.seed)

    worker = int(os.environ.get("RINGRUN_WORKER_ID", hvd.rank()))
    batches_per_epoch = args.samples // args.global_batch

    def step(state):
        return state.epoch * batches_per_epoch + state.batch

    def log(msg):
        if hvd.rank() == 0:
            print(msg, flush=True)

    @hvd.elastic.run
    def train(state):
        while state.epoch < args.epochs:
            if args.global_batch % hvd.size():
                raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of the "
                                 f"size {hvd.size()}")
            per_rank = args.global_batch // hvd.size()
            loader = torch.utils.data.DataLoader(dataset, batch_size=per_rank,
                                                 sampler=state.sampler)
            for x, y in loader:
                state.optimizer.zero_grad()
                F.mse_loss(state.model(x), y).backward()
                state.optimizer.step()
                state.sampler.record_batch(state.batch, per_rank)
                state.batch += 1
                if args.step_delay > 0:
                    time.sleep(args.step_delay)
                if args.log_steps:
                    log(f"step {step(state)} size={hvd.size()} t={time.time():.6f}")
                if worker == args.kill_worker and step(state) == args.kill_at:
                    if args.log_steps:
                        print(f"kill step {step(state)} t={time.time():.6f}", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            state.commit()
            log(f"epoch {state.epoch} done on {hvd.size()} ranks")

    def on_reset():
        log(f"reset: {hvd.size()} ranks")

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])
    train(state)
    log(final_line(model, dataset))


if __name__ == "__main__":
    main()
