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

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgl_dist.nn.time_encoding import TimeEncode
from tgl_dist.nn.unique import unique_first
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
        ``forward(block, h, rows=None)``: ``h [S, dim_node]`` rows of ``block.srcdata``
        (or, with ``rows [S]``, ``h [U, dim_node]`` distinct rows and source row i is
        ``h[rows[i]]``: products with ``h`` are then computed once per distinct row);
        returns ``[D, dim_out]`` for the block's destinations. Edge-feature products
        are computed once per distinct event id.
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

    def forward(self, block: Block, h: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        D, M, H = block.num_dst, block.num_edges, self.num_head
        h_dst = h[:D] if rows is None else h[rows[:D]]
        if M == 0:
            agg = h.new_zeros((D, self.dim_out))
        else:
            src, dst = block.edge_index[0], block.edge_index[1]
            dn, de = self.dim_node, self.dim_edge
            w, b = self.w_q.weight, self.w_q.bias
            # q = W_q [h_i || phi(0)]: the phi(0) part is a constant vector
            q_const = F.linear(self.time_enc(h.new_zeros(1)), w[:, dn:], b)
            q = torch.addmm(q_const, h_dst, w[:, :dn].t()) if dn else q_const.expand(D, -1)
            # k, v = W_kv [h_j || e_ij || phi(dt)], as three products (no concatenated copy)
            w = self.w_kv.weight
            kv = F.linear(self.time_enc(block.edata["dt"]), w[:, dn + de:], self.w_kv.bias)
            if dn and rows is not None:
                kv = kv + F.linear(h, w[:, :dn])[rows[src]]
            elif dn:
                h_src = h[D:D + M] if _is_tail_range(src, D, M, h.size(0)) else h[src]
                kv = torch.addmm(kv, h_src, w[:, :dn].t())
            if de:
                f = block.edata["f"].float()
                first, inv = unique_first(block.edata["ID"]) if "ID" in block.edata else (None, None)
                if first is not None and 2 * first.numel() < M:
                    kv = kv + F.linear(f[first], w[:, dn:dn + de])[inv]
                else:
                    kv = torch.addmm(kv, f, w[:, dn:dn + de].t())
            k, v = kv.view(M, 2, H, -1).unbind(1)
            logits = F.leaky_relu((q.view(D, H, -1)[dst] * k).sum(-1), 0.2)
            att = self.att_dropout(edge_softmax(logits, dst, D))
            msg = (v * att.unsqueeze(-1)).reshape(M, self.dim_out)
            agg = h.new_zeros((D, self.dim_out)).index_add_(0, dst, msg)
        w = self.w_out.weight
        out = torch.addmm(self.w_out.bias, agg, w[:, :self.dim_out].t())
        if self.dim_node:
            out = torch.addmm(out, h_dst, w[:, self.dim_out:].t())
        return self.layer_norm(F.relu(self.dropout(out)))


def _is_tail_range(src: Tensor, D: int, M: int, S: int) -> bool:
    """True when edge j's source is row D + j (the sampler's layout): a slice, no gather."""
    if S != D + M:
        return False
    return bool(src[0] == D) and bool(src[-1] == D + M - 1) and bool(
        (src[1:] - src[:-1] == 1).all()) if M > 1 else bool(src[0] == D)
