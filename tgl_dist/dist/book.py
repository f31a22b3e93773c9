"""``PartitionBook``: global node id -> (owner rank, local row), and back; ``EventBook``:
the same for events, sharded.

Every rank holds the node book (owner int32, local row and the owner-sorted order int64:
20 bytes a node):
it is metadata, not node state, and it lets any rank route a request for any
node to its owner without asking anyone. Events are too many for that (E is 10 to 100
times N): the :class:`EventBook` is dealt over the ranks (eid ``e`` to rank ``e mod P``),
and a rank asks the holder of an eid's entry where the event lives. Keys no book lists
(pairs of nodes) are owned by a hash of the key (:func:`hash_owner`).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


class PartitionBook:
    """Maps global ids to owners and owner-local rows.

    Args:
        owner: owner rank of each node, shape ``[N]``.
        num_parts: number of parts (default ``owner.max() + 1``); pass it when the
            last parts may own nothing.

    Local rows are assigned in increasing global-id order within each owner, so
    ``owned_ids(r)[local_row] == global_id``.
    """

    def __init__(self, owner: Tensor, num_parts: Optional[int] = None) -> None:
        self.owner = torch.as_tensor(owner, dtype=torch.int32).contiguous()
        self.num_nodes = int(self.owner.numel())
        self.num_parts = int(self.owner.max()) + 1 if self.num_nodes else 1
        if num_parts is not None:  # parts that own nothing still count
            if num_parts < self.num_parts:
                raise ValueError(f"num_parts={num_parts} but owner holds rank {self.num_parts - 1}")
            self.num_parts = int(num_parts)
        order = torch.sort(self.owner.long(), stable=True).indices
        counts = torch.bincount(self.owner.long(), minlength=self.num_parts)
        starts = torch.cumsum(counts, 0) - counts
        local = torch.empty(self.num_nodes, dtype=torch.long)
        local[order] = torch.arange(self.num_nodes) - torch.repeat_interleave(starts, counts)
        self.local = local
        self._order = order
        self._starts = starts
        self.counts = counts
        self._copies: dict = {}   # device -> (owner, local) for ids that live there

    def _tables(self, device: torch.device) -> Tuple[Tensor, Tensor]:
        """``(owner, local)`` on ``device``: a copy is made once per GPU the ids come from
        (12 bytes a node), so GPU-resident state routes without host round trips."""
        if device.type == "cpu":
            return self.owner, self.local
        t = self._copies.get(device)
        if t is None:
            t = self._copies[device] = (self.owner.to(device), self.local.to(device))
        return t

    def owned_ids(self, rank: int) -> Tensor:
        """Global ids owned by ``rank``, in local-row order, shape ``[n_owned]``."""
        s = int(self._starts[rank])
        return self._order[s:s + int(self.counts[rank])]

    def to_owner(self, global_ids: Tensor) -> Tensor:
        """Owner rank of each id (int64), same shape as ``global_ids``."""
        return _lookup(self._tables(global_ids.device)[0], global_ids).long()

    def to_local(self, global_ids: Tensor) -> Tensor:
        """Row of each id inside its owner's tables."""
        return _lookup(self._tables(global_ids.device)[1], global_ids)

    def locate(self, global_ids: Tensor) -> Tuple[Tensor, Tensor]:
        """``(owner, local_row)`` of each id."""
        return self.to_owner(global_ids), self.to_local(global_ids)

    def check_world(self, world_size: int) -> None:
        """``ValueError`` unless there is one rank per part: a part's local rows stand for
        rows that live in the other parts, so a group of another size would read wrong ones."""
        check_one_rank_per_part(self.num_parts, world_size)

    def state(self) -> dict:
        return {"owner": self.owner}

    def __repr__(self) -> str:
        return f"PartitionBook(num_nodes={self.num_nodes}, num_parts={self.num_parts})"


def _lookup(table: Tensor, ids: Tensor) -> Tensor:
    """``table[ids]`` in the shape of ``ids``, by ``index_select`` (about half the time of
    advanced indexing on CPU at a batch's ~6,000 ids); a negative id is an ``IndexError``
    here, where ``table[ids]`` would wrap it to another node's entry."""
    return table.index_select(0, ids.reshape(-1)).view(ids.shape)


class EventBook:
    """Where each event's row lives (owner rank, row in the owner's tables), sharded.

    Events are numbered ``0 .. E-1`` in stream order (the global, chronological eid) and
    live on the rank that owns their source, so the ranks' events interleave in that
    numbering. No rank holds a table over all E events: rank ``q`` holds the *directory*
    entries of the eids ``q, q + P, q + 2P, ...`` (entry ``i`` is eid ``q + i P``), the
    owner (int32) and the owner's row (int64) of each: 12 bytes per event of its share.
    Dealt round-robin rather than in ranges of eids, the entries a step asks for (its
    neighbours' events, close in time) are spread over all ranks instead of all falling
    in one rank's range. The holder of eid ``e`` is ``e mod P``, the entry ``e div P``
    (:meth:`holder`), answered there by :meth:`serve`; the exchange itself is the
    caller's, e.g. ``DistributedGraphStore.get_edge_feat``.

    Args:
        num_events: E.
        num_parts: P.
        rank: the rank whose entries ``owner`` and ``row`` are.
        owner: owner rank of each of its eids, ``[len(range(rank, E, P))]``.
        row: its row in the owner's event tables (rows are chronological), same shape.
    """

    def __init__(self, num_events: int, num_parts: int, rank: int, owner: Tensor,
                 row: Tensor) -> None:
        self.num_events, self.num_parts, self.rank = int(num_events), int(num_parts), int(rank)
        n = directory_size(self.num_events, self.num_parts, self.rank)
        if owner.numel() != n or row.numel() != n:
            raise ValueError(f"EventBook of rank {rank}: owner and row must hold its {n} "
                             f"entries (eids {rank}, {rank} + {num_parts}, ...), got "
                             f"{owner.numel()} and {row.numel()}")
        self.owner, self.row = owner.reshape(-1), row.reshape(-1)

    def holder(self, eids: Tensor) -> Tuple[Tensor, Tensor]:
        """``(rank, index)`` of each eid's directory entry, ``(eid mod P, eid div P)``,
        int64, shape of ``eids``. ``ValueError`` for an eid outside ``[0, E)``."""
        eids = eids.to(torch.long)
        if eids.numel() and not (0 <= int(eids.min()) and int(eids.max()) < self.num_events):
            raise ValueError(f"event ids must be in [0, {self.num_events}), got "
                             f"[{int(eids.min())}, {int(eids.max())}]")
        return eids % self.num_parts, eids // self.num_parts

    def serve(self, index: Tensor) -> Tensor:
        """``[n, 2]`` int64 rows ``(owner, row)`` of this rank's directory entries ``index``."""
        return torch.stack([self.owner.index_select(0, index).long(),
                            self.row.index_select(0, index).long()], 1)

    def check_world(self, world_size: int) -> None:
        """``ValueError`` unless there is one rank per part (as :meth:`PartitionBook.check_world`)."""
        check_one_rank_per_part(self.num_parts, world_size)

    def nbytes(self) -> int:
        """Bytes of this rank's directory entries (``owner`` and ``row``; mapped from the partition)."""
        return sum(int(x.numel()) * x.element_size() for x in (self.owner, self.row))

    def __repr__(self) -> str:
        return (f"EventBook(num_events={self.num_events}, num_parts={self.num_parts}, "
                f"rank={self.rank}, entries={self.owner.numel()})")


_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)   # Fibonacci hashing: spreads keys over the ranks


def hash_owner(keys: Tensor, world_size: int) -> Tensor:
    """``[n]`` the rank in ``[0, world_size)`` that owns each int64 key ``[n]``, by a
    multiplicative hash: any rank computes it without asking (e.g. a (src, dst) pair's
    key in EdgeBank's sharded memory or in historical negatives' pair shards)."""
    return (((keys * _GOLDEN) >> 33) & ((1 << 30) - 1)) % world_size


def directory_size(num_events: int, num_parts: int, rank: int) -> int:
    """How many of the eids ``0 .. E-1`` are ``rank`` mod ``P``: rank's directory entries."""
    return max(0, (int(num_events) - int(rank) + int(num_parts) - 1) // int(num_parts))


def check_one_rank_per_part(num_parts: int, world_size: int) -> None:
    """``ValueError`` unless a group of ``world_size`` ranks has one rank per part."""
    if world_size != num_parts:
        raise ValueError(f"the partition has {num_parts} parts but the process group "
                         f"{world_size} ranks: one rank per part (run with "
                         f"--nproc_per_node={num_parts}, or partition into "
                         f"{world_size} parts)")
