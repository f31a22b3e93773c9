"""Format loaders: one module per on-disk format, each returning a ``TemporalGraph``.

========== ============================================ ===========================
format     files                                        loader
========== ============================================ ===========================
jodie      ``user_id,item_id,timestamp,state_label,..`` :func:`load_jodie`
dyglib     ``ml_<name>.csv`` (+ ``.npy`` features)       :func:`load_dyglib`
snap       ``src dst time`` lines (optional ``.gz``)     :func:`load_snap`
snap-signed ``SOURCE,TARGET,RATING,TIME`` gzip CSV       :func:`load_snap_signed`
csv        header of known names: ``src,dst,t[,...]``   :func:`load_named_csv`
konect     ``out.*`` with ``%`` header lines             :func:`load_konect`
pyg        ``torch.save``-d ``TemporalData``             :func:`load_pyg`
========== ============================================ ===========================

TGB's link datasets are a folder of files, not one file: :func:`load_tgb` reads them
(``load_dataset("tgbl-wiki", root=...)`` calls it), :func:`load_tgb_negatives` their
pre-generated evaluation negatives (:mod:`tgl_dist.data.loaders.tgb`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, Tuple

from tgl_dist.data.loaders._common import (DatasetNotFoundError, PathLike, head_lines,
                                           looks_like_header, require_keys)
from tgl_dist.data.loaders.dyglib import load_dyglib
from tgl_dist.data.loaders.jodie import load_jodie
from tgl_dist.data.loaders.konect import load_konect
from tgl_dist.data.loaders.named_csv import ROLES, column_roles, load_named_csv
from tgl_dist.data.loaders.pyg import from_pyg, load_pyg, to_pyg
from tgl_dist.data.loaders.snap import load_snap
from tgl_dist.data.loaders.snap_signed import load_snap_signed
from tgl_dist.data.loaders.tgb import TGBNegatives, load_tgb, load_tgb_negatives
from tgl_dist.errors import DataFormatError

LOADERS: Dict[str, Callable] = {
    "jodie": load_jodie,
    "dyglib": load_dyglib,
    "snap": load_snap,
    "snap-signed": load_snap_signed,
    "konect": load_konect,
    "pyg": load_pyg,
    "csv": load_named_csv,
}


def get_loader(fmt: str) -> Callable:
    """The loader function of format ``fmt`` (``-``/``_`` interchangeable)."""
    key = fmt.lower().replace("_", "-")
    if key not in LOADERS:
        raise ValueError(f"unknown dataset format {fmt!r}; known formats: {', '.join(LOADERS)}")
    return LOADERS[key]


def infer_format(path: PathLike) -> str:
    """Guess the format of a data file from its name, then from its first lines.

    Rules, in order: ``.pt``/``.pth`` -> pyg; ``ml_*.csv`` -> dyglib; ``out.*`` -> konect;
    ``soc-sign-*`` -> snap-signed; a first line starting with ``%`` -> konect; a header
    ``user_id,...`` -> jodie; a header ``,u,i,ts,...`` (or ``u,i,ts,...`` with an ``idx``
    column) -> dyglib; a header ``SOURCE,TARGET,RATING,TIME`` -> snap-signed; another
    header that names a source, a destination and a time column (``src,dst,t``,
    ``u,i,ts``, ``source,target,time,weight``, any case; see
    :mod:`~tgl_dist.data.loaders.named_csv`) -> csv; data lines with 3 fields -> snap.
    Four comma-separated fields without that name or header are refused: SNAP's signed
    layout has the time last, the common ``src,dst,time,weight`` has it third, and a
    wrong guess would read weights as times without any error.

    :func:`guess_format` also returns the reason, which :func:`tgl_dist.data.load_dataset`
    adds to every format error of a guessed format.

    Raises:
        DataFormatError: when none of the rules decides (pass ``format=`` then).
    """
    return guess_format(path)[0]


def guess_format(path: PathLike) -> Tuple[str, str]:
    """``(format, reason)``: :func:`infer_format`'s guess and what it was guessed from,
    e.g. ``("snap", "3 fields per line")``."""
    path = Path(path)
    n = path.name.lower()
    if n.endswith((".pt", ".pth")):
        return "pyg", f"the file name ending {Path(n).suffix}"
    if n.startswith("ml_") and n.endswith(".csv"):
        return "dyglib", "the file name ml_*.csv"
    if n.startswith("out."):
        return "konect", "the file name out.*"
    if n.startswith("soc-sign-"):
        return "snap-signed", "the file name soc-sign-*"
    if n.endswith(".json"):
        raise DataFormatError(path, "a .json file is snapshot (DTDG) data in PyTorch Geometric "
                              "Temporal's layout: load it with tgl_dist.dtdg.load_pgt_json and "
                              "partition it with GraphData.save_partition (the DTDG examples do "
                              "both), not as an event stream")
    raw = head_lines(path, 50)
    lines = [ln for ln in raw if ln.strip()]
    if not lines:
        raise DataFormatError(path, "empty file: cannot infer its format")
    first = lines[0]
    if first.startswith("%"):
        return "konect", "a first line starting with '%'"
    low = first.lower().replace(" ", "")
    head = f"the header {first.strip()[:60]!r}"
    if low.startswith("user_id,item_id"):
        return "jodie", head
    names = [f.strip() for f in low.split(",")]
    if low.startswith(",u,i,ts") or (low.startswith("u,i,ts") and "idx" in names):
        return "dyglib", head
    if low.startswith("source,target,rating,time"):
        return "snap-signed", head
    data = [ln for ln in lines if not ln.startswith(("#", "%"))]
    # a header after comment lines: the first line that is not a comment
    top = data[0] if data else ""
    fields = [f.strip() for f in (top.split(",") if "," in top else top.split())]
    if fields and looks_like_header(fields):
        head = f"the header {top.strip()[:60]!r}"
        if column_roles(fields) is not None:
            return "csv", head
        raise DataFormatError(
            path, f"{head} names no known layout: a CSV header needs a source, a "
            f"destination and a time column, named {' / '.join(ROLES['src'])}, "
            f"{' / '.join(ROLES['dst'])} and {' / '.join(ROLES['t'])} (any case); rename "
            f"the columns, or pass format= (--format on the command line) one of "
            f"{', '.join(LOADERS)}", line=raw.index(top) + 1)
    if data:
        fields = data[0].replace(",", " ").replace("\t", " ").split()
        if len(fields) == 3:
            return "snap", "3 fields per line"
        if len(fields) == 4 and "," in data[0]:
            raise DataFormatError(
                path, "4 comma-separated fields: the format is ambiguous, so it is not "
                "guessed. format='snap-signed' (--format snap-signed) reads SNAP's signed "
                "layout SOURCE,TARGET,RATING,TIME (time last, rating as an edge feature); "
                "a file with the time in another column reads with a header line naming "
                "the columns, e.g. src,dst,time,weight (format 'csv'); or keep "
                "'src,dst,time' (format='snap')", line=raw.index(data[0]) + 1)
    raise DataFormatError(path, "cannot infer the format from the file name or first lines; pass "
                          f"format= (--format on the command line) one of {', '.join(LOADERS)}",
                          line=1)


def add_guess(err: DataFormatError, fmt: str, why: str) -> DataFormatError:
    """``err`` with the guessed format appended to its message (same type, file, line and
    field), so the reader knows to pass ``--format`` when the guess was wrong."""
    err.args = (f"{err} [read as {fmt}, guessed from {why}; pass format= (--format on the "
                f"command line) to choose another: {', '.join(LOADERS)}]",) + err.args[1:]
    return err


__all__ = [
    "LOADERS", "get_loader", "infer_format", "guess_format", "add_guess", "load_named_csv", "require_keys", "DatasetNotFoundError",
    "load_jodie", "load_dyglib", "load_snap", "load_snap_signed", "load_konect", "load_pyg",
    "from_pyg", "to_pyg", "load_tgb", "load_tgb_negatives", "TGBNegatives",
]
