"""``TemporalNeighborSampleGraph``: the T-CSR structure the temporal sampler searches.

For every node, its incident events (both directions: an event ``u -> v`` is listed
under ``u`` with neighbour ``v`` and under ``v`` with neighbour ``u``) sorted by
``(time, eid)``. Arrays::

    indptr [N + 1]   node n's events are rows indptr[n] : indptr[n + 1]
    nbr    [2E]      the other endpoint (global id)
    ts     [2E]      event time (float64)
    eid    [2E]      event id (global)
    key    [2E]      sorted search key, so one ``torch.searchsorted`` finds "events of n
                     before t": ``node * span + (t - t_min)`` (float64, exact) when times
                     are integers, else ``node * (U + 1) + rank of t among the U distinct
                     times`` (int64, plus the distinct times)

Two modes:

* ``'full'``: every rank holds the structure of the WHOLE graph, built from all
  ranks' owned events gathered with :func:`tgl_dist.dist.all_gather_v`. Memory per
  rank: ``(8 + 8 + 8 + 8) * 2E + 8 (N + 1)`` bytes (nbr, ts, eid, key per
  direction; indptr; plus 8 U for U distinct non-integer times), about 64 bytes per event: 10 MB for Wikipedia
  (157 k events), 56 MB for facebook-wall (877 k), 64 GB for a 1 G-event graph.
  Sampling needs no communication.
* ``'partitioned'``: a rank keeps only the neighbourhoods of the nodes it owns
  (``pdata.sample_graph`` holds every event with an owned endpoint, so those
  neighbourhoods are complete). Memory scales with the partition. The sampler sends
  ``(node, query time)`` requests for every root to its owner by all-to-all and the
  owner answers; sampling randomness is a function of (seed, node, time), so both
  modes return identical samples.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from tgl_dist.dist import PartitionBook, all_gather_v, world

log = logging.getLogger(__name__)

MODES = ("full", "partitioned")

# Peak bytes per event of building and using a full T-CSR on one rank: the structure
# (64 bytes an event, above), its build's transient (the gather and sorts, about 3.3x the
# structure) and the compiled sampler's records (a second copy, 64 bytes an event).
# Measured at 10^7 events: +2,000 MiB build peak over a 618 MiB structure, 630 MiB of
# records (benchmarks/RESULTS.md, "Scale").
FULL_PEAK_BYTES_PER_EVENT = 64 + 3.3 * 64 + 64


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
        node = torch.cat([src, dst])
        nbr = torch.cat([dst, src])
        ts = torch.cat([t, t])
        ids = torch.cat([eid, eid])
        # sort by (node, time, eid): eid first, then stable sorts on time and node
        o = torch.sort(ids, stable=True).indices
        o = o[torch.sort(ts[o], stable=True).indices]
        o = o[torch.sort(node[o], stable=True).indices]
        node, self.nbr, self.ts, self.eid = node[o], nbr[o], ts[o], ids[o]
        counts = torch.bincount(node, minlength=self.num_nodes)
        self.indptr = torch.zeros(self.num_nodes + 1, dtype=torch.long)
        torch.cumsum(counts, 0, out=self.indptr[1:])
        # search key: node-major, time-minor, sorted
        self._tmin = float(ts.min()) if ts.numel() else 0.0
        span = float(ts.max()) - self._tmin + 1 if ts.numel() else 1.0
        integral = bool((ts == torch.floor(ts)).all()) if ts.numel() else True
        if integral and (self.num_nodes + 1) * span < 2.0 ** 52:
            # integer times: one float64 key node * span + (t - tmin) is exact
            self._span = span
            self.times = None
            self.key = node.to(torch.float64) * span + (self.ts - self._tmin)
        else:
            # general times: node * (U + 1) + rank of t among the U distinct times (int64)
            self.times, trank = torch.unique(self.ts, sorted=True, return_inverse=True)
            self._span = int(self.times.numel()) + 1
            self.key = node * self._span + trank

        # ---------------------------------------------------------------- queries
    def before(self, nodes: Tensor, ts: Tensor) -> Tuple[Tensor, Tensor]:
        """Row range of each node's events strictly before its query time.

        Args:
            nodes: global ids ``[R]`` (must be held here: any node in 'full' mode, owned
                nodes in 'partitioned' mode).
            ts: query times ``[R]`` (float64).
        Returns:
            ``(start, end)`` ``[R]`` each: rows ``start:end`` are the node's events with
            time ``< ts``, in ``(time, eid)`` order.
        """
        ts = ts.to(torch.float64)
        if self.times is None:  # integer event times: t < q  <=>  t < ceil(q)
            q = (torch.ceil(ts) - self._tmin).clamp_(0.0, self._span)
            end = torch.searchsorted(self.key, nodes.to(torch.float64) * self._span + q, right=False)
        else:
            qrank = torch.searchsorted(self.times, ts, right=False)
            end = torch.searchsorted(self.key, nodes * self._span + qrank, right=False)
        return self.indptr.index_select(0, nodes), end

    def degree(self, nodes: Tensor) -> Tensor:
        """Number of incident events of each node held here, ``[R]``."""
        return self.indptr[nodes + 1] - self.indptr[nodes]

    def owns(self, nodes: Tensor) -> Tensor:
        """Whether this rank holds the complete neighbourhood of each node (bool ``[R]``)."""
        if self.mode == "full" or self.book is None:
            return torch.ones_like(nodes, dtype=torch.bool)
        return self.book.to_owner(nodes) == self.rank

    def nbytes(self) -> int:
        """Bytes held by the structure on this rank."""
        return sum(x.numel() * x.element_size()
                   for x in (self.indptr, self.nbr, self.ts, self.eid, self.key, self.times)
                   if x is not None)

    def __repr__(self) -> str:
        return (f"TemporalNeighborSampleGraph(mode={self.mode!r}, num_nodes={self.num_nodes}, "
                f"num_events={self.num_events}, MB={self.nbytes() / 2**20:.1f})")
