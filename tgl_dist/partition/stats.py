"""Partition statistics: sizes, balance, edge cut and halo replication (vectorised).

Definitions (P parts, N nodes, E events; an event is owned by the owner of its source):

* ``nodes_per_part[r]`` = nodes owned by ``r``; ``events_per_part[r]`` = events owned by ``r``.
* ``balance_nodes`` = ``max_r nodes_per_part[r] / mean_r nodes_per_part[r]`` (1.0 is perfect);
  ``balance_events`` likewise for owned events.
* ``edge_cut`` = fraction of events whose source and destination have different owners.
* ``halo_per_part[r]`` = nodes *not* owned by ``r`` that share at least one event with a
  node owned by ``r`` (the remote neighbours ``r`` needs state of).
* ``replication`` = ``sum_r (nodes_per_part[r] + halo_per_part[r]) / N``: how many parts
  hold a copy (owned or halo) of an average node; 1.0 means no halo at all, P means every
  part needs every node. Equivalently, the node-weighted mean over parts of
  ``(owned + halo) / owned``.
"""
from __future__ import annotations

from typing import Dict

import torch
from torch import Tensor


def partition_stats(src: Tensor, dst: Tensor, owner: Tensor, num_parts: int) -> Dict:
    """Statistics of a node assignment.

    Args:
        src: source of each event, shape ``[E]``, global ids.
        dst: destination of each event, shape ``[E]``, global ids.
        owner: owner of each node, shape ``[N]``.
        num_parts: P.

    Returns:
        a JSON-serialisable dict: ``nodes_per_part``, ``events_per_part``, ``halo_per_part``
        (lists of P ints), ``balance_nodes``, ``balance_events``, ``edge_cut``, ``replication``.
    """
    owner = owner.long()
    N, E, P = int(owner.numel()), int(src.numel()), int(num_parts)
    so, do = owner[src], owner[dst]
    nodes = torch.bincount(owner, minlength=P)
    events = torch.bincount(so, minlength=P)
    # (part, remote node) pairs: dst seen from the source's part and src from the dst's part
    part = torch.cat([so, do])
    node = torch.cat([dst, src])
    remote = owner[node] != part
    keys = torch.unique(part[remote] * max(N, 1) + node[remote])
    halo = torch.bincount(keys // max(N, 1), minlength=P)

    def balance(x: Tensor) -> float:
        mean = x.double().mean()
        return float(x.max().double() / mean) if float(mean) > 0 else 1.0

    return {
        "nodes_per_part": nodes.tolist(),
        "events_per_part": events.tolist(),
        "halo_per_part": halo.tolist(),
        "balance_nodes": round(balance(nodes), 6),
        "balance_events": round(balance(events), 6),
        "edge_cut": round(float((so != do).double().mean()) if E else 0.0, 6),
        "replication": round(float((nodes.sum() + halo.sum()).double() / N) if N else 1.0, 6),
    }
