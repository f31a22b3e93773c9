"""``TemporalAttention``: TGL's temporal graph attention layer (TGN, TGAT).

For a destination node i with sampled neighbours j (edge features e_ij, age
Delta_ij = t_i - t_ij > 0):

.. math::
    q_i = W_q [h_i \\| \\phi(0)], \\quad k_j = W_k [h_j \\| e_{ij} \\| \\phi(\\Delta_{ij})],
    \\quad v_j = W_v [h_j \\| e_{ij} \\| \\phi(\\Delta_{ij})]

    \\alpha_{ij} = \\mathrm{softmax}_j\\big(\\mathrm{LeakyReLU}_{0.2}(q_i \\cdot k_j)\\big)
    \\text{ per head, no } 1/\\sqrt{d} \\text{ scaling}

    \\mathrm{out}_i = \\mathrm{LayerNorm}(\\mathrm{ReLU}(\\mathrm{Dropout}(W_o[\\textstyle\\sum_j \\alpha_{ij} v_j \\| h_i])))

A destination without neighbours aggregates to zero (Rossi et al. 2020, TGN;
Zhou et al. 2022, TGL ``layers.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgl_dist.nn.time_encoding import TimeEncode
from tgl_dist.sampling.block import Block


def edge_softmax(logits: Tensor, dst: Tensor, num_dst: int) -> Tensor:
    """Softmax of edge scores over the incoming edges of each destination.

    Args:
        logits: ``[M, H]`` scores. dst: ``[M]`` destination of each edge (int64).
        num_dst: D.
    Returns:
        ``[M, H]`` weights summing to one over each destination's edges.
    """
    H = logits.size(1)
    idx = dst.view(-1, 1).expand(-1, H)
    mx = logits.new_full((num_dst, H), float("-inf"))
    mx = mx.scatter_reduce(0, idx, logits.detach(), reduce="amax", include_self=True)
    ex = torch.exp(logits - mx[dst])
    den = logits.new_zeros((num_dst, H)).index_add_(0, dst, ex)
    return ex / den[dst]


class TemporalAttention(nn.Module):
    """One layer of TGL's temporal graph attention.

    Args:
        dim_node: size of the input node representation ``h`` (0 allowed).
        dim_edge: size of edge features ``block.edata['f']`` (0 = none).
        dim_time: size of the time encoding (> 0).
        dim_out: output size (divisible by ``num_head``).
        num_head: attention heads H.
        dropout: dropout on ``W_o``'s output. att_dropout: dropout on the weights.

    Shapes:
        ``forward(block, h)``: ``h [S, dim_node]`` rows of ``block.srcdata``;
        returns ``[D, dim_out]`` for the block's destinations.
    """

    def __init__(self, dim_node: int, dim_edge: int, dim_time: int, dim_out: int,
                 num_head: int = 2, dropout: float = 0.0, att_dropout: float = 0.0) -> None:
        super().__init__()
        if dim_time <= 0:
            raise ValueError(f"TemporalAttention needs dim_time > 0, got {dim_time}")
        if dim_out % num_head:
            raise ValueError(f"dim_out={dim_out} is not divisible by num_head={num_head}")
        self.dim_node, self.dim_edge, self.dim_time = dim_node, dim_edge, dim_time
        self.dim_out, self.num_head = dim_out, num_head
        self.time_enc = TimeEncode(dim_time)
        self.w_q = nn.Linear(dim_node + dim_time, dim_out)
        self.w_kv = nn.Linear(dim_node + dim_edge + dim_time, 2 * dim_out)
        self.w_out = nn.Linear(dim_node + dim_out, dim_out)
        self.layer_norm = nn.LayerNorm(dim_out)
        self.dropout = nn.Dropout(dropout)
        self.att_dropout = nn.Dropout(att_dropout)

    def forward(self, block: Block, h: Tensor) -> Tensor:
        D, M, H = block.num_dst, block.num_edges, self.num_head
        h_dst = h[:D]
        if M == 0:
            agg = h.new_zeros((D, self.dim_out))
        else:
            src, dst = block.edge_index[0], block.edge_index[1]
            phi0 = self.time_enc(h.new_zeros(1)).expand(D, -1)
            q = self.w_q(torch.cat([h_dst, phi0], 1))[dst]
            parts = [h[src]]
            if self.dim_edge:
                parts.append(block.edata["f"].float())
            parts.append(self.time_enc(block.edata["dt"]))
            k, v = self.w_kv(torch.cat(parts, 1)).split(self.dim_out, 1)
            q = q.view(M, H, -1)
            k = k.reshape(M, H, -1)
            logits = F.leaky_relu((q * k).sum(-1), 0.2)
            att = self.att_dropout(edge_softmax(logits, dst, D))
            msg = (v.reshape(M, H, -1) * att.unsqueeze(-1)).reshape(M, self.dim_out)
            agg = h.new_zeros((D, self.dim_out)).index_add_(0, dst, msg)
        out = self.w_out(torch.cat([agg, h_dst], 1))
        return self.layer_norm(F.relu(self.dropout(out)))
