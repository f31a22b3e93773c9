"""Sparse optimizers for sharded :class:`~tgl_dist.nn.DistEmbedding` tables.

Gradient rows travel to the owning rank; only touched rows update.
"""
from tgl_dist.optim.base import SparseOptimizer
from tgl_dist.optim.sparse_adagrad import SparseAdagrad
from tgl_dist.optim.sparse_adam import SparseAdam

__all__ = ["SparseOptimizer", "SparseAdam", "SparseAdagrad"]
