"""KONECT ``out.*`` files: ``%`` header lines, then ``src dst [weight [time]]`` per line.

Example: ``out.facebook-wosn-wall`` from http://konect.cc/networks/facebook-wosn-wall/
(download ``http://konect.cc/files/download.tsv.facebook-wosn-wall.tar.bz2``). Fields
may be separated by spaces, tabs or commas (the facebook-wall copy in the shared
datasets uses commas). The second header line, when it reads ``% E N1 N2``, gives the
number of edges, which is checked against the rows read (a truncated download fails).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from tgl_dist.data.loaders._common import (PathLike, finite_values, head_lines, read_table, remap_nodes, node_ids,
                                           sort_by_time, timestamps)
from tgl_dist.errors import DataFormatError
from tgl_dist.data.temporal import TemporalGraph

log = logging.getLogger(__name__)

FIELDS = ("src", "dst", "weight", "time")


def load_konect(path: PathLike, name: Optional[str] = None, check_header: bool = True) -> TemporalGraph:
    """Read a KONECT ``out.*`` file into a :class:`TemporalGraph`.

    The weight column becomes ``edge_attr [E, 1]`` only when it is not all ones (KONECT
    writes weight 1 for unweighted multigraphs such as facebook-wosn-wall, which then
    have no edge features). A file without the 4th (time) column is not temporal and is
    refused. Node ids are remapped to ``0..N-1`` (``node_map``); events are sorted stably
    by time.

    Args:
        path: the ``out.*`` file (plain or gzip).
        name: dataset name (default: the file name after ``out.``).
        check_header: compare the edge count of a ``% E N1 N2`` header line with the rows.

    Raises:
        DataFormatError: no time column, a malformed line, a bad id or time, or a row
            count that differs from the header's edge count.
    """
    path = Path(path)
    tab = read_table(path, names=FIELDS, min_cols=2, max_cols=4, header=False, comments="%#")
    if tab.values.shape[1] < 4:
        raise DataFormatError(path, f"KONECT file has {tab.values.shape[1]} columns (src dst [weight]) and no "
                              "time column: it is not a temporal network", line=int(tab.lines[0]),
                              field="time")
    u, v = node_ids(tab, 0, "src"), node_ids(tab, 1, "dst")
    w = finite_values(tab, 2, "weight", "weight")
    t = timestamps(tab, 3, "time")
    E = tab.num_rows
    if check_header:
        _check_edge_count(path, E)
    edge_attr = None if bool((w == 1).all()) else torch.from_numpy(w.astype(np.float32)).view(-1, 1)
    del tab, w
    src, dst, node_map = remap_nodes(u, v)
    del u, v
    log.info("read %s: %d events, %d nodes, weights %s", path, E, node_map.numel(),
             "all ones (dropped)" if edge_attr is None else "kept as edge_attr")
    nm = path.name[4:] if path.name.startswith("out.") else path.name
    return sort_by_time(src, dst, t, num_nodes=int(node_map.numel()), edge_attr=edge_attr,
                        node_map=node_map, name=name or nm)


def _check_edge_count(path: Path, rows: int) -> None:
    for i, line in enumerate(head_lines(path, 2)):
        parts = line.lstrip("%").split()
        if line.startswith("%") and len(parts) == 3 and all(p.isdigit() for p in parts):
            if int(parts[0]) != rows:
                raise DataFormatError(path, f"header says {parts[0]} edges but the file has {rows} data "
                                      "rows (truncated or edited file? pass check_header=False to accept)",
                                      line=i + 1)
