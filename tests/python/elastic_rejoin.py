"""An elastic job's rank on the plain ringrun API (python/ringrun, no torch): allreduces, and
when one fails (a peer is gone) leaves and joins the next generation with ringrun.shutdown()
and ringrun.init(), then agrees on the step with an allreduce(Min). Worker 2 kills itself with
SIGKILL at step 50 of the first generation. Prints "error: ..." for the failed collective,
"rejoined RANK SIZE LOCAL_RANK CROSS_SIZE EPOCH" after the join, "done RANK SIZE PID" at the
end."""
import os
import signal

import numpy as np

import ringrun

STEPS = 200
ringrun.init()
me = int(os.environ["RINGRUN_WORKER_ID"])
step, first = 0, True
while step < STEPS:
    if first and me == 2 and step == 50:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        total = ringrun.allreduce(np.array([1.0]), op=ringrun.Sum)
        assert total[0] == ringrun.size(), (total, ringrun.size())
        step += 1
    except ringrun.RingrunError as e:
        print("error:", e, flush=True)
        ringrun.shutdown()
        ringrun.init()
        first = False
        step = int(ringrun.allreduce(np.array([step], np.int64), op=ringrun.Min)[0])
        print("rejoined", ringrun.rank(), ringrun.size(), ringrun.local_rank(),
              ringrun.cross_size(), ringrun.membership_epoch(), flush=True)
print("done", ringrun.rank(), ringrun.size(), os.getpid(), flush=True)
