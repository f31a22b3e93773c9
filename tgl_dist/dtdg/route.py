"""``Route``: the differentiable halo exchange of partition-parallel snapshot GNNs.

Rank r computes its owned nodes. A graph convolution on rank r also reads its
**halo** nodes (remote sources of edges into owned nodes). The route sends, in one
all-to-all, each owned row that some other rank holds in its halo; autograd's
backward sends the halo gradients back to the owners, where they are summed into
the owned rows' gradients.

Worked example (2 ranks, 4 nodes, owner = ``[0, 1, 0, 1]``, edges 1->0, 3->0, 0->1)::

    rank 0 owns [0, 2], halo [1, 3] (both from rank 1);  rank 1 owns [1, 3], halo [0]
    rank 0: send_rows [0] (node 0, for rank 1)  send_counts [0, 1]  recv_counts [0, 2]
    rank 1: send_rows [0, 1] (nodes 1, 3)       send_counts [2, 0]  recv_counts [1, 0]
    forward on rank 0: h_own [2, *] -> h_all [4, *] = [h_0, h_2 | h_1, h_3]
    backward on rank 1: grad of h_own gets grad(h_1) and grad(h_3) from rank 0's halo rows
"""
from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor

from tgl_dist.dist import AllToAllV, Plan, world


class Route:
    """A fixed routing of owned rows to the ranks that hold them as halo rows.

    Args:
        send_rows: local rows of owned nodes to send, grouped by destination rank, ``[S]``.
        send_counts: rows for each destination rank (length P, sums to S).
        recv_counts: halo rows arriving from each rank (length P, sums to h).
        num_owned: n, the owned rows the input must have.
        group: process group (``None``: default group, or a world of one).

    Calling the route (a collective: every rank must call it, in the same order) maps
    ``h_own [n, *]`` (node dimension ``node_dim``) to ``h_all [n + h, *]``: owned rows
    first, then the halo rows grouped by owner. In a world of one it is the identity.
    """

    def __init__(self, send_rows: Tensor, send_counts, recv_counts, num_owned: int,
                 group=None) -> None:
        self.send_rows = torch.as_tensor(send_rows, dtype=torch.long)
        self.send_counts: List[int] = [int(c) for c in send_counts]
        self.recv_counts: List[int] = [int(c) for c in recv_counts]
        self.num_owned = int(num_owned)
        self.group = group
        self.world_size = world(group)[1]

    @property
    def num_halo(self) -> int:
        """h, the halo rows the route appends."""
        return sum(self.recv_counts)

    @property
    def num_all(self) -> int:
        return self.num_owned + self.num_halo

    def to(self, device) -> "Route":
        self.send_rows = self.send_rows.to(device)
        return self

    def __call__(self, h_own: Tensor, node_dim: int = 0) -> Tensor:
        """``[.., n, ..] -> [.., n + h, ..]`` along ``node_dim`` (differentiable)."""
        if h_own.size(node_dim) != self.num_owned:
            raise ValueError(f"Route expects {self.num_owned} owned rows along dim {node_dim}, "
                             f"got shape {tuple(h_own.shape)}")
        if self.world_size == 1:
            return h_own
        send = h_own.index_select(node_dim, self.send_rows)
        if node_dim != 0:
            send = send.movedim(node_dim, 0)
        recv = AllToAllV.apply(send.contiguous(), self.send_counts, self.recv_counts, self.group)
        if node_dim != 0:
            recv = recv.movedim(0, node_dim)
        return torch.cat([h_own, recv], dim=node_dim)

    apply = __call__

    def __repr__(self) -> str:
        return (f"Route(num_owned={self.num_owned}, num_halo={self.num_halo}, "
                f"send={sum(self.send_counts)}, world_size={self.world_size})")

    # ------------------------------------------------------------ builders
    @classmethod
    def for_ids(cls, global_ids: Tensor, owner: Tensor, local: Tensor, rank: int,
                num_owned: int, group=None) -> Tuple["Route", Tensor]:
        """A route that brings the rows of arbitrary nodes (a collective).

        Args:
            global_ids: nodes this rank needs, ``[m]`` (any order, repeats allowed).
            owner / local: the partition book (owner rank and owner-local row of every node).
            rank: this rank.
            num_owned: n.
        Returns:
            ``(route, index)``: ``route(h_own)[index]`` are the rows of ``global_ids``, ``[m, *]``.
        """
        uniq, inv = torch.unique(global_ids, return_inverse=True)
        own = owner[uniq].long()
        is_remote = own != rank
        remote = uniq[is_remote]
        plan = Plan(own[is_remote], group)
        asked = plan.forward(local[remote])                  # rows others want from us
        route = cls(asked, plan.recv_counts, plan.send_counts, num_owned, group)
        pos = torch.empty(uniq.numel(), dtype=torch.long, device=uniq.device)
        pos[~is_remote] = local[uniq[~is_remote]]
        remote_pos = torch.empty(remote.numel(), dtype=torch.long, device=uniq.device)
        remote_pos[plan.perm] = torch.arange(remote.numel(), device=uniq.device)
        pos[is_remote] = num_owned + remote_pos
        return route, pos[inv]
