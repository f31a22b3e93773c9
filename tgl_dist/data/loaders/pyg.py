"""PyTorch Geometric ``TemporalData`` in and out.

``from_pyg`` / ``to_pyg`` convert in memory (``msg`` <-> ``edge_attr``, ``y`` <->
``labels``); :func:`load_pyg` reads a file written by ``torch.save(temporal_data, path)``
or ``torch.save({'src': ..., 'dst': ..., 't': ..., 'msg': ...}, path)``.
"""
from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Optional

import torch

from tgl_dist.data.loaders._common import DatasetNotFoundError, PathLike, require_keys
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

log = logging.getLogger(__name__)


def from_pyg(data, name: str = "pyg", num_nodes: Optional[int] = None) -> TemporalGraph:
    """Convert a PyG ``TemporalData`` (or a dict with its keys) to a :class:`TemporalGraph`.

    Node ids are kept as they are (PyG ids are already ``0..N-1``; ``node_map`` is the
    identity). Events are sorted stably by ``t``; ``msg [E, F]`` becomes ``edge_attr``
    and ``y [E]`` becomes ``labels``.

    Args:
        data: ``TemporalData`` with ``src, dst, t`` (each ``[E]``), optional ``msg``, ``y``.
        name: dataset name.
        num_nodes: N (default ``data.num_nodes``, i.e. ``max(src, dst) + 1``).
    """
    get = (lambda k: data.get(k)) if isinstance(data, dict) else (lambda k: getattr(data, k, None))
    src, dst, t = get("src"), get("dst"), get("t")
    if src is None or dst is None or t is None:
        raise DataFormatError("<TemporalData>", "needs src, dst and t", field="src/dst/t")
    t = torch.as_tensor(t)
    if t.numel() and (bool(torch.isnan(t.double()).any()) or float(t.min()) < 0):
        bad = int(torch.nonzero(torch.isnan(t.double()) | (t.double() < 0))[0])
        raise DataFormatError("<TemporalData>", f"t[{bad}] = {t[bad].item()!r}: times must be finite "
                              "and >= 0", line=bad, field="t")
    if num_nodes is None:
        n = None if isinstance(data, dict) else data.num_nodes
        num_nodes = int(n) if n is not None else -1
    N = num_nodes if num_nodes >= 0 else int(max(int(src.max()), int(dst.max())) + 1) if src.numel() else 0
    return TemporalGraph.sorted(src, dst, t, num_nodes=N, edge_attr=get("msg"), labels=get("y"),
                                node_map=torch.arange(N, dtype=torch.long), name=name)


def to_pyg(graph: TemporalGraph):
    """Convert a :class:`TemporalGraph` to a PyG ``TemporalData``.

    ``t`` becomes int64 when every time is integral (as PyG's datasets store it), else
    stays float64; ``msg = edge_attr[eid]`` (absent when the graph has no edge
    features); ``y = labels``.
    """
    from torch_geometric.data import TemporalData

    t = graph.t
    if t.numel() == 0 or bool((t == torch.floor(t)).all()):
        t = t.long()
    kw = {}
    if graph.edge_attr is not None:
        kw["msg"] = graph.edge_attr[graph.eid]
    if graph.labels is not None:
        kw["y"] = graph.labels
    return TemporalData(src=graph.src.clone(), dst=graph.dst.clone(), t=t, **kw)


def load_pyg(path: PathLike, name: Optional[str] = None, trusted: bool = False) -> TemporalGraph:
    """Read a ``torch.save``-d ``TemporalData`` (or dict of its tensors) file.

    The file is opened with ``torch.load(weights_only=True)``, allowing only the PyG
    ``TemporalData`` classes, so an untrusted file cannot run code. ``trusted=True``
    falls back to full unpickling for files that need other classes.
    """
    from torch_geometric.data import TemporalData
    from torch_geometric.data.storage import GlobalStorage

    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(f"no such file: {path}")
    try:
        with torch.serialization.safe_globals([TemporalData, GlobalStorage]):
            obj = torch.load(path, map_location="cpu", weights_only=not trusted)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise DataFormatError(path, f"cannot read it as a torch.save-d TemporalData ({first}); if you "
                              "trust the file, pass trusted=True") from None
    if isinstance(obj, dict):
        require_keys(obj, ("src", "dst", "t"), path)
    elif not isinstance(obj, TemporalData):
        raise DataFormatError(path, f"expected a TemporalData or a dict of tensors, found {type(obj).__name__}")
    stem = path.name.rsplit(".", 1)[0]
    try:
        g = from_pyg(obj, name=name or stem)
    except DataFormatError as exc:
        raise DataFormatError(path, str(exc).split(": ", 1)[-1], line=exc.line, field=exc.field) from None
    log.info("read %s: %d events, %d nodes", path, g.num_events, g.num_nodes)
    return g
