"""CSV event lists with a header of known column names: ``src,dst,t``, ``u,i,ts``,
``source,target,time,weight``, ...

The columns are found by name (any order, any case), not by position:

=========== ===========================================================================
role        accepted header names
=========== ===========================================================================
source      ``src``, ``source``, ``u``, ``from``, ``sender``
destination ``dst``, ``target``, ``destination``, ``dest``, ``i``, ``to``, ``receiver``
time        ``t``, ``ts``, ``time``, ``timestamp``
=========== ===========================================================================

Every other column (``weight``, ``rating``, ``label``, ...) must hold numbers on every
row and becomes an edge feature: ``edge_attr [E, F_e]`` in header order. A column of
text (a category, a date) is refused, naming the file, line and column: convert it to
numbers, or drop the column. Fields may be separated by commas, tabs or spaces; ``#``
and ``%`` lines are comments; the file may be gzip-compressed.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from tgl_dist.data.loaders._common import (PathLike, check_finite, head_lines, looks_like_header,
                                           node_ids, read_table, remap_nodes, sort_by_time, stem,
                                           timestamps)
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

log = logging.getLogger(__name__)

#: header names of each role (lower case)
ROLES: Dict[str, Sequence[str]] = {
    "src": ("src", "source", "u", "from", "sender"),
    "dst": ("dst", "target", "destination", "dest", "i", "to", "receiver"),
    "t": ("t", "ts", "time", "timestamp"),
}
_ROLE_OF = {n: role for role, names in ROLES.items() for n in names}


def header_fields(path: PathLike) -> Tuple[Optional[List[str]], int]:
    """``(fields, line)``: the fields of the first line that is neither blank nor a
    comment and its 1-based number; ``fields`` is ``None`` when one of them is a number
    (no header)."""
    for k, ln in enumerate(head_lines(path, 64), 1):
        if not ln.strip() or ln[:1] in "#%":
            continue
        fields = [f.strip() for f in (ln.split(",") if "," in ln else ln.split())]
        return (fields if looks_like_header(fields) else None), k
    return None, 1


def column_roles(fields: Sequence[str]) -> Optional[Dict[str, int]]:
    """``{"src": k, "dst": k, "t": k}`` (0-based columns) when ``fields`` names each role
    exactly once; ``None`` otherwise (what :func:`~tgl_dist.data.loaders.infer_format` asks)."""
    found: Dict[str, int] = {}
    for k, f in enumerate(fields):
        role = _ROLE_OF.get(f.lower())
        if role is not None:
            if role in found:
                return None
            found[role] = k
    return found if len(found) == 3 else None


def _roles_or_error(path: Path, fields: List[str], line: int) -> Dict[str, int]:
    shown = ",".join(fields)
    for k, f in enumerate(fields, 1):
        if not f:
            raise DataFormatError(path, f"header {shown!r}: column {k} has no name", line=line)
    seen: Dict[str, str] = {}
    for f in fields:
        role = _ROLE_OF.get(f.lower())
        if role is not None and role in seen:
            raise DataFormatError(path, f"header {shown!r} names the {role} column twice "
                                  f"({seen[role]!r} and {f!r})", line=line, field=f)
        if role is not None:
            seen[role] = f
    roles = column_roles(fields)
    if roles is None:
        missing = next(r for r in ROLES if r not in seen)
        raise DataFormatError(path, f"header {shown!r} has no {missing} column; expected one "
                              f"named {' / '.join(ROLES[missing])} (any case)", line=line,
                              field=missing)
    return roles


def load_named_csv(path: PathLike, name: Optional[str] = None) -> TemporalGraph:
    """Read a CSV event list whose header names its columns into a :class:`TemporalGraph`.

    The source, destination and time columns are found by name (see the module
    docstring for the accepted names); node ids are remapped to ``0..N-1`` in ascending
    order of the original ids (``node_map`` keeps them); events are sorted stably by time.
    Every other column becomes an edge feature (``edge_attr [E, F_e]``, float32, in header
    order; ``None`` when there is no other column) and must hold finite numbers.

    Args:
        path: the file (plain or gzip).
        name: dataset name (default: file name without extensions).

    Raises:
        DataFormatError: no header or a header without a source, destination or time
            column (naming the header found), a row with another number of fields, a
            value that is not a number (naming the line and the column's header name),
            a negative or fractional id, a NaN or negative time, a NaN feature.
    """
    path = Path(path)
    fields, line = header_fields(path)
    if fields is None:
        raise DataFormatError(path, "expected a header line naming the columns (e.g. "
                              "src,dst,t or source,target,time,weight) before the data",
                              line=line)
    roles = _roles_or_error(path, fields, line)
    tab = read_table(path, names=fields, min_cols=len(fields), header=True)
    src, dst, node_map = remap_nodes(node_ids(tab, roles["src"], fields[roles["src"]]),
                                     node_ids(tab, roles["dst"], fields[roles["dst"]]))
    t = torch.from_numpy(timestamps(tab, roles["t"], fields[roles["t"]]))
    rest = [k for k in range(len(fields)) if k not in roles.values()]
    edge_attr = None
    if rest:
        feats = tab.values[:, rest]
        check_finite(feats, path, "edge features", lines=tab.lines, field=lambda c: fields[rest[c]])
        edge_attr = torch.from_numpy(feats.astype(np.float32))
    log.info("read %s: %d events, %d nodes, edge features %s", path, tab.num_rows,
             node_map.numel(), [fields[k] for k in rest] or "none")
    return sort_by_time(src, dst, t, num_nodes=int(node_map.numel()), edge_attr=edge_attr,
                        node_map=node_map, name=name or stem(path))
