"""Autotune at np=2 (HOROVOD_AUTOTUNE=1, a short warmup, one step per sample; ctest sets the
variables): a training loop of named allreduces whose results are checked at every step while
rank 0 tries settings, and rank 0's log in Horovod's CSV columns once tuning ends."""
import csv
import os

import torch

import ringrun.torch as hvd

hvd.init()

# Small tensors (fused) and one of 1 MiB (run from its own buffer).
SIZES = [1, 10, 1000, 5000, 262144]
# 1 warmup + 4 joint trials, each 5 samples of 1 step and 1 more step: 30 steps; then more.
STEPS = 45


def test_results_stay_right_and_the_log_is_horovods():
    assert os.environ.get("HOROVOD_AUTOTUNE") == "1"
    log = os.environ["HOROVOD_AUTOTUNE_LOG"]
    for step in range(STEPS):
        handles = [hvd.allreduce_async(torch.full((n,), float(hvd.rank() + step + i)),
                                       name=f"at.grad{i}", op=hvd.Sum)
                   for i, n in enumerate(SIZES)]
        for i, h in enumerate(handles):
            want = sum(r + step + i for r in range(hvd.size()))
            got = hvd.synchronize(h)
            assert torch.all(got == want), (step, i, got[:4])
    hvd.allreduce(torch.ones(1), name="at.after")  # the engine has logged the last round's trial
    if hvd.rank() != 0:
        return
    with open(log) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce",
                       "cache_enabled", "cycle_time_ms", "tensor_fusion_threshold", "score"]
    trials, best = rows[1:-1], rows[-1]
    assert len(trials) == int(os.environ["HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"])
    for row in rows[1:]:
        assert len(row) == 7
        assert row[:4] == ["0", "0", "0", "1"]  # one host: flat; cache on
        assert 0 <= float(row[4]) <= 0.064 and 0 <= float(row[5]) <= 64 and float(row[6]) > 0
    assert trials[0][4:6] == ["0.002", "64"]  # the first trial: the job's own settings
    # The last line repeats the best trial.
    assert best in trials
    assert float(best[6]) == max(float(r[6]) for r in trials)
