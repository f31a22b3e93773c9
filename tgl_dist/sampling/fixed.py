"""``FixedNegatives``: pre-generated negatives per event (TGB's evaluation negatives).

TGB (Huang et al. 2023) ships, for every validation and test event, its own list of
negative destinations (``*_val_ns*.pkl`` / ``*_test_ns*.pkl``); each positive is ranked
against exactly those. :class:`FixedNegatives` hands them to the
:class:`~tgl_dist.loader.DistributedDataLoader` in the layout of any negative sampler:
``roots.extra['neg_dst']`` ``[q*B]`` (j-major: entry ``j*B + i`` is negative ``j`` of
event ``i``), queried at the event's time with the event's source, so the loader, the
neighbour sampler and the model run unchanged. A table's ``-1`` entries (TGB lists fewer
than ``q`` negatives when its pool is small) are replaced by the event's own destination
(a valid root for the sampler) and flagged in ``roots.extra['neg_mask']`` ``[q*B]``
(False: padding, to leave out of every metric).

Each rank looks up its own events only (the table is keyed by global event id), so the
negatives of an event are the same whichever rank holds it.
"""
from __future__ import annotations

from typing import Optional, Protocol, Tuple

import torch
from torch import Tensor

from tgl_dist.sampling.negative import NegativeSampling


class NegativeTable(Protocol):
    """What :class:`FixedNegatives` reads: ``num_neg`` (q) and ``rows(eid [B]) -> [B, q]``
    int64 node ids, ``-1`` for padding (e.g. :class:`tgl_dist.data.loaders.tgb.TGBNegatives`)."""

    @property
    def num_neg(self) -> int: ...

    def rows(self, eid: Tensor) -> Tensor: ...


class FixedNegatives(NegativeSampling):
    """A negative source that gives every event its pre-generated negatives.

    Args:
        table: a :class:`NegativeTable` covering every event of the split the loader
            iterates on this rank (e.g. ``TGBNegatives`` of this rank's events).
        width: ``q``, the negatives per positive handed out; default ``table.num_neg``.
            Wider than the table: rows are padded (masked). Pass the same width on every
            rank (the widest row of the split), so the steps' layouts agree.

    Only for evaluation loaders (``train=False``); the draws do not depend on the epoch.
    """

    strategy_name = "fixed"

    def __init__(self, table: NegativeTable, width: Optional[int] = None) -> None:
        q = int(table.num_neg)
        width = q if width is None else int(width)
        if width < max(q, 1):
            raise ValueError(f"FixedNegatives: width {width} is below the table's {q} "
                             f"negatives per event (and must be >= 1)")
        self.mode, self.strategy, self.seed = "triplet", self.strategy_name, 0
        self.num_neg = width
        self.table = table

    @property
    def has_neg_src(self) -> bool:
        """False: a fixed negative's source is its positive's source."""
        return False

    def bind(self, split: str, train: bool, *args, **kwargs) -> "BoundFixedNegatives":
        """The negatives of one evaluation loader (``train`` must be False)."""
        if train:
            raise ValueError(f"FixedNegatives are evaluation negatives (TGB's val/test lists); "
                             f"the {split!r} loader trains: give it a NegativeSampling")
        return BoundFixedNegatives(self, split)

    def __repr__(self) -> str:
        return f"FixedNegatives(num_neg={self.num_neg})"


class BoundFixedNegatives:
    """:class:`FixedNegatives` bound to one split (built by the loader)."""

    def __init__(self, cfg: FixedNegatives, split: str) -> None:
        self.cfg, self.split, self.train = cfg, split, False

    def rows(self, eid: Tensor, dst: Tensor) -> Tuple[Tensor, Tensor]:
        """``(neg_dst [q, B], mask [q, B])`` (j-major) of the events ``eid [B]`` with
        destinations ``dst [B]``: padding (a ``-1`` entry, or beyond the table's width)
        holds ``dst`` and ``mask`` False there."""
        q = self.cfg.num_neg
        B = int(eid.numel())
        if B == 0:   # this rank's empty share of a window (or no event of the split at all)
            empty = torch.zeros(q, 0, dtype=torch.long)
            return empty, empty.bool()
        try:
            tab = self.cfg.table.rows(eid).to(torch.long).reshape(B, -1)
        except KeyError as e:
            raise KeyError(f"split {self.split!r}: {e.args[0] if e.args else e} (the fixed "
                           f"negatives must cover this rank's events of the split)") from None
        if tab.size(1) < q:
            tab = torch.cat([tab, tab.new_full((B, q - tab.size(1)), -1)], 1)
        neg = tab.t().contiguous()
        mask = neg >= 0
        neg = torch.where(mask, neg, dst.view(1, -1).to(neg.dtype))
        return neg, mask


__all__ = ["FixedNegatives", "BoundFixedNegatives", "NegativeTable"]
