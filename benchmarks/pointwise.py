"""Benchmark: the compiled pointwise kernels (time encoding, dropout mask) vs torch.

A TGN step on a 200-event batch encodes ``--rows`` (about 4,500 sampled edges) time gaps
into ``--dim`` cosines and draws dropout masks of the attention output (600 x 100).
Times, interleaved so machine noise hits both alike (median over ``--iters``):

- time encoding forward and forward + backward: ``TimeEncode``'s kernel
  (``tgl_dist/kernels/pointwise.c``) vs torch's ``cos(Linear(dt))``, for time gaps in
  seconds of a month-long stream (``--scale``, the arguments torch's ``cos`` is slow
  on) and for unit-scale gaps;
- ``F.dropout`` vs :func:`tgl_dist.nn._pointwise.dropout` on a ``[600, 100]`` tensor;
- TGN's memory update on ``--gru-rows`` distinct nodes (about 800 a step) of ``--dim``
  hidden units, mails ``[memory || 100 more]`` and a ``--dim`` time encoding:
  :class:`tgl_dist.nn._pointwise.GRUTimeCell` (one compiled call each way) vs its torch
  reference (the encoding, then :func:`tgl_dist.nn._pointwise.gru_cell`), forward and
  forward + backward.

Run: ``python benchmarks/pointwise.py [--rows 4500] [--dim 100] [--iters 100]
[--gru-rows 800] [--threads 2]``. The last line is one JSON object (microseconds).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from tgl_dist.nn import TimeEncode
from tgl_dist.nn._pointwise import (KERNEL, CosineTimeEncoding, GRUTimeCell, dropout, gru_cell,
                                    whole_time_cell)


def timed(fns: dict, iters: int) -> dict:
    """Median microseconds of each function, calls interleaved."""
    for f in fns.values():
        for _ in range(3):
            f()
    times = {k: [] for k in fns}
    for _ in range(iters):
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4500)
    ap.add_argument("--dim", type=int, default=100)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scale", type=float, default=2.6e6, help="largest time gap (seconds)")
    ap.add_argument("--gru-rows", type=int, default=800, help="distinct nodes of the GRU")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lib = KERNEL.load()
    g = torch.Generator().manual_seed(0)
    w = torch.from_numpy(1 / 10 ** np.linspace(0, 9, args.dim, dtype=np.float32)).requires_grad_()
    b = torch.zeros(args.dim, requires_grad=True)
    grad = torch.randn(args.rows, args.dim, generator=g)
    res = {"rows": args.rows, "dim": args.dim, "threads": args.threads}
    for name, dt in (("seconds", torch.rand(args.rows, generator=g) * args.scale),
                     ("unit", torch.rand(args.rows, generator=g))):
        def torch_fwd():
            with torch.no_grad():
                torch.cos(torch.addmm(b, dt.view(-1, 1), w.view(1, -1)))

        def kernel_fwd():
            with torch.no_grad():
                CosineTimeEncoding.apply(dt, w, b, lib)

        def torch_both():
            torch.cos(torch.addmm(b, dt.view(-1, 1), w.view(1, -1))).backward(grad)

        def kernel_both():
            CosineTimeEncoding.apply(dt, w, b, lib).backward(grad)

        t = timed({"torch_fwd": torch_fwd, "kernel_fwd": kernel_fwd, "torch_fwd_bwd": torch_both,
                   "kernel_fwd_bwd": kernel_both}, args.iters)
        for k, v in t.items():
            res[f"time_enc_{name}_{k}_us"] = round(v, 1)
        print(f"time encoding, {name:7s} gaps: forward {t['kernel_fwd']:7.0f} us (torch "
              f"{t['torch_fwd']:7.0f}), forward+backward {t['kernel_fwd_bwd']:7.0f} us (torch "
              f"{t['torch_fwd_bwd']:7.0f})", flush=True)
    x = torch.randn(600, 100, generator=g)
    t = timed({"torch": lambda: F.dropout(x, 0.1, True), "kernel": lambda: dropout(x, 0.1, True)},
              args.iters)
    print(f"dropout [600, 100]: {t['kernel']:.0f} us (torch {t['torch']:.0f})", flush=True)
    res["dropout_torch_us"], res["dropout_kernel_us"] = round(t["torch"], 1), round(t["kernel"], 1)
    U, H = args.gru_rows, args.dim
    cell, enc = torch.nn.GRUCell(2 * H + H, H), TimeEncode(H)
    params = list(cell.parameters())
    x0, h = torch.randn(U, H, generator=g), torch.randn(U, H, generator=g)
    dt = torch.rand(U, generator=g) * args.scale
    gout = torch.randn(U, H, generator=g)
    te = (enc.w.weight, enc.w.bias)
    if whole_time_cell(x0, dt, h, *params, *te) is None:
        raise SystemExit("the compiled GRU cell needs torch's sgemm_ (this torch exports none)")

    def gates(kernel: bool, backward: bool):
        def run():
            with torch.set_grad_enabled(backward):
                if kernel:
                    out = GRUTimeCell.apply(x0, dt, h, *params, *te, lib)
                else:
                    out = gru_cell(x0, enc(dt), h, *params, own_state=True)
                if backward:
                    out.backward(gout)
        return run

    t = timed({"torch_fwd": gates(False, False), "kernel_fwd": gates(True, False),
               "torch_fwd_bwd": gates(False, True), "kernel_fwd_bwd": gates(True, True)},
              args.iters)
    print(f"GRU time cell [{U}, {H}]: forward {t['kernel_fwd']:.0f} us (torch {t['torch_fwd']:.0f}), "
          f"forward+backward {t['kernel_fwd_bwd']:.0f} us (torch {t['torch_fwd_bwd']:.0f})",
          flush=True)
    for k, v in t.items():
        res[f"gru_time_cell_{k}_us"] = round(v, 1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
