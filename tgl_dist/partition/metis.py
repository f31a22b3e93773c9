"""``metis``: METIS on the time-aggregated undirected interaction graph.

The event stream is collapsed into a static weighted graph: one undirected edge
``{u, v}`` per pair of nodes that ever interacted, weighted by the number of
events between them (either direction); self-loops are dropped. METIS minimises
the total weight of edges whose endpoints land in different parts -- which is
exactly the number of *events* whose endpoints get different owners, i.e.
``edge_cut * E`` -- while keeping every part's node count within METIS's
imbalance tolerance of ``N / P``. Nodes without events are vertices without
edges: METIS places them where they help node balance.

The CSR graph is built with vectorised torch ops (sort / unique / bincount);
nothing loops over nodes or events in Python.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.partition._metis_mc import part_graph_multiconstraint

log = logging.getLogger(__name__)


@dataclass
class AggregatedGraph:
    """Symmetric CSR of the time-aggregated graph, as METIS wants it.

    Shapes:
        N: number of nodes; M: number of distinct undirected pairs (no self-loops).

    Attributes:
        xadj: row pointers, shape ``[N + 1]``, int64.
        adjncy: neighbour of each stored entry, shape ``[2M]``, int64 (both directions).
        weight: number of events between the two endpoints, shape ``[2M]``, int64 (>= 1).
    """

    xadj: Tensor
    adjncy: Tensor
    weight: Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.xadj.numel()) - 1


def aggregate_graph(graph: TemporalGraph, chunk: int = 1 << 22) -> AggregatedGraph:
    """Collapse the event stream into a weighted undirected CSR graph (vectorised).

    Duplicate interactions are merged into one edge whose weight is their count,
    ``u -> v`` and ``v -> u`` count toward the same edge, self-loops are dropped.
    The events are read ``chunk`` at a time (distinct pairs of each chunk, then merged),
    so the temporaries are O(chunk + distinct pairs), not O(E).
    """
    N = graph.num_nodes
    keys, cnts = [], []
    for a in range(0, graph.num_events, chunk):
        s, d = graph.src[a:a + chunk], graph.dst[a:a + chunk]
        lo, hi = torch.minimum(s, d), torch.maximum(s, d)
        keep = lo != hi
        k, c = torch.unique(lo[keep] * N + hi[keep], return_counts=True)
        keys.append(k)
        cnts.append(c)
        del s, d, lo, hi, keep
    if len(keys) == 1:
        pairs, counts = keys[0], cnts[0]                     # sorted by (lo, hi)
    elif keys:
        pairs, inv = torch.unique(torch.cat(keys), return_inverse=True)
        counts = torch.zeros(pairs.numel(), dtype=torch.long).index_add_(0, inv, torch.cat(cnts))
        del inv
    else:
        pairs = counts = torch.zeros(0, dtype=torch.long)
    del keys, cnts
    # both directions, sorted by (row, col): the keys row * N + col are distinct, so one
    # sort orders them; the row pointers are where each row's keys begin
    both, order = torch.sort(torch.cat([pairs, (pairs % N) * N + pairs // N]))
    w = torch.cat([counts, counts])[order]
    del order, pairs, counts
    xadj = torch.searchsorted(both, torch.arange(N + 1, dtype=torch.long) * N)
    return AggregatedGraph(xadj=xadj, adjncy=both % N, weight=w)


def run_metis(agg: AggregatedGraph, num_parts: int, vweights: Optional[Tensor] = None,
              seed: int = 0) -> Tensor:
    """Partition ``agg`` with METIS, minimising the weighted edge cut.

    Recursive bisection for ``P <= 8``, k-way above (pymetis's rule).

    Args:
        agg: the CSR graph.
        num_parts: P.
        vweights: vertex weights, shape ``[N, C]`` (C balance constraints, each part's sum
            of every column is kept within METIS's tolerance of the mean) or ``None``
            (every vertex weighs 1: balance node counts).
        seed: METIS's random seed (same seed, same partition).

    Returns:
        ``owner``, shape ``[N]``, int64 in ``[0, P)``.
    """
    import pymetis

    N = agg.num_nodes
    if num_parts == 1 or N == 0:
        return torch.zeros(N, dtype=torch.long)
    recursive = num_parts <= 8
    if vweights is not None and vweights.reshape(N, -1).size(1) > 1:
        vw = vweights.reshape(N, -1).long()
        vw = vw[:, vw.sum(0) > 0]   # a constraint with zero total (no events) constrains nothing
        if vw.size(1) > 1:
            return part_graph_multiconstraint(agg.xadj, agg.adjncy, agg.weight, vw, num_parts,
                                              seed, recursive)
        vweights = vw
    dtype = np.int64
    csr = pymetis.CSRAdjacency(adj_starts=agg.xadj.numpy().astype(dtype, copy=False),
                               adjacent=agg.adjncy.numpy().astype(dtype, copy=False))
    vw1 = None if vweights is None else vweights.reshape(-1).long().numpy()
    ew = agg.weight.numpy().astype(dtype, copy=False) if agg.adjncy.numel() else None
    cut, parts = pymetis.part_graph(num_parts, adjacency=csr, vweights=vw1, eweights=ew,
                                    options=pymetis.Options(seed=int(seed)), recursive=recursive)
    log.debug("METIS: P=%d, cut weight %d", num_parts, cut)
    return torch.as_tensor(np.asarray(parts), dtype=torch.long)


def metis_partition(graph: TemporalGraph, num_parts: int, seed: int = 0) -> Tensor:
    """METIS with one constraint (node count) on the time-aggregated graph.

    Minimises the number of events whose endpoints have different owners, with
    node counts balanced. Event counts per part are *not* balanced: a part that
    receives the hubs also receives most of the work (see ``metis_for_tgnn``).

    Args:
        graph: the temporal graph.
        num_parts: P, number of parts.
        seed: METIS seed.

    Returns:
        ``owner``, shape ``[N]``, int64 in ``[0, P)``.
    """
    return run_metis(aggregate_graph(graph), num_parts, None, seed)
