"""``EventNegatives``: pre-generated negatives of one split, one row per event, found by event id."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import Tensor


@dataclass
class EventNegatives:
    """The pre-generated negatives of some events of one split (TGB's ``*_ns*.pkl`` lists
    of the whole split, or of one rank's events as its partition stores them).

    Shapes:
        S: the events; q: the widest list.

    Attributes:
        split: ``'val'`` or ``'test'``.
        eid: the events' ids, increasing (time order), ``[S]`` int64.
        dst: negative destinations of each event, ``[S, q]`` int64 (int32 in a
            partition), tgl_dist's node ids; rows shorter than ``q`` (TGB returns a short
            pool whole) are padded with ``-1``.
        source: the file they were read from, ``{'file': name, 'bytes': size}`` (a
            partition records it, to notice a replaced file); ``None`` when not known.
    """

    split: str
    eid: Tensor
    dst: Tensor
    source: Optional[Dict[str, object]] = None

    @property
    def mask(self) -> Tensor:
        """``[S, q]`` bool: the real (non-padding) negatives."""
        return self.dst >= 0

    @property
    def num_neg(self) -> int:
        """q, the row width."""
        return int(self.dst.size(1))

    def rows(self, eid: Tensor) -> Tensor:
        """The negatives ``[B, q]`` of the events ``eid [B]`` (any order, e.g. one rank's
        share of a step). Raises ``KeyError`` for an event that has no row here."""
        eid = torch.as_tensor(eid, dtype=torch.long).reshape(-1).contiguous()
        pos = torch.searchsorted(self.eid, eid).clamp_(max=max(self.eid.numel() - 1, 0))
        if self.eid.numel() == 0 or not bool((self.eid[pos] == eid).all()):
            raise KeyError(f"some events are not in the {self.split} split's negatives")
        return self.dst[pos]


__all__ = ["EventNegatives"]
