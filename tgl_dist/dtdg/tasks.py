"""Snapshot tasks: link prediction and node regression (head, loss, metrics, trivial baseline).

Each rank computes the loss of its own share (edges into owned nodes, owned nodes'
targets), divided by the **global** count, so the sum of the ranks' gradients is the
full-graph gradient and training with P processes follows the same path as with one.

Negatives (link prediction) are deterministic per ``(seed, split, label snapshot)``
(training: also per epoch) and do not depend on the world size: positive edge
``(u, v)`` of snapshot t, at position ``pos`` among the snapshot's edges in global
order, gets ``k`` corrupted sources ``u'_j``, SplitMix64 hashes
(:mod:`tgl_dist.sampling.hashing`, the samplers' hash) of ``(seed, split, t, epoch, pos,
j)`` modulo N. A draw equal to ``u`` or to the source of a true edge into ``v`` at
snapshot t is drawn again (:meth:`LinkPrediction._negatives`). The owner of ``v``
scores them, fetching ``h[u'_j]`` through a per-step :meth:`Route.for_ids
<tgl_dist.dtdg.route.Route.for_ids>`.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgl_dist.dist import all_reduce_
from tgl_dist.dtdg.route import Route
from tgl_dist.metrics import LinkPredMetrics
from tgl_dist.sampling.hashing import hash_keys, uniform_below

SPLIT_IDS = {"train": 1, "dev": 2, "test": 3}
REDRAWS = 20   # times a negative that is a true edge (or the source itself) is drawn again


def hashed_nodes(seed: int, split: str, t: int, epoch: int, pos: Tensor, k: int, num_nodes: int) -> Tensor:
    """``[len(pos), k]`` pseudo-random node ids, a pure function of the arguments."""
    key = pos.view(-1, 1).long() * k + torch.arange(k, device=pos.device)
    return uniform_below(hash_keys(seed, SPLIT_IDS[split], t, epoch, key), num_nodes)


class EdgeHead(nn.Module):
    """Scores a directed pair from ``[h_src || h_dst || h_src * h_dst]`` with a 2-layer MLP (one logit)."""

    def __init__(self, dim: int, hidden: int = 64) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3 * dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, h_src: Tensor, h_dst: Tensor) -> Tensor:
        return self.mlp(torch.cat([h_src, h_dst, h_src * h_dst], -1)).squeeze(-1)


class LinkPrediction(nn.Module):
    """Predict the label snapshot's edges from the history's embeddings.

    Args:
        graph: the rank's ``DistGraph``. dim: embedding size.
        neg_train: negatives per positive in training (default 1).
        neg_eval: negatives per positive in evaluation (default 20): AP and AUC use the
            first one (1:1), MRR all of them.
        seed: negative-sampling seed.

    A negative replaces the source of a label edge ``u -> v`` by a uniform node that is not
    ``u`` and not the source of a true edge into ``v`` at the label snapshot
    (:meth:`_negatives`); the draws are a pure function of (seed, split, snapshot, epoch,
    edge, j), the same on any number of ranks.

    The trivial baseline (evaluation only) repeats the last snapshot: a pair scores the
    number of times it is an edge of snapshot ``label_ts - 1``.
    """

    higher_better = True
    metric = "ap"

    def __init__(self, graph, dim: int, hidden: int = 64, neg_train: int = 1, neg_eval: int = 20,
                 seed: int = 0) -> None:
        super().__init__()
        object.__setattr__(self, "graph", graph)
        self.head = EdgeHead(dim, hidden)
        self.neg_train, self.neg_eval, self.seed = neg_train, neg_eval, seed
        self.metrics = LinkPredMetrics()
        self.baseline = LinkPredMetrics()

    def reset_metrics(self) -> None:
        self.metrics.reset()
        self.baseline.reset()

    def _repeat_last(self, t: int, src: Tensor, dst: Tensor) -> Tensor:
        g = self.graph
        if t == 0:
            return torch.zeros(src.shape, dtype=torch.float32)
        s = g.snapshot_slice(t - 1)
        ei = g.edge_index[:, s]
        N = g.num_nodes
        keys = torch.sort(g.all_ids[ei[0]] * N + g.owned_ids[ei[1]]).values
        q = src * N + dst
        return (torch.searchsorted(keys, q, right=True) - torch.searchsorted(keys, q)).float()

    def _negatives(self, split: str, t: int, epoch: int, pos_id: Tensor, k: int, src_g: Tensor,
                   dst_g: Tensor) -> Tensor:
        """``[P, k]`` negative sources for the label snapshot's edges ``src_g -> dst_g``
        (global ids): uniform node ids that are neither the edge's source nor the source of
        any true edge into ``dst_g`` at snapshot ``t`` (IBM's "no self-loops, true edges").

        A draw that is one of those is drawn again from the next hash key (at most
        :data:`REDRAWS` times). The rank owning ``dst_g`` holds all of its edges at ``t``,
        so the filter is local and the draws do not depend on the number of ranks.
        """
        N = self.graph.num_nodes
        neg = hashed_nodes(self.seed, split, t, epoch, pos_id, k, N)
        true = src_g * N + dst_g              # this snapshot's edges into dst
        d = dst_g.view(-1, 1)
        for r in range(1, REDRAWS + 1):
            bad = (neg == src_g.view(-1, 1)) | torch.isin(neg * N + d, true)
            if not bool(bad.any()):
                break
            neg = torch.where(bad, hashed_nodes(self.seed + r, split, t, epoch, pos_id, k, N), neg)
        return neg

    def forward(self, model, window: Dict, split: str, epoch: int = 0,
                evaluate: bool = False) -> Tensor:
        """Loss of this rank's share of the window (a collective: every rank calls it)."""
        g = self.graph
        t = int(window["label_ts"])
        h = model(window["hist_ts"])                                   # [n, d]
        h_all = g.route(h)                                              # [n+h, d]
        s = g.snapshot_slice(t)
        src, dst = g.edge_index[0, s], g.edge_index[1, s]
        pos_id = g.edge()["pos"][s]
        k = self.neg_eval if evaluate else self.neg_train
        src_g, dst_g = g.all_ids[src], g.owned_ids[dst]
        neg = self._negatives(split, t, -1 if evaluate else epoch, pos_id, k, src_g, dst_g)
        route, idx = Route.for_ids(neg.reshape(-1), g.owner, g.local, g.rank, g.num_owned, g.group)
        h_neg = route(h)[idx].view(src.numel(), k, h.size(-1))   # explicit: src may be empty
        h_dst = h[dst]
        pos_score = self.head(h_all[src], h_dst)
        neg_score = self.head(h_neg, h_dst.unsqueeze(1).expand(-1, k, -1))
        P = float(g.snapshot_edges[t])
        loss = (F.binary_cross_entropy_with_logits(pos_score, torch.ones_like(pos_score), reduction="sum") / P
                + F.binary_cross_entropy_with_logits(neg_score, torch.zeros_like(neg_score),
                                                     reduction="sum") / (P * k))
        if evaluate:
            self.metrics.update(pos_score, neg_score[:, 0], neg_score)
            b_pos = self._repeat_last(t, src_g, dst_g)
            b_neg = self._repeat_last(t, neg.reshape(-1), dst_g.repeat_interleave(k)).view(-1, k)
            self.baseline.update(b_pos, b_neg[:, 0], b_neg)
        return loss

    def compute(self) -> Tuple[Dict[str, float], Dict[str, float]]:
        """``(metrics, baseline)`` over the whole split, gathered across ranks (collective)."""
        grp = self.graph.group
        return self.metrics.compute(grp), self.baseline.compute(grp)


class NodeRegression(nn.Module):
    """Predict ``node()['y'][:, label_ts]`` of every node (MSE over the whole split).

    The trivial baseline predicts the previous value ``y[:, label_ts - 1]``.
    """

    higher_better = False
    metric = "mse"

    def __init__(self, graph, dim: int, target: str = "y") -> None:
        super().__init__()
        object.__setattr__(self, "graph", graph)
        if target not in graph.node():
            raise KeyError(f"node()['{target}'] is missing: node regression needs targets per snapshot")
        self.target = target
        self.head = nn.Linear(dim, 1)
        self.reset_metrics()

    def reset_metrics(self) -> None:
        self._sums = torch.zeros(3, dtype=torch.float64)   # model SSE, baseline SSE, count

    def forward(self, model, window: Dict, split: str, epoch: int = 0, evaluate: bool = False) -> Tensor:
        g = self.graph
        t = int(window["label_ts"])
        y = g.node()[self.target][:, t].to(self.head.weight.dtype)
        pred = self.head(model(window["hist_ts"])).squeeze(-1)
        se = (pred - y) ** 2
        loss = se.sum() / float(g.num_nodes)
        if evaluate:
            prev = g.node()[self.target][:, t - 1].to(y.dtype)
            self._sums += torch.tensor([float(se.detach().sum()), float(((prev - y) ** 2).sum()),
                                        float(y.numel())], dtype=torch.float64)
        return loss

    def compute(self) -> Tuple[Dict[str, float], Dict[str, float]]:
        sums = all_reduce_(self._sums.clone(), group=self.graph.group)
        n = max(float(sums[2]), 1.0)
        return ({"mse": float(sums[0]) / n, "num": int(sums[2])},
                {"mse": float(sums[1]) / n, "num": int(sums[2])})


def build_task(name: str, graph, dim: int, **kwargs) -> nn.Module:
    """``'link_pred'`` -> :class:`LinkPrediction`, ``'node_regression'`` -> :class:`NodeRegression`."""
    if name == "link_pred":
        return LinkPrediction(graph, dim, **kwargs)
    if name == "node_regression":
        return NodeRegression(graph, dim, **{k: v for k, v in kwargs.items() if k == "target"})
    raise ValueError(f"unknown task {name!r}; known: ['link_pred', 'node_regression']")

