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
from tgl_dist.sampling._ckernel import get_kernel, load_kernel
from tgl_dist.sampling.block import Block, Roots
from tgl_dist.sampling.hashing import GOLDEN, hash_keys, mix64, time_bits, uniform_below, wrap64

log = logging.getLogger(__name__)

POLICIES = ("recent", "uniform")
BACKENDS = ("auto", "compiled", "torch", "cpp")  # 'cpp': old name of 'compiled'
Hop = Tuple[Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]  # (row, nbr, eid, edge_ts, dt?), flat


def compact(cnt: Tensor) -> Tuple[Tensor, Tensor]:
    """Flatten ``cnt[r]`` items per row: ``(row, j)`` of every item, row-major, ``[sum(cnt)]`` each."""
    R = cnt.numel()
    if R == 0:
        z = torch.zeros(0, dtype=torch.long)
        return z, z
    ends = torch.cumsum(cnt, 0)
    total = int(ends[-1])
    row = torch.repeat_interleave(torch.arange(R), cnt, output_size=total)
    j = torch.arange(total, dtype=torch.long) - (ends - cnt).index_select(0, row)
    return row, j


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
        workers: threads of the compiled kernel, and torch's intra-op threads while
            sampling from the main thread (default 1).
        policy: ``'recent'`` or ``'uniform'``.
        seed: base seed of the uniform policy (default 0).
        graph_name: optional name used in log messages.
        backend: ``'auto'`` (default: the compiled C kernel of
            :mod:`tgl_dist.sampling._ckernel`, built on first use in about a
            second, or the torch path with one warning if no C compiler works),
            ``'compiled'`` (the kernel; error if it cannot be built; ``'cpp'`` is an
            alias) or ``'torch'`` (vectorised torch ops only). All return identical
            samples.

    Shapes:
        R: roots, ``D_l`` / ``S_l`` / ``M_l``: destinations / sources / edges of block l.
    """

    def __init__(self, num_nodes: int, num_layers: int, fanout: Union[int, Sequence[int]],
                 graph_data: TemporalNeighborSampleGraph, workers: int = 1,
                 policy: str = "recent", seed: int = 0, graph_name: Optional[str] = None,
                 backend: str = "auto") -> None:
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
        self.threads = self.workers or 1  # threads of the compiled kernel
        self.policy = policy
        self.seed = int(seed)
        self.name = graph_name or "graph"
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self._kernel = None
        if backend == "auto":
            self._kernel = get_kernel()
        elif backend != "torch":
            try:
                self._kernel = load_kernel()
            except RuntimeError as e:
                raise RuntimeError(f"backend={backend!r}: the compiled sampling kernel is unavailable ({e}); "
                                   f"install a C compiler or set CC, or use backend='torch' or 'auto'") from e
        self.backend = "compiled" if self._kernel is not None else "torch"
        self._salts: dict = {}
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        """Reseed the uniform policy for an epoch (default of :meth:`sample`'s ``epoch``)."""
        self.epoch = int(epoch)

    def salt(self, epoch: Optional[int] = None) -> int:
        """The uniform policy's key for ``epoch`` (default: the current epoch)."""
        e = self.epoch if epoch is None else int(epoch)
        if e not in self._salts:
            self._salts[e] = int(hash_keys(self.seed, int(e)))
        return self._salts[e]

    # ------------------------------------------------------------ local core
    def sample_local(self, nodes: Tensor, ts: Tensor, k: int, salt: int = 0
                     ) -> Tuple[Tensor, Optional[Tensor], Tensor]:
        """Sample on this rank's T-CSR (nodes must be held here); ``salt`` keys uniform draws.

        Returns:
            ``(first, table, cnt)``: ``cnt`` ``[R]`` neighbours per root. With ``table``
            None the neighbours of root r are T-CSR rows ``first[r] + 0..cnt[r]-1``;
            otherwise ``table`` ``[R, k]`` holds the rows, left-aligned. Chronological.
        """
        g = self.graph
        start, end = g.before(nodes, ts)
        avail = end - start
        cnt = avail.clamp(max=k)
        if self.policy == "recent":
            return end - cnt, None, cnt
        big = (avail > k).nonzero().view(-1)
        if big.numel() == 0:
            return start, None, cnt
        table = start.unsqueeze(1) + torch.arange(k, dtype=torch.long)
        c = avail.index_select(0, big)
        base = hash_keys(salt, nodes.index_select(0, big), time_bits(ts.index_select(0, big)))
        pick = torch.empty(big.numel(), k, dtype=torch.long)
        for j in range(k):  # Floyd's algorithm: k distinct offsets in [0, c), vectorised over rows
            i = c - k + j
            r = uniform_below(mix64(base + wrap64((j + 1) * GOLDEN)), i + 1)
            if j:
                dup = (pick[:, :j] == r.unsqueeze(1)).any(1)
                r = torch.where(dup, i, r)
            pick[:, j] = r
        pick = pick.sort(dim=1).values
        table.index_copy_(0, big, start.index_select(0, big).unsqueeze(1) + pick)
        return start, table, cnt

    def _hop_local(self, nodes: Tensor, ts: Tensor, k: int, salt: int) -> Hop:
        g = self.graph
        if self._kernel is not None:  # the kernel computes dt too
            return self._kernel.hop(g, nodes, ts, k, self.policy == "uniform", salt, self.threads)
        first, table, cnt = self.sample_local(nodes, ts, k, salt)
        row, j = compact(cnt)
        if table is None:
            e = first.index_select(0, row) + j
        else:
            e = table.view(-1).index_select(0, row * k + j)
        g = self.graph
        return row, g.nbr.index_select(0, e), g.eid.index_select(0, e), g.ts.index_select(0, e), None

    def _hop_remote(self, nodes: Tensor, ts: Tensor, k: int, salt: int, group) -> Hop:
        """Partitioned mode: every root goes to its owner, which samples and replies.

        Reply per request: ``[cnt | nbr x k | eid x k | time bits x k]`` (int64).
        """
        g = self.graph
        plan = Plan(g.book.to_owner(nodes), group)
        req = plan.forward(torch.stack([nodes, time_bits(ts)], 1))
        rn, rt = req[:, 0].contiguous(), req[:, 1].contiguous().view(torch.float64)
        if rn.numel() and not bool(g.owns(rn).all()):
            raise RuntimeError("partitioned sampling received a request for a node this rank does not own")
        m = rn.numel()
        out = torch.zeros((m, 1 + 3 * k), dtype=torch.long)
        if m and g.nbr.numel():
            row, nbr, eid, ets, _ = self._hop_local(rn, rt, k, salt)
            cnt = torch.bincount(row, minlength=m)
            _, j = compact(cnt)
            flat = out[:, 1:].view(m, 3, k)
            flat[row, 0, j] = nbr
            flat[row, 1, j] = eid
            flat[row, 2, j] = time_bits(ets)
            out[:, 0] = cnt
        back = plan.backward(out)
        n = back.size(0)
        row, j = compact(back[:, 0].contiguous())
        body = back[:, 1:].reshape(-1)
        base = row * (3 * k) + j
        return (row, body.index_select(0, base), body.index_select(0, base + k),
                body.index_select(0, base + 2 * k).view(torch.float64), None) if n else (
                    row, row.clone(), row.clone(), torch.zeros(0, dtype=torch.float64), None)

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
        if nodes.numel() and (lambda mm: int(mm[0]) < 0 or int(mm[1]) >= self.num_nodes)(torch.aminmax(nodes)):
            raise ValueError(f"root ids must lie in [0, {self.num_nodes})")
        if bool(torch.isnan(ts).any()):  # "strictly before NaN" means nothing
            raise ValueError(f"query time of root {int(torch.isnan(ts).nonzero()[0])} is NaN")
        blocks: List[Block] = []
        salt = self.salt(epoch)
        with num_threads(self.workers):
            dst_id, dst_ts = nodes, ts
            prev: Optional[Hop] = None
            prev_dst = 0
            for layer, k in enumerate(self.fanout):
                if self._kernel is not None and self.graph.mode == "full":
                    # the compiled kernel writes the whole block in place; destinations
                    # sampled with the same k in the previous block are copied from it
                    reuse = (d_prev,) + out if layer and k == self.fanout[layer - 1] else None
                    out = self._kernel.block(self.graph, dst_id, dst_ts, k, self.policy == "uniform",
                                             salt, self.threads, reuse, None if layer == 0 else out[5],
                                             want_hint=layer + 1 < len(self.fanout))
                    src_id, src_ts, edge_index, eid, dt, _ = out
                    d_prev = dst_id.numel()
                    blocks.append(Block({"ID": src_id, "ts": src_ts}, {"ID": eid, "dt": dt}, edge_index,
                                        d_prev))
                    dst_id, dst_ts = src_id, src_ts
                    continue
                if prev is not None and k == self.fanout[layer - 1]:
                    # the first prev_dst destinations were sampled with the same k last hop
                    new = self._hop(dst_id[prev_dst:], dst_ts[prev_dst:], k, salt, group)
                    hop = (torch.cat([prev[0], new[0] + prev_dst]),) + tuple(
                        torch.cat([a, b]) for a, b in zip(prev[1:4], new[1:4])) + (
                        None if prev[4] is None or new[4] is None else torch.cat([prev[4], new[4]]),)
                else:
                    hop = self._hop(dst_id, dst_ts, k, salt, group)
                row, nbr, eid, ets, dt = hop
                d = dst_id.numel()
                src_id = torch.cat([dst_id, nbr])
                src_ts = torch.cat([dst_ts, ets])
                edge_index = torch.stack([torch.arange(d, d + nbr.numel()), row])
                if dt is None:
                    dt = (dst_ts.index_select(0, row) - ets).to(torch.float32)
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
                f"mode={self.graph.mode!r}, workers={self.workers}, backend={self.backend!r})")
