"""Benchmark: what a rank holds and spends for TGB's evaluation negatives (``eval_protocol='tgb'``).

Writes a folder in TGB's layout (``tgbl-coin``'s CSV columns ``ts,src,dst,weight``: a
synthetic stream of ``--events`` events over ``--nodes`` nodes) with validation and test
negatives in TGB's format (a pickled dict ``{(src, dst, t): array of q destinations}``,
as ``*_val_ns_v2.pkl`` / ``*_test_ns_v2.pkl``), then for each P in ``--parts``, in P fresh
gloo processes:

- ``setup``: :func:`tgl_dist.ctdg.run.ensure_partition` (rank 0 partitions, and reads
  TGB's pickles once where the partition stores the negatives), ``partition_load`` and
  ``DistributedGraphStore``;
- ``negatives``: :class:`~tgl_dist.ctdg.tgb_protocol.TGBProtocol` (what each rank builds
  at the start of a run under TGB's protocol): seconds, RSS and peak RSS above the RSS
  after ``setup`` (the peak reset before it, ``/proc/self/clear_refs``);
- ``lookup``: one pass over the rank's rows (``FixedNegatives`` of every own event of
  both splits, as evaluation reads them), RSS after it.

Figures are MiB per rank (the largest rank's, and each rank's in the JSON). The script
also runs against an older tgl_dist whose ``TGBProtocol`` read the pickles itself (its
``(name, graph, root)`` signature), which is how the before/after in RESULTS.md was taken.

Run: ``python benchmarks/tgb_negatives.py [--events 2000000] [--nodes 100000] [--q 20]
[--parts 1 2]``. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import inspect
import json
import pickle
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:      # the tgl_dist next to this script (also in spawned ranks)
    sys.path.insert(0, str(ROOT))
BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from scale import Meter, _status  # noqa: E402  (this folder's per-stage meter)

NAME = "tgbl-coin"


def _write_dataset(root: Path, events: int, nodes: int, q: int, seed: int) -> dict:
    """The TGB folder ``root/tgbl_coin``: edge list, val/test pickles; returns sizes."""
    import numpy as np
    from tgl_dist.data.loaders.tgb import load_tgb, tgb_spec
    spec = tgb_spec(NAME)
    folder = root / spec.folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    src = rng.integers(0, nodes, events)
    dst = rng.integers(0, nodes, events)
    t = np.sort(rng.integers(0, 10 * events, events))
    with open(folder / spec.edgelist, "w") as f:
        f.write("ts,src,dst,weight\n")
        np.savetxt(f, np.stack([t, src, dst, np.ones(events, dtype=np.int64)], 1), fmt="%d",
                   delimiter=",")
    g = load_tgb(NAME, root, download=False)
    sizes = {}
    for split in ("val", "test"):
        m = g.masks[split].numpy()
        s, d, ts = (x.numpy()[m] for x in (g.src, g.dst, g.t))
        neg = rng.integers(0, g.num_nodes, (s.size, q))
        table = {k: neg[i] for i, k in enumerate(zip(s.tolist(), d.tolist(),
                                                     ts.astype(np.int64).tolist()))}
        path = folder / spec.negatives(split)
        with open(path, "wb") as f:
            pickle.dump(table, f, protocol=4)
        sizes[split] = {"events": int(s.size), "pkl_mib": round(path.stat().st_size / 2 ** 20, 1)}
        del table, neg
    return {"num_nodes": g.num_nodes, "num_events": g.num_events, **sizes}


def _rank(root: str, parts: str) -> dict:
    from tgl_dist import DistributedContext
    from tgl_dist.ctdg import run
    from tgl_dist.ctdg.tgb_protocol import TGBProtocol
    from tgl_dist.graph import DistributedGraphStore
    from tgl_dist.partition import partition_load
    ctx = DistributedContext.init()
    meter = Meter()
    kw = {"tgb_negatives": True} if "tgb_negatives" in inspect.signature(
        run.ensure_partition).parameters else {}
    with meter.stage("setup"):
        folder = run.ensure_partition(NAME, parts, "hash", root=root,
                                      dataset_kwargs={"download": False}, **kw)
        graph = DistributedGraphStore(partition_load(folder, "hash"))
    old = "root" in inspect.signature(TGBProtocol.__init__).parameters
    base = _status()
    meter.base = base               # the next figures are above the RSS after the setup
    with meter.stage("negatives"):
        proto = TGBProtocol(NAME, graph, root) if old else TGBProtocol(NAME, graph)
    with meter.stage("lookup"):
        rows = 0
        for split, fixed in proto.negatives.items():
            ev = graph.split_events(split)
            bound = fixed.bind(split, False)
            for a in range(0, ev.eid.numel(), 4096):
                neg, _ = bound.rows(ev.eid[a:a + 4096], ev.dst[a:a + 4096])
                rows += int(neg.size(1))
    return {"rank": ctx.rank, "old_api": old, "own_rows": rows, "stages": meter.rows,
            "q": {s: f.num_neg for s, f in proto.negatives.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=2_000_000, help="events (default 2,000,000)")
    ap.add_argument("--nodes", type=int, default=100_000, help="nodes (default 100,000)")
    ap.add_argument("--q", type=int, default=20, help="negatives per event (default 20, "
                    "TGB's for coin, comment, flight)")
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 2], help="process counts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    from tgl_dist.testing import run_distributed
    tmp = Path(tempfile.mkdtemp(prefix="tgl_tgbneg_"))
    out = {"benchmark": "tgb_negatives", "machine": platform.processor() or platform.machine(),
           "events": args.events, "nodes": args.nodes, "q": args.q, "runs": {}}
    try:
        t0 = time.perf_counter()
        out["dataset"] = _write_dataset(tmp / "data", args.events, args.nodes, args.q, args.seed)
        print(f"dataset written in {time.perf_counter() - t0:.0f}s: {out['dataset']}", flush=True)
        print(f"{'P':>2} {'rank':>4} {'setup s':>8} {'setup peak':>10} {'negatives s':>11} "
              f"{'neg rss':>8} {'neg peak':>8} {'lookup rss':>10}   (MiB above the setup)")
        for P in args.parts:
            per = run_distributed(_rank, P, str(tmp / "data"), str(tmp / f"parts{P}"),
                                  timeout=args.timeout)
            for r in per:
                st = r["stages"]
                print(f"{P:>2} {r['rank']:>4} {st['setup']['s']:>8.1f} {st['setup']['peak']:>10.0f} "
                      f"{st['negatives']['s']:>11.2f} {st['negatives']['rss']:>8.1f} "
                      f"{st['negatives']['peak']:>8.1f} {st['lookup']['rss']:>10.1f}", flush=True)
            out["runs"][P] = per
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
