"""JODIE CSV: ``user_id,item_id,timestamp,state_label[,features...]`` (Kumar et al. 2019).

Published at http://snap.stanford.edu/jodie/ (``wikipedia.csv``, ``reddit.csv``,
``mooc.csv``, ``lastfm.csv``). The header line names only the first four fields (the
original files then carry e.g. 172 feature columns on every data line).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import torch

from tgl_dist.data.loaders._common import (PathLike, head_lines, int_labels, looks_like_header,
                                           node_ids, read_table, remap_nodes, sort_by_time, stem,
                                           timestamps)
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

log = logging.getLogger(__name__)

FIELDS = ("user_id", "item_id", "timestamp", "state_label")


def load_jodie(path: PathLike, name: Optional[str] = None, shift_items: bool = True) -> TemporalGraph:
    """Read a JODIE CSV file into a :class:`TemporalGraph`.

    Item ids are shifted by ``max(user_id) + 1`` so users and items share one id space
    (as JODIE, TGN and DyGLib do), then all ids are remapped to ``0..N-1`` keeping their
    order (``node_map`` holds the shifted id: a user keeps its id, item ``i`` becomes
    ``i + max(user_id) + 1``).

    Args:
        path: the CSV file (plain or gzip).
        name: dataset name (default: the file name without extension).
        shift_items: shift item ids as above (``False`` if users and items already share
            one id space).

    Returns:
        TemporalGraph with ``labels [E]`` (state labels, int64) and, when the file has
        feature columns, ``edge_attr [E, F]``.

    Raises:
        DataFormatError: naming the line and field of a malformed row, a non-numeric or
            negative id, a NaN or negative timestamp, a fractional state label, a NaN or
            infinite feature, a header whose first names are not JODIE's.
    """
    path = Path(path)
    # the first line that is neither blank nor a comment is a header when none of its fields
    # is a number (a data row with one mistyped field is data: its bad field is reported)
    head = head_lines(path, 64)
    k = next((i for i, ln in enumerate(head) if ln.strip() and ln[:1] not in "#%"), None)
    line = "" if k is None else head[k]
    fields = [h.strip() for h in (line.split(",") if "," in line else line.split())]
    has_header = bool(fields) and looks_like_header(fields)
    if has_header:                # its first four names must be JODIE's
        names = [h.lower() for h in fields[:4]]
        if names != list(FIELDS):
            missing = [f for f in FIELDS if f not in names]
            raise DataFormatError(path, f"the header's first columns are {names}, expected "
                                  f"{list(FIELDS)}" + (f": no {missing[0]!r}" if missing else ""),
                                  line=k + 1, field=missing[0] if missing else None)
    tab = read_table(path, names=FIELDS, min_cols=4, max_cols=-1, header="auto" if k is None else has_header,
                     features_from=4)
    users = node_ids(tab, 0, FIELDS[0])
    items = node_ids(tab, 1, FIELDS[1])
    t = timestamps(tab, 2, FIELDS[2])
    lab = int_labels(tab, 3, FIELDS[3], "state label")
    if shift_items:
        items = items + (int(users.max()) + 1)
    src, dst, node_map = remap_nodes(users, items)
    edge_attr = None
    if tab.features is not None:
        if tab.nonfinite is not None:           # what check_finite says, found while reading
            r, c, got = tab.nonfinite
            raise DataFormatError(path, f"edge features must be finite numbers, got {got!r}",
                                  line=int(tab.lines[r]), field=f"feature_{c}")
        edge_attr = torch.from_numpy(tab.features)
    log.info("read %s: %d events, %d nodes, %d feature columns", path, tab.num_rows,
             node_map.numel(), 0 if edge_attr is None else edge_attr.size(1))
    del tab, users, items
    return sort_by_time(src, dst, t, num_nodes=int(node_map.numel()),
                        edge_attr=edge_attr, labels=torch.from_numpy(lab),
                        node_map=node_map, name=name or stem(path))

