"""``TemporalNeighborSampleGraph``: the T-CSR structure the temporal sampler searches.

For every node held here, its incident events (both directions: an event ``u -> v`` is
listed under ``u`` with neighbour ``v`` and under ``v`` with neighbour ``u``) sorted by
``(time, eid)``. Arrays, for R rows::

    indptr [N + 1]   node n's events are rows indptr[n] : indptr[n + 1]
    rec    [R, 4]    int64 rows {nbr, eid, time bits, twin}: the compiled sampler's packed
                     records (tgl_dist/sampling/_ckernel.py reads this very tensor, no copy)
    nbr    [R]       rec[:, 0], the other endpoint (global id)    } column views
    eid    [R]       rec[:, 1], the event id (global)             } of rec
    ts     [R]       rec[:, 2] read as float64, the event time    } (ts: stride 4)
    twin   [R]       rec[:, 3], the row of the same event in the  }
                     neighbour's list, -1 when that list is not held here (a search hint
                     of the kernel's next hop)
    key    [R]       sorted search key of :meth:`before` (the torch path), built on its first
                     call: ``node * span + (t - t_min)`` (float64, exact) when times are
                     integers, else ``node * (U + 1) + rank of t among the U distinct
                     times`` (int64, plus the distinct times)

Memory: 32 bytes a row (rec; the kernel searches the times inside it) plus ``8 (N + 1)``,
and 8 more a row once the torch path has built ``key``; the sampling kernel adds only its
per-node hints (8 N). The build peaks at about 40 bytes a row, 8 above the structure
(the sort's permutation and the sorted nodes beside the records; plus 8 an event when the
events are not in time order): at 10^7 events, one process, 612 MiB held and 764 MiB at
the peak. (Until 2026-12 the times were also kept contiguous: 40 bytes a row held, 765 MiB
and 841 MiB at the peak at 10^7 events; the layout before that held 618 MiB, 2,618 MiB at
the peak, and 630 MiB more of kernel records on first sampling.)

Two modes:

* ``'full'``: every rank holds the structure of the WHOLE graph, built from all
  ranks' owned events gathered with :func:`tgl_dist.dist.all_gather_v`: R = 2E rows,
  64 bytes an event (80 with the torch path's key), plus ``8 (N + 1)``: 10 MB for
  Wikipedia (157 k events), 56 MB for facebook-wall (877 k), 64 GB for a 1 G-event
  graph. Sampling needs no communication.
* ``'partitioned'``: a rank keeps only the rows of the nodes it owns (``pdata.sample_graph``
  holds every event with an owned endpoint, so those neighbourhoods are complete; the
  rows of its non-owned endpoints are dropped): R = the owned nodes' degrees summed, so
  over the P ranks every row is held once, 64 / P bytes an event per rank on a balanced
  partition. A non-owned node has zero rows here (``degree`` 0, ``before`` an empty
  range); the sampler never asks for one (it sends ``(node, query time)`` requests for
  every root to its owner by all-to-all and the owner answers). Sampling randomness is
  a function of (seed, node, time), so both modes return identical samples.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from tgl_dist.dist import PartitionBook, all_gather_v, world

log = logging.getLogger(__name__)

MODES = ("full", "partitioned")
_CHUNK = 1 << 18   # rows per gather of the build

# Peak bytes per event of building and using a full T-CSR on one rank: the structure
# (64 bytes an event, above), the torch path's key (16), the build's transient (8 bytes
# a row above the structure: 16; measured +152 MiB for 2 x 10^7 rows) and, on P > 1
# ranks, the gathered events the build reads (src, dst, t, eid: 32).
FULL_PEAK_BYTES_PER_EVENT = 64 + 16 + 16 + 32


def available_memory() -> int:
    """Bytes of memory available on this machine (``MemAvailable`` of /proc/meminfo, else
    the physical memory)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def choose_mode(num_events: int, world_size: int, budget: Optional[float] = None,
                ranks_here: Optional[int] = None) -> Tuple[str, str]:
    """The sampling mode for ``mode='auto'``: ``(mode, why)``.

    ``'full'`` when one process runs (its partition is the whole graph: the modes are the
    same structure) or when a full T-CSR's peak (:data:`FULL_PEAK_BYTES_PER_EVENT` bytes
    an event) fits ``budget`` bytes; else ``'partitioned'``, whose memory falls as 1/P.
    Where it fits, full is the faster mode: it sends no sampler requests (on 2 CPU
    processes it trained wikipedia faster, benchmarks/RESULTS.md "Sampling mode").

    Args:
        num_events: E of the whole graph.
        world_size: P.
        budget: bytes one rank may spend on it (default: a quarter of this machine's
            available memory over the ranks on it, ``ranks_here`` or ``LOCAL_WORLD_SIZE``).
    """
    if world_size <= 1:
        return "full", "one process"
    need = FULL_PEAK_BYTES_PER_EVENT * num_events
    if budget is None:
        import os
        here = ranks_here or int(os.environ.get("LOCAL_WORLD_SIZE") or world_size)
        budget = available_memory() / 4 / max(here, 1)
    if need <= budget:
        return "full", f"a full T-CSR (~{need / 2**20:.0f} MiB at peak) fits {budget / 2**20:.0f} MiB"
    return "partitioned", (f"a full T-CSR (~{need / 2**20:.0f} MiB at peak) exceeds "
                           f"{budget / 2**20:.0f} MiB a rank")


def _field(obj: Any, name: str) -> Tensor:
    if isinstance(obj, dict):
        if name not in obj:
            raise ValueError(f"sample_graph lacks field {name!r}; expected src, dst, t, eid")
        return obj[name]
    if not hasattr(obj, name):
        raise ValueError(f"sample_graph lacks field {name!r}; expected src, dst, t, eid")
    return getattr(obj, name)


def events_of(sample_graph: Any) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(src, dst, t, eid)`` from a dict, a ``TemporalGraph`` or any object with those fields."""
    src = torch.as_tensor(_field(sample_graph, "src"), dtype=torch.long).reshape(-1)
    dst = torch.as_tensor(_field(sample_graph, "dst"), dtype=torch.long).reshape(-1)
    t = torch.as_tensor(_field(sample_graph, "t"), dtype=torch.float64).reshape(-1)
    eid = torch.as_tensor(_field(sample_graph, "eid"), dtype=torch.long).reshape(-1)
    if not (src.numel() == dst.numel() == t.numel() == eid.numel()):
        raise ValueError(f"sample_graph fields differ in length: src {src.numel()}, dst {dst.numel()}, "
                         f"t {t.numel()}, eid {eid.numel()}")
    return src, dst, t, eid


class TemporalNeighborSampleGraph:
    """Per-node time-sorted incident events (T-CSR), replicated or partitioned.

    Args:
        sample_graph: the events to index: ``pdata`` / a graph store (its
            ``sample_graph`` and ``book`` are used), or a dict / object with ``src``, ``dst``
            (global ids, ``[E']``), ``t`` (``[E']`` float64) and ``eid`` (``[E']``),
            e.g. ``pdata.sample_graph`` (every event with an owned endpoint) or a
            whole ``TemporalGraph``.
        mode: ``'full'`` or ``'partitioned'`` (see the module docstring).
        num_nodes: N (default: ``book.num_nodes`` or ``max id + 1`` over all ranks).
        book: the node :class:`PartitionBook`; required for ``'partitioned'``.
        group: process group for the build-time gather (default world).

    In ``'full'`` mode the events of every rank are gathered and de-duplicated by
    ``eid`` (an event with endpoints on two ranks is held by both), so passing each
    rank's ``sample_graph`` builds the whole graph. This is a collective when a
    process group is initialised: every rank must construct it.

    ``num_events`` is E' (the events indexed, after that gather), ``num_rows`` R (the rows
    held: 2E' in 'full' mode, the owned endpoints' in 'partitioned'). Rows of equal
    ``(node, time, eid)`` (a self-loop's two, or events sharing an id) keep the events'
    input order.
    """

    def __init__(self, sample_graph: Any, mode: str = "full", num_nodes: Optional[int] = None,
                 book: Optional[PartitionBook] = None, group=None) -> None:
        if hasattr(sample_graph, "sample_graph") and hasattr(sample_graph, "book"):
            book = sample_graph.book if book is None else book  # a PartitionData or a graph store
            sample_graph = sample_graph.sample_graph
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "partitioned" and book is None:
            raise ValueError("mode='partitioned' needs the node partition book (book=pdata.book) "
                             "to route requests to owners")
        self.mode = mode
        self.book = book
        self.rank, self.world_size = world(group)
        if book is not None:   # each rank passes its own part's sample_graph
            book.check_world(self.world_size)
        src, dst, t, eid = events_of(sample_graph)
        if mode == "full" and self.world_size > 1:
            src, dst, t, eid = self._gather(src, dst, t, eid, group)
        if num_nodes is None:
            if book is not None:
                num_nodes = book.num_nodes
            else:
                m = torch.tensor([int(torch.cat([src, dst]).max()) + 1 if src.numel() else 0])
                from tgl_dist.dist.exchange import all_reduce_max_int
                num_nodes = all_reduce_max_int(int(m), group)
        self.num_nodes = int(num_nodes)
        if src.numel() and int(torch.maximum(src.max(), dst.max())) >= self.num_nodes:
            raise ValueError(f"sample_graph has node id {int(torch.maximum(src.max(), dst.max()))} "
                             f">= num_nodes={self.num_nodes}")
        self.num_events = int(eid.numel())
        self._key_lock = threading.Lock()
        self._build(src, dst, t, eid)
        log.info("T-CSR (%s) on rank %d: %d nodes, %d events, %.1f MB", mode, self.rank,
                 self.num_nodes, self.num_events, self.nbytes() / 2**20)

    # ------------------------------------------------------------------ build
    @staticmethod
    def _gather(src, dst, t, eid, group):
        src = all_gather_v(src, group)
        dst = all_gather_v(dst, group)
        t = all_gather_v(t, group)
        eid = all_gather_v(eid, group)
        order = torch.sort(eid, stable=True).indices
        se = eid[order]
        keep = torch.ones_like(se, dtype=torch.bool)
        keep[1:] = se[1:] != se[:-1]
        sel = order[keep]
        return src[sel], dst[sel], t[sel], eid[sel]

    def _build(self, src: Tensor, dst: Tensor, t: Tensor, eid: Tensor) -> None:
        """Rows sorted by ``(node, time, eid)``, written straight into the packed table.

        One stable sort of the rows' nodes (int32) over rows already in ``(time, eid)``
        order; its permutation (int32 where it fits) is parked in the table's twin column
        and every output is gathered into place a chunk at a time, so the peak above the
        final structure (32 bytes a row) is about 8 bytes a row (the sorted nodes and the
        permutation, then the inverse permutation), plus 8 bytes an event when the events
        are not already in time order.
        """
        E = int(src.numel())
        # 1. events in (time, eid) order (skipped when they already are, the usual case)
        o_ev = None
        if E > 1:
            d = t[1:] - t[:-1]
            inorder = bool(((d > 0) | ((d == 0) & (eid[1:] >= eid[:-1]))).all())
            del d
            if not inorder:
                o_ev = torch.sort(eid, stable=True).indices
                o_ev = o_ev.index_select(0, torch.sort(t.index_select(0, o_ev), stable=True).indices)
        small = self.num_nodes < 2 ** 31 and 2 * E < 2 ** 31
        itype = torch.int32 if small else torch.long
        # 2. rows in event order: kept row q of event position p is its src side, then its
        #    dst side; 'partitioned' keeps only the rows of owned nodes
        if self.mode == "partitioned" and self.world_size > 1:
            own_s = self.book.to_owner(src) == self.rank
            own_d = self.book.to_owner(dst) == self.rank
            if o_ev is not None:
                own_s, own_d = own_s.index_select(0, o_ev), own_d.index_select(0, o_ev)
            rid = torch.stack([own_s, own_d], 1).view(-1).nonzero().view(-1)
            del own_s, own_d
            pos = rid >> 1
            # kept rows q, q + 1 of the same event (both endpoints owned) are twins
            has_next = torch.zeros(rid.numel(), dtype=torch.bool)
            torch.eq(pos[1:], pos[:-1], out=has_next[:-1])
            evr = pos if o_ev is None else o_ev.index_select(0, pos)   # event of kept row q
            del pos
            node_r = torch.where((rid & 1).bool(), dst.index_select(0, evr), src.index_select(0, evr))
            node_r = node_r.to(itype)
            evr = evr.to(itype)
            del rid
        else:
            node_r = torch.empty(2 * E, dtype=itype)
            node_r[0::2] = src if o_ev is None else src.index_select(0, o_ev)
            node_r[1::2] = dst if o_ev is None else dst.index_select(0, o_ev)
            has_next = None   # rows 2p, 2p + 1 of event position p
            evr = None        # event of kept row q: o_ev[q >> 1]
        R = int(node_r.numel())
        # 3. one stable sort by node: (node, time, eid) order
        node_s, perm = torch.sort(node_r, stable=True)
        del node_r
        perm = perm.to(itype)   # int32 where it fits: the records are allocated beside it
        self.indptr = torch.zeros(self.num_nodes + 1, dtype=torch.long)
        torch.cumsum(torch.bincount(node_s, minlength=self.num_nodes), 0, out=self.indptr[1:])
        rec = torch.empty(R, 4, dtype=torch.long)   # {nbr, eid, time bits, twin}
        rec[:, 3] = perm   # kept row of each row, until the twins replace it
        del perm
        # 4. every column gathered into place, a chunk of rows at a time
        times = rec.view(torch.float64)[:, 2]   # the time column, as float64
        for c0 in range(0, R, _CHUNK):
            c1 = min(c0 + _CHUNK, R)
            q = rec[c0:c1, 3].clone()
            if evr is not None:
                e = evr.index_select(0, q)
            else:
                e = q >> 1 if o_ev is None else o_ev.index_select(0, q >> 1)
            nb = src.index_select(0, e)
            nb += dst.index_select(0, e)
            nb -= node_s[c0:c1]      # the other endpoint: src + dst - node
            rec[c0:c1, 0] = nb
            rec[c0:c1, 1] = eid.index_select(0, e)
            times[c0:c1] = t.index_select(0, e)
        del node_s, evr, o_ev, times
        # 5. twins: the row of the same event in the neighbour's list (-1: not held here)
        inv = torch.empty(R, dtype=itype)   # row of kept row q
        for c0 in range(0, R, _CHUNK):
            c1 = min(c0 + _CHUNK, R)
            inv.index_copy_(0, rec[c0:c1, 3].clone(), torch.arange(c0, c1, dtype=itype))
        for c0 in range(0, R, _CHUNK):
            c1 = min(c0 + _CHUNK, R)
            q = rec[c0:c1, 3].clone()
            if has_next is None:
                rec[c0:c1, 3] = inv.index_select(0, q ^ 1)
            else:
                nxt = has_next.index_select(0, q)
                prv = has_next.index_select(0, (q - 1).clamp_(min=0)) & (q > 0)
                partner = torch.where(nxt, q + 1, q - 1).clamp_(0, max(R - 1, 0))
                rec[c0:c1, 3] = torch.where(nxt | prv, inv.index_select(0, partner), -1)
        del inv, has_next
        self.rec = rec
        self.key, self.times = None, None   # built on the first before() (the torch path)

    def _build_key(self) -> None:
        """The search key of :meth:`before` (torch path only; the kernel searches ``ts``)."""
        ts = self.ts
        node = torch.repeat_interleave(torch.arange(self.num_nodes), self.indptr.diff())
        self._tmin = float(ts.min()) if ts.numel() else 0.0
        span = float(ts.max()) - self._tmin + 1 if ts.numel() else 1.0
        integral = bool((ts == torch.floor(ts)).all()) if ts.numel() else True
        if integral and (self.num_nodes + 1) * span < 2.0 ** 52:
            # integer times: one float64 key node * span + (t - tmin) is exact
            self._span = span
            self.times = None
            key = node.to(torch.float64)
            del node
            key *= span
            key += ts - self._tmin
        else:
            # general times: node * (U + 1) + rank of t among the U distinct times (int64)
            self.times, trank = torch.unique(ts, sorted=True, return_inverse=True)
            self._span = int(self.times.numel()) + 1
            key = node * self._span + trank
        self.key = key

    @property
    def nbr(self) -> Tensor:
        """``[R]`` the other endpoint of each row (a column view of :attr:`rec`)."""
        return self.rec[:, 0]

    @property
    def eid(self) -> Tensor:
        """``[R]`` the event id of each row (a column view of :attr:`rec`)."""
        return self.rec[:, 1]

    @property
    def ts(self) -> Tensor:
        """``[R]`` float64 the time of each row (a column view of :attr:`rec`, stride 4)."""
        return self.rec.view(torch.float64)[:, 2]

    @property
    def twin(self) -> Tensor:
        """``[R]`` the row of the same event in the neighbour's list, -1 where not held."""
        return self.rec[:, 3]

    @property
    def num_rows(self) -> int:
        """R: rows held here (2 per event in 'full' mode, the owned endpoints' in 'partitioned')."""
        return int(self.rec.size(0))

        # ---------------------------------------------------------------- queries
    def before(self, nodes: Tensor, ts: Tensor) -> Tuple[Tensor, Tensor]:
        """Row range of each node's events strictly before its query time.

        Args:
            nodes: global ids ``[R]`` (held here: any node in 'full' mode, owned nodes in
                'partitioned' mode; a node another rank owns gets an empty range).
            ts: query times ``[R]`` (float64).
        Returns:
            ``(start, end)`` ``[R]`` each: rows ``start:end`` are the node's events with
            time ``< ts``, in ``(time, eid)`` order.
        """
        if self.key is None:
            with self._key_lock:
                if self.key is None:
                    self._build_key()
        ts = ts.to(torch.float64)
        if self.times is None:  # integer event times: t < q  <=>  t < ceil(q)
            q = (torch.ceil(ts) - self._tmin).clamp_(0.0, self._span)
            end = torch.searchsorted(self.key, nodes.to(torch.float64) * self._span + q, right=False)
        else:
            qrank = torch.searchsorted(self.times, ts, right=False)
            end = torch.searchsorted(self.key, nodes * self._span + qrank, right=False)
        return self.indptr.index_select(0, nodes), end

    def degree(self, nodes: Tensor) -> Tensor:
        """Number of rows of each node held here, ``[R]`` (in 'partitioned' mode 0 for a
        node another rank owns)."""
        return self.indptr[nodes + 1] - self.indptr[nodes]

    def owns(self, nodes: Tensor) -> Tensor:
        """Whether this rank holds the complete neighbourhood of each node (bool ``[R]``)."""
        if self.mode == "full" or self.book is None:
            return torch.ones_like(nodes, dtype=torch.bool)
        return self.book.to_owner(nodes) == self.rank

    def nbytes(self) -> int:
        """Bytes held by the structure on this rank."""
        return sum(x.numel() * x.element_size()
                   for x in (self.indptr, self.rec, self.key, self.times)
                   if x is not None)

    def __repr__(self) -> str:
        return (f"TemporalNeighborSampleGraph(mode={self.mode!r}, num_nodes={self.num_nodes}, "
                f"num_events={self.num_events}, MB={self.nbytes() / 2**20:.1f})")
