"""``load_dataset``: one entry point for files, known dataset names and the built-in stream.

Known names are looked up under ``root`` in the layout of the project's shared datasets
folder (one folder per dataset, files as their publishers name them)::

    root/
    ├── wikipedia/wikipedia.csv                      (jodie)
    ├── uci/ml_uci.csv, ml_uci.npy, ml_uci_node.npy  (dyglib)
    ├── collegemsg/CollegeMsg.txt[.gz]               (snap)
    ├── bitcoin_alpha/soc-sign-bitcoinalpha.csv.gz   (snap-signed)
    └── facebook_wall/out.facebook-wosn-wall         (konect)

TGB's link datasets (``tgbl-wiki``, ``tgbl-review``, ``tgbl-coin``, ``tgbl-comment``,
``tgbl-flight``, ...) are read from ``root/tgbl_wiki/`` etc. in py-tgb's layout by
:func:`tgl_dist.data.loaders.tgb.load_tgb` (with TGB's split; their pre-generated
negatives by :func:`~tgl_dist.data.loaders.tgb.load_tgb_negatives`).

A missing dataset is downloaded from its canonical public URL into that layout when the
network allows (``download=True``, short timeout, written atomically); otherwise the error
says which file to put where and where to get it.
"""
from __future__ import annotations

import inspect
import logging
import os
import shutil
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from tgl_dist.data.loaders import add_guess, get_loader, guess_format
from tgl_dist.data.loaders._common import DatasetNotFoundError
from tgl_dist.data.loaders.tgb import TGB_DATASETS, load_tgb
from tgl_dist.data.synthetic import generate_synthetic
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

log = logging.getLogger(__name__)

DEFAULT_ROOT = Path.home() / ".cache" / "tgl_dist" / "datasets"
ROOT_ENV = "TGL_DIST_DATASETS"


def default_root() -> Path:
    """Where named datasets are looked up (and downloaded to) when no ``root`` is given.

    ``$TGL_DIST_DATASETS`` when set, else ``~/.cache/tgl_dist/datasets``. Every command
    line of the project (``python -m tgl_dist.partition``, the examples, the benchmarks)
    uses this same default for its ``--root``.
    """
    env = os.environ.get(ROOT_ENV)
    return Path(env).expanduser() if env else DEFAULT_ROOT
DOWNLOAD_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class DatasetSpec:
    """Where a known dataset lives and where it comes from.

    Args:
        name: canonical name (``-`` separated, lower case).
        format: loader format.
        folder: folder under ``root``.
        files: file names; the first that exists is read (the others are alternatives).
        extra: further files of the same dataset (e.g. DyGLib feature ``.npy`` files).
        url: canonical public download URL.
        archive: ``None`` (``url`` is the file itself, saved as ``files[-1]``), ``"tar"`` or
            ``"zip"`` (members named like ``files[0]`` and ``extra`` are extracted).
        page: human-readable page about the dataset.
    """

    name: str
    format: str
    folder: str
    files: Tuple[str, ...]
    url: str
    extra: Tuple[str, ...] = ()
    archive: Optional[str] = None
    page: str = ""


def _jodie(name: str) -> DatasetSpec:
    return DatasetSpec(name, "jodie", name, (f"{name}.csv",), f"http://snap.stanford.edu/jodie/{name}.csv",
                       page="http://snap.stanford.edu/jodie/")


def _dyglib(name: str, dg: str) -> DatasetSpec:
    return DatasetSpec(name, "dyglib", name.replace("-", "_"), (f"ml_{dg}.csv",),
                       f"https://zenodo.org/records/7213796/files/{dg}.zip?download=1",
                       extra=(f"ml_{dg}.npy", f"ml_{dg}_node.npy"), archive="zip",
                       page="https://zenodo.org/records/7213796")


def _snap(name: str, file: str, fmt: str = "snap") -> DatasetSpec:
    plain = file[:-3] if file.endswith(".gz") and fmt == "snap" else None
    files = (plain, file) if plain else (file,)
    return DatasetSpec(name, fmt, name.replace("-", "_"), files, f"https://snap.stanford.edu/data/{file}",
                       page="https://snap.stanford.edu/data/")


KNOWN: Dict[str, DatasetSpec] = {s.name: s for s in [
    _jodie("wikipedia"), _jodie("reddit"), _jodie("mooc"), _jodie("lastfm"),
    _dyglib("uci", "uci"), _dyglib("enron", "enron"), _dyglib("social-evo", "SocialEvo"),
    _dyglib("flights", "Flights"), _dyglib("can-parl", "CanParl"), _dyglib("us-legis", "USLegis"),
    _dyglib("un-trade", "UNtrade"), _dyglib("un-vote", "UNvote"), _dyglib("contacts", "Contacts"),
    _snap("bitcoin-alpha", "soc-sign-bitcoinalpha.csv.gz", "snap-signed"),
    _snap("bitcoin-otc", "soc-sign-bitcoinotc.csv.gz", "snap-signed"),
    _snap("collegemsg", "CollegeMsg.txt.gz"),
    _snap("email-eu", "email-Eu-core-temporal.txt.gz"),
    _snap("sx-mathoverflow", "sx-mathoverflow.txt.gz"),
    _snap("sx-askubuntu", "sx-askubuntu.txt.gz"),
    _snap("sx-superuser", "sx-superuser.txt.gz"),
    _snap("wiki-talk", "wiki-talk-temporal.txt.gz"),
    DatasetSpec("facebook-wall", "konect", "facebook_wall", ("out.facebook-wosn-wall",),
                "http://konect.cc/files/download.tsv.facebook-wosn-wall.tar.bz2", archive="tar",
                page="http://konect.cc/networks/facebook-wosn-wall/"),
]}


def known_datasets() -> List[str]:
    """Names :func:`load_dataset` knows (plus TGB's ``tgbl-*`` and ``synthetic``)."""
    return sorted(KNOWN) + sorted(TGB_DATASETS) + ["synthetic"]


class UnknownDatasetError(DatasetNotFoundError, ValueError):
    """Neither a file nor a known dataset name (a ``ValueError`` too, as before)."""


def _call(fn, what: str, kw: dict, *args):
    """``fn(*args, **kw)``, after refusing keywords ``fn`` does not take with a
    ``ValueError`` that names them and what it takes (not a ``TypeError`` from inside)."""
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        bad = sorted(set(kw) - set(params))
        if bad:
            takes = [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY
                     or (p.kind is p.POSITIONAL_OR_KEYWORD and n != "path")]
            hint = (" (num_nodes, num_events and seed are for the 'synthetic' dataset)"
                    if {"num_nodes", "num_events"} & set(bad) and fn is not generate_synthetic else "")
            raise ValueError(f"{what} takes no argument {', '.join(bad)}; it takes "
                             f"{', '.join(takes) or 'none'}{hint}")
    return fn(*args, **kw)


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def load_dataset(name_or_path: Union[str, Path], root: Union[str, Path, None] = None,
                 format: Optional[str] = None, download: bool = True, **kw) -> TemporalGraph:
    """Load a temporal graph from a file, a known dataset name, or the built-in generator.

    Args:
        name_or_path: a file path (read in ``format``, or the format inferred from its
            name and first lines), a directory holding one data file, a known name
            (``wikipedia``, ``uci``, ``bitcoin-alpha``, ``collegemsg``, ``facebook-wall``,
            TGB's ``tgbl-wiki``, ``tgbl-review``, ``tgbl-coin``, ``tgbl-comment``,
            ``tgbl-flight``, ...;
            ``-`` and ``_`` are interchangeable, see :func:`known_datasets`), or
            ``synthetic``.
        root: folder of the datasets for known names (default :func:`default_root`:
            ``$TGL_DIST_DATASETS``, else ``~/.cache/tgl_dist/datasets``).
        format: ``jodie``, ``dyglib``, ``snap``, ``snap-signed``, ``konect``, ``pyg`` or
            ``csv`` (a header of known column names); guessed when ``None`` (every format
            error then names the guessed format and what it was guessed from).
        download: fetch a missing known dataset from its public URL into ``root``.
        **kw: passed to the loader, or to :func:`generate_synthetic` (``num_nodes``,
            ``num_events``, ``seed``, ...) for ``synthetic``.

    Returns:
        TemporalGraph with ``num_nodes``, ``num_events`` and the 70/15/15 split masks.

    Raises:
        DatasetNotFoundError: the file or dataset is absent and could not be downloaded.
        DataFormatError: the file is malformed (names file, line and field).
        ValueError: unknown name or format.
    """
    key = _norm(str(name_or_path))
    if key == "synthetic":
        if format not in (None, "synthetic"):
            raise ValueError(f"'synthetic' is generated, not read: format={format!r} makes no sense")
        return _call(generate_synthetic, "the synthetic generator", kw)
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return _load_file(path, format, kw)
    if path.is_dir() and key not in KNOWN:
        return _load_dir(path, format, kw)
    if key in TGB_DATASETS and not path.exists():
        if format not in (None, "tgb"):
            raise ValueError(f"{key} is a TGB dataset, read in TGB's layout: format={format!r} "
                             "makes no sense")
        base = Path(root).expanduser() if root is not None else default_root()
        return _call(load_tgb, "the TGB loader", {"download": download, **kw}, key, base)
    if key in KNOWN:
        spec = KNOWN[key]
        base = Path(root).expanduser() if root is not None else default_root()
        found = _find(spec, base)
        if found is None:
            found = _fetch(spec, base, download)
        kw.setdefault("name", spec.name)
        fmt = format or spec.format
        return _call(get_loader(fmt), f"the {fmt} loader", kw, found)
    if os.sep in str(name_or_path) or path.suffix:
        raise DatasetNotFoundError(f"no such file: {path}")
    raise UnknownDatasetError(f"unknown dataset {str(name_or_path)!r}: not a file and not a "
                              f"known name; known names: {', '.join(known_datasets())}")


def _folders(spec: DatasetSpec, base: Path) -> List[Path]:
    names = [spec.folder, spec.folder.replace("_", "-"), spec.folder.replace("-", "_"),
             spec.name, spec.name.replace("-", "_")]
    out: List[Path] = []
    for n in names:
        if base / n not in out:
            out.append(base / n)
    return out + [base]


def _find(spec: DatasetSpec, base: Path) -> Optional[Path]:
    for folder in _folders(spec, base):
        for f in spec.files:
            if (folder / f).is_file():
                return folder / f
    return None


def _where(spec: DatasetSpec, base: Path) -> str:
    extra = f" (with {', '.join(spec.extra)} beside it)" if spec.extra else ""
    alt = f" or {spec.files[1]}" if len(spec.files) > 1 else ""
    how = {None: "", "tar": " (a tar.bz2 archive: extract " + spec.files[0] + " from it)",
           "zip": " (a zip archive: extract " + ", ".join((spec.files[0],) + spec.extra) + " from it)"}
    return (f"put {spec.files[0]}{alt}{extra} into {base / spec.folder}/; get it from {spec.url}"
            f"{how[spec.archive]}" + (f", see {spec.page}" if spec.page else ""))


def _fetch(spec: DatasetSpec, base: Path, download: bool) -> Path:
    if not download:
        raise DatasetNotFoundError(f"dataset '{spec.name}' not found under {base} (downloads disabled): "
                                   + _where(spec, base))
    folder = base / spec.folder
    created, d = [], folder                     # folders this call creates (innermost first)
    while not d.exists():
        created.append(d)
        d = d.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if spec.archive is None:
            dest = folder / spec.files[-1]
            _download(spec.url, dest)
            return dest
        tmp = folder / f".{spec.name}.{os.getpid()}.archive.part"
        try:
            _download(spec.url, tmp)
            _extract(tmp, spec.archive, (spec.files[0],) + spec.extra, folder)
        finally:
            tmp.unlink(missing_ok=True)
        return folder / spec.files[0]
    except (urllib.error.URLError, OSError, TimeoutError, tarfile.TarError, zipfile.BadZipFile) as exc:
        for d in created:                       # leave no empty folders behind
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise DatasetNotFoundError(f"dataset '{spec.name}' not found under {base} and downloading "
                                   f"{spec.url} failed ({exc}): " + _where(spec, base)) from None


def _download(url: str, dest: Path) -> None:
    """Download ``url`` to ``dest`` atomically (a temporary file renamed at the end)."""
    log.info("downloading %s -> %s", url, dest)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as resp, open(part, "wb") as out:
            shutil.copyfileobj(resp, out, 1 << 20)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


def _extract(archive: Path, kind: str, wanted: Tuple[str, ...], folder: Path) -> None:
    """Extract members whose base name is in ``wanted`` into ``folder`` (atomically each)."""
    got = set()
    if kind == "tar":
        with tarfile.open(archive, "r:*") as tf:
            for m in tf.getmembers():
                base = Path(m.name).name
                if m.isfile() and base in wanted and base not in got:
                    _write_atomic(folder / base, tf.extractfile(m))
                    got.add(base)
    else:
        with zipfile.ZipFile(archive) as zf:
            for m in zf.infolist():
                base = Path(m.filename).name
                if not m.is_dir() and base in wanted and base not in got:
                    with zf.open(m) as src:
                        _write_atomic(folder / base, src)
                    got.add(base)
    if wanted[0] not in got:
        raise OSError(f"the archive holds no {wanted[0]}")


def _write_atomic(dest: Path, src) -> None:
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    try:
        with open(part, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


def _load_dir(path: Path, format: Optional[str], kw) -> TemporalGraph:
    """A directory holding exactly one data file (DyGLib ``.npy`` files go with their CSV)."""
    cands = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                   and not p.name.endswith((".npy", ".md", ".json", ".txt.md")))
    if len(cands) != 1:
        raise DatasetNotFoundError(f"{path} is a directory with {len(cands)} candidate data files "
                                   f"({', '.join(c.name for c in cands[:8])}); pass the file itself")
    kw.setdefault("name", path.name)
    return _load_file(cands[0], format, kw)


def _load_file(path: Path, format: Optional[str], kw) -> TemporalGraph:
    """``path`` read in ``format``, or in the guessed one: then a format error says which
    format was guessed and from what (a wrong guess is fixed with ``format=``)."""
    if format is not None:
        return _call(get_loader(format), f"the {format} loader", kw, path)
    fmt, why = guess_format(path)
    try:
        return _call(get_loader(fmt), f"the {fmt} loader", kw, path)
    except DataFormatError as err:
        raise add_guess(err, fmt, why) from None
