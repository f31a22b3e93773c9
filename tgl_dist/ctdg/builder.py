"""``build_model``: a :class:`ModelConfig` -> a :class:`TemporalLinkModel` with explicit arguments.

With a ``node_embedding`` section (``dim`` D > 0) the model gets a learnable node input:
a :class:`tgl_dist.nn.DistEmbedding` of ``num_nodes`` rows sharded by the partition book
(each rank stores the rows of its own nodes). Featureless graphs use it as the node
input ``[S, D]``; graphs with node features ``[S, F]`` get ``[features || embedding]``
``[S, F + D]``. The table is built with ``grad_reduction='mean'`` (the training loop
averages dense gradients over ranks) and carries the section's ``optimizer`` / ``lr``
for :func:`tgl_dist.ctdg.build_optimizer`.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from tgl_dist.dist import PartitionBook, world
from tgl_dist.memory.updaters import UPDATERS
from tgl_dist.ctdg.config import ConfigError, ModelConfig
from tgl_dist.ctdg.tgnn import TemporalLinkModel
from tgl_dist.nn.attention import TemporalAttention, TGNAttention
from tgl_dist.nn.dist_embedding import DistEmbedding
from tgl_dist.sampling.block import Block

NODE_EMBEDDING_NAME = "node_embedding"


class FeatureEmbeddingLinkModel(TemporalLinkModel):
    """A :class:`TemporalLinkModel` whose node input is ``[node features || node embedding]``.

    What :func:`build_model` returns when the config has a ``node_embedding`` section and
    the graph has node features (``F > 0``). The embedding is looked up at every step,
    also for an empty batch (the lookup is a collective).
    """

    def node_input(self, block: Block) -> Optional[Tensor]:
        """``[S, F + D]``: the block's ``'h'`` (when present) followed by the embedding rows."""
        e = self.node_embedding(block.srcdata["ID"])
        h = block.srcdata.get("h")
        return e if h is None else torch.cat([h.to(e.dtype), e], 1)


def node_embedding_table(cfg: ModelConfig, num_nodes: int,
                         partition_book: Optional[PartitionBook] = None) -> Optional[DistEmbedding]:
    """The sharded table the config's ``node_embedding`` section asks for (``None`` when off).

    Args:
        cfg: parsed config.
        num_nodes: N, nodes of the whole graph.
        partition_book: the book the graph was partitioned with (one part per rank); may be
            left out in a world of one.
    """
    sec = cfg.node_embedding
    if not sec.enabled:
        return None
    if cfg.has_memory and not cfg.memory.combine_node_feature:
        raise ConfigError("node_embedding", "memory.combine_node_feature is False, so this model "
                                            "never reads node inputs: set it True or remove "
                                            "node_embedding")
    if num_nodes <= 0:
        raise ConfigError("node_embedding", f"needs the graph's node count: pass num_nodes= to "
                                            f"build_model (got {num_nodes})")
    if partition_book is None:
        if world()[1] != 1:
            raise ConfigError("node_embedding", "in a world of more than one process, pass "
                                                "partition_book= (the graph partition's book)")
        partition_book = PartitionBook(torch.zeros(num_nodes, dtype=torch.long), num_parts=1)
    hint = {"optimizer": sec.optimizer, **({"lr": sec.lr} if sec.lr is not None else {})}
    return DistEmbedding(num_nodes, sec.dim, partition_book, NODE_EMBEDDING_NAME,
                         grad_reduction="mean", sparse_optim=hint)


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
        cfg: parsed config (:func:`tgl_dist.ctdg.load_config`).
        dim_node_feat: F, size of the graph's node features (0 = none; or, with no
            features, of a ``node_embedding`` module given here).
        dim_edge_feat: d_e, size of the event features (0 = none).
        node_embedding: optional learnable node input (ids -> ``[S, F]``) used when the
            blocks carry no ``'h'``; cannot be combined with a config ``node_embedding``
            section.
        num_nodes, partition_book: the graph's node count and partition book; needed by
            the config's ``node_embedding`` section (the book may be left out in a world
            of one).
    """
    mem, gnn, tr = cfg.memory, cfg.gnn, cfg.train
    table = node_embedding_table(cfg, num_nodes, partition_book)
    model_cls = TemporalLinkModel
    if table is not None:
        if node_embedding is not None:
            raise ConfigError("node_embedding", "the config asks for a node embedding and "
                                                "build_model got a node_embedding module too")
        node_embedding = table
        if dim_node_feat > 0:
            model_cls = FeatureEmbeddingLinkModel
        dim_node_feat += table.dim
    updater = None
    node_dim = dim_node_feat
    if cfg.has_memory:
        dim_mail = 2 * mem.dim_out + dim_edge_feat
        kw = dict(dim_memory=mem.dim_out, dim_mail=dim_mail, mailbox_size=mem.mailbox_size,
                  dim_time=mem.dim_time, dim_node_feat=dim_node_feat,
                  combine_node_feature=mem.combine_node_feature)
        if mem.memory_update == "transformer":
            kw.update(num_head=mem.attention_head, dropout=tr.dropout, att_dropout=tr.att_dropout)
        if mem.time_delta != "query":
            kw.update(time_delta=mem.time_delta)
        updater = UPDATERS[mem.memory_update](**kw)
        node_dim = mem.dim_out
    layers = None
    if gnn.arch == "transformer_attention":
        d_out = gnn.dim_out or mem.dim_out
        layers, d_in = [], node_dim
        for _ in range(gnn.layer):
            if gnn.att_variant == "tgn" and (d_in + gnn.dim_time) % gnn.att_head:
                # known only here: the node input's width depends on the data's features
                raise ConfigError("gnn.att_head", f"the 'tgn' attention splits its query of "
                                                  f"{d_in} (node) + {gnn.dim_time} (time) = "
                                                  f"{d_in + gnn.dim_time} values over heads: not "
                                                  f"divisible by att_head {gnn.att_head}",
                                  cfg.name)
            att_cls = TGNAttention if gnn.att_variant == "tgn" else TemporalAttention
            layers.append(att_cls(d_in, dim_edge_feat, gnn.dim_time, d_out, gnn.att_head,
                                  tr.dropout, tr.att_dropout))
            d_in = d_out
    projection = None if layers else ("jodie" if gnn.time_transform == "JODIE" else "identity")
    return model_cls(dim_out=embedding_dim(cfg), memory_updater=updater, gnn_layers=layers,
                     projection=projection, output=gnn.output,
                     mail_uses_embedding=mem.mail_dst_embedding, node_embedding=node_embedding)
