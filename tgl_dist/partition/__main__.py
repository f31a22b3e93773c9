"""Command line: ``python -m tgl_dist.partition --data NAME|PATH --num-parts P --algo ALGO --out OUT``.

Loads a dataset with :func:`tgl_dist.data.load_dataset`, partitions it, writes
``OUT/<name>/<algo>_<P>/`` atomically, prints a per-part summary table and, as the
last line, one JSON object with the statistics. For a TGB dataset (``tgbl-*``) each part
also stores TGB's validation and test negatives of its own events (``--no-tgb-negatives``:
not).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import List, Optional

from tgl_dist.cli import folder_path
from tgl_dist.errors import TGLDistError
from tgl_dist.partition.registry import available_partitioners, get_partitioner


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tgl_dist.partition",
        description="Partition a temporal graph (CTDG) for distributed training. Writes "
                    "OUT/<name>/<algo>_<P>/ (manifest.json, book.pt, part_<r>/...) atomically "
                    "and prints the partition statistics (last line: JSON).",
        epilog="example: python -m tgl_dist.partition --data wikipedia --root \"$TGL_DIST_DATASETS\" "
               "--num-parts 4 --algo metis_for_tgnn --out parts")
    p.add_argument("--data", required=True,
                   help="dataset name (wikipedia, facebook-wall, synthetic, ...) or a file path")
    p.add_argument("--format", default=None,
                   help="file format of a path (jodie, dyglib, snap, snap-signed, konect, pyg); "
                        "default: inferred")
    p.add_argument("--root", default=None,
                   help="folder with the named datasets (default: $TGL_DIST_DATASETS, else "
                        "~/.cache/tgl_dist/datasets)")
    p.add_argument("--num-parts", type=int, required=True, help="number of parts P (= world size)")
    p.add_argument("--algo", default="metis_for_tgnn",
                   help=f"partitioning algorithm: {', '.join(available_partitioners())} "
                        f"(default: metis_for_tgnn)")
    p.add_argument("--out", type=folder_path, default="parts", help="output root (default: ./parts)")
    p.add_argument("--name", default=None, help="dataset folder name under OUT (default: the dataset's name)")
    p.add_argument("--force", action="store_true", help="overwrite an existing partition")
    p.add_argument("--seed", type=int, default=0, help="seed of the algorithm (default: 0)")
    g = p.add_argument_group("built-in synthetic dataset (passed to load_dataset)")
    g.add_argument("--num-nodes", type=int, default=None, help="number of nodes")
    g.add_argument("--num-events", type=int, default=None, help="number of events")
    g.add_argument("--data-seed", type=int, default=None, help="generator seed")
    p.add_argument("--no-tgb-negatives", action="store_true",
                   help="for a TGB dataset (tgbl-*): do not store TGB's validation and test "
                        "negatives with the partition (by default each part keeps its own "
                        "events' lists from the *_val_ns*.pkl / *_test_ns*.pkl files, which "
                        "--eval-protocol tgb needs)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def format_table(stats: dict) -> str:
    """The per-part summary table followed by the aggregate statistics."""
    rows = [("part", "nodes", "events", "halo nodes")]
    for r, (n, e, h) in enumerate(zip(stats["nodes_per_part"], stats["events_per_part"],
                                      stats["halo_per_part"])):
        rows.append((str(r), f"{n:,}", f"{e:,}", f"{h:,}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += [f"balance_nodes  {stats['balance_nodes']:.4f}  (max/mean)",
              f"balance_events {stats['balance_events']:.4f}  (max/mean, event owner = source owner)",
              f"edge_cut       {stats['edge_cut']:.4f}  (fraction of events crossing parts)",
              f"replication    {stats['replication']:.4f}  ((owned + halo) copies per node)",
              f"seconds        {stats['seconds']:.3f}  (algorithm)"]
    return "\n".join(lines)


def _tgb_negatives(graph, root: Optional[str], quiet: bool) -> Optional[dict]:
    """TGB's val/test negatives of ``graph`` when it is a TGB dataset (``None`` for any
    other); a TGB dataset whose negatives files are absent is an error that names them
    (``--no-tgb-negatives`` partitions it without)."""
    from tgl_dist.data.loaders.tgb import TGB_DATASETS, tgb_eval_negatives
    if graph.name not in TGB_DATASETS:
        return None
    if not quiet:
        print(f"reading TGB's validation and test negatives of {graph.name} ...",
              file=sys.stderr, flush=True)
    try:
        return tgb_eval_negatives(graph, root)
    except FileNotFoundError as e:
        raise ValueError(f"{e} (or pass --no-tgb-negatives: the partition then serves "
                         f"--eval-protocol random only)") from None


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        get_partitioner(args.algo)
        if args.num_parts < 1:
            raise ValueError(f"--num-parts must be >= 1, got {args.num_parts}")
        from tgl_dist.data import load_dataset  # lazy: partitioning itself imports no loader
        from tgl_dist.partition.writer import partition_graph

        kw = {k: v for k, v in (("num_nodes", args.num_nodes), ("num_events", args.num_events),
                                ("seed", args.data_seed)) if v is not None}
        t0 = time.perf_counter()
        if not args.quiet:
            print(f"loading {args.data} ...", file=sys.stderr, flush=True)
        graph = load_dataset(args.data, root=args.root, format=args.format, **kw)
        negatives = None if args.no_tgb_negatives else _tgb_negatives(graph, args.root,
                                                                       args.quiet)
        load_s = time.perf_counter() - t0
        path = partition_graph(graph, args.num_parts, args.algo, args.out, force=args.force,
                               seed=args.seed, name=args.name, progress=not args.quiet,
                               eval_negatives=negatives)
    except (TGLDistError, ValueError, OSError) as e:   # OSError: --out not writable
        print(f"error: {e}", file=sys.stderr)
        return 2
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    stats = manifest["stats"]
    print(f"{graph!r} -> {path}")
    print(format_table(stats))
    summary = {"data": manifest["name"], "algo": args.algo, "num_parts": args.num_parts,
               "num_nodes": graph.num_nodes, "num_events": graph.num_events, "path": str(path),
               **{k: stats[k] for k in ("balance_nodes", "balance_events", "edge_cut",
                                        "replication", "seconds", "nodes_per_part",
                                        "events_per_part")},
               **({"tgb_negatives": {s: v["num_neg"] for s, v in
                                     manifest["eval_negatives"].items()}}
                  if manifest.get("eval_negatives") else {}),
               "load_seconds": round(load_s, 3),
               "total_seconds": round(time.perf_counter() - t0, 3)}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
