"""Training curves of CTDG runs as a PNG: loss and train/val/test AP per epoch, EdgeBank's test AP as a line.

Reads what a run folder holds (the metrics CSV, ``summary.json``); used by the
:class:`~tgl_dist.ctdg.Trainer` at the end of a run (``curves.png`` in the run folder)
and by ``python -m tgl_dist.plot RUN [RUN ...]`` (several runs overlaid). matplotlib is
an optional extra (``pip install "tgl_dist[plot]"``): :func:`have_matplotlib` says
whether it is installed; nothing here imports it before a plot is drawn.
"""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

PLOT_HINT = 'pip install "tgl_dist[plot]"'
CURVES = "curves.png"


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported (without importing it)."""
    return importlib.util.find_spec("matplotlib") is not None


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def read_run(run: Union[str, Path]) -> Dict[str, Any]:
    """A run folder (or a metrics CSV) as ``{'name', 'rows': [{column: float}],
    'edgebank_test_ap'}``; the CSV is the summary's ``metrics_csv`` when the folder has
    a ``summary.json``, else ``<run>/metrics.csv``."""
    run = Path(run)
    summary: Dict[str, Any] = {}
    if run.is_dir():
        if (run / "summary.json").is_file():
            summary = json.loads((run / "summary.json").read_text())
        path = Path(summary.get("metrics_csv") or run / "metrics.csv")
        if not path.is_file():
            path = run / "metrics.csv"
    else:
        path = run
    if not path.is_file():
        raise FileNotFoundError(f"{run}: no metrics CSV (expected {path}); pass a run folder "
                                f"(--out of train_tgn.py) or a metrics CSV")
    with open(path, newline="") as fh:
        rows = [{k: _num(v) for k, v in r.items()} for r in csv.DictReader(fh)]
    eb = summary.get("edgebank_test_ap")
    return {"name": run.name if run.is_dir() else run.stem, "rows": rows,
            "edgebank_test_ap": None if eb is None else float(eb)}


def plot_runs(runs: Sequence[Dict[str, Any]], out: Union[str, Path],
              title: Optional[str] = None) -> Path:
    """Draw the runs (:func:`read_run`'s dicts) into ``out`` (PNG): loss on the left;
    train (dotted), val (dashed) and test (solid) AP per epoch on the right, one colour
    per run, EdgeBank's test AP as a horizontal line of the run's colour."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_l, ax_ap) = plt.subplots(1, 2, figsize=(11, 4))
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        rows: List[Dict[str, float]] = run["rows"]
        ep = [r.get("epoch", j) for j, r in enumerate(rows)]
        label = run["name"]
        ax_l.plot(ep, [r.get("train_loss", float("nan")) for r in rows], "o-", color=colour,
                  label=label, markersize=3)
        for key, style in (("train_ap", ":"), ("val_ap", "--"), ("test_ap", "-")):
            ax_ap.plot(ep, [r.get(key, float("nan")) for r in rows], style, color=colour,
                       marker="o", markersize=3, label=f"{label} {key[:-3]}")
        eb = run.get("edgebank_test_ap")
        if eb is not None and eb == eb:
            ax_ap.axhline(eb, color=colour, linestyle="-.", linewidth=1,
                          label=f"{label} EdgeBank test")
    from matplotlib.ticker import MaxNLocator
    for ax in (ax_l, ax_ap):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_l.set(xlabel="epoch", ylabel="training loss", title="loss")
    ax_ap.set(xlabel="epoch", ylabel="AP", title="average precision")
    ax_l.legend(fontsize="small")
    ax_ap.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


__all__ = ["CURVES", "PLOT_HINT", "have_matplotlib", "plot_runs", "read_run"]
