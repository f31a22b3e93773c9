"""``DistEmbedding``: a learnable node-embedding table sharded by a partition book.

Each rank stores only the rows of the nodes it owns (``book.owned_ids(rank)``, in
local-row order). A lookup of any global ids fetches the remote rows from their
owners by all-to-all; the backward pass records ``(unique ids, gradient rows)``
locally and the sparse optimizers in :mod:`tgl_dist.optim` send them to the owners
in their ``step()``. No dense gradient of the table is ever formed.

Worked example (2 ranks, owners ``[0, 1, 0, 1]``, so rank 0 holds rows of nodes
``[0, 2]`` and rank 1 of ``[1, 3]``)::

    rank 0: emb(tensor([3, 0, 3]))        rank 1: emb(tensor([2]))
      unique [0, 3], inverse [1, 0, 1]      unique [2]
      asks itself for row 0 (node 0),       asks rank 0 for row 1 (node 2)
      rank 1 for row 1 (node 3)
      returns rows of [3, 0, 3]  [3, D]     returns the row of [2]  [1, D]
    backward: rank 0 records ([0, 3], grad [2, D]) (the two rows of node 3 summed),
              rank 1 records ([2], grad [1, D]); nothing is sent until optimizer.step().
"""
from __future__ import annotations

import ctypes
import logging
import math
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from tgl_dist.dist import PartitionBook, all_gather_v, fetch_rows, world
from tgl_dist.errors import PartitionError

log = logging.getLogger(__name__)

_M32 = 0xFFFFFFFF
_INIT_CHUNK_ROWS = 1 << 12
_HUGE_PAGE = 1 << 21
_MADV_HUGEPAGE = 14          # Linux <sys/mman.h>
_HUGE_MIN_BYTES = 32 << 20


_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_REDUCTIONS = ("sum", "mean")


def empty_rows(n: int, d: int, dtype: torch.dtype = torch.float32,
               device: Optional[torch.device | str] = None) -> Tensor:
    """``torch.empty(n, d)`` for a large per-row table; fill it before use.

    On Linux CPU, a table of 32 MB or more is advised (``madvise(MADV_HUGEPAGE)``,
    before its pages are first touched) to use transparent huge pages: a step touches
    rows at random, and with 4 KB pages every touched row of a multi-GB table is a TLB
    miss; with 2 MB pages the cost of a step stays that of a small table. Advisory
    only: where it is unavailable the table is an ordinary one.
    """
    t = torch.empty(n, d, dtype=dtype, device=device)
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu" or nbytes < _HUGE_MIN_BYTES or not sys.platform.startswith("linux"):
        return t
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        start = (t.data_ptr() + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
        length = (t.data_ptr() + nbytes - start) & ~(_HUGE_PAGE - 1)
        if length > 0 and libc.madvise(start, length, _MADV_HUGEPAGE) != 0:
            log.debug("madvise(MADV_HUGEPAGE) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as e:  # no libc symbol table: keep 4 KB pages
        log.debug("huge pages not advised: %s", e)
    return t


def _fmix64_(h: Tensor) -> Tensor:
    """MurmurHash3's 32-bit finaliser, in place, on int64 values in ``[0, 2^32)``."""
    h ^= h >> 16
    h.mul_(0x85EBCA6B).bitwise_and_(_M32)
    h ^= h >> 13
    h.mul_(0xC2B2AE35).bitwise_and_(_M32)
    h ^= h >> 16
    return h


def _s32(v: int) -> int:
    """The int32 with the same 32 bits as ``v`` in ``[0, 2^32)``."""
    return v - (1 << 32) if v >= (1 << 31) else v


def _fmix32_(h: Tensor) -> Tensor:
    """The same finaliser on int32 tensors (wrapping multiply, logical shifts by masking);
    three times faster than the int64 form on the ``[n, D]`` part."""
    h ^= (h >> 16) & 0xFFFF
    h.mul_(_s32(0x85EBCA6B))
    h ^= (h >> 13) & 0x7FFFF
    h.mul_(_s32(0xC2B2AE35))
    h ^= (h >> 16) & 0xFFFF
    return h


def hash_uniform_(out: Tensor, global_ids: Tensor, seed: int, low: float, high: float) -> Tensor:
    """Fill ``out[i, j]`` with a uniform number in ``[low, high)`` that depends only on
    ``(seed, global_ids[i], j)``: the same node gets the same row on any rank, in any
    world size and in any order. Vectorised and chunked (no Python loop over nodes).

    Args:
        out: table to fill in place, shape ``[n, D]``.
        global_ids: global id of each row of ``out``, shape ``[n]``.
        seed: any integer.
        low, high: bounds of the uniform distribution.
    Returns:
        ``out``.
    """
    n, d = out.shape
    s = _fmix64_(torch.tensor([(seed ^ 0x5BD1E995) & _M32], dtype=torch.long))
    s = int(_fmix64_(s ^ ((seed >> 32) & _M32)))
    cols = torch.tensor([_s32((j * 0x9E3779B9) & _M32) for j in range(d)], dtype=torch.int32)
    scale = (high - low) / float(1 << 24)
    for a in range(0, n, _INIT_CHUNK_ROWS):
        g = global_ids[a:a + _INIT_CHUNK_ROWS].to("cpu", torch.long)
        h = _fmix64_(_fmix64_((g >> 32) ^ s) ^ (g & _M32))          # per row, [c] in [0, 2^32)
        h = torch.where(h >= 1 << 31, h - (1 << 32), h).to(torch.int32)
        h = (h.view(-1, 1) + cols) ^ _s32(s)                        # [c, D], int32 wraps
        _fmix32_(h)
        u = ((h >> 8) & 0xFFFFFF).to(torch.float32)                 # 24 random bits
        out[a:a + g.numel()] = u.mul_(scale).add_(low).to(out.dtype)
    return out


class _Lookup(torch.autograd.Function):
    """Fetch rows of unique global ids; backward records the gradient rows (no communication)."""

    @staticmethod
    def forward(ctx, anchor: Tensor, uniq: Tensor, emb: "DistEmbedding") -> Tensor:
        owner, local = emb.book.locate(uniq)
        ctx.emb = emb
        ctx.save_for_backward(uniq, owner, local)  # the step routes by them: no second look-up
        return emb._fetch(owner, local)

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.emb._record(*ctx.saved_tensors, grad)
        return None, None, None


class DistEmbedding(nn.Module):
    """Learnable embedding of ``num_nodes`` nodes, sharded so each rank keeps its own rows.

    Args:
        num_nodes: number of nodes N (global ids ``0 .. N-1``).
        dim: embedding size D.
        partition_book: :class:`~tgl_dist.dist.PartitionBook` over the N nodes with as
            many parts as ranks in ``group`` (a book of one part in a world of one).
        name: unique name; keys the optimizer state and checkpoints.
        init: optional callable ``init(weight)`` that fills the local table
            (shape ``[n_owned, D]``) in place, e.g. ``torch.nn.init.zeros_``. Default:
            uniform in ``[-1/sqrt(D), 1/sqrt(D))`` from a counter-based hash of
            ``(seed, global id, column)``, so a node's row is the same whatever the
            world size or partition. A custom random ``init`` does not have that property.
        group: process group of the ranks sharing the table (default: the world).
        seed: seed of the default initialisation (default: ``0``).
        dtype: table dtype (default: ``torch.float32``).
        device: where the local table lives (default: CPU).
        grad_reduction: how the gradient rows of the ranks combine at the owner in the
            sparse optimizer's ``step()``: ``'sum'`` (default) or ``'mean'`` (the sum
            divided by the group's world size). Use ``'mean'`` when the training loop
            *averages* the dense gradients over ranks (each rank's loss is a mean over
            its share of the step, as :func:`tgl_dist.ctdg.all_reduce_gradients`
            assumes), ``'sum'`` when each rank's loss is already normalised by global
            counts and dense gradients are summed (the DTDG trainer). Either way the
            table then follows the 1-process gradient.
        sparse_optim: optional hint for :func:`tgl_dist.ctdg.build_optimizer`:
            ``{'optimizer': 'adam' | 'adagrad', 'lr': float}`` (either key may be
            left out). The table itself never reads it.

    Attributes:
        weight: this rank's rows, shape ``[n_owned, D]``; row ``k`` is node
            ``owned_ids[k]``. Neither a ``Parameter`` nor a buffer: dense optimizers
            never see it and DDP neither all-reduces nor broadcasts it (its size differs
            between ranks); :mod:`tgl_dist.optim` updates it. It is in ``state_dict()``
            (keys ``weight`` and ``owned_ids``) and follows ``.to()``.
        owned_ids: global ids of the local rows, shape ``[n_owned]`` (int64).

    Shapes:
        - ids: ``[n]`` global ids (any order, duplicates allowed).
        - output: ``[n, D]``.

    ``forward`` is a collective: every rank of ``group`` must call it the same number
    of times and in the same order (with an empty ``ids`` when it has nothing to look
    up). Its backward does no communication; the gradient rows wait in this module
    until a sparse optimizer's ``step()`` (or ``zero_grad()``).
    """

    def __init__(self, num_nodes: int, dim: int, partition_book: PartitionBook, name: str,
                 init: Optional[Callable[[Tensor], Any]] = None, group=None, *, seed: int = 0,
                 dtype: torch.dtype = torch.float32,
                 device: Optional[torch.device | str] = None,
                 grad_reduction: str = "sum",
                 sparse_optim: Optional[Dict[str, Any]] = None) -> None:
        super().__init__()
        if grad_reduction not in _REDUCTIONS:
            raise ValueError(f"DistEmbedding: grad_reduction must be 'sum' or 'mean', "
                             f"got {grad_reduction!r}")
        hint = dict(sparse_optim or {})
        unknown = sorted(set(hint) - {"optimizer", "lr"})
        if unknown:
            raise ValueError(f"DistEmbedding: sparse_optim takes keys 'optimizer' and 'lr', "
                             f"got {unknown}")
        if int(num_nodes) < 0 or int(dim) <= 0:
            raise ValueError(f"DistEmbedding needs num_nodes >= 0 and dim > 0, got "
                             f"num_nodes={num_nodes}, dim={dim}")
        if not isinstance(partition_book, PartitionBook):
            raise TypeError(f"partition_book must be a tgl_dist.dist.PartitionBook, "
                            f"got {type(partition_book).__name__}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"DistEmbedding needs a non-empty name, got {name!r}")
        rank, ws = world(group)
        if partition_book.num_nodes != int(num_nodes):
            raise PartitionError(f"DistEmbedding '{name}': partition book covers "
                                 f"{partition_book.num_nodes} nodes but num_nodes={num_nodes}")
        if partition_book.num_parts > ws:
            raise PartitionError(f"DistEmbedding '{name}': partition book has "
                                 f"{partition_book.num_parts} parts but the group has {ws} ranks")
        self.num_nodes = int(num_nodes)
        self.dim = int(dim)
        self.book = partition_book
        self.name = name
        self.group = group
        self.rank = rank
        self.world_size = ws
        self.seed = int(seed)
        self.grad_reduction = grad_reduction
        self.sparse_optim = hint
        owned = (partition_book.owned_ids(rank) if rank < partition_book.num_parts
                 else torch.empty(0, dtype=torch.long))
        weight = empty_rows(owned.numel(), self.dim, dtype=dtype, device=device)
        with torch.no_grad():
            if init is None:
                bound = 1.0 / math.sqrt(self.dim)
                hash_uniform_(weight, owned, self.seed, -bound, bound)
            else:
                init(weight)
        self.weight = weight
        self.owned_ids = owned.to(device=weight.device, dtype=torch.long).clone()
        self._anchor = torch.zeros(0, requires_grad=True)
        self._grads: List[Tuple[Tensor, Tensor]] = []
        self._agreed = ws == 1
        log.debug("DistEmbedding '%s': rank %d holds %d of %d rows (D=%d)",
                  name, rank, owned.numel(), self.num_nodes, self.dim)

    # ------------------------------------------------------------------ lookup
    @property
    def num_owned(self) -> int:
        """Rows held by this rank."""
        return int(self.weight.size(0))

    def forward(self, ids: Tensor) -> Tensor:
        """Rows of the global ``ids`` (collective).

        Args:
            ids: global node ids, shape ``[n]`` (integer; duplicates allowed).
        Returns:
            rows, shape ``[n, D]``; differentiable when grad is enabled.
        """
        ids = torch.as_tensor(ids)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() != 1:
            raise TypeError(f"DistEmbedding '{self.name}': ids must be a 1-D integer tensor, "
                            f"got dtype {ids.dtype} and shape {tuple(ids.shape)}")
        ids = ids.long()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_nodes):
            bad = ids[(ids < 0) | (ids >= self.num_nodes)][0]
            raise ValueError(f"DistEmbedding '{self.name}': id {int(bad)} is out of range "
                             f"[0, {self.num_nodes})")
        if not self._agreed:
            self._check_agreement()
        uniq, inverse = torch.unique(ids.cpu(), return_inverse=True)
        if torch.is_grad_enabled():
            rows = _Lookup.apply(self._anchor, uniq, self)
        else:
            rows = self._fetch(*self.book.locate(uniq))
        return rows.index_select(0, inverse.to(rows.device))

    def _check_agreement(self) -> None:
        """At the first lookup (already a collective): every rank's table must have the same
        shape, dtype and gradient reduction; rows of another width would abort the exchange
        inside gloo / NCCL, and another reduction would be applied silently by its owners."""
        mine = [self.num_nodes, self.dim, _REDUCTIONS.index(self.grad_reduction),
                _DTYPES.index(self.weight.dtype) if self.weight.dtype in _DTYPES else -1]
        every = all_gather_v(torch.tensor([mine], dtype=torch.long), group=self.group).tolist()
        shown = [(n, d, _REDUCTIONS[r], str(_DTYPES[t]) if t >= 0 else "other")
                 for n, d, r, t in every]
        for i, field in enumerate(("num_nodes", "dim", "grad_reduction", "dtype")):
            values = [row[i] for row in shown]
            if len(set(values)) > 1:
                raise ValueError(f"DistEmbedding '{self.name}': the ranks built the table with "
                                 f"different {field}: {values} (rank order)")
        self._agreed = True

    def _fetch(self, owner: Tensor, local: Tensor) -> Tensor:
        """Rows ``[u, D]`` at (owner rank, local row) of unique nodes (collective).

        ``owner``/``local`` come from the book, which lives on the CPU.
        """
        w = self.weight
        # index tensors travel on the table's device (NCCL exchanges device tensors only)
        return fetch_rows(owner.to(w.device), local.to(w.device),
                          lambda r: w.index_select(0, r), group=self.group)

    def _record(self, uniq: Tensor, owner: Tensor, local: Tensor, grad: Tensor) -> None:
        self._grads.append((uniq, owner, local, grad.detach().to(self.weight.dtype).clone(
            memory_format=torch.contiguous_format)))

    # --------------------------------------------------------------- gradients
    def take_grads(self) -> Tuple[Tensor, Tensor]:
        """The gradient rows recorded since the last ``clear_grads()`` (not cleared).

        Returns:
            ``(ids, grad)``: global ids ``[m]`` and gradient rows ``[m, D]``; an id may
            appear more than once (once per lookup that used it).
        """
        ids, _, _, grad = self.take_routed_grads()
        return ids, grad

    def take_routed_grads(self) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Like :meth:`take_grads`, with each id's owner rank and local row (from the lookup).

        Returns:
            ``(ids, owner, local_row, grad)``: ``[m]``, ``[m]``, ``[m]`` (int64, CPU) and
            ``[m, D]`` on the table's device.
        """
        if not self._grads:
            empty = torch.empty(0, dtype=torch.long)
            return empty, empty, empty, self.weight.new_zeros(0, self.dim)
        cols = list(zip(*self._grads))
        return (torch.cat(cols[0]), torch.cat(cols[1]), torch.cat(cols[2]),
                torch.cat([g.to(self.weight.device) for g in cols[3]]))

    @property
    def has_grad(self) -> bool:
        """True when a backward pass reached this table since the last ``clear_grads()``."""
        return bool(self._grads)

    def clear_grads(self) -> None:
        """Forget the recorded gradient rows (what ``optimizer.zero_grad()`` calls)."""
        self._grads = []

    # ------------------------------------------------------------------ export
    def full_table(self) -> Tensor:
        """The whole ``[N, D]`` table on every rank (collective; O(N·D) memory per rank).

        For tests, small tables and export only: training never needs it.
        """
        ids = all_gather_v(self.owned_ids.cpu(), group=self.group)
        rows = all_gather_v(self.weight.detach().cpu(), group=self.group)
        out = rows.new_zeros(self.num_nodes, self.dim)
        out[ids] = rows
        return out

    # ------------------------------------------------------------ module state
    #: per-rank state (each rank its own rows): never broadcast or all-reduced
    #: (:func:`tgl_dist.dist.parallel.sharded_state_keys`)
    sharded_state_keys = ("weight", "owned_ids")

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        self.weight = fn(self.weight)
        self.owned_ids = self.owned_ids.to(self.weight.device)
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.weight.detach()
        destination[prefix + "owned_ids"] = self.owned_ids

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,
                                      missing_keys, [], error_msgs)
        for k in state_dict:
            rest = k[len(prefix):]
            if k.startswith(prefix) and "." not in rest and rest not in self.sharded_state_keys:
                unexpected_keys.append(k)
        missing = [prefix + k for k in self.sharded_state_keys if prefix + k not in state_dict]
        if missing:
            missing_keys.extend(missing)
            return
        ids = state_dict[prefix + "owned_ids"]
        if not torch.equal(ids.cpu(), self.owned_ids.cpu()):
            raise PartitionError(
                f"DistEmbedding '{self.name}': the saved shard holds {ids.numel()} rows of "
                f"other nodes than this rank's {self.num_owned} (saved with another "
                f"partition or rank)")
        w = state_dict[prefix + "weight"]
        if tuple(w.shape) != tuple(self.weight.shape):
            error_msgs.append(f"size mismatch for {prefix}weight: saved {tuple(w.shape)}, "
                              f"this table {tuple(self.weight.shape)}")
            return
        with torch.no_grad():
            self.weight.copy_(w)

    def extra_repr(self) -> str:
        return (f"name={self.name!r}, num_nodes={self.num_nodes}, dim={self.dim}, "
                f"rank={self.rank}, num_owned={self.num_owned}, "
                f"grad_reduction={self.grad_reduction!r}")
