"""The compiled write-back of a world of one (``tgl_dist/kernels/writeback.c``): one call per step.

:meth:`tgl_dist.memory.SharedMailBox.update` with mails to the endpoints, the latest kept
(TGN, JODIE, DyRep), written with torch's operators takes ~25 calls (two stable sorts to
find each node's latest occurrence, gathers, a concatenation, indexed writes): ~0.4-0.8 ms
of a ~10-20 ms TGN step, almost all of it per-call cost. :func:`update_last` does the same
in one serial pass and writes the same values, bit for bit. Built and cached like the
other kernels (:data:`tgl_dist.kernels.WRITEBACK`); without a compiler, or with
``TGL_DIST_NO_KERNEL=1``, the mailbox keeps its torch path.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from tgl_dist.kernels import WRITEBACK as KERNEL  # noqa: F401 - the mailbox reads it here


def usable(mailbox, *tensors: Optional[Tensor]) -> bool:
    """Whether :func:`update_last` applies: the mailbox's rows and the given tensors are
    float32 on the CPU (its times are float64 and its next-slot pointers int64, all
    contiguous, as :class:`SharedMailBox` creates and loads them; the rows take torch's
    default dtype)."""
    f32 = [mailbox.memory, mailbox.mailbox, *[t for t in tensors if t is not None]]
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in f32)


def _rows(x: Tensor) -> Tensor:
    """``x [n, c]`` with unit column stride (a copy only when it has none)."""
    return x if x.dim() == 2 and (x.stride(1) == 1 or x.size(1) <= 1) else x.contiguous()


def update_last(lib, mailbox, local: Tensor, own: Tensor, other: Tensor, t: Tensor,
                s: Tensor, o: Tensor, feats: Optional[Tensor]) -> None:
    """Write one step's updates into ``mailbox`` (see ``tgl_dist/kernels/writeback.c``).

    Args:
        local: ``[2B]`` local rows of the occurrences' nodes (u_1, v_1, u_2, v_2, ...).
        own, other: ``[2B]`` rows of ``s`` (the occurrence's own root) and of ``o`` (the
            other endpoint's).
        t: ``[B]`` event times. s: ``[R, d]`` updated memory of the roots. o: ``[R', d]``
            second part of the mails (``s``, or DyRep's embeddings).
        feats: ``[B, d_e]`` float32 event features, or ``None`` (``d_e = 0``).
    """
    mb = mailbox
    n2 = local.numel()
    idx = [x.to(torch.long).contiguous() for x in (local, own, other)]
    t = t.to(torch.float64).contiguous()
    s, o = _rows(s.detach()), _rows(o.detach())
    de = 0 if feats is None else feats.size(1)
    if feats is not None:
        feats = _rows(feats)
    if s.size(1) != mb.dim_memory or o.size(1) != mb.dim_memory or de != mb.dim_edge_feat \
            or t.numel() * 2 != n2:
        raise ValueError(f"update_last: expected memory rows of {mb.dim_memory}, "
                         f"{mb.dim_edge_feat} event features and 2 occurrences per event; got "
                         f"{s.size(1)}, {o.size(1)}, {de} and {n2} for {t.numel()} events")
    rc = lib.tgl_wb_update_last(
        n2, idx[0].data_ptr(), idx[1].data_ptr(), idx[2].data_ptr(), t.data_ptr(),
        s.data_ptr(), s.stride(0), s.size(0), o.data_ptr(), o.stride(0), o.size(0),
        None if feats is None else feats.data_ptr(), de, 0 if feats is None else feats.stride(0),
        mb.num_nodes, mb.dim_memory, mb.mailbox_size, int(mb.time_delta == "mail"),
        mb.memory.data_ptr(), mb.memory_ts.data_ptr(), mb.mailbox.data_ptr(),
        mb.mail_ts.data_ptr(), mb.next_mail_pos.data_ptr())
    if rc == -1:
        raise IndexError(f"update_last: a node row outside 0..{mb.num_nodes - 1} or a root row "
                         f"outside the {s.size(0)} / {o.size(0)} rows given")
    if rc < 0:
        raise MemoryError("update_last: no memory for the kernel's scratch table")
