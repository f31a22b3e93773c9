"""Build :class:`GraphData` from PyTorch Geometric Temporal JSON files and from CTDG streams.

PyTorch Geometric Temporal (PGT) publishes its datasets as JSON in two layouts;
:func:`load_pgt_json` reads both (it looks at the keys, never at the file name):

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
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional, Union

import numpy as np
import torch
from torch import Tensor

from tgl_dist.data.loaders._common import DatasetNotFoundError
from tgl_dist.dtdg.graph_data import GraphData
from tgl_dist.errors import DataFormatError

SIGNAL_KEYS = ("y", "FX", "X")
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
                  name: Optional[str] = None, fit_fraction: float = 0.7) -> GraphData:
    """Read a PyTorch Geometric Temporal JSON file (either layout) into a :class:`GraphData`.

    Args:
        path: the ``.json`` file.
        lags: node-signal layout only: how many past values form the features (default 4).
        standardize: node-signal layout only: z-score the series per node (default True).
        name: dataset name (default: the file stem).
        fit_fraction: the z-score's mean and std come from this leading share of the
            periods (default 0.7, the training share of :class:`Splitter`'s default; with
            a smaller training share, lower it too, or test values leak into training).

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
    elif any(k in d for k in SIGNAL_KEYS):
        g = _signal_layout(path, d, lags, standardize, fit_fraction)
    else:
        raise DataFormatError(path, "unknown PyTorch Geometric Temporal layout: expected snapshot "
                              "keys '0', '1', ... or a node signal key "
                              f"({', '.join(SIGNAL_KEYS)})")
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


def _signal_layout(path: Path, d: dict, lags: int, standardize: bool,
                   fit_fraction: float = 0.7) -> GraphData:
    key = next(k for k in SIGNAL_KEYS if k in d)
    sig = _floats(path, d[key], key, "a [T, N] matrix of").double()
    if sig.dim() != 2:
        raise DataFormatError(path, f"expected a [T, N] matrix, got shape {tuple(sig.shape)}", field=key)
    T_total, N = sig.shape
    if lags < 1 or lags >= T_total:
        raise ValueError(f"lags must lie in [1, {T_total}) for {path} ({T_total} periods), got {lags}")
    fit = 0
    if standardize:   # statistics of the leading (training) periods only: no leak
        if not 0.0 < fit_fraction <= 1.0:
            raise ValueError(f"fit_fraction must lie in (0, 1], got {fit_fraction}")
        fit = max(2, int(fit_fraction * T_total))
        head = sig[:fit]
        sig = (sig - head.mean(0)) / (head.std(0, unbiased=False) + 1e-10)
    T = T_total - lags
    x = sig.unfold(0, lags, 1)[:T]                      # [T, N, lags]
    x = x.permute(1, 0, 2).float().contiguous()        # [N, T, lags]
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
    """Link-prediction inputs of a node-signal graph: ``[N, T, lags]`` whose snapshot ``s``
    holds the signal of periods ``s - lags + 1 .. s`` (zeros before period 0).

    The signal layout follows PGT: ``x[:, s] = signal[s : s + lags]`` beside the edges of
    period ``s``, which is right for node regression (its target is ``signal[s + lags]``)
    but looks ``lags - 1`` periods past the edges: a link predictor of period ``t`` reading
    snapshots up to ``t - 1`` would see the signal of periods ``t ..``. These features end
    at each snapshot's own period. Built from ``x`` and ``y`` (standardised alike).
    """
    if g.meta().get("layout") != "node_signal":
        raise ValueError(f"past_signal_features needs a node-signal graph (layout "
                         f"'node_signal'), got layout {g.meta().get('layout')!r}")
    x, y = g.node()["x"], g.node()["y"]                          # [N, T, L], [N, T]
    N, T, L = x.shape
    signal = torch.cat([x[:, 0, :], y], 1)                       # periods 0 .. T + L - 1
    padded = torch.cat([signal.new_zeros(N, L - 1), signal], 1)  # column p + L - 1: period p
    return padded.unfold(1, L, 1)[:, :T].contiguous()            # s: periods s - L + 1 .. s


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


def load_dtdg(data: Union[str, Path], root: Union[str, Path, None] = None, lags: int = 4,
              standardize: bool = True, span: Union[float, str, None] = "month",
              num_snapshots: Optional[int] = None) -> GraphData:
    """A snapshot graph from a name or a path.

    Args:
        data: a ``.json`` file (PGT layouts), a folder name under ``root`` holding
            ``<name>.json`` (``-`` and ``_`` interchangeable), or any CTDG dataset
            :func:`tgl_dist.data.load_dataset` reads (name or file), which is then binned
            with :func:`from_temporal` by ``span`` (default calendar months) or ``num_snapshots``.
        root: datasets folder.
        lags, standardize: for PGT node-signal files.
    """
    p = Path(data)
    if p.suffix == ".json":
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such PyTorch Geometric Temporal JSON file")
        return load_pgt_json(p, lags=lags, standardize=standardize)
    if root is not None and not p.exists():
        for stem in {str(data), str(data).replace("-", "_"), str(data).replace("_", "-")}:
            cand = Path(root) / stem / f"{stem}.json"
            if cand.is_file():
                return load_pgt_json(cand, lags=lags, standardize=standardize)
    from tgl_dist.data import load_dataset
    from tgl_dist.data.registry import UnknownDatasetError, known_datasets
    try:
        tg = load_dataset(str(data), root=root, download=False)
    except UnknownDatasetError:   # neither a PGT file under root nor a stream: say what is there
        there = root is not None and Path(root).is_dir()
        pgt = sorted(d.name for d in Path(root).iterdir() if (d / f"{d.name}.json").is_file()) \
            if there else []
        where = (f"{root} holds no {data}/{data}.json" if there
                 else f"the datasets folder {root} does not exist")
        raise DatasetNotFoundError(
            f"unknown dataset {str(data)!r}: {where}; snapshot (PGT JSON) datasets there: "
            f"{', '.join(pgt) or 'none'}; event-stream datasets (binned into snapshots): "
            f"{', '.join(known_datasets())}; or pass a file path") from None
    return from_temporal(tg, span=None if num_snapshots else span, num_snapshots=num_snapshots)
