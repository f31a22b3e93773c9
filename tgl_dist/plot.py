"""``python -m tgl_dist.plot RUN [RUN ...]``: overlay the training curves of runs (their run folders' metrics CSVs) in one PNG.

    python -m tgl_dist.plot runs/synthetic_TGN_20261201-120000 runs/synthetic_JODIE_20261201-121500
    python -m tgl_dist.plot runs/a runs/b --out compare.png

Each RUN is a run folder (``--out`` of ``examples/ctdg/train_tgn.py``: ``metrics.csv``,
``summary.json``) or a metrics CSV. Left: training loss per epoch; right: train (dotted),
val (dashed), test (solid) AP per epoch and EdgeBank's test AP (dash-dot), one colour a
run. Needs matplotlib: ``pip install "tgl_dist[plot]"``.
"""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from tgl_dist.ctdg.curves import PLOT_HINT, have_matplotlib, plot_runs, read_run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tgl_dist.plot",
                                description=__doc__.split("\n")[0].split(": ", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Needs matplotlib: " + PLOT_HINT)
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run folders (metrics.csv, summary.json) or metrics CSVs")
    p.add_argument("--out", default="curves.png", metavar="FILE",
                   help="the PNG to write (default: curves.png)")
    p.add_argument("--title", default=None, help="a title above the plots")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if not have_matplotlib():
        print(f"error: plotting needs matplotlib: {PLOT_HINT}", file=sys.stderr)
        return 2
    try:
        runs = [read_run(r) for r in args.runs]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = plot_runs(runs, args.out, args.title)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
