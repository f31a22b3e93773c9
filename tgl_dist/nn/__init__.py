"""Layers: sharded node embeddings, time encoding, temporal attention, embeddings, predictor."""
from tgl_dist.nn.attention import TemporalAttention, TGNAttention, edge_softmax
from tgl_dist.nn.dist_embedding import DistEmbedding
from tgl_dist.nn.embedding import IdentityEmbedding, JODIETimeProjection
from tgl_dist.nn.predictor import EdgePredictor
from tgl_dist.nn.time_encoding import TimeEncode

__all__ = [
    "DistEmbedding",
    "TimeEncode",
    "TemporalAttention",
    "TGNAttention",
    "edge_softmax",
    "IdentityEmbedding",
    "JODIETimeProjection",
    "EdgePredictor",
]
