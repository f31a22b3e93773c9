"""What a training checkpoint holds: replicated ("dense") and per-rank ("shard") state.

A checkpoint of a run is two dictionaries (see :class:`CheckpointManager.save`):

* **dense** (written by rank 0, read by every rank): the model's replicated
  parameters and buffers, the dense optimizer state (Adam), and the run's bookkeeping
  that is the same on every rank (metrics history, early stopping, best model, args,
  config);
* **shard** (one per rank): what only this rank holds: the rows of every
  :class:`~tgl_dist.nn.DistEmbedding` (any state-dict key under a ``DistEmbedding``
  submodule), the sparse optimizer's rows, the node memory / mailbox of the owned
  nodes, the RNG states (Python, NumPy, torch) and the accumulators of a partial epoch.

This module splits live objects into those two parts and puts them back; the
training loops (``examples/ctdg/train_tgn.py``, :class:`tgl_dist.dtdg.Trainer`)
decide *when*. Worked example (TGN, 2 ranks, a checkpoint after train step 40)::

    dense = {"model": {...all parameters...}, "optim": {Adam state}, "loop": {history, stopper, ...}}
    shard (rank r) = {"model": {}, "optim": None, "mailbox": {memory [n_r, D], memory_ts [n_r],
                      mailbox [n_r, K, M], mail_ts [n_r, K], next_mail_pos [n_r]},
                      "rng": {...}, "partial": {"acc": run_epoch accumulators, "metrics": scores so far}}
    meta = {"epoch": 2, "step": 40, "global_step": 140, "done": False}
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from torch import nn

from tgl_dist.checkpoint.manager import rng_state, set_rng_state
from tgl_dist.errors import TGLDistError

Modules = Union[nn.Module, Sequence[nn.Module]]


def sharded_prefixes(module: nn.Module) -> List[str]:
    """State-dict prefixes (``'a.b.'``) of the :class:`DistEmbedding` submodules of ``module``."""
    from tgl_dist.nn.dist_embedding import DistEmbedding
    return [f"{name}." if name else "" for name, m in module.named_modules()
            if isinstance(m, DistEmbedding)]


def split_state_dict(module: nn.Module, state: Optional[Dict[str, Any]] = None
                     ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(dense, sharded)`` parts of ``module.state_dict()`` (or of a saved ``state``).

    A key is sharded when it lies under a :class:`DistEmbedding` submodule (each rank
    holds its own rows); every other key is replicated.
    """
    state = module.state_dict() if state is None else state
    pre = sharded_prefixes(module)
    sharded = {k: v for k, v in state.items() if any(k.startswith(p) for p in pre)}
    dense = {k: v for k, v in state.items() if k not in sharded}
    return dense, sharded


def load_split_state_dict(module: nn.Module, dense: Dict[str, Any], sharded: Dict[str, Any]) -> None:
    """Inverse of :func:`split_state_dict` (strict: every key must be present)."""
    module.load_state_dict({**dense, **sharded})


def _optim_parts(optimizer) -> Tuple[Any, Any]:
    if optimizer is None:
        return None, None
    s = optimizer.state_dict()
    if isinstance(s, dict) and set(s) == {"dense", "sparse"}:  # TrainOptimizer
        return s["dense"], s["sparse"]
    return s, None  # a plain torch optimizer (replicated)


def _load_optim(optimizer, dense, sparse) -> None:
    if optimizer is None:
        return
    if isinstance(optimizer.state_dict(), dict) and set(optimizer.state_dict()) == {"dense", "sparse"}:
        optimizer.load_state_dict({"dense": dense, "sparse": sparse})
    else:
        optimizer.load_state_dict(dense)


def capture(modules: Modules, optimizer=None, mailbox=None, rank: int = 0,
            loop: Optional[Dict[str, Any]] = None, partial: Optional[Dict[str, Any]] = None
            ) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """Take ``(dense, shard)`` from live training objects (every rank calls it).

    Args:
        modules: the model, or a list of modules (model and task head), saved in order.
        optimizer: a :class:`~tgl_dist.optim.build.TrainOptimizer` (its ``'dense'`` part
            goes to ``dense``, ``'sparse'`` to the shard) or a plain torch optimizer.
        mailbox: a :class:`~tgl_dist.memory.SharedMailBox` (this rank's owned nodes) or None.
        rank: this rank; ``dense`` is ``None`` on ranks other than 0 (saves copying).
        loop: replicated bookkeeping of the training loop (history, early stopping...).
        partial: this rank's accumulators of a partial epoch (or None).
    Returns:
        ``(dense or None, shard)``; they hold references to the live tensors (no copy):
        save them before the next training step.
    """
    mods = [modules] if isinstance(modules, nn.Module) else list(modules)
    parts = [split_state_dict(m) for m in mods]
    od, osp = _optim_parts(optimizer)
    shard = {"model": [p[1] for p in parts], "optim": osp,
             "mailbox": None if mailbox is None else mailbox.state_dict(),
             "rng": rng_state(), "partial": partial}
    dense = None
    if rank == 0:
        dense = {"model": [p[0] for p in parts], "optim": od, "loop": loop}
    return dense, shard


def restore(dense: Dict[str, Any], shard: Dict[str, Any], modules: Modules, optimizer=None,
            mailbox=None, rng: bool = True) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]]]:
    """Put a :func:`capture` back into live objects; returns ``(loop, partial)``.

    The RNG states are restored last (``rng=False`` skips them), so call it after the
    objects are built.

    Raises:
        TGLDistError: the checkpoint holds another number of modules, or mailbox
            state where this run has none (or the reverse).
    """
    mods = [modules] if isinstance(modules, nn.Module) else list(modules)
    if len(dense["model"]) != len(mods) or len(shard["model"]) != len(mods):
        raise TGLDistError(f"checkpoint holds {len(dense['model'])} modules, this run has {len(mods)}")
    for m, d, s in zip(mods, dense["model"], shard["model"]):
        load_split_state_dict(m, d, s)
    _load_optim(optimizer, dense["optim"], shard["optim"])
    if (mailbox is None) != (shard.get("mailbox") is None):
        raise TGLDistError("checkpoint and this run disagree on node memory (a mailbox in one only)")
    if mailbox is not None:
        mailbox.load_state_dict(shard["mailbox"])
    if rng:
        set_rng_state(shard["rng"])
    return dense.get("loop"), shard.get("partial")


def split_nested(modules: Modules, state: Dict[str, Any], keys: Iterable[str]
                 ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Split a saved ``{key: module.state_dict()}`` snapshot (e.g. a best-model copy)
    into dense and sharded parts, module ``i`` for ``keys[i]``; other entries of
    ``state`` (e.g. ``'optimizer'``, ``'epoch'``) go to the dense part except a
    :class:`TrainOptimizer` state's ``'sparse'`` half."""
    mods = [modules] if isinstance(modules, nn.Module) else list(modules)
    keys = list(keys)
    dense, sharded = {}, {}
    for k, v in state.items():
        if k in keys:
            dense[k], sharded[k] = split_state_dict(mods[keys.index(k)], v)
        elif isinstance(v, dict) and set(v) == {"dense", "sparse"}:
            dense[k], sharded[k] = {"dense": v["dense"]}, {"sparse": v["sparse"]}
        else:
            dense[k] = v
    return dense, sharded


def join_nested(dense: Dict[str, Any], sharded: Dict[str, Any]) -> Dict[str, Any]:
    """Inverse of :func:`split_nested`."""
    out = dict(dense)
    for k, v in sharded.items():
        out[k] = {**dense.get(k, {}), **v}
    return out


def config_dict(cfg: Any, drop: Sequence[Tuple[str, str]] = ()) -> Dict[str, Any]:
    """A dataclass config as a plain dict without the ``(section, field)`` pairs in ``drop``
    (e.g. ``('train', 'epoch')``, which a resumed run may raise)."""
    d = copy.deepcopy(dataclasses.asdict(cfg)) if dataclasses.is_dataclass(cfg) else dict(cfg)
    for sec, field in drop:
        if isinstance(d.get(sec), dict):
            d[sec].pop(field, None)
    return d


def partition_identity(manifest: Dict[str, Any]) -> Dict[str, Any]:
    """What identifies a partitioning (for ``run_meta``): dataset name and fingerprint,
    algorithm, part count, and one sha256 over every partition file's checksum (any
    repartitioning changes it)."""
    import hashlib
    out = {k: manifest.get(k) for k in ("name", "algorithm", "num_parts", "fingerprint")}
    files = manifest.get("files") or {}
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}:{files[name].get('sha256')}\n".encode())
    out["files_sha256"] = h.hexdigest()
    return out


__all__ = ["sharded_prefixes", "split_state_dict", "load_split_state_dict", "capture", "restore",
           "split_nested", "join_nested", "config_dict", "partition_identity"]
