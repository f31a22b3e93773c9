"""``hash``: node ``v`` goes to part ``v % P``.

Deterministic and needs no state to evaluate: any process can compute the owner of
any id. Like ``random`` it ignores the structure (edge cut about ``1 - 1/P``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from tgl_dist.data.temporal import TemporalGraph


def hash_partition(graph: TemporalGraph, num_parts: int, seed: int = 0) -> Tensor:
    """Owner of every node: ``global_id % num_parts``.

    Args:
        graph: the temporal graph (only ``num_nodes`` is used).
        num_parts: P, number of parts.
        seed: ignored (the assignment is deterministic); kept for a uniform signature.

    Returns:
        ``owner``, shape ``[N]``, int64 in ``[0, P)``.
    """
    return torch.arange(graph.num_nodes, dtype=torch.long) % num_parts
