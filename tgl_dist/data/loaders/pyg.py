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
from torch import Tensor

from tgl_dist.data.loaders._common import (DatasetNotFoundError, PathLike, check_finite,
                                           require_keys)
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

log = logging.getLogger(__name__)


_WHERE = "<TemporalData>"   # load_pyg puts the file name in its place


def from_pyg(data, name: str = "pyg", num_nodes: Optional[int] = None) -> TemporalGraph:
    """Convert a PyG ``TemporalData`` (or a dict with its keys) to a :class:`TemporalGraph`.

    Node ids are kept as they are (PyG ids are already ``0..N-1``; ``node_map`` is the
    identity). Events are sorted stably by ``t``; ``msg [E, F]`` becomes ``edge_attr``
    and ``y [E]`` becomes ``labels``.

    Args:
        data: ``TemporalData`` with ``src, dst, t`` (each ``[E]``), optional ``msg``, ``y``
            (tensors, or anything ``torch.as_tensor`` takes).
        name: dataset name.
        num_nodes: N (default ``max(src, dst) + 1``, as ``TemporalData.num_nodes``).

    Raises:
        DataFormatError: naming the field (and the row, as ``line``): a missing
            ``src``/``dst``/``t``, a value that is not a 1-d tensor of real numbers, lengths
            that differ, a negative or fractional node id (or one ``>= num_nodes``, or one
            ``>= 2^31``: ids are kept, so they would need that many nodes), a NaN,
            infinite or negative time, ``msg`` or ``y`` without one row per event, a NaN or
            infinite ``msg`` or ``y`` value.
    """
    get = (lambda k: data.get(k)) if isinstance(data, dict) else (lambda k: getattr(data, k, None))
    src, dst, t = get("src"), get("dst"), get("t")
    if src is None or dst is None or t is None:
        raise DataFormatError(_WHERE, "needs src, dst and t", field="src/dst/t")
    src, dst, t = (_real_tensor(x, k, allow_bool=False) for x, k in ((src, "src"), (dst, "dst"), (t, "t")))
    E = src.numel()
    for k, x in (("src", src), ("dst", dst), ("t", t)):
        if x.dim() != 1 or x.numel() != E:
            raise DataFormatError(_WHERE, f"expected a 1-d tensor of one entry per event like src [{E}], "
                                  f"got shape {list(x.shape)}", field=k)
    src, dst = _node_ids(src, "src"), _node_ids(dst, "dst")
    td = t.double()
    bad = ~torch.isfinite(td) | (td < 0)
    if bool(bad.any()):
        r = int(torch.nonzero(bad)[0])
        raise DataFormatError(_WHERE, f"t[{r}] = {t[r].item()!r}: times must be finite and >= 0",
                              line=r, field="t")
    top = int(max(int(src.max()), int(dst.max()))) if E else -1
    N = top + 1 if num_nodes is None or num_nodes < 0 else int(num_nodes)
    if top >= min(N, MAX_NODES):   # name the field and row of the largest id
        k = "src" if int(src.max()) == top else "dst"
        r = int(torch.nonzero((src if k == "src" else dst) == top)[0])
        if top >= MAX_NODES:
            raise DataFormatError(_WHERE, f"node id {top}: ids are kept as given (PyG's "
                                  f"convention), so this stream would have {top + 1:,} nodes, "
                                  f"more than {MAX_NODES:,}; renumber them 0..N-1 first "
                                  f"(torch.unique(ids, return_inverse=True))", line=r, field=k)
        raise DataFormatError(_WHERE, f"node id {top} is not below num_nodes={N}", line=r, field=k)
    extra = {}
    for key, k in (("msg", "edge_attr"), ("y", "labels")):
        x = get(key)
        if x is None:
            continue
        x = _real_tensor(x, key, allow_bool=True)
        if x.dim() == 0 or x.size(0) != E or (key == "msg" and x.dim() > 2):
            want = f"[{E}, F]" if key == "msg" else f"[{E}]"
            raise DataFormatError(_WHERE, f"expected {want} (one row per event), got shape {list(x.shape)}",
                                  field=key)
        if x.is_floating_point():   # (numpy has no bfloat16; float32 holds its values)
            v = x.reshape(E, -1)
            check_finite((v.float() if v.dtype == torch.bfloat16 else v).numpy(), _WHERE, key,
                         field=lambda c, key=key: key)
        extra[k] = x
    return TemporalGraph.sorted(src, dst, t, num_nodes=N, node_map=torch.arange(N, dtype=torch.long),
                                name=name, **extra)


# node ids are kept, so the largest one sets the node count; past this many nodes the
# per-node arrays (memory, mailbox: hundreds of bytes a node) could not be held anyway
MAX_NODES = 2 ** 31


def _real_tensor(x, field: str, allow_bool: bool) -> Tensor:
    """``x`` as a tensor of real numbers (ints or floats; bools if ``allow_bool``)."""
    try:
        x = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DataFormatError(_WHERE, f"expected a tensor of numbers, got {type(x).__name__} ({exc})",
                              field=field) from None
    if x.is_complex() or (x.dtype == torch.bool and not allow_bool):
        raise DataFormatError(_WHERE, f"expected real numbers, got dtype {x.dtype}", field=field)
    return x


def _node_ids(x: Tensor, field: str) -> Tensor:
    """Node ids ``[E]`` as int64; each must be a non-negative integer (floats such as 3.0 pass)."""
    bad = x < 0
    if x.is_floating_point():
        bad |= ~torch.isfinite(x) | (x != torch.floor(x)) | (x >= 2.0 ** 63)
    if bool(bad.any()):
        r = int(torch.nonzero(bad)[0])
        raise DataFormatError(_WHERE, f"node id must be a non-negative integer, got {x[r].item()!r}",
                              line=r, field=field)
    return x.long()


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

    Raises:
        DataFormatError: an unreadable file, a missing key, no events, or any bad value
            :func:`from_pyg` reports (naming the file, the field and the row as ``line``).
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
        from tgl_dist.integrity import unreadable_reason
        why = unreadable_reason(path, exc)
        hint = ("; if you trust the file, pass trusted=True" if "safe loading refuses" in why
                and not trusted else "")
        raise DataFormatError(path, f"cannot read it as a torch.save-d TemporalData: {why}{hint}") from None
    if isinstance(obj, dict):
        require_keys(obj, ("src", "dst", "t"), path)
    elif not isinstance(obj, TemporalData):
        raise DataFormatError(path, f"expected a TemporalData or a dict of tensors, found {type(obj).__name__}")
    stem = path.name.rsplit(".", 1)[0]
    try:
        g = from_pyg(obj, name=name or stem)
    except DataFormatError as exc:
        raise DataFormatError(path, str(exc).split(": ", 1)[-1], line=exc.line, field=exc.field) from None
    if g.num_events == 0:        # as the text loaders: a file without events is an error
        raise DataFormatError(path, "the file holds no events (src, dst and t are empty)", field="src")
    log.info("read %s: %d events, %d nodes", path, g.num_events, g.num_nodes)
    return g
