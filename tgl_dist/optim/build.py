"""``build_optimizer``: one optimizer object for a model's dense parameters and its sharded tables.

Dense parameters (updaters, attention, predictor, snapshot GNN weights) are replicated on
every rank and trained data-parallel with Adam (:class:`tgl_dist.optim.Adam`:
``torch.optim.Adam``, stepped by one compiled pass on the CPU). Sharded tables
(:class:`tgl_dist.nn.DistEmbedding`, each rank holding its own rows) are trained with a
sparse optimizer from :mod:`tgl_dist.optim` that touches only the rows a step used.
:class:`TrainOptimizer` drives both with the usual ``zero_grad()`` / ``step()`` calls, so
training loops do not need to know whether a model has sharded parts.

Checkpoints: ``state_dict()`` returns ``{'dense': ..., 'sparse': ...}``; ``'dense'`` is the
same on every rank (save it from one), ``'sparse'`` holds this rank's rows only (save it
per rank).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
from torch import nn

from tgl_dist.nn.dist_embedding import DistEmbedding
from tgl_dist.optim.adam import Adam
from tgl_dist.optim.sparse_adagrad import SparseAdagrad
from tgl_dist.optim.sparse_adam import SparseAdam


def sharded_modules(modules: Union[nn.Module, Sequence[nn.Module]]) -> List[DistEmbedding]:
    """The :class:`DistEmbedding` tables inside ``modules``, in a rank-independent order."""
    mods = [modules] if isinstance(modules, nn.Module) else list(modules)
    found = [m for mod in mods for m in mod.modules() if isinstance(m, DistEmbedding)]
    return sorted({id(m): m for m in found}.values(), key=lambda m: m.name)


class TrainOptimizer:
    """Adam for dense parameters + a sparse optimizer for sharded tables, stepped together.

    Args:
        dense: optimizer over the dense parameters (``None`` when there are none).
        sparse: :class:`tgl_dist.optim.SparseOptimizer` over the sharded tables, or ``None``.

    ``step()`` is a collective when ``sparse`` is set (gradient rows travel to their
    owners): every rank calls it at every step.
    """

    def __init__(self, dense: Optional[torch.optim.Optimizer], sparse=None) -> None:
        if dense is None and sparse is None:
            raise ValueError("TrainOptimizer needs dense parameters or sharded tables")
        self.dense, self.sparse = dense, sparse

    @property
    def param_groups(self):
        """The dense optimizer's parameter groups (e.g. to change the learning rate)."""
        return self.dense.param_groups if self.dense is not None else []

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.dense is not None:
            self.dense.zero_grad(set_to_none=set_to_none)
        if self.sparse is not None:
            self.sparse.zero_grad()

    def step(self) -> None:
        if self.dense is not None:
            self.dense.step()
        if self.sparse is not None:
            self.sparse.step()

    def state_dict(self) -> dict:
        """``{'dense': same on all ranks, 'sparse': this rank's rows only}``."""
        return {"dense": None if self.dense is None else self.dense.state_dict(),
                "sparse": None if self.sparse is None else self.sparse.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for part in ("dense", "sparse"):
            mine, saved = getattr(self, part), state.get(part)
            if (mine is None) != (saved is None):
                raise ValueError(f"optimizer state has {'no ' if saved is None else ''}{part} "
                                 f"part but this model has {'none' if mine is None else 'one'}")
            if mine is not None:
                mine.load_state_dict(saved)


SPARSE_OPTIMIZERS = ("adam", "adagrad")


def _sparse_settings(tables: List[DistEmbedding], lr: float, sparse_lr: Optional[float],
                     sparse_optimizer: Optional[str]):
    """The one (optimizer name, lr) all ``tables`` use: explicit arguments, then the tables'
    ``sparse_optim`` hints, then ``('adam', lr)``."""
    names = {t.sparse_optim.get("optimizer") for t in tables} - {None}
    lrs = {float(t.sparse_optim["lr"]) for t in tables if t.sparse_optim.get("lr") is not None}
    if sparse_optimizer is None and len(names) > 1:
        raise ValueError(f"build_optimizer: the sharded tables ask for different sparse "
                         f"optimizers {sorted(names)}; pass sparse_optimizer=")
    if sparse_lr is None and len(lrs) > 1:
        raise ValueError(f"build_optimizer: the sharded tables ask for different learning "
                         f"rates {sorted(lrs)}; pass sparse_lr=")
    name = sparse_optimizer or (names.pop() if names else "adam")
    if name not in SPARSE_OPTIMIZERS:
        raise ValueError(f"build_optimizer: unknown sparse optimizer {name!r}; known: "
                         f"{list(SPARSE_OPTIMIZERS)}")
    return name, float(sparse_lr if sparse_lr is not None else (lrs.pop() if lrs else lr))


def _dense_adam(params: List[nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Adam:
    """:class:`tgl_dist.optim.Adam`: ``torch.optim.Adam`` with the fused kernel where the
    parameters allow it (floating point, on CPU or CUDA; on CPU float32 stepped by one
    compiled pass over all tensors, the same bits), else the ``foreach`` form."""
    return Adam(params, lr=lr, weight_decay=weight_decay)


def build_optimizer(modules: Union[nn.Module, Sequence[nn.Module]], lr: float,
                    weight_decay: float = 0.0, sparse_lr: Optional[float] = None,
                    sparse_optimizer: Optional[str] = None) -> TrainOptimizer:
    """Adam over the dense parameters of ``modules``; a sparse optimizer over their sharded tables.

    Args:
        modules: the model (or model and task head).
        lr: dense learning rate.
        weight_decay: dense Adam weight decay (the sparse optimizers have none).
        sparse_lr: the tables' learning rate. Default: the ``'lr'`` of the tables'
            ``sparse_optim`` hint (set by the model builders from the config's
            ``node_embedding`` section), else ``lr``.
        sparse_optimizer: ``'adam'`` (:class:`tgl_dist.optim.SparseAdam`) or
            ``'adagrad'`` (:class:`tgl_dist.optim.SparseAdagrad`). Default: the tables'
            ``sparse_optim['optimizer']`` hint, else ``'adam'``. All tables share one
            sparse optimizer: conflicting hints raise ``ValueError``.
    """
    mods = [modules] if isinstance(modules, nn.Module) else list(modules)
    seen, params = set(), []
    for m in mods:
        for p in m.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    dense = _dense_adam(params, lr, weight_decay) if params else None
    tables = sharded_modules(mods)
    sparse = None
    if tables:
        name, table_lr = _sparse_settings(tables, lr, sparse_lr, sparse_optimizer)
        sparse = (SparseAdam if name == "adam" else SparseAdagrad)(tables, lr=table_lr)
    return TrainOptimizer(dense, sparse)
