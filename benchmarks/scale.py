"""Benchmark: per-rank time and memory of every stage at scale, and bytes per exchange.

For each stream size (synthetic, ``--nodes-ratio`` nodes per event) and each number of
processes P it measures, in fresh processes:

- ``generate`` and ``partition`` (one process: the stream is generated once, then
  partitioned for every P with ``partition_graph``), time and peak RSS;
- per rank (P processes, gloo, :func:`tgl_dist.testing.run_distributed`): ``partition_load``,
  ``DistributedGraphStore``, ``TemporalNeighborSampleGraph`` in ``partitioned`` and
  ``full`` mode, ``SharedMailBox`` of the owned nodes (``configs/TGN.yml``'s memory), and
  one training pass of ``DistributedDataLoader`` + TGN over ``--steps`` steps, once with
  each sampling mode.

Memory figures are MiB above the process's baseline, taken after ``import torch,
tgl_dist`` and the modules the stages use (and, for ranks, after the process group is
up): ``rss`` is the resident set after the stage, ``peak`` the high-water mark during it
(``VmHWM``, reset before each stage through ``/proc/self/clear_refs``), ``anon`` the
anonymous part of ``rss`` (what is not a clean page of a mapped file). During the
training passes every collective the library issues is counted (``torch.distributed``'s
``all_to_all_single``, ``all_reduce``, ``all_gather`` wrapped in each rank) and
attributed by its caller to feature fetches, sampler requests, memory/mail, gradient
all-reduce or other: bytes this rank sends to other ranks per step (an all-reduce
counts its tensor's size once).

``--stagger``: the ranks build their partitioned T-CSR one at a time (a barrier loop over
the ranks around that stage), so when all P ranks share one machine its total transient
is one rank's build, not P at once; the per-rank figures are the same either way (each
rank measures only its own build). ``--device cuda`` puts the model and the mailbox of
the training passes on the GPU (``cuda:<local rank>``, gloo collectives; an error when
CUDA is absent); the T-CSR and the sampler stay on the CPU.

Run: ``python benchmarks/scale.py [--events 1000000 10000000] [--big] [--parts 1 2 4]
[--algo metis_for_tgnn] [--steps 20] [--stagger] [--device cpu|cuda]``. ``--big`` adds 10^8 events (needs ~10 GB at P=1).
The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:      # the tgl_dist next to this script (also in spawned ranks)
    sys.path.insert(0, str(ROOT))
CONFIG = ROOT / "configs" / "TGN.yml"
MIB = 2.0 ** 20


# ------------------------------------------------------------------ measuring
def _status() -> dict:
    """VmRSS, VmHWM, RssAnon, RssFile of this process in MiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) / 1024.0
    return out


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Meter:
    """Per-stage seconds, RSS, peak RSS and anonymous RSS above a baseline (MiB)."""

    def __init__(self) -> None:
        gc.collect()
        self.base = _status()
        self.rows: dict = {}

    @contextmanager
    def stage(self, name: str):
        gc.collect()
        _reset_peak()
        t0 = time.perf_counter()
        extra: dict = {}
        yield extra
        dt = time.perf_counter() - t0
        m = _status()
        self.rows[name] = {"s": round(dt, 3), "rss": round(m["VmRSS"] - self.base["VmRSS"], 1),
                           "peak": round(m["VmHWM"] - self.base["VmRSS"], 1),
                           "anon": round(m["RssAnon"] - self.base["RssAnon"], 1), **extra}


# ------------------------------------------------------------ counting bytes
_COUNT = {"on": False, "bytes": defaultdict(int), "calls": defaultdict(int)}


def _category() -> str:
    """Who issued the collective: the innermost tgl_dist caller outside tgl_dist/dist."""
    f = sys._getframe(2)
    while f is not None:
        name, path = f.f_code.co_name, f.f_code.co_filename.replace("\\", "/")
        if name == "all_reduce_gradients":
            return "gradient all-reduce"
        if "/tgl_dist/" in path and "/tgl_dist/dist/" not in path:
            if "/graph/store.py" in path:
                return "feature fetch"
            if "/memory/" in path:
                return "memory/mail"
            if "/sampling/" in path or "/graph/tcsr.py" in path:
                return "sampler"
            if "/loader/" in path:
                return "loader (schedule, negatives)"
            if "/ctdg/" in path:
                return "training loop (counts)"
            return "other"
        f = f.f_back
    return "other"


def _instrument() -> None:
    import torch.distributed as dist

    def wrap(fn, sent):
        def inner(*a, **kw):
            if _COUNT["on"]:
                c = _category()
                _COUNT["bytes"][c] += int(sent(*a, **kw))
                _COUNT["calls"][c] += 1
            return fn(*a, **kw)
        return inner

    def a2a(out, inp, output_split_sizes=None, input_split_sizes=None, group=None, **_):
        ws, rk = dist.get_world_size(group), dist.get_rank(group)
        rows = max(int(inp.shape[0]) if inp.dim() else 1, 1)
        row_bytes = inp.numel() * inp.element_size() / rows
        own = input_split_sizes[rk] if input_split_sizes else rows / ws
        return (rows - own) * row_bytes

    def reduce(t, *a, **kw):
        return t.numel() * t.element_size()

    def gather(out, t, *a, **kw):
        return t.numel() * t.element_size() * (len(out) - 1)

    dist.all_to_all_single = wrap(dist.all_to_all_single, a2a)
    dist.all_reduce = wrap(dist.all_reduce, reduce)
    dist.all_gather = wrap(dist.all_gather, gather)


# ------------------------------------------------------------------- stages
def _tensor_mib(*xs) -> float:
    return round(sum(x.numel() * x.element_size() for x in xs if x is not None) / MIB, 1)


def _prepare(num_nodes: int, num_events: int, parts, algo: str, out: str, edge_dim: int) -> dict:
    """Generate the stream, then partition it for every P (one process)."""
    import torch  # noqa: F401
    import tgl_dist  # noqa: F401
    from tgl_dist.data import load_dataset
    from tgl_dist.partition import partition_graph

    meter = Meter()
    with meter.stage("generate") as x:
        g = load_dataset("synthetic", num_nodes=num_nodes, num_events=num_events, edge_dim=edge_dim)
        x["final_mib"] = _tensor_mib(g.src, g.dst, g.t, g.eid, g.edge_attr, *g.masks.values())
    for P in parts:
        with meter.stage(f"partition P={P}") as x:
            path = partition_graph(g, P, algo, out, force=True, name="scale")
            files = json.loads((Path(path) / "manifest.json").read_text())["files"]
            x["disk_mib"] = {k: round(v["bytes"] / MIB, 1) for k, v in files.items()
                             if k == "book.pt" or k.startswith("part_0/")}
    return {"base_mib": round(meter.base["VmRSS"], 1), "stages": meter.rows}


def _rank(root: str, algo: str, steps: int, batch: int, modes, full_max: int,
          stagger: bool = False, device: str = "cpu") -> dict:
    """One rank's stages; returns its measurements and its bytes per step by exchange."""
    import torch
    import tgl_dist  # noqa: F401
    from tgl_dist import DistributedContext
    from tgl_dist.ctdg import build_model, load_config, run_epoch
    from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
    from tgl_dist.loader import DistributedDataLoader
    from tgl_dist.memory import SharedMailBox
    from tgl_dist.optim import build_optimizer
    from tgl_dist.partition import partition_load
    from tgl_dist.sampling import NegativeSampling, NeighborSampler

    ctx = DistributedContext.init(backend="gloo", use_gpu=device == "cuda")
    _instrument()
    cfg = load_config(CONFIG)
    meter = Meter()
    with meter.stage("partition_load") as x:
        pdata = partition_load(root, algo)
        x["owned_events"], x["owned_nodes"] = pdata.num_local_events, pdata.num_local_nodes
        book = pdata.edge_book   # before issue 39: a PartitionBook over all events
        x["edge_book_mib"] = (round(book.nbytes() / MIB, 1) if hasattr(book, "nbytes") else
                              _tensor_mib(book.owner, book.local, book._order))
        x["node_book_mib"] = _tensor_mib(pdata.book.owner, pdata.book.local, pdata.book._order)
    with meter.stage("graph_store"):
        graph = DistributedGraphStore(pdata)
    tcsr = {}
    turns = range(ctx.world_size) if stagger and ctx.world_size > 1 else [ctx.rank]
    for turn in turns:       # --stagger: one rank builds at a time (no collective inside)
        if len(turns) > 1:
            ctx.barrier()
        if turn != ctx.rank:
            continue
        with meter.stage("tcsr partitioned") as x:
            tcsr["partitioned"] = TemporalNeighborSampleGraph(pdata, mode="partitioned")
            x["tcsr_mib"] = round(tcsr["partitioned"].nbytes() / MIB, 1)
    if len(turns) > 1:
        ctx.barrier()
    with meter.stage("mailbox") as x:
        mb = SharedMailBox(pdata.num_local_nodes, cfg.memory, graph.edge_feat_dim,
                           partition_book=pdata.book, device=ctx.device)
        x["mailbox_mib"] = _tensor_mib(mb.memory, mb.memory_ts, mb.mailbox, mb.mail_ts)
    ev = graph.split_events("train")
    ev = ev.select(ev.eid < steps * batch)         # the first steps * batch training events
    exchanges = {}
    for mode in modes:
        if mode == "full" and pdata.num_events > full_max:
            continue
        if mode not in tcsr:
            with meter.stage(f"tcsr {mode}") as x:
                tcsr[mode] = TemporalNeighborSampleGraph(pdata, mode=mode)
                x["tcsr_mib"] = round(tcsr[mode].nbytes() / MIB, 1)
        smp = cfg.sampling
        sampler = NeighborSampler(graph.num_nodes, smp.layer, list(smp.neighbor), tcsr[mode])
        loader = DistributedDataLoader(graph, ev, sampler=sampler,
                                       neg_sampler=NegativeSampling("triplet", "random", 1),
                                       batch_size=max(1, batch // ctx.world_size), mailbox=mb,
                                       queue_size=0, device=ctx.device)
        torch.manual_seed(0)
        model = build_model(cfg, graph.node_feat_dim, graph.edge_feat_dim).to(ctx.device)
        opt = build_optimizer(model, lr=1e-4)
        n = [0]
        _COUNT["bytes"].clear()
        _COUNT["calls"].clear()
        with meter.stage(f"train {mode}") as x:
            _COUNT["on"] = True
            run_epoch(model, loader, mb, opt, on_step=lambda _: n.__setitem__(0, n[0] + 1))
            _COUNT["on"] = False
            x["steps"] = n[0]
        exchanges[mode] = {"steps": n[0],
                           "bytes_per_step": {k: round(v / max(n[0], 1)) for k, v in _COUNT["bytes"].items()},
                           "calls_per_step": {k: round(v / max(n[0], 1), 2) for k, v in _COUNT["calls"].items()}}
        del loader, sampler, model, opt
        if mode == "full":
            del tcsr["full"]
    return {"rank": ctx.rank, "base_mib": round(meter.base["VmRSS"], 1), "stages": meter.rows,
            "exchanges": exchanges}


# ---------------------------------------------------------------------- main
def _table(title: str, per_rank: list) -> str:
    """Stages x (seconds, rss, peak) of the rank with the largest peak per stage."""
    names = list(per_rank[0]["stages"])
    lines = [title, f"{'stage':<22} {'s (max rank)':>12} {'rss MiB':>9} {'peak MiB':>9} {'anon MiB':>9}"]
    for s in names:
        rows = [r["stages"][s] for r in per_rank if s in r["stages"]]
        lines.append(f"{s:<22} {max(x['s'] for x in rows):>12.2f} {max(x['rss'] for x in rows):>9.1f} "
                     f"{max(x['peak'] for x in rows):>9.1f} {max(x['anon'] for x in rows):>9.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="example: python benchmarks/scale.py --events 1000000 --parts 1 2")
    ap.add_argument("--events", type=float, nargs="+", default=[1e6, 1e7],
                    help="stream sizes (default: 1e6 1e7)")
    ap.add_argument("--big", action="store_true", help="add a stream of 1e8 events")
    ap.add_argument("--nodes-ratio", type=float, default=0.1, help="nodes per event (default 0.1)")
    ap.add_argument("--edge-dim", type=int, default=0, help="edge feature columns (default 0)")
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 2, 4], help="P values (default 1 2 4)")
    ap.add_argument("--algo", default="metis_for_tgnn", help="partitioning algorithm")
    ap.add_argument("--steps", type=int, default=20, help="training steps per pass (default 20)")
    ap.add_argument("--batch", type=int, default=600, help="global batch size (default 600)")
    ap.add_argument("--modes", nargs="*", default=["partitioned", "full"],
                    help="sampling modes of the training passes")
    ap.add_argument("--full-max-events", type=float, default=1e7,
                    help="skip mode='full' above this many events (default 1e7)")
    ap.add_argument("--skip-ranks", action="store_true", help="only generate and partition")
    ap.add_argument("--generate-only", action="store_true", help="only generate (no partition, no ranks)")
    ap.add_argument("--out", default=None, help="partition folder (default: a temporary one)")
    ap.add_argument("--ranks-only", action="store_true",
                    help="skip generate + partition: use the partitions an earlier run with "
                         "--skip-ranks left in --out")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per distributed run")
    ap.add_argument("--stagger", action="store_true",
                    help="ranks build their partitioned T-CSR one at a time (per-rank figures unchanged)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="device of the training passes' model and mailbox (default cpu)")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            ap.error("--device cuda: CUDA is not available on this machine (no GPU visible)")
    from tgl_dist.testing import run_distributed

    sizes = [int(e) for e in args.events] + ([10 ** 8] if args.big else [])
    tmp = args.out or tempfile.mkdtemp(prefix="tgl_scale_")
    results = []
    try:
        for E in sizes:
            N = max(2, int(E * args.nodes_ratio))
            out = str(Path(tmp) / f"E{E}")
            t0 = time.perf_counter()
            if args.ranks_only:
                if args.out is None or not (Path(out) / "scale").is_dir():
                    ap.error(f"--ranks-only needs --out with the partitions of an earlier "
                             f"--skip-ranks run: {Path(out) / 'scale'} not found")
                prep = {"base_mib": None, "stages": {}}
            else:
                prep = run_distributed(_prepare, 1, N, E, [] if args.generate_only else args.parts,
                                       args.algo, out, args.edge_dim,
                                       timeout=args.timeout)[0]
                print(_table(f"== {E:,} events, {N:,} nodes: generate + partition (one process, "
                             f"{time.perf_counter() - t0:.0f}s)", [prep]), flush=True)
            entry = {"events": E, "nodes": N, "prepare": prep, "ranks": {},
                     "load_avg": os.getloadavg()}
            for P in ([] if args.skip_ranks or args.generate_only else args.parts):
                per_rank = run_distributed(_rank, P, str(Path(out) / "scale"), args.algo, args.steps,
                                           args.batch, args.modes, int(args.full_max_events),
                                           args.stagger, args.device, timeout=args.timeout)
                entry["ranks"][P] = per_rank
                print(_table(f"== {E:,} events, P={P} (largest rank per stage; load "
                             f"{os.getloadavg()[0]:.1f})", per_rank), flush=True)
                for mode in per_rank[0]["exchanges"]:
                    cats = sorted({c for r in per_rank for c in r["exchanges"][mode]["bytes_per_step"]})
                    row = {c: max(r["exchanges"][mode]["bytes_per_step"].get(c, 0) for r in per_rank)
                           for c in cats}
                    print(f"   bytes sent per step ({mode}, largest rank): "
                          + ", ".join(f"{c} {v:,}" for c, v in row.items()), flush=True)
            entry["load_avg_end"] = os.getloadavg()
            results.append(entry)
            if args.out is None:
                shutil.rmtree(out, ignore_errors=True)
    finally:
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"benchmark": "scale", "algo": args.algo, "steps": args.steps,
                      "stagger": args.stagger, "device": args.device,
                      "batch": args.batch, "cpus": os.cpu_count(), "machine": platform.machine(),
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
