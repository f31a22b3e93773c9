"""The sampler's side of the compiled sampling kernel (``tgl_dist/kernels/sampler.c``).

The library itself (build, cache, ABI check, ctypes signatures) is
:data:`tgl_dist.kernels.SAMPLER`; this module holds what the sampler puts around it: the
packed :class:`Records` of a T-CSR and :class:`Kernel`, which runs one sampling hop or
block on tensors (the C kernel's two passes: count, then fill into exactly sized outputs).
ctypes releases the GIL for the duration of each call, so the loader's background thread
samples in parallel with training.

:func:`get_kernel` returns ``None`` (and logs ONE warning per process saying why and how
to fix it) when no compiler is found or the build fails; the sampler then uses its
pure-torch path, which returns identical samples (``tests/sampling`` compares them).
``TGL_DIST_NO_KERNEL=1`` selects the torch path without a warning.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

from tgl_dist.kernels import SAMPLER
from tgl_dist.sampling.hashing import seed_state

log = logging.getLogger(__name__)


class Records:
    """What the kernel reads from one T-CSR, built once per graph (see :func:`records`).

    It holds no copy of the graph: ``indptr`` and ``rec`` ARE the T-CSR's own
    tensors (:class:`tgl_dist.graph.TemporalNeighborSampleGraph` builds its rows in the
    kernel's layout), so the kernel adds only ``node_hint`` (8 bytes a node).

    Attributes:
        indptr: ``[N + 1]``.
        rec: ``[R, 4]`` int64 rows ``{nbr, eid, time bits, twin}``: one 32-byte record
            per T-CSR row, so a sampled edge costs one cache miss instead of three; the
            binary searches read the times in place (``time bits`` is the float64);
            ``twin`` is the row of the same event in the neighbour's list (-1 if the
            neighbour's list is not held here): the next hop's binary search for that
            neighbour starts there.
        node_hint: ``[N]`` per node, the row where its last search (with no better hint)
            ended: in chronological replay the next query of the node lands near it.
            Updated by the kernel; a hint only changes the search's speed, never its
            answer, so concurrent samplers may share it.
    """

    def __init__(self, g) -> None:
        for name in ("indptr", "rec"):
            x = getattr(g, name)
            if not x.is_contiguous():
                raise ValueError(f"sampling kernel: the T-CSR's {name} must be contiguous")
        if g.rec.dim() != 2 or g.rec.size(1) != 4 or g.rec.dtype != torch.long:
            raise ValueError(f"sampling kernel: the T-CSR's rec must be [R, 4] int64, got "
                             f"{tuple(g.rec.shape)} {g.rec.dtype}")
        self.indptr, self.rec = g.indptr, g.rec
        self.num_nodes = int(self.indptr.numel()) - 1
        self.node_hint = torch.full((self.num_nodes,), -1, dtype=torch.long)

    def nbytes(self) -> int:
        """Bytes the kernel adds to the T-CSR's (its ``node_hint``)."""
        return int(self.node_hint.numel()) * 8


_records: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_records_lock = threading.Lock()


def records(g) -> Records:
    """The kernel's :class:`Records` of T-CSR ``g`` (built on first use, shared by samplers)."""
    with _records_lock:
        r = _records.get(g)
        if r is None:
            r = _records[g] = Records(g)
            log.info("sampling kernel: %.1f MB of search hints for %r", r.nbytes() / 2**20, g)
        return r


class Kernel:
    """Tensor-level wrapper of the compiled kernel (one sampling hop or block)."""

    def __init__(self, lib) -> None:
        self.lib = lib

    def draw_below(self, seed: int, keys: Tensor, k: int, n: int) -> Tensor:
        """``uniform_below(hash_keys(seed, keys.view(1, -1), arange(k).view(k, 1)), n)``
        ``[k, B]`` (:mod:`tgl_dist.sampling.hashing`, the same values) for CPU int64
        ``keys [B]``, in one pass (~40 tensor operations in torch)."""
        keys = keys.contiguous()
        out = torch.empty(k, keys.numel(), dtype=torch.long)
        self.lib.tgl_draw_below(seed_state(seed) & ((1 << 64) - 1), keys.numel(), keys.data_ptr(),
                                k, n, out.data_ptr())
        return out

    def _count(self, r: Records, nodes: Tensor, ts: Tensor, hint: Optional[Tensor], k: int, uniform: bool,
               threads: int):
        D = nodes.numel()
        scratch = torch.empty(3 * D + 1, dtype=torch.long)
        first, avail, off = scratch[:D], scratch[D:2 * D], scratch[2 * D:]
        M = self.lib.tgl_count(r.indptr.data_ptr(), r.num_nodes, r.rec.data_ptr(), nodes.data_ptr(),
                               ts.data_ptr(), None if hint is None else hint.data_ptr(),
                               r.node_hint.data_ptr() if hint is None else None, D, k, int(uniform),
                               first.data_ptr(), avail.data_ptr(), off.data_ptr(), threads)
        return first, avail, off, int(M)

    def _fill(self, r: Records, nodes, ts, k, uniform, salt, cnt, threads, nbr, ets, eid, dt,
              hint=None, src=None, src_base=0, dst=None, dst_base=0) -> None:
        first, avail, off, _ = cnt
        ptr = lambda x: None if x is None else x.data_ptr()  # noqa: E731
        rc = self.lib.tgl_fill(r.rec.data_ptr(), nodes.data_ptr(), ts.data_ptr(), nodes.numel(), k,
                               int(uniform), salt, first.data_ptr(), avail.data_ptr(), off.data_ptr(),
                               nbr.data_ptr(), ets.data_ptr(), eid.data_ptr(), ptr(dt), ptr(hint), ptr(src),
                               src_base, ptr(dst), dst_base, threads)
        if rc != 0:
            raise MemoryError("sampling kernel: out of memory for its scratch space")

    def hop(self, g, nodes: Tensor, ts: Tensor, k: int, uniform: bool, salt: int, threads: int
            ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """One hop, flat: ``(row, nbr, eid, ts, dt)`` ``[M]`` each (row indexes ``nodes``)."""
        r = records(g)
        nodes, ts = nodes.contiguous(), ts.contiguous()
        cnt = self._count(r, nodes, ts, None, k, uniform, threads)
        M = cnt[3]
        row, nbr, eid = (torch.empty(M, dtype=torch.long) for _ in range(3))
        ets, dt = torch.empty(M, dtype=torch.float64), torch.empty(M, dtype=torch.float32)
        self._fill(r, nodes, ts, k, uniform, salt, cnt, threads, nbr, ets, eid, dt, dst=row)
        return row, nbr, eid, ets, dt

    def block(self, g, dst_id: Tensor, dst_ts: Tensor, k: int, uniform: bool, salt: int, threads: int,
              prev: Optional[tuple] = None, hint: Optional[Tensor] = None, want_hint: bool = False
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]:
        """One block written in place: ``(src_id, src_ts, edge_index, eid, dt, src_hint)``.

        ``src_id``/``src_ts`` ``[D + M]`` start with the destinations; ``edge_index``
        ``[2, M]``; ``eid`` ``[M]``; ``dt`` ``[M]`` float32. ``hint`` ``[D]`` (or None):
        search hints of the destinations; ``src_hint`` ``[D + M]`` (when ``want_hint``):
        those of the sources, for the next block.

        ``prev``: the previous block's ``(P, *its return value)`` (the block next to the
        roots) when its ``P`` destinations, the first ``P`` here, were sampled with the
        same ``k``: their edges are copied from it instead of sampled again.
        """
        r = records(g)
        dst_id, dst_ts = dst_id.contiguous(), dst_ts.contiguous()
        D = dst_id.numel()
        P = 0 if prev is None else prev[0]
        nodes, ts = dst_id[P:], dst_ts[P:]
        cnt = self._count(r, nodes, ts, None if hint is None else hint[P:], k, uniform, threads)
        Mp = 0 if prev is None else prev[4].numel()
        M = Mp + cnt[3]
        src_id, src_ts = torch.empty(D + M, dtype=torch.long), torch.empty(D + M, dtype=torch.float64)
        edge_index, eid = torch.empty(2, M, dtype=torch.long), torch.empty(M, dtype=torch.long)
        dt = torch.empty(M, dtype=torch.float32)
        src_hint = torch.empty(D + M, dtype=torch.long) if want_hint else None
        src_id[:D] = dst_id
        src_ts[:D] = dst_ts
        if src_hint is not None:
            src_hint[:D] = -1 if hint is None else hint
        if prev is not None:
            _, p_id, p_ts, p_ei, p_eid, p_dt, p_hint = prev
            src_id[D:D + Mp] = p_id[P:]
            src_ts[D:D + Mp] = p_ts[P:]
            torch.arange(D, D + Mp, out=edge_index[0, :Mp])
            edge_index[1, :Mp] = p_ei[1]
            eid[:Mp] = p_eid
            dt[:Mp] = p_dt
            if src_hint is not None:
                src_hint[D:D + Mp] = -1 if p_hint is None else p_hint[P:]
        self._fill(r, nodes, ts, k, uniform, salt, cnt, threads, src_id[D + Mp:], src_ts[D + Mp:],
                   eid[Mp:], dt[Mp:], hint=None if src_hint is None else src_hint[D + Mp:],
                   src=edge_index[0, Mp:], src_base=D + Mp, dst=edge_index[1, Mp:], dst_base=P)
        return src_id, src_ts, edge_index, eid, dt, src_hint


_kernels: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _wrap(lib) -> Kernel:
    k = _kernels.get(lib)
    if k is None:
        k = _kernels[lib] = Kernel(lib)
    return k


def load_kernel() -> Kernel:
    """The process's sampling kernel (:meth:`tgl_dist.kernels.Library.load`: raises with
    the reason when it cannot be built)."""
    return _wrap(SAMPLER.load())


def get_kernel() -> Optional[Kernel]:
    """The sampling kernel, or ``None`` with one warning per process (:meth:`Library.get`)."""
    lib = SAMPLER.get()
    return None if lib is None else _wrap(lib)
