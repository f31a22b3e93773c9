"""Snapshot edge lists: a header ``snapshot,src,dst[,weight]``, then one edge per line.

The discrete-time (DTDG) counterpart of the event formats: each row is an edge of one
snapshot. This module only parses and checks the file (the data layer knows no snapshot
graph); :func:`tgl_dist.dtdg.load_snapshot_csv` builds the ``GraphData``.

Rules: the first line that is neither blank nor a comment (``#``, ``%``) is the header;
it names the columns ``snapshot``, ``src``, ``dst`` and optionally ``weight`` (any order,
any case, each once, no other column). ``snapshot``, ``src`` and ``dst`` hold
non-negative integers (``3.0`` is read as 3; ``3.5`` is an error), ``weight`` finite
numbers. Fields may be separated by commas, tabs or spaces; the file may be gzip.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from tgl_dist.data.loaders._common import (PathLike, finite_values, head_lines, looks_like_header,
                                           read_table)
from tgl_dist.errors import DataFormatError

REQUIRED = ("snapshot", "src", "dst")
OPTIONAL = ("weight",)
HEADER = "snapshot,src,dst[,weight]"


@dataclass
class SnapshotEdges:
    """The checked columns of a snapshot edge list.

    Attributes:
        snapshot, src, dst: ``[E]`` int64, as written in the file.
        weight: ``[E]`` float64, or ``None`` without a weight column.
        lines: ``[E]`` int64, the 1-based file line of each edge.
        path: the file.
    """

    snapshot: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    weight: Optional[np.ndarray]
    lines: np.ndarray
    path: Path


def is_snapshot_csv(path: PathLike) -> bool:
    """Whether the first line that is neither blank nor a comment is a header whose
    first name is ``snapshot`` (any case): how :func:`tgl_dist.dtdg.load_dtdg` tells this
    format from an event list."""
    for ln in head_lines(path, 64):
        if ln.strip() and ln[:1] not in "#%":
            first = (ln.split(",") if "," in ln else ln.split())[0]
            return first.strip().lower() == "snapshot"
    return False


def _integers(tab, col: int, field: str, what: str) -> np.ndarray:
    x = tab.values[:, col]
    bad = ~np.isfinite(x) | (x < 0) | (x != np.floor(x)) | (x >= 2.0 ** 53)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise tab.error(r, field, f"{what} must be a non-negative integer, got {float(x[r])!r}")
    return x.astype(np.int64)


def read_snapshot_csv(path: PathLike) -> SnapshotEdges:
    """Read and check a snapshot edge list (rules in the module docstring).

    Raises:
        DataFormatError: a missing header or a header without ``snapshot``, ``src`` or
            ``dst`` (naming the header found), an unknown or repeated column, a row with
            another number of fields, a value that is not a number, a negative or
            fractional snapshot or node id, a NaN or infinite weight (naming the file, the
            line and the column).
    """
    path = Path(path)
    head = head_lines(path, 64)
    k = next((i for i, ln in enumerate(head) if ln.strip() and ln[:1] not in "#%"), None)
    if k is None:
        raise DataFormatError(path, f"the file holds no header and no data rows; expected a "
                              f"header {HEADER} and one edge per line")
    fields = [f.strip() for f in (head[k].split(",") if "," in head[k] else head[k].split())]
    shown = ",".join(fields)
    names = [f.lower() for f in fields]
    if not looks_like_header(fields):
        raise DataFormatError(path, f"expected a header {HEADER} on the first line, found the "
                              f"data row {shown!r}", line=k + 1)
    for f in names:
        if f not in REQUIRED + OPTIONAL:
            raise DataFormatError(path, f"header {shown!r}: unknown column {f!r}; expected "
                                  f"{HEADER}", line=k + 1, field=f)
        if names.count(f) > 1:
            raise DataFormatError(path, f"header {shown!r} names column {f!r} twice", line=k + 1,
                                  field=f)
    for f in REQUIRED:
        if f not in names:
            raise DataFormatError(path, f"header {shown!r} has no column {f!r}; expected "
                                  f"{HEADER}", line=k + 1, field=f)
    tab = read_table(path, names=names, min_cols=len(names), header=True)
    col = {f: names.index(f) for f in names}
    weight = None
    if "weight" in col:
        weight = finite_values(tab, col["weight"], "weight", "weight")
    return SnapshotEdges(_integers(tab, col["snapshot"], "snapshot", "snapshot"),
                         _integers(tab, col["src"], "src", "node id"),
                         _integers(tab, col["dst"], "dst", "node id"), weight, np.asarray(tab.lines), path)
