"""``SparseOptimizer``: the base of the sparse optimizers for :class:`DistEmbedding`.

The base class owns the exchange; subclasses own the math (as in DGL's
``SparseGradOptimizer``): ``step()`` sends every recorded ``(global id, gradient
row)`` to the owner of the id, the owner deduplicates the incoming ids and **sums**
the gradient rows of duplicates (the same id looked up twice in a batch, in two
lookups, or on two ranks), then calls :meth:`SparseOptimizer.update` with unique
local rows only. A table built with ``grad_reduction='mean'`` divides that sum by
the world size of its group (to match data-parallel loops that average the dense
gradients over ranks). Cost per step grows with the number of touched rows, not with the
table size.

Worked example (2 ranks, owners ``[0, 1, 0, 1]``)::

    rank 0 recorded ids [3, 0] grads [a, b]     rank 1 recorded ids [0] grads [c]
    step(): rank 0 receives local rows [0 (node 0, from 0), 0 (node 0, from 1)]
            -> unique [0], summed grad [b + c] -> update(rows=[0], grad=[b + c])
            rank 1 receives local row [1 (node 3, from 0)] -> update(rows=[1], grad=[a])
"""
from __future__ import annotations

import logging
from typing import Dict, Iterable, List

import torch
from torch import Tensor

from tgl_dist.dist import all_reduce_, push_rows
from tgl_dist.errors import PartitionError
from tgl_dist.nn.dist_embedding import DistEmbedding

log = logging.getLogger(__name__)

STATE_FORMAT_VERSION = 1


class SparseOptimizer:
    """Base class: gradient exchange, per-row state bookkeeping, ``state_dict``.

    Args:
        params: the :class:`DistEmbedding` tables to optimise (unique names).
        lr: learning rate.

    Subclasses implement :meth:`init_state` (per-row state tensors for the local
    rows, preallocated; first dimension ``n_owned``) and :meth:`update`.

    ``step()`` and ``state_dict()`` are per rank; ``step()`` is a collective: every
    rank of each table's group calls it, also with no gradient (it then sends and
    receives empty tensors). The tables are processed in the order given, which
    must be the same on every rank.
    """

    #: names of the hyper-parameters saved in ``state_dict`` and checked on load
    hyper_names: tuple = ("lr",)
    #: hyper-parameters that shape the state: a saved state must have the same values
    structural_names: tuple = ()

    def __init__(self, params: Iterable[DistEmbedding], lr: float) -> None:
        embs = list(params.values()) if isinstance(params, dict) else list(params)
        if not embs:
            raise ValueError(f"{type(self).__name__} got an empty list of embeddings")
        for e in embs:
            if not isinstance(e, DistEmbedding):
                raise TypeError(f"{type(self).__name__} optimises DistEmbedding tables only, "
                                f"got {type(e).__name__} (use a torch.optim optimizer for "
                                "dense parameters)")
        names = [e.name for e in embs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"{type(self).__name__}: embedding names must be unique, "
                             f"repeated: {dup}")
        if not float(lr) > 0.0:
            raise ValueError(f"invalid learning rate: {lr} (must be > 0)")
        self.lr = float(lr)
        self.embeddings: List[DistEmbedding] = embs
        self.state: Dict[str, Dict[str, Tensor]] = {
            e.name: self.init_state(e) for e in embs}

    # --------------------------------------------------------------- subclass
    def init_state(self, emb: DistEmbedding) -> Dict[str, Tensor]:
        """Per-row state for ``emb``'s local rows (each tensor ``[n_owned, ...]``)."""
        raise NotImplementedError

    def update(self, emb: DistEmbedding, rows: Tensor, grad: Tensor,
               state: Dict[str, Tensor]) -> None:
        """Update local ``rows`` (unique, ``[u]``) of ``emb.weight`` with ``grad`` ``[u, D]``."""
        raise NotImplementedError

    def begin_step(self, emb: DistEmbedding, any_grad: bool) -> None:
        """Hook called on every rank before ``update`` (``any_grad``: some rank had gradients).

        Only called when :attr:`needs_global_grad_flag` is true (it costs one all-reduce).
        """

    needs_global_grad_flag: bool = False

    # ------------------------------------------------------------------- step
    @torch.no_grad()
    def step(self) -> None:
        """Send recorded gradients to their owners and update the touched rows (collective)."""
        for emb in self.embeddings:
            _, owner, local, grad = emb.take_routed_grads()
            if self.needs_global_grad_flag:
                flag = torch.tensor([1 if emb.has_grad else 0], dtype=torch.long)
                self.begin_step(emb, bool(int(all_reduce_(flag, group=emb.group)) > 0))
            dev = emb.weight.device
            rows, g = push_rows(owner.to(dev), local.to(dev), grad.to(dev), group=emb.group)
            if rows.numel() == 0:
                continue
            uniq, inverse = torch.unique(rows, return_inverse=True)
            summed = g.new_zeros(uniq.numel(), emb.dim).index_add_(0, inverse, g)
            if emb.grad_reduction == "mean" and emb.world_size > 1:
                summed /= emb.world_size
            self.update(emb, uniq, summed, self.state[emb.name])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradient rows recorded by the tables' backward passes (local, no collective)."""
        for emb in self.embeddings:
            emb.clear_grads()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """This rank's optimizer state: hyper-parameters and the per-row state of its own rows.

        The table rows themselves are module state: save them with
        ``DistEmbedding.state_dict()``.
        """
        return {
            "format_version": STATE_FORMAT_VERSION,
            "type": type(self).__name__,
            "hyper": {k: getattr(self, k) for k in self.hyper_names},
            "state": {e.name: {"owned_ids": e.owned_ids.clone(),
                               **{k: v.clone() for k, v in self.state[e.name].items()}}
                      for e in self.embeddings},
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what :meth:`state_dict` returned on this rank (same tables and partition)."""
        me = type(self).__name__
        ver = state_dict.get("format_version")
        if ver != STATE_FORMAT_VERSION:
            raise ValueError(f"{me}.load_state_dict: format_version {ver!r} is not the "
                             f"supported {STATE_FORMAT_VERSION}")
        if state_dict.get("type") != me:
            raise ValueError(f"{me}.load_state_dict: the state was saved by "
                             f"{state_dict.get('type')!r}, not {me}")
        for k in self.structural_names:
            if k in state_dict["hyper"] and state_dict["hyper"][k] != getattr(self, k):
                raise ValueError(f"{me}.load_state_dict: the state was saved with {k}="
                                 f"{state_dict['hyper'][k]!r}, this optimizer has "
                                 f"{k}={getattr(self, k)!r}")
        saved = state_dict["state"]
        names = sorted(e.name for e in self.embeddings)
        if sorted(saved) != names:
            raise ValueError(f"{me}.load_state_dict: saved embeddings {sorted(saved)} "
                             f"do not match this optimizer's {names}")
        new_state: Dict[str, Dict[str, Tensor]] = {}
        for e in self.embeddings:
            s = saved[e.name]
            if not torch.equal(s["owned_ids"].cpu(), e.owned_ids.cpu()):
                raise PartitionError(f"{me}.load_state_dict: state of '{e.name}' was saved for "
                                     f"{s['owned_ids'].numel()} other rows than this rank's "
                                     f"{e.num_owned} (another partition or rank)")
            cur = self.state[e.name]
            for k, v in cur.items():
                if k not in s or tuple(s[k].shape) != tuple(v.shape):
                    got = tuple(s[k].shape) if k in s else "missing"
                    raise ValueError(f"{me}.load_state_dict: '{e.name}' state '{k}' has shape "
                                     f"{got}, expected {tuple(v.shape)}")
            new_state[e.name] = {k: s[k].to(v.device, v.dtype).clone() for k, v in cur.items()}
        for k in self.hyper_names:
            if k in state_dict["hyper"]:
                setattr(self, k, state_dict["hyper"][k])
        self.state = new_state

    def __repr__(self) -> str:
        hp = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.hyper_names)
        return f"{type(self).__name__}({[e.name for e in self.embeddings]}, {hp})"
