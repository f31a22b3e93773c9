"""Layers: the sharded node-embedding table (more layers are added beside it)."""
from tgl_dist.nn.dist_embedding import DistEmbedding

__all__ = [
    "DistEmbedding",
]
