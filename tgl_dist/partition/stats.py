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


def partition_stats(src: Tensor, dst: Tensor, owner: Tensor, num_parts: int,
                    chunk: int = 1 << 22) -> Dict:
    """Statistics of a node assignment.

    Args:
        src: source of each event, shape ``[E]``, global ids.
        dst: destination of each event, shape ``[E]``, global ids.
        owner: owner of each node, shape ``[N]``.
        num_parts: P.
        chunk: events handled at a time (memory: O(chunk + distinct halo pairs)).

    Returns:
        a JSON-serialisable dict: ``nodes_per_part``, ``events_per_part``, ``halo_per_part``
        (lists of P ints), ``balance_nodes``, ``balance_events``, ``edge_cut``, ``replication``.
    """
    owner = owner.long()
    N, E, P = int(owner.numel()), int(src.numel()), int(num_parts)
    nodes = torch.bincount(owner, minlength=P)
    events = torch.zeros(P, dtype=torch.long)
    cut = 0
    # (part, remote node) pairs: dst seen from the source's part and src from the dst's
    # part; chunk by chunk, so the temporaries are O(chunk) and the pairs O(distinct pairs)
    found = []
    for a in range(0, E, chunk):
        s, d = src[a:a + chunk], dst[a:a + chunk]
        so, do = owner[s], owner[d]
        events += torch.bincount(so, minlength=P)
        remote = so != do
        cut += int(remote.sum())
        keys = torch.cat([so[remote] * max(N, 1) + d[remote], do[remote] * max(N, 1) + s[remote]])
        found.append(torch.unique(keys))
    keys = torch.unique(torch.cat(found)) if found else torch.zeros(0, dtype=torch.long)
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
        "edge_cut": round(cut / E if E else 0.0, 6),
        "replication": round(float((nodes.sum() + halo.sum()).double() / N) if N else 1.0, 6),
    }
