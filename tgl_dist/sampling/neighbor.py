"""``NeighborSampler``: multi-hop temporal neighbour sampling over a T-CSR, vectorised over roots.

Semantics (per hop, per destination node ``x`` queried at time ``t``):

* only events of ``x`` with time **strictly before** ``t`` are candidates (no leakage;
  same-time events are excluded);
* ``'recent'``: the ``k`` latest candidates (ties in time broken by the larger eid);
* ``'uniform'``: ``k`` distinct candidates drawn uniformly without replacement (all of
  them when there are at most ``k``). The draw is a deterministic function of
  ``(seed, epoch, x, t)`` (counter-based hashing, :mod:`tgl_dist.sampling.hashing`),
  so it is the same whichever rank makes it;
* a sampled neighbour is queried at the **event time** for the next hop (TGL's
  ``prop_time=False``), so ``dt = t - t_event > 0`` at every hop.

Neighbours of one destination come in chronological order. Output blocks follow
the nested prefix layout: ``mfgs`` is input-first (``mfgs[-1]`` has the roots as
destinations) and every block's sources start with its destinations, which are the
sources of the block after it; so root ``i`` is source ``i`` of every block.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from tgl_dist.dist import Plan
from tgl_dist.graph.tcsr import TemporalNeighborSampleGraph
from tgl_dist.sampling.block import Block, Roots
from tgl_dist.sampling.hashing import GOLDEN, hash_keys, mix64, time_bits, uniform_below, wrap64

log = logging.getLogger(__name__)

POLICIES = ("recent", "uniform")
Hop = Tuple[Tensor, Tensor, Tensor, Tensor]  # (row, nbr, eid, edge_ts), flat, row-major


@contextlib.contextmanager
def num_threads(n: Optional[int]) -> Iterator[None]:
    """Temporarily set torch's intra-op threads (only from the main thread)."""
    if not n or threading.current_thread() is not threading.main_thread():
        yield
        return
    old = torch.get_num_threads()
    if old != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if old != n:
            torch.set_num_threads(old)


class NeighborSampler:
    """Temporal neighbour sampler producing message-flow-graph blocks.

    Args:
        num_nodes: N, number of nodes of the whole graph.
        num_layers: L, number of hops.
        fanout: neighbours per hop, an int (every hop) or a list of L ints
            (``fanout[0]`` is the hop next to the roots).
        graph_data: the :class:`TemporalNeighborSampleGraph` to sample from.
        workers: torch intra-op threads while sampling (default 1).
        policy: ``'recent'`` or ``'uniform'``.
        seed: base seed of the uniform policy (default 0).
        graph_name: optional name used in log messages.

    Shapes:
        R: roots, ``D_l`` / ``S_l`` / ``M_l``: destinations / sources / edges of block l.
    """

    def __init__(self, num_nodes: int, num_layers: int, fanout: Union[int, Sequence[int]],
                 graph_data: TemporalNeighborSampleGraph, workers: int = 1,
                 policy: str = "recent", seed: int = 0, graph_name: Optional[str] = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        fan = [int(fanout)] * num_layers if isinstance(fanout, int) else [int(f) for f in fanout]
        if len(fan) != num_layers or min(fan) < 1:
            raise ValueError(f"fanout must be a positive int or {num_layers} positive ints, got {fanout!r}")
        if not isinstance(graph_data, TemporalNeighborSampleGraph):
            raise TypeError(f"graph_data must be a TemporalNeighborSampleGraph, got {type(graph_data).__name__}")
        if graph_data.num_nodes != num_nodes:
            raise ValueError(f"num_nodes={num_nodes} but graph_data has {graph_data.num_nodes} nodes")
        self.num_nodes = int(num_nodes)
        self.num_layers = int(num_layers)
        self.fanout = fan
        self.graph = graph_data
        self.workers = int(workers) if workers else None
        self.policy = policy
        self.seed = int(seed)
        self.name = graph_name or "graph"
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Reseed the uniform policy for an epoch (default of :meth:`sample`'s ``epoch``)."""
        self.epoch = int(epoch)

    def salt(self, epoch: Optional[int] = None) -> int:
        """The uniform policy's key for ``epoch`` (default: the current epoch)."""
        return int(hash_keys(self.seed, torch.tensor(self.epoch if epoch is None else int(epoch))))

    # ------------------------------------------------------------ local core
    def sample_local(self, nodes: Tensor, ts: Tensor, k: int, salt: int = 0) -> Tuple[Tensor, Tensor]:
        """Sample on this rank's T-CSR (nodes must be held here); ``salt`` keys uniform draws.

        Returns:
            ``(idx, valid)``: ``[R, k]`` row indices into the T-CSR arrays and a mask of
            the valid ones; valid entries of a row are chronological and left-aligned.
        """
        g = self.graph
        start, end = g.before(nodes, ts)
        avail = end - start
        ar = torch.arange(k, dtype=torch.long)
        if self.policy == "recent":
            cnt = avail.clamp(max=k)
            idx = (end - cnt).unsqueeze(1) + ar
            return idx, ar < cnt.unsqueeze(1)
        idx = start.unsqueeze(1) + ar
        valid = ar < avail.unsqueeze(1)
        big = (avail > k).nonzero().view(-1)
        if big.numel():
            c = avail[big]
            base = hash_keys(salt, nodes[big], time_bits(ts[big]))
            pick = torch.empty(big.numel(), k, dtype=torch.long)
            for j in range(k):  # Floyd's algorithm: k distinct offsets in [0, c), vectorised over rows
                i = c - k + j
                r = uniform_below(mix64(base + wrap64((j + 1) * GOLDEN)), i + 1)
                if j:
                    dup = (pick[:, :j] == r.unsqueeze(1)).any(1)
                    r = torch.where(dup, i, r)
                pick[:, j] = r
            pick = pick.sort(dim=1).values
            idx[big] = start[big].unsqueeze(1) + pick
        return idx, valid

    def _hop_local(self, nodes: Tensor, ts: Tensor, k: int, salt: int) -> Hop:
        idx, valid = self.sample_local(nodes, ts, k, salt)
        nz = valid.nonzero()
        row = nz[:, 0]
        e = idx[row, nz[:, 1]]
        g = self.graph
        return row, g.nbr[e], g.eid[e], g.ts[e]

    def _hop_remote(self, nodes: Tensor, ts: Tensor, k: int, salt: int, group) -> Hop:
        """Partitioned mode: every root goes to its owner, which samples and replies."""
        g = self.graph
        plan = Plan(g.book.to_owner(nodes), group)
        req = plan.forward(torch.stack([nodes, time_bits(ts)], 1))
        rn, rt = req[:, 0].contiguous(), req[:, 1].contiguous().view(torch.float64)
        if rn.numel() and not bool(g.owns(rn).all()):
            raise RuntimeError("partitioned sampling received a request for a node this rank does not own")
        idx, valid = self.sample_local(rn, rt, k, salt)
        idx = idx.clamp(max=max(g.nbr.numel() - 1, 0))
        m = rn.numel()
        out = torch.full((m, 3, k), -1, dtype=torch.long)
        if g.nbr.numel():
            out[:, 0] = g.nbr[idx]
            out[:, 1] = torch.where(valid, g.eid[idx], -1)
            out[:, 2] = time_bits(g.ts[idx])
        back = plan.backward(out.view(m, 3 * k)).view(-1, 3, k)
        nz = (back[:, 1] >= 0).nonzero()
        row, col = nz[:, 0], nz[:, 1]
        return row, back[row, 0, col], back[row, 1, col], back[row, 2, col].view(torch.float64)

    def _hop(self, nodes: Tensor, ts: Tensor, k: int, salt: int, group) -> Hop:
        if self.graph.mode == "partitioned":
            return self._hop_remote(nodes, ts, k, salt, group)
        return self._hop_local(nodes, ts, k, salt)

    # --------------------------------------------------------------- public
    def sample(self, nodes: Tensor, ts: Tensor, group=None, epoch: Optional[int] = None) -> List[Block]:
        """Sample ``num_layers`` hops around ``nodes`` queried at ``ts``.

        A collective in ``'partitioned'`` mode (one all-to-all round per hop): every
        rank must call it, also with no roots.

        Args:
            nodes: root global ids ``[R]`` (int64).
            ts: root query times ``[R]`` (float64).
            group: process group for partitioned requests (default world).
            epoch: keys the uniform draws (default: the one set by :meth:`set_epoch`);
                the loader passes its own, so concurrent loaders never race.
        Returns:
            ``L`` blocks, input-first. Block ``l`` (counted from the roots) has
            ``srcdata['ID']``, ``srcdata['ts']`` ``[S_l]``, ``edata['ID']`` (eids),
            ``edata['dt']`` ``[M_l]`` and local ``edge_index`` ``[2, M_l]``.
        """
        nodes = torch.as_tensor(nodes, dtype=torch.long).reshape(-1)
        ts = torch.as_tensor(ts, dtype=torch.float64).reshape(-1)
        if nodes.numel() != ts.numel():
            raise ValueError(f"nodes ({nodes.numel()}) and ts ({ts.numel()}) differ in length")
        if nodes.numel() and (int(nodes.min()) < 0 or int(nodes.max()) >= self.num_nodes):
            raise ValueError(f"root ids must lie in [0, {self.num_nodes})")
        blocks: List[Block] = []
        salt = self.salt(epoch)
        with num_threads(self.workers):
            dst_id, dst_ts = nodes, ts
            prev: Optional[Hop] = None
            prev_dst = 0
            for layer, k in enumerate(self.fanout):
                if prev is not None and k == self.fanout[layer - 1]:
                    # the first prev_dst destinations were sampled with the same k last hop
                    new = self._hop(dst_id[prev_dst:], dst_ts[prev_dst:], k, salt, group)
                    hop = (torch.cat([prev[0], new[0] + prev_dst]),) + tuple(
                        torch.cat([a, b]) for a, b in zip(prev[1:], new[1:]))
                else:
                    hop = self._hop(dst_id, dst_ts, k, salt, group)
                row, nbr, eid, ets = hop
                d = dst_id.numel()
                src_id = torch.cat([dst_id, nbr])
                src_ts = torch.cat([dst_ts, ets])
                edge_index = torch.stack([torch.arange(d, d + nbr.numel()), row])
                dt = (dst_ts[row] - ets).to(torch.float32)
                blocks.append(Block({"ID": src_id, "ts": src_ts}, {"ID": eid, "dt": dt}, edge_index, d))
                prev, prev_dst = hop, d
                dst_id, dst_ts = src_id, src_ts
        blocks.reverse()
        return blocks

    def sample_roots(self, roots: Roots, group=None, epoch: Optional[int] = None) -> List[Block]:
        """:meth:`sample` on ``roots.nodes`` at ``roots.ts``."""
        return self.sample(roots.nodes, roots.ts, group, epoch)

    def __repr__(self) -> str:
        return (f"NeighborSampler(policy={self.policy!r}, fanout={self.fanout}, "
                f"mode={self.graph.mode!r}, workers={self.workers})")
