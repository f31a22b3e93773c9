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

from tgl_dist.nn._attention_kernel import (MAX_HEADS, SegmentAttention, csr_from_dst,
                                           get_attention_kernel)
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


def csr_offsets(block: Block) -> Optional[Tensor]:
    """``ptr [D + 1]``: the edges of destination d are ``ptr[d] .. ptr[d+1]-1`` (CSR), or
    ``None`` when the edges are not grouped by destination."""
    return csr_from_dst(block.edge_index[1], block.num_dst)


def segment_attend(q: Tensor, w_k: Tensor, b_k: Optional[Tensor], w_v: Tensor,
                   b_v: Optional[Tensor], hs: Optional[Tensor], idx: Optional[Tensor],
                   x: Tensor, ptr: Tensor, num_head: int, leaky: bool, att_dropout: nn.Module,
                   lib) -> Tensor:
    """Multi-head attention of each destination over its edges' inputs, the per-edge part
    in the compiled kernel (edges in CSR order), without per-edge keys.

    ``k_j = W_k x_j + b_k``, ``v_j = W_v x_j + b_v``; the products are re-associated so no
    ``[M, 2 d]`` key/value tensor is formed: ``q . k_j = (W_k^T q) . x_j + q . b_k`` and
    ``sum_j a_j v_j = W_v (sum_j a_j x_j) + b_v sum_j a_j`` (exact algebra). The scores,
    the softmax over each destination's edges,
    the attention dropout and the weighted sum of the ``x_j`` run in one pass of
    :class:`tgl_dist.nn._attention_kernel.SegmentAttention` (forward and backward), with
    no padding and no per-edge copy of the node rows.

    Args:
        hs: ``[U, dn]`` node rows (or ``None`` when dn = 0); edge e's input row is
            ``x_e = [hs[idx[e]] || x[e]]``. idx: ``[M]`` int64.
        x: ``[M, C - dn]`` the edges' own inputs, edges of destination d at rows
            ``ptr[d] .. ptr[d+1]-1``. ptr: ``[D + 1]`` int64 (:func:`csr_offsets`).
        q: ``[D, d]`` queries (already scaled when the layer scales). w_k, w_v: ``[d, C]``;
        b_k, b_v: ``[d]`` or ``None``. leaky: LeakyReLU(0.2) on the scores (TGL).
    Returns:
        ``[D, d]``; zero for a destination without edges.
    """
    M, H = x.size(0), num_head
    qk, qb = query_terms(q, w_k, b_k, H)                                   # [D, H, C], [D, H]
    mask = _mask(att_dropout, (M, H), x)
    agg, asum = SegmentAttention.apply(qk, qb, hs, idx, x, ptr, mask, 0.2 if leaky else None,
                                       lib, lib.threads())  # [D, H, C], [D, H]
    return value_terms(agg, asum, w_v, b_v)


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

    Two implementations, one dispatch point (:meth:`forward`): on CPU float32 with the
    compiled kernels, node input, edges grouped by destination (the sampler's blocks) and
    edge inputs that want no gradient, the layer runs as ONE autograd node with a
    written-out backward whose every pass is one compiled call (:class:`AttentionLayer`);
    anywhere else (GPU, other dtypes, ``TGL_DIST_NO_KERNEL=1``) it runs
    :meth:`reference`, the per-edge torch form, which computes the same values and
    gradients (``tests/ctdg/test_attention_kernel.py``) for any block.
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

    def _segment(self, block: Block, h: Tensor):
        """``(attention lib, ptr)`` when the compiled kernel can attend over this block
        (float32 CPU input, edges grouped by destination), else ``None``."""
        if block.num_edges == 0 or self.num_head > MAX_HEADS or not _cpu_f32(h):
            return None
        if block.edata["dt"].device.type != "cpu":
            return None
        lib = get_attention_kernel()
        if lib is None:
            return None
        ptr = csr_offsets(block)
        return None if ptr is None else (lib, ptr)

    def _compiled_args(self, block: Block, h: Tensor, rows: Optional[Tensor]):
        """The arguments of :class:`AttentionLayer` when the compiled layer applies to this
        call (see the class docstring), else ``None``."""
        if not self.dim_node:
            return None
        seg = self._segment(block, h)
        pw = POINTWISE.get() if seg is not None else None
        if pw is None or not getattr(seg[0], "blas", False):
            return None
        f = block.edata["f"].float() if self.dim_edge else None
        dt = block.edata["dt"].float()
        te, ln = self.time_enc.w, self.layer_norm
        params = (te.weight, te.bias, self.w_q.weight, self.w_q.bias, self.w_kv.weight,
                  self.w_kv.bias, self.w_out.weight, self.w_out.bias, ln.weight, ln.bias)
        if (dt.requires_grad or (f is not None and f.requires_grad)
                or not all(_cpu_f32(t) and t.is_contiguous() for t in params)):
            return None
        D, M = block.num_dst, block.num_edges
        src = block.edge_index[0]
        idx = src if rows is None else rows.index_select(0, src)
        dst_rows = torch.arange(D) if rows is None else rows[:D]
        att_mask = _mask(self.att_dropout, (M, self.num_head), h)
        out_mask = _mask(self.dropout, (D, self.dim_out), h)
        return (h.contiguous(), dst_rows, idx, dt.contiguous(),
                None if f is None else f.contiguous(), seg[1], att_mask, out_mask,
                self.num_head, (seg[0], pw), *params, ln.eps)

    def forward(self, block: Block, h: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        args = self._compiled_args(block, h, rows)
        if args is None:
            return self.reference(block, h, rows)
        if torch.is_grad_enabled():
            return AttentionLayer.apply(*args)
        return attention_layer(*args)[0]

    def reference(self, block: Block, h: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        """The layer in torch's differentiable operators, per edge: any device, dtype and
        block (edges in any order). :meth:`forward` runs it wherever the compiled layer
        does not apply."""
        D, M = block.num_dst, block.num_edges
        h_dst = h[:D] if rows is None else h.index_select(0, rows[:D])
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


def _cpu_f32(t: Tensor) -> bool:
    return t.device.type == "cpu" and t.dtype == torch.float32


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

    def forward(self, block: Block, h: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        return self._forward(block, h, rows, self._segment(block, h))

    def reference(self, block: Block, h: Tensor, rows: Optional[Tensor] = None) -> Tensor:
        """The layer in torch's differentiable operators, per edge (any device, dtype and
        block); :meth:`forward` runs it wherever the compiled segment attention does not
        apply."""
        return self._forward(block, h, rows, None)

    def _forward(self, block: Block, h: Tensor, rows: Optional[Tensor], seg) -> Tensor:
        """The layer; its attention by the compiled segment kernel (``seg`` from
        :meth:`_segment`, CPU float32) or, with ``seg = None``, per edge in torch."""
        D, M, H, W = block.num_dst, block.num_edges, self.num_head, self.width
        h_dst = h[:D] if rows is None else h.index_select(0, rows[:D])
        x = torch.cat([h_dst, self.time_enc(h.new_zeros(1)).expand(D, -1)], 1)
        if M == 0:
            agg = h.new_zeros((D, W))
        else:
            q = F.linear(x, self.w_q.weight) * (W // H) ** -0.5
            if seg is not None:
                w_k, w_v = self.w_kv.weight.split([W, W], 0)
                agg = segment_attend(q.contiguous(), w_k, None, w_v, None,
                                     *self._segment_inputs(block, h, rows), seg[1], H, False,
                                     self.att_dropout, seg[0])
            else:
                agg = self._per_edge(block, h, rows, q, None, None)
        o = self.layer_norm(self.dropout(self.w_res(agg)) + x)
        if self.dim_node:
            w_o, w_h = self.merge1.weight.split([W, self.dim_node], 1)
            z = torch.addmm(torch.addmm(self.merge1.bias, o, w_o.t()), h_dst, w_h.t())
        else:
            z = self.merge1(o)
        return self.merge2(F.relu(z))

    def _segment_inputs(self, block: Block, h: Tensor, rows: Optional[Tensor]):
        """``(hs, idx, x)`` for :func:`segment_attend`: node rows with each edge's source row,
        and ``x [M, dim_edge + dim_time] = [e_ij || phi(dt_ij)]``."""
        hs = idx = None
        if self.dim_node:
            src = block.edge_index[0]
            hs, idx = h, (src if rows is None else rows.index_select(0, src))
        x = self.time_enc(block.edata["dt"], block.edata["f"].float() if self.dim_edge else None)
        return hs, idx, x
