"""TGL's temporal attention layer (:class:`tgl_dist.nn.TemporalAttention`) as ONE autograd node.

Written with torch's differentiable ops, the layer's forward records about 45 autograd
nodes (views, transposes, splits, products, the kernel, dropout, LayerNorm), and its
backward runs each one's bookkeeping and small operator calls. :class:`AttentionLayer`
runs the same forward without recording and writes the backward out: the same
products, straight into the parameters' gradients. It computes what the differentiable
form computes (``tests/models/test_attention_kernel.py`` compares it with the padded and
per-edge torch paths, values and gradients). See the layer's docstring for the math.

Shapes (D destinations, M edges in destination order, U node rows, H heads, d the
output size, ``c = d / H``, edge rows ``C = dn + de + dt`` wide)::

    h        [U, dn]   node rows; destination i reads row dst_rows[i], edge e row idx[e]
    dt       [M]       edge ages;  f [M, de] edge features (or None)
    ->       [D, d]    LayerNorm(ReLU(Dropout(W_o [sum_j a_ij v_j || h_i] + b_o)))
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from tgl_dist.nn._attention_kernel import index_add_rows, segment_backward, segment_forward
from tgl_dist.nn._pointwise import time_encoding_forward
from tgl_dist.kernels import data_ptr as _ptr


def query_terms(q: Tensor, w_k: Tensor, b_k: Optional[Tensor], num_head: int
                ) -> Tuple[Tensor, Optional[Tensor]]:
    """The query side of ``q . k_j = (W_k^T q) . x_j + q . b_k``, per destination and head.

    ``q [D, d]``, ``w_k [d, C]``, ``b_k [d]`` or ``None`` -> ``(W_k,h^T q_h [D, H, C],
    q_h . b_k,h [D, H] or None)``.
    """
    D, d = q.shape
    H, C = num_head, w_k.size(1)
    c = d // H
    qh = q.view(D, H, c).transpose(0, 1)                                    # [H, D, c]
    qk = torch.bmm(qh, w_k.view(H, c, C)).transpose(0, 1).contiguous()     # [D, H, C]
    qb = None if b_k is None else (q.view(D, H, c) * b_k.view(H, c)).sum(-1)
    return qk, qb


def value_terms(agg: Tensor, asum: Tensor, w_v: Tensor, b_v: Optional[Tensor]) -> Tensor:
    """``sum_j a_j v_j = W_v (sum_j a_j x_j) + b_v sum_j a_j`` per head, heads concatenated.

    ``agg [D, H, C]`` (sum_j a_j x_j), ``asum [D, H]`` (sum_j a_j), ``w_v [d, C]``,
    ``b_v [d]`` or ``None`` -> ``[D, d]``. One product batched over the heads.
    """
    D, H, _ = agg.shape
    c = w_v.size(0) // H
    a, w = agg.transpose(0, 1), w_v.view(H, c, -1).transpose(1, 2)       # [H, D, C], [H, C, c]
    v = (torch.bmm(a, w) if b_v is None
         else torch.baddbmm(asum.t().unsqueeze(2) * b_v.view(H, 1, c), a, w))
    return v.transpose(0, 1).reshape(D, H * c)


def _query_terms_into(q: Tensor, w_k: Tensor, b_k: Tensor, num_head: int
                      ) -> Tuple[Tensor, Tensor]:
    """:func:`query_terms` without autograd: one product per head written straight into
    the ``[D, H, C]`` layout (``bmm`` gives ``[H, D, C]``, which then needs a transposing
    copy)."""
    D, d = q.shape
    H, C = num_head, w_k.size(1)
    c = d // H
    qh, wk = q.view(D, H, c), w_k.view(H, c, C)
    qk = torch.empty(D, H, C)
    for j in range(H):
        torch.mm(qh[:, j], wk[j], out=qk[:, j])
    return qk, (qh * b_k.view(H, c)).sum(-1)


class AttentionLayer(torch.autograd.Function):
    """``apply(h, dst_rows, idx, dt, f, ptr, att_mask, out_mask, num_head, kernels, te_w,
    te_b, w_q, b_q, w_kv, b_kv, w_o, b_o, ln_w, ln_b, ln_eps) -> [D, d]``.

    ``dst_rows [D]``, ``idx [M]`` int64 rows of ``h``; ``ptr [D + 1]`` CSR offsets of the
    edges (:func:`tgl_dist.nn.attention.csr_offsets`); ``att_mask [M, H]`` and ``out_mask
    [D, d]`` dropout multipliers (or ``None``); ``kernels = (attention lib, pointwise
    lib)``. The rest are the layer's parameters: time encoding ``w [dt, 1]``, ``b [dt]``;
    ``W_q [d, dn + dt]``, ``b_q``; ``W_kv [2d, C]``, ``b_kv``; ``W_o [d, d + dn]``, ``b_o``;
    LayerNorm weight, bias and eps. Scores use LeakyReLU(0.2), as TGL. Gradients flow to
    ``h`` and the parameters (float32, CPU, ``dn > 0``).
    """

    @staticmethod
    def forward(ctx, h: Tensor, dst_rows: Tensor, idx: Tensor, dt: Tensor, f: Optional[Tensor],
                ptr: Tensor, att_mask: Optional[Tensor], out_mask: Optional[Tensor],
                num_head: int, kernels, te_w: Tensor, te_b: Tensor, w_q: Tensor, b_q: Tensor,
                w_kv: Tensor, b_kv: Tensor, w_o: Tensor, b_o: Tensor, ln_w: Tensor, ln_b: Tensor,
                ln_eps: float) -> Tensor:
        keep_sin = ctx.needs_input_grad[10] or ctx.needs_input_grad[11]
        z, saved = attention_layer(h, dst_rows, idx, dt, f, ptr, att_mask, out_mask, num_head,
                                   kernels, te_w, te_b, w_q, b_q, w_kv, b_kv, w_o, b_o, ln_w,
                                   ln_b, ln_eps, keep_sin)
        ctx.save_for_backward(*saved)
        ctx.H, ctx.att = num_head, kernels[0]   # the backward needs no pointwise kernel
        ctx.whole = saved[18].dim() == 1   # the compiled forward's LayerNorm mean is [D]
        return z

    @staticmethod
    def backward(ctx, gz: Tensor):
        if ctx.whole:
            return _whole_backward(ctx, gz)
        (h, dst_rows, idx, dt, ptr, att_mask, out_mask, vh, x, sinz, c0, q, qk, s, alpha,
         agg, asum, r, mean, rstd, te_w, te_b, w_q, w_kv, b_kv, w_o, ln_w,
         ln_b) = ctx.saved_tensors
        need = ctx.needs_input_grad
        att, H = ctx.att, ctx.H
        D, d, dn = q.size(0), q.size(1), h.size(1)
        c, dtd = d // H, te_w.numel()
        # LayerNorm, ReLU and dropout
        gr, g_lnw, g_lnb = torch.ops.aten.native_layer_norm_backward(
            gz.contiguous(), r, [d], mean, rstd, ln_w, ln_b, [True, need[18], need[19]])
        go = torch.ops.aten.threshold_backward(gr, r, 0.0)
        if out_mask is not None:
            go = go * out_mask
        # o = W_o [v || h_dst] + b_o
        g_wo = go.t().mm(vh)
        g_bo = go.sum(0)
        g_vh = go.mm(w_o)                                                      # [D, d + dn]
        gv, g_hdst = g_vh[:, :d], g_vh[:, d:]
        h_dst = vh[:, d:]
        # v_j = W_v,j agg_j + b_v,j asum_j
        # (every product per head j, batched over the heads: [H, ...] views)
        w_k, w_v = w_kv.view(2, H, c, -1).unbind(0)                           # [H, c, C]
        b_k, b_v = b_kv.view(2, H, c).unbind(0)
        g_wkv, g_bkv = torch.empty_like(w_kv), torch.empty_like(b_kv)
        g_agg = torch.empty_like(agg)
        gvh = gv.view(D, H, c)
        torch.bmm(gvh.permute(1, 2, 0), agg.transpose(0, 1), out=g_wkv[d:].view(H, c, -1))
        for j in range(H):   # per head, straight into g_agg's [D, H, C] layout (no copy)
            torch.mm(gv[:, j * c:(j + 1) * c], w_v[j], out=g_agg[:, j])
        torch.bmm(asum.t().unsqueeze(1), gvh.transpose(0, 1), out=g_bkv[d:].view(H, 1, c))
        g_asum = (gvh * b_v).sum(2)
        # (the time encoding's backward runs inside the kernel's pass over the edges)
        g_qk, g_qb, g_h, g_te = segment_backward(att, att.threads(), qk, True, h, idx, x, ptr,
                                                 att_mask, 0.2, s, alpha, g_agg, g_asum,
                                                 time_enc=(dt, sinz))
        # qk_j = W_k,j^T q_j, qb_j = q_j . b_k,j
        g_q = torch.empty(D, d)
        qh = q.view(D, H, c)
        for j in range(H):
            torch.mm(g_qk[:, j], w_k[j].t(), out=g_q[:, j * c:(j + 1) * c])
        g_q.view(D, H, c).addcmul_(g_qb.unsqueeze(2), b_k.unsqueeze(0))
        torch.bmm(qh.permute(1, 2, 0), g_qk.transpose(0, 1), out=g_wkv[:d].view(H, c, -1))
        torch.bmm(g_qb.t().unsqueeze(1), qh.transpose(0, 1), out=g_bkv[:d].view(H, 1, c))
        # q = W_qh h_dst + W_qt cos(b) + b_q
        w_qh, w_qt = w_q.split([dn, dtd], 1)
        g_wq = torch.empty_like(w_q)
        torch.mm(g_q.t(), h_dst, out=g_wq[:, :dn])
        g_bq = g_q.sum(0)
        torch.outer(g_bq, c0, out=g_wq[:, dn:])
        g_hdst.addmm_(g_q, w_qh)
        index_add_rows(g_h, dst_rows, g_hdst)
        # time encoding: the edges' rows (from the kernel) and phi(0)
        g_tew = g_teb = None
        if g_te is not None:
            g_tew, g_teb = g_te
            g_teb.addcmul_(torch.sin(te_b), w_qt.t().mv(g_bq), value=-1.0)
            g_tew = g_tew.view_as(te_w)
        return (g_h, None, None, None, None, None, None, None, None, None, g_tew, g_teb,
                g_wq if need[12] else None, g_bq if need[13] else None,
                g_wkv if need[14] else None, g_bkv if need[15] else None,
                g_wo if need[16] else None, g_bo if need[17] else None, g_lnw, g_lnb, None)


def attention_layer(h: Tensor, dst_rows: Tensor, idx: Tensor, dt: Tensor, f: Optional[Tensor],
                    ptr: Tensor, att_mask: Optional[Tensor], out_mask: Optional[Tensor],
                    num_head: int, kernels, te_w: Tensor, te_b: Tensor, w_q: Tensor, b_q: Tensor,
                    w_kv: Tensor, b_kv: Tensor, w_o: Tensor, b_o: Tensor, ln_w: Tensor,
                    ln_b: Tensor, ln_eps: float, keep_sin: bool = False):
    """:class:`AttentionLayer`'s forward without autograd (the layer in evaluation calls it
    directly): ``(out [D, d], what the backward needs)``; ``keep_sin``: keep the time
    encoding's ``sin(z)`` for its gradient."""
    att, pw = kernels
    H, D, dn = num_head, dst_rows.numel(), h.size(1)
    d, dtd = w_q.size(0), te_w.numel()
    h = h.contiguous()
    if _whole_layer(att, h, dt, f, w_q, b_q, w_kv, b_kv, w_o, b_o, ln_w, ln_b, te_w, te_b,
                    att_mask, out_mask):
        return _whole_forward(h, dst_rows, idx, dt, f, ptr, att_mask, out_mask, H, att, pw,
                              te_w, te_b, w_q, b_q, w_kv, b_kv, w_o, b_o, ln_w, ln_b, ln_eps,
                              keep_sin)
    # [v || h_dst]: the output product's input, one [D, d + dn] matrix
    vh = torch.empty(D, d + dn)
    h_dst = vh[:, d:]
    torch.index_select(h, 0, dst_rows, out=h_dst)
    # edge rows [f || phi(dt)]; the query's time part is phi(0) = cos(b)
    x, sinz = time_encoding_forward(pw, dt.contiguous(), te_w.view(-1), te_b, f, keep_sin)
    c0 = torch.cos(te_b)
    w_qh, w_qt = w_q.split([dn, dtd], 1)
    q = torch.addmm(torch.addmv(b_q, w_qt, c0), h_dst, w_qh.t())          # [D, d]
    # q . k_e = (W_k,j^T q_j) . x_e + q_j . b_k,j per head j (no per-edge keys)
    w_k, w_v = w_kv.split([d, d], 0)
    b_k, b_v = b_kv.split([d, d], 0)
    qk, qb = _query_terms_into(q, w_k, b_k, H)                           # [D, H, C], [D, H]
    agg, asum, s, alpha = segment_forward(att, att.threads(), qk, qb, h, idx, x, ptr,
                                          att_mask, 0.2)
    # sum_e a_e v_e = W_v,j agg_j + b_v,j asum_j per head j
    c = d // H
    wv = w_v.view(H, c, -1)
    for j in range(H):   # per head, straight into vh's columns (no copy)
        torch.mm(agg[:, j], wv[j].t(), out=vh[:, j * c:(j + 1) * c])
    vh[:, :d].view(D, H, c).addcmul_(asum.unsqueeze(2), b_v.view(1, H, c))
    o = torch.addmm(b_o, vh, w_o.t())
    r = torch.relu(o if out_mask is None else o * out_mask)
    z, mean, rstd = torch.native_layer_norm(r, [d], ln_w, ln_b, ln_eps)
    return z, (h, dst_rows, idx, dt, ptr, att_mask, out_mask, vh, x, sinz, c0, q, qk, s,
               alpha, agg, asum, r, mean, rstd, te_w, te_b, w_q, w_kv, b_kv, w_o, ln_w, ln_b)


# ---------------------------------------------------------------------------------------
# The whole layer in one compiled call each way (tgl_att_layer_fwd / _bwd in _attention.c:
# the same products through torch's own sgemm_, the per-edge passes, and the small row
# operations as plain loops instead of ~50 torch operators and their Python)


def _whole_layer(att, *tensors: Optional[Tensor]) -> bool:
    """Whether the compiled whole-layer calls apply: the kernel found torch's BLAS
    (``blas``) and every tensor is a contiguous float32 CPU one (or ``None``)."""
    return bool(getattr(att, "blas", False)) and all(
        t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous())
        for t in tensors)


def _whole_forward(h, dst_rows, idx, dt, f, ptr, att_mask, out_mask, H, att, pw, te_w, te_b,
                   w_q, b_q, w_kv, b_kv, w_o, b_o, ln_w, ln_b, ln_eps, keep_sin):
    """:func:`attention_layer` as one call of ``tgl_att_layer_fwd`` (after the edges' time
    encoding): ``(out [D, d], saved)``, the torch form's layout and, after it, the query
    side's distinct rows and the edge features ``f`` (read in place: the edges' rows are
    ``[h[idx] || f || phi(dt)]`` with ``x = phi(dt)`` alone here, no copy of ``f``)."""
    D, M, (U, dn) = dst_rows.numel(), idx.numel(), h.shape
    d, dtd = w_q.size(0), te_w.numel()
    dst_rows, idx, ptr = dst_rows.contiguous(), idx.contiguous(), ptr.contiguous()
    x, sinz = time_encoding_forward(pw, dt.contiguous(), te_w.view(-1), te_b, None, keep_sin)
    cf, cx = (0 if f is None else f.size(1)), x.size(1)
    C = dn + cf + cx
    c0 = torch.cos(te_b)
    e = torch.empty
    vh, q, qk, qb = e(D, d), e(D, d), e(D, H, C), e(D, H)   # vh: v alone here
    s, alpha, agg, asum = e(M, H), e(M, H), e(D, H, C), e(D, H)
    r, mean, rstd, z = e(D, d), e(D), e(D), e(D, d)
    i64 = torch.int64   # the query side's distinct rows (the first nq[0] of each buffer)
    qmap, qrows, hq, nq = e(D, dtype=i64), e(D, dtype=i64), e(D, dn), e(1, dtype=i64)
    rc = att.tgl_att_layer_fwd(
        D, M, U, H, dn, cx, d, dtd, h.data_ptr(), dst_rows.data_ptr(), idx.data_ptr(),
        _ptr(f), cf, x.data_ptr(), ptr.data_ptr(), _ptr(att_mask), _ptr(out_mask), 0.2,
        c0.data_ptr(),
        w_q.data_ptr(), b_q.data_ptr(), w_kv.data_ptr(), b_kv.data_ptr(), w_o.data_ptr(),
        b_o.data_ptr(), ln_w.data_ptr(), ln_b.data_ptr(), float(ln_eps), vh.data_ptr(),
        q.data_ptr(), qk.data_ptr(), qb.data_ptr(), s.data_ptr(), alpha.data_ptr(),
        agg.data_ptr(), asum.data_ptr(), r.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
        z.data_ptr(), qmap.data_ptr(), qrows.data_ptr(), hq.data_ptr(), nq.data_ptr(),
        max(1, int(att.threads())))
    if rc == -1:
        raise IndexError(f"attention layer: destination or edge rows must lie in 0..{U - 1}")
    if rc != 0:
        raise RuntimeError(f"attention layer: the compiled call failed ({rc})")
    return z, (h, dst_rows, idx, dt, ptr, att_mask, out_mask, vh, x, sinz, c0, q, qk, s,
               alpha, agg, asum, r, mean, rstd, te_w, te_b, w_q, w_kv, b_kv, w_o, ln_w, ln_b,
               qmap, qrows, hq, nq, f)


def _whole_backward(ctx, gz: Tensor):
    """:meth:`AttentionLayer.backward` as one call of ``tgl_att_layer_bwd``."""
    (h, dst_rows, idx, dt, ptr, att_mask, out_mask, vh, x, sinz, c0, q, qk, s, alpha, agg,
     asum, r, mean, rstd, te_w, te_b, w_q, w_kv, b_kv, w_o, ln_w, ln_b, qmap, qrows, hq,
     nq, f) = ctx.saved_tensors
    need = ctx.needs_input_grad
    H, att = ctx.H, ctx.att
    (D, d), (M, _), (U, dn) = q.shape, s.shape, h.shape
    cf, cx, dtd = (0 if f is None else f.size(1)), x.size(1), te_w.numel()
    C = dn + cf + cx
    e = torch.empty
    gz = gz.contiguous()
    g_h, g_wq, g_bq = e(U, dn), torch.empty_like(w_q), e(d)
    g_wkv, g_bkv = torch.empty_like(w_kv), torch.empty_like(b_kv)
    g_wo, g_bo, g_lnw, g_lnb = torch.empty_like(w_o), e(d), e(d), e(d)
    te = sinz is not None
    g_tw, g_tb, part = (e(dtd), e(dtd), e(D, 2 * dtd)) if te else (None, None, None)
    go, g_v, g_agg, g_qk = e(D, d), e(D, d), e(D, H, C), e(D, H, C)
    g_asum, g_qb, g_q, g_xh, tmp = e(D, H), e(D, H), e(D, d), e(M, dn), e(M, H)
    Dq = int(nq[0])
    g_hq = e(Dq, dn)
    rc = att.tgl_att_layer_bwd(
        D, M, U, H, dn, cx, d, dtd, gz.data_ptr(), h.data_ptr(), idx.data_ptr(), _ptr(f), cf,
        x.data_ptr(), ptr.data_ptr(), _ptr(att_mask), _ptr(out_mask), 0.2, dt.data_ptr(),
        _ptr(sinz), c0.data_ptr(), te_b.data_ptr(), w_q.data_ptr(),
        w_kv.data_ptr(), b_kv.data_ptr(), w_o.data_ptr(), ln_w.data_ptr(), vh.data_ptr(),
        q.data_ptr(), qk.data_ptr(), s.data_ptr(), alpha.data_ptr(), agg.data_ptr(),
        asum.data_ptr(), r.data_ptr(), mean.data_ptr(), rstd.data_ptr(), g_h.data_ptr(),
        g_wq.data_ptr(), g_bq.data_ptr(), g_wkv.data_ptr(), g_bkv.data_ptr(), g_wo.data_ptr(),
        g_bo.data_ptr(), g_lnw.data_ptr(), g_lnb.data_ptr(), _ptr(g_tw), _ptr(g_tb), go.data_ptr(),
        g_v.data_ptr(), g_agg.data_ptr(), g_qk.data_ptr(), g_asum.data_ptr(), g_qb.data_ptr(),
        g_q.data_ptr(), g_xh.data_ptr(), tmp.data_ptr(), _ptr(part), Dq, qmap.data_ptr(),
        qrows.data_ptr(), hq.data_ptr(), g_hq.data_ptr(), max(1, int(att.threads())))
    if rc != 0:
        raise RuntimeError(f"attention layer: the compiled backward failed ({rc})")
    return (g_h if need[0] else None, None, None, None, None, None, None, None, None, None,
            g_tw.view_as(te_w) if te and need[10] else None, g_tb if te and need[11] else None,
            g_wq if need[12] else None, g_bq if need[13] else None,
            g_wkv if need[14] else None, g_bkv if need[15] else None,
            g_wo if need[16] else None, g_bo if need[17] else None,
            g_lnw if need[18] else None, g_lnb if need[19] else None, None)
