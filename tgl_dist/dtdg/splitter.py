"""``Splitter``: chronological train / dev / test lists of ``{hist_ts, label_ts}`` windows.

* ``task='link_pred'``: ``hist_ts = [t - hist_len, ..., t - 1]``, ``label_ts = t``: the
  embeddings after the history predict snapshot t's edges. Windows whose label
  snapshot has no edge (in the whole graph) are left out.
* ``task='node_regression'``: ``hist_ts = [t - hist_len + 1, ..., t]``, ``label_ts = t``:
  predict ``y[:, t]`` from the features up to snapshot t (in the PGT signal datasets
  ``x[:, t]`` holds only earlier values of the signal, so no target leaks), and
  ``t >= 1`` so the previous-value baseline exists.

Windows are ordered by label snapshot and cut into the first ``train`` fraction, the
next ``dev`` fraction and the rest (test), as EvolveGCN's splitter does.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

Window = Dict[str, object]
TASKS = ("link_pred", "node_regression")


class Splitter:
    """Train / dev / test windows over ``num_snapshots`` snapshots.

    Args:
        num_snapshots: T.
        hist_len: snapshots in each window's history (default 10).
        task: ``'link_pred'`` or ``'node_regression'``.
        train / dev: fractions of the windows (default 0.7 / 0.1, test gets the rest:
            the IBM EvolveGCN split, algorithms.md §5).
        snapshot_edges: ``[T]`` global edge count per snapshot (link prediction drops
            windows whose label snapshot is empty); ``None`` keeps every window.

    Attributes:
        train, dev, test: lists of ``{'hist_ts': [int], 'label_ts': int}``.
    """

    def __init__(self, num_snapshots: int, hist_len: int = 10, task: str = "link_pred",
                 train: float = 0.7, dev: float = 0.1,
                 snapshot_edges: Optional[torch.Tensor] = None) -> None:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; known: {list(TASKS)}")
        if hist_len < 1:
            raise ValueError(f"hist_len must be >= 1, got {hist_len}")
        if not (0 < train < 1 and 0 <= dev < 1 and train + dev < 1):
            raise ValueError(f"need 0 < train, 0 <= dev and train + dev < 1, got {train}, {dev}")
        T = int(num_snapshots)
        windows: List[Window] = []
        if task == "link_pred":
            for t in range(hist_len, T):
                if snapshot_edges is not None and int(snapshot_edges[t]) == 0:
                    continue
                windows.append({"hist_ts": list(range(t - hist_len, t)), "label_ts": t})
        else:
            for t in range(max(hist_len - 1, 1), T):
                windows.append({"hist_ts": list(range(max(t - hist_len + 1, 0), t + 1)), "label_ts": t})
        if len(windows) < 3:
            raise ValueError(f"{T} snapshots with hist_len={hist_len} give {len(windows)} windows; "
                             f"need at least 3 (one per split): lower hist_len")
        n_train = max(1, int(round(train * len(windows))))
        n_dev = max(1 if dev > 0 else 0, int(round(dev * len(windows))))
        n_train = min(n_train, len(windows) - n_dev - 1)
        self.task, self.hist_len, self.num_snapshots = task, hist_len, T
        self.train = windows[:n_train]
        self.dev = windows[n_train:n_train + n_dev]
        self.test = windows[n_train + n_dev:]

    @classmethod
    def from_graph(cls, graph, hist_len: int = 10, task: str = "link_pred", train: float = 0.7,
                   dev: float = 0.1) -> "Splitter":
        """Windows for a ``DistGraph`` (uses its global per-snapshot edge counts)."""
        return cls(graph.num_snapshots, hist_len, task, train, dev,
                   graph.snapshot_edges if task == "link_pred" else None)

    def splits(self) -> Dict[str, List[Window]]:
        return {"train": self.train, "dev": self.dev, "test": self.test}

    def __repr__(self) -> str:
        return (f"Splitter(task={self.task!r}, hist_len={self.hist_len}, train={len(self.train)}, "
                f"dev={len(self.dev)}, test={len(self.test)} windows)")
