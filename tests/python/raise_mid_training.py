"""Rank 1 raises at step 3 of a training loop; the job must end with rank 1's exit code and
traceback, and rank 0 (waiting in an allreduce) must not hang."""
import torch
import torch.nn as nn

import ringrun.torch as hvd

hvd.init()
model = nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
for step in range(100):
    if step == 3 and hvd.rank() == 1:
        raise RuntimeError("boom at step 3 on rank 1")
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
