"""ringrun.torch with CUDA tensors (run by scripts/gpu-check.sh under ringrun, one GPU shared by
the ranks): allreduce and broadcast of device tensors on the caller's current stream for every
floating dtype, and DistributedOptimizer on a CUDA model against the CPU result. Exit 0 on
success, 77 when this torch has no CUDA."""
import sys

import torch

import ringrun.torch as hvd

if not torch.cuda.is_available():
    print("torch has no CUDA here (Debian's python3-torch is CPU-only)")
    sys.exit(77)
hvd.init()
n, r = hvd.size(), hvd.rank()
dev = torch.device("cuda", 0)
assert hvd.nccl_built(), "this libringrun has no NCCL backend"
for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
    x = torch.full((1 << 20,), float(r + 1), dtype=dtype, device=dev)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # the collective follows the caller's current stream
        y = hvd.allreduce(x * 1, op=hvd.Sum)
    s.synchronize()
    assert torch.all(y == n * (n + 1) / 2), (dtype, y[:4])
    b = hvd.broadcast(torch.full((4096,), float(r), dtype=dtype, device=dev), root_rank=n - 1)
    torch.cuda.synchronize()
    assert torch.all(b == n - 1), (dtype, b[:4])
    h = hvd.allreduce_async_(x, op=hvd.Average)
    hvd.synchronize(h)
    torch.cuda.synchronize()
    assert torch.allclose(x.float(), torch.full_like(x.float(), (n + 1) / 2), rtol=1e-2)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
ref.load_state_dict(model.state_dict())
model.to(dev)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
for step in range(3):
    x = torch.randn(8 * n, 32, generator=g)
    opt.zero_grad()
    model(x[8 * r:8 * (r + 1)].to(dev)).pow(2).mean().backward()
    opt.step()
    ropt.zero_grad()
    ref(x).pow(2).mean().backward()
    ropt.step()
torch.cuda.synchronize()
for p, q in zip(model.parameters(), ref.parameters()):
    assert torch.allclose(p.cpu(), q, atol=1e-5), (p.cpu() - q).abs().max()
print(f"rank {r}: ringrun.torch CUDA checks passed")
