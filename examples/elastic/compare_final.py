"""Compares the final lines ("final loss=... params=[...]") of two outputs of the elastic example
(or of benchmarks/torchrun_elastic_train.py): prints the largest absolute difference, and exits 1
when it is 1e-12 or more, or when a file has no final line.

    /usr/bin/python3 examples/elastic/compare_final.py JOB_OUTPUT REFERENCE_OUTPUT
"""
import re
import sys


def final(path):
    line = re.search(r"final loss=(\S+) params=\[(.*)\]", open(path).read())
    if not line:
        raise SystemExit(f"no final line in {path}")
    return [float(line.group(1))] + [float(v) for v in line.group(2).split(",")]


def main():
    got, want = final(sys.argv[1]), final(sys.argv[2])
    if len(got) != len(want):
        raise SystemExit(f"{len(got)} values against {len(want)}")
    diff = max(abs(a - b) for a, b in zip(got, want))
    print(f"{diff:.3g}")
    return 0 if diff < 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())
