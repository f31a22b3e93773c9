"""Pick one update per node: the latest by timestamp, ties to the later position.

PyTorch documents ``scatter_`` with repeated indices as non-deterministic and
``index_put_`` with duplicate indices as undefined (algorithms.md §1, Duplicates),
so the surviving row is selected explicitly with two stable sorts.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def latest_per_key(keys: Tensor, ts: Tensor, order: Optional[Tensor] = None) -> Tensor:
    """Row of the latest entry of every distinct key.

    Args:
        keys: ``[n]`` int64 (node ids). ts: ``[n]`` timestamps.
        order: ``[n]`` int64 position of each row in the event stream (rows gathered from
            several ranks are not in stream order); ``None``: the row position.
    Returns:
        ``[u]`` row indices into ``keys``, one per distinct key, in increasing key
        order; for each key the row with the largest ``ts`` and, among equal ``ts``,
        the largest ``order`` (position).

    Example::

        keys = [4, 2, 4, 2], ts = [1., 5., 1., 3.]  ->  [1, 2]
        (key 2: ts 5 at row 1 beats ts 3; key 4: tie at ts 1, row 2 is later)
        with order = [9, 0, 3, 1]                   ->  [1, 0]
    """
    n = keys.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=keys.device)
    if order is None:
        by_ts = torch.sort(ts, stable=True).indices
    else:
        first = torch.sort(order, stable=True).indices
        by_ts = first[torch.sort(ts[first], stable=True).indices]
    order = by_ts[torch.sort(keys[by_ts], stable=True).indices]
    k = keys[order]
    last = torch.ones(n, dtype=torch.bool, device=keys.device)
    last[:-1] = k[1:] != k[:-1]
    return order[last]


def mean_per_key(keys: Tensor, *values: Tensor):
    """Mean of ``values`` rows per distinct key.

    On the CPU ``index_add_`` sums in row order, so the result is deterministic and rows
    given in one order sum to the same bits on any number of ranks. On CUDA
    ``index_add_`` accumulates with atomics (PyTorch lists it as nondeterministic): the
    means may differ in the last bits between runs.

    Returns ``(unique_keys [u], *means)`` with means shaped ``[u, *]``.
    """
    uniq, inv = torch.unique(keys, return_inverse=True)
    cnt = torch.zeros(uniq.numel(), dtype=torch.float64, device=keys.device)
    cnt.index_add_(0, inv, torch.ones_like(inv, dtype=torch.float64))
    out = []
    for v in values:
        s = v.new_zeros((uniq.numel(),) + tuple(v.shape[1:])).index_add_(0, inv, v)
        out.append(s / cnt.view((-1,) + (1,) * (v.dim() - 1)).to(v.dtype))
    return (uniq, *out)
