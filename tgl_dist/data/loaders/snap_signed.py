"""SNAP signed networks: ``SOURCE,TARGET,RATING,TIME`` per line, gzip CSV, no header.

Examples: ``soc-sign-bitcoinalpha.csv.gz`` and ``soc-sign-bitcoinotc.csv.gz`` from
https://snap.stanford.edu/data/soc-sign-bitcoin-alpha.html. Rows are not sorted by time
in the published files; many events share a timestamp.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tgl_dist.data.loaders._common import (PathLike, finite_values, node_ids, read_table,
                                           remap_nodes, sort_by_time, stem, timestamps)
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

log = logging.getLogger(__name__)

FIELDS = ("SOURCE", "TARGET", "RATING", "TIME")


def load_snap_signed(path: PathLike, name: Optional[str] = None) -> TemporalGraph:
    """Read a SNAP signed network into a :class:`TemporalGraph`.

    The rating becomes a 1-dim edge feature ``edge_attr [E, 1]`` (float32, unscaled:
    −10..10 for the bitcoin networks). Rows are sorted stably by time (rows with equal
    times keep their file order); node ids are remapped to ``0..N-1`` (``node_map``).

    The published files have no header; a first line in which no field is a number is
    taken as one, and must then read ``SOURCE,TARGET,RATING,TIME`` (any case).

    Raises:
        DataFormatError: a line without 4 fields, a bad id, a NaN rating, a NaN or
            negative time, another header (naming the line and field).
    """
    path = Path(path)
    tab = read_table(path, names=FIELDS, min_cols=4, header="auto")
    if tab.header is not None and [h.upper() for h in tab.header] != list(FIELDS):
        raise DataFormatError(path, f"the first line {','.join(tab.header)!r} is not a data row and not the "
                              f"header {','.join(FIELDS)!r} (the published files have no header)",
                              line=tab.header_line)
    u, v = node_ids(tab, 0, "SOURCE"), node_ids(tab, 1, "TARGET")
    rating = finite_values(tab, 2, "RATING", "rating").astype(np.float32)
    t = timestamps(tab, 3, "TIME")
    E = tab.num_rows
    del tab
    src, dst, node_map = remap_nodes(u, v)
    del u, v
    log.info("read %s: %d events, %d nodes", path, E, node_map.numel())
    return sort_by_time(src, dst, t, num_nodes=int(node_map.numel()),
                        edge_attr=torch.from_numpy(rating).view(-1, 1),
                        node_map=node_map, name=name or stem(path))
