"""Partition a :class:`GraphData` by node and write one part per rank.

Each rank owns a set of nodes and keeps, for every snapshot, the edges whose
**destination** it owns (so it aggregates its own nodes' messages locally), plus the
**halo**: the remote source nodes of those edges, with their owners. Everything the
halo :class:`~tgl_dist.dtdg.route.Route` needs is computed here, offline, from the
full graph, and so are the per-snapshot degrees the GCN normalisation needs (the
normalisation is that of the full graph, never of a part).

On disk (same atomic conventions and manifest checks as the CTDG partitions)::

    root/<name>/dtdg_<algorithm>_<P>/
        manifest.json          {"format_version": 2, "kind": "dtdg", "num_parts": P,
                                "algorithm": "metis", "num_nodes": N, "num_snapshots": T,
                                "fingerprint": ..., "files": {"part_0/graph.pt": {sha256, bytes}}}
        part_0/graph.pt        rank 0's part (a dict of tensors, see :func:`build_parts`)
        part_1/graph.pt        ...

The folder is written under a temporary name and renamed into place only when
every part and the manifest are on disk.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Dict, List, Union

import numpy as np
import torch
from torch import Tensor

from tgl_dist.dist import PartitionBook
from tgl_dist.dtdg.graph_data import GraphData
from tgl_dist.errors import PartitionError
from tgl_dist.integrity import atomic_dir, save_tensors
from tgl_dist.partition.storage import write_manifest

log = logging.getLogger(__name__)

PART_FILE = "graph.pt"
KIND = "dtdg"


# --------------------------------------------------------------- algorithms
def random_owner(g: GraphData, num_parts: int, seed: int = 0) -> Tensor:
    """Balanced random assignment: a seeded permutation dealt round-robin, shape ``[N]``."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(g.num_nodes, generator=gen)
    owner = torch.empty(g.num_nodes, dtype=torch.long)
    owner[perm] = torch.arange(g.num_nodes) % num_parts
    return owner


def union_csr(g: GraphData):
    """Undirected union graph over all snapshots, no self loops: ``(xadj, adjncy, eweights)``.

    ``eweights`` counts how many (snapshot, direction) edges join the pair.
    """
    N = g.num_nodes
    s, d = g.edge_index
    keep = s != d
    s, d = s[keep], d[keep]
    key = torch.cat([s * N + d, d * N + s])
    uniq, counts = torch.unique(key, return_counts=True)      # sorted by (row, col)
    row, col = uniq // N, uniq % N
    xadj = torch.zeros(N + 1, dtype=torch.long)
    xadj[1:] = torch.cumsum(torch.bincount(row, minlength=N), 0)
    return xadj.numpy(), col.numpy(), counts.numpy()


def metis_owner(g: GraphData, num_parts: int, seed: int = 0) -> Tensor:
    """METIS (pymetis) on the union graph over all snapshots, edge weights = edge counts."""
    if num_parts == 1:
        return torch.zeros(g.num_nodes, dtype=torch.long)
    import pymetis
    xadj, adjncy, ew = union_csr(g)
    opts = pymetis.Options(seed=seed)
    adj = (dict(adjacency=pymetis.CSRAdjacency(xadj, adjncy)) if hasattr(pymetis, "CSRAdjacency")
           else dict(xadj=xadj, adjncy=adjncy))
    _, parts = pymetis.part_graph(num_parts, **adj,
                                  eweights=np.minimum(ew, 2**30).astype(np.int64), options=opts)
    owner = torch.as_tensor(np.asarray(parts), dtype=torch.long)
    counts = torch.bincount(owner, minlength=num_parts)
    if bool((counts == 0).any()):
        raise PartitionError(f"metis left part(s) {torch.nonzero(counts == 0).view(-1).tolist()} "
                             f"empty ({g.num_nodes} nodes into {num_parts} parts); use fewer parts "
                             f"or algorithm='random'")
    return owner


ALGORITHMS: Dict[str, Callable[[GraphData, int, int], Tensor]] = {
    "random": random_owner,
    "metis": metis_owner,
}


def get_algorithm(name: str) -> Callable[[GraphData, int, int], Tensor]:
    """The partitioner called ``name``; the error lists the known ones."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown DTDG partitioning algorithm {name!r}; known: {sorted(ALGORITHMS)}")
    return ALGORITHMS[name]


# ----------------------------------------------------------------- degrees
def snapshot_degrees(edge_index: Tensor, time: Tensor, weight, num_nodes: int, T: int):
    """Per-snapshot degree information of the full graph.

    Returns:
        in_w: ``[N, T]`` float64, summed weight of the non-self-loop edges into each node.
        loop_w: ``[N, T]`` float64, weight of the node's self loop as PyG's
            ``add_remaining_self_loops`` sets it: an existing self loop's weight (the
            largest if there are several), else 1.
        active: ``[N, T]`` bool, the node has an edge (in or out, loops included).
    """
    s, d = edge_index
    w = torch.ones(s.numel(), dtype=torch.float64) if weight is None else weight.double()
    loop = s == d
    key = d * T + time
    in_w = torch.zeros(num_nodes * T, dtype=torch.float64).index_add_(0, key[~loop], w[~loop])
    loop_w = torch.full((num_nodes * T,), float("-inf"), dtype=torch.float64)
    loop_w.scatter_reduce_(0, key[loop], w[loop], reduce="amax")
    loop_w[torch.isinf(loop_w)] = 1.0
    active = torch.zeros(num_nodes * T, dtype=torch.bool)
    active[key] = True
    active[s * T + time] = True
    return in_w.view(num_nodes, T), loop_w.view(num_nodes, T), active.view(num_nodes, T)


# ------------------------------------------------------------------- parts
def build_parts(g: GraphData, owner: Tensor) -> List[dict]:
    """Every rank's part, in memory (``save_partition`` writes them; world-of-one code uses them).

    Shapes (per part): n: owned nodes, h: halo nodes, e: local edges, T: snapshots.

    Each part is a dict with:
        ``owned_ids [n]`` (global ids, increasing), ``halo_ids [h]`` and ``halo_owner [h]``
        (sorted by owner, then id), ``owner [N]`` (the partition book),
        ``edge_index [2, e]`` local ids (row 0: source in ``[0, n+h)``, owned first then
        halo; row 1: destination in ``[0, n)``), ``edge`` (every ``g.edge()`` store sliced to
        the local edges, plus ``eid`` global edge id and ``pos`` the edge's position among
        its snapshot's edges in global order), ``node`` (every ``g.node()`` store's owned rows),
        ``in_w [n+h, T]``, ``in_count [n+h, T]`` (unweighted), ``loop_w [n+h, T]`` (see :func:`snapshot_degrees`),
        ``active [n, T]``, the route (``send_rows``, ``send_counts [P]``, ``recv_counts [P]``),
        ``snapshot_edges [T]`` (global edge count per snapshot) and ``meta``.
    """
    g.validate()
    N, T, P = g.num_nodes, g.num_snapshots, int(owner.max()) + 1 if owner.numel() else 1
    book = PartitionBook(owner)
    P = max(P, book.num_parts)
    src, dst = g.edge_index
    time = g.edge()["time"].long()
    weight = g.edge().get("weight")
    in_w, loop_w, active = snapshot_degrees(g.edge_index, time, weight, N, T)
    in_c = in_w if weight is None else snapshot_degrees(g.edge_index, time, None, N, T)[0]
    order = torch.sort(time, stable=True).indices
    per_snap = torch.bincount(time, minlength=T)
    start = torch.cumsum(per_snap, 0) - per_snap
    pos = torch.empty_like(time)
    pos[order] = torch.arange(time.numel()) - start[time[order]]
    eid = torch.arange(time.numel())
    owner = owner.long()
    halos = []
    for r in range(P):
        mask = owner[dst] == r
        s = src[mask]
        remote = s[owner[s] != r]
        key = torch.unique(owner[remote] * N + remote)            # sorted by (owner, id)
        halos.append((mask, key % N, key // N, key))
    parts = []
    for r in range(P):
        mask, halo_ids, halo_owner, hkey = halos[r]
        owned = book.owned_ids(r)
        n = owned.numel()
        s, d = src[mask], dst[mask]
        local_src = torch.where(owner[s] == r, book.local[s],
                                n + torch.searchsorted(hkey, owner[s] * N + s))
        edge = {k: v[mask] for k, v in g.edge().items()}
        edge["eid"], edge["pos"] = eid[mask], pos[mask]
        send_rows, send_counts = [], []
        for p in range(P):
            _, h_ids, h_own, _ = halos[p]
            rows = book.local[h_ids[h_own == r]] if p != r else torch.zeros(0, dtype=torch.long)
            send_rows.append(rows)
            send_counts.append(rows.numel())
        recv_counts = torch.bincount(halo_owner, minlength=P)
        all_ids = torch.cat([owned, halo_ids])
        parts.append({
            "rank": r, "owned_ids": owned, "halo_ids": halo_ids, "halo_owner": halo_owner,
            "owner": owner, "edge_index": torch.stack([local_src, book.local[d]]),
            "edge": edge, "node": {k: v[owned].contiguous() for k, v in g.node().items()},
            "in_w": in_w[all_ids], "in_count": in_c[all_ids], "loop_w": loop_w[all_ids], "active": active[owned],
            "send_rows": torch.cat(send_rows), "send_counts": torch.tensor(send_counts),
            "recv_counts": recv_counts, "snapshot_edges": per_snap,
            "meta": {**g.meta(), "num_nodes": N, "num_snapshots": T, "num_parts": P},
        })
    return parts


def partition_path(root: Union[str, Path], name: str, algorithm: str, num_parts: int) -> Path:
    """``root/<name>/dtdg_<algorithm>_<num_parts>``."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"dataset name {name!r} cannot be used as a folder name; set meta()['name']")
    return Path(root) / name / f"{KIND}_{algorithm}_{int(num_parts)}"


def save_partition(g: GraphData, root: Union[str, Path], num_parts: int, algorithm: str = "metis",
                   seed: int = 0, force: bool = False) -> Path:
    """Partition ``g`` into ``num_parts`` parts and write them atomically.

    Args:
        g: the graph (``edge()['time']`` required).
        root: partitions root folder.
        num_parts: P, the world size that will load it.
        algorithm: ``'random'`` or ``'metis'`` (see :data:`ALGORITHMS`).
        seed: seed of the algorithm.
        force: overwrite an existing partition folder.

    Returns:
        the partition folder ``root/<name>/dtdg_<algorithm>_<P>``.
    """
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"num_parts must be a positive int, got {num_parts!r}")
    if num_parts > g.num_nodes:
        raise ValueError(f"cannot split {g.num_nodes} nodes into {num_parts} parts")
    owner = get_algorithm(algorithm)(g, num_parts, seed)
    parts = build_parts(g, owner)
    out = partition_path(root, g.name, algorithm, num_parts)
    with atomic_dir(out, force=force) as tmp:
        for r, part in enumerate(parts):
            (tmp / f"part_{r}").mkdir()
            save_tensors(tmp / f"part_{r}" / PART_FILE, part)
        meta = {k: v for k, v in g.meta().items() if isinstance(v, (int, float, str, bool, type(None)))}
        write_manifest(tmp, {
            **meta, "kind": KIND, "num_parts": num_parts, "algorithm": algorithm, "seed": seed,
            "name": g.name, "num_nodes": g.num_nodes, "num_snapshots": g.num_snapshots,
            "num_edges": g.num_edges, "fingerprint": g.fingerprint(),
            "owned_nodes": [int(p["owned_ids"].numel()) for p in parts],
            "halo_nodes": [int(p["halo_ids"].numel()) for p in parts],
            "local_edges": [int(p["edge_index"].size(1)) for p in parts],
        })
    log.info("wrote %d-part %s partition of %s to %s", num_parts, algorithm, g.name, out)
    return out
