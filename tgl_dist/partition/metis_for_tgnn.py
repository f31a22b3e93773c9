"""``metis_for_tgnn``: METIS balancing both memory size and work of a memory-based TGNN.

What it optimises, exactly. On the time-aggregated undirected graph of
:func:`tgl_dist.partition.metis.aggregate_graph` (edge ``{u, v}`` weighted by the
number of events between ``u`` and ``v``, self-loops dropped) METIS

* **minimises** the total weight of cut edges = the number of events whose source
  and destination have different owners (``edge_cut * E``): every such event
  costs a remote memory/mail fetch and a remote mail update;
* **subject to two balance constraints** (multi-constraint METIS, ``ncon = 2``),
  each part ``r`` within METIS's tolerance of the mean:

  1. ``sum_{v owned by r} 1`` -- node count: memory, mailbox and node features
     are stored by the owner, so this balances memory size;
  2. ``sum_{v owned by r} outdeg(v)`` -- events owned by ``r``: an event is owned
     by the owner of its *source* node, so this is the number of events rank ``r``
     trains on (sampling, embedding, memory update) per epoch, i.e. the work.

Plain ``metis`` balances only (1); on heavy-tailed streams its event balance can
be far off (one part with the hubs does most of the work while the others wait at
every synchronous step).
"""
from __future__ import annotations

import torch
from torch import Tensor

from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.partition.metis import aggregate_graph, run_metis


def tgnn_vertex_weights(graph: TemporalGraph) -> Tensor:
    """The two METIS constraints per node: ``[1, number of events with src == v]``, shape ``[N, 2]``."""
    N = graph.num_nodes
    owned_events = torch.bincount(graph.src, minlength=N)
    return torch.stack([torch.ones(N, dtype=torch.long), owned_events], 1)


def metis_for_tgnn_partition(graph: TemporalGraph, num_parts: int, seed: int = 0) -> Tensor:
    """Multi-constraint METIS: minimise cut events, balance node count and owned events.

    Args:
        graph: the temporal graph.
        num_parts: P, number of parts.
        seed: METIS seed.

    Returns:
        ``owner``, shape ``[N]``, int64 in ``[0, P)``.
    """
    return run_metis(aggregate_graph(graph), num_parts, tgnn_vertex_weights(graph), seed)
