"""``DistGraph``: one rank's part of a partitioned snapshot graph, and ``get_graph`` to load it.

Local ids: owned nodes are rows ``[0, n)`` (in increasing global id), halo nodes rows
``[n, n + h)`` (grouped by owner). ``all_ids[local] == global id``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

import torch
from torch import Tensor

from tgl_dist.dist import PartitionBook, world
from tgl_dist.dtdg.adjacency import SnapshotAdj
from tgl_dist.dtdg.graph_data import GraphData, Snapshot
from tgl_dist.dtdg.partition import KIND, PART_FILE, build_parts, partition_path
from tgl_dist.dtdg.route import Route
from tgl_dist.errors import PartitionError
from tgl_dist.partition.storage import MANIFEST, existing_folder, read_manifest, verify_files

log = logging.getLogger(__name__)


class DistGraph:
    """The calling rank's owned nodes, their in-edges over all snapshots, the halo and the route.

    Shapes:
        n: owned nodes, h: halo nodes, e: local edges, T: snapshots, N: all nodes.

    Attributes:
        rank, world_size, group: where this part lives.
        owned_ids ``[n]``, halo_ids ``[h]``, all_ids ``[n+h]``: global ids of the local rows.
        owner ``[N]``, local ``[N]``: the partition book (owner rank, owner-local row).
        edge_index ``[2, e]``: local ids, sorted by snapshot; ``edge()['time']`` etc. follow.
        route: the halo :class:`Route` (``route(h_own) -> h_all``).
    """

    def __init__(self, part: Dict[str, Any], group=None) -> None:
        self.group = group
        self.rank, self.world_size = world(group)
        self.owned_ids: Tensor = part["owned_ids"]
        self.halo_ids: Tensor = part["halo_ids"]
        self.halo_owner: Tensor = part["halo_owner"]
        self.owner: Tensor = part["owner"].long()
        self.all_ids = torch.cat([self.owned_ids, self.halo_ids])
        self.local = PartitionBook(self.owner).local
        time = part["edge"]["time"].long()
        order = torch.sort(time, stable=True).indices
        self.edge_index: Tensor = part["edge_index"][:, order]
        self._edge = {k: v[order] for k, v in part["edge"].items()}
        self._node = dict(part["node"])
        self._meta = dict(part["meta"])
        self.T = int(self._meta["num_snapshots"])
        counts = torch.bincount(self._edge["time"].long(), minlength=self.T)
        self.snap_ptr = torch.zeros(self.T + 1, dtype=torch.long)
        self.snap_ptr[1:] = torch.cumsum(counts, 0)
        self.snapshot_edges: Tensor = part["snapshot_edges"]
        self.in_w, self.in_count, self.loop_w = part["in_w"], part["in_count"], part["loop_w"]
        self.active: Tensor = part["active"]
        self.route = Route(part["send_rows"], part["send_counts"], part["recv_counts"],
                           self.num_owned, group)
        if self.route.num_halo != self.num_halo:
            raise PartitionError(f"part {self.rank}: route brings {self.route.num_halo} halo rows "
                                 f"but the part lists {self.num_halo} halo nodes")
        self._adj: Dict[tuple, SnapshotAdj] = {}
        self._x_tm: Optional[Tensor] = None
        self._ax: Dict[tuple, Tensor] = {}

    # -------------------------------------------------------------- basics
    @property
    def num_owned(self) -> int:
        return int(self.owned_ids.numel())

    @property
    def num_halo(self) -> int:
        return int(self.halo_ids.numel())

    @property
    def num_nodes(self) -> int:
        """N, all nodes of the graph."""
        return int(self._meta["num_nodes"])

    @property
    def num_snapshots(self) -> int:
        return self.T

    @property
    def name(self) -> str:
        return str(self._meta.get("name", "graph"))

    def node(self) -> Dict[str, Tensor]:
        """Owned nodes' stores, e.g. ``x [n, T, F]``, ``y [n, T]``."""
        return self._node

    def edge(self) -> Dict[str, Tensor]:
        """Local edges' stores (``time``, ``weight``, ``attr``, ``eid``, ``pos``)."""
        return self._edge

    def meta(self) -> Dict[str, Any]:
        return self._meta

    def snapshot_slice(self, t: int) -> slice:
        """The local edges of snapshot ``t`` (edges are sorted by snapshot)."""
        return slice(int(self.snap_ptr[t]), int(self.snap_ptr[t + 1]))

    def get_snapshot(self, t: int) -> Snapshot:
        """Snapshot ``t``: local edges (local ids) and owned nodes' ``x`` / ``y``."""
        s = self.snapshot_slice(t)
        w, a = self._edge.get("weight"), self._edge.get("attr")
        x, y = self._node.get("x"), self._node.get("y")
        return Snapshot(self.edge_index[:, s], None if w is None else w[s],
                        None if a is None else a[s], None if x is None else x[:, t],
                        None if y is None else y[:, t], self.num_owned)

    def features(self, ts: Sequence[int]) -> Tensor:
        """Owned node features of snapshots ``ts``, time-major ``[len(ts), n, F]``."""
        if self._x_tm is None:
            x = self._node.get("x")
            if x is None:
                raise KeyError("node()['x'] is missing: models need node features per snapshot")
            if x.dim() == 2:
                x = x.unsqueeze(-1)
            self._x_tm = x.transpose(0, 1).contiguous()
        return self._x_tm[torch.as_tensor(list(ts), dtype=torch.long, device=self._x_tm.device)]

    def propagated_features(self, ts: Sequence[int], kind: str = "gcn", use_weight: bool = True,
                            dtype=torch.float32) -> Tensor:
        """:math:`\\hat A_t x_t` of the owned nodes for snapshots ``ts``: ``[len(ts), n, F]``.

        The node features are constant, so a first layer ``Â (x W)`` equals ``(Â x) W``:
        models use this cache and skip the first layer's route and sparse product (as SGC
        caches ``Â x``). Computed once for all snapshots in float64 on first use: a
        collective (one route), which every rank reaches in the same model call.
        """
        key = (kind, bool(use_weight), dtype)
        if key not in self._ax:
            master = (kind, bool(use_weight), torch.float64)
            if master not in self._ax:
                with torch.no_grad():
                    x = self.features(range(self.T)).double()
                    ax = self.adjacency(kind, use_weight).propagate(self.route(x, node_dim=1),
                                                                    range(self.T))
                self._ax[master] = ax
            self._ax[key] = self._ax[master].to(dtype)
        ax = self._ax[key]
        return ax[torch.as_tensor(list(ts), dtype=torch.long, device=ax.device)]

    def adjacency(self, kind: str = "gcn", use_weight: bool = True) -> SnapshotAdj:
        """The :class:`SnapshotAdj` of this part (built once per ``(kind, use_weight)``)."""
        key = (kind, bool(use_weight))
        if key not in self._adj:
            w = self._edge.get("weight") if use_weight else None
            in_w = self.in_w if w is not None else self.in_count
            loop_w = self.loop_w if w is not None else torch.ones_like(self.loop_w)
            self._adj[key] = SnapshotAdj(self.edge_index.cpu(), self._edge["time"].long().cpu(),
                                         None if w is None else w.cpu(), in_w.cpu(), loop_w.cpu(),
                                         self.num_owned, kind).to(self.owned_ids.device)
        return self._adj[key]

    def to(self, device) -> "DistGraph":
        """Move every tensor to ``device``."""
        for name in ("owned_ids", "halo_ids", "halo_owner", "owner", "all_ids", "local", "edge_index",
                     "snap_ptr", "active"):
            setattr(self, name, getattr(self, name).to(device))
        self._edge = {k: v.to(device) for k, v in self._edge.items()}
        self._node = {k: v.to(device) for k, v in self._node.items()}
        self._x_tm = None
        self._ax = {}
        self.route.to(device)
        self._adj = {k: a.to(device) for k, a in self._adj.items()}
        return self

    def __repr__(self) -> str:
        return (f"DistGraph(name={self.name!r}, rank={self.rank}/{self.world_size}, "
                f"owned={self.num_owned}, halo={self.num_halo}, edges={self.edge_index.size(1)}, "
                f"snapshots={self.T})")

    @classmethod
    def from_graph_data(cls, g: GraphData) -> "DistGraph":
        """The whole graph as the single part of a world of one (no disk, no process group)."""
        if world(None)[1] != 1:
            raise PartitionError("DistGraph.from_graph_data is for a world of one; under torchrun "
                                 "save a partition and load it with get_graph")
        return cls(build_parts(g, torch.zeros(g.num_nodes, dtype=torch.long))[0], None)


def get_graph(root: Union[str, Path], group=None, name: Optional[str] = None,
              algorithm: str = "metis") -> DistGraph:
    """Load the calling rank's part (every file checked against the manifest).

    Args:
        root: a partition folder (holding ``manifest.json``), or the partitions root
            together with ``name`` (then ``root/<name>/dtdg_<algorithm>_<world size>``).
        group: process group (``None``: default group, or a world of one).
        name / algorithm: used only when ``root`` is not itself a partition folder.

    Raises:
        PartitionError: not a DTDG partition, written for another world size, an
            unsupported format version, or a missing / corrupt / truncated file.
    """
    rank, ws = world(group)
    folder = Path(root)
    if not (folder / MANIFEST).is_file() and name is not None:
        folder = partition_path(root, name, algorithm, ws)
    folder = existing_folder(folder)
    if not (folder / MANIFEST).is_file():   # read_manifest's own hint names the CTDG tool
        where = "" if name is not None else "; or pass the partitions root and name="
        raise PartitionError(f"{folder / MANIFEST} not found: {folder} is not a tgl_dist partition "
                             f"(write a DTDG one with GraphData.save_partition(root, num_parts)"
                             f"{where})")
    manifest = read_manifest(folder)
    if manifest.get("kind") != KIND:
        raise PartitionError(f"{folder}: a {manifest.get('kind', 'CTDG')!r} partition, not a DTDG "
                             f"one; write it with GraphData.save_partition")
    if int(manifest["num_parts"]) != ws:
        raise PartitionError(f"{folder} has {manifest['num_parts']} parts but the world size is {ws}; "
                             f"re-partition with num_parts={ws} (g.save_partition(root, {ws}, ...))")
    verify_files(folder, manifest, prefix=f"part_{rank}/")
    try:
        part = torch.load(folder / f"part_{rank}" / PART_FILE, weights_only=True)
    except Exception as e:  # unreadable despite a matching checksum: a writer bug or torch change
        raise PartitionError(f"{folder / f'part_{rank}' / PART_FILE}: cannot be read ({e})") from e
    if int(part["rank"]) != rank:
        raise PartitionError(f"{folder}/part_{rank} holds rank {part['rank']}'s part")
    g = DistGraph(part, group)
    log.info("rank %d loaded %s", rank, g)
    return g
