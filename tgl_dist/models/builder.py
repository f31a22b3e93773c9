"""``build_model``: a :class:`ModelConfig` -> a :class:`TemporalLinkModel` with explicit arguments."""
from __future__ import annotations

from typing import Optional

from torch import nn

from tgl_dist.memory.updaters import UPDATERS
from tgl_dist.models.config import ModelConfig
from tgl_dist.models.tgnn import TemporalLinkModel
from tgl_dist.nn.attention import TemporalAttention


def embedding_dim(cfg: ModelConfig) -> int:
    """Size of the embeddings the predictor scores."""
    if cfg.gnn.output == "memory" or cfg.gnn.arch == "identity":
        return cfg.memory.dim_out
    return cfg.gnn.dim_out or cfg.memory.dim_out


def build_model(cfg: ModelConfig, dim_node_feat: int = 0, dim_edge_feat: int = 0,
                node_embedding: Optional[nn.Module] = None, *, num_nodes: int = 0,
                partition_book=None) -> TemporalLinkModel:
    """Build the model a config describes.

    Args:
        cfg: parsed config (:func:`tgl_dist.models.load_config`).
        dim_node_feat: F, size of the node features (0 = none; or of ``node_embedding``).
        dim_edge_feat: d_e, size of the event features (0 = none).
        node_embedding: optional learnable node input (ids -> ``[S, F]``).
        num_nodes, partition_book: the graph's node count and partition book (used by
            options that create sharded per-node tables).
    """
    mem, gnn, tr = cfg.memory, cfg.gnn, cfg.train
    updater = None
    node_dim = dim_node_feat
    if cfg.has_memory:
        dim_mail = 2 * mem.dim_out + dim_edge_feat
        kw = dict(dim_memory=mem.dim_out, dim_mail=dim_mail, mailbox_size=mem.mailbox_size,
                  dim_time=mem.dim_time, dim_node_feat=dim_node_feat,
                  combine_node_feature=mem.combine_node_feature)
        if mem.memory_update == "transformer":
            kw.update(num_head=mem.attention_head, dropout=tr.dropout, att_dropout=tr.att_dropout)
        updater = UPDATERS[mem.memory_update](**kw)
        node_dim = mem.dim_out
    layers = None
    if gnn.arch == "transformer_attention":
        d_out = gnn.dim_out or mem.dim_out
        layers, d_in = [], node_dim
        for _ in range(gnn.layer):
            layers.append(TemporalAttention(d_in, dim_edge_feat, gnn.dim_time, d_out, gnn.att_head,
                                            tr.dropout, tr.att_dropout))
            d_in = d_out
    projection = None if layers else ("jodie" if gnn.time_transform == "JODIE" else "identity")
    return TemporalLinkModel(dim_out=embedding_dim(cfg), memory_updater=updater, gnn_layers=layers,
                             projection=projection, output=gnn.output,
                             mail_uses_embedding=mem.mail_dst_embedding,
                             node_embedding=node_embedding)
