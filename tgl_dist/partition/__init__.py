"""Offline partitioning of temporal graphs and loading of one rank's part.

Write: ``python -m tgl_dist.partition ...`` or :func:`partition_graph`.
Read:  :func:`partition_load` (one rank's :class:`PartitionData`).
Algorithms: ``random``, ``hash``, ``metis``, ``metis_for_tgnn`` (see :data:`PARTITIONERS`).
"""
from tgl_dist.partition.load import PartitionData, SampleGraph, partition_load
from tgl_dist.partition.registry import (PARTITIONERS, available_partitioners, get_partitioner,
                                         register_partitioner)
from tgl_dist.partition.stats import partition_stats
from tgl_dist.partition.writer import partition_dir, partition_graph

__all__ = ["partition_graph", "partition_load", "PartitionData", "SampleGraph", "PARTITIONERS",
           "available_partitioners", "get_partitioner", "register_partitioner", "partition_stats",
           "partition_dir"]
