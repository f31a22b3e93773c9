"""Time-aligned batch windows: step k on every rank covers the same slice of the global stream.

Global event ids are chronological. The loader gathers the (eid, t) of the split's
events of all ranks once (``8 + 8`` bytes per event), sorts them, and numbers them
``0 .. n-1`` (their *global position*). Window k covers global positions
``[b_k, b_{k+1})`` with ``b_{k+1} - b_k = batch_size * world_size``; each rank takes
its own events in the window (possibly none). Every rank computes the same windows,
so every rank runs the same number of steps and collectives never hang. With one
rank this is plain chronological batching of ``batch_size`` events.

Random chunk scheduling (TGL's ``train.reorder``, training only): each epoch the
window boundaries are shifted by ``c * chunk_size`` global events with ``c`` drawn
from ``[0, batch_size * world_size / chunk_size)`` (seeded by (seed, epoch), the
same on every rank); the first window is then the shorter ``[0, c * chunk_size)``.
Events thereby meet different batch neighbours each epoch, which reduces the
staleness of node memory within large batches.

Worked example (2 ranks, batch_size 2, 10 split events, global eids 0..9, rank 0
owns eids {0, 1, 2, 5, 8}, rank 1 owns {3, 4, 6, 7, 9})::

    windows of 4 global events: [0, 4), [4, 8), [8, 10)
    rank 0 steps: [0, 1, 2], [5], [8]      rank 1 steps: [3], [4, 6, 7], [9]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch
from torch import Tensor

from tgl_dist.dist import all_gather_v


@dataclass
class Window:
    """One step: global positions ``[start, end)`` and this rank's events in it.

    Attributes:
        start, end: global positions of the window.
        t_start, t_end: times of its first and last global event.
        lo, hi: this rank's events ``lo:hi`` (indices into the rank's EventSet).
        index: the step number within the epoch.
    """

    start: int
    end: int
    t_start: float
    t_end: float
    lo: int
    hi: int
    index: int


class GlobalSchedule:
    """The global order of a split's events and the windows of each epoch.

    Collective at construction (two all-gathers over ``group``).

    Args:
        eid: this rank's events' global ids ``[B_r]``, increasing.
        t: their times ``[B_r]``.
        group: process group (default world).
    """

    def __init__(self, eid: Tensor, t: Tensor, group=None) -> None:
        geid = all_gather_v(eid.to(torch.long), group)
        gt = all_gather_v(t.to(torch.float64), group)
        order = torch.sort(geid).indices
        self.eid = geid[order]
        self.t = gt[order]
        self.num_events = int(self.eid.numel())
        if self.num_events > 1 and bool((self.eid[1:] == self.eid[:-1]).any()):
            raise ValueError("two ranks hold the same event: the split's events must be disjoint")
        # global position of each local event (local events are increasing)
        self.local_pos = torch.searchsorted(self.eid, eid.to(torch.long))

    def boundaries(self, window: int, offset: int = 0, drop_last: bool = False) -> List[int]:
        """Window boundaries over global positions (``offset`` shifts them, chunk scheduling)."""
        n = self.num_events
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        b = [0]
        if 0 < offset < n:
            b.append(offset)
        b += list(range(b[-1] + window, n, window))
        if b[-1] != n:
            b.append(n)
        if n == 0:
            return [0]
        if drop_last and len(b) > 1 and b[-1] - b[-2] < window:
            b.pop()
        return b

    def windows(self, bounds: List[int]) -> List[Window]:
        """The :class:`Window` of each consecutive pair of ``bounds``."""
        if len(bounds) < 2:
            return []
        bt = torch.tensor(bounds, dtype=torch.long)
        local = torch.searchsorted(self.local_pos, bt).tolist()
        out = []
        for k in range(len(bounds) - 1):
            s, e = bounds[k], bounds[k + 1]
            out.append(Window(s, e, float(self.t[s]), float(self.t[e - 1]), local[k], local[k + 1], k))
        return out
