"""``TemporalGraph``: a continuous-time dynamic graph (a time-ordered stream of events).

Shapes:
    E: number of events, N: number of nodes, F_e / F_n: edge / node feature sizes.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor

OptTensor = Optional[Tensor]


def sorted_quantiles(t: Tensor, qs: Sequence[float]) -> List[float]:
    """Quantiles of the sorted times ``t [E]`` (E >= 1), interpolated linearly between
    order statistics: the values ``torch.quantile`` gives, bit for bit, without its limit
    of 2^24 elements (streams such as sx-stackoverflow are longer)."""
    q = torch.tensor(qs, dtype=torch.float64)
    rank = q * (t.numel() - 1)
    below = rank.floor().long()
    above = rank.ceil().long()
    return torch.lerp(t[below], t[above], rank - below.to(torch.float64)).tolist()


@dataclass
class TemporalGraph:
    """A stream of timestamped interaction events ``(src, dst, t)``, sorted by time.

    Args:
        src: source node of each event, global ids in ``[0, num_nodes)``, shape ``[E]``, int64.
        dst: destination node of each event, shape ``[E]``, int64.
        t: event time, shape ``[E]``, float64 (kept in double so unix seconds stay exact).
        num_nodes: N. Defaults to ``max(src, dst) + 1``.
        eid: event id, shape ``[E]``, int64 (default ``arange(E)``); indexes ``edge_attr``.
        edge_attr: optional event features, shape ``[E, F_e]``, float32.
        node_feat: optional node features, shape ``[N, F_n]``, float32.
        labels: optional per-event labels (e.g. JODIE state labels), shape ``[E]``.
        node_map: original id of each node, shape ``[N]`` (the remapping the loader applied).
        name: dataset name, used for partition folders.

    Split masks (computed by :meth:`split`, chronological as in TGN / DyGLib / TGB):
        ``train_mask``, ``val_mask``, ``test_mask`` (``t <= Q(0.70)``, ``<= Q(0.85)``, rest);
        ``inductive_train_mask`` (training events not touching a held-out new node),
        ``new_node_val_mask`` and ``new_node_test_mask`` (events with an endpoint unseen
        in ``inductive_train_mask``), as DyGLib defines them.
    """

    src: Tensor
    dst: Tensor
    t: Tensor
    num_nodes: int = -1
    eid: OptTensor = None
    edge_attr: OptTensor = None
    node_feat: OptTensor = None
    labels: OptTensor = None
    node_map: OptTensor = None
    name: str = "graph"
    masks: Dict[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.src = torch.as_tensor(self.src, dtype=torch.long)
        self.dst = torch.as_tensor(self.dst, dtype=torch.long)
        self.t = torch.as_tensor(self.t, dtype=torch.float64)
        if self.labels is not None:
            self.labels = torch.as_tensor(self.labels)
        E = _check_events(self.src, self.dst, self.t, labels=self.labels)
        if self.eid is None:
            self.eid = torch.arange(E, dtype=torch.long)
        if self.num_nodes < 0:
            self.num_nodes = int(max(int(self.src.max()), int(self.dst.max())) + 1) if E else 0
        if self.edge_attr is not None:
            self.edge_attr = torch.as_tensor(self.edge_attr, dtype=torch.float32)
            if self.edge_attr.dim() == 1:
                self.edge_attr = self.edge_attr.view(-1, 1)
            if self.edge_attr.size(0) != E:
                raise ValueError(f"edge_attr has {self.edge_attr.size(0)} rows, expected {E} (one per event)")
        if self.node_feat is not None:
            self.node_feat = torch.as_tensor(self.node_feat, dtype=torch.float32)
            if self.node_feat.size(0) != self.num_nodes:
                raise ValueError(f"node_feat has {self.node_feat.size(0)} rows, expected {self.num_nodes}")
        if E and (int(self.src.min()) < 0 or int(self.dst.min()) < 0
                  or int(max(int(self.src.max()), int(self.dst.max()))) >= self.num_nodes):
            raise ValueError(f"node ids must lie in [0, {self.num_nodes})")
        if E > 1 and bool((self.t[1:] < self.t[:-1]).any()):
            raise ValueError("events must be sorted by time; use TemporalGraph.sorted()")
        if not self.masks:
            self.split()

    # ------------------------------------------------------------------ basics
    @property
    def num_events(self) -> int:
        """E, the number of events."""
        return int(self.src.numel())

    @property
    def train_mask(self) -> Tensor:
        return self.masks["train"]

    @property
    def val_mask(self) -> Tensor:
        return self.masks["val"]

    @property
    def test_mask(self) -> Tensor:
        return self.masks["test"]

    def __repr__(self) -> str:
        ef = 0 if self.edge_attr is None else self.edge_attr.size(1)
        nf = 0 if self.node_feat is None else self.node_feat.size(1)
        return (f"TemporalGraph(name={self.name!r}, num_nodes={self.num_nodes}, "
                f"num_events={self.num_events}, edge_feat_dim={ef}, node_feat_dim={nf})")

    @staticmethod
    def sorted(src, dst, t, **kwargs) -> "TemporalGraph":
        """Build a graph from unsorted events, sorting them stably by time.

        ``edge_attr`` and ``labels`` rows follow their events; ``eid`` is renumbered
        to the sorted order.
        """
        t = torch.as_tensor(t, dtype=torch.float64)
        src = torch.as_tensor(src, dtype=torch.long)
        dst = torch.as_tensor(dst, dtype=torch.long)
        for key in ("edge_attr", "labels"):
            if kwargs.get(key) is not None:
                kwargs[key] = torch.as_tensor(kwargs[key])
        _check_events(src, dst, t, edge_attr=kwargs.get("edge_attr"), labels=kwargs.get("labels"))
        order = torch.sort(t, stable=True).indices
        for key in ("edge_attr", "labels"):
            if kwargs.get(key) is not None:
                kwargs[key] = kwargs[key][order]
        return TemporalGraph(src[order], dst[order], t[order], **kwargs)

    # ------------------------------------------------------------------ splits
    def split(self, val_ratio: float = 0.15, test_ratio: float = 0.15,
              new_node_ratio: float = 0.1, seed: int = 2020) -> None:
        """Compute the chronological and inductive split masks (stored in ``self.masks``).

        Train holds events with ``t <= Q(1 - val - test)``, validation those with
        ``t <= Q(1 - test)``, test the rest (Q = quantile of event times). Inductive
        masks follow DyGLib: ``new_node_ratio * N`` nodes are drawn (``random.seed(seed)``)
        among nodes active after the validation time; their training events are left
        out of ``inductive_train_mask``; ``new_node_{val,test}_mask`` keep the
        evaluation events with an endpoint not seen in the inductive training set.
        """
        E = self.num_events
        if E == 0:
            z = torch.zeros(0, dtype=torch.bool)
            self.masks = {k: z for k in ("train", "val", "test", "inductive_train",
                                         "new_node_val", "new_node_test")}
            return
        val_time, test_time = sorted_quantiles(self.t, [1 - val_ratio - test_ratio, 1 - test_ratio])
        train = self.t <= val_time
        val = (self.t > val_time) & (self.t <= test_time)
        test = self.t > test_time
        after_val = torch.cat([self.src[self.t > val_time], self.dst[self.t > val_time]]).unique()
        rng = random.Random(seed)
        k = min(int(new_node_ratio * self.num_nodes), after_val.numel())
        picked = sorted(rng.sample(after_val.tolist(), k)) if k > 0 else []
        new_nodes = torch.zeros(self.num_nodes, dtype=torch.bool)
        new_nodes[torch.tensor(picked, dtype=torch.long)] = True
        ind_train = train & ~new_nodes[self.src] & ~new_nodes[self.dst]
        seen = torch.zeros(self.num_nodes, dtype=torch.bool)
        seen[self.src[ind_train]] = True
        seen[self.dst[ind_train]] = True
        unseen_endpoint = ~seen[self.src] | ~seen[self.dst]
        self.masks = {
            "train": train, "val": val, "test": test, "inductive_train": ind_train,
            "new_node_val": val & unseen_endpoint, "new_node_test": test & unseen_endpoint,
        }

    # ------------------------------------------------------------- identity
    def fingerprint(self) -> str:
        """A short hash of everything a partition stores: the event stream (ids, times),
        the node count, and the values of the features, labels and split masks.
        Partitions record it, so one written from other data (an edited feature file, a
        changed label) is told apart and written again."""
        h = hashlib.sha256()
        h.update(f"{self.num_nodes}".encode())
        named = [("src", self.src), ("dst", self.dst), ("t", self.t), ("edge_attr", self.edge_attr),
                 ("node_feat", self.node_feat), ("labels", self.labels)]
        named += [(f"mask.{k}", v) for k, v in sorted((self.masks or {}).items())]
        for name, x in named:
            hash_tensor(h, name, x)
        return h.hexdigest()[:16]

    def subgraph_events(self, mask: Tensor) -> "TemporalGraph":
        """The events selected by ``mask`` (shape ``[E]``, bool).

        Node ids, node features and the ``edge_attr`` table stay whole: selected
        events keep their ``eid``, which still indexes ``edge_attr``.
        """
        g = TemporalGraph.__new__(TemporalGraph)
        for f in fields(self):
            setattr(g, f.name, getattr(self, f.name))
        g.src, g.dst, g.t, g.eid = self.src[mask], self.dst[mask], self.t[mask], self.eid[mask]
        g.labels = None if self.labels is None else self.labels[mask]
        g.masks = {k: v[mask] for k, v in self.masks.items()}
        return g


def hash_tensor(h, name: str, x: OptTensor) -> None:
    """Feed ``name``, the shape, dtype and bytes of ``x`` (or its absence) to the hashlib
    object ``h`` (the data fingerprints of CTDG and DTDG partitions)."""
    if x is None:
        h.update(f"{name}:-".encode())
        return
    v = x.detach().cpu().contiguous().reshape(-1)
    h.update(f"{name}:{tuple(x.shape)}:{v.dtype}".encode())
    h.update(memoryview(v.view(torch.uint8).numpy()))


def _check_events(src: Tensor, dst: Tensor, t: Tensor, edge_attr: OptTensor = None,
                  labels: OptTensor = None) -> int:
    """E, after checking that ``src``, ``dst`` and ``t`` are 1-d of one length, that every
    time is finite and that ``edge_attr`` / ``labels`` (when given) have one row per event;
    else ``ValueError``."""
    E = src.numel()
    if src.dim() != 1 or dst.dim() != 1 or t.dim() != 1 or dst.numel() != E or t.numel() != E:
        raise ValueError(f"src, dst and t must be 1-d and have the same length, got shapes "
                         f"{list(src.shape)}, {list(dst.shape)}, {list(t.shape)}")
    for key, x in (("edge_attr", edge_attr), ("labels", labels)):
        if x is not None and (x.dim() == 0 or x.size(0) != E):
            raise ValueError(f"{key} has shape {list(x.shape)}, expected {E} rows (one per event)")
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        i = int((~finite).nonzero()[0])
        raise ValueError(f"event times must be finite numbers: event {i} has t = {float(t[i])}")
    return E
