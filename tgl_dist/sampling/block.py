"""Message-flow-graph blocks: what the sampler produces and the models consume.

Shapes:
    S: source nodes of a block, D: destination nodes (``D <= S``), M: sampled edges,
    R: roots of a batch (``[src | pos dst | neg dst]``), B: positive events.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from torch import Tensor


@dataclass
class Block:
    """One hop of sampled neighbours.

    Attributes:
        srcdata: per source node. ``'ID'`` global node ids ``[S]`` (int64);
            ``'ts'`` the time each node is queried at ``[S]`` (float64). The first
            ``num_dst`` sources are the destinations themselves. The loader and the
            mailbox attach more: ``'h'`` node features ``[S, F_n]``, ``'mem'``,
            ``'mem_ts'``, ``'mail'``, ``'mail_ts'``.
        edata: per sampled edge. ``'ID'`` event ids ``[M]``; ``'dt'`` = query time of
            the destination minus the event time ``[M]`` (float32, always > 0);
            ``'f'`` edge features ``[M, F_e]`` when the graph has them.
        edge_index: ``[2, M]`` local ids: row 0 indexes ``srcdata``, row 1 ``dstdata``.
        num_dst: D.
    """

    srcdata: Dict[str, Tensor]
    edata: Dict[str, Tensor]
    edge_index: Tensor
    num_dst: int

    @property
    def num_src(self) -> int:
        return int(self.srcdata["ID"].numel())

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.size(1))

    @property
    def dstdata(self) -> Dict[str, Tensor]:
        """Views of the first ``num_dst`` rows of every ``srcdata`` entry."""
        return {k: v[: self.num_dst] for k, v in self.srcdata.items()}

    def to(self, device) -> "Block":
        return Block({k: v.to(device) for k, v in self.srcdata.items()},
                     {k: v.to(device) for k, v in self.edata.items()},
                     self.edge_index.to(device), self.num_dst)

    def __repr__(self) -> str:
        return f"Block(num_src={self.num_src}, num_dst={self.num_dst}, num_edges={self.num_edges})"


@dataclass
class Roots:
    """The roots of one batch: ``nodes = [src | dst | neg_dst]``, queried at ``ts``.

    Attributes:
        nodes: global ids ``[R]``.
        ts: query times ``[R]`` (each negative takes its positive event's time).
        eids: event ids of the batch's positive events ``[B]``.
        src, dst: the positive events' endpoints ``[B]``.
        t: the positive events' times ``[B]``.
    """

    nodes: Tensor
    ts: Tensor
    eids: Tensor
    src: Tensor
    dst: Tensor
    t: Tensor
    extra: Dict[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.eids.numel())
