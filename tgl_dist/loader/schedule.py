"""Time-aligned batch windows: step k on every rank covers the same slice of the global stream.

Global event ids are chronological. A split's events, over all ranks, are numbered
``0 .. n-1`` in eid order (their *global position*). Window k covers global positions
``[b_k, b_{k+1})`` with ``b_{k+1} - b_k = batch_size * world_size``; each rank takes
its own events in the window (possibly none). Every rank computes the same windows,
so every rank runs the same number of steps and collectives never hang. With one
rank this is plain chronological batching of ``batch_size`` events.

A rank needs only the global positions of its OWN events: the position of event
``e`` is the number of the split's events with a smaller eid, summed over the ranks.
:class:`GlobalSchedule` counts them by passing each rank's eids around a ring (P - 1
rounds; in round s rank r holds the eids of rank r - s besides its own), so a rank
holds ``8`` bytes per own event plus one other rank's eids at a time, never the
split's events of all ranks.

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

from tgl_dist.dist import all_gather_v, all_to_all_v, world


@dataclass
class Window:
    """One step: global positions ``[start, end)`` and this rank's events in it.

    Attributes:
        start, end: global positions of the window.
        lo, hi: this rank's events ``lo:hi`` (indices into the rank's EventSet).
        index: the step number within the epoch.
    """

    start: int
    end: int
    lo: int
    hi: int
    index: int


def global_positions(eid: Tensor, counts: List[int], group=None) -> Tensor:
    """Global position of each of this rank's events among the events of all ranks.

    Collective over ``group`` (P - 1 all-to-alls around a ring).

    Args:
        eid: this rank's event ids ``[B_r]`` (int64), strictly increasing; the ranks'
            sets must be disjoint.
        counts: every rank's ``B_r``, in rank order (``[P]``).
    Returns:
        ``[B_r]`` int64: the number of events of all ranks with a smaller eid.
    Raises:
        ValueError: two ranks hold the same eid (raised on every rank holding one,
            after all rounds, so no rank is left waiting in a collective).
    """
    eid = eid.to(torch.long).reshape(-1)
    rank, ws = world(group)
    pos = torch.arange(eid.numel(), dtype=torch.long)
    if ws == 1:
        return pos
    shared = 0
    for s in range(1, ws):
        to, frm = (rank + s) % ws, (rank - s) % ws
        send, recv = [0] * ws, [0] * ws
        send[to], recv[frm] = eid.numel(), counts[frm]
        peer = all_to_all_v(eid, send, recv, group)      # rank frm's eids, increasing
        below = torch.searchsorted(peer, eid)
        shared += int((torch.searchsorted(peer, eid, right=True) - below).sum())
        pos += below
    if shared:
        raise ValueError(f"rank {rank} holds {shared} events that another rank holds too: "
                         f"the split's events must be disjoint")
    return pos


class GlobalSchedule:
    """The global positions of a split's events and the windows of each epoch.

    Collective at construction (an all-gather of the counts, then
    :func:`global_positions`). Holds the ``[B_r]`` positions of this rank's events
    (8 bytes an own event), nothing per event of the other ranks.

    Args:
        eid: this rank's events' global ids ``[B_r]``, strictly increasing.
        group: process group (default world).
    """

    def __init__(self, eid: Tensor, group=None) -> None:
        counts = all_gather_v(torch.tensor([eid.numel()], dtype=torch.long), group).tolist()
        self.num_events = int(sum(counts))
        self.local_pos = global_positions(eid, counts, group)

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
        return [Window(bounds[k], bounds[k + 1], local[k], local[k + 1], k)
                for k in range(len(bounds) - 1)]
