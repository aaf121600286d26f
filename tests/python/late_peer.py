"""A peer that submits late is no failure (run with RINGRUN_TIMEOUT_MS=500): rank 1 submits
each collective 1.5 s after rank 0, as a rank busy evaluating or saving a checkpoint would.
Rank 0's waits last until rank 1 submits, as in Horovod; the timeout bounds transfers and
dead peers, and the stall inspector reports tensors that some rank has not submitted."""
import sys
import time

import numpy as np

import ringrun

ringrun.init()
late = 1.5
for step in range(2):
    if ringrun.rank() == 1:
        time.sleep(late)
    t0 = time.monotonic()
    out = ringrun.allreduce(np.full(4, float(ringrun.rank() + 1), np.float32), op=ringrun.Sum,
                            name=f"step{step}")
    assert out.tolist() == [3.0] * 4, out
    if ringrun.rank() == 0:
        waited = time.monotonic() - t0
        assert waited > late * 0.8, waited
        print(f"rank 0 waited {waited:.2f} s for step {step}", flush=True)
ringrun.shutdown()
sys.exit(0)
