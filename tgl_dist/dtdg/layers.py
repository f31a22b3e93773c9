"""Building blocks of partition-parallel snapshot models.

Every layer works on a **window** of snapshots at once, time-major:
``[Tw, n, F]`` (Tw snapshots, n owned nodes). Halo rows come through the graph's
:class:`~tgl_dist.dtdg.route.Route`; the sparse product covers the whole window
(:class:`~tgl_dist.dtdg.adjacency.SnapshotAdj`). Each layer's result on the owned
rows equals the single-process full-graph computation.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from tgl_dist.dist import AllToAllV, all_to_all_v


def propagate(graph, h: Tensor, ts: Sequence[int], kind: str = "gcn", use_weight: bool = True) -> Tensor:
    """:math:`\\hat A_t h_t` for every snapshot of the window: ``[Tw, n, F] -> [Tw, n, F]``.

    One route call (all snapshots' halo rows in one all-to-all) and one sparse product.
    """
    h_all = graph.route(h, node_dim=1)
    return graph.adjacency(kind, use_weight).propagate(h_all, ts)


class SnapshotGCNConv(nn.Module):
    """PyG ``GCNConv`` on every snapshot of a window, over the full graph's normalisation.

    .. math::
        H'_t = \\hat A_t H_t W + b, \\qquad
        \\hat A_t = \\tilde D_t^{-1/2} (A_t + I) \\tilde D_t^{-1/2}

    Args:
        in_dim / out_dim: F_in / F_out.
        bias: add a learnable bias (default True).
        use_weight: use ``edge()['weight']`` (default True; all 1 when the graph has none).

    Shapes:
        x ``[Tw, n, F_in]`` -> ``[Tw, n, F_out]``; ``weight`` (optional, per snapshot,
        e.g. EvolveGCN's evolved weights) ``[Tw, F_in, F_out]`` replaces the layer's own.
    """

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, use_weight: bool = True,
                 own_weight: bool = True) -> None:
        super().__init__()
        self.in_dim, self.out_dim, self.use_weight = in_dim, out_dim, use_weight
        self.weight = nn.Parameter(torch.empty(in_dim, out_dim)) if own_weight else None
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None
        if self.weight is not None:
            nn.init.xavier_uniform_(self.weight)

    def forward(self, x: Tensor, graph, ts: Sequence[int], weight: Optional[Tensor] = None,
                propagated: bool = False) -> Tensor:
        """``propagated=True``: ``x`` is already :math:`\\hat A_t x_t` (constant inputs, see
        ``DistGraph.propagated_features``), so only the product with the weight remains."""
        w = self.weight if weight is None else weight
        h = torch.matmul(x, w)                    # [Tw, n, F_out] (w: [F_in, F_out] or [Tw, ...])
        out = h if propagated else propagate(graph, h, ts, "gcn", self.use_weight)
        return out if self.bias is None else out + self.bias


class MatGRUCell(nn.Module):
    """EvolveGCN's matrix GRU on a weight matrix (IBM ``mat_GRU_cell``).

    .. math::
        Z = \\sigma(U_z X + V_z W + B_z),\\; R = \\sigma(U_r X + V_r W + B_r),\\;
        \\tilde W = \\tanh(U_h X + V_h (R \\odot W) + B_h),\\;
        W' = (1 - Z) \\odot W + Z \\odot \\tilde W

    Args:
        rows / cols: d_l / d_{l+1} (the evolved weight is ``[rows, cols]``).

    Shapes: X, W ``[rows, cols]`` -> ``[rows, cols]``.
    """

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        self.rows = rows
        bound = 1.0 / math.sqrt(rows)
        u = lambda m: nn.Parameter(torch.empty(m * rows, rows).uniform_(-bound, bound))  # noqa: E731
        self.U_zr, self.U_h = u(2), u(1)          # [U_z; U_r] stacked, U_h
        self.V_zr, self.V_h = u(2), u(1)          # [V_z; V_r] stacked, V_h
        self.B_zr = nn.Parameter(torch.zeros(2 * rows, cols))
        self.B_h = nn.Parameter(torch.zeros(rows, cols))

    def _step(self, gx_zr: Tensor, gx_h: Tensor, w: Tensor) -> Tensor:
        z, reset = torch.sigmoid(gx_zr).split(self.rows)
        w_cap = torch.tanh(gx_h + self.V_h @ (reset * w))
        return w + z * (w_cap - w)

    def forward(self, x: Tensor, w: Tensor) -> Tensor:
        return self._step(self.U_zr @ x + self.V_zr @ w + self.B_zr, self.U_h @ x + self.B_h, w)

    def evolve_self(self, w: Tensor, steps: int) -> Tensor:
        """EvolveGCN-O's recurrence ``W <- GRU(W, W)`` for ``steps`` steps: ``[steps, rows, cols]``.

        With ``X = W`` the z/r gates need one product ``(U_zr + V_zr) W`` per step (the
        sum is formed once per call), so a step costs three small matrix products.
        """
        m_zr = self.U_zr + self.V_zr
        out = []
        for _ in range(steps):
            w = self._step(torch.addmm(self.B_zr, m_zr, w), torch.addmm(self.B_h, self.U_h, w), w)
            out.append(w)
        return torch.stack(out)


def _tie_order(scores: Tensor, ids: Tensor) -> Tensor:
    """Order of candidates by score (descending), ties by global id (ascending); ``[C]``."""
    by_id = torch.sort(ids, stable=True).indices
    return by_id[torch.sort(scores[by_id], descending=True, stable=True).indices]


class TopKSummarize(nn.Module):
    """EvolveGCN-H's summary of a snapshot: the top-k nodes of the **whole** graph.

    .. math:: y = H p / \\lVert p \\rVert,\\quad X = (H_{idx} \\odot \\tanh(y_{idx}))^\\top

    Nodes absent from the snapshot score :math:`-\\infty`; fewer than k present nodes are
    padded with the last one (IBM code). Each rank takes its local top-k; the
    candidates of all ranks reach every rank through a differentiable all-to-all, and
    every rank picks the same global top-k (ties broken by global id), so the result does
    not depend on the partitioning. Gradients flow back to the candidates' owners.

    Shapes: H ``[Tw, n, d]`` -> X ``[Tw, d, k]``.
    """

    def __init__(self, dim: int, k: int) -> None:
        super().__init__()
        self.k = k
        self.p = nn.Parameter(torch.empty(dim))
        nn.init.uniform_(self.p, -1.0 / math.sqrt(dim), 1.0 / math.sqrt(dim))

    def forward(self, h: Tensor, graph, ts: Sequence[int]) -> Tensor:
        Tw, n, d = h.shape
        k = self.k
        y = (h @ self.p) / self.p.norm()                                   # [Tw, n]
        active = graph.active[:, list(ts)].t()
        y = y.masked_fill(~active, float("-inf"))
        kl = min(k, n)
        # stable sort: ties go to the smaller id (owned ids are increasing), as globally
        top = torch.sort(y.detach(), dim=1, descending=True, stable=True).indices[:, :kl]
        rows = torch.gather(h, 1, top.unsqueeze(-1).expand(Tw, kl, d))
        sc = torch.gather(y, 1, top)
        payload = torch.cat([rows, sc.unsqueeze(-1)], -1)                  # [Tw, kl, d+1]
        ids = graph.owned_ids[top]                                          # [Tw, kl]
        if graph.world_size > 1:
            sizes = torch.bincount(graph.owner, minlength=graph.world_size).clamp(max=k) * Tw
            recv = [int(s) for s in sizes]
            ws = graph.world_size
            flat = payload.reshape(Tw * kl, d + 1)
            got = AllToAllV.apply(flat.repeat(ws, 1), [Tw * kl] * ws, recv, graph.group)
            got_ids = all_to_all_v(ids.reshape(-1).repeat(ws), [Tw * kl] * ws, recv, graph.group)
            kls = [s // Tw for s in recv]
            payload = torch.cat([c.view(Tw, m, d + 1) for c, m in zip(got.split(recv), kls)], 1)
            ids = torch.cat([c.view(Tw, m) for c, m in zip(got_ids.split(recv), kls)], 1)
        out = []
        for t in range(Tw):                              # a loop over the window's snapshots
            s = payload[t, :, d]
            order = _tie_order(s.detach(), ids[t])
            order = order[torch.isfinite(s.detach()[order])][:k]
            if order.numel() == 0:
                out.append(h.new_zeros(d, k))
                continue
            if order.numel() < k:
                order = torch.cat([order, order[-1:].expand(k - order.numel())])
            sel = payload[t, order]
            out.append((sel[:, :d] * torch.tanh(sel[:, d:])).t())
        return torch.stack(out)
