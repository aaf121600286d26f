#!/usr/bin/python3
"""Plots benchmarks/scale_harness's measured table (docs/scale.md, "Negotiation").

    /usr/bin/python3 benchmarks/plot_scale.py [CSV] [IMAGE]

CSV (default benchmarks/data/scale_harness.csv): one row per n and transport, the columns that
scale_harness prints (lines starting with '#' are comments). IMAGE (default docs/images/scale.png;
.svg also works) gets three panels against n on a log2 axis:
  - negotiation's messages per rank per warm round, with ceil(log2 n) (a round in which every
    rank's frame agrees) and the goal of 2*log2(n);
  - connections per rank, with 2*log2(n) - 1 (negotiation's partners at a power of two) and the
    same goal;
  - the time of a warm step and of the cold negotiation (n ranks as threads sharing the
    machine's CPUs, not n hosts).
Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""

import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STYLE = {"socket": dict(marker="o", color="tab:blue"), "memory": dict(marker="s", color="tab:orange")}
LABEL = {"socket": "loopback TCP (real transport)", "memory": "in-process transport"}


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    for r in rows:
        for k, v in r.items():
            if k != "transport":
                r[k] = float(v)
    return rows


def series(rows, transport, column):
    pts = sorted((r["n"], r[column]) for r in rows if r["transport"] == transport)
    return [p[0] for p in pts], [p[1] for p in pts]


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "benchmarks/data/scale_harness.csv")
    dst = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "docs/images/scale.png")
    rows = read(src)
    ns = [2 ** k for k in range(1, 14)]  # 2 .. 8192: the lines run past the measured n
    log2 = [math.log2(n) for n in ns]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    msgs, conns, times = axes
    for t in ("socket", "memory"):
        x, y = series(rows, t, "msgs_per_rank_per_warm_round")
        msgs.plot(x, y, linestyle="none", markersize=7, label=LABEL[t], **STYLE[t])
        x, y = series(rows, t, "connections_per_rank")
        conns.plot(x, y, linestyle="none", markersize=7, label=LABEL[t], **STYLE[t])
    msgs.plot(ns, [2 * v for v in log2], "k--", label="goal: 2·log2 n")
    msgs.plot(ns, [math.ceil(v) for v in log2], "g:", label="ceil(log2 n): frames all agree")
    msgs.set_title("negotiation messages per rank per warm round")
    conns.plot(ns, [2 * v for v in log2], "k--", label="goal: 2·log2 n (+ ranks per host)")
    conns.plot(ns, [2 * v - 1 for v in log2], "g:", label="2·log2 n − 1: ±2^k partners")
    conns.set_title("connections per rank")

    for t in ("socket", "memory"):
        x, y = series(rows, t, "warm_step_ms")
        times.plot(x, y, markersize=7, label=f"warm step, {t}", **STYLE[t])
        x, y = series(rows, t, "cold_negotiation_ms")
        times.plot(x, y, markersize=5, linestyle=":", fillstyle="none", label=f"cold negotiation, {t}",
                   **STYLE[t])
    times.set_yscale("log")
    times.set_ylabel("ms")
    times.set_title("time: n threads sharing 2 vCPUs, not n hosts")

    measured = sorted({int(r["n"]) for r in rows})
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlim(1.5, 10000)
        ax.set_xticks(measured)
        ax.set_xticklabels([f"{n:,}" for n in measured], fontsize=8)
        ax.minorticks_off()
        ax.set_xlabel("ranks n")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    for r in rows:  # rows that ran fewer tensors than the others say so
        if r["tensors"] != rows[0]["tensors"]:
            for ax, col in ((msgs, "msgs_per_rank_per_warm_round"), (times, "warm_step_ms")):
                ax.annotate(f"{int(r['tensors'])} tensor", (r["n"], r[col]), textcoords="offset points",
                            xytext=(-20, -14), fontsize=7)
    msgs.set_ylim(0, 28)
    conns.set_ylim(0, 28)
    fig.suptitle("benchmarks/scale_harness (" + os.path.relpath(src, ROOT) + ")", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    # No timestamp in the file, so that the same data makes the same image.
    meta = {"Date": None} if dst.endswith(".svg") else {"Software": None}
    fig.savefig(dst, dpi=100, metadata=meta)
    print(dst)


if __name__ == "__main__":
    main()
