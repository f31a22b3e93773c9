"""AP, AUC and MRR computed over a whole evaluation split, never averaged per batch.

``LinkPredMetrics`` accumulates scores batch by batch on each rank; ``compute()``
gathers every rank's scores (a collective) and evaluates once over the full set.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import torch
from torch import Tensor

from tgl_dist.dist.exchange import all_gather_v, all_reduce_max_int
from tgl_dist.errors import TGLDistError


class NonFiniteScoresError(TGLDistError, ValueError):
    """Evaluation scores that are NaN or infinite (a diverged model): nothing to rank."""


def _check_finite(scores: Tensor) -> None:
    bad = int((~torch.isfinite(scores)).sum())
    if bad:
        raise NonFiniteScoresError(f"{bad} of {scores.numel()} evaluation scores are NaN or "
                                   f"infinite: the model diverged (a learning rate too high?), "
                                   f"and AP / AUC / MRR cannot rank them")


def _curve(pos: Tensor, neg: Tensor):
    """``(fps, tps)`` float64 ``[T]``: false and true positives above each of the T distinct
    scores, highest first (scikit-learn's ``_binary_clf_curve``; the order of tied scores
    does not matter, a tie is one threshold)."""
    s = torch.cat([pos.reshape(-1), neg.reshape(-1)]).double().cpu().numpy()
    y = np.concatenate([np.ones(pos.numel()), np.zeros(neg.numel())])
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    idx = np.concatenate([np.nonzero(np.diff(s))[0], [s.size - 1]])
    tps = np.cumsum(y)[idx]
    return 1 + idx.astype(np.float64) - tps, tps


def average_precision(pos: Tensor, neg: Tensor) -> float:
    """AP of positives ``[P]`` against negatives ``[Q]`` (scores or logits): the step
    integral of precision over recall, ``sum_k (R_k - R_(k-1)) P_k`` over the distinct
    scores, bit for bit scikit-learn's ``average_precision_score`` (same arrays, same
    summation; tests compare them), without importing it (scikit-learn and SciPy took 1.7 s
    of every process's start). NaN without positives."""
    if pos.numel() == 0:
        return float("nan")
    fps, tps = _curve(pos, neg)
    precision = np.concatenate([(tps / (tps + fps))[::-1], [1.0]])
    recall = np.concatenate([(tps / tps[-1])[::-1], [0.0]])
    return float(max(0.0, -np.sum(np.diff(recall) * precision[:-1])))


def roc_auc(pos: Tensor, neg: Tensor) -> float:
    """ROC AUC of positives ``[P]`` against negatives ``[Q]``: the trapezoids under the ROC
    curve (collinear points dropped first), bit for bit scikit-learn's ``roc_auc_score``.
    NaN without positives or without negatives."""
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    fps, tps = _curve(pos, neg)
    if fps.size > 2:
        keep = np.concatenate([[True], np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), [True]])
        fps, tps = fps[keep], tps[keep]
    fpr = np.concatenate([[0.0], fps]) / fps[-1]
    tpr = np.concatenate([[0.0], tps]) / tps[-1]
    return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2.0))


def mrr(pos: Tensor, neg: Tensor) -> float:
    """Mean reciprocal rank of each positive among its own k negatives (TGB's tie rule).

    Args:
        pos: ``[P]`` scores; neg: ``[P, k]`` scores of the negatives of each positive.
    rank = 1 + #(neg > pos) + 0.5 * #(neg == pos).
    """
    if pos.numel() == 0:
        return float("nan")
    pos = pos.reshape(-1, 1).double()
    neg = neg.reshape(pos.size(0), -1).double()
    rank = 1 + (neg > pos).sum(1).double() + 0.5 * (neg == pos).sum(1).double()
    # fsum: correctly rounded, so the order the ranks gathered the scores in is irrelevant
    return math.fsum((1.0 / rank).tolist()) / rank.numel()


class LinkPredMetrics:
    """Accumulate link-prediction scores over a split, then evaluate the whole split once.

    ``update(pos, neg)`` with ``pos [B]`` and ``neg [B]`` (one negative per positive,
    for AP/AUC); optionally ``neg_k [B, k]`` for MRR. ``compute(group)`` is a
    collective: every rank must call it, even with no scores. NaN or infinite scores (a
    diverged model) raise :class:`NonFiniteScoresError` on every rank.

    Scores are ranked at float32 precision, also those of a float64 model. Scores that
    are equal in exact arithmetic come out of 1 and N ranks with different rounding
    (summation order), ~1e-16 apart in float64; ranked as they are, those differences
    would break ties one way on one process and another way on two, and AP, AUC and
    MRR would depend on the world size (by 8e-5 AP in a test whose featureless
    EvolveGCN gives many equal scores). The price: float64 scores closer than
    float32's precision (~6e-8 relative) count as ties, like any two equal scores.
    """

    def __init__(self) -> None:
        self.pos: List[Tensor] = []
        self.neg: List[Tensor] = []
        self.neg_k: List[Tensor] = []

    def update(self, pos: Tensor, neg: Tensor, neg_k: Optional[Tensor] = None) -> None:
        # compared at float32 precision on purpose (see the class docstring)
        self.pos.append(pos.detach().reshape(-1).float().cpu())
        self.neg.append(neg.detach().reshape(-1).float().cpu())
        if neg_k is not None and pos.numel():   # an empty batch (a rank without events) has no k
            self.neg_k.append(neg_k.detach().reshape(pos.numel(), -1).float().cpu())

    def compute(self, group=None) -> Dict[str, float]:
        pos = torch.cat(self.pos) if self.pos else torch.zeros(0)
        neg = torch.cat(self.neg) if self.neg else torch.zeros(0)
        pos, neg = all_gather_v(pos, group), all_gather_v(neg, group)
        _check_finite(torch.cat([pos, neg]))   # every rank holds the same: all raise alike
        out = {"ap": float("nan"), "auc": float("nan"), "num": int(pos.numel())}
        if pos.numel() and neg.numel():
            out["ap"] = average_precision(pos, neg)
            out["auc"] = roc_auc(pos, neg)
        k = all_reduce_max_int(self.neg_k[0].size(1) if self.neg_k else 0, group)
        if k > 0:
            pk = torch.cat(self.pos) if self.neg_k else torch.zeros(0)
            nk = torch.cat(self.neg_k) if self.neg_k else torch.zeros(0, int(k))
            pk, nk = all_gather_v(pk, group), all_gather_v(nk, group)
            _check_finite(nk)
            out["mrr"] = mrr(pk, nk)
        return out

    def reset(self) -> None:
        self.__init__()

    def state_dict(self) -> Dict[str, Optional[Tensor]]:
        """This rank's scores so far (for checkpoints of a partial split):
        ``{'pos': [n], 'neg': [n], 'neg_k': [n, k] or None}``."""
        return {"pos": torch.cat(self.pos) if self.pos else torch.zeros(0),
                "neg": torch.cat(self.neg) if self.neg else torch.zeros(0),
                "neg_k": torch.cat(self.neg_k) if self.neg_k else None}

    def load_state_dict(self, state: Dict[str, Optional[Tensor]]) -> None:
        """Restore :meth:`state_dict`; ``compute()`` then gives the same figures."""
        self.__init__()
        if state["pos"].numel():
            self.pos, self.neg = [state["pos"].float().cpu()], [state["neg"].float().cpu()]
        if state.get("neg_k") is not None and state["neg_k"].numel():
            self.neg_k = [state["neg_k"].float().cpu()]


class EarlyStopMonitor:
    """Stop when the monitored metric (higher is better unless ``higher_better=False``)
    has not improved by more than ``tolerance`` for ``patience`` rounds."""

    def __init__(self, patience: int = 5, higher_better: bool = True, tolerance: float = 1e-10):
        self.patience = patience
        self.higher_better = higher_better
        self.tolerance = tolerance
        self.best: Optional[float] = None
        self.best_epoch = -1
        self.rounds = 0
        self.epoch = -1

    def step(self, value: float) -> bool:
        """Record one round; returns True when training should stop."""
        self.epoch += 1
        v = value if self.higher_better else -value
        if v == v and (self.best is None or v - self.best > self.tolerance):   # NaN: no better
            self.best, self.best_epoch, self.rounds = v, self.epoch, 0
        else:
            self.rounds += 1
        return self.rounds >= self.patience

    def state_dict(self) -> dict:
        return dict(best=self.best, best_epoch=self.best_epoch, rounds=self.rounds, epoch=self.epoch)

    def load_state_dict(self, s: dict) -> None:
        self.best, self.best_epoch, self.rounds, self.epoch = (s["best"], s["best_epoch"],
                                                               s["rounds"], s["epoch"])
