"""``random``: a seeded, balanced random assignment of nodes to parts.

Nodes are shuffled with a seeded generator and dealt round-robin, so node counts
differ by at most one between parts. It ignores the graph structure: its edge
cut is about ``1 - 1/P``, the baseline the structural partitioners must beat.
"""
from __future__ import annotations

import torch
from torch import Tensor

from tgl_dist.data.temporal import TemporalGraph


def random_partition(graph: TemporalGraph, num_parts: int, seed: int = 0) -> Tensor:
    """Owner of every node, drawn at random with balanced part sizes.

    Args:
        graph: the temporal graph (only ``num_nodes`` is used).
        num_parts: P, number of parts.
        seed: seed of the shuffle (same seed, same owners).

    Returns:
        ``owner``, shape ``[N]``, int64 in ``[0, P)``.
    """
    gen = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(graph.num_nodes, generator=gen)
    owner = torch.empty(graph.num_nodes, dtype=torch.long)
    owner[perm] = torch.arange(graph.num_nodes) % num_parts
    return owner
