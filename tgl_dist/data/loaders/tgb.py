"""TGB link property prediction datasets (``tgbl-*``), read as ``py-tgb`` reads them.

The Temporal Graph Benchmark (Huang et al. 2023, https://tgb.complexdatalab.com/) ships each
dataset as a zip of CSV and pickle files; ``py-tgb``'s ``LinkPropPredDataset`` keeps them in
``<root>/<name with '_' for '-'>/``::

    root/tgbl_wiki/
    ├── tgbl-wiki_edgelist_v2.csv       events (version-2 datasets carry ``_v2``)
    ├── tgbl-wiki_val_ns_v2.pkl         pre-generated validation negatives
    └── tgbl-wiki_test_ns_v2.pkl        pre-generated test negatives
    root/tgbl_flight/airport_node_feat_v2.csv   (tgbl-flight only: node features)
    root/tgbl_comment/tgbl-comment_edgelist.csv (version 1: no ``_v2`` in the names)

This module reproduces ``py-tgb`` 2.3.0 (``tgb/linkproppred/dataset.py``,
``tgb/utils/pre_process.py``) column by column, without importing it (it needs ``pandas``,
which ``py-tgb`` installs too):

* ``tgbl-wiki`` (and the v1 ``tgbl-uci``, ``-enron``, ``-subreddit``, ``-lastfm``), JODIE
  layout ``user,item,timestamp,state_label,features...`` with a header: sources keep their
  ids, destinations are shifted by ``max(source) + 1``; the features are columns 5 on; the
  state label is dropped.
* ``tgbl-review``, ``tgbl-coin``: ``ts,src,dst,weight``; node names are numbered in order
  of first appearance (each row's source before its destination); the edge feature is
  ``log2(weight)`` with a zero weight read as 1.
* ``tgbl-comment``: ``ts,src,dst,num_words,score``; edge features
  ``[num_words/5000, num_words/5000, score]`` (py-tgb broadcasts the one word count into
  both of its two feature columns, then appends the weight, the score).
* ``tgbl-flight``: ``day,src,dst,callsign,typecode``; ``day`` is a unix time or a
  ``%Y-%m-%d`` date (read as local midnight, as py-tgb does, decided by the first row);
  the 16 edge features encode the callsign and typecode characters (digits as themselves,
  ``!`` padding as -1, letters as ``ord(upper) - 35``); node features (20 per airport)
  from ``airport_node_feat_v2.csv``.

Timestamps are truncated to integers (py-tgb's ``astype(int)``). Node ids are TGB's own ids
(``node_map`` is the identity), so TGB's negatives need no translation. The split is TGB's:
``val_time, test_time = np.quantile(t, [0.70, 0.85])``, train ``t <= val_time``,
validation ``val_time < t <= test_time``, test ``t > test_time``.
"""
from __future__ import annotations

import csv
import datetime
import logging
import os
import pickle
import shutil
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from tgl_dist.data.loaders._common import DatasetNotFoundError, PathLike
from tgl_dist.data.negatives import EventNegatives
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

log = logging.getLogger(__name__)

_URL = "https://object-arbutus.alliancecan.ca/swift/v1/14c95234f6cd4a21a47deafe20cce2a7/tgb/"
PAGE = "https://tgb.complexdatalab.com/"
DOWNLOAD_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TGBSpec:
    """One TGB link dataset: its file version, parser, download URL and TGB's negative count.

    Args:
        name: TGB's name (``tgbl-wiki``).
        version: TGB's file version (2: file names end in ``_v2``).
        kind: the py-tgb parser it goes through (``wiki``, ``sc``, ``rc``, ``flight``).
        url: the zip TGB's ``tgb/utils/info.py`` lists.
        num_neg: negatives per positive in TGB's released val/test files (for messages).
    """

    name: str
    version: int
    kind: str
    url: str
    num_neg: int = 0

    @property
    def folder(self) -> str:
        """Folder under ``root`` (py-tgb: the name with ``_`` for ``-``)."""
        return self.name.replace("-", "_")

    def _v(self) -> str:
        return f"_v{self.version}" if self.version > 1 else ""

    @property
    def edgelist(self) -> str:
        return f"{self.name}_edgelist{self._v()}.csv"

    @property
    def nodefile(self) -> Optional[str]:
        return f"airport_node_feat{self._v()}.csv" if self.name == "tgbl-flight" else None

    def negatives(self, split: str) -> str:
        return f"{self.name}_{split}_ns{self._v()}.pkl"

    @property
    def files(self) -> Tuple[str, ...]:
        out = (self.edgelist,) + ((self.nodefile,) if self.nodefile else ())
        return out + (self.negatives("val"), self.negatives("test"))


def _spec(name: str, version: int, kind: str, zipname: Optional[str] = None, q: int = 0) -> TGBSpec:
    return TGBSpec(name, version, kind, _URL + (zipname or f"{name}.zip"), q)


TGB_DATASETS: Dict[str, TGBSpec] = {s.name: s for s in [
    _spec("tgbl-wiki", 2, "wiki", "tgbl-wiki-v2.zip", 12000),
    _spec("tgbl-review", 2, "sc", "tgbl-review-v2.zip", 100),
    _spec("tgbl-coin", 2, "sc", "tgbl-coin-v2.zip", 20),
    _spec("tgbl-comment", 1, "rc", None, 20),
    _spec("tgbl-flight", 2, "flight", "tgbl-flight-v2.zip", 20),
    _spec("tgbl-uci", 1, "wiki"),
    _spec("tgbl-enron", 1, "wiki"),
    _spec("tgbl-subreddit", 1, "wiki"),
    _spec("tgbl-lastfm", 1, "wiki"),
]}


def tgb_spec(name: str) -> TGBSpec:
    """The :class:`TGBSpec` of a TGB link dataset name (``_`` and ``-`` interchangeable)."""
    key = name.strip().lower().replace("_", "-")
    if key not in TGB_DATASETS:
        raise ValueError(f"unknown TGB link dataset {name!r}; known: {', '.join(TGB_DATASETS)}")
    return TGB_DATASETS[key]


def _where(spec: TGBSpec, base: Path) -> str:
    return (f"put {', '.join(spec.files)} into {base / spec.folder}/ (the files of TGB's zip "
            f"{spec.url}, extracted), or pass as root py-tgb's own datasets folder (tgb/datasets/ "
            f"in the installed package), where its LinkPropPredDataset('{spec.name}') downloads "
            f"them; see {PAGE}")


def tgb_folder(name: str, root: PathLike, download: bool = False) -> Path:
    """The folder holding dataset ``name``'s edge list under ``root``.

    Looked up in ``root/<folder>`` (py-tgb's layout, e.g. ``root/tgbl_wiki``), then
    ``root/<name>``, then ``root`` itself. When absent and ``download`` is true, TGB's zip
    is fetched (with a progress bar, a short timeout) and extracted into ``root/<folder>``.

    Raises:
        DatasetNotFoundError: absent (and not downloaded): says which files to put where
            and TGB's URL for them.
    """
    spec = tgb_spec(name)
    base = Path(root).expanduser()
    for folder in (base / spec.folder, base / spec.name, base):
        if (folder / spec.edgelist).is_file():
            return folder
    if not download:
        raise DatasetNotFoundError(f"TGB dataset '{spec.name}' not found under {base}: no "
                                   f"{spec.edgelist} (downloads disabled): " + _where(spec, base))
    return _fetch(spec, base)


def _fetch(spec: TGBSpec, base: Path) -> Path:
    folder = base / spec.folder
    created, d = [], folder                     # folders this call creates (innermost first)
    while not d.exists():
        created.append(d)
        d = d.parent
    part = folder / f".{spec.name}.{os.getpid()}.zip.part"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _download(spec.url, part)
        with zipfile.ZipFile(part) as zf:
            wanted = set(spec.files)
            got = set()
            for m in zf.infolist():
                b = Path(m.filename).name
                if not m.is_dir() and b in wanted and b not in got:
                    tmp = folder / f".{b}.{os.getpid()}.part"
                    with zf.open(m) as src, open(tmp, "wb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
                    os.replace(tmp, folder / b)
                    got.add(b)
        if spec.edgelist not in got:
            raise OSError(f"the archive holds no {spec.edgelist}")
        return folder
    except (urllib.error.URLError, OSError, TimeoutError, zipfile.BadZipFile) as exc:
        part.unlink(missing_ok=True)
        for d in created:                       # leave no empty folders behind
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise DatasetNotFoundError(f"TGB dataset '{spec.name}' not found under {base} and "
                                   f"downloading {spec.url} failed ({exc}): "
                                   + _where(spec, base)) from None
    finally:
        part.unlink(missing_ok=True)


def _download(url: str, dest: Path) -> None:
    """``url`` to ``dest`` with a tqdm progress bar; socket timeout ``DOWNLOAD_TIMEOUT_S``."""
    from tqdm import tqdm
    log.info("downloading %s -> %s", url, dest)
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp, open(dest, "wb") as out:
        total = int(resp.headers.get("content-length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=Path(url).name) as bar:
            while True:
                chunk = resp.read(1 << 20)
                if not chunk:
                    break
                out.write(chunk)
                bar.update(len(chunk))


# ---------------------------------------------------------------------- parsing
def _pandas():
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas comes with py-tgb
        raise ImportError("reading TGB's files needs pandas: pip install pandas "
                          "(or pip install py-tgb, which installs it)") from None
    return pd


def _read_csv(path: Path, what: str, **kw):
    pd = _pandas()
    try:
        return pd.read_csv(path, **kw)
    except (ValueError, pd.errors.ParserError) as exc:
        raise DataFormatError(path, f"cannot read it as TGB's {what} CSV ({exc})") from None


def _row_error(path: Path, row: int, field: str, msg: str) -> DataFormatError:
    # row 0 is the line after the header
    return DataFormatError(path, msg, line=row + 2, field=field)


def _check_ints(path: Path, x: np.ndarray, field: str) -> np.ndarray:
    """``x`` as int64 (truncated as py-tgb's ``astype(int)``); refuses NaN / infinite /
    negative values naming the line."""
    x = np.asarray(x)
    if x.dtype.kind == "f":
        bad = ~np.isfinite(x)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise _row_error(path, r, field, f"expected a finite number, got {x[r]!r}")
    if x.dtype.kind not in "iuf":
        raise DataFormatError(path, f"column '{field}' holds text, expected numbers", field=field)
    v = x.astype(np.int64)
    if v.size and v.min() < 0:
        r = int(np.argmin(v))
        raise _row_error(path, r, field, f"expected a non-negative number, got {x[r]!r}")
    return v


def _number_ids(src: np.ndarray, dst: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Names -> ids in order of first appearance, each row's source before its
    destination (py-tgb's ``node_ids`` dictionary)."""
    pd = _pandas()
    both = np.empty(2 * src.size, dtype=object)
    both[0::2], both[1::2] = src, dst
    codes, _ = pd.factorize(both, sort=False)
    codes = codes.astype(np.int64)
    return codes[0::2], codes[1::2]


def _parse_wiki(path: Path):
    df = _read_csv(path, "JODIE-layout", skiprows=1, header=None)
    if df.shape[1] < 4:
        raise DataFormatError(path, f"expected at least 4 columns (user, item, timestamp, "
                              f"state_label[, features]), found {df.shape[1]}", line=2)
    src = _check_ints(path, df.iloc[:, 0].values, "user")
    dst = _check_ints(path, df.iloc[:, 1].values, "item")
    dst = dst + int(src.max()) + 1 if src.size else dst
    t = _check_ints(path, df.iloc[:, 2].values, "timestamp")
    msg = df.iloc[:, 4:].values
    feat = None
    if msg.shape[1]:
        try:
            feat = msg.astype(np.float64)
        except (ValueError, TypeError):
            raise DataFormatError(path, "edge features (columns 5 on) must be numbers") from None
        _check_finite_rows(path, feat, "edge features")
    return src, dst, t, feat, None


def _check_finite_rows(path: Path, x: np.ndarray, what: str) -> None:
    ok = np.isfinite(x).reshape(x.shape[0], -1).all(axis=1)
    if not ok.all():
        r = int(np.flatnonzero(~ok)[0])
        raise _row_error(path, r, what, f"{what} must be finite numbers")


def _parse_sc(path: Path):
    """py-tgb's ``csv_to_pd_data_sc`` (tgbl-review, tgbl-coin): ts, src, dst, weight."""
    df = _read_csv(path, "ts,src,dst,weight", skiprows=1, header=None,
                   dtype={1: str, 2: str, 3: str}, keep_default_na=False, na_filter=False)
    if df.shape[1] < 4:
        raise DataFormatError(path, f"expected 4 columns (ts, src, dst, weight), found "
                              f"{df.shape[1]}", line=2)
    t = _check_ints(path, _numeric(path, df.iloc[:, 0], "ts"), "ts")
    src, dst = _number_ids(df.iloc[:, 1].values, df.iloc[:, 2].values)
    w = _floats(path, df.iloc[:, 3].values, "weight")
    w = np.where(w == 0, 1.0, w)
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        r = int(np.flatnonzero(bad)[0])
        raise _row_error(path, r, "weight", f"weight must be a finite number >= 0 (its log2 is "
                                            f"the edge feature), got {w[r]!r}")
    with np.errstate(divide="ignore"):
        feat = np.log2(w).reshape(-1, 1)
    return src, dst, t, feat, None


def _numeric(path: Path, col, field: str) -> np.ndarray:
    x = col.values
    if x.dtype.kind in "iuf":
        return x
    pd = _pandas()
    v = pd.to_numeric(col, errors="coerce").values
    bad = np.flatnonzero(np.isnan(v.astype(np.float64)))
    if bad.size:
        r = int(bad[0])
        raise _row_error(path, r, field, f"{x[r]!r} is not a number")
    return v


def _floats(path: Path, x: np.ndarray, field: str) -> np.ndarray:
    """Text to float64 through Python's ``float`` (correctly rounded, as py-tgb reads it)."""
    try:
        return x.astype(np.float64)
    except ValueError:
        for r, v in enumerate(x.tolist()):
            try:
                float(v)
            except ValueError:
                raise _row_error(path, r, field, f"{v!r} is not a number") from None
        raise


def _parse_rc(path: Path):
    """py-tgb's ``csv_to_pd_data_rc`` (tgbl-comment): ts, src, dst, num_words, score."""
    df = _read_csv(path, "ts,src,dst,num_words,score", skiprows=1, header=None,
                   dtype={1: str, 2: str}, keep_default_na=False, na_filter=False)
    if df.shape[1] < 5:
        raise DataFormatError(path, f"expected 5 columns (ts, src, dst, num_words, score), "
                              f"found {df.shape[1]}", line=2)
    t = _check_ints(path, _numeric(path, df.iloc[:, 0], "ts"), "ts")
    src, dst = _number_ids(df.iloc[:, 1].values, df.iloc[:, 2].values)
    words = _numeric(path, df.iloc[:, 3], "num_words").astype(np.int64) / 5000
    score = _numeric(path, df.iloc[:, 4], "score").astype(np.int64).astype(np.float64)
    feat = np.stack([words, words, score], axis=1)
    return src, dst, t, feat, None


def _str2int(s: str) -> List[float]:
    """py-tgb's ``convert_str2int``: digits as themselves, ``!`` as -1, else ord(upper) - 35."""
    return [float(c) if c.isnumeric() else (-1.0 if c == "!" else float(ord(c.upper()) - 44 + 9))
            for c in s]


def _parse_flight(path: Path, nodefile: Optional[Path]):
    """py-tgb's ``csv_to_pd_data`` (tgbl-flight) and ``process_node_feat``."""
    pd = _pandas()
    df = _read_csv(path, "day,src,dst,callsign,typecode", skiprows=1, header=None, dtype=str,
                   keep_default_na=False, na_filter=False)
    if df.shape[1] < 5:
        raise DataFormatError(path, f"expected 5 columns (day, src, dst, callsign, typecode), "
                              f"found {df.shape[1]}", line=2)
    days = df.iloc[:, 0].values
    codes, uniq = pd.factorize(days, sort=False)
    unix = len(uniq) > 0 and str(days[0]).isdigit()
    vals = np.empty(len(uniq), dtype=np.float64)
    for i, d in enumerate(uniq):
        try:
            vals[i] = (float(int(d)) if unix else
                       datetime.datetime.strptime(d, "%Y-%m-%d").timestamp())
        except ValueError:
            r = int(np.flatnonzero(codes == i)[0])
            want = "a unix time like the first row" if unix else "a %Y-%m-%d date"
            raise _row_error(path, r, "day", f"{d!r} is not {want}") from None
    t = vals[codes].astype(np.int64)
    src, dst = _number_ids(df.iloc[:, 1].values, df.iloc[:, 2].values)
    feat = np.zeros((len(df), 16), dtype=np.float64)
    for col, off, name in ((3, 0, "callsign"), (4, 8, "typecode")):
        c, u = pd.factorize(df.iloc[:, col].values, sort=False)
        enc = np.zeros((len(u), 8))
        for i, s in enumerate(u):
            s = s if s else "!" * 8
            s = s + "!" * max(0, 8 - len(s))
            if len(s) > 8:
                if col == 4:
                    s = "!" * 8
                else:
                    r = int(np.flatnonzero(c == i)[0])
                    raise _row_error(path, r, name, f"callsign {s.rstrip('!')!r} is longer than "
                                                    "8 characters (py-tgb cannot encode it either)")
            enc[i] = _str2int(s)
        feat[:, off:off + 8] = enc[c]
    node_feat = None
    if nodefile is not None:
        names = np.empty(2 * len(df), dtype=object)
        names[0::2], names[1::2] = df.iloc[:, 1].values, df.iloc[:, 2].values
        _, order = pd.factorize(names, sort=False)
        node_feat = _flight_node_feat(nodefile, {n: i for i, n in enumerate(order)})
    return src, dst, t, feat, node_feat


def _flight_node_feat(path: Path, node_ids: Dict[str, int]) -> np.ndarray:
    """py-tgb's ``process_node_feat``: per airport, one-hot type, one-hot continent, the
    region code's characters (padded with ``!`` to 7) and longitude, latitude (20 values)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    types: Dict[str, int] = {}
    conts: Dict[str, int] = {}
    for row in rows:
        if row and row[0] in node_ids:
            types.setdefault(row[1], len(types))
            conts.setdefault(row[2], len(conts))
    out = np.zeros((len(node_ids), 20))
    for k, row in enumerate(rows):
        if not row or row[0] not in node_ids:
            continue
        tv = np.zeros(len(types))
        tv[types[row[1]]] = 1
        cv = np.zeros(len(conts))
        cv[conts[row[2]]] = 1
        region = row[3] + "!" * max(0, 7 - len(row[3]))
        try:
            coords = [float(row[4]), float(row[5])]
        except (ValueError, IndexError):
            raise DataFormatError(path, "longitude and latitude must be numbers", line=k + 2,
                                  field="longitude") from None
        final = np.concatenate([tv, cv, _str2int(region), coords])
        if final.size != 20:
            raise DataFormatError(path, f"the airport's features have {final.size} values, "
                                  "TGB's layout has 20 (types + continents + 7 region "
                                  "characters + 2 coordinates)", line=k + 2, field="iso_region")
        out[node_ids[row[0]]] = final
    return out


def load_tgb(name: str, root: Optional[PathLike] = None, download: bool = True) -> TemporalGraph:
    """Read a TGB link dataset from TGB's files into a :class:`TemporalGraph`.

    Args:
        name: ``tgbl-wiki``, ``tgbl-review``, ``tgbl-coin``, ``tgbl-comment``,
            ``tgbl-flight`` (also ``tgbl-uci``, ``-enron``, ``-subreddit``, ``-lastfm``).
        root: folder holding ``<folder>/`` as py-tgb lays it out (see :func:`tgb_folder`);
            default :func:`tgl_dist.data.default_root`.
        download: fetch TGB's zip from its URL when the files are absent.

    Returns:
        TemporalGraph with TGB's node ids, integer times (as float64), ``edge_attr`` as
        py-tgb's ``edge_feat`` (float32), ``node_feat`` for tgbl-flight, and TGB's
        train/val/test masks (the inductive masks follow DyGLib's rule on the same split,
        see :meth:`TemporalGraph.split`).

    Raises:
        DatasetNotFoundError: files absent (names them, where to put them, TGB's URL).
        DataFormatError: a malformed file (names file, line and field).
    """
    spec = tgb_spec(name)
    if root is None:
        from tgl_dist.data.registry import default_root
        root = default_root()
    folder = tgb_folder(spec.name, root, download)
    path = folder / spec.edgelist
    if spec.kind == "wiki":
        src, dst, t, feat, node_feat = _parse_wiki(path)
    elif spec.kind == "sc":
        src, dst, t, feat, node_feat = _parse_sc(path)
    elif spec.kind == "rc":
        src, dst, t, feat, node_feat = _parse_rc(path)
    else:
        nf = folder / spec.nodefile
        if not nf.is_file():
            raise DatasetNotFoundError(f"TGB dataset '{spec.name}': {path} is there but its node "
                                       f"features {nf} are not: " + _where(spec, Path(root)))
        src, dst, t, feat, node_feat = _parse_flight(path, nf)
    if src.size == 0:
        raise DataFormatError(path, "the file holds no events")
    return _graph(spec.name, src, dst, t, feat, node_feat)


def tgb_split_masks(t: np.ndarray, val_ratio: float = 0.15,
                    test_ratio: float = 0.15) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TGB's ``generate_splits``: ``val_time, test_time = np.quantile(t, [1 - val - test,
    1 - test])``; train ``t <= val_time``, val ``val_time < t <= test_time``, test the rest."""
    val_time, test_time = list(np.quantile(t, [(1 - val_ratio - test_ratio), (1 - test_ratio)]))
    return t <= val_time, np.logical_and(t <= test_time, t > val_time), t > test_time


def _graph(name, src, dst, t, feat, node_feat) -> TemporalGraph:
    train, val, test = tgb_split_masks(t)
    if t.size > 1 and (np.diff(t) < 0).any():      # TGB's files are sorted; keep order if so
        order = np.argsort(t, kind="stable")
        src, dst, t, train, val, test = (a[order] for a in (src, dst, t, train, val, test))
        feat = None if feat is None else feat[order]
    N = int(max(src.max(), dst.max())) + 1
    g = TemporalGraph(torch.from_numpy(src), torch.from_numpy(dst),
                      torch.from_numpy(t.astype(np.float64)), num_nodes=N,
                      edge_attr=None if feat is None else torch.from_numpy(feat.astype(np.float32)),
                      node_feat=None if node_feat is None else torch.from_numpy(
                          node_feat.astype(np.float32)),
                      node_map=torch.arange(N), name=name)
    tgb = {"train": torch.from_numpy(train), "val": torch.from_numpy(val),
           "test": torch.from_numpy(test)}
    if any(not torch.equal(g.masks[k], v) for k, v in tgb.items()):   # pragma: no cover
        log.warning("%s: TGB's numpy quantiles differ from TemporalGraph.split's; keeping TGB's "
                    "train/val/test masks", name)
        g.masks.update(tgb)
    return g


# -------------------------------------------------------------------- negatives
#: TGB's lists of one split are :class:`~tgl_dist.data.negatives.EventNegatives` rows
TGBNegatives = EventNegatives


_NUMPY_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"), ("builtins", "set"), ("builtins", "frozenset"),
    ("_codecs", "encode"),          # protocol-2 pickles carry array bytes as latin-1 text
}


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles dicts, tuples, numbers and numpy arrays/scalars only: a pickle is code, and a
    negatives file from elsewhere must not run any."""

    def find_class(self, module, name):
        if (module, name) in _NUMPY_GLOBALS or (module == "numpy" and name.endswith("dtype")) \
                or (module.startswith("numpy") and name.endswith("DType")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: TGB's negatives files "
                                     "hold only a dict of numpy arrays")


def read_tgb_negatives_file(path: PathLike) -> dict:
    """The dict ``{(src, dst, t): array of negative destinations}`` of a TGB ``*_ns*.pkl``
    file (loaded with a restricted unpickler: numpy arrays and plain values only)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"no such file: {path}")
    try:
        with open(path, "rb") as f:
            d = _SafeUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise DataFormatError(path, f"not a TGB negatives pickle ({exc})") from None
    if not isinstance(d, dict):
        raise DataFormatError(path, f"expected a dict {{(src, dst, t): negatives}}, got "
                              f"{type(d).__name__}")
    return d


def load_tgb_negatives(name: str, split: str, graph: TemporalGraph,
                       root: Optional[PathLike] = None) -> TGBNegatives:
    """TGB's pre-generated negatives for the events of ``split`` of ``graph``, in order.

    Reads ``<name>_<split>_ns[_v2].pkl`` as py-tgb's ``NegativeEdgeSampler.load_eval_set``
    does and looks every event ``(src, dst, t)`` up as its ``query_batch`` does (events
    with the same triple share one list, the file's).

    Args:
        name: the TGB dataset (``tgbl-wiki``, ...).
        split: ``'val'`` or ``'test'``.
        graph: the graph :func:`load_tgb` returned (TGB's node ids and integer times).
        root: as for :func:`load_tgb`.

    Returns:
        :class:`TGBNegatives` (``dst [P, q]``, ``-1``-padded, tgl_dist node ids).

    Raises:
        DatasetNotFoundError: the file is absent (names it and TGB's URL).
        DataFormatError: not a TGB negatives dict, an event without negatives, a negative
            outside ``[0, num_nodes)``.
    """
    m = graph.masks[split] if split in ("val", "test") else None
    if m is None:
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    return tgb_negatives_for_events(name, split, graph.src[m], graph.dst[m], graph.t[m],
                                    graph.eid[m], graph.num_nodes, root)


def tgb_negatives_for_events(name: str, split: str, src: Tensor, dst: Tensor, t: Tensor,
                             eid: Tensor, num_nodes: int,
                             root: Optional[PathLike] = None) -> TGBNegatives:
    """TGB's pre-generated negatives of some events of ``split`` (e.g. one rank's share).

    What :func:`load_tgb_negatives` does for the whole split, for the events given: each
    event ``(src[i], dst[i], t[i])`` is looked up in ``<name>_<split>_ns[_v2].pkl``.

    Args:
        name: the TGB dataset. split: ``'val'`` or ``'test'``.
        src, dst, t, eid: ``[P]`` the events (TGB's node ids, integer times), ``eid``
            increasing (the rows of :class:`TGBNegatives` follow it).
        num_nodes: node ids of the negatives must lie in ``[0, num_nodes)``.
        root: as for :func:`load_tgb`.

    Returns / Raises: as :func:`load_tgb_negatives`.
    """
    spec = tgb_spec(name)
    path = tgb_negatives_path(name, split, root)
    table = read_tgb_negatives_file(path)
    eid = torch.as_tensor(eid, dtype=torch.long).reshape(-1)
    keys = zip(torch.as_tensor(src).tolist(), torch.as_tensor(dst).tolist(),
               torch.as_tensor(t).long().tolist())
    lists = []
    for i, key in enumerate(keys):
        v = table.get(key)
        if v is None:
            raise DataFormatError(path, f"event {i} of the {split} split, (src, dst, t) = {key}, "
                                  f"has no negatives in the file: is it the negatives file of "
                                  f"this dataset and version ({spec.edgelist})?")
        lists.append(v)
    lens = np.fromiter((len(v) for v in lists), dtype=np.int64, count=len(lists))
    q = int(lens.max()) if lens.size else 0
    if lens.size and (lens == q).all():
        arr = np.asarray(np.stack([np.asarray(v) for v in lists]) if q else
                         np.zeros((len(lists), 0)))
    else:
        arr = np.full((len(lists), q), -1.0)
        flat = np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in lists]) \
            if lists else np.zeros(0)
        rows = np.repeat(np.arange(len(lists)), lens)
        cols = np.arange(flat.size) - np.repeat(np.cumsum(lens) - lens, lens)
        arr[rows, cols] = flat
    pad = arr == -1 if not (lens == q).all() else np.zeros(arr.shape, dtype=bool)
    vals = arr[~pad]
    if vals.size and (not np.isfinite(vals).all() or (vals != np.floor(vals)).any()
                      or vals.min() < 0 or vals.max() >= num_nodes):
        raise DataFormatError(path, f"negatives must be node ids in [0, {num_nodes}); "
                              f"found values in [{vals.min()}, {vals.max()}]")
    return TGBNegatives(split, eid.clone(), torch.from_numpy(arr.astype(np.int64)),
                        negatives_source(path))


def tgb_eval_negatives(graph: TemporalGraph, root: Optional[PathLike] = None
                       ) -> Dict[str, EventNegatives]:
    """TGB's validation and test negatives of every event of those splits of ``graph`` (a
    TGB dataset, ``graph.name`` its TGB name), one split read at a time, each kept as
    int32 where the node ids fit: what a partition stores
    (``partition_graph(..., eval_negatives=...)``).

    Returns:
        ``{'val': EventNegatives, 'test': EventNegatives}`` (``dst [S, q]``).

    Raises: as :func:`load_tgb_negatives`.
    """
    out = {}
    for split in ("val", "test"):
        neg = load_tgb_negatives(graph.name, split, graph, root)
        if graph.num_nodes <= 2 ** 31:   # ids < num_nodes fit
            neg.dst = neg.dst.to(torch.int32)
        out[split] = neg
    return out


def tgb_negatives_path(name: str, split: str, root: Optional[PathLike] = None) -> Path:
    """The file of TGB's pre-generated ``split`` negatives of dataset ``name``:
    ``<root>/<folder>/<name>_<split>_ns[_v2].pkl`` (or under ``root/<name>``, ``root``).

    Raises:
        ValueError: ``split`` is not ``'val'`` or ``'test'``.
        DatasetNotFoundError: absent (names the file, where to put it, TGB's URL).
    """
    if split not in ("val", "test"):
        raise ValueError(f"split must be 'val' or 'test', got {split!r}")
    spec = tgb_spec(name)
    if root is None:
        from tgl_dist.data.registry import default_root
        root = default_root()
    base = Path(root).expanduser()
    folder = next((f for f in (base / spec.folder, base / spec.name, base)
                   if (f / spec.negatives(split)).is_file()), None)
    if folder is None:
        raise DatasetNotFoundError(f"TGB dataset '{spec.name}': no {spec.negatives(split)} under "
                                   f"{base / spec.folder}: " + _where(spec, base))
    return folder / spec.negatives(split)


def negatives_source(path: PathLike) -> Dict[str, object]:
    """``{'file': name, 'bytes': size}`` of a negatives file: what a partition records to
    notice, on the next run, that the file was replaced (another version of TGB's)."""
    path = Path(path)
    return {"file": path.name, "bytes": int(path.stat().st_size)}


__all__ = ["TGB_DATASETS", "TGBSpec", "TGBNegatives", "tgb_spec", "tgb_folder", "load_tgb",
           "load_tgb_negatives", "tgb_eval_negatives", "tgb_negatives_for_events", "tgb_negatives_path",
           "negatives_source", "read_tgb_negatives_file", "tgb_split_masks"]
