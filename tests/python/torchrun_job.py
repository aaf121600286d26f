"""One rank of a job that torchrun started (run.sh torchrun): ringrun.torch joins through
torch's store and checks the shape torchrun gave, then allreduces. With argument `kill`, rank 1
dies (SIGKILL) after a first allreduce and rank 0's next allreduce must fail naming it. With
`nodes`, torchrun ran several nodes on this host; with `hosts`, one node on each of two hosts."""
import os
import signal
import socket
import sys

import torch

import ringrun.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
env = {k: int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
# ringrun counts a host's ranks by address: torchrun's nodes on one host (argument `nodes`)
# make one host of every rank. With `hosts`, each torchrun node ran on a host of its own
# (tests/cluster/torchrun_test.sh): ringrun's cross rank is the node's.
nodes = sys.argv[1:] == ["nodes"]
hosts = sys.argv[1:] == ["hosts"]
local = (rank, size) if nodes else (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"])
shape = (rank, size, hvd.local_rank(), hvd.local_size())
assert shape == (env["RANK"], env["WORLD_SIZE"]) + local, shape
cross = (int(os.environ["GROUP_RANK"]), size // env["LOCAL_WORLD_SIZE"]) if hosts else (0, 1)
assert (hvd.cross_rank(), hvd.cross_size()) == cross, (hvd.cross_rank(), hvd.cross_size())
if sys.argv[1:] == ["kill"]:
    hvd.allreduce(torch.ones(4), op=hvd.Sum, name="before_kill")  # every pair connected
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:  # at once, so that it fails before torchrun, seeing rank 1 gone, ends this rank
        hvd.allreduce(torch.ones(4), op=hvd.Sum, name="after_kill")
    except hvd.HorovodInternalError as e:
        print(f"rank {rank} failed: {e}", flush=True)
        sys.exit(3)
    sys.exit("rank 0's allreduce succeeded without rank 1")
total = hvd.allreduce(torch.full((1000,), float(rank + 1)), op=hvd.Sum, name="ranks")
assert total.eq(size * (size + 1) / 2).all(), total[:4]
where = f"cross {hvd.cross_rank()} of {hvd.cross_size()}, " if hosts else ""
print(f"rank {rank} of {size}: local {hvd.local_rank()} of {hvd.local_size()}, {where}"
      f"allreduce {total[0].item()} on host {socket.gethostname()}", flush=True)
hvd.shutdown()
