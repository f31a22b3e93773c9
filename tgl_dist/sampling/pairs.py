"""``PairShards``: a stream's distinct (src, dst) pairs sharded over ranks in first-seen order, and the window draws of historical / inductive negatives.

DyGLib's historical negatives of a batch spanning ``[t_s, t_e]`` are drawn from
``H \\ C``: the pairs first seen at or before ``t_s`` minus the pairs of the events in
``[t_s, t_e]`` (inductive: also minus the pairs first seen by ``T_obs``). The first
design gathered the whole stream on every rank (O(E) each). Here the distinct pairs are
kept once over all ranks: ordered by ``(first-seen time, key)`` (``key = src * N +
dst``) and cut into ``P`` contiguous ranges, one per rank. ``H`` minus the inductive
prefix is then one contiguous range of that global order; each rank knows its piece of
it by a binary search, and the window's draw picks positions in the global order:

1. all-gather the window's events (keys, times): ``t_s``, ``t_e`` and the positives;
2. all-gather the pairs of each rank's other events in ``[t_s, t_e]`` (ties at the
   window's ends): with the positives that is ``C``;
3. all-gather each rank's candidate count and the positions of ``C`` in its piece
   (riding on step 2's all-gather, and sent again only when some rank had ties);
4. every rank draws the same positions in ``[0, M)`` (``M = |H \\ C|``) from the
   window's seed, each rank looks up the keys of the positions in its piece, and an
   all-gather puts them in draw order.

That is three all-gathers a window (four with ties), five collectives in all when the
caller gives the window's size.

A rank holds 32 bytes per distinct pair of its range (key, first time, a key-sorted
lookup) and 16 bytes per own event of the stream (key, time): O((E + N) / P), plus the
distinct sources and destinations (O(N)) the fill draws from. Every collective runs
on the group given at construction, the same ones on every rank for every window; a
world of one runs none.

The global order and the draws do not depend on the number of ranks: one process and
``P`` processes return the same negatives for a window.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from tgl_dist.dist import Plan, all_gather_v, hash_owner, world

SMALL = 1 << 20     # candidate ranges up to this many pairs are drawn by a full permutation
_SAMPLES = 256      # splitter samples per rank when the pairs are cut into ranges


def _as_bits(t: Tensor) -> Tensor:
    return t.to(torch.float64).contiguous().view(torch.int64)


def _from_bits(b: Tensor) -> Tensor:
    return b.contiguous().view(torch.float64)


def _by_first_then_key(first: Tensor, key: Tensor) -> Tensor:
    """The order of ``(first, key)`` pairs, ascending lexicographically."""
    o = torch.sort(key).indices
    return o[torch.sort(first[o], stable=True).indices]


def _lex_cut(first: Tensor, key: Tensor, f: float, k: int) -> int:
    """Rows of the ``(first, key)``-sorted table strictly below ``(f, k)``."""
    ft = torch.tensor([f], dtype=torch.float64)
    lo = int(torch.searchsorted(first, ft, right=False))
    hi = int(torch.searchsorted(first, ft, right=True))
    return lo + int(torch.searchsorted(key[lo:hi], torch.tensor([k], dtype=torch.long), right=False))


def _first_seen(key: Tensor, t: Tensor) -> Tuple[Tensor, Tensor]:
    """The distinct ``key`` values (sorted) and the earliest ``t`` of each ``[U]``."""
    uk, inv = torch.unique(key, return_inverse=True)
    first = torch.full((uk.numel(),), float("inf"), dtype=torch.float64)
    first.scatter_reduce_(0, inv, t, "amin")
    return uk, first


def first_occurrences(x: Tensor) -> Tensor:
    """The distinct values of ``x`` ``[n]`` in the order they first occur."""
    u, inv = torch.unique(x, return_inverse=True)
    first = torch.full((u.numel(),), x.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inv, torch.arange(x.numel()), "amin")
    return x[first.sort().values]


def draw_distinct(m: int, size: int, g: torch.Generator) -> Tensor:
    """``size <= m`` distinct positions in ``[0, m)``, uniformly, from generator ``g``.

    A full permutation's prefix when ``m <= SMALL`` or ``size > m / 2`` (the draws of
    the first design, which gathered the stream); else random positions with repeats
    dropped in draw order, O(size) instead of O(m).
    """
    if m <= SMALL or 2 * size > m:
        return torch.randperm(m, generator=g)[:size]
    out = torch.zeros(0, dtype=torch.long)
    while out.numel() < size:
        out = first_occurrences(torch.cat([out, torch.randint(m, (2 * (size - out.numel()) + 16,),
                                                              generator=g)]))
    return out[:size]


class PairShards:
    """The distinct (src, dst) pairs of a stream, cut over the ranks in first-seen order.

    Collective at construction (every rank of ``group``, in the same order as its other
    collectives): two routings of rows to ranks (:class:`~tgl_dist.dist.Plan`) and three
    all-gathers.

    Args:
        src, dst: this rank's events of the stream, global node ids ``[E_r]`` int64.
        t: their times ``[E_r]`` float64.
        num_nodes: N (pair keys are ``src * N + dst``).
        group: the process group of the window draws (default world).

    Attributes:
        keys, first: this rank's range of the distinct pairs ``[S_r]``, ascending by
            ``(first, key)``; ``first`` is the pair's first time in the whole stream.
        offsets: ``[P + 1]`` global position of each rank's range.
        usrc, udst: the stream's distinct sources and destinations (sorted, O(N)).
    """

    def __init__(self, src: Tensor, dst: Tensor, t: Tensor, num_nodes: int, group=None) -> None:
        self.group = group
        self.rank, self.ws = world(group)
        self.n = max(int(num_nodes), 1)
        t = t.to(torch.float64)
        o = torch.sort(t, stable=True).indices
        self.ev_key, self.ev_t = (src * self.n + dst)[o], t[o]       # own events by time
        self.usrc = torch.unique(all_gather_v(torch.unique(src), group))
        self.udst = torch.unique(all_gather_v(torch.unique(dst), group))
        key, first = self._distinct(self.ev_key, self.ev_t)
        self.keys, self.first = self._cut(key, first)
        counts = all_gather_v(torch.tensor([self.keys.numel()], dtype=torch.long), group)
        self.offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        self._sorted_keys, self._key_rows = torch.sort(self.keys)

    @property
    def num_pairs(self) -> int:
        """Distinct pairs of the whole stream."""
        return int(self.offsets[-1])

    # ------------------------------------------------------------ construction
    def _distinct(self, key: Tensor, t: Tensor) -> Tuple[Tensor, Tensor]:
        """Each distinct pair once over all ranks (on the rank its key hashes to), with
        its first time over all ranks."""
        uk, first = _first_seen(key, t)
        if self.ws == 1:
            return uk, first
        got = Plan(hash_owner(uk, self.ws), self.group).forward(torch.stack([uk, _as_bits(first)], 1))
        return _first_seen(got[:, 0], _from_bits(got[:, 1]))

    def _cut(self, key: Tensor, first: Tensor) -> Tuple[Tensor, Tensor]:
        """Move the pairs so that rank r holds the r-th of P contiguous ranges of the
        global ``(first, key)`` order (splitters from weighted regular samples)."""
        o = _by_first_then_key(first, key)
        key, first = key[o], first[o]
        if self.ws == 1:
            return key, first
        n = key.numel()
        s = min(n, _SAMPLES)
        at = (torch.arange(s) * n) // max(s, 1)
        sample = torch.stack([_as_bits(first[at]), key[at],
                              torch.full((s,), n, dtype=torch.long),
                              torch.full((s,), s, dtype=torch.long)], 1)
        every = all_gather_v(sample, self.group)                      # [sum s_r, 4]
        sf, sk = _from_bits(every[:, 0]), every[:, 1]
        so = _by_first_then_key(sf, sk)
        weight = (every[:, 2].double() / every[:, 3].double())[so]    # pairs a sample stands for
        cum = torch.cumsum(weight, 0)
        total = float(cum[-1]) if cum.numel() else 0.0
        cuts = [0]
        for r in range(1, self.ws):                                   # P - 1 splitters
            j = int(torch.searchsorted(cum, torch.tensor([total * r / self.ws], dtype=torch.float64)))
            if j >= so.numel():
                cuts.append(n)
            else:
                cuts.append(max(cuts[-1], _lex_cut(first, key, float(sf[so[j]]), int(sk[so[j]]))))
        cuts.append(n)
        dest = torch.repeat_interleave(torch.arange(self.ws), torch.diff(torch.tensor(cuts)))
        got = Plan(dest, self.group).forward(torch.stack([key, _as_bits(first)], 1))
        key, first = got[:, 0], _from_bits(got[:, 1])
        o = _by_first_then_key(first, key)
        return key[o], first[o]

    # ------------------------------------------------------------------ windows
    def window(self, key: Tensor, t: Tensor, t_obs: Optional[float] = None,
               max_events: Optional[int] = None) -> Tuple[Tensor, "Candidates"]:
        """The global window's positive keys and its candidates ``H \\ O \\ C``
        (collective: steps 1-3 of the module's description; step 3 rides on step 2's
        all-gather when no rank has an event outside the window in ``[t_s, t_e]``).

        Args:
            key: this rank's events of the window, ``src * N + dst`` ``[B_r]``.
            t: their times ``[B_r]``.
            t_obs: inductive: pairs first seen at or before it are not candidates.
            max_events: the global window's events (``B_r`` on no rank exceeds it), when
                every rank knows it: step 1 then needs one collective instead of two.
        Returns:
            the window's positive keys (every rank's) ``[B]`` and its :class:`Candidates`.
        """
        rows = torch.stack([key, _as_bits(t)], 1)
        if max_events is None:
            got = all_gather_v(rows, self.group)
        else:   # a header row with the count, padded to the bound: sizes known to all
            pad = rows.new_zeros(int(max_events) + 1, 2)
            pad[0, 0] = rows.size(0)
            pad[1:1 + rows.size(0)] = rows
            every = all_gather_v(pad, self.group, [pad.size(0)] * self.ws).view(self.ws, -1, 2)
            got = torch.cat([every[r, 1:1 + int(every[r, 0, 0])] for r in range(self.ws)])
        pos, times = got[:, 0], _from_bits(got[:, 1])
        if pos.numel() == 0:
            return pos, Candidates(self, [(0, 0, pos)] * self.ws)
        ts = torch.tensor([float(times.min()), float(times.max())], dtype=torch.float64)
        a, b = torch.searchsorted(self.ev_t, ts[:1]), torch.searchsorted(self.ev_t, ts[1:], right=True)
        mine = torch.unique(self.ev_key[int(a):int(b)])
        extra = mine[~torch.isin(mine, pos)]     # ties at the window's ends
        hi = int(torch.searchsorted(self.first, ts[:1], right=True))
        lo = 0
        if t_obs is not None:
            lo = min(hi, int(torch.searchsorted(self.first, torch.tensor([float(t_obs)],
                                                                        dtype=torch.float64), right=True)))
        # step 2, with step 3 as it stands if no rank has ties: [lo, n, m, e, ex..., extra...]
        ex = self._excluded(torch.unique(torch.cat([pos, extra])), lo, hi)
        head = torch.tensor([lo, hi - lo, ex.numel(), extra.numel()])
        every = all_gather_v(torch.cat([head, ex, extra]), self.group)
        per, ties, at = [], [], 0
        for _ in range(self.ws):
            lo_r, n_r, m_r, e_r = (int(v) for v in every[at:at + 4])
            per.append((lo_r, n_r, every[at + 4:at + 4 + m_r]))
            ties.append(every[at + 4 + m_r:at + 4 + m_r + e_r])
            at += 4 + m_r + e_r
        ties = torch.cat(ties)
        if ties.numel():   # another rank's tie may be a pair of this rank's range: step 3 again
            ex = self._excluded(torch.unique(torch.cat([pos, ties])), lo, hi)
            every = all_gather_v(torch.cat([torch.tensor([ex.numel()]), ex]), self.group)
            at = 0
            for r in range(self.ws):
                m_r = int(every[at])
                per[r] = (per[r][0], per[r][1], every[at + 1:at + 1 + m_r])
                at += 1 + m_r
        return pos, Candidates(self, per)

    def _excluded(self, cur: Tensor, lo: int, hi: int) -> Tensor:
        """Sorted rows, relative to ``lo``, of the keys ``cur`` that lie in this rank's
        rows ``[lo, hi)``."""
        nk = self._sorted_keys.numel()
        if nk == 0:
            return cur[:0]
        p = torch.searchsorted(self._sorted_keys, cur).clamp(max=nk - 1)
        rows = self._key_rows[p[self._sorted_keys[p] == cur]]
        return torch.sort(rows[(rows >= lo) & (rows < hi)] - lo).values


class Candidates:
    """A window's candidate pairs ``H \\ O \\ C`` in the global ``(first, key)`` order,
    ``len()`` of them; :meth:`keys` looks positions up (collective)."""

    def __init__(self, shards: PairShards, per: List[Tuple[int, int, Tensor]]) -> None:
        self.shards = shards
        self.per = per        # each rank: (start row of its range, rows in it, excluded rows)
        self.count = torch.tensor([n - ex.numel() for _, n, ex in per], dtype=torch.long)
        self.ends = torch.cumsum(self.count, 0)

    def __len__(self) -> int:
        return int(self.ends[-1]) if self.ends.numel() else 0

    def keys(self, at: Tensor) -> Tensor:
        """Keys of the candidates at positions ``at`` ``[m]`` (in ``[0, len)``), in that
        order (collective: each rank looks up its range, an all-gather joins them)."""
        sh = self.shards
        r = torch.searchsorted(self.ends, at, right=True)             # whose range
        order = torch.sort(r, stable=True).indices
        lo, _, ex = self.per[sh.rank]
        i = at[r == sh.rank] - (self.ends[sh.rank] - self.count[sh.rank])
        adj = ex - torch.arange(ex.numel())                            # skip the excluded rows
        mine = sh.keys[lo + i + torch.searchsorted(adj, i, right=True)]
        out = torch.empty_like(at)
        sizes = torch.bincount(r, minlength=sh.ws).tolist()           # known to every rank
        out[order] = all_gather_v(mine, sh.group, sizes)              # by rank, draw order within
        return out
