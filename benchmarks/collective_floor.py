"""What the transport alone costs a distributed TGN step: a step's collectives around a fixed compute.

    torchrun --nproc_per_node=2 benchmarks/collective_floor.py [--compute-ms 5.6] [--steps 300]
    torchrun --nproc_per_node=2 benchmarks/collective_floor.py --one-process-ms 6.26

Each rank (1 thread) repeats a step made of ``--compute-ms`` of matrix products (the
measured compute of one rank's share: ``benchmarks/step_phases.py --threads 1
--batch-size 100``) and the collectives :func:`tgl_dist.ctdg.run_epoch` runs on every
step with PyG's example settings on wikipedia (sizes from a timeline of the 2-rank step):
the gradient all-reduce (222k floats, started after the backward, waited for before the
next forward) and the memory exchange of the next step (an all-to-all of counts, one of
about 90 KB of updates and requests, one of about 600 KB of replies), in that order.
The ranks' compute is equal, so nothing here waits for a slower rank: the step time above
``--compute-ms`` is what the collectives cost on this machine at best. Four variants run
one after the other:

- ``compute_only``: no collective (the reference);
- ``overlap`` (what ``run_epoch`` does): the all-reduce in flight while the next step's
  memory exchange runs;
- ``exchange_first``: the memory exchange, then the all-reduce waited for at once;
- ``serial``: the all-reduce waited for, then the memory exchange.

With ``--one-process-ms`` (the step of one process of 2 threads on the whole batch,
``step_phases.py --threads 2``) it also prints the highest ratio of events/s that 2
ranks can reach with these collectives: ``one_process_ms / mean step``. The last line is one
JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compute-ms", type=float, default=5.6, help="compute of a rank's step")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--grad-floats", type=int, default=222_000)
    ap.add_argument("--request-bytes", type=int, default=90_000)
    ap.add_argument("--reply-bytes", type=int, default=600_000)
    ap.add_argument("--one-process-ms", type=float, default=None,
                    help="1 process x 2 threads step (ms) for the ceiling ratio")
    args = ap.parse_args(argv)
    if "RANK" not in os.environ:
        ap.error("run under torchrun, e.g. torchrun --nproc_per_node=2 benchmarks/collective_floor.py")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    grads = torch.zeros(args.grad_floats)
    counts = torch.zeros(2 * ws, dtype=torch.int64)
    counts_in = torch.empty_like(counts)
    req = torch.zeros(ws * (args.request_bytes // (4 * ws)))
    req_in = torch.empty_like(req)
    rep = torch.zeros(ws * (args.reply_bytes // (4 * ws)))
    rep_in = torch.empty_like(rep)
    a = torch.randn(128, 128)

    def compute(ms: float) -> None:
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            a @ a

    def exchange() -> None:
        dist.all_to_all_single(counts_in, counts)
        dist.all_to_all_single(req_in, req)
        dist.all_to_all_single(rep_in, rep)

    out = {}
    for order in ("compute_only", "overlap", "exchange_first", "serial"):
        times = []
        dist.barrier()                                 # both ranks start the variant together
        for _ in range(args.warmup + args.steps):
            t = time.perf_counter()
            compute(args.compute_ms)                   # forward + backward
            if order == "overlap":
                w = dist.all_reduce(grads, async_op=True)
                exchange()
                w.wait()
            elif order == "exchange_first":
                exchange()
                dist.all_reduce(grads)
            elif order == "serial":
                dist.all_reduce(grads)
                exchange()
            times.append(time.perf_counter() - t)
        times = sorted(times[args.warmup:])
        out[order] = {"median_ms": round(1e3 * times[len(times) // 2], 3),
                      "mean_ms": round(1e3 * sum(times) / len(times), 3)}
    res = {"benchmark": "collective_floor", "world_size": ws, "compute_ms": args.compute_ms,
           "steps": args.steps, "grad_floats": args.grad_floats, "orders": out}
    if args.one_process_ms:
        res["ceiling_ratio"] = {k: round(args.one_process_ms / v["mean_ms"], 3)
                                for k, v in out.items()}
    if rank == 0:
        for k, v in out.items():
            extra = f"  ceiling ratio {res['ceiling_ratio'][k]}" if args.one_process_ms else ""
            print(f"{k:15s} median {v['median_ms']:7.3f} ms  mean {v['mean_ms']:7.3f} ms{extra}")
        print(json.dumps(res))
    dist.destroy_process_group()
    return res


if __name__ == "__main__":
    main()
