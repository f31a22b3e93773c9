"""SNAP temporal edge lists: one ``src dst time`` event per line.

Examples: ``CollegeMsg.txt``, ``email-Eu-core-temporal.txt.gz``, ``sx-mathoverflow.txt.gz``
from https://snap.stanford.edu/data/#temporal. Fields may be separated by spaces, tabs or
commas; ``#`` and ``%`` lines are comments; the file may be gzip-compressed.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

from tgl_dist.data.loaders._common import (PathLike, read_table, remap_nodes, node_ids, sort_by_time, stem,
                                           timestamps)
from tgl_dist.data.temporal import TemporalGraph

log = logging.getLogger(__name__)

FIELDS = ("src", "dst", "time")


def load_snap(path: PathLike, name: Optional[str] = None) -> TemporalGraph:
    """Read a SNAP temporal edge list into a :class:`TemporalGraph`.

    Node ids are remapped to ``0..N-1`` in ascending order of the original ids
    (``node_map`` keeps them); events are sorted stably by time.

    Args:
        path: the file (plain or gzip).
        name: dataset name (default: file name without extensions).

    Returns:
        TemporalGraph with no features.

    Raises:
        DataFormatError: a line without exactly 3 fields, a non-numeric or negative id,
            a NaN or negative time (naming the line and field).
    """
    path = Path(path)
    tab = read_table(path, names=FIELDS, min_cols=3, header=False)
    u, v, t = node_ids(tab, 0, "src"), node_ids(tab, 1, "dst"), timestamps(tab, 2, "time")
    E = tab.num_rows
    del tab                                  # the float64 table: free before remapping
    src, dst, node_map = remap_nodes(u, v)
    del u, v
    log.info("read %s: %d events, %d nodes", path, E, node_map.numel())
    return sort_by_time(src, dst, t, num_nodes=int(node_map.numel()), node_map=node_map,
                        name=name or stem(path))

