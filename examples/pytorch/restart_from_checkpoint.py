"""Checkpoint to disk, and go on from the last checkpoint when ringrun --max-restarts restarts the
job: the pattern for programs that are not elastic.

    ringrun --max-restarts 3 -np 2 /usr/bin/python3 examples/pytorch/restart_from_checkpoint.py \
        --checkpoint /tmp/ckpt.pt [--steps 60] [--every 10] [--fail-at 25]

A least-squares model in float64 on data made from a fixed seed, trained data parallel with
ringrun.torch (Horovod's API). Rank 0 writes a checkpoint (model, optimizer, next step) every
--every steps, atomically: a rank killed mid-write leaves the previous checkpoint whole. Every
attempt starts by loading the checkpoint on rank 0, if there is one, and broadcasting it, so that
all ranks go on from the same step; only the steps since the last checkpoint run again.

RINGRUN_RESTART_COUNT (or torchrun's TORCHELASTIC_RESTART_COUNT) says which attempt this is.
--fail-at S makes rank 1 exit 1 at step S in the first attempt only, to show a restart.
Rank 0 ends by printing the final loss, the same with or without restarts.
"""
import argparse
import os
import sys

import torch

import ringrun.torch as hvd


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="the checkpoint file (rank 0 writes it)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    p.add_argument("--fail-at", type=int, default=-1,
                   help="rank 1 exits 1 at this step in the first attempt (a demonstration)")
    return p.parse_args()


def batch(step, rank, size, features=8, rows=32):
    """The rank's shard of step `step`: the same numbers whatever the attempt."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(rows, features, generator=g, dtype=torch.float64)
    w_true = torch.arange(1, features + 1, dtype=torch.float64)
    return x, x @ w_true + 0.5


def save(path, model, optimizer, next_step):
    tmp = f"{path}.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "next_step": next_step}, tmp)
    os.replace(tmp, path)  # atomic: readers see the old checkpoint or the new one


def main():
    args = parse_args()
    hvd.init()
    attempt = int(os.environ.get("RINGRUN_RESTART_COUNT",
                                 os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1, dtype=torch.float64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # Wrapped before the state is loaded: the wrapper is a new optimizer over the same parameters,
    # and state loaded into the one it wraps would not reach it.
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    start = 0
    if hvd.rank() == 0 and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["next_step"]
    # Rank 0's state, from its checkpoint or its initial weights, is every rank's.
    start = hvd.broadcast_object(start, root_rank=0)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    if hvd.rank() == 0:
        print(f"attempt {attempt}: starting at step {start}", flush=True)

    loss = None
    for step in range(start, args.steps):
        if step == args.fail_at and attempt == 0 and hvd.rank() == 1:
            print(f"rank 1: failing at step {step}", file=sys.stderr, flush=True)
            sys.exit(1)
        x, y = batch(step, hvd.rank(), hvd.size())
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        loss.backward()
        optimizer.step()
        if hvd.rank() == 0 and (step + 1) % args.every == 0:
            save(args.checkpoint, model, optimizer, step + 1)
    final = hvd.allreduce(loss.detach(), name="final_loss") if loss is not None else None
    if hvd.rank() == 0 and final is not None:
        print(f"final loss={final.item():.12g} after step {args.steps - 1}", flush=True)


if __name__ == "__main__":
    main()
