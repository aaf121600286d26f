"""Ctrl-C while waiting: rank 0 waits in an allreduce that rank 1 joins only after 4 s; a
SIGINT to rank 0 after 0.5 s must raise KeyboardInterrupt at once (not hang inside C)."""
import os
import signal
import sys
import threading
import time

import numpy as np

import ringrun

ringrun.init()
if ringrun.rank() == 0:
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        ringrun.allreduce(np.ones(4, np.float32))
    except KeyboardInterrupt:
        print(f"interrupted after {time.monotonic() - t0:.2f} s", flush=True)
        os._exit(0)
    print("not interrupted", flush=True)
    os._exit(1)
else:
    time.sleep(4)
    sys.exit(0)
