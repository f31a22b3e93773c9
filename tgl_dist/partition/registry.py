"""Partitioner registry: algorithm name -> function ``(graph, num_parts, seed) -> owner [N]``.

An unknown name is an error that lists the known names; there is no fallback.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, List

from torch import Tensor

from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.partition.hash import hash_partition
from tgl_dist.partition.metis import metis_partition
from tgl_dist.partition.metis_for_tgnn import metis_for_tgnn_partition
from tgl_dist.partition.random import random_partition

Partitioner = Callable[[TemporalGraph, int, int], Tensor]

PARTITIONERS: Dict[str, Partitioner] = {
    "random": random_partition,
    "hash": hash_partition,
    "metis": metis_partition,
    "metis_for_tgnn": metis_for_tgnn_partition,
}


def available_partitioners() -> List[str]:
    """Names of the registered algorithms, sorted."""
    return sorted(PARTITIONERS)


def get_partitioner(name: str) -> Partitioner:
    """The partitioning function registered under ``name``.

    Raises:
        ValueError: ``name`` is not registered (the message lists the known names).
    """
    try:
        return PARTITIONERS[name]
    except KeyError:
        raise ValueError(f"unknown partitioning algorithm {name!r}; known: "
                         f"{', '.join(available_partitioners())}") from None


def register_partitioner(name: str, fn: Partitioner, overwrite: bool = False) -> None:
    """Register ``fn`` under ``name`` (a custom algorithm); refuses to replace one unless ``overwrite``."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_\-]*", name or ""):
        raise ValueError(f"partitioner name {name!r} must be letters, digits, '_' or '-' "
                         f"(it becomes a folder name)")
    if name in PARTITIONERS and not overwrite:
        raise ValueError(f"partitioning algorithm {name!r} is already registered")
    PARTITIONERS[name] = fn
