"""Graph data held by a rank: the distributed graph store and the temporal sampling structure (T-CSR)."""
from tgl_dist.graph.store import DistributedGraphStore, EventSet
from tgl_dist.graph.tcsr import TemporalNeighborSampleGraph

__all__ = ["DistributedGraphStore", "EventSet", "TemporalNeighborSampleGraph"]
