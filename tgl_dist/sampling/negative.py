"""``NegativeSampling``: negative destinations (and sources) for link prediction, as DyGLib defines them.

Strategies (``mode='triplet'``: each positive event ``(u, v, t)`` gets ``num_neg``
negatives queried at ``t``):

* ``'random'``: negative destination uniform over the unique destination ids of
  the sampler's stream: the **training** split's events when training, **all**
  events for validation/test, the split's own events for the new-node splits
  (TGN / DyGLib). The negative source is the positive source. In training a draw
  equal to the positive destination stays (as in TGN and DyGLib); in evaluation it is
  drawn again (TGB's generator filters the positive out), so the MRR's k negatives are
  all true negatives.
* ``'historical'``: for a batch spanning ``[t_s, t_e]``: H = unique (src, dst) pairs
  with ``t <= t_s`` in the stream, C = pairs with ``t`` in ``[t_s, t_e]``; draw the
  batch's negatives without replacement from ``H \\ C``; when too few, take all of it
  and fill the rest, without replacement, from ``unique src x unique dst`` minus the
  batch's positives (with replacement only when that pool is smaller than the fill).
  Negative sources and destinations both come from the pairs.
* ``'inductive'``: like historical, with candidates ``H \\ O \\ C`` where O = pairs
  with ``t <= T_obs`` (last training time for validation, last validation time for
  test): pairs first seen after the observed period.

Determinism (what makes numbers comparable):

* ``random`` draws are a hash of ``(seed, epoch or split, eid, j)``: the negative of
  an event is the same whichever rank holds it and however many ranks there are.
  Training uses a new key every epoch; evaluation keys depend on the split only, so
  every evaluation of a split sees the same negatives.
* ``historical`` / ``inductive`` draw a whole global batch window at once, seeded by the
  window's position, and each rank takes the entries of its own events. The pairs are
  not gathered: :class:`~tgl_dist.sampling.pairs.PairShards` keeps each distinct pair
  on one rank, in a global first-seen order that does not depend on the number of
  ranks, and a window's draw is three small all-gathers. Results equal a single process
  whose batch is that window (``batch_size * world_size`` events).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from tgl_dist.sampling._ckernel import get_kernel
from tgl_dist.sampling.hashing import hash_keys, uniform_below
from tgl_dist.sampling.pairs import PairShards, draw_distinct, first_occurrences

log = logging.getLogger(__name__)

STRATEGIES = ("random", "historical", "inductive")
REDRAWS = 20       # evaluation: times a random negative equal to the positive is redrawn
_SPLIT_KEY = {"train": 1, "val": 2, "new_node_val": 3, "test": 4, "new_node_test": 5,
              "inductive_train": 6, "all": 7}


@dataclass
class Stream:
    """This rank's events of the stream negatives are drawn from (its share: the
    ranks' streams together are the whole stream).

    Attributes: src, dst ``[E_r]`` int64; t ``[E_r]`` float64; num_nodes N.
    """

    src: Tensor
    dst: Tensor
    t: Tensor
    num_nodes: int


class NegativeSampling:
    """Negative sampler configuration, shared by a run's loaders.

    Args:
        mode: only ``'triplet'`` (source, positive destination, negative destination).
        strategy: ``'random'``, ``'historical'`` or ``'inductive'``.
        num_neg: negatives per positive event (k).
        seed: base seed.
    """

    def __init__(self, mode: str = "triplet", strategy: str = "random", num_neg: int = 1,
                 seed: int = 0) -> None:
        if mode != "triplet":
            raise ValueError(f"mode must be 'triplet', got {mode!r}")
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if int(num_neg) < 1:
            raise ValueError(f"num_neg must be >= 1, got {num_neg}")
        self.mode = mode
        self.strategy = strategy
        self.num_neg = int(num_neg)
        self.seed = int(seed)

    @property
    def has_neg_src(self) -> bool:
        """True when negatives come with their own sources (historical, inductive)."""
        return self.strategy != "random"

    def bind(self, split: str, train: bool, stream: Stream, dst_pool: Optional[Tensor],
             last_observed_time: Optional[float] = None, group=None) -> "BoundNegatives":
        """The sampler for one loader (a split). Collective over ``group`` for historical
        and inductive (the pairs are sharded, :class:`PairShards`); random needs none.

        Args:
            split: the split's name (keys evaluation draws).
            train: training (new draws every epoch) or evaluation (fixed draws).
            stream: this rank's events of the stream H and C are taken from
                (historical, inductive; random ignores it).
            dst_pool: unique destination ids random negatives are drawn from ``[P]``
                (historical / inductive: ``None`` takes the stream's destinations).
            last_observed_time: T_obs (inductive only).
            group: the process group of the window draws (the loader's own).
        """
        if self.strategy == "inductive" and last_observed_time is None:
            raise ValueError("strategy='inductive' needs the last observed time (T_obs)")
        return BoundNegatives(self, split, train, stream, dst_pool, last_observed_time, group)

    def __repr__(self) -> str:
        return f"NegativeSampling(mode={self.mode!r}, strategy={self.strategy!r}, num_neg={self.num_neg})"


def _repeats(neg: Tensor, priority: Optional[Tensor] = None) -> Tensor:
    """``[k, B]`` bool: entry ``(j, i)`` repeats an id of its column ``i`` held by an entry
    of lower ``priority`` (default: the row number ``j``; ties keep the lower ``j``)."""
    if neg.size(0) < 2:
        return torch.zeros_like(neg, dtype=torch.bool)
    order = torch.arange(neg.size(0), device=neg.device).view(-1, 1).expand_as(neg)
    if priority is not None:                               # first by priority, then by id
        order = torch.sort(priority, dim=0, stable=True).indices
    srt, o2 = torch.sort(neg.gather(0, order), dim=0, stable=True)
    later = torch.zeros_like(neg, dtype=torch.bool)
    later[1:] = srt[1:] == srt[:-1]                        # all but the first of equal ids
    out = torch.empty_like(later)
    out.scatter_(0, order.gather(0, o2), later)
    return out


class BoundNegatives:
    """A :class:`NegativeSampling` bound to one split's stream (built by the loader)."""

    def __init__(self, cfg: NegativeSampling, split: str, train: bool, stream: Stream,
                 dst_pool: Optional[Tensor], last_observed_time: Optional[float], group=None) -> None:
        self.cfg = cfg
        self.split = split
        self.train = train
        self.t_obs = last_observed_time
        self._n = max(stream.num_nodes, 1)
        self.pairs: Optional[PairShards] = None
        if cfg.strategy != "random":
            self.pairs = PairShards(stream.src, stream.dst, stream.t, stream.num_nodes, group)
        self.pool = self.pairs.udst if dst_pool is None and self.pairs is not None else dst_pool

    def _key(self, epoch: int) -> int:
        k = _SPLIT_KEY.get(self.split, 99)
        return int(hash_keys(self.cfg.seed, k, epoch if self.train else -1))

    # ---------------------------------------------------------------- random
    def random(self, eid: Tensor, epoch: int, avoid: Optional[Tensor] = None) -> Tensor:
        """Negative destinations ``[k, B]`` (j-major) for events ``eid`` ``[B]``.

        Draw ``j`` of event ``e`` is ``pool[hash(key, e, j) mod |pool|]``. With ``avoid
        [B]`` (evaluation: TGB's generator draws each event's candidates without
        replacement and filters out its true destination) a draw equal to ``avoid`` or to
        an earlier draw ``j' < j`` of the same event is drawn again with counter
        ``j + r k`` (r = 1, 2, ..., at most :data:`REDRAWS` times). Entries still bad
        after that (pools of about ``k`` ids) take the ids their event does not hold yet,
        in a hash order of the pool (:meth:`_complete`). So a draw equals the positive
        only when the pool holds nothing else, and repeats occur only when the pool
        holds at most ``k`` ids.
        """
        k = self.cfg.num_neg
        if self.pool.numel() == 0:
            raise ValueError(f"split {self.split!r}: no destination ids to draw negatives from")
        n = self.pool.numel()
        key = self._key(epoch)
        kern = get_kernel() if eid.device.type == "cpu" and eid.dtype == torch.long else None
        if kern is not None:   # the same draws in one pass
            neg = self.pool[kern.draw_below(key, eid, k, n)]
        else:
            h = hash_keys(key, eid.view(1, -1), torch.arange(k).view(k, 1))
            neg = self.pool[uniform_below(h, torch.tensor(n))]
        if avoid is None or n < 2:
            return neg
        # repeats can all go only when the pool holds k ids besides the positive; the
        # positive always goes (redrawing repeats in vain could land on it again)
        distinct = n > k
        rounds = torch.zeros_like(neg) if distinct else None   # times each entry was redrawn
        rows = torch.arange(k, device=neg.device).view(k, 1)
        for r in range(1, REDRAWS + 2):
            bad = neg == avoid.view(1, -1)
            if distinct:   # a redrawn entry yields to one drawn fewer times, then to lower j
                bad |= _repeats(neg, rounds * k + rows)
            j, i = bad.nonzero(as_tuple=True)
            if j.numel() == 0:
                break
            if r > REDRAWS:   # still bad after every redraw: complete deterministically
                self._complete(neg, bad, avoid, eid, key, distinct)
                break
            h = hash_keys(key, eid[i], j + r * k)
            neg[j, i] = self.pool[uniform_below(h, torch.tensor(n))]
            if distinct:
                rounds[j, i] += 1
        return neg

    def _complete(self, neg: Tensor, bad: Tensor, avoid: Tensor, eid: Tensor, key: int,
                  distinct: bool) -> None:
        """Replace the ``bad [k, B]`` entries of ``neg`` in place: event i's bad entries
        take, in order of ``j``, the pool ids that are neither its positive nor (with
        ``distinct``) held by its other entries, in the order of ``hash(key, eid, -1 -
        position)`` (wrapping round when fewer ids are left, which happens only without
        ``distinct``)."""
        cols = bad.any(0).nonzero().view(-1)
        sub, sbad, pos = neg[:, cols], bad[:, cols], avoid[cols]
        pool = torch.sort(self.pool).values
        n, b = pool.numel(), cols.numel()
        rows = torch.arange(b, device=neg.device)
        held = torch.zeros(b, n, dtype=torch.bool, device=neg.device)
        p = torch.searchsorted(pool, pos).clamp(max=n - 1)
        hit = pool[p] == pos
        held[rows[hit], p[hit]] = True
        if distinct:
            kj, ki = (~sbad).nonzero(as_tuple=True)
            held[ki, torch.searchsorted(pool, sub[kj, ki])] = True
        h = hash_keys(key, eid[cols].view(-1, 1), -1 - torch.arange(n, device=neg.device))
        order = torch.sort(h, dim=1).indices                       # a random order per event
        order = order.gather(1, torch.sort(held.gather(1, order).to(torch.uint8), dim=1,
                                           stable=True).indices)   # free ids first
        free = (~held).sum(1)                                      # >= 1 (n >= 2)
        bj, bi = sbad.nonzero(as_tuple=True)
        r = (torch.cumsum(sbad.long(), 0) - 1)[bj, bi] % free[bi]
        sub[bj, bi] = pool[order[bi, r]]
        neg[:, cols] = sub

    # ------------------------------------------------------- historical pairs
    def window(self, src: Tensor, dst: Tensor, t: Tensor, size: int, window_id: int,
               epoch: int, window_events: Optional[int] = None) -> Tuple[Tensor, Tensor]:
        """Negative ``(src, dst)`` pairs ``[size]`` for a whole global batch window
        (collective over the bound group: every rank calls it for every window).

        Args:
            src, dst, t: this rank's events of the window ``[B_r]`` (the positives).
            size: number of negatives (the global window's events x k).
            window_id: the window's global start position (keys the draw).
            epoch: training epoch (evaluation draws ignore it).
            window_events: the global window's events, when known (saves a collective).
        Returns:
            ``(neg_src, neg_dst)`` ``[size]``, the same on every rank, in draw order.
        """
        g = torch.Generator().manual_seed(int(hash_keys(self._key(epoch), int(window_id)))
                                          & ((1 << 62) - 1))
        n = self._n
        t_obs = self.t_obs if self.cfg.strategy == "inductive" else None
        pos, cand = self.pairs.window(src * n + dst, t, t_obs, window_events)
        m = len(cand)
        if m >= size:
            pick = cand.keys(draw_distinct(m, size, g))
            return pick // n, pick % n
        fs, fd = self._fill(size - m, pos, g)     # DyGLib's order: the fill, then all of H
        every = cand.keys(torch.arange(m))
        return torch.cat([fs, every // n]), torch.cat([fd, every % n])

    def _fill(self, size: int, pos_keys: Tensor, g: torch.Generator) -> Tuple[Tensor, Tensor]:
        """``size`` random pairs of ``unique src x unique dst`` minus the batch's positives
        ``pos_keys`` (``src * N + dst``), without replacement (DyGLib's
        ``random_sample_with_collision_check``); with replacement only when that pool
        holds fewer than ``size`` pairs."""
        usrc, udst = self.pairs.usrc, self.pairs.udst
        nd = udst.numel()
        P = usrc.numel() * nd                       # pairs, numbered i = s_idx * nd + d_idx

        def pairs(i: Tensor) -> Tensor:             # pair numbers -> src * N + dst
            return usrc[i // nd] * self._n + udst[i % nd]

        pos = torch.unique(pos_keys)
        if P <= _SMALL or P - pos.numel() < size:   # enumerate the pool
            keys = pairs(torch.arange(P))
            keys = keys[~torch.isin(keys, pos)]
            if keys.numel() == 0:
                raise ValueError(f"split {self.split!r}: every (src, dst) pair of the stream "
                                 f"is a positive of the batch; no negative pairs to fill with")
            pick = (torch.randperm(keys.numel(), generator=g)[:size] if keys.numel() >= size
                    else torch.randint(keys.numel(), (size,), generator=g))
            keys = keys[pick]
        else:                                       # a huge product: draw, drop repeats
            keys = pos.new_zeros(0)
            while keys.numel() < size:
                draw = pairs(torch.randint(P, (2 * (size - keys.numel()) + 16,), generator=g))
                keys = first_occurrences(torch.cat([keys, draw[~torch.isin(draw, pos)]]))
            keys = keys[:size]
        return keys // self._n, keys % self._n


_SMALL = 1 << 20   # fill pools up to this many pairs are enumerated
