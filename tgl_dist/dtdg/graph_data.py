"""``GraphData``: a discrete-time dynamic graph (a sequence of snapshots) held in one process.

Shapes:
    N: nodes, T: snapshots, E: edges over all snapshots, F: node feature size,
    F_e: edge attribute size.

A ``GraphData`` is what loaders build and what :meth:`GraphData.save_partition`
splits across ranks. Training code works on the per-rank
:class:`~tgl_dist.dtdg.dist_graph.DistGraph` that :func:`~tgl_dist.dtdg.get_graph` loads.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Union

import torch
from torch import Tensor

from tgl_dist.data.temporal import hash_tensor

OptTensor = Optional[Tensor]


@dataclass
class Snapshot:
    """One snapshot's edges and node data.

    Attributes:
        edge_index: ``[2, E_t]`` (source row 0, destination row 1). Global ids for a
            :class:`GraphData`; local ids (owned first, then halo) for a ``DistGraph``.
        edge_weight: ``[E_t]`` or ``None``.
        edge_attr: ``[E_t, F_e]`` or ``None``.
        x: node features of the snapshot, ``[N, F]`` (owned nodes only on a ``DistGraph``) or ``None``.
        y: node targets of the snapshot, ``[N, *]`` or ``None``.
        num_nodes: rows of ``x`` (all nodes, or owned nodes on a ``DistGraph``).
    """

    edge_index: Tensor
    edge_weight: OptTensor
    edge_attr: OptTensor
    x: OptTensor
    y: OptTensor
    num_nodes: int


def _integers(x: Tensor, what: str) -> Tensor:
    """``x`` as int64 when every value is an integer (``3.0`` passes); else ``ValueError``
    naming ``what`` and the first bad value (no silent truncation of ``1.9`` to 1)."""
    if x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{what} must hold integer node ids, got dtype {x.dtype}")
    if x.is_floating_point():
        bad = ~torch.isfinite(x) | (x != torch.floor(x))
        if bool(bad.any()):
            raise ValueError(f"{what} must hold integer node ids, got {x[bad][0].item()!r}")
    return x.long()


class GraphData:
    """A snapshot sequence: edges with a snapshot index, per-snapshot node data, metadata.

    Args:
        edge_index: ``[2, E]`` int64 global node ids (source, destination), all snapshots.
        num_nodes: N.

    Attribute stores (plain dicts of tensors, filled by the caller or a loader):
        ``node()``: per-node tensors with first dimension N, e.g. ``x [N, T, F]``
            (features per snapshot) and ``y [N, T]`` (targets per snapshot).
        ``edge()``: per-edge tensors with first dimension E. ``time [E]`` (int64 snapshot
            index in ``[0, T)``) is required before use; ``weight [E]`` and ``attr [E, F_e]``
            are optional (``weight`` is the edge weight the GCN normalisation uses).
        ``meta()``: JSON-able values: ``num_nodes``, ``num_snapshots``, ``name`` and anything else.

    Example::

        g = GraphData(edge_index, num_nodes=x.size(0))
        g.node()["x"] = x                      # [N, T, F]
        g.edge()["time"] = edge_times          # [E]
        g.meta()["num_snapshots"] = T
        g.save_partition("partitions", num_parts=2, algorithm="metis")
    """

    def __init__(self, edge_index: Tensor, num_nodes: int) -> None:
        edge_index = _integers(torch.as_tensor(edge_index), "edge_index")
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
        if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
            raise ValueError(f"edge_index holds ids outside [0, {num_nodes}): "
                             f"min {int(edge_index.min())}, max {int(edge_index.max())}")
        self.edge_index = edge_index
        self.num_nodes = int(num_nodes)
        self._node: Dict[str, Tensor] = {}
        self._edge: Dict[str, Tensor] = {}
        self._meta: Dict[str, Any] = {"num_nodes": self.num_nodes}

    # ---------------------------------------------------------------- stores
    def node(self) -> Dict[str, Tensor]:
        """Per-node tensors (first dimension N)."""
        return self._node

    def edge(self) -> Dict[str, Tensor]:
        """Per-edge tensors (first dimension E); ``'time'`` is the snapshot index."""
        return self._edge

    def meta(self) -> Dict[str, Any]:
        """Graph-level metadata (JSON-able)."""
        return self._meta

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.size(1))

    @property
    def num_snapshots(self) -> int:
        """T: ``meta()['num_snapshots']`` or, if absent, ``max(edge time) + 1`` / ``x.size(1)``."""
        if "num_snapshots" in self._meta:
            return int(self._meta["num_snapshots"])
        t = 0
        if "time" in self._edge and self._edge["time"].numel():
            t = int(self._edge["time"].max()) + 1
        x = self._node.get("x")
        if x is not None and x.dim() >= 2:
            t = max(t, int(x.size(1)))
        return t

    @property
    def name(self) -> str:
        return str(self._meta.get("name", "graph"))

    def validate(self) -> None:
        """Check the stores' shapes against N, E and T (raises ``ValueError`` naming the key)."""
        E, N, T = self.num_edges, self.num_nodes, self.num_snapshots
        if "time" not in self._edge:
            raise ValueError("edge()['time'] (snapshot index of each edge, shape [E]) is required")
        for k, v in self._edge.items():
            if v.size(0) != E:
                raise ValueError(f"edge()['{k}'] has {v.size(0)} rows, expected E={E}")
        time = self._edge["time"]
        if time.is_floating_point() or time.dtype == torch.bool or time.is_complex():
            raise ValueError(f"edge()['time'] must hold integer snapshot indices, got dtype "
                             f"{time.dtype}")
        if time.numel() and (int(time.min()) < 0 or int(time.max()) >= T):
            raise ValueError(f"edge()['time'] must lie in [0, {T}), got [{int(time.min())}, "
                             f"{int(time.max())}]")
        for k, v in self._node.items():
            if v.size(0) != N:
                raise ValueError(f"node()['{k}'] has {v.size(0)} rows, expected N={N}")
            if k in ("x", "y") and (v.dim() < 2 or v.size(1) != T):
                raise ValueError(f"node()['{k}'] must have shape [N, T, ...] with T={T}, "
                                 f"got {tuple(v.shape)}")

    # -------------------------------------------------------------- access
    def get_snapshot(self, t: int) -> Snapshot:
        """Edges and node data of snapshot ``t`` (global ids)."""
        mask = self._edge["time"] == t
        w, a = self._edge.get("weight"), self._edge.get("attr")
        x, y = self._node.get("x"), self._node.get("y")
        return Snapshot(self.edge_index[:, mask], None if w is None else w[mask],
                        None if a is None else a[mask], None if x is None else x[:, t],
                        None if y is None else y[:, t], self.num_nodes)

    def fingerprint(self) -> str:
        """A short hash of the structure and of every stored tensor's name, shape, dtype and
        values; partitions record it, so a partition of other data (same edges, changed
        signals, targets or weights) is told apart and written again."""
        h = hashlib.sha256()
        h.update(self.edge_index.contiguous().numpy().tobytes())
        h.update(f"{self.num_nodes}/{self.num_snapshots}".encode())
        for tag, store in (("node", self._node), ("edge", self._edge)):
            for k in sorted(store):
                hash_tensor(h, f"{tag}.{k}", store[k])
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return (f"GraphData(name={self.name!r}, num_nodes={self.num_nodes}, "
                f"num_edges={self.num_edges}, num_snapshots={self.num_snapshots}, "
                f"node={ {k: tuple(v.shape) for k, v in self._node.items()} }, "
                f"edge={ {k: tuple(v.shape) for k, v in self._edge.items()} })")

    # ------------------------------------------------------------ builders
    @classmethod
    def from_json(cls, path: Union[str, Path], **kwargs) -> "GraphData":
        """Read a PyTorch Geometric Temporal JSON file (see :func:`~tgl_dist.dtdg.load_pgt_json`)."""
        from tgl_dist.dtdg.loaders import load_pgt_json
        return load_pgt_json(path, **kwargs)

    @classmethod
    def from_temporal(cls, tg, span: Union[float, str, None] = None,
                      num_snapshots: Optional[int] = None) -> "GraphData":
        """Bin a CTDG ``TemporalGraph`` into snapshots (see :func:`~tgl_dist.dtdg.from_temporal`)."""
        from tgl_dist.dtdg.loaders import from_temporal
        return from_temporal(tg, span=span, num_snapshots=num_snapshots)

    def save_partition(self, root: Union[str, Path], num_parts: int, algorithm: str = "metis",
                       seed: int = 0, force: bool = False) -> Path:
        """Partition the nodes and write one part per rank (see :func:`~tgl_dist.dtdg.save_partition`).

        Returns the partition folder ``root/<name>/dtdg_<algorithm>_<num_parts>``.
        """
        from tgl_dist.dtdg.partition import save_partition
        return save_partition(self, root, num_parts, algorithm, seed=seed, force=force)
