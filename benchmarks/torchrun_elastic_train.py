"""The elastic example's model and batches (examples/elastic/pytorch_synthetic_elastic.py) in
plain torch.distributed (gloo), for torchrun --max-restarts: the recovery that
benchmarks/elastic_recovery.sh compares with ringrun's elastic reset.

    torchrun --nnodes 4 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint HOST1:PORT \
        --max_restarts 3 --redirects 1 --tee 1 benchmarks/torchrun_elastic_train.py \
        --checkpoint /tmp/ckpt.pt --log-steps --kill-worker 2 --kill-at 23

The same least-squares float64 model, data set, seed, global batch and learning rate as the
example; each step's global batch (the epoch's order shuffled with seed + epoch) is split evenly
over the ranks, whose gradients are summed with all_reduce and divided by the size, so the
parameters follow the example's --reference up to float64 rounding. A commit (every
--batches-per-commit batches and at the end of each epoch) is rank 0 writing model, optimizer,
epoch, batch and generation to --checkpoint (atomically, by rename) and a barrier; every start
(the first, and each restart of torchrun's workers) resumes from that file when it exists.

The generation (0 at the first start, the checkpoint's + 1 at a restart) is the same on every
rank. TORCHELASTIC_RESTART_COUNT is not: an agent whose worker failed counts a restart, an agent
that restarts its healthy worker because another node re-joined the rendezvous does not.
"""
import argparse
import datetime
import os
import random
import signal
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

FEATURES = 8


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--samples", type=int, default=240)
    p.add_argument("--global-batch", type=int, default=12)
    p.add_argument("--batches-per-commit", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--checkpoint", required=True, help="the commit file (rank 0 writes it)")
    p.add_argument("--kill-worker", type=int, default=-1,
                   help="this rank kills itself with SIGKILL at --kill-at, in generation 0 only")
    p.add_argument("--kill-at", type=int, default=23)
    p.add_argument("--log-steps", action="store_true",
                   help="rank 0 prints 'step N size=S gen=G t=T' after each step")
    return p.parse_args()


# The example's data set and model: the same seeds, shapes and calls.
def make_dataset(args):
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.samples, FEATURES, generator=g, dtype=torch.float64)
    w = torch.linspace(-1.0, 1.0, FEATURES, dtype=torch.float64)
    y = (x @ w + 0.3 + 0.01 * torch.randn(args.samples, generator=g, dtype=torch.float64))
    return x, y.unsqueeze(1)


def make_model(args):
    torch.manual_seed(args.seed)
    model = torch.nn.Linear(FEATURES, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    return model, optimizer


def main():
    args = parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.global_batch % size:
        raise SystemExit(f"--global-batch {args.global_batch} is not a multiple of {size}")
    x_all, y_all = make_dataset(args)
    model, optimizer = make_model(args)
    epoch = batch = gen = 0
    if os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        epoch, batch, gen = saved["epoch"], saved["batch"], saved["gen"] + 1
    per_rank = args.global_batch // size
    batches_per_epoch = args.samples // args.global_batch

    def commit():
        if rank == 0:
            tmp = args.checkpoint + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch, "batch": batch, "gen": gen}, tmp)
            os.replace(tmp, args.checkpoint)
        dist.barrier()

    while epoch < args.epochs:
        order = list(range(args.samples))
        random.Random(args.seed + epoch).shuffle(order)
        while batch < batches_per_epoch:
            start = batch * args.global_batch + rank * per_rank
            idx = torch.tensor(order[start:start + per_rank])
            optimizer.zero_grad()
            F.mse_loss(model(x_all[idx]), y_all[idx]).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= size
            optimizer.step()
            batch += 1
            step = epoch * batches_per_epoch + batch
            if args.log_steps and rank == 0:
                print(f"step {step} size={size} gen={gen} t={time.time():.6f}", flush=True)
            if rank == args.kill_worker and gen == 0 and step == args.kill_at:
                print(f"kill step {step} t={time.time():.6f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if batch % args.batches_per_commit == 0 and batch < batches_per_epoch:
                commit()
        epoch += 1
        batch = 0
        commit()
    if rank == 0:
        with torch.no_grad():
            loss = F.mse_loss(model(x_all), y_all).item()
        params = [repr(v) for p in model.parameters() for v in p.detach().flatten().tolist()]
        print(f"final loss={loss!r} params=[{', '.join(params)}]", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
