"""``SnapshotAdj``: the normalised adjacency of every snapshot as one block-diagonal sparse operator.

Rows are ``t * n + v`` (snapshot t, owned destination v), columns ``t * (n + h) + u``
(snapshot t, local source u: owned first, then halo). Any contiguous window of
snapshots is a cheap slice of the CSR arrays, so a layer propagates a whole window
with one sparse-dense product ``[Tw*n, Tw*(n+h)] @ [Tw*(n+h), F]`` instead of one
message-passing call per snapshot. The transpose is kept too: the backward pass is
another CSR product (``torch.sparse.mm`` with autograd on the dense side is several
times slower on CPU).

Normalisations (computed from the degrees of the **full** graph, recorded at
partition time for owned and halo nodes):

* ``'gcn'``: PyG ``GCNConv``: :math:`\\hat A = \\tilde D^{-1/2}(A + I)\\tilde D^{-1/2}`,
  one self loop per node per snapshot (an existing loop's weight is kept, as in
  ``add_remaining_self_loops``), :math:`\\tilde D` the weighted in-degree with the loop.
* ``'cheb'``: the order-1 Chebyshev term of PyG ``ChebConv`` (``sym``, ``lambda_max=2``):
  :math:`\\hat L = -D^{-1/2} A D^{-1/2}` without self loops. ``D`` is the in-degree;
  PyG uses the source degree, which is the same on symmetric graphs.
"""
from __future__ import annotations

import warnings
from typing import Dict, Sequence, Tuple

import torch
from torch import Tensor

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, A: Tensor, At: Tensor, x: Tensor) -> Tensor:
        ctx.At = At
        return torch.sparse.mm(A, x)

    @staticmethod
    def backward(ctx, g: Tensor):
        return None, None, torch.sparse.mm(ctx.At, g.contiguous())


def _csr(rows: Tensor, cols: Tensor, vals: Tensor, shape) -> Tuple[Tensor, Tensor, Tensor]:
    coo = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, shape,
                                  check_invariants=False).coalesce()
    r, c = coo.indices()
    crow = torch.zeros(shape[0] + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(torch.bincount(r, minlength=shape[0]), 0)
    return crow, c.contiguous(), coo.values().contiguous()


class SnapshotAdj:
    """Normalised adjacency of all snapshots of one rank's part.

    Args:
        edge_index: ``[2, e]`` local ids (source in ``[0, n+h)``, destination in ``[0, n)``).
        time: ``[e]`` snapshot of each edge.
        weight: ``[e]`` edge weights or ``None`` (all 1).
        in_w: ``[n+h, T]`` weighted in-degree (no loops) of the full graph.
        loop_w: ``[n+h, T]`` self-loop weight (``'gcn'`` only).
        num_owned: n.
        kind: ``'gcn'`` or ``'cheb'``.
    """

    def __init__(self, edge_index: Tensor, time: Tensor, weight, in_w: Tensor, loop_w: Tensor,
                 num_owned: int, kind: str = "gcn") -> None:
        if kind not in ("gcn", "cheb"):
            raise ValueError(f"unknown normalisation {kind!r}; known: ['cheb', 'gcn']")
        n, n_all, T = int(num_owned), int(in_w.size(0)), int(in_w.size(1))
        self.n, self.n_all, self.T, self.kind = n, n_all, T, kind
        src, dst = edge_index
        w = torch.ones(src.numel(), dtype=torch.float64) if weight is None else weight.double()
        keep = src != dst
        src, dst, time, w = src[keep], dst[keep], time[keep], w[keep]
        deg = in_w + loop_w if kind == "gcn" else in_w.clone()
        dinv = deg.pow(-0.5)
        dinv[torch.isinf(dinv)] = 0.0
        vals = w * dinv[src, time] * dinv[dst, time]
        rows, cols = time * n + dst, time * n_all + src
        if kind == "cheb":
            vals = -vals
        else:
            v = torch.arange(n).repeat(T)
            t = torch.arange(T).repeat_interleave(n)
            rows = torch.cat([rows, t * n + v])
            cols = torch.cat([cols, t * n_all + v])
            vals = torch.cat([vals, loop_w[v, t] * dinv[v, t] ** 2])
        self._A = _csr(rows, cols, vals, (T * n, T * n_all))
        self._At = _csr(cols, rows, vals, (T * n_all, T * n))
        self._cast: Dict[Tuple, Tuple] = {}

    def to(self, device) -> "SnapshotAdj":
        self._A = tuple(a.to(device) for a in self._A)
        self._At = tuple(a.to(device) for a in self._At)
        self._cast = {}
        return self

    def _arrays(self, dtype, device):
        key = (dtype, str(device))
        if key not in self._cast:
            self._cast[key] = (tuple(a.to(device) for a in self._A[:2]) + (self._A[2].to(device, dtype),),
                               tuple(a.to(device) for a in self._At[:2]) + (self._At[2].to(device, dtype),))
        return self._cast[key]

    @staticmethod
    def _slice(arr, r0: int, r1: int, c0: int, ncols: int) -> Tensor:
        crow, col, val = arr
        a, b = int(crow[r0]), int(crow[r1])
        return torch.sparse_csr_tensor(crow[r0:r1 + 1] - a, col[a:b] - c0, val[a:b],
                                       (r1 - r0, ncols), check_invariants=False)

    def window(self, ts: Sequence[int], dtype=torch.float32, device="cpu") -> Tuple[Tensor, Tensor]:
        """``(A, A^T)`` of the snapshots ``ts``: ``[Tw*n, Tw*(n+h)]`` and its transpose."""
        A, At = self._arrays(dtype, device)
        n, na = self.n, self.n_all
        ts = list(ts)
        if not ts:
            raise ValueError("empty snapshot window")
        if min(ts) < 0 or max(ts) >= self.T:
            raise ValueError(f"snapshots {ts} outside [0, {self.T})")
        a, b = ts[0], ts[-1] + 1
        if ts == list(range(a, b)):
            return (self._slice(A, a * n, b * n, a * na, (b - a) * na),
                    self._slice(At, a * na, b * na, a * n, (b - a) * n))
        blocks, blocks_t = [], []
        for i, t in enumerate(ts):                       # a loop over snapshots, not edges
            blocks.append(self._slice(A, t * n, (t + 1) * n, t * na - i * na, len(ts) * na).to_sparse_coo())
            blocks_t.append(self._slice(At, t * na, (t + 1) * na, t * n - i * n, len(ts) * n).to_sparse_coo())
        cat = lambda bl, nr: torch.cat([b.to_sparse_coo() for b in bl]).to_sparse_csr()  # noqa: E731
        return cat(blocks, n), cat(blocks_t, na)

    def propagate(self, h_all: Tensor, ts: Sequence[int]) -> Tensor:
        """``[Tw, n+h, F] -> [Tw, n, F]``: :math:`\\hat A_t h_t` for every snapshot of the window."""
        Tw, na, F = h_all.shape
        if na != self.n_all or Tw != len(ts):
            raise ValueError(f"propagate expects [{len(ts)}, {self.n_all}, F], got {tuple(h_all.shape)}")
        A, At = self.window(ts, h_all.dtype, h_all.device)
        out = _SpMM.apply(A, At, h_all.reshape(Tw * na, F))
        return out.view(Tw, self.n, F)
