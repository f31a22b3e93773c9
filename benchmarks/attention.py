"""Benchmark: one attention layer's forward + backward, compiled kernel vs torch reference.

A TGN-shaped input block: ``--dst`` destinations (a batch of 200 events has 600 roots:
sources, destinations, negatives), each with a random number of sampled edges between
0 and ``--fanout`` (a recent-neighbour sampler gives fewer early in the stream), node
rows of width ``--dim`` gathered through a row map (as the models call the layer),
time encoding of width ``--dim``, 2 heads, dropout 0.1, training mode.

For both layer forms (``TemporalAttention``: TGL's; ``TGNAttention``: DyGLib's / the TGN
code's) it times, interleaved so machine noise hits both alike:

- ``kernel``: the layer's forward, which on CPU float32 runs the compiled op
  (``tgl_dist/kernels/attention.c``: the whole layer for ``TemporalAttention``, the
  segment attention for ``TGNAttention``),
- ``reference``: the layer's torch reference (``layer.reference``, per edge), what a GPU
  or ``TGL_DIST_NO_KERNEL=1`` runs.

(The padded torch form, deleted in favour of one reference, measured here before it
went: 11.3 / 14.9 ms against the per-edge form's 10.7 / 21.7 ms, 2 threads.)

Run: ``python benchmarks/attention.py [--dst 600] [--fanout 10] [--dim 100] [--iters 60]
[--threads 2]``. Median milliseconds per forward+backward; the last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from tgl_dist.nn import TemporalAttention, TGNAttention
from tgl_dist.nn._attention_kernel import get_attention_kernel
from tgl_dist.sampling.block import Block


def make_block(D: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    deg = torch.randint(0, K + 1, (D,), generator=g)
    M = int(deg.sum())
    S = D + M
    dst = torch.arange(D).repeat_interleave(deg)
    block = Block({"ID": torch.arange(S), "ts": torch.zeros(S, dtype=torch.float64)},
                  {"dt": torch.rand(M, generator=g) * 100, "ID": torch.arange(M)},
                  torch.stack([torch.arange(D, S), dst]), D)
    return block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dst", type=int, default=600)
    ap.add_argument("--fanout", type=int, default=10)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if get_attention_kernel() is None:
        raise SystemExit("the attention kernel cannot be built here (see the warning above)")
    d = args.dim
    block = make_block(args.dst, args.fanout)
    U = args.dst + block.num_edges // 4   # distinct nodes: fewer than source rows
    rows = torch.randint(0, U, (block.num_src,))
    h = torch.randn(U, d, requires_grad=True)
    result = {"dst": args.dst, "edges": block.num_edges, "dim": d, "threads": args.threads}
    for cls in (TemporalAttention, TGNAttention):
        layer = cls(d, 0, d, d, num_head=2, dropout=0.1, att_dropout=0.1).train()
        paths = {"kernel": layer, "reference": layer.reference}
        times = {name: [] for name in paths}
        for i in range(args.warmup + args.iters):
            for name, fn in paths.items():
                t0 = time.perf_counter()
                fn(block, h, rows).square().sum().backward()
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
        for name, ts in times.items():
            ms = 1e3 * statistics.median(ts)
            result[f"{cls.__name__}_{name}_ms"] = round(ms, 3)
            print(f"{cls.__name__:17s} {name:9s} {ms:8.2f} ms  (forward + backward, "
                  f"{block.num_edges} edges)")
        result[f"{cls.__name__}_speedup"] = round(result[f"{cls.__name__}_reference_ms"]
                                                  / result[f"{cls.__name__}_kernel_ms"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
