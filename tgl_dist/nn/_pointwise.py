"""Compiled pointwise kernels (``tgl_dist/kernels/pointwise.c``): the cosine time encoding, dropout, GRU gates.

Built and cached like the other kernels (:data:`tgl_dist.kernels.POINTWISE`: plain C, the
system compiler, about a second on first use), with OpenMP: large inputs are split in
fixed blocks of rows over torch's own worker threads (results do not depend on their
number). Every function here falls back to torch
(same values up to float rounding; ``tests/ctdg/test_pointwise_kernel.py`` compares
them) when the kernel cannot be built (ONE warning per process), for tensors that are
not float32 on the CPU, and with ``TGL_DIST_NO_KERNEL=1``.

Why: in a TGN training step on CPU, ``cos`` of the ``[edges, d_t]`` time encodings, the
``sin`` of its backward and torch's ``bernoulli_`` for dropout masks took ~12 % of the
step (torch's CPU ``cos`` takes a slow path for the large arguments that raw time gaps
give, and its RNG draws ~5-8 ns an element). :class:`GRUTimeCell` puts TGN's whole
memory update (time encoding, both products and the gates) in one autograd node with a
written-out backward, in place of ~15 small operators and their autograd nodes.

Each op has two implementations behind one dispatch function: the compiled one (CPU
float32, kernel built) and one torch reference.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from tgl_dist.kernels import POINTWISE as KERNEL
from tgl_dist.kernels import data_ptr as _ptr


def _cpu_f32(*ts: Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in ts)


class CosineTimeEncoding(torch.autograd.Function):
    """``cos(dt[:, None] * w + b)``: ``dt [M]``, ``w [d]``, ``b [d]`` (float32, CPU) -> ``[M, d]``,
    or ``[M, F + d]`` = ``[prefix || cos(...)]`` with a ``prefix [M, F]`` (e.g. the edge
    features beside the encoding: one output, no concatenation copy forward or backward).

    Gradients flow to ``w``, ``b`` and (when they require one) ``dt`` and ``prefix``. When
    a gradient is wanted the forward also keeps ``sin(z) [M, d]`` (the kernel evaluates it
    beside the cosine at almost no cost), so the backward is one pass over memory.
    """

    @staticmethod
    def forward(ctx, dt: Tensor, w: Tensor, b: Tensor, lib, prefix: Optional[Tensor] = None) -> Tensor:
        dt, w = dt.contiguous(), w.contiguous()
        out, sinz = time_encoding_forward(lib, dt, w, b, prefix, any(ctx.needs_input_grad[:3]))
        ctx.save_for_backward(dt, w, sinz)
        ctx.lib, ctx.F = lib, 0 if prefix is None else prefix.size(1)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        dt, w, sinz = ctx.saved_tensors
        F = ctx.F
        g_prefix = g[:, :F] if F and ctx.needs_input_grad[4] else None
        if sinz is None:  # only the prefix wanted a gradient
            return None, None, None, None, g_prefix
        gdt, gw, gb = time_encoding_backward(ctx.lib, g, F, dt, w, sinz, ctx.needs_input_grad[0])
        return gdt, gw, gb, None, g_prefix


def time_encoding_forward(lib, dt: Tensor, w: Tensor, b: Tensor, prefix: Optional[Tensor],
                          keep_sin: bool):
    """The kernel's forward of :class:`CosineTimeEncoding`, no autograd: ``(out [M, F + d],
    sin(z) [M, d] or None)`` from contiguous ``dt [M]``, ``w [d]``."""
    b = b.contiguous()
    M, d = dt.numel(), w.numel()
    F = 0 if prefix is None else prefix.size(1)
    out = torch.empty(M, F + d)
    if F:
        out[:, :F] = prefix
    sinz = torch.empty(M, d) if keep_sin else None
    lib.tgl_time_enc_fwd(M, d, dt.data_ptr(), w.data_ptr(), b.data_ptr(), out[:, F:].data_ptr(),
                         F + d, None if sinz is None else sinz.data_ptr(), lib.threads())
    return out, sinz


def time_encoding_backward(lib, g: Tensor, F: int, dt: Tensor, w: Tensor, sinz: Tensor,
                           want_dt: bool):
    """``(g_dt [M] or None, g_w [d], g_b [d])`` from the gradient ``g [M, F + d]`` of the
    forward's output (columns ``F..`` are the encoding's) and its kept ``sinz``."""
    M, d = dt.numel(), w.numel()
    if g.stride(1) != 1 or (M > 1 and g.stride(0) < F + d):
        g = g.contiguous()
    gw, gb = torch.empty(d), torch.empty(d)
    gdt = torch.empty(M) if want_dt else None
    acc = torch.empty(lib.tgl_time_enc_bwd_scratch(M, d), dtype=torch.float64)
    lib.tgl_time_enc_bwd(M, d, dt.data_ptr(), w.data_ptr(), sinz.data_ptr(), g[:, F:].data_ptr(),
                         g.stride(0) if M else F + d, gw.data_ptr(), gb.data_ptr(),
                         None if gdt is None else gdt.data_ptr(), acc.data_ptr(), lib.threads())
    return gdt, gw, gb


def cosine_time_encoding(dt: Tensor, w: Tensor, b: Tensor,
                         prefix: Optional[Tensor] = None) -> Tensor:
    """``cos(dt[:, None] * w + b)`` for ``dt [M]`` float32, ``w, b [d]`` -> ``[M, d]``, or
    ``[prefix || cos(...)]`` ``[M, F + d]`` with ``prefix [M, F]`` (the compiled kernel on
    CPU float32, else torch)."""
    tensors = (dt, w, b) if prefix is None else (dt, w, b, prefix)
    lib = KERNEL.get() if _cpu_f32(*tensors) else None
    if lib is None:
        phi = torch.cos(torch.addmm(b, dt.view(-1, 1), w.view(1, -1)))
        return phi if prefix is None else torch.cat([prefix, phi], 1)
    return CosineTimeEncoding.apply(dt, w, b, lib, prefix)


def _gates_torch(gi: Tensor, gh: Tensor, h: Tensor) -> Tensor:
    """The GRU gates in torch's ops, ``gi``, ``gh`` ``[U, 3H]`` (r, z, n) -> ``h' [U, H]``."""
    H = h.size(1)
    gi_rz, gi_n = gi.split([2 * H, H], 1)
    gh_rz, gh_n = gh.split([2 * H, H], 1)
    r, z = torch.sigmoid(gi_rz + gh_rz).chunk(2, 1)
    n = torch.tanh(gi_n + r * gh_n)
    return n + z * (h - n)


def _whole_cell(lib, x0: Tensor, x1: Tensor, h: Tensor, *params: Tensor) -> bool:
    """Whether the compiled cell applies to this layout: torch's BLAS found (``blas``),
    rows of ``x0`` contiguous in memory, the rest contiguous (all float32 on the CPU:
    :func:`whole_time_cell` checks)."""
    return (bool(getattr(lib, "blas", False)) and x0.stride(1) == 1
            and (x0.size(0) < 2 or x0.stride(0) >= x0.size(1)) and x1.is_contiguous()
            and h.is_contiguous() and all(p.is_contiguous() for p in params))


def _cell_outputs(U: int, H: int, F: int):
    """The compiled cells' forward outputs: ``x [U, F]`` (the input after ``h``), ``w_own
    [4H, H]``, ``hh [U, 4H]``, ``h' [U, H]`` and ``r, z, n [U, 3H]``."""
    e = torch.empty
    return e(U, F), e(4 * H, H), e(U, 4 * H), e(U, H), e(U, 3 * H)


def _cell_grads(need, U: int, H: int, f0: int, w_ih: Tensor):
    """The compiled cells' gradient buffers, each only where ``need`` (the autograd
    node's ``needs_input_grad``: 0 ``x0``, 2 ``h``, 3-6 the cell's parameters) asks:
    ``(g_x0, g_h, g_wih, g_whh, g_bih, g_bhh)``."""
    e = torch.empty
    return (e(U, f0) if need[0] else None, e(U, H) if need[2] else None,
            torch.empty_like(w_ih) if need[3] else None, e(3 * H, H) if need[4] else None,
            e(3 * H) if need[5] else None, e(3 * H) if need[6] else None)


class GRUTimeCell(torch.autograd.Function):
    """TGN's memory update as ONE autograd node: :class:`torch.nn.GRUCell` on
    ``[h || x0 || cos(dt w + b)]`` with hidden state ``h``, both products, the gates and
    the cosine time encoding in one compiled call each way (``tgl_gru_time_cell_fwd`` /
    ``_bwd``: no separate encoding node, no copy of its rows). The input starts with
    ``h`` (TGN's mails start with the receiver's own memory), so the products that read
    ``h`` are one ``[U, H] x [H, 4H]`` product with the r and z weights summed
    (:func:`own_state_weights`: the same function, 2H x H fewer multiply-adds a row), and
    ``dW_ih`` is one product; input gradients only where asked. ``apply(x0 [U, F0], dt [U], h [U, H], W_ih, W_hh, b_ih,
    b_hh, te_w [F1, 1], te_b [F1], lib) -> h' [U, H]``; gradients flow to the cell's and
    the encoding's parameters and, when asked, to ``x0`` and ``h`` (``dt`` is data).
    Only where :func:`whole_time_cell` holds; elsewhere the torch reference
    :func:`gru_cell` (``own_state=True``) on the time encoding's output computes the same
    values (tested)."""

    @staticmethod
    def forward(ctx, x0: Tensor, dt: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor,
                b_ih: Tensor, b_hh: Tensor, te_w: Tensor, te_b: Tensor, lib) -> Tensor:
        (U, H), F0, F1 = h.shape, x0.size(1), te_w.numel()
        x, w_own, hh, out, saved = _cell_outputs(U, H, F0 + F1)
        sinz = torch.empty(U, F1) if (ctx.needs_input_grad[7] or ctx.needs_input_grad[8]) else None
        rc = lib.tgl_gru_time_cell_fwd(U, H, F0, F1, x0.data_ptr(), x0.stride(0) if U else F0,
                                       dt.data_ptr(), te_w.data_ptr(), te_b.data_ptr(),
                                       _ptr(sinz), h.data_ptr(), w_ih.data_ptr(),
                                       w_hh.data_ptr(), b_ih.data_ptr(), b_hh.data_ptr(),
                                       x.data_ptr(), w_own.data_ptr(), hh.data_ptr(),
                                       out.data_ptr(), saved.data_ptr(), lib.threads())
        if rc != 0:
            raise RuntimeError(f"GRU cell: the compiled call failed ({rc})")
        ctx.save_for_backward(x, h, hh, saved, w_ih, w_own, dt, te_w, sinz)
        ctx.lib, ctx.f0 = lib, F0
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        x, h, hh, saved, w_ih, w_own, dt, te_w, sinz = ctx.saved_tensors
        need = ctx.needs_input_grad
        (U, H), f0, lib = h.shape, ctx.f0, ctx.lib
        f1 = x.size(1) - f0
        e = torch.empty
        te = sinz is not None
        g_x0, g_h, g_wih, g_whh, g_bih, g_bhh = _cell_grads(need, U, H, f0, w_ih)
        g_tw, g_tb = (torch.empty_like(te_w), e(f1)) if te else (None, None)
        g_x1 = e(U, f1) if te else None
        acc = e(lib.tgl_time_enc_bwd_scratch(U, f1), dtype=torch.float64) if te else None
        g, g_all = g.contiguous(), e(U, 4 * H)   # named: alive through the call
        rc = lib.tgl_gru_time_cell_bwd(
            U, H, f0, f1, g.data_ptr(), x.data_ptr(), h.data_ptr(), hh.data_ptr(),
            saved.data_ptr(), w_ih.data_ptr(), w_own.data_ptr(), dt.data_ptr(), te_w.data_ptr(),
            _ptr(sinz), _ptr(g_h), _ptr(g_x0), _ptr(g_x1), _ptr(g_wih), _ptr(g_whh),
            _ptr(g_bih), _ptr(g_bhh), _ptr(g_tw), _ptr(g_tb), _ptr(acc), g_all.data_ptr(),
            lib.threads())
        if rc != 0:
            raise RuntimeError(f"GRU cell: the compiled backward failed ({rc})")
        return (g_x0, None, g_h, g_wih, g_whh, g_bih, g_bhh,
                g_tw if te and need[7] else None, g_tb if te and need[8] else None, None)


def whole_time_cell(x0: Tensor, dt: Tensor, h: Tensor, *params: Tensor):
    """The pointwise kernel when :class:`GRUTimeCell` applies (torch's BLAS found, CPU
    float32, ``dt`` data, rows of ``x0`` contiguous in memory, the rest contiguous), else
    ``None``."""
    if not _cpu_f32(x0, dt, h, *params) or dt.requires_grad or dt.dim() != 1:
        return None
    lib = KERNEL.get()
    if lib is None or not _whole_cell(lib, x0, dt, h, *params):
        return None
    return lib


def rows_equal(a: Tensor, b: Tensor) -> bool:
    """``torch.equal(a, b)`` for two ``[U, w]`` tensors whose rows are contiguous (either
    may be a column slice of a wider one, e.g. the first columns of the stored mails):
    one serial pass of the kernel on CPU float32 (torch's ``equal`` on a strided slice
    runs its elementwise comparison over the whole view), torch's otherwise."""
    lib = KERNEL.get() if _cpu_f32(a, b) else None
    if (lib is None or a.shape != b.shape or a.dim() != 2 or a.stride(1) != 1
            or b.stride(1) != 1):
        return torch.equal(a, b)
    return bool(lib.tgl_rows_equal(a.size(0), a.size(1), a.data_ptr(), a.stride(0),
                                   b.data_ptr(), b.stride(0)))


def own_state_weights(w_ih: Tensor, w_hh: Tensor, b_ih: Tensor, b_hh: Tensor):
    """``(W [4H, H], b [4H])`` of the products of ``h`` in a cell whose input starts with
    ``h``: rows ``[W_ih,rz^h + W_hh,rz | W_ih,n^h | W_hh,n]`` and the matching biases
    (``b_ih`` for the input-side parts: r and z hold both biases)."""
    H = w_hh.size(1)
    w_s = w_ih[:, :H]
    w = torch.cat([w_s[:2 * H] + w_hh[:2 * H], w_s[2 * H:], w_hh[2 * H:]])
    b = torch.cat([b_ih[:2 * H] + b_hh[:2 * H], b_ih[2 * H:], b_hh[2 * H:]])
    return w, b


def gru_cell(x0: Tensor, x1: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
             b_hh: Tensor, own_state: bool = False) -> Tensor:
    """``GRUCell([x0 || x1], h)`` with :class:`torch.nn.GRUCell`'s parameter layout, in
    torch's ops (any device and dtype); with ``own_state``, ``GRUCell([h || x0 || x1], h)``.
    The torch reference of :class:`GRUTimeCell`."""
    x = torch.cat([h, x0, x1] if own_state else [x0, x1], 1)
    return _gates_torch(F.linear(x, w_ih, b_ih), F.linear(h, w_hh, b_hh), h)


def dropout_mask(shape, p: float, like: Tensor) -> Optional[Tensor]:
    """A dropout multiplier tensor (``0`` with probability ``p``, else ``1 / (1 - p)``) of
    ``shape`` from the compiled kernel, seeded by one draw from torch's default generator
    (so ``torch.manual_seed`` reproduces it); ``None`` when the kernel does not apply
    (``like`` not float32 on the CPU, ``p`` outside ``(0, 1)``, no kernel)."""
    if not (0.0 < p < 1.0 and _cpu_f32(like)):
        return None
    lib = KERNEL.get()
    if lib is None:
        return None
    out = torch.empty(shape)
    seed = int(torch.randint(0, 2 ** 62, (1,)))
    lib.tgl_dropout_mask(out.numel(), float(p), 1.0 / (1.0 - p), seed, out.data_ptr(),
                         lib.threads())
    return out


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """:func:`torch.nn.functional.dropout` with the mask drawn by the compiled kernel on
    CPU float32 (same distribution, a different random stream); torch's otherwise."""
    if not training or p == 0.0:
        return x
    mask = dropout_mask(x.shape, p, x)
    return torch.nn.functional.dropout(x, p, True) if mask is None else x * mask


class Dropout(torch.nn.Dropout):
    """:class:`torch.nn.Dropout` drawing its mask with :func:`dropout` (same ``p``, same
    state dict)."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
