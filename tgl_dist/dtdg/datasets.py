"""The named snapshot (DTDG) datasets: where :func:`~tgl_dist.dtdg.load_dtdg` looks for them
and where to get them.

All are PyTorch Geometric Temporal's JSON files (MIT licence), one folder per dataset
under the datasets root (``-`` and ``_`` interchangeable in the name)::

    root/
    ├── chickenpox/chickenpox.json
    ├── pedalme_london/pedalme_london.json
    ├── england_covid/england_covid.json
    ├── twitter_tennis_rg17/twitter_tennis_rg17.json
    ├── twitter_tennis_uo17/twitter_tennis_uo17.json
    └── montevideo_bus/montevideo_bus.json

Nothing is downloaded: a missing file raises
:class:`~tgl_dist.data.DatasetNotFoundError` naming the file to put where and its URL.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

PGT_RAW = "https://raw.githubusercontent.com/benedekrozemberczki/pytorch_geometric_temporal/master/dataset/"


@dataclass(frozen=True)
class PGTSpec:
    """A PyTorch Geometric Temporal dataset.

    Args:
        name: folder and file stem (``_`` separated).
        loader: the PGT class that reads it (named in the error, for orientation).
        url: the raw file on GitHub (PGT's ``dataset/`` folder).
    """

    name: str
    loader: str

    @property
    def file(self) -> str:
        return f"{self.name}.json"

    @property
    def url(self) -> str:
        return PGT_RAW + self.file


PGT_DATASETS: Dict[str, PGTSpec] = {s.name: s for s in [
    PGTSpec("chickenpox", "ChickenpoxDatasetLoader"),
    PGTSpec("pedalme_london", "PedalMeDatasetLoader"),
    PGTSpec("england_covid", "EnglandCovidDatasetLoader"),
    PGTSpec("twitter_tennis_rg17", "TwitterTennisDatasetLoader(event_id='rg17')"),
    PGTSpec("twitter_tennis_uo17", "TwitterTennisDatasetLoader(event_id='uo17')"),
    PGTSpec("montevideo_bus", "MontevideoBusDatasetLoader"),
]}


def pgt_spec(name: str) -> Optional[PGTSpec]:
    """The spec of a named snapshot dataset (``-``/``_`` and case ignored), or ``None``."""
    return PGT_DATASETS.get(str(name).strip().lower().replace("-", "_"))


def find_pgt(spec: PGTSpec, root: Path) -> Optional[Path]:
    """``root/<name>/<name>.json`` (or ``root/<name>.json``) when it is a file."""
    for cand in (root / spec.name / spec.file, root / spec.name.replace("_", "-") / spec.file,
                 root / spec.file):
        if cand.is_file():
            return cand
    return None


def where_to_get(spec: PGTSpec, root: Path) -> str:
    """The message part that says which file to put where, and its origin URL."""
    return (f"put {spec.file} into {root / spec.name}/; get it from {spec.url} (PyTorch "
            f"Geometric Temporal's {spec.loader} reads the same file)")


def known_snapshot_datasets() -> List[str]:
    return sorted(PGT_DATASETS)
