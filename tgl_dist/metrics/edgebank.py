"""EdgeBank (Poursafaei et al. 2022, "Towards Better Evaluation for Dynamic Link
Prediction"): score 1 for a pair seen before, else 0.

This is the variant TGB's examples (``examples/linkproppred/*/edgebank.py``, memory mode
``unlimited``) and DyGLib (``models/EdgeBank.py``, ``unlimited_memory``) report: unlimited
memory and an unlimited time window. Pairs are directed, ``(src, dst)`` as stored.

Protocol (TGB's example): the memory starts with the training events; a split is evaluated
in batches in time order; each batch's positives and negatives are scored against the
memory as it stands, then the batch's positives are added to it. The next split (test
after validation) continues from that memory. The batching matters only within the split:
a pair that first appears in batch ``b`` scores 1 from batch ``b + 1`` on.

Vectorised with torch: a pair is one int64 key ``src << 31 | dst``; the memory is a few
sorted, disjoint key tables (merged as they grow, log-structured), looked up with
``searchsorted``; a whole split is scored at once from each pair's first batch (no loop
over events or batches).

On several ranks the memory is sharded: :meth:`EdgeBank.sync` moves each pair to the
rank that owns it (a hash of its key), so a rank holds 1/P of the pairs, and
:meth:`EdgeBankMetrics.compute` sends each query and each positive of the split to its
pair's owner, which scores it and sends the score back. No rank holds every pair.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Union

import torch
from torch import Tensor

from tgl_dist.dist.book import hash_owner
from tgl_dist.dist.exchange import Plan, world
from tgl_dist.metrics.ranking import LinkPredMetrics
from tgl_dist.metrics.tgb import TGBMetrics

_SHIFT = 31
_LIMIT = 1 << _SHIFT


def pair_keys(src: Tensor, dst: Tensor) -> Tensor:
    """One int64 key per directed pair: ``src << 31 | dst`` (ids in ``[0, 2^31)``)."""
    src = torch.as_tensor(src, dtype=torch.long).reshape(-1).cpu()
    dst = torch.as_tensor(dst, dtype=torch.long).reshape(-1).cpu()
    if src.numel() != dst.numel():
        raise ValueError(f"src and dst differ in length: {src.numel()} and {dst.numel()}")
    if src.numel():
        lo = min(int(src.min()), int(dst.min()))
        hi = max(int(src.max()), int(dst.max()))
        if lo < 0 or hi >= _LIMIT:
            raise ValueError(f"EdgeBank takes node ids in [0, 2^31), got [{lo}, {hi}] "
                             "(mask out padding such as -1 first)")
    return (src << _SHIFT) | dst


class EdgeBank:
    """The set of directed pairs seen so far (unlimited memory, unlimited time window).

    ``update(src, dst)`` memorises pairs; ``predict(src, dst)`` gives ``1.0`` for a pair in
    memory, else ``0.0`` (float32, the shape of ``src``). Ids must lie in ``[0, 2^31)``.
    After :meth:`sync` over P > 1 ranks the bank holds this rank's share of the pairs and
    answers only for those (:class:`EdgeBankMetrics` asks the owners).
    """

    def __init__(self) -> None:
        self._levels: List[Tensor] = []      # sorted, disjoint key tables, larger first
        self.rank, self.shards = 0, 1         # after sync: this rank of `shards` owners

    def __len__(self) -> int:
        """Distinct pairs in memory."""
        return sum(int(x.numel()) for x in self._levels)

    def _contains_keys(self, keys: Tensor) -> Tensor:
        keys = keys.contiguous()
        hit = torch.zeros(keys.shape, dtype=torch.bool)
        for lv in self._levels:
            i = torch.searchsorted(lv, keys).clamp_(max=lv.numel() - 1)
            hit |= lv[i] == keys
        return hit

    def _add_keys(self, keys: Tensor) -> None:
        k = torch.unique(keys)
        k = k[~self._contains_keys(k)]
        if k.numel() == 0:
            return
        self._levels.append(k)
        while len(self._levels) > 1 and self._levels[-2].numel() <= 2 * self._levels[-1].numel():
            b = self._levels.pop()
            a = self._levels.pop()
            self._levels.append(torch.sort(torch.cat([a, b])).values)

    def update(self, src: Tensor, dst: Tensor) -> None:
        """Memorise the pairs ``(src[i], dst[i])``."""
        self._add_keys(pair_keys(src, dst))

    def contains(self, src: Tensor, dst: Tensor) -> Tensor:
        """``[n]`` bool: whether each pair is in memory (of a synced bank: pairs this rank
        owns only, a ``ValueError`` for another's)."""
        keys = pair_keys(src, dst)
        if self.shards > 1:
            other = hash_owner(keys, self.shards) != self.rank
            if bool(other.any()):
                i = int(other.nonzero()[0])
                raise ValueError(f"EdgeBank synced over {self.shards} ranks: pair "
                                 f"({int(keys[i] >> _SHIFT)}, {int(keys[i] & (_LIMIT - 1))}) is "
                                 f"held by rank {int(hash_owner(keys[i:i + 1], self.shards))}, "
                                 f"not {self.rank}; score through EdgeBankMetrics.compute")
        return self._contains_keys(keys)

    def predict(self, src: Tensor, dst: Tensor) -> Tensor:
        """EdgeBank's scores: ``1.0`` if the pair is in memory, else ``0.0`` (float32,
        shaped like ``src``)."""
        shape = torch.as_tensor(src).shape
        return self.contains(src, dst).float().reshape(shape)

    def keys(self) -> Tensor:
        """All pairs' keys, sorted (see :func:`pair_keys`)."""
        return torch.sort(torch.cat(self._levels)).values if self._levels else torch.zeros(
            0, dtype=torch.long)

    def sync(self, group=None) -> None:
        """Shard the memory over the ranks (a collective: all ranks call it), e.g. after
        each rank memorised its own share of the training events: every pair moves to
        the rank :func:`~tgl_dist.dist.hash_owner` names, so this rank then holds its share of all ranks'
        pairs (``len()`` counts them) and the ranks together hold each pair once."""
        rank, ws = world(group)
        keys = self.keys()
        keys = Plan(hash_owner(keys, ws), group).forward(keys)
        self._levels = []
        self._add_keys(keys)
        self.rank, self.shards = rank, ws

    def state_dict(self) -> Dict[str, Tensor]:
        """This rank's pairs (``keys``) and, of a synced bank, its rank among the owners."""
        return {"keys": self.keys(), "rank": torch.tensor(self.rank), "shards": torch.tensor(self.shards)}

    def load_state_dict(self, state: Dict[str, Tensor]) -> None:
        self._levels = []
        self._add_keys(state["keys"].long().cpu())
        self.rank, self.shards = int(state.get("rank", 0)), int(state.get("shards", 1))


def edgebank_split_scores(bank: EdgeBank, pos_keys: Tensor, pos_step: Tensor,
                          query_keys: Tensor, query_step: Tensor) -> Tensor:
    """Scores of query pairs when the memory at step ``s`` is ``bank`` plus the positives
    of all steps ``< s`` (every step's positives are added after it is scored).

    Args:
        bank: the memory before the split (not modified).
        pos_keys, pos_step: ``[P]`` the split's positives (:func:`pair_keys`) and steps.
        query_keys, query_step: ``[Q]`` pairs to score and the step they are scored in.

    Returns:
        ``[Q]`` float32, 1.0 or 0.0.
    """
    seen = bank._contains_keys(query_keys)
    if pos_keys.numel():
        uk, inv = torch.unique(pos_keys, return_inverse=True)
        first = torch.full((uk.numel(),), torch.iinfo(torch.long).max, dtype=torch.long)
        first.scatter_reduce_(0, inv, pos_step.long(), reduce="amin")
        i = torch.searchsorted(uk, query_keys).clamp_(max=uk.numel() - 1)
        seen |= (uk[i] == query_keys) & (first[i] < query_step.long())
    return seen.float()


class EdgeBankMetrics:
    """EdgeBank evaluated over a split on the negatives the model gets, across ranks.

    Per evaluation step (the same step index on every rank), each rank passes its share
    of the step: ``update(step, src [B], dst [B], neg_dst [B, k], neg_src=None)``
    (``neg_src`` ``[B, k]`` for negatives with their own sources, e.g. historical or
    inductive; default: the positive's source; ``-1`` entries of ``neg_dst`` are padding,
    e.g. TGB's short negative lists). ``compute(group)`` (a collective) gathers every
    rank's positives, scores every query against the memory as it stood at its step
    (``bank`` plus the positives of earlier steps), and returns::

        {"ap", "auc": whole-split AP / AUC of the positives against each one's first
                      negative (as LinkPredMetrics does for the model; all real negatives
                      with ap_auc_all_negatives=True),
         "mrr", "hits@<k>": TGB's one-vs-many ranks over all real negatives,
         "num": positives}

    Afterwards ``bank`` holds all of the split's positives too (so the test split can
    follow the validation split, as in TGB's example).
    """

    def __init__(self, bank: EdgeBank, k_value: int = 10, ap_auc_all_negatives: bool = False):
        self.bank = bank
        self.k_value = int(k_value)
        self.all_neg = bool(ap_auc_all_negatives)
        self._pos: List[Tensor] = []
        self._step: List[Tensor] = []
        self._neg: List[Tensor] = []
        self._mask: List[Tensor] = []
        self._k: Optional[int] = None

    def update(self, step: Union[int, Tensor], src: Tensor, dst: Tensor, neg_dst: Tensor,
               neg_src: Optional[Tensor] = None) -> None:
        """Record one step's share (``step`` an int, or ``[B]`` steps per event)."""
        src = torch.as_tensor(src, dtype=torch.long).reshape(-1).cpu()
        dst = torch.as_tensor(dst, dtype=torch.long).reshape(-1).cpu()
        B = src.numel()
        if B == 0:
            return
        neg_dst = torch.as_tensor(neg_dst, dtype=torch.long).cpu().reshape(B, -1)
        k = neg_dst.size(1)
        if self._k is None:
            self._k = k
        elif k != self._k:
            raise ValueError(f"negatives per positive changed from {self._k} to {k}; pad "
                             "short rows with -1")
        if neg_src is None:
            neg_src = src.view(B, 1).expand(B, k)
        neg_src = torch.as_tensor(neg_src, dtype=torch.long).cpu().reshape(B, k)
        steps = torch.as_tensor(step, dtype=torch.long).reshape(-1).expand(B).clone()
        mask = (neg_dst >= 0) & (neg_src >= 0)
        keys = torch.zeros(B, k, dtype=torch.long)
        keys[mask] = pair_keys(neg_src[mask], neg_dst[mask])
        self._pos.append(pair_keys(src, dst))
        self._step.append(steps)
        self._neg.append(keys)
        self._mask.append(mask)

    def compute(self, group=None) -> Dict[str, float]:
        k = self._k or 0
        pos = torch.cat(self._pos) if self._pos else torch.zeros(0, dtype=torch.long)
        step = torch.cat(self._step) if self._step else torch.zeros(0, dtype=torch.long)
        neg = torch.cat(self._neg) if self._neg else torch.zeros(0, k, dtype=torch.long)
        mask = torch.cat(self._mask) if self._mask else torch.zeros(0, k, dtype=torch.bool)
        _, ws = world(group)
        if self.bank.shards != ws:
            raise ValueError(f"EdgeBankMetrics.compute on {ws} ranks needs a bank synced over "
                             f"them (bank.sync(group)); this one is cut over {self.bank.shards}")
        P = pos.numel()
        # every positive and every query goes to its pair's owner, which scores it against
        # its share of the memory plus the split's positives of that pair
        mine = Plan(hash_owner(pos, ws), group).forward(torch.stack([pos, step], 1))
        q = torch.cat([pos, neg.reshape(-1)])
        q_step = torch.cat([step, step.view(-1, 1).expand(P, k).reshape(-1)])
        ask = Plan(hash_owner(q, ws), group)
        asked = ask.forward(torch.stack([q, q_step], 1))
        mine, asked = mine.t().contiguous(), asked.t().contiguous()     # [2, n]: keys, steps
        scores = ask.backward(edgebank_split_scores(self.bank, mine[0], mine[1], asked[0], asked[1]))
        pos_s, neg_s = scores[:P], scores[P:].view(P, k)
        lp, tm = LinkPredMetrics(), TGBMetrics(self.k_value)
        if P:
            if self.all_neg:
                lp.update(pos_s, neg_s[mask])
            else:
                has = mask[:, 0]
                lp.update(pos_s, neg_s[has, 0])
            tm.update(pos_s, neg_s, mask)
        out = lp.compute(group)
        out.pop("mrr", None)
        r = tm.compute(group)
        out.update({"mrr": r["mrr"], f"hits@{self.k_value}": r[f"hits@{self.k_value}"],
                    "num": r["num"]})
        self.bank._add_keys(mine[0])
        self.reset()
        return out

    def reset(self) -> None:
        """Forget the recorded steps (the bank keeps what it memorised)."""
        self.__init__(self.bank, self.k_value, self.all_neg)


def evaluate_edgebank(bank: EdgeBank, src: Tensor, dst: Tensor, neg_dst: Tensor,
                      neg_src: Optional[Tensor] = None, batch_size: int = 200,
                      k_value: int = 10, ap_auc_all_negatives: bool = False) -> Dict[str, float]:
    """EdgeBank over a whole split in one process, TGB's protocol (see the module doc).

    Args:
        bank: memory before the split (usually the training events); it ends up holding
            the split's positives too.
        src, dst: ``[P]`` the split's events in time order.
        neg_dst: ``[P, k]`` (or ``[P]``) negative destinations of each event, ``-1``
            padding allowed (e.g. :class:`tgl_dist.data.loaders.tgb.TGBNegatives.dst`).
        neg_src: ``[P, k]`` their sources (default: the event's source).
        batch_size: events per batch (TGB's example: 200; use the model's evaluation batch).
        k_value: the k of hits@k.

    Returns:
        ``{"ap", "auc", "mrr", "hits@<k>", "num"}`` as :class:`EdgeBankMetrics`.
    """
    m = EdgeBankMetrics(bank, k_value, ap_auc_all_negatives)
    P = torch.as_tensor(src).numel()
    m.update(torch.arange(P) // int(batch_size), src, dst, neg_dst, neg_src)
    return m.compute(None)


__all__ = ["EdgeBank", "EdgeBankMetrics", "evaluate_edgebank", "edgebank_split_scores",
           "pair_keys"]
