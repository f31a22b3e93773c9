"""The compiled segment-attention kernel (``_attention.c``) and its autograd function.

Built and cached like every kernel (:data:`tgl_dist.kernels.ATTENTION`: plain C, the
system compiler, about a second on first use), with OpenMP: destinations are split over
torch's own worker threads (:func:`tgl_dist.kernels.runtime.openmp_threads`). :func:`get_attention_kernel`
returns ``None`` when it cannot be built; the attention layers then run their torch
reference (``reference()``, per edge), which computes the same values
(``tests/ctdg/test_attention_kernel.py`` compares them), and ONE warning per process
says why. ``TGL_DIST_NO_KERNEL=1`` selects the torch reference without a warning.

:class:`SegmentAttention` is what :class:`tgl_dist.nn.TGNAttention` calls on CPU float32. Shapes (D destinations, M edges in
destination order, H heads, Cx the width of an edge's input row)::

    qx   [D, H, Cx]  per-head query folded into the key projection (W_k,h^T q_h)
    qb   [D, H]      per-head q . b_k (or None)
    X    [M, Cx]     edge input rows [h_j || e_ij || phi(dt_ij)] (the h_j part gathered in
                     the kernel from node rows hs [U, dn] by idx [M])
    ptr  [D + 1]     int64 CSR offsets: the edges of d are rows ptr[d] .. ptr[d+1]-1
    mask [M, H]      attention-dropout multipliers (or None)
    ->  aggx [D, H, Cx] = sum_e w[e,h] X[e],  asum [D, H] = sum_e w[e,h]

with ``w = softmax_e(act(qx . X + qb)) * mask`` per destination and head.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tgl_dist.kernels import ATTENTION as KERNEL
from tgl_dist.kernels import data_ptr as _ptr

MAX_HEADS = 16  # HMAX in kernels/attention.c


def get_attention_kernel():
    """The kernel, or ``None`` with one warning per process (``Library.get``)."""
    return KERNEL.get()


def csr_from_dst(dst: Tensor, num_dst: int) -> Optional[Tensor]:
    """``ptr [D + 1]`` (int64) of edges listed by destination ``dst [M]`` (the edges of d are
    ``ptr[d] .. ptr[d+1]-1``), or ``None`` when ``dst`` is not sorted. One pass of the
    compiled kernel for int64 on the CPU (torch's ``bincount`` + ``cumsum`` otherwise).

    Raises:
        IndexError: a destination outside ``0 .. num_dst - 1``.
    """
    lib = KERNEL.get() if dst.device.type == "cpu" and dst.dtype == torch.long else None
    if lib is None:
        if dst.numel() > 1 and not bool((dst[1:] >= dst[:-1]).all()):
            return None
        ptr = torch.zeros(num_dst + 1, dtype=torch.long, device=dst.device)
        torch.cumsum(torch.bincount(dst, minlength=num_dst), 0, out=ptr[1:])
        return ptr
    dst = dst.contiguous()
    ptr = torch.empty(num_dst + 1, dtype=torch.long)
    rc = lib.tgl_att_csr(dst.numel(), num_dst, dst.data_ptr(), ptr.data_ptr())
    if rc < 0:
        raise IndexError(f"edge destinations must lie in 0..{num_dst - 1}")
    return ptr if rc == 0 else None


class SegmentAttention(torch.autograd.Function):
    """``(aggx [D, H, dn + cx], asum [D, H])`` (see the module docstring).

    Edge e's input row is ``[hs[idx[e]] || X[e]]``: ``hs [U, dn]`` node rows gathered by
    ``idx [M]`` inside the kernel (no ``[M, dn]`` copy; their gradient is summed back
    into ``[U, dn]`` there too) and ``X [M, cx]`` the edge's own part. Either may be
    ``None``. Gradients flow to ``qx``, ``qb``, ``hs`` and ``X``; ``idx``, ``ptr`` and
    ``mask`` are data. ``slope``: LeakyReLU slope of the scores, or ``None``.
    """

    @staticmethod
    def forward(ctx, qx: Tensor, qb: Optional[Tensor], hs: Optional[Tensor], idx: Optional[Tensor],
                X: Optional[Tensor], ptr: Tensor, mask: Optional[Tensor], slope: Optional[float],
                lib, threads: int):
        qx, ptr = qx.contiguous(), ptr.contiguous()
        qb, hs, idx, X, mask = (None if t is None else t.contiguous() for t in (qb, hs, idx, X, mask))
        aggx, asum, s, alpha = segment_forward(lib, threads, qx, qb, hs, idx, X, ptr, mask, slope)
        ctx.save_for_backward(qx, hs, idx, X, ptr, mask, s, alpha)
        ctx.has_qb, ctx.slope, ctx.lib, ctx.threads = qb is not None, slope, lib, threads
        return aggx, asum

    @staticmethod
    def backward(ctx, g_aggx: Tensor, g_asum: Optional[Tensor]):
        qx, hs, idx, X, ptr, mask, s, alpha = ctx.saved_tensors
        g_qx, g_qb, g_hs, g_X = segment_backward(ctx.lib, ctx.threads, qx, ctx.has_qb, hs, idx, X,
                                                 ptr, mask, ctx.slope, s, alpha, g_aggx, g_asum)
        return g_qx, g_qb, g_hs, None, g_X, None, None, None, None, None


def segment_forward(lib, threads: int, qx: Tensor, qb: Optional[Tensor], hs: Optional[Tensor],
                    idx: Optional[Tensor], X: Optional[Tensor], ptr: Tensor, mask: Optional[Tensor],
                    slope: Optional[float]):
    """The kernel's forward, no autograd, on contiguous tensors: ``(aggx, asum, s, alpha)``
    (``s``, ``alpha [M, H]``: the scores and weights :func:`segment_backward` needs)."""
    D, H, Cx = qx.shape
    if H > MAX_HEADS:
        raise ValueError(f"the attention kernel supports at most {MAX_HEADS} heads, got {H}")
    M = int(ptr[-1])
    dn = 0 if hs is None else hs.size(1)
    cx = 0 if X is None else X.size(1)
    if dn + cx != Cx:
        raise ValueError(f"qx has width {Cx} but the edge rows have {dn} + {cx}")
    if dn and (idx is None or idx.numel() != M or (M and not 0 <= int(idx.min()) <= int(idx.max()) < hs.size(0))):
        raise ValueError(f"idx must hold {M} row numbers of hs (0..{hs.size(0) - 1})")
    s, alpha = torch.empty(M, H), torch.empty(M, H)
    aggx, asum = torch.empty(D, H, Cx), torch.empty(D, H)
    lib.tgl_att_fwd(D, H, dn, cx, ptr.data_ptr(), qx.data_ptr(), _ptr(qb), _ptr(hs), _ptr(idx),
                    _ptr(X), _ptr(mask), 0 if slope is None else 1, float(slope or 0.0),
                    s.data_ptr(), alpha.data_ptr(), aggx.data_ptr(), asum.data_ptr(),
                    max(1, int(threads)))
    return aggx, asum, s, alpha


def segment_backward(lib, threads: int, qx: Tensor, has_qb: bool, hs: Optional[Tensor],
                     idx: Optional[Tensor], X: Optional[Tensor], ptr: Tensor,
                     mask: Optional[Tensor], slope: Optional[float], s: Tensor, alpha: Tensor,
                     g_aggx: Optional[Tensor], g_asum: Optional[Tensor]):
    """``(g_qx, g_qb or None, g_hs or None, g_X or None)`` from the forward's inputs and
    ``s, alpha`` and the outputs' gradients (``None``: zero)."""
    D, H, Cx = qx.shape
    M = s.size(0)
    dn = 0 if hs is None else hs.size(1)
    cx = 0 if X is None else X.size(1)
    g_aggx = g_aggx.contiguous() if g_aggx is not None else torch.zeros_like(qx)
    g_asum = None if g_asum is None else g_asum.contiguous()
    g_qx = torch.empty_like(qx)
    g_qb = torch.empty(D, H) if has_qb else None
    g_X = None if X is None else torch.empty_like(X)
    g_xh = torch.empty(M, dn) if dn else None
    g_hs = torch.empty_like(hs) if dn else None
    tmp = torch.empty_like(alpha)
    U = 0 if hs is None else hs.size(0)
    # td = 0: no time encoding folded in (the whole-layer call folds it, in C)
    lib.tgl_att_bwd(D, H, dn, cx, U, ptr.data_ptr(), qx.data_ptr(), _ptr(hs), _ptr(idx), _ptr(X),
                    _ptr(mask), 0 if slope is None else 1, float(slope or 0.0), s.data_ptr(),
                    alpha.data_ptr(), g_aggx.data_ptr(), _ptr(g_asum), g_qx.data_ptr(),
                    _ptr(g_qb), _ptr(g_X), _ptr(g_xh), _ptr(g_hs), tmp.data_ptr(), 0, None,
                    None, None, None, None, max(1, int(threads)))
    return g_qx, g_qb, g_hs, g_X
