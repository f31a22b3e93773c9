"""Build :class:`GraphData` from PyTorch Geometric Temporal JSON files and from CTDG streams.

PyTorch Geometric Temporal (PGT) publishes its datasets as JSON in three layouts;
:func:`load_pgt_json` reads them all (it looks at the keys, never at the file name):

* **snapshot list** (``twitter_tennis_*``): keys ``"0" .. "T-1"``, each
  ``{"edges": [[src, dst], ...], "weights": [...], "X": [[...] * N], "y": [...]}``,
  plus ``node_ids`` / ``time_periods``. Node features ``x [N, T, F]`` come from ``X``,
  targets ``y [N, T]`` from ``y``, edge weights from ``weights``.
* **node signal** (``england_covid``, ``chickenpox``, ``pedalme_london``): one
  series ``[T_total, N]`` under ``y``, ``FX`` or ``X``; edges either static (``edges`` +
  optional ``weights``) or per period (``edge_mapping.edge_index[str(t)]`` +
  ``edge_mapping.edge_weight[str(t)]``). As in PGT, snapshot ``s`` has features
  ``x[:, s] = signal[s : s + lags].T`` (``[N, lags]``), target ``y[:, s] = signal[s + lags]``
  and, for per-period edges, the edges of period ``s``; ``T = T_total - lags``.
  The series is standardised per node when ``standardize`` is True (PGT does so for
  England COVID only; we do it for every signal file by default), with the mean and
  standard deviation of the first ``fit_fraction`` (0.7) of the periods only: the
  training share of the default split, so no value of the evaluation periods leaks
  into the training inputs (PGT z-scores over the whole series).
* **node-link graph with per-node series** (``montevideo_bus``, as PGT's
  ``MontevideoBusDatasetLoader`` reads it): ``{"nodes": [{"bus_stop": id, "y": [T_total],
  "X": {"y": [T_total], ...}}, ...], "links": [{"source": id, "target": id, "weight": w},
  ...]}``. The graph is static (every snapshot has all links). Link endpoints are node
  ids: the nodes' ``bus_stop`` values when every node has one, else their ``id`` values
  (networkx's ``node_link_data``), else 0-based positions in ``nodes``. Features are the
  lags of ``X[v]`` for each ``v`` in ``feature_vars`` (default ``("y",)``; ``x [N, T,
  lags * len(feature_vars)]``, variable-major), the target is the node's ``target_var``
  series (default ``"y"``), with the same lags and per-node standardisation (training
  share only) as the node-signal layout (PGT z-scores features and targets over the
  whole series).

:func:`load_snapshot_csv` reads a snapshot edge list (``snapshot,src,dst[,weight]`` with a
header; :mod:`tgl_dist.data.loaders.snapshot_csv`), :func:`from_temporal` bins an event
stream, and :func:`load_dtdg` picks one of them from a name or a path.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import List, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from tgl_dist.data.loaders._common import DatasetNotFoundError, stem
from tgl_dist.data.loaders.snapshot_csv import is_snapshot_csv, read_snapshot_csv
from tgl_dist.dtdg.datasets import find_pgt, known_snapshot_datasets, pgt_spec, where_to_get
from tgl_dist.dtdg.graph_data import GraphData
from tgl_dist.errors import DataFormatError

SIGNAL_KEYS = ("y", "FX", "X")
#: layouts whose ``x`` holds ``lags`` past values of a series (see :func:`past_signal_features`)
SIGNAL_LAYOUTS = ("node_signal", "node_series")
SPANS = {"hour": 3600.0, "day": 86400.0, "week": 7 * 86400.0}


def _edges(path, raw, field: str, num_nodes: Optional[int]) -> Tensor:
    """``[[s, d], ...]`` -> ``[2, E]`` int64, validated."""
    if not isinstance(raw, list):
        raise DataFormatError(path, f"expected a list of [src, dst] pairs, got {type(raw).__name__}",
                              field=field)
    if len(raw) == 0:
        return torch.zeros(2, 0, dtype=torch.long)
    try:    # numpy keeps what JSON wrote (int64, or float64 when any id has a fraction)
        a = np.asarray(raw)
    except (TypeError, ValueError, OverflowError) as err:
        raise DataFormatError(path, f"expected a list of integer [src, dst] pairs ({err})",
                              field=field) from None
    if a.dtype.kind == "f":  # 1.0 is id 1; 1.5, NaN or Infinity is no node id (no truncation)
        bad = ~np.isfinite(a) | (a != np.floor(a))
        if bad.any():
            k = np.argwhere(bad)[0]
            raise DataFormatError(path, f"node ids must be integers, got {float(a[tuple(k)])!r} at "
                                  f"{field}{''.join(f'[{i}]' for i in k.tolist())}", field=field)
    elif a.dtype.kind not in "iu":
        raise DataFormatError(path, f"expected a list of integer [src, dst] pairs, got values of type "
                              f"{a.dtype}", field=field)
    e = torch.from_numpy(a.astype(np.int64))
    if e.dim() != 2 or e.size(1) != 2:
        raise DataFormatError(path, f"expected pairs [src, dst], got shape {tuple(e.shape)}", field=field)
    if int(e.min()) < 0 or (num_nodes is not None and int(e.max()) >= num_nodes):
        raise DataFormatError(path, f"node ids must lie in [0, {num_nodes}), got "
                              f"[{int(e.min())}, {int(e.max())}]", field=field)
    return e.t().contiguous()


def _floats(path, raw, field: str, shape_hint: str) -> Tensor:
    """``raw`` as float32; NaN or Infinity (which Python's JSON reader accepts) is an error."""
    try:
        x = torch.tensor(raw, dtype=torch.float32)
    except (TypeError, ValueError) as err:
        raise DataFormatError(path, f"expected {shape_hint} numbers ({err})", field=field) from None
    if not bool(torch.isfinite(x).all()):
        k = torch.nonzero(~torch.isfinite(x))[0]
        raise DataFormatError(path, f"values must be finite numbers, got {x[tuple(k)].item()!r} at "
                              f"{field}{''.join(f'[{i}]' for i in k.tolist())}", field=field)
    return x


def _need(path, d: dict, key: str, where: str = ""):
    if key not in d:
        raise DataFormatError(path, f"missing key '{key}'{where}", field=key)
    return d[key]


def load_pgt_json(path: Union[str, Path], lags: int = 4, standardize: bool = True,
                  name: Optional[str] = None, fit_fraction: float = 0.7,
                  feature_vars: Sequence[str] = ("y",), target_var: str = "y") -> GraphData:
    """Read a PyTorch Geometric Temporal JSON file (any of its layouts) into a :class:`GraphData`.

    Args:
        path: the ``.json`` file.
        lags: node-signal and node-link layouts: how many past values form the features
            (default 4).
        standardize: those layouts: z-score each series per node (default True).
        name: dataset name (default: the file stem).
        fit_fraction: the z-score's mean and std come from this leading share of the
            periods (default 0.7, the training share of :class:`Splitter`'s default; with
            a smaller training share, lower it too, or test values leak into training).
        feature_vars: node-link layout: the keys of each node's ``X`` whose lags form the
            features (default ``("y",)``, as PGT's Montevideo loader).
        target_var: node-link layout: the node key of the target series (default ``"y"``).

    Returns:
        ``GraphData`` with ``node()['x'] [N, T, F]``, ``node()['y'] [N, T]`` (when the file
        has targets), ``edge()['time'] [E]``, ``edge()['weight'] [E]`` and ``meta()`` with
        ``name``, ``num_snapshots``, ``layout``.

    Raises:
        DataFormatError: unreadable JSON, a missing key or a malformed value (names the
            file and the key).
    """
    path = Path(path)
    try:
        with open(path) as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise DataFormatError(path, f"not valid JSON: {e.msg}", line=e.lineno) from None
    except UnicodeDecodeError as e:
        raise DataFormatError(path, f"not a text file (byte {e.start} is not UTF-8); expected "
                              f"JSON") from None
    if not isinstance(d, dict):
        raise DataFormatError(path, f"top level must be an object, got {type(d).__name__}")
    name = name or path.stem
    if "0" in d:
        g = _snapshot_layout(path, d)
    elif "nodes" in d and "links" in d:
        g = _node_link_layout(path, d, lags, standardize, fit_fraction, tuple(feature_vars),
                              target_var)
    elif any(k in d for k in SIGNAL_KEYS):
        g = _signal_layout(path, d, lags, standardize, fit_fraction)
    else:
        raise DataFormatError(path, "unknown PyTorch Geometric Temporal layout: expected snapshot "
                              "keys '0', '1', ..., a node signal key "
                              f"({', '.join(SIGNAL_KEYS)}) or 'nodes' and 'links' (found keys: "
                              f"{', '.join(sorted(map(str, d))[:12]) or 'none'})")
    g.meta()["name"] = name
    g.validate()
    return g


def _snapshot_layout(path: Path, d: dict) -> GraphData:
    T = 0
    while str(T) in d:
        T += 1
    stray = sorted((k for k in d if k.isdigit() and int(k) >= T), key=int)
    if stray:
        raise DataFormatError(path, f"snapshot keys must run '0'..'{T - 1}' without a gap: "
                              f"'{T}' is missing but '{stray[0]}' is present", field=stray[0])
    if "time_periods" in d:
        tp = d["time_periods"]
        if (isinstance(tp, bool) or not isinstance(tp, (int, float))
                or (isinstance(tp, float) and not tp.is_integer())):   # also NaN, Infinity
            raise DataFormatError(path, f"expected an integer number of snapshots, got {tp!r:.40}",
                                  field="time_periods")
        if int(tp) != T:
            raise DataFormatError(path, f"time_periods says {tp} but snapshot keys "
                                  f"'0'..'{T - 1}' are present", field="time_periods")
    first = d["0"]
    if "node_ids" in d:
        if not isinstance(d["node_ids"], (list, dict)):
            raise DataFormatError(path, f"expected a list of node ids, got "
                                  f"{type(d['node_ids']).__name__}", field="node_ids")
        N = len(d["node_ids"])
    elif "X" in first:
        N = len(first["X"])
    else:
        N = None
    eis: List[Tensor] = []
    ws: List[Tensor] = []
    xs: List[Tensor] = []
    ys: List[Tensor] = []
    for t in range(T):
        s = d[str(t)]
        where = f" in snapshot '{t}'"
        e = _edges(path, _need(path, s, "edges", where), f"{t}.edges", N)
        eis.append(e)
        if "weights" in s:
            w = _floats(path, s["weights"], f"{t}.weights", "one weight per edge:")
            if w.numel() != e.size(1):
                raise DataFormatError(path, f"{w.numel()} weights for {e.size(1)} edges",
                                      field=f"{t}.weights")
            ws.append(w)
        if "X" in s:
            x = _floats(path, s["X"], f"{t}.X", "an [N, F] matrix of")
            if x.dim() == 1:
                x = x.view(-1, 1)
            xs.append(x)
        if "y" in s:
            ys.append(_floats(path, s["y"], f"{t}.y", "one target per node:"))
    if N is None:
        N = int(torch.cat(eis, 1).max()) + 1 if eis else 0
    for key, lst in (("X", xs), ("y", ys), ("weights", ws)):
        if lst and len(lst) != T:
            raise DataFormatError(path, f"'{key}' is present in {len(lst)} of {T} snapshots", field=key)
    for t, x in enumerate(xs):
        if x.size(0) != N or x.shape[1:] != xs[0].shape[1:]:
            raise DataFormatError(path, f"expected [{N}, {xs[0].size(1)}] features, got "
                                  f"{tuple(x.shape)}", field=f"{t}.X")
    for t, y in enumerate(ys):
        if tuple(y.shape) != (N,):
            raise DataFormatError(path, f"expected {N} targets (one number per node), got shape "
                                  f"{list(y.shape)}", field=f"{t}.y")
    counts = torch.tensor([e.size(1) for e in eis], dtype=torch.long)
    g = GraphData(torch.cat(eis, 1) if eis else torch.zeros(2, 0, dtype=torch.long), N)
    g.edge()["time"] = torch.repeat_interleave(torch.arange(T), counts)
    if ws:
        g.edge()["weight"] = torch.cat(ws)
    if xs:
        g.node()["x"] = torch.stack(xs, 1)
    if ys:
        g.node()["y"] = torch.stack(ys, 1)
    g.meta().update(num_snapshots=T, periods=T, layout="snapshot_list")
    return g


def _check_lags(path, lags: int, T_total: int) -> None:
    if lags < 1 or lags >= T_total:
        raise ValueError(f"lags must lie in [1, {T_total}) for {path} ({T_total} periods), got {lags}")


def _standardized(sig: Tensor, standardize: bool, fit_fraction: float):
    """``(sig, fit)``: the ``[T_total, N]`` series z-scored per column with the statistics
    of its first ``fit`` periods (the training share: no leak), or unchanged (``fit = 0``)."""
    if not standardize:
        return sig, 0
    if not 0.0 < fit_fraction <= 1.0:
        raise ValueError(f"fit_fraction must lie in (0, 1], got {fit_fraction}")
    fit = max(2, int(fit_fraction * sig.size(0)))
    head = sig[:fit]
    return (sig - head.mean(0)) / (head.std(0, unbiased=False) + 1e-10), fit


def _lag_features(sig: Tensor, lags: int) -> Tensor:
    """``[T_total, N]`` -> ``[N, T_total - lags, lags]``: snapshot ``s`` holds periods
    ``s .. s + lags - 1``."""
    x = sig.unfold(0, lags, 1)[:sig.size(0) - lags]    # [T, N, lags]
    return x.permute(1, 0, 2).float().contiguous()


def _signal_layout(path: Path, d: dict, lags: int, standardize: bool,
                   fit_fraction: float = 0.7) -> GraphData:
    key = next(k for k in SIGNAL_KEYS if k in d)
    sig = _floats(path, d[key], key, "a [T, N] matrix of").double()
    if sig.dim() != 2:
        raise DataFormatError(path, f"expected a [T, N] matrix, got shape {tuple(sig.shape)}", field=key)
    T_total, N = sig.shape
    _check_lags(path, lags, T_total)
    sig, fit = _standardized(sig, standardize, fit_fraction)
    T = T_total - lags
    x = _lag_features(sig, lags)                       # [N, T, lags]
    y = sig[lags:].t().float().contiguous()            # [N, T]
    if "edge_mapping" in d:
        em = d["edge_mapping"]
        eidx = _need(path, em, "edge_index", " in 'edge_mapping'")
        ewt = em.get("edge_weight")
        eis, ws = [], []
        for t in range(T):
            if str(t) not in eidx:
                raise DataFormatError(path, f"no edges for period {t}", field=f"edge_mapping.edge_index.{t}")
            e = _edges(path, eidx[str(t)], f"edge_mapping.edge_index.{t}", N)
            eis.append(e)
            if ewt is not None:
                if str(t) not in ewt:
                    raise DataFormatError(path, f"no weights for period {t}",
                                          field=f"edge_mapping.edge_weight.{t}")
                w = _floats(path, ewt[str(t)], f"edge_mapping.edge_weight.{t}", "one weight per edge:")
                if w.numel() != e.size(1):
                    raise DataFormatError(path, f"{w.numel()} weights for {e.size(1)} edges",
                                          field=f"edge_mapping.edge_weight.{t}")
                ws.append(w)
        counts = torch.tensor([e.size(1) for e in eis], dtype=torch.long)
        ei = torch.cat(eis, 1)
        weight = torch.cat(ws) if ws else None
    else:
        e = _edges(path, _need(path, d, "edges"), "edges", N)
        w = None
        if "weights" in d:
            w = _floats(path, d["weights"], "weights", "one weight per edge:")
            if w.numel() != e.size(1):
                raise DataFormatError(path, f"{w.numel()} weights for {e.size(1)} edges", field="weights")
        counts = torch.full((T,), e.size(1), dtype=torch.long)
        ei = e.repeat(1, T)
        weight = None if w is None else w.repeat(T)
    g = GraphData(ei, N)
    g.edge()["time"] = torch.repeat_interleave(torch.arange(T), counts)
    if weight is not None:
        g.edge()["weight"] = weight
    g.node()["x"] = x
    g.node()["y"] = y
    g.meta().update(num_snapshots=T, periods=T_total, layout="node_signal", signal_key=key, lags=lags,
                    standardized=bool(standardize), standardized_on_periods=fit)
    return g


def _node_link_layout(path: Path, d: dict, lags: int, standardize: bool, fit_fraction: float,
                      feature_vars, target_var: str) -> GraphData:
    """PGT's Montevideo bus layout (module docstring): static links, per-node series."""
    nodes, links = d["nodes"], d["links"]
    for key, v in (("nodes", nodes), ("links", links)):
        if not isinstance(v, list) or not v:
            raise DataFormatError(path, f"expected a non-empty list of objects, got "
                                  f"{type(v).__name__ if not isinstance(v, list) else 'an empty list'}",
                                  field=key)
    if not feature_vars:
        raise ValueError("feature_vars must name at least one series of the nodes' 'X'")
    N = len(nodes)
    ids = None
    for key in ("bus_stop", "id"):
        if all(isinstance(n, dict) and key in n for n in nodes):
            ids = {}
            for i, n in enumerate(nodes):
                v = n[key]
                if not isinstance(v, (str, int)) or isinstance(v, bool) or v in ids:
                    raise DataFormatError(path, f"node ids ({key!r}) must be distinct strings or "
                                          f"integers, got {v!r:.40}", field=f"nodes[{i}].{key}")
                ids[v] = i
            break
    series = {}          # name -> [N][T_total] raw lists, one per feature var and the target
    for i, n in enumerate(nodes):
        if not isinstance(n, dict):
            raise DataFormatError(path, f"expected an object, got {type(n).__name__}",
                                  field=f"nodes[{i}]")
        X = _need(path, n, "X", f" in nodes[{i}]")
        if not isinstance(X, dict):
            raise DataFormatError(path, f"expected an object of series, got {type(X).__name__}",
                                  field=f"nodes[{i}].X")
        for v in feature_vars:
            series.setdefault(f"X.{v}", []).append(_need(path, X, v, f" in nodes[{i}].X"))
        series.setdefault(target_var, []).append(_need(path, n, target_var, f" in nodes[{i}]"))
    mats = {}
    for key, rows in series.items():
        lens = {len(r) if isinstance(r, list) else -1 for r in rows}
        if len(lens) != 1 or -1 in lens:
            i = next(i for i, r in enumerate(rows) if not isinstance(r, list)
                     or len(r) != len(rows[0]))
            raise DataFormatError(path, f"every node's series must be a list of the same length "
                                  f"(nodes[0] has {len(rows[0]) if isinstance(rows[0], list) else '-'}"
                                  f" values)", field=f"nodes[{i}].{key}")
        mats[key] = _floats(path, rows, f"nodes[*].{key}", "[N, T] series of").double().t()
    T_total = mats[target_var].size(0)
    if any(m.size(0) != T_total for m in mats.values()):
        bad = next(k for k, m in mats.items() if m.size(0) != T_total)
        raise DataFormatError(path, f"series {bad!r} has {mats[bad].size(0)} periods, the target "
                              f"{target_var!r} has {T_total}", field=f"nodes[0].{bad}")
    _check_lags(path, lags, T_total)
    fit = 0
    xs = []
    for v in feature_vars:
        m, fit = _standardized(mats[f"X.{v}"], standardize, fit_fraction)
        xs.append(_lag_features(m, lags))
    target, fit = _standardized(mats[target_var], standardize, fit_fraction)
    src, dst, w = [], [], []
    for k, ln in enumerate(links):
        if not isinstance(ln, dict):
            raise DataFormatError(path, f"expected an object, got {type(ln).__name__}",
                                  field=f"links[{k}]")
        for end, out in (("source", src), ("target", dst)):
            v = _need(path, ln, end, f" in links[{k}]")
            if ids is not None:
                if not isinstance(v, (str, int)) or isinstance(v, bool) or v not in ids:
                    raise DataFormatError(path, f"{v!r:.40} is not the id of a node",
                                          field=f"links[{k}].{end}")
                out.append(ids[v])
            elif isinstance(v, int) and not isinstance(v, bool) and 0 <= v < N:
                out.append(v)
            else:
                raise DataFormatError(path, f"expected a node position in [0, {N}) (the nodes "
                                      f"have no 'bus_stop' or 'id'), got {v!r:.40}",
                                      field=f"links[{k}].{end}")
        if "weight" in ln:
            w.append(ln["weight"])
    if w and len(w) != len(links):
        k = next(k for k, ln in enumerate(links) if "weight" not in ln)
        raise DataFormatError(path, f"{len(w)} of {len(links)} links have a weight",
                              field=f"links[{k}].weight")
    T = T_total - lags
    e = torch.tensor([src, dst], dtype=torch.long)
    g = GraphData(e.repeat(1, T), N)
    g.edge()["time"] = torch.arange(T).repeat_interleave(e.size(1))
    if w:
        g.edge()["weight"] = _floats(path, w, "links[*].weight", "one weight per link:").repeat(T)
    g.node()["x"] = torch.cat(xs, -1)
    g.node()["y"] = target[lags:].t().float().contiguous()
    g.meta().update(num_snapshots=T, periods=T_total, layout="node_series", lags=lags,
                    feature_vars=list(feature_vars), target_var=target_var,
                    standardized=bool(standardize), standardized_on_periods=fit)
    if ids is not None:
        g.meta()["node_ids"] = list(ids)
    return g


def degree_features(g: GraphData, log: bool = True) -> Tensor:
    """Per-snapshot ``[in-degree, out-degree]`` of every node, ``[N, T, 2]`` (``log1p`` by default).

    Computed from the full graph (before partitioning), so every rank sees the true degrees.
    Append them to ``x`` with ``g.node()['x'] = torch.cat([g.node()['x'], degree_features(g)], -1)``.
    """
    N, T = g.num_nodes, g.num_snapshots
    src, dst = g.edge_index
    t = g.edge()["time"].long()
    deg_in = torch.bincount(dst * T + t, minlength=N * T).view(N, T).float()
    deg_out = torch.bincount(src * T + t, minlength=N * T).view(N, T).float()
    out = torch.stack([deg_in, deg_out], -1)
    return out.log1p() if log else out


def past_signal_features(g: GraphData) -> Tensor:
    """Link-prediction inputs of a node-signal or node-link graph: ``[N, T, F]`` (the shape
    of ``x``) whose snapshot ``s`` holds each series at periods ``s - lags + 1 .. s``
    (zeros before period 0).

    These layouts follow PGT: ``x[:, s] = series[s : s + lags]`` beside the edges of
    period ``s``, which is right for node regression (its target is ``series[s + lags]``)
    but looks ``lags - 1`` periods past the edges: a link predictor of period ``t`` reading
    snapshots up to ``t - 1`` would see the series of periods ``t ..``. These features end
    at each snapshot's own period. Built from ``x`` alone (it holds periods
    ``0 .. T + lags - 2`` of each series, standardised as loaded).
    """
    if g.meta().get("layout") not in SIGNAL_LAYOUTS:
        raise ValueError(f"past_signal_features needs a node-signal graph (layout "
                         f"{' or '.join(map(repr, SIGNAL_LAYOUTS))}), got layout "
                         f"{g.meta().get('layout')!r}")
    x = g.node()["x"]                                            # [N, T, V * L]
    N, T, F = x.shape
    L = int(g.meta().get("lags", F))
    out = []
    for xv in x.split(L, dim=-1):                                # one series: [N, T, L]
        series = torch.cat([xv[:, 0, :], xv[:, 1:, L - 1]], 1)   # periods 0 .. T + L - 2
        padded = torch.cat([series.new_zeros(N, L - 1), series], 1)  # column p + L - 1: period p
        out.append(padded.unfold(1, L, 1)[:, :T])                # s: periods s - L + 1 .. s
    return torch.cat(out, -1).contiguous()


def load_snapshot_csv(path: Union[str, Path], name: Optional[str] = None,
                      num_nodes: Optional[int] = None) -> GraphData:
    """Read a snapshot edge list (``snapshot,src,dst[,weight]`` with a header) into a
    :class:`GraphData`.

    The file's rules (header, integers, separators) are those of
    :func:`tgl_dist.data.loaders.snapshot_csv.read_snapshot_csv`. Node ids are kept as
    written (``N = max id + 1``, or ``num_nodes``); snapshot numbers are shifted so the
    smallest one is snapshot 0 (``meta()['first_snapshot']`` keeps it: a file numbering
    years 2010..2015 has snapshots 0..5), and numbers without an edge in between are kept
    as empty snapshots, so snapshot ``k`` always means file number ``first_snapshot + k``.
    Edges are sorted stably by snapshot (file order within one).

    Returns:
        ``GraphData`` with ``edge()['time'] [E]``, ``edge()['weight'] [E]`` (float32, with
        a weight column), node features ``x [N, T, 2]`` (``log1p`` in/out degree per
        snapshot, :func:`degree_features`, as for a binned event stream), no targets, and
        ``meta()`` ``name`` (default: the file stem), ``num_snapshots``, ``layout``
        (``'snapshot_csv'``), ``first_snapshot``.

    Raises:
        DataFormatError: a bad header or row (names the file, the line and the column).
        ValueError: ``num_nodes`` not above the largest node id.
    """
    path = Path(path)
    se = read_snapshot_csv(path)
    top = int(max(se.src.max(), se.dst.max()))
    if num_nodes is not None and num_nodes <= top:
        raise ValueError(f"num_nodes={num_nodes} but {path} has node id {top}")
    N = top + 1 if num_nodes is None else int(num_nodes)
    first = int(se.snapshot.min())
    snap = torch.from_numpy(se.snapshot - first)
    order = torch.argsort(snap, stable=True)
    g = GraphData(torch.from_numpy(np.stack([se.src, se.dst]))[:, order], N)
    g.edge()["time"] = snap[order]
    if se.weight is not None:
        g.edge()["weight"] = torch.from_numpy(se.weight).float()[order]
    T = int(snap.max()) + 1
    g.meta().update(name=name or stem(path), num_snapshots=T, layout="snapshot_csv",
                    first_snapshot=first)
    g.node()["x"] = degree_features(g)
    g.validate()
    return g


def _month_index(t: Tensor) -> Tensor:
    months = np.asarray(t.numpy(), dtype="datetime64[s]").astype("datetime64[M]").astype(np.int64)
    return torch.from_numpy(months - months.min())


def from_temporal(tg, span: Union[float, str, None] = None,
                  num_snapshots: Optional[int] = None) -> GraphData:
    """Bin a CTDG :class:`~tgl_dist.data.TemporalGraph` into snapshots.

    Args:
        tg: the event stream (``src, dst, t`` seconds float64, optional ``edge_attr``,
            ``node_feat``).
        span: snapshot length: seconds (float) or ``'hour'``, ``'day'``, ``'week'``,
            ``'month'`` (calendar months, UTC unix seconds). Snapshot ``k`` holds the
            events with ``t0 + k*span <= t < t0 + (k+1)*span``.
        num_snapshots: alternatively, this many equal-width bins over ``[t_min, t_max]``
            (the last one includes ``t_max``). Give exactly one of ``span`` / ``num_snapshots``.

    Returns:
        ``GraphData`` with one edge per event (``edge()['time']`` its snapshot,
        ``edge()['attr']`` its features, ``edge()['eid']`` its event id) and node
        features ``x [N, T, F]``: the static ``node_feat`` repeated per snapshot when
        the stream has them, else ``[log1p(in-degree), log1p(out-degree)]`` of each node
        in each snapshot. Empty snapshots are kept, so snapshot ``k`` always means the
        same time window.
    """
    if (span is None) == (num_snapshots is None):
        raise ValueError("give exactly one of span=... or num_snapshots=...")
    t = tg.t.double()
    E, N = int(tg.src.numel()), int(tg.num_nodes)
    if E == 0:
        raise ValueError("cannot bin an empty event stream into snapshots")
    t0, t1 = float(t.min()), float(t.max())
    if num_snapshots is not None:
        if num_snapshots < 1:
            raise ValueError(f"num_snapshots must be >= 1, got {num_snapshots}")
        width = (t1 - t0) / num_snapshots if t1 > t0 else 1.0
        snap = ((t - t0) / width).floor().long().clamp_(max=num_snapshots - 1)
        span_s = width
    elif span == "month":
        snap = _month_index(t)
        span_s = float("nan")
    else:
        span_s = SPANS.get(span, span) if isinstance(span, str) else float(span)
        if isinstance(span_s, str) or not math.isfinite(span_s) or span_s <= 0:
            raise ValueError(f"span must be a positive number of seconds or one of "
                             f"{sorted(SPANS) + ['month']}, got {span!r}")
        snap = ((t - t0) / span_s).floor().long()
    T = int(snap.max()) + 1
    g = GraphData(torch.stack([tg.src, tg.dst]), N)
    g.edge()["time"] = snap
    g.edge()["eid"] = tg.eid.clone()
    if tg.edge_attr is not None:
        g.edge()["attr"] = tg.edge_attr[tg.eid]
    if tg.node_feat is not None:
        g.node()["x"] = tg.node_feat[:, None, :].expand(N, T, -1).contiguous()
    else:
        g.meta()["num_snapshots"] = T
        g.node()["x"] = degree_features(g)
    g.meta().update(name=getattr(tg, "name", "graph"), num_snapshots=T, t0=t0,
                    span_seconds=span_s if span != "month" else None,
                    span=span if span is not None else f"{num_snapshots} bins")
    g.validate()
    return g


#: the snapshot formats :func:`load_dtdg` reads itself (any other goes to ``load_dataset``)
DTDG_FORMATS = ("pgt-json", "snapshot-csv")


def _guess_note(err: DataFormatError, fmt: str, why: str) -> DataFormatError:
    from tgl_dist.data.loaders import LOADERS
    err.args = (f"{err} [read as {fmt}, guessed from {why}; pass format= (--format on the "
                f"command line) to choose another: {', '.join(DTDG_FORMATS)}, or an event "
                f"format binned into snapshots: {', '.join(LOADERS)}]",) + err.args[1:]
    return err


def _load_file(p: Path, fmt: Optional[str], lags: int, standardize: bool, span,
               num_snapshots: Optional[int]) -> GraphData:
    if fmt is None:
        if p.suffix.lower() == ".json":
            guess, why = "pgt-json", "the file name ending .json"
        elif is_snapshot_csv(p):
            guess, why = "snapshot-csv", "a header starting with 'snapshot'"
        else:
            guess, why = None, ""
        if guess is not None:
            try:
                return _load_file(p, guess, lags, standardize, span, num_snapshots)
            except DataFormatError as err:
                raise _guess_note(err, guess, why) from None
    if fmt == "pgt-json":
        return load_pgt_json(p, lags=lags, standardize=standardize)
    if fmt == "snapshot-csv":
        return load_snapshot_csv(p)
    from tgl_dist.data import load_dataset     # an event file (its errors name a guessed format)
    tg = load_dataset(p, format=fmt, download=False)
    return from_temporal(tg, span=None if num_snapshots else span, num_snapshots=num_snapshots)


def load_dtdg(data: Union[str, Path], root: Union[str, Path, None] = None, lags: int = 4,
              standardize: bool = True, span: Union[float, str, None] = "month",
              num_snapshots: Optional[int] = None, format: Optional[str] = None) -> GraphData:
    """A snapshot graph from a name or a path.

    Args:
        data: a file, or a name. A file is read in ``format``, else by its name and first
            line: ``.json`` -> PGT JSON (:func:`load_pgt_json`, any layout), a header
            starting ``snapshot`` -> snapshot edge list (:func:`load_snapshot_csv`), anything
            else -> an event file read by :func:`tgl_dist.data.load_dataset` (format guessed
            there) and binned with :func:`from_temporal` by ``span`` (default calendar
            months) or ``num_snapshots``. A name is a PGT dataset of
            :mod:`tgl_dist.dtdg.datasets` (``root/<name>/<name>.json``; ``-`` and ``_``
            interchangeable), another folder ``root/<name>/<name>.json``, or any CTDG
            dataset name ``load_dataset`` knows (binned as above).
        root: datasets folder (default :func:`tgl_dist.data.default_root`).
        lags, standardize: for PGT node-signal and node-link files.
        format: ``'pgt-json'``, ``'snapshot-csv'``, or an event format of
            :data:`tgl_dist.data.loaders.LOADERS` (``-``/``_`` interchangeable); ``None``
            guesses, and a format error then names the guess.

    Raises:
        DatasetNotFoundError: a named dataset that is absent: the message says which
            file to put where and the URL to get it from (nothing is downloaded).
        DataFormatError: a malformed file (file, line or key, field).
    """
    from tgl_dist.data.registry import default_root
    fmt = None if format is None else str(format).lower().replace("_", "-")
    if fmt is not None:
        from tgl_dist.data.loaders import LOADERS
        if fmt not in DTDG_FORMATS and fmt not in LOADERS:
            raise ValueError(f"unknown format {format!r}; snapshot formats: "
                             f"{', '.join(DTDG_FORMATS)}; event formats (binned into "
                             f"snapshots): {', '.join(LOADERS)}")
    p = Path(data).expanduser()
    if p.is_file():
        return _load_file(p, fmt, lags, standardize, span, num_snapshots)
    if p.suffix.lower() in (".json", ".csv", ".gz", ".txt", ".tsv") or os.sep in str(data):
        raise DatasetNotFoundError(f"no such file: {p}")
    base = Path(root).expanduser() if root is not None else default_root()
    spec = pgt_spec(str(data))
    if spec is not None:
        found = find_pgt(spec, base)
        if found is None:
            absent = "" if base.is_dir() else f" (the datasets folder {base} does not exist)"
            raise DatasetNotFoundError(f"snapshot dataset '{spec.name}' not found under {base}"
                                       f"{absent}: " + where_to_get(spec, base))
        return _load_file(found, fmt or "pgt-json", lags, standardize, span, num_snapshots)
    for name in {str(data), str(data).replace("-", "_"), str(data).replace("_", "-")}:
        cand = base / name / f"{name}.json"
        if cand.is_file():
            return _load_file(cand, fmt or "pgt-json", lags, standardize, span, num_snapshots)
    from tgl_dist.data import load_dataset
    from tgl_dist.data.registry import UnknownDatasetError, known_datasets
    try:
        tg = load_dataset(str(data), root=base, format=fmt, download=False)
    except UnknownDatasetError:   # neither a PGT file under root nor a stream: say what is there
        there = base.is_dir()
        pgt = sorted(d.name for d in base.iterdir() if (d / f"{d.name}.json").is_file()) \
            if there else []
        where = (f"{base} holds no {data}/{data}.json" if there
                 else f"the datasets folder {base} does not exist")
        raise DatasetNotFoundError(
            f"unknown dataset {str(data)!r}: {where}; snapshot (PGT JSON) datasets there: "
            f"{', '.join(pgt) or 'none'}; known snapshot datasets: "
            f"{', '.join(known_snapshot_datasets())}; event-stream datasets (binned into "
            f"snapshots): {', '.join(known_datasets())}; or pass a file path") from None
    return from_temporal(tg, span=None if num_snapshots else span, num_snapshots=num_snapshots)
