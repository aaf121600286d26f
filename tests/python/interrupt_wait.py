"""Ctrl-C while waiting: rank 0 waits in an allreduce that rank 1 joins only after 4 s; a
SIGINT to rank 0 after 0.5 s must raise KeyboardInterrupt at once (not hang inside C).

Rank 0 then goes on, as a program that catches KeyboardInterrupt may: the abandoned allreduce
still runs when rank 1 joins it, into buffers that must still be there (64 MiB each: freed,
they would be unmapped and the engine would fault)."""
import gc
import os
import signal
import sys
import threading
import time

import numpy as np

import ringrun

BIG = 16 << 20
ringrun.init()
if ringrun.rank() == 0:
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        ringrun.allreduce(np.ones(BIG, np.float32), name="abandoned")
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - t0:.2f} s", flush=True)
    else:
        print("not interrupted", flush=True)
        os._exit(1)
    gc.collect()
    ringrun.barrier()  # rank 1 joins "abandoned" before it
    out = ringrun.allreduce(np.full(4, 3.0, np.float32), op=ringrun.Sum)
    print(f"went on: {out.tolist()}", flush=True)
    ringrun.shutdown()
    sys.exit(0)
else:
    time.sleep(4)
    out = ringrun.allreduce(np.ones(BIG, np.float32), name="abandoned")
    assert float(out[0]) == 1.0 and float(out[-1]) == 1.0, out[:4]
    ringrun.barrier()
    ringrun.allreduce(np.full(4, 3.0, np.float32), op=ringrun.Sum)
    ringrun.shutdown()
    sys.exit(0)
