"""Benchmark: one sparse optimizer step on a DistEmbedding as the table grows.

For tables of 10^5, 10^6 and 10^7 rows (dim 64 by default) and a fixed batch of
looked-up ids (10,000 by default, drawn with duplicates), it times, in a world of one:

- ``lookup_bwd_ms``: ``emb(ids)`` + ``loss.backward()`` (gradient rows recorded),
- ``step_ms``: ``SparseAdam.step()`` alone (dedup, exchange, Adam on the touched rows),

beside ``torch.optim.Adam`` on a dense ``nn.Parameter`` table of the same size
(``dense_step_ms``: ``Adam.step()`` alone after a dense backward; at most a few steps).
The sparse step must stay flat in the table size; the dense one grows linearly.

Run: ``python benchmarks/embedding.py [--sizes 100000 1000000 10000000] [--dim 64]
[--batch 10000] [--steps 20] [--dense-steps 3] [--threads 1]``. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch

from tgl_dist.dist import PartitionBook
from tgl_dist.nn import DistEmbedding
from tgl_dist.optim import SparseAdam


def _mem_available_gb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def _ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def bench_sparse(sizes, dim: int, batch: int, steps: int, warmup: int, seed: int = 0) -> list:
    """All tables live at once and the steps interleave (one step of each size per round),
    so a change of machine load between sizes does not bias the ratio."""
    g = torch.Generator().manual_seed(seed)
    runs = []
    for n in sizes:
        t0 = time.perf_counter()
        book = PartitionBook(torch.zeros(n, dtype=torch.int32))
        emb = DistEmbedding(n, dim, book, f"bench_{n}")
        opt = SparseAdam([emb], lr=1e-3)
        setup_s = time.perf_counter() - t0
        # ids spread over the whole table (random rows of a large table are cache misses)
        batches = [(torch.randint(0, n, (batch,), generator=g), torch.rand(batch, 1, generator=g))
                   for _ in range(steps + warmup)]
        runs.append({"n": n, "emb": emb, "opt": opt, "batches": batches, "fb": [], "st": [],
                     "setup_s": setup_s})
    for i in range(steps + warmup):
        for r in runs:
            emb, opt = r["emb"], r["opt"]
            ids, w = r["batches"][i]
            opt.zero_grad()
            t_fb = _ms(lambda: (emb(ids) * w).sum().backward())
            t_st = _ms(opt.step)
            if i >= warmup:
                r["fb"].append(t_fb)
                r["st"].append(t_st)
    out = [{"rows": r["n"], "setup_s": round(r["setup_s"], 2),
            "unique_ids_per_step": round(statistics.mean(b[0].unique().numel()
                                                         for b in r["batches"])),
            "lookup_bwd_ms": round(statistics.median(r["fb"]), 3),
            "step_ms": round(statistics.median(r["st"]), 3)} for r in runs]
    del runs
    gc.collect()
    return out


def bench_dense(n: int, dim: int, batches, steps: int) -> dict:
    if steps < 1:
        return {"rows": n, "dense_step_ms": None, "skipped": "--dense-steps 0"}
    need_gb = 5.5 * n * dim * 4 / 2**30  # param, grad, 2 moments, Adam's temporaries
    if _mem_available_gb() < need_gb + 1.0:
        return {"rows": n, "dense_step_ms": None, "skipped": f"needs ~{need_gb:.1f} GB"}
    p = torch.nn.Parameter(torch.empty(n, dim).uniform_(-0.1, 0.1))
    opt = torch.optim.Adam([p], lr=1e-3)
    st = []
    for i, (ids, w) in enumerate(batches):
        opt.zero_grad(set_to_none=False)
        (p[ids] * w).sum().backward()
        t = _ms(opt.step)
        if i >= 1:  # the first step allocates the moments
            st.append(t)
    del p, opt
    gc.collect()
    return {"rows": n, "dense_step_ms": round(statistics.median(st), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10**5, 10**6, 10**7])
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dense-steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: one rank per core, as under torchrun)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'rows':>10} {'setup s':>8} {'unique ids':>10} {'lookup+bwd ms':>14} "
          f"{'sparse step ms':>15} {'dense Adam step ms':>19}")
    rows = bench_sparse(args.sizes, args.dim, args.batch, args.steps, args.warmup)
    g = torch.Generator().manual_seed(1)
    for s in rows:
        n = s["rows"]
        batches = [(torch.randint(0, n, (args.batch,), generator=g),
                    torch.rand(args.batch, 1, generator=g)) for _ in range(args.dense_steps + 1)]
        s.update(bench_dense(n, args.dim, batches, args.dense_steps))
        dense = "skipped" if s["dense_step_ms"] is None else f"{s['dense_step_ms']:.1f}"
        print(f"{n:>10} {s['setup_s']:>8.2f} {s['unique_ids_per_step']:>10} "
              f"{s['lookup_bwd_ms']:>14.2f} {s['step_ms']:>15.2f} {dense:>19}", flush=True)
    small = min(rows, key=lambda r: r["rows"])
    large = max(rows, key=lambda r: r["rows"])
    result = {
        "benchmark": "embedding", "dim": args.dim, "batch_ids": args.batch,
        "timed": "SparseAdam.step() alone (dedup + exchange + update); lookup+backward separate",
        "threads": torch.get_num_threads(),
        "step_ms_small": small["step_ms"], "step_ms_large": large["step_ms"],
        "flatness": round(large["step_ms"] / small["step_ms"], 3),
        "lookup_bwd_ms_small": small["lookup_bwd_ms"], "lookup_bwd_ms_large": large["lookup_bwd_ms"],
        "dense_adam_step_ms_small": small["dense_step_ms"],
        "dense_adam_step_ms_large": large["dense_step_ms"],
        "rows": rows,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
