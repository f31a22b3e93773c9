"""Partition-parallel snapshot models: sync GCN, EvolveGCN-O/-H, T-GCN, GConvGRU (GCRN).

Every model is called with a window of snapshot ids and computes the owned nodes of
this rank: ``model(ts) -> [n, F_out]`` (embeddings at the window's last snapshot) and
``model.forward_sequence(ts) -> [n, Tw, F_out]`` (every snapshot of the window). Node
features come from ``graph.node()['x']`` unless ``x [Tw, n, F_in]`` is passed. Models
call no collective themselves: halo rows arrive through ``graph.route`` inside the
layers, so every rank must call the model with the same window.

Where the recurrence does not pass through the graph (GCN, EvolveGCN-O's weights)
the whole window is one batched sparse product per layer; T-GCN and GConvGRU run the
input part batched and the recurrent part step by step (one route per step and gate group).

Node embeddings: a model may carry a learnable per-node input
(:meth:`SnapshotModel.set_node_embedding`, a :class:`tgl_dist.nn.DistEmbedding` sharded
like the graph: each rank stores its owned nodes' rows). The input of every snapshot is
then ``[x_t || e]`` ``[Tw, n, F + D]`` (``[Tw, n, D]`` on a featureless graph). Each rank
looks up its owned rows (a collective lookup, purely local with this sharding); halo
rows reach the other ranks through the route inside the layers, whose backward brings
their gradient back to the owner. A learnable input is not constant, so the
first-layer cache of :math:`\\hat A x` (``DistGraph.propagated_features``) is not used.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgl_dist.dtdg.layers import MatGRUCell, SnapshotGCNConv, TopKSummarize, propagate

ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh, "leaky_relu": F.leaky_relu, "elu": F.elu}


class SnapshotModel(nn.Module):
    """Base: holds the graph (not as a submodule: ``state_dict`` stays graph-free)."""

    def __init__(self, graph) -> None:
        super().__init__()
        object.__setattr__(self, "graph", graph)
        self.node_embedding: Optional[nn.Module] = None

    def set_node_embedding(self, table: nn.Module) -> None:
        """Append a learnable node input: ``table(owned global ids) -> [n, D]``.

        ``table`` is a :class:`tgl_dist.nn.DistEmbedding` over the graph's nodes, sharded
        by the graph's partition (``PartitionBook(graph.owner)``); the model's ``in_dim``
        must already count its D columns. Every rank looks up its owned rows at every
        model call (a collective, like the route).
        """
        self.node_embedding = table

    def embedded_inputs(self, ts: Sequence[int], x: Optional[Tensor]) -> Optional[Tensor]:
        """``[x_t || e]`` for the window ``[Tw, n, F + D]`` when the model has a node
        embedding (``x``: given features or the graph's, if any); else ``x`` unchanged."""
        if self.node_embedding is None:
            return x
        e = self.node_embedding(self.graph.owned_ids)                        # [n, D]
        e = e.unsqueeze(0).expand(len(ts), -1, -1)                           # [Tw, n, D]
        if x is None and self.graph.node().get("x") is not None:
            x = self.graph.features(ts)
        return e if x is None else torch.cat([x.to(e.dtype), e], -1)

    @property
    def route(self):
        return self.graph.route

    @property
    def group(self):
        return self.graph.group

    def inputs(self, ts: Sequence[int], x: Optional[Tensor]) -> Tensor:
        """Node features of the window ``[Tw, n, F_in]``, in the parameters' dtype."""
        x = self.graph.features(ts) if x is None else x
        p = next(self.parameters(), None)
        return x if p is None or x.dtype == p.dtype else x.to(p.dtype)

    def propagated(self, ts: Sequence[int], kind: str = "gcn") -> Tensor:
        """Cached :math:`\\hat A_t x_t` of the graph's features, in the parameters' dtype."""
        p = next(self.parameters())
        return self.graph.propagated_features(ts, kind, self.use_weight, p.dtype)

    def window(self, ts: Sequence[int], x: Optional[Tensor] = None) -> Tensor:
        """``[Tw, n, F_out]`` (time-major); implemented by subclasses."""
        raise NotImplementedError

    def forward_sequence(self, ts: Sequence[int], x: Optional[Tensor] = None) -> Tensor:
        """Embeddings of the owned nodes at every snapshot of ``ts``: ``[n, Tw, F_out]``."""
        ts = list(ts)
        return self.window(ts, self.embedded_inputs(ts, x)).transpose(0, 1)

    def forward(self, ts: Sequence[int], x: Optional[Tensor] = None) -> Tensor:
        """Embeddings of the owned nodes at the last snapshot of ``ts``: ``[n, F_out]``."""
        ts = list(ts)
        return self.window(ts, self.embedded_inputs(ts, x))[-1]

    def get_snapshot(self, t: int):
        return self.graph.get_snapshot(t)


def _dims(in_dim: int, hidden_dims: Sequence[int]) -> List[int]:
    dims = [int(in_dim)] + [int(h) for h in hidden_dims]
    if len(dims) < 2 or min(dims) < 1:
        raise ValueError(f"layer sizes must be positive, got {dims}")
    return dims


class GCN(SnapshotModel):
    """A stack of :class:`SnapshotGCNConv` with weights shared by all snapshots (the sync GCN).

    Args:
        graph: this rank's ``DistGraph``.
        in_dim: F_in. hidden_dims: output size of each layer.
        activation: between layers (default ``'relu'``); ``last_activation`` also after
            the last layer (default False).
    """

    def __init__(self, graph, in_dim: int, hidden_dims: Sequence[int] = (32, 32),
                 activation: str = "relu", last_activation: bool = False,
                 use_weight: bool = True) -> None:
        super().__init__(graph)
        dims = _dims(in_dim, hidden_dims)
        self.convs = nn.ModuleList(SnapshotGCNConv(a, b, use_weight=use_weight)
                                   for a, b in zip(dims[:-1], dims[1:]))
        self.act = ACTIVATIONS[activation]
        self.last_activation = last_activation
        self.use_weight = use_weight

    def window(self, ts, x=None):
        h = self.propagated(ts) if x is None else self.inputs(ts, x)
        for i, conv in enumerate(self.convs):
            h = conv(h, self.graph, ts, propagated=(i == 0 and x is None))
            if i < len(self.convs) - 1 or self.last_activation:
                h = self.act(h)
        return h


class EvolveGCNO(SnapshotModel):
    """EvolveGCN-O (Pareja et al., AAAI 2020): the GCN weights evolve by a matrix GRU.

    .. math:: W_t^l = \\mathrm{GRU}(W_{t-1}^l, W_{t-1}^l),\\qquad
              H_t^{l+1} = \\sigma(\\hat A_t H_t^l W_t^l)

    Each layer has one learnable initial weight ``W_0``; the window starts from it and
    evolves once per snapshot (before use, as in the IBM and PyG-Temporal code). The
    weight sequence does not depend on the graph, so each layer computes all the
    window's weights first and then one batched GCN over the whole window.

    Args:
        graph, in_dim, hidden_dims, activation: as :class:`GCN`.
        last_activation: ``sigma`` after the last layer too (default True: the formula
            above and the IBM code apply it to every layer).
    """

    def __init__(self, graph, in_dim: int, hidden_dims: Sequence[int] = (32, 32),
                 activation: str = "relu", last_activation: bool = True,
                 use_weight: bool = True) -> None:
        super().__init__(graph)
        dims = _dims(in_dim, hidden_dims)
        self.w0 = nn.ParameterList(nn.Parameter(nn.init.xavier_uniform_(torch.empty(a, b)))
                                   for a, b in zip(dims[:-1], dims[1:]))
        self.cells = nn.ModuleList(MatGRUCell(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.convs = nn.ModuleList(SnapshotGCNConv(a, b, bias=False, use_weight=use_weight,
                                                   own_weight=False)
                                   for a, b in zip(dims[:-1], dims[1:]))
        self.act = ACTIVATIONS[activation]
        self.last_activation = last_activation
        self.use_weight = use_weight

    def evolve(self, layer: int, steps: int, h: Optional[Tensor] = None) -> Tensor:
        """The evolved weights of ``layer`` for ``steps`` snapshots: ``[steps, d_l, d_{l+1}]``."""
        return self.cells[layer].evolve_self(self.w0[layer], steps)

    def window(self, ts, x=None):
        h = self.inputs(ts, x)
        first = self.propagated(ts) if x is None else None      # Â x, cached: layer 0 is one bmm
        for i, conv in enumerate(self.convs):
            w = self.evolve(i, len(ts), h)
            if i == 0 and first is not None:
                h = conv(first, self.graph, ts, weight=w, propagated=True)
            else:
                h = conv(h, self.graph, ts, weight=w)
            if i < len(self.convs) - 1 or self.last_activation:
                h = self.act(h)
        return h


class EvolveGCNH(EvolveGCNO):
    """EvolveGCN-H: the GRU's input is a top-k summary of the layer's node embeddings.

    .. math:: W_t^l = \\mathrm{GRU}(X_t, W_{t-1}^l),\\quad
              X_t = \\mathrm{summarize}(H_t^l, k = d_{l+1})

    The summary picks the top-k nodes of the whole graph (see :class:`TopKSummarize`);
    one differentiable all-to-all per layer brings every rank's candidates for the
    whole window.
    """

    def __init__(self, graph, in_dim: int, hidden_dims: Sequence[int] = (32, 32),
                 activation: str = "relu", last_activation: bool = True,
                 use_weight: bool = True) -> None:
        super().__init__(graph, in_dim, hidden_dims, activation, last_activation, use_weight)
        dims = _dims(in_dim, hidden_dims)
        self.summaries = nn.ModuleList(TopKSummarize(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def evolve(self, layer: int, steps: int, h: Optional[Tensor] = None) -> Tensor:
        xs = self.summaries[layer](h, self.graph, self._ts)
        w, cell, out = self.w0[layer], self.cells[layer], []
        for t in range(steps):
            w = cell(xs[t], w)
            out.append(w)
        return torch.stack(out)

    def window(self, ts, x=None):
        self._ts = list(ts)
        return super().window(ts, x)


class TGCN(SnapshotModel):
    """T-GCN (Zhao et al., 2019; reference-code form): a GRU whose gates are graph convolutions.

    .. math::
        [r, u] = \\sigma(\\hat A [x_t \\| H_{t-1}] W_g + b_g),\\;
        c = \\tanh(\\hat A [x_t \\| r \\odot H_{t-1}] W_c + b_c),\\;
        H_t = u \\odot H_{t-1} + (1 - u) \\odot c

    The gate bias starts at 1.0. The ``x_t`` halves of both convolutions are computed for
    the whole window at once; the hidden halves step by step (two routes per step).

    Args:
        graph, in_dim: as :class:`GCN`; hidden_dim: d.
    """

    def __init__(self, graph, in_dim: int, hidden_dim: int = 32, use_weight: bool = True) -> None:
        super().__init__(graph)
        d = int(hidden_dim)
        self.d, self.use_weight = d, use_weight
        self.wx = nn.Parameter(nn.init.xavier_uniform_(torch.empty(in_dim, 3 * d)))
        self.wh_g = nn.Parameter(nn.init.xavier_uniform_(torch.empty(d, 2 * d)))
        self.wh_c = nn.Parameter(nn.init.xavier_uniform_(torch.empty(d, d)))
        self.b_g = nn.Parameter(torch.ones(2 * d))
        self.b_c = nn.Parameter(torch.zeros(d))

    def window(self, ts, x=None):
        x = None if x is None else self.inputs(ts, x)
        ax = (self.propagated(ts) @ self.wx if x is None                         # [Tw, n, 3d]
              else propagate(self.graph, x @ self.wx, ts, "gcn", self.use_weight))
        x = self.inputs(ts, x)
        d = self.d
        h = x.new_zeros(x.size(1), d)
        out = []
        for i, t in enumerate(ts):
            gh = propagate(self.graph, (h @ self.wh_g).unsqueeze(0), [t], "gcn", self.use_weight)[0]
            r, u = torch.sigmoid(ax[i, :, :2 * d] + gh + self.b_g).chunk(2, -1)
            ch = propagate(self.graph, ((r * h) @ self.wh_c).unsqueeze(0), [t], "gcn", self.use_weight)[0]
            c = torch.tanh(ax[i, :, 2 * d:] + ch + self.b_c)
            h = u * h + (1 - u) * c
            out.append(h)
        return torch.stack(out)


class GConvGRU(SnapshotModel):
    """GConvGRU (PyG-Temporal, after GCRN, Seo et al. 2018): a GRU with Chebyshev graph convs.

    .. math::
        Z = \\sigma(C_{xz} X + C_{hz} H),\\; R = \\sigma(C_{xr} X + C_{hr} H),\\;
        \\tilde H = \\tanh(C_{xh} X + C_{hh}(R \\odot H)),\\; H' = Z \\odot H + (1 - Z) \\odot \\tilde H

    Each :math:`C` is a Chebyshev convolution of order ``K`` in {1, 2}:
    :math:`C(X) = X \\Theta_0 + \\hat L X \\Theta_1` with :math:`\\hat L = -D^{-1/2} A D^{-1/2}`
    (``sym``, ``lambda_max = 2``; ``K = 1`` drops the graph term). ``D`` is the in-degree
    of the full graph (PyG's ``ChebConv`` uses the source degree; equal on symmetric graphs).
    The two biases of each gate are merged into one (same function).

    Args:
        graph, in_dim: as :class:`GCN`; hidden_dim: d; K: Chebyshev order (default 2).
    """

    def __init__(self, graph, in_dim: int, hidden_dim: int = 32, K: int = 2,
                 use_weight: bool = True) -> None:
        super().__init__(graph)
        if K not in (1, 2):
            raise ValueError(f"GConvGRU supports Chebyshev order K in (1, 2), got {K}")
        d = int(hidden_dim)
        self.d, self.K, self.use_weight = d, K, use_weight
        self.theta_x = nn.Parameter(nn.init.xavier_uniform_(torch.empty(K, in_dim, 3 * d)))
        self.theta_h = nn.Parameter(nn.init.xavier_uniform_(torch.empty(K, d, 2 * d)))
        self.theta_hh = nn.Parameter(nn.init.xavier_uniform_(torch.empty(K, d, d)))
        self.bias = nn.Parameter(torch.zeros(3 * d))

    def _cheb(self, h: Tensor, theta: Tensor, ts) -> Tensor:
        out = h @ theta[0]
        if self.K == 2:
            out = out + propagate(self.graph, h @ theta[1], ts, "cheb", self.use_weight)
        return out

    def window(self, ts, x=None):
        if x is None:                                    # cached L̂ x for the input part
            x = self.inputs(ts, None)
            cx = x @ self.theta_x[0]
            if self.K == 2:
                cx = cx + self.propagated(ts, "cheb") @ self.theta_x[1]
            cx = cx + self.bias                                                 # [Tw, n, 3d]
        else:
            x = self.inputs(ts, x)
            cx = self._cheb(x, self.theta_x, ts) + self.bias
        d = self.d
        h = x.new_zeros(x.size(1), d)
        out = []
        for i, t in enumerate(ts):
            ch = self._cheb(h.unsqueeze(0), self.theta_h, [t])[0]
            z, r = torch.sigmoid(cx[i, :, :2 * d] + ch).chunk(2, -1)
            h_cap = torch.tanh(cx[i, :, 2 * d:] + self._cheb((r * h).unsqueeze(0), self.theta_hh, [t])[0])
            h = z * h + (1 - z) * h_cap
            out.append(h)
        return torch.stack(out)
