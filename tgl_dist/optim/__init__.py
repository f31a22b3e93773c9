"""Optimizers: sparse ones for sharded :class:`~tgl_dist.nn.DistEmbedding` tables, Adam, and their assembly.

Sparse: gradient rows travel to the owning rank; only touched rows update.
:class:`Adam` is ``torch.optim.Adam(fused=True)`` (same state, same bits) stepped by one
compiled pass over all tensors on the CPU: the dense optimizer of ``build_optimizer``.
"""
from tgl_dist.optim.adam import Adam
from tgl_dist.optim.base import SparseOptimizer
from tgl_dist.optim.sparse_adagrad import SparseAdagrad
from tgl_dist.optim.sparse_adam import SparseAdam
from tgl_dist.optim.build import TrainOptimizer, build_optimizer, sharded_modules

__all__ = ["Adam", "SparseOptimizer", "SparseAdam", "SparseAdagrad", "TrainOptimizer",
           "build_optimizer", "sharded_modules"]
