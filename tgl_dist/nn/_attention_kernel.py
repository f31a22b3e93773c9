"""The compiled segment-attention kernel (``_attention.c``) and its autograd function.

Built and cached like every kernel (:data:`tgl_dist.kernels.ATTENTION`: plain C, the
system compiler, about a second on first use), with OpenMP: destinations are split over
torch's own worker threads (:func:`tgl_dist.kernels.runtime.openmp_threads`). :func:`get_attention_kernel`
returns ``None`` when it cannot be built; the attention layers then use their torch
formulations, which compute the same values (``tests/models/test_attention_kernel.py``
compares all three), and ONE warning per process says why.
``TGL_DIST_NO_KERNEL=1`` selects the torch paths without a warning.

:class:`SegmentAttention` is what the layers call. Shapes (D destinations, M edges in
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

import torch
from torch import Tensor

from tgl_dist.kernels import ATTENTION as KERNEL
from tgl_dist.kernels import data_ptr as _ptr

MAX_HEADS = 16  # HMAX in _attention.c
def load_attention_kernel():
    """The process's kernel (:meth:`tgl_dist.kernels.Library.load`)."""
    return KERNEL.load()


def get_attention_kernel():
    """The kernel, or ``None`` with one warning per process (``Library.get``)."""
    return KERNEL.get()


def kernel_usable(*tensors: Optional[Tensor]) -> bool:
    """Whether the kernel applies: float32 tensors on the CPU."""
    return all(t is None or (t.device.type == "cpu" and t.dtype == torch.float32) for t in tensors)


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


def index_add_rows(out: Tensor, idx: Tensor, src: Tensor) -> Tensor:
    """``out.index_add_(0, idx, src)`` (``out [U, d]``, ``idx [n]`` int64, ``src [n, d]``),
    summing in row order: a serial loop of the compiled kernel for float32 on the CPU
    (torch's CPU ``index_add_`` goes through a generic scatter, several times slower on
    TGN's ``[600, 100]`` rows); torch's ``index_add_`` otherwise. Returns ``out``."""
    lib = None
    if (kernel_usable(out, src) and out.dim() == 2 and out.is_contiguous() and src.dim() == 2
            and src.stride(1) == 1 and idx.dtype == torch.long and idx.device.type == "cpu"):
        lib = KERNEL.get()
    if lib is None or idx.numel() != src.size(0) or src.size(1) != out.size(1):
        return out.index_add_(0, idx, src)
    idx = idx.contiguous()
    if lib.tgl_att_index_add(idx.numel(), out.size(1), idx.data_ptr(), src.data_ptr(),
                             src.stride(0), out.data_ptr(), out.size(0)) < 0:
        raise IndexError(f"index_add_rows: an index is outside 0..{out.size(0) - 1}")
    return out


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
                     g_aggx: Optional[Tensor], g_asum: Optional[Tensor],
                     time_enc: Optional[Tuple[Tensor, Tensor]] = None):
    """``(g_qx, g_qb or None, g_hs or None, g_X or None)`` from the forward's inputs and
    ``s, alpha`` and the outputs' gradients (``None``: zero).

    ``time_enc = (dt [M], sinz [M, td])`` when the last ``td`` columns of ``X`` are a
    cosine time encoding ``cos(dt w + b)`` (``sinz``: its ``sin(dt w + b)``) and ``X`` is
    otherwise data: the kernel then folds the encoding's backward into its pass over the
    edges and returns ``(g_qx, g_qb, g_hs, (g_w [td], g_b [td]))`` instead of ``g_X [M, cx]``
    (no per-edge gradient rows are written or read again). ``sinz = None``: the encoding
    wants no gradient, and neither does ``X`` (returns ``None`` in its place).
    """
    D, H, Cx = qx.shape
    M = s.size(0)
    dn = 0 if hs is None else hs.size(1)
    cx = 0 if X is None else X.size(1)
    g_aggx = g_aggx.contiguous() if g_aggx is not None else torch.zeros_like(qx)
    g_asum = None if g_asum is None else g_asum.contiguous()
    g_qx = torch.empty_like(qx)
    g_qb = torch.empty(D, H) if has_qb else None
    g_X = None if X is None or time_enc is not None else torch.empty_like(X)
    g_xh = torch.empty(M, dn) if dn else None
    g_hs = torch.empty_like(hs) if dn else None
    tmp = torch.empty_like(alpha)
    U = 0 if hs is None else hs.size(0)
    td, dt, sinz, part, g_tw, g_tb = 0, None, None, None, None, None
    if time_enc is not None and time_enc[1] is not None:
        dt, sinz = time_enc[0].contiguous(), time_enc[1].contiguous()
        td = sinz.size(1)
        if not 0 < td <= cx or sinz.size(0) != M or dt.numel() != M:
            raise ValueError(f"time_enc: expected dt [{M}] and sinz [{M}, td] with td <= {cx}")
        part, g_tw, g_tb = torch.empty(D, 2 * td), torch.empty(td), torch.empty(td)
    lib.tgl_att_bwd(D, H, dn, cx, U, ptr.data_ptr(), qx.data_ptr(), _ptr(hs), _ptr(idx), _ptr(X),
                    _ptr(mask), 0 if slope is None else 1, float(slope or 0.0), s.data_ptr(),
                    alpha.data_ptr(), g_aggx.data_ptr(), _ptr(g_asum), g_qx.data_ptr(),
                    _ptr(g_qb), _ptr(g_X), _ptr(g_xh), _ptr(g_hs), tmp.data_ptr(), td, _ptr(dt),
                    _ptr(sinz), _ptr(part), _ptr(g_tw), _ptr(g_tb), max(1, int(threads)))
    if time_enc is not None:
        return g_qx, g_qb, g_hs, (None if sinz is None else (g_tw, g_tb))
    return g_qx, g_qb, g_hs, g_X
