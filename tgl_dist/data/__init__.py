"""Temporal graph data: the ``TemporalGraph`` container, format loaders and the built-in dataset."""
from tgl_dist.data.temporal import TemporalGraph

__all__ = ["TemporalGraph"]
