"""Benchmark: what historical / inductive negatives cost a rank (memory, bind time, a window's draw).

The pairs are sharded (:class:`tgl_dist.sampling.pairs.PairShards`): a rank holds 32
bytes per distinct pair of its range and 16 per own event of the stream. The first
design gathered the stream on every rank: 32 bytes per event of the stream gathered
(src, dst, t, eid), 8 more for the pair keys and 16 per distinct pair, on every rank;
the JSON gives that figure (``gathered_mib``) beside the measured one.

For each stream size (the synthetic generator, ``--nodes-ratio`` nodes per event) and
each P, P processes (gloo, :func:`tgl_dist.testing.run_distributed`) each keep the
events whose source hashes to them, then bind an evaluation loader's negatives
(``NegativeSampling('triplet', 'historical')``: the collective construction) and draw
``--windows`` windows of ``--batch`` events per rank with ``--k`` negatives an event,
spread over the second half of the stream. Per rank: bind seconds, RSS growth and peak
above the process before the bind (MiB; the RSS after ``malloc_trim``, so it counts what is
held), the shard's tensors (MiB), median ms a window.

Run: ``python benchmarks/historical_negatives.py [--events 1000000 10000000] [--parts 1 2 4]
[--batch 200] [--k 1] [--windows 30]``. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from scale import _reset_peak, _status  # noqa: E402  (RSS helpers)

MIB = 2.0 ** 20


def _trim() -> None:
    """Return the heap's free pages to the kernel (glibc ``malloc_trim``), so that the RSS
    after the bind counts what is held, not what the allocator kept of its transients."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rank(num_nodes: int, num_events: int, batch: int, k: int, windows: int) -> dict:
    import torch
    from tgl_dist import DistributedContext
    from tgl_dist.data import load_dataset
    from tgl_dist.dist import barrier, world
    from tgl_dist.sampling import NegativeSampling
    from tgl_dist.sampling.hashing import mix64
    from tgl_dist.sampling.negative import Stream

    DistributedContext.init()
    rank, P = world()
    g = load_dataset("synthetic", num_nodes=num_nodes, num_events=num_events)
    mine = ((mix64(g.src) & ((1 << 62) - 1)) % P) == rank
    src, dst, t = g.src[mine].clone(), g.dst[mine].clone(), g.t[mine].clone()
    order = torch.nonzero(mine).view(-1)            # this rank's positions in the stream
    n, E = g.num_nodes, g.num_events
    del g, mine
    gc.collect()
    _trim()
    barrier()
    base = _status()
    _reset_peak()
    t0 = time.perf_counter()
    b = NegativeSampling("triplet", "historical", k, seed=0).bind(
        "test", False, Stream(src, dst, t, n), None)
    bind_s = time.perf_counter() - t0
    peak = _status()["VmHWM"]
    gc.collect()
    _trim()
    after = _status()
    sh = b.pairs
    shard = sum(x.numel() * x.element_size() for x in (sh.keys, sh.first, sh.ev_key, sh.ev_t,
                                                       sh._sorted_keys, sh._key_rows))
    times = []
    W = batch * P
    for w in range(windows):
        lo = E // 2 + w * (E // 2 - W) // max(windows, 1)
        a, z = torch.searchsorted(order, torch.tensor([lo, lo + W])).tolist()
        t1 = time.perf_counter()
        b.window(src[a:z], dst[a:z], t[a:z], W * k, lo, 0)
        times.append(time.perf_counter() - t1)
    U = sh.num_pairs
    return {"rank": rank, "events": int(src.numel()), "pairs_held": int(sh.keys.numel()),
            "pairs_total": U, "bind_s": round(bind_s, 2),
            "rss_mib": round(after["VmRSS"] - base["VmRSS"], 1),
            "peak_mib": round(peak - base["VmRSS"], 1),
            "shard_mib": round(shard / MIB, 1),
            "gathered_mib": round((40 * E + 16 * U) / MIB, 1),
            "window_ms": round(1e3 * statistics.median(times), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--nodes-ratio", type=float, default=0.1, help="nodes per event")
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--batch", type=int, default=200, help="events per rank in a window")
    ap.add_argument("--k", type=int, default=1, help="negatives per event")
    ap.add_argument("--windows", type=int, default=30)
    args = ap.parse_args(argv)
    from tgl_dist.testing import run_distributed

    out = {"machine": platform.processor() or platform.machine(), "runs": []}
    for E in args.events:
        N = max(int(E * args.nodes_ratio), 10)
        for P in args.parts:
            per = run_distributed(_rank, P, N, E, args.batch, args.k, args.windows, timeout=3600)
            big = max(per, key=lambda r: r["rss_mib"])
            print(f"E={E:>11,} P={P}: largest rank rss +{big['rss_mib']} MiB (peak +{big['peak_mib']}, "
                  f"shard {big['shard_mib']}; gathered design {big['gathered_mib']}), "
                  f"pairs {big['pairs_held']:,}/{big['pairs_total']:,}, bind {big['bind_s']} s, "
                  f"window {big['window_ms']} ms", flush=True)
            out["runs"].append({"events": E, "nodes": N, "P": P, "ranks": per})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
