"""DyGLib / DGB files: ``ml_<name>.csv`` + ``ml_<name>.npy`` + ``ml_<name>_node.npy``.

The format of Poursafaei et al. 2022 (EdgeBank / DGB) and Yu et al. 2023 (DyGLib),
published at https://zenodo.org/records/7213796. The CSV is a pandas dump with header
``,u,i,ts,label,idx``: the unnamed first column is the row index, ``u``/``i`` are node
ids counted from 1, ``idx`` is the edge id counted from 1. ``ml_<name>.npy`` holds edge
features ``[E + 1, F_e]`` and ``ml_<name>_node.npy`` node features ``[N + 1, F_n]``;
row 0 of both is padding.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tgl_dist.data.loaders._common import (PathLike, Table, check_finite, int_labels, read_table,
                                           remap_nodes, node_ids, sort_by_time, stem,
                                           timestamps)
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

log = logging.getLogger(__name__)

REQUIRED = ("u", "i", "ts", "idx")


def dyglib_paths(csv_path: PathLike):
    """``(csv, edge_npy, node_npy)`` paths that belong together for ``ml_<name>.csv``."""
    csv_path = Path(csv_path)
    base = stem(csv_path)
    return csv_path, csv_path.with_name(base + ".npy"), csv_path.with_name(base + "_node.npy")


def load_dyglib(path: PathLike, name: Optional[str] = None, edge_features: bool = True,
                node_features: bool = True) -> TemporalGraph:
    """Read DyGLib/DGB ``ml_<name>.csv`` (and its ``.npy`` feature files) into a TemporalGraph.

    Node ids: with a node-feature file of ``N + 1`` rows, the graph has ``N`` nodes and
    original id ``k`` (1-based) becomes ``k - 1`` (DyGLib's node universe, including
    nodes without events; ``node_map = arange(1, N + 1)``). Without it, ids are remapped
    to ``0..N-1`` over the nodes that occur. Edge ``idx`` selects the row of the edge
    feature file (``edge_attr[e] = feats[idx[e]]``).

    Args:
        path: the ``ml_<name>.csv`` file.
        name: dataset name (default: ``<name>`` from ``ml_<name>.csv``).
        edge_features / node_features: read the ``.npy`` files when they exist
            (``False`` skips them).

    Labels are edge classes (0/1 state labels in the published files): a NaN or fractional
    ``label`` is an error.

    Raises:
        DataFormatError: a missing header column, a malformed row, a bad id, time or label,
            a feature file whose row count does not match the events / nodes, that is not
            a real-valued numeric array, or that holds NaN or infinite values.
    """
    csv_path, edge_npy, node_npy = dyglib_paths(path)
    tab = read_table(csv_path, names=("index", "u", "i", "ts", "label", "idx"), min_cols=4, max_cols=-1,
                     header=True)
    header = tab.header or []
    col = {h: k for k, h in enumerate(header)}
    # the data rows may have one more field than the header names (pandas' unnamed index)
    shift = tab.values.shape[1] - len(header)
    for key in REQUIRED:
        if key not in col:
            raise DataFormatError(csv_path, f"header {','.join(header)!r} lacks column '{key}' "
                                  "(expected ',u,i,ts,label,idx')", line=1, field=key)
    if shift not in (0, 1):
        raise DataFormatError(csv_path, f"header has {len(header)} fields but rows have "
                              f"{tab.values.shape[1]}", line=int(tab.lines[0]))
    c = {k: v + shift for k, v in col.items()}
    u, i = node_ids(tab, c["u"], "u"), node_ids(tab, c["i"], "i")
    t = timestamps(tab, c["ts"], "ts")
    idx = node_ids(tab, c["idx"], "idx")
    E = tab.num_rows
    labels = None
    if "label" in c:
        labels = torch.from_numpy(int_labels(tab, c["label"], "label", "label"))

    node_feat = None
    if node_features and node_npy.is_file():
        nf = _load_npy(node_npy)
        N = nf.shape[0] - 1
        _check_ids(tab, (u, i), ("u", "i"), N, node_npy)
        src, dst = torch.from_numpy(u - 1), torch.from_numpy(i - 1)
        node_map = torch.arange(1, N + 1, dtype=torch.long)
        nf = _gather_float32(nf, np.arange(1, nf.shape[0]))
        check_finite(nf, node_npy, "node features", row_offset=1)
        node_feat = torch.from_numpy(nf)
    else:
        src, dst, node_map = remap_nodes(u, i)
        N = int(node_map.numel())

    edge_attr = None
    if edge_features and edge_npy.is_file():
        ef = _load_npy(edge_npy)
        if ef.shape[0] != E + 1:
            raise DataFormatError(edge_npy, f"edge feature file has {ef.shape[0]} rows, expected "
                                  f"{E + 1} ({E} events in {csv_path.name} + 1 padding row 0)",
                                  field="rows")
        _check_ids(tab, (idx,), ("idx",), E, edge_npy)
        ef = _gather_float32(ef, idx)
        check_finite(ef, edge_npy, "edge features", lines=idx)     # names the row of the .npy
        edge_attr = torch.from_numpy(ef)
    log.info("read %s: %d events, %d nodes", csv_path, E, N)
    missing = [f.name for want, f in ((edge_features, edge_npy), (node_features, node_npy))
               if want and not f.is_file()]
    if missing:   # DyGLib ships both files, so a missing one is more likely lost than meant
        log.warning("%s: no %s beside it, so the graph has no %s", csv_path,
                    " and no ".join(missing),
                    "features" if len(missing) == 2 else
                    ("edge features" if missing[0] == edge_npy.name else "node features"))
    base = stem(csv_path)
    return sort_by_time(src, dst, t, num_nodes=N, edge_attr=edge_attr,
                        node_feat=node_feat, labels=labels, node_map=node_map,
                        name=name or (base[3:] if base.startswith("ml_") else base))


_GATHER_ROWS = 1 << 16


def _gather_float32(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a[rows]`` as float32, shape ``[len(rows), F]``, gathered from the memory-mapped
    ``a`` in blocks of rows: no float64 copy of the whole table on the way."""
    out = np.empty((rows.shape[0], a.shape[1]), dtype=np.float32)
    for k in range(0, rows.shape[0], _GATHER_ROWS):
        out[k:k + _GATHER_ROWS] = a[rows[k:k + _GATHER_ROWS]]
    return out


def _load_npy(path: Path) -> np.ndarray:
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DataFormatError(path, f"not a readable .npy array ({exc})") from None
    if a.ndim != 2:
        raise DataFormatError(path, f"expected a 2-d feature array [rows, F], got shape {tuple(a.shape)}")
    if a.dtype.kind not in "biuf":     # strings, objects, complex numbers, dates: not features
        raise DataFormatError(path, f"expected real numbers (int or float) as features, got dtype {a.dtype}")
    return a


def _check_ids(tab: Table, cols, fields, n: int, npy: Path) -> None:
    """Ids must lie in ``1..n`` (row 0 of the feature file is padding); reports the first bad row."""
    bad = np.stack([(c < 1) | (c > n) for c in cols], axis=1)      # [R, len(cols)]
    rows = np.flatnonzero(bad.any(axis=1))
    if rows.size:
        r = int(rows[0])
        k = int(np.flatnonzero(bad[r])[0])
        raise tab.error(r, fields[k], f"id {int(cols[k][r])} outside 1..{n} (the rows of {npy.name}, "
                        "row 0 being padding)")
