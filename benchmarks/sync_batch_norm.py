"""A ResNet-18 training step with hvd.SyncBatchNorm against the same step with plain BatchNorm.

    ringrun -np 2 /usr/bin/python3 benchmarks/sync_batch_norm.py [--rounds 15] [--steps 3]

Both nets are the same ResNet-18 (built here: torchvision is not needed), with the same weights;
one has torch.nn.BatchNorm2d, the other hvd.SyncBatchNorm. Each round times --steps steps of one,
then of the other (the order alternates between rounds), every rank starting each block
together (a barrier). A step is forward, backward and a local SGD step: no gradient averaging,
so that the difference is SyncBatchNorm's alone. Rank 0 prints the median step time of each and
the median of the per-round ratios.
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn

import ringrun.torch as hvd


class Block(nn.Module):
    def __init__(self, cin, cout, stride, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


def resnet18(norm, classes=10):
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), norm(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride, norm), Block(cout, cout, 1, norm)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes)]
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="per rank")
    ap.add_argument("--image", type=int, default=64)
    args = ap.parse_args()
    hvd.init()
    torch.manual_seed(0)
    plain = resnet18(nn.BatchNorm2d)
    synced = resnet18(hvd.SyncBatchNorm)
    synced.load_state_dict(plain.state_dict())
    torch.manual_seed(1 + hvd.rank())
    x = torch.randn(args.batch, 3, args.image, args.image)
    y = torch.randint(0, 10, (args.batch,))
    nets = {"BatchNorm2d": plain, "SyncBatchNorm": synced}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in nets.items()}

    def block(kind):
        net, opt = nets[kind], opts[kind]
        hvd.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return (time.perf_counter() - start) / args.steps

    for kind in nets:  # warm-up
        block(kind)
    times = {k: [] for k in nets}
    ratios = []
    for r in range(args.rounds):
        order = list(nets) if r % 2 == 0 else list(reversed(list(nets)))
        got = {k: block(k) for k in order}
        for k, v in got.items():
            times[k].append(v)
        ratios.append(got["SyncBatchNorm"] / got["BatchNorm2d"])
    if hvd.rank() == 0:
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"np={hvd.size()} batch={args.batch}/rank image={args.image} rounds={args.rounds} "
              f"steps={args.steps}: BatchNorm2d {med['BatchNorm2d'] * 1e3:.1f} ms, "
              f"SyncBatchNorm {med['SyncBatchNorm'] * 1e3:.1f} ms per step; "
              f"ratio of medians {med['SyncBatchNorm'] / med['BatchNorm2d']:.3f}, "
              f"median of per-round ratios {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
