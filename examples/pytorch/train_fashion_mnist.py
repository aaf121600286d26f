"""A CNN on Fashion-MNIST, data parallel with ringrun.torch (Horovod's API).

    ringrun -np 2 /usr/bin/python3 examples/pytorch/train_fashion_mnist.py [--epochs N]
        [--checkpoint PATH] [--data DIR] [--max-batches N]

Each rank trains on its shard of the training set (DistributedSampler); gradients are averaged
by hvd.DistributedOptimizer while backward runs; rank 0's initial weights are broadcast; the
test accuracy is averaged over the ranks' shards of the test set with hvd.allreduce. Rank 0
writes a checkpoint after every epoch, and a later run with the same --checkpoint resumes from
it. Rank 0 ends by printing test_accuracy=0.XXXX.

Data: Debian's dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import ringrun.torch as hvd

DATA = "/usr/share/datasets/fashion-mnist"


def load_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, split):
    images = load_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    labels = load_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    x = (x - 0.2860) / 0.3530  # the training set's mean and standard deviation
    return TensorDataset(x, torch.from_numpy(labels.astype(np.int64)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(x, 1))


def average_buffers(model):
    """BatchNorm's running statistics are per rank: average them, so that every rank (and the
    checkpoint) evaluates the same model."""
    for name, buf in model.named_buffers():
        if buf.dtype.is_floating_point:
            hvd.allreduce_(buf, op=hvd.Average, name=f"buffer.{name}")


def evaluate(model, loader):
    average_buffers(model)
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.numel()
    counts = hvd.allreduce(torch.tensor([correct, total], dtype=torch.float64), op=hvd.Sum,
                           name="test_counts")
    return (counts[0] / counts[1]).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=2e-3, help="for the job (not scaled by size)")
    ap.add_argument("--checkpoint", default="", help="file to write after each epoch and resume")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--max-batches", type=int, default=0, help="per epoch (0: all; for tests)")
    args = ap.parse_args()

    hvd.init()
    torch.manual_seed(42)
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    train, test = load(args.data, "train"), load(args.data, "t10k")
    sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True,
                                 seed=42)
    train_loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(test, batch_size=1000, sampler=DistributedSampler(
        test, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False))

    model = Net()
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.lr),
                                         named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(
        optimizer, T_max=args.epochs * len(train_loader))
    start_epoch, schedule = 0, scheduler.state_dict()
    if args.checkpoint and hvd.rank() == 0 and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, schedule = state["epoch"], state["scheduler"]
        print(f"resuming from {args.checkpoint} after epoch {start_epoch}", flush=True)
    # Every rank starts from rank 0's weights, optimizer state, epoch and schedule.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    start_epoch, schedule = hvd.broadcast_object((start_epoch, schedule), root_rank=0)
    scheduler.load_state_dict(schedule)

    t0 = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        model.train()
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(train_loader):
            if args.max_batches and i == args.max_batches:
                break
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            scheduler.step()
        accuracy = evaluate(model, test_loader)
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: test accuracy {accuracy:.4f} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
            if args.checkpoint:
                tmp = args.checkpoint + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "epoch": epoch + 1}, tmp)
                os.replace(tmp, args.checkpoint)
    accuracy = evaluate(model, test_loader)
    if hvd.rank() == 0:
        print(f"test_accuracy={accuracy:.4f}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
