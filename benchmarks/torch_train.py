# Data-parallel training throughput with ringrun.torch.DistributedOptimizer on the models and
# synthetic data of the DDP anchor (/work/shared/anchors/torch_ddp_train.py), so the two compare
# on the same model, batch and threads.
# usage (under ringrun, or alone for np=1):  torch_train.py MODEL STEPS [BATCH_PER_RANK] [WARMUP]
#   WARMUP: untimed steps first (default 3; more to let HOROVOD_AUTOTUNE finish before timing)
# Prints on rank 0: ringrun-torch model=M np=N params=P step_ms=T samples_per_s=S
import sys
import time

import torch
import torch.nn as nn

import ringrun.torch as hvd

torch.set_num_threads(1)
model_name, steps = sys.argv[1], int(sys.argv[2])
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 32
warmup = int(sys.argv[4]) if len(sys.argv) > 4 else 3
hvd.init()
n, rank = hvd.size(), hvd.rank()
torch.manual_seed(1)


def build(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 2048), nn.ReLU(), nn.Linear(2048, 2048),
                             nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    if name == "convnet":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    if name == "deep":
        layers = [nn.Flatten(), nn.Linear(784, 256), nn.ReLU()]
        for _ in range(62):
            layers += [nn.Linear(256, 256), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(256, 10))
    raise SystemExit(f"unknown model {name}")


model = build(model_name)
params = sum(p.numel() for p in model.parameters())
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
x = torch.randn(batch, 1, 28, 28)
y = torch.randint(0, 10, (batch,))
loss_fn = nn.CrossEntropyLoss()


def step():
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()


for _ in range(warmup):
    step()
hvd.barrier()
t0 = time.perf_counter()
for _ in range(steps):
    step()
hvd.barrier()
dt = (time.perf_counter() - t0) / steps
if rank == 0:
    print(f"ringrun-torch model={model_name} np={n} params={params} step_ms={dt * 1e3:.2f} "
          f"samples_per_s={batch * n / dt:.1f}", flush=True)
hvd.shutdown()
