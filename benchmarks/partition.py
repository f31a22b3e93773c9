"""Benchmark: time, balance and edge cut of every partitioning algorithm on a real stream.

Default: ``facebook-wall`` (46,952 nodes, 876,993 events) with P = 2 and 4. For each
algorithm and P it reports

- ``algo_s``: the algorithm alone (owner of every node), best of ``--repeat`` runs;
- ``write_s``: ``partition_graph`` end to end (algorithm, statistics, every part written
  and checksummed into a temporary folder), one run;
- ``edge_cut``, ``balance_nodes``, ``balance_events``, ``replication`` (see docs/partition.md).

Run: ``python benchmarks/partition.py [--data facebook-wall] [--root DIR] [--parts 2 4]
[--algos random hash metis metis_for_tgnn] [--repeat 3]``. Datasets are read from
``--root`` (default ``$TGL_DIST_DATASETS`` or ``../shared/datasets``). The last line is one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

from tgl_dist.data import load_dataset
from tgl_dist.partition import available_partitioners, get_partitioner, partition_graph, partition_stats

DEFAULT_ROOT = os.environ.get("TGL_DIST_DATASETS",
                              str(Path(__file__).resolve().parents[1].parent / "shared" / "datasets"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="facebook-wall")
    ap.add_argument("--root", default=DEFAULT_ROOT)
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--algos", nargs="+", default=available_partitioners())
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    t0 = time.perf_counter()
    g = load_dataset(args.data, root=args.root)
    load_s = time.perf_counter() - t0
    print(f"{g!r} loaded in {load_s:.2f}s; torch threads {torch.get_num_threads()}")
    header = f"{'algo':>15} {'P':>2} {'algo_s':>7} {'write_s':>7} {'edge_cut':>8} {'bal_nodes':>9} " \
             f"{'bal_events':>10} {'replication':>11}"
    print(header)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for P in args.parts:
            for algo in args.algos:
                fn = get_partitioner(algo)
                times = []
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    owner = fn(g, P, 0)
                    times.append(time.perf_counter() - t)
                s = partition_stats(g.src, g.dst, owner, P)
                t = time.perf_counter()
                partition_graph(g, P, algo, tmp, force=True)
                write_s = time.perf_counter() - t
                row = {"algo": algo, "P": P, "algo_s": round(min(times), 4),
                       "write_s": round(write_s, 3), **{k: s[k] for k in (
                           "edge_cut", "balance_nodes", "balance_events", "replication")}}
                results.append(row)
                print(f"{algo:>15} {P:>2} {row['algo_s']:>7.3f} {row['write_s']:>7.2f} "
                      f"{row['edge_cut']:>8.4f} {row['balance_nodes']:>9.4f} "
                      f"{row['balance_events']:>10.4f} {row['replication']:>11.4f}")
    print(json.dumps({"benchmark": "partition", "data": g.name, "num_nodes": g.num_nodes,
                      "num_events": g.num_events, "load_s": round(load_s, 2),
                      "cpus": os.cpu_count(), "machine": platform.machine(), "results": results}))


if __name__ == "__main__":
    main()
