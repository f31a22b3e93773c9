"""TGL's temporal attention layer (:class:`tgl_dist.nn.TemporalAttention`) as ONE autograd node.

Written with torch's differentiable ops, the layer's forward records about 45 autograd
nodes (views, transposes, splits, products, the kernel, dropout, LayerNorm), and its
backward runs each one's bookkeeping and small operator calls. :class:`AttentionLayer`
runs the same forward without recording and writes the backward out: the same
products, straight into the parameters' gradients. It computes what the differentiable
form computes (``tests/ctdg/test_attention_kernel.py`` compares it with the layer's
per-edge torch reference, values and gradients). See the layer's docstring for the math.

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
        return z

    @staticmethod
    def backward(ctx, gz: Tensor):
        return _whole_backward(ctx, gz)


def attention_layer(h: Tensor, dst_rows: Tensor, idx: Tensor, dt: Tensor, f: Optional[Tensor],
                    ptr: Tensor, att_mask: Optional[Tensor], out_mask: Optional[Tensor],
                    num_head: int, kernels, te_w: Tensor, te_b: Tensor, w_q: Tensor, b_q: Tensor,
                    w_kv: Tensor, b_kv: Tensor, w_o: Tensor, b_o: Tensor, ln_w: Tensor,
                    ln_b: Tensor, ln_eps: float, keep_sin: bool = False):
    """:class:`AttentionLayer`'s forward without autograd (the layer in evaluation calls it
    directly): ``(out [D, d], what the backward needs)``; ``keep_sin``: keep the time
    encoding's ``sin(z)`` for its gradient."""
    att, pw = kernels
    if not _whole_layer(att, h, dt, f, w_q, b_q, w_kv, b_kv, w_o, b_o, ln_w, ln_b, te_w, te_b,
                        att_mask, out_mask):
        raise ValueError("attention_layer: the compiled layer needs torch's BLAS and contiguous "
                         "float32 CPU tensors (TemporalAttention.forward checks)")
    return _whole_forward(h, dst_rows, idx, dt, f, ptr, att_mask, out_mask, num_head, att, pw,
                          te_w, te_b, w_q, b_q, w_kv, b_kv, w_o, b_o, ln_w, ln_b, ln_eps,
                          keep_sin)


# ---------------------------------------------------------------------------------------
# The whole layer in one compiled call each way (tgl_att_layer_fwd / _bwd in kernels/attention.c:
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
