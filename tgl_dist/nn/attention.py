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

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgl_dist.nn._attention_kernel import (SegmentAttention, csr_from_dst, get_attention_kernel,
                                           kernel_usable)
from tgl_dist.nn._attention_layer import (AttentionLayer, attention_layer, query_terms,
                                          value_terms)
from tgl_dist.nn._pointwise import KERNEL as POINTWISE
from tgl_dist.nn._pointwise import Dropout, dropout_mask
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


def padded_layout(block: Block) -> Optional[Tuple[Tensor, Tensor, int]]:
    """Edges of ``block`` in a ``[D, K]`` padded layout (K = largest in-degree).

    Returns ``(flat [M], count [D], K)`` with edge e at flat position ``flat[e]`` of the
    ``D * K`` slots, or ``None`` when the edges are not grouped by destination (the
    sampler lists them destination-sorted) or there are none.
    """
    dst = block.edge_index[1]
    M, D = dst.numel(), block.num_dst
    if M == 0 or (M > 1 and not bool((dst[1:] >= dst[:-1]).all())):
        return None
    cnt = torch.bincount(dst, minlength=D)
    K = int(cnt.max())
    start = torch.cumsum(cnt, 0) - cnt
    flat = dst * K + (torch.arange(M, device=dst.device) - start[dst])
    return flat, cnt, K


def csr_offsets(block: Block) -> Optional[Tensor]:
    """``ptr [D + 1]``: the edges of destination d are ``ptr[d] .. ptr[d+1]-1`` (CSR), or
    ``None`` when the edges are not grouped by destination."""
    return csr_from_dst(block.edge_index[1], block.num_dst)


def segment_attend(q: Tensor, w_k: Tensor, b_k: Optional[Tensor], w_v: Tensor,
                   b_v: Optional[Tensor], hs: Optional[Tensor], idx: Optional[Tensor],
                   x: Tensor, ptr: Tensor, num_head: int, leaky: bool, att_dropout: nn.Module,
                   lib) -> Tensor:
    """:func:`padded_attend` on edges in CSR order, the per-edge part in the compiled kernel.

    Same algebra (``q . k_j = (W_k^T q) . x_j + q . b_k``, ``sum_j a_j v_j = W_v (sum_j
    a_j x_j) + b_v sum_j a_j``); the scores, the softmax over each destination's edges,
    the attention dropout and the weighted sum of the ``x_j`` run in one pass of
    :class:`tgl_dist.nn._attention_kernel.SegmentAttention` (forward and backward), with
    no padding and no per-edge copy of the node rows.

    Args:
        hs: ``[U, dn]`` node rows (or ``None`` when dn = 0); edge e's input row is
            ``x_e = [hs[idx[e]] || x[e]]``. idx: ``[M]`` int64.
        x: ``[M, C - dn]`` the edges' own inputs, edges of destination d at rows
            ``ptr[d] .. ptr[d+1]-1``. ptr: ``[D + 1]`` int64 (:func:`csr_offsets`).
        Others as :func:`padded_attend` (``w_k``, ``w_v``: ``[d, C]``).
    Returns:
        ``[D, d]``; zero for a destination without edges.
    """
    M, H = x.size(0), num_head
    qk, qb = query_terms(q, w_k, b_k, H)                                   # [D, H, C], [D, H]
    mask = _mask(att_dropout, (M, H), x)
    agg, asum = SegmentAttention.apply(qk, qb, hs, idx, x, ptr, mask, 0.2 if leaky else None,
                                       lib, lib.threads())  # [D, H, C], [D, H]
    return value_terms(agg, asum, w_v, b_v)


class _PaddedScores(torch.autograd.Function):
    """``scores[d, k, h] = sum_c x[d, k, c] qk[d, h, c]``: ``x [D, K, C]``, ``qk [D, H, C]`` -> ``[D, K, H]``.

    A batched product of D tiny matrices. Its backward is written out because autograd's
    default (``g @ qk`` with an inner size of H and a strided ``g``, ``x^T @ g`` over
    ``[D, C, K]`` views) takes slow paths on CPU (11 ms of a 36 ms TGN step on
    Wikipedia); the forms here compute the same values in well under 1 ms.
    """

    @staticmethod
    def forward(ctx, x: Tensor, qk: Tensor) -> Tensor:
        ctx.save_for_backward(x, qk)
        return torch.bmm(x, qk.transpose(1, 2))

    @staticmethod
    def backward(ctx, g: Tensor):
        x, qk = ctx.saved_tensors
        gx = gq = None
        if ctx.needs_input_grad[0]:
            # sum over the H heads of outer products; bmm with an inner size of H (2) and a
            # strided g is ~20x slower on CPU than these broadcast products
            gx = g[:, :, 0, None] * qk[:, None, 0]
            for h in range(1, qk.size(1)):
                gx.addcmul_(g[:, :, h, None], qk[:, None, h])
        if ctx.needs_input_grad[1]:
            gq = torch.bmm(g.transpose(1, 2), x)
        return gx, gq


class _PaddedAggregate(torch.autograd.Function):
    """``agg[d, h, c] = sum_k att[d, h, k] x[d, k, c]``: ``att [D, H, K]``, ``x [D, K, C]`` -> ``[D, H, C]``.

    Backward written out for the same reason as :class:`_PaddedScores`.
    """

    @staticmethod
    def forward(ctx, att: Tensor, x: Tensor) -> Tensor:
        ctx.save_for_backward(att, x)
        return torch.bmm(att, x)

    @staticmethod
    def backward(ctx, g: Tensor):
        att, x = ctx.saved_tensors
        ga = torch.bmm(g, x.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        gx = (torch.bmm(att.transpose(1, 2).contiguous(), g)
              if ctx.needs_input_grad[1] else None)
        return ga, gx


def padded_attend(q: Tensor, w_k: Tensor, b_k: Optional[Tensor], w_v: Tensor,
                  b_v: Optional[Tensor], xp: Tensor, cnt: Tensor, num_head: int, leaky: bool,
                  att_dropout: nn.Module) -> Tensor:
    """Multi-head attention of each destination over its edges' inputs, without per-edge keys.

    ``k_j = W_k x_j + b_k``, ``v_j = W_v x_j + b_v``; the products are re-associated so
    no ``[M, 2 d]`` key/value tensor is formed: ``q . k_j = (W_k^T q) . x_j + q . b_k``
    and ``sum_j a_j v_j = W_v (sum_j a_j x_j) + b_v sum_j a_j`` (exact algebra; the
    per-edge matmul becomes two small batched products per destination).

    Args:
        q: ``[D, d]`` queries (already scaled when the layer scales). w_k, w_v: ``[d, C]``.
        b_k, b_v: ``[d]`` or ``None``. xp: ``[D, K, C]`` edge inputs in the padded layout
        (:func:`padded_layout`; padding slots may hold any finite values). cnt: ``[D]``
        edges per destination. leaky: LeakyReLU(0.2) on the scores (TGL).
    Returns:
        ``[D, d]``; zero for a destination without edges.
    """
    K, H = xp.size(1), num_head
    qk, qb = query_terms(q, w_k, b_k, H)                                  # [D, H, C], [D, H]
    scores = _PaddedScores.apply(xp, qk)                                   # [D, K, H]
    if qb is not None:
        scores = scores + qb.unsqueeze(1)
    if leaky:
        scores = F.leaky_relu(scores, 0.2)
    valid = (torch.arange(K, device=q.device) < cnt.unsqueeze(1)).unsqueeze(2)  # [D, K, 1]
    # finite fill: a destination without edges gets uniform weights, zeroed just below
    att = torch.softmax(scores.masked_fill(~valid, -1e30), 1) * valid
    att = att_dropout(att).transpose(1, 2).contiguous()                   # [D, H, K]
    agg = _PaddedAggregate.apply(att, xp)                                  # [D, H, C]
    return value_terms(agg, att.sum(-1), w_v, b_v)


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

    On CPU float32 with the compiled kernels (and node input) the layer runs as one
    autograd node with a written-out backward (:class:`AttentionLayer`); the torch forms
    (``use_kernel = False``, ``padded = False``) compute the same values and gradients.
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
        self.dropout = Dropout(dropout)
        self.att_dropout = Dropout(att_dropout)
        self.padded = True  # False: the per-edge key/value formulation (reference path)
        self.use_kernel = True  # the compiled segment kernel when available (else padded)

    def _segment_inputs(self, block: Block, h: Tensor, rows: Optional[Tensor]):
        """``(hs, idx, x)`` for :func:`segment_attend`: node rows with each edge's source row,
        and ``x [M, dim_edge + dim_time] = [e_ij || phi(dt_ij)]``."""
        hs = idx = None
        if self.dim_node:
            src = block.edge_index[0]
            hs, idx = h, (src if rows is None else rows.index_select(0, src))
        x = self.time_enc(block.edata["dt"], block.edata["f"].float() if self.dim_edge else None)
        return hs, idx, x

    def _segment(self, block: Block, h: Tensor, rows: Optional[Tensor]):
        """``(lib, ptr)`` when the compiled kernel computes this block's attention, else None."""
        if not (self.use_kernel and self.padded) or block.num_edges == 0:
            return None
        lib = get_attention_kernel()
        if lib is None or not kernel_usable(h, block.edata["dt"].float()[:1]):
            return None
        ptr = csr_offsets(block)
        return None if ptr is None else (lib, ptr)

    def _attend(self, block: Block, h: Tensor, rows: Optional[Tensor], qkv: tuple, seg,
                layout, leaky: bool) -> Tensor:
        """The aggregation ``[D, d]`` by the compiled kernel (``seg`` from :meth:`_segment`)
        or else the padded torch form; ``qkv = (q, w_k, b_k, w_v, b_v)``."""
        if seg is not None:
            return segment_attend(*qkv, *self._segment_inputs(block, h, rows), seg[1],
                                  self.num_head, leaky, self.att_dropout, seg[0])
        return padded_attend(*qkv, self._padded_inputs(block, h, rows, layout), layout[1],
                             self.num_head, leaky, self.att_dropout)

    def _padded_inputs(self, block: Block, h: Tensor, rows: Optional[Tensor],
                       layout: Tuple[Tensor, Tensor, int]) -> Tensor:
        """``[D, K, dim_node + dim_edge + dim_time]``: ``[h_j || e_ij || phi(dt_ij)]`` per edge
        slot of the padded layout (padding slots repeat source row 0 / time 0)."""
        flat, _, K = layout
        D, M = block.num_dst, block.num_edges
        dense = flat.numel() == D * K

        def pad(v: Tensor) -> Tensor:
            return v if dense else v.new_zeros(D * K).index_copy_(0, flat, v)

        parts = []
        if self.dim_node:
            src = block.edge_index[0]
            parts.append(h.index_select(0, pad(src if rows is None else rows[src])))
        if self.dim_edge:
            e = torch.arange(M, device=flat.device)
            parts.append(block.edata["f"].float().index_select(0, pad(e)))
        parts.append(self.time_enc(pad(block.edata["dt"])))
        x = torch.cat(parts, 1) if len(parts) > 1 else parts[0]
        return x.view(D, K, -1)

    def _fused(self, block: Block, h: Tensor, rows: Optional[Tensor], seg) -> Optional[Tensor]:
        """The whole layer as one autograd node (:class:`AttentionLayer`) on the kernel
        path, or ``None`` when it does not apply (no node input, no pointwise kernel, or
        edge inputs that want a gradient: the node gives none to them)."""
        pw = POINTWISE.get() if self.dim_node else None
        f = block.edata["f"].float() if self.dim_edge else None
        dt = block.edata["dt"].float()
        if pw is None or dt.requires_grad or (f is not None and f.requires_grad):
            return None
        D, M = block.num_dst, block.num_edges
        src = block.edge_index[0]
        idx = src if rows is None else rows.index_select(0, src)
        dst_rows = torch.arange(D) if rows is None else rows[:D]
        att_mask = _mask(self.att_dropout, (M, self.num_head), h)
        out_mask = _mask(self.dropout, (D, self.dim_out), h)
        te, ln = self.time_enc.w, self.layer_norm
        args = (h, dst_rows, idx, dt, f, seg[1], att_mask, out_mask,
                self.num_head, (seg[0], pw), te.weight, te.bias, self.w_q.weight, self.w_q.bias,
                self.w_kv.weight, self.w_kv.bias, self.w_out.weight, self.w_out.bias, ln.weight,
                ln.bias, ln.eps)
        if torch.is_grad_enabled():
            return AttentionLayer.apply(*args)
        return attention_layer(*args)[0]

    def forward(self, block: Block, h: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        D, M = block.num_dst, block.num_edges
        seg = self._segment(block, h, rows) if M else None
        if seg is not None:
            out = self._fused(block, h, rows, seg)
            if out is not None:
                return out
        h_dst = h[:D] if rows is None else h.index_select(0, rows[:D])
        layout = padded_layout(block) if self.padded and seg is None else None
        if M == 0:
            agg = h.new_zeros((D, self.dim_out))
        else:
            dn = self.dim_node
            # q = W_q [h_i || phi(0)]: the phi(0) part is a constant vector. Weights are cut
            # with split, not slicing: its backward writes the parts' gradients into one
            # tensor (one copy) where each slice's backward zero-fills a full-size one
            w_h, w_t = self.w_q.weight.split([dn, self.dim_time], 1)
            q_const = F.linear(self.time_enc(h.new_zeros(1)), w_t, self.w_q.bias)
            q = torch.addmm(q_const, h_dst, w_h.t()) if dn else q_const.expand(D, -1)
        if seg is not None or (M and layout is not None):
            d = self.dim_out
            w_k, w_v = self.w_kv.weight.split([d, d], 0)
            b_k, b_v = self.w_kv.bias.split([d, d], 0)
            agg = self._attend(block, h, rows, (q.contiguous(), w_k, b_k, w_v, b_v), seg,
                               layout, True)
        elif M:
            agg = self._per_edge(block, h, rows, q, self.w_kv.bias, 0.2)
        if self.dim_node:
            w_a, w_h = self.w_out.weight.split([self.dim_out, self.dim_node], 1)
            out = torch.addmm(torch.addmm(self.w_out.bias, agg, w_a.t()), h_dst, w_h.t())
        else:
            out = F.linear(agg, self.w_out.weight, self.w_out.bias)
        return self.layer_norm(F.relu(self.dropout(out)))


    def _per_edge(self, block: Block, h: Tensor, rows: Optional[Tensor], q: Tensor,
                  bias: Optional[Tensor], slope: Optional[float]) -> Tensor:
        """The per-edge torch form: ``k, v = W_kv [h_j || e_ij || phi(dt)] (+ bias)`` for
        every edge, scores ``q_i . k_j`` per head (LeakyReLU(``slope``) unless ``None``),
        softmax over each destination's edges, dropout -> ``sum_j a_ij v_j [D, width]``."""
        D, M, H = block.num_dst, block.num_edges, self.num_head
        src, dst = block.edge_index[0], block.edge_index[1]
        dn, de = self.dim_node, self.dim_edge
        # three products (no concatenated copy of the edge rows)
        w = self.w_kv.weight
        kv = F.linear(self.time_enc(block.edata["dt"]), w[:, dn + de:], bias)
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
        logits = (q.view(D, H, -1)[dst] * k).sum(-1)
        if slope is not None:
            logits = F.leaky_relu(logits, slope)
        att = self.att_dropout(edge_softmax(logits, dst, D))
        width = w.size(0) // 2
        msg = (v * att.unsqueeze(-1)).reshape(M, width)
        return h.new_zeros((D, width)).index_add_(0, dst, msg)


def _mask(drop: nn.Module, shape, like: Tensor) -> Optional[Tensor]:
    """The multipliers ``drop`` would apply to a tensor of ``shape`` (``None``: none),
    drawn as :func:`tgl_dist.nn._pointwise.dropout` draws them."""
    if not (drop.training and drop.p > 0):
        return None
    mask = dropout_mask(shape, drop.p, like)
    return mask if mask is not None else F.dropout(like.new_ones(shape), drop.p, True)


def _is_tail_range(src: Tensor, D: int, M: int, S: int) -> bool:
    """True when edge j's source is row D + j (the sampler's layout): a slice, no gather."""
    if S != D + M:
        return False
    return bool(src[0] == D) and bool(src[-1] == D + M - 1) and bool(
        (src[1:] - src[:-1] == 1).all()) if M > 1 else bool(src[0] == D)


class TGNAttention(TemporalAttention):
    """The temporal attention of the TGN reference code and DyGLib (``gnn.att_variant: tgn``).

    .. math::
        x_i = [h_i \\| \\phi(0)], \\quad q_i = W_q x_i, \\quad
        k_j, v_j = W_k, W_v [h_j \\| e_{ij} \\| \\phi(\\Delta_{ij})] \\quad (\\text{no biases})

        \\alpha_{ij} = \\mathrm{softmax}_j(q_i \\cdot k_j / \\sqrt{d_h}) \\text{ per head, then dropout}

        o_i = \\mathrm{LayerNorm}(\\mathrm{Dropout}(W_r \\textstyle\\sum_j \\alpha_{ij} v_j + b_r) + x_i)

        \\mathrm{out}_i = W_2 \\, \\mathrm{ReLU}(W_1 [o_i \\| h_i] + b_1) + b_2

    The attention width is ``dim_node + dim_time`` (``d_h`` = that / heads), as in
    DyGLib's ``MultiHeadAttention`` + ``MergeLayer`` (Rossi et al. 2020; Yu et al. 2023).
    A destination without neighbours aggregates zero. Same shapes and arguments as
    :class:`TemporalAttention`.
    """

    def __init__(self, dim_node: int, dim_edge: int, dim_time: int, dim_out: int,
                 num_head: int = 2, dropout: float = 0.0, att_dropout: float = 0.0) -> None:
        nn.Module.__init__(self)
        if dim_time <= 0:
            raise ValueError(f"TGNAttention needs dim_time > 0, got {dim_time}")
        width = dim_node + dim_time
        if width % num_head:
            raise ValueError(f"dim_node + dim_time = {width} is not divisible by "
                             f"num_head={num_head}")
        self.dim_node, self.dim_edge, self.dim_time = dim_node, dim_edge, dim_time
        self.dim_out, self.num_head, self.width = dim_out, num_head, width
        self.time_enc = TimeEncode(dim_time)
        self.w_q = nn.Linear(width, width, bias=False)
        self.w_kv = nn.Linear(dim_node + dim_edge + dim_time, 2 * width, bias=False)
        self.w_res = nn.Linear(width, width)
        self.layer_norm = nn.LayerNorm(width)
        self.merge1 = nn.Linear(width + dim_node, dim_out)
        self.merge2 = nn.Linear(dim_out, dim_out)
        self.dropout = Dropout(dropout)
        self.att_dropout = Dropout(att_dropout)
        self.padded = True
        self.use_kernel = True

    def forward(self, block: Block, h: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        D, M, H, W = block.num_dst, block.num_edges, self.num_head, self.width
        h_dst = h[:D] if rows is None else h.index_select(0, rows[:D])
        x = torch.cat([h_dst, self.time_enc(h.new_zeros(1)).expand(D, -1)], 1)
        seg = self._segment(block, h, rows) if M else None
        layout = padded_layout(block) if self.padded and seg is None else None
        if M:
            q = F.linear(x, self.w_q.weight) * (W // H) ** -0.5
        if M == 0:
            agg = h.new_zeros((D, W))
        elif seg is not None or layout is not None:
            w_k, w_v = self.w_kv.weight.split([W, W], 0)
            agg = self._attend(block, h, rows, (q, w_k, None, w_v, None), seg, layout, False)
        else:
            agg = self._per_edge(block, h, rows, q, None, None)
        o = self.layer_norm(self.dropout(self.w_res(agg)) + x)
        if self.dim_node:
            w_o, w_h = self.merge1.weight.split([W, self.dim_node], 1)
            z = torch.addmm(torch.addmm(self.merge1.bias, o, w_o.t()), h_dst, w_h.t())
        else:
            z = self.merge1(o)
        return self.merge2(F.relu(z))
