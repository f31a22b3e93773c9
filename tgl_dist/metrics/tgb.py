"""TGB's link property prediction metrics: its ``Evaluator`` interface, and the same ranks
accumulated over a whole split across ranks.

TGB (``tgb/linkproppred/evaluate.py``, py-tgb 2.3.0) ranks each positive among its own
negatives (one-vs-many)::

    optimistic  = #{neg >  pos}          pessimistic = #{neg >= pos}
    rank        = 0.5 * (optimistic + pessimistic) + 1     (= 1 + #> + 0.5 * #=)
    mrr         = mean(1 / float32(rank))                   hits@k = mean(rank <= k)

computed in numpy (float32 reciprocals, float32 means). :class:`Evaluator` reproduces those
numbers exactly, call for call. TGB's examples call it once per positive and average the
per-positive values; :class:`TGBMetrics` does the same over a whole split (all ranks'
positives, ragged negative lists allowed), with the mean taken in float64 (``math.fsum``),
so it can differ from the examples' float32 mean by float32 rounding (~1e-7).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import Tensor

from tgl_dist.dist.exchange import all_gather_v
from tgl_dist.errors import TGLDistError

# tgb/utils/info.py DATA_EVAL_METRIC_DICT, link datasets
TGB_EVAL_METRIC: Dict[str, str] = {n: "mrr" for n in [
    "tgbl-enron", "tgbl-uci", "tgbl-wiki", "tgbl-subreddit", "tgbl-lastfm", "tgbl-review",
    "tgbl-coin", "tgbl-comment", "tgbl-flight", "tkgl-polecat", "tkgl-yago", "tkgl-wikidata",
    "tkgl-smallpedia", "tkgl-icews", "thgl-myket", "thgl-github", "thgl-forum", "thgl-software"]}


class Evaluator:
    """TGB's link prediction ``Evaluator`` (same constructor, ``eval`` input and output).

    Args:
        name: a TGB link dataset name (``tgbl-wiki``, ...); its default metric is
            :attr:`metric` (``'mrr'`` for all of them).
        k_value: the k of ``hits@k``.

    ``eval({"y_pred_pos": [P], "y_pred_neg": [P, q] (or [q] for one positive),
    "eval_metric": ["mrr"]})`` returns ``{"hits@<k>": float, "mrr": float}`` (both, as
    TGB does), the values TGB's numpy path gives (float32 arithmetic), as Python floats.
    Inputs may be numpy arrays or torch tensors (any device, detached here).

    Raises:
        NotImplementedError: unknown dataset (as TGB).
        RuntimeError / ValueError: a missing key, an unsupported metric, inputs that are
            neither numpy nor torch (as TGB).
    """

    valid_metric_list = ["hits@", "mrr"]

    def __init__(self, name: str, k_value: int = 10) -> None:
        self.name = name
        self.k_value = int(k_value)
        if name not in TGB_EVAL_METRIC:
            raise NotImplementedError(f"Dataset not supported: {name!r} (TGB's link datasets: "
                                      f"{', '.join(TGB_EVAL_METRIC)})")
        self.metric = TGB_EVAL_METRIC[name]

    def _parse_and_check_input(self, input_dict: dict):
        if "eval_metric" not in input_dict:
            raise RuntimeError("Missing key of eval_metric!")
        pos = neg = None
        for m in input_dict["eval_metric"]:
            if m not in self.valid_metric_list:
                raise ValueError(f"Unsupported eval metric: {m}, not found in "
                                 f"{self.valid_metric_list}")
            if "y_pred_pos" not in input_dict:
                raise RuntimeError("Missing key of y_pred_pos")
            if "y_pred_neg" not in input_dict:
                raise RuntimeError("Missing key of y_pred_neg")
            pos, neg = input_dict["y_pred_pos"], input_dict["y_pred_neg"]
            if isinstance(pos, Tensor):
                pos = pos.detach().cpu().numpy()
            if isinstance(neg, Tensor):
                neg = neg.detach().cpu().numpy()
            if not isinstance(pos, np.ndarray) or not isinstance(neg, np.ndarray):
                raise RuntimeError("Arguments to Evaluator need to be either numpy ndarray or "
                                   "torch tensor!")
        self.eval_metric = input_dict["eval_metric"]
        return pos, neg

    def eval(self, input_dict: dict, verbose: bool = False) -> Dict[str, float]:
        """``{"hits@<k>": ..., "mrr": ...}`` of the positives against their negatives."""
        pos, neg = self._parse_and_check_input(input_dict)
        if pos is None:          # TGB would fail here too: nothing to rank
            raise RuntimeError("eval_metric is empty: nothing to evaluate")
        pos = pos.reshape(-1, 1)
        opt = (neg > pos).sum(axis=1)
        pes = (neg >= pos).sum(axis=1)
        rank = 0.5 * (opt + pes) + 1
        hits = (rank <= self.k_value).astype(np.float32)
        rr = 1.0 / rank.astype(np.float32)
        out = {f"hits@{self.k_value}": float(hits.mean()), "mrr": float(rr.mean())}
        if verbose:
            print(f"{self.name}: {out}")
        return out


def tgb_ranks(pos: Tensor, neg: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """TGB's rank of each positive among its own negatives: ``1 + #{neg > pos} +
    0.5 * #{neg == pos}``.

    Args:
        pos: ``[P]`` scores of the positives.
        neg: ``[P, q]`` scores of each positive's negatives.
        mask: optional ``[P, q]`` bool, the real negatives (TGB's lists can be shorter
            than q: padded entries are ignored).

    Returns:
        ``[P]`` float64 ranks (half-integers on ties).
    """
    pos = torch.as_tensor(pos).detach().reshape(-1, 1)
    neg = torch.as_tensor(neg).detach().reshape(pos.size(0), -1)
    gt, ge = neg > pos, neg >= pos
    if mask is not None:
        mask = torch.as_tensor(mask, dtype=torch.bool).reshape(neg.shape).to(neg.device)
        gt, ge = gt & mask, ge & mask
    return (0.5 * (gt.sum(1) + ge.sum(1)).double() + 1).cpu()


def mrr_hits_from_ranks(rank: Tensor, k_value: int = 10) -> Dict[str, float]:
    """MRR and hits@k of the ranks ``[P]``: per positive TGB's float32 ``1/rank`` and
    ``rank <= k``, averaged in float64 (``math.fsum``, so the order is irrelevant)."""
    if rank.numel() == 0:
        return {"mrr": float("nan"), f"hits@{k_value}": float("nan")}
    rr = (1.0 / rank.float()).double()
    hits = (rank <= k_value).double()
    n = rank.numel()
    return {"mrr": math.fsum(rr.tolist()) / n, f"hits@{k_value}": math.fsum(hits.tolist()) / n}


class TGBMetrics:
    """Accumulate TGB one-vs-many ranks over a split on each rank; evaluate the whole split.

    ``update(pos [B], neg [B, q], mask [B, q] or None)`` per batch (any rank's share, also
    empty); ``compute(group)`` is a collective (every rank calls it): it gathers every
    rank's ranks and returns ``{"mrr", "hits@<k>", "num"}`` over all positives.
    NaN or infinite scores (a diverged model) make ``compute`` raise
    :class:`NonFiniteTGBScoresError` on every rank (the count is gathered first).
    """

    def __init__(self, k_value: int = 10) -> None:
        self.k_value = int(k_value)
        self.ranks: List[Tensor] = []
        self.nonfinite = 0

    def update(self, pos: Tensor, neg: Tensor, mask: Optional[Tensor] = None) -> None:
        pos = torch.as_tensor(pos).detach()
        if pos.numel() == 0:
            return
        neg = torch.as_tensor(neg).detach()
        bad = ~torch.isfinite(neg) if mask is None else (~torch.isfinite(neg)) & mask.reshape(
            neg.shape).to(neg.device)
        self.nonfinite += int((~torch.isfinite(pos)).sum()) + int(bad.sum())
        self.ranks.append(tgb_ranks(pos, neg, mask))

    def compute(self, group=None) -> Dict[str, float]:
        bad = int(all_gather_v(torch.tensor([self.nonfinite]), group).sum())
        if bad:
            raise NonFiniteTGBScoresError(f"{bad} NaN or infinite scores in TGB evaluation: the "
                                          "model diverged, and their ranks are meaningless")
        r = torch.cat(self.ranks) if self.ranks else torch.zeros(0, dtype=torch.float64)
        r = all_gather_v(r, group)
        out = mrr_hits_from_ranks(r, self.k_value)
        out["num"] = int(r.numel())
        return out

    def reset(self) -> None:
        self.ranks = []
        self.nonfinite = 0


class NonFiniteTGBScoresError(TGLDistError, ValueError):
    """NaN or infinite scores given to :class:`TGBMetrics`."""


__all__ = ["Evaluator", "TGBMetrics", "tgb_ranks", "mrr_hits_from_ranks", "TGB_EVAL_METRIC",
           "NonFiniteTGBScoresError"]
