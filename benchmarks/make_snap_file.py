"""Write a synthetic SNAP temporal edge list (``src dst time`` per line) of E events.

Used to measure the loaders' time and peak memory on large files
(benchmarks/RESULTS.md, "Loading a 10^7/10^8-event file")::

    python benchmarks/make_snap_file.py /tmp/snap_1e7.txt --events 10000000
    /usr/bin/time -v python -c "from tgl_dist.data import load_dataset; load_dataset('/tmp/snap_1e7.txt', format='snap')"
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    block = 1_000_000
    t0 = 1_200_000_000
    with open(args.path, "w") as f:
        for a in range(0, args.events, block):
            n = min(block, args.events - a)
            src = rng.integers(0, args.nodes, n)
            dst = rng.integers(0, args.nodes, n)
            # mostly increasing unix times with some local disorder (SNAP files are not all sorted)
            t = t0 + (np.arange(a, a + n) // 3) + rng.integers(0, 50, n)
            f.write("\n".join(f"{s} {d} {x}" for s, d, x in zip(src.tolist(), dst.tolist(), t.tolist())))
            f.write("\n")


if __name__ == "__main__":
    main()
