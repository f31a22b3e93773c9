"""Data-parallel training of the dense parameters: explicit gradient all-reduce.

Every rank holds a full copy of the dense parameters (updaters, attention, predictor).
:func:`broadcast_parameters` makes the copies equal at the start; after each
``backward()``, :func:`all_reduce_gradients` averages the gradients over ranks in one
flat all-reduce (optionally started asynchronously, to overlap other collectives), so
identical optimizer steps keep them equal. No-ops in a world of one.

Sharded tables (:class:`tgl_dist.nn.DistEmbedding`) are not dense parameters: they are
neither broadcast nor all-reduced. Their gradient rows go to the owning rank in the
sparse optimizer's ``step()``; a table built with ``grad_reduction='mean'`` (what
:func:`tgl_dist.ctdg.build_model` does) divides the sum of the ranks' rows by the world
size there, matching the averaging of the dense gradients here.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Set

import torch
from torch import nn

from tgl_dist.dist import Pending, all_reduce_async, broadcast_object, world


def sharded_state_keys(module: nn.Module) -> Set[str]:
    """``state_dict`` keys of the sharded tables inside ``module``.

    A submodule is sharded when its class names its per-rank state keys in a
    ``sharded_state_keys`` attribute (:class:`tgl_dist.nn.DistEmbedding` does: its
    ``weight`` and ``owned_ids``); their values differ between ranks by design (each rank
    holds its own rows). The attribute keeps ``dist`` free of model classes.
    """
    keys = set()
    for prefix, m in module.named_modules():
        own = getattr(type(m), "sharded_state_keys", None)
        if own:
            p = f"{prefix}." if prefix else ""
            keys.update(p + k for k in own)
    return keys


def broadcast_parameters(module: nn.Module, src: int = 0, group=None) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (collective).

    Sharded tables (:class:`tgl_dist.nn.DistEmbedding`) are left alone: each rank holds
    different rows, and their default initialisation already gives a node the same row
    whatever the partition.
    """
    if world(group)[1] == 1:
        return
    skip = sharded_state_keys(module)
    state = broadcast_object({k: v.detach().cpu() for k, v in module.state_dict().items()
                              if k not in skip}, src, group)
    missing, unexpected = module.load_state_dict(state, strict=False)
    wrong = sorted(set(missing) - skip) + sorted(unexpected)
    if wrong:
        raise RuntimeError(f"broadcast_parameters: rank {src}'s model differs from this "
                           f"rank's (keys {wrong[:5]})")


class PendingGradients:
    """Gradients being reduced over ranks (:func:`reduce_gradients` with ``async_op``).

    ``wait()`` blocks until the all-reduce is done and writes the sums (divided by
    ``divisor``) into the parameters' ``.grad``; until then they hold this rank's values.
    """

    def __init__(self, params: List[nn.Parameter], flat: Optional[Pending], divisor: int,
                 check: bool = True) -> None:
        self.params, self.flat, self.divisor, self.check = params, flat, divisor, check

    def wait(self) -> None:
        if self.flat is None:
            return
        flat, self.flat = self.flat.wait(), None
        # ranks that had a gradient, per parameter; read (a device sync on GPUs) only when
        # this rank lacked one: else every count is >= 1
        present = (flat[-len(self.params):].tolist() if self.check
                   else [1.0] * len(self.params))
        if self.divisor != 1:
            flat /= self.divisor
        off = 0
        for p, k in zip(self.params, present):
            n = p.numel()
            if k == 0:      # no rank had one: no gradient, as in one process (Adam skips it)
                p.grad = None
            elif p.grad is None:
                p.grad = flat[off:off + n].view_as(p).clone()
            else:
                p.grad.copy_(flat[off:off + n].view_as(p))
            off += n


def reduce_gradients(params: Iterable[nn.Parameter], group=None, average: bool = True,
                     async_op: bool = False) -> Optional[PendingGradients]:
    """Sum (``average=False``) or average the gradients of ``params`` over ranks, in one
    flat all-reduce (collective).

    Parameters without a gradient on this rank count as zero gradient, so every rank
    contributes a buffer of the same size; one without a gradient on EVERY rank keeps
    none (``grad = None``), as it would in one process, so Adam skips it there too (a
    zero gradient would still move it by its momentum). CTDG training averages
    (:func:`all_reduce_gradients`); the DTDG trainer sums, its losses being normalised by
    global counts already. With ``async_op=True`` it returns at once a
    :class:`PendingGradients`; call its ``wait()`` before the optimizer step.
    """
    ws = world(group)[1]
    params = [] if ws == 1 else list(params)   # a world of one: not even listed
    if not params:
        return PendingGradients([], None, 1) if async_op else None
    has = [p.grad is not None for p in params]
    flat = torch.cat([(p.grad if h else torch.zeros_like(p)).reshape(-1)
                      for p, h in zip(params, has)]
                     + [torch.tensor(has, dtype=params[0].dtype, device=params[0].device)])
    pending = PendingGradients(params, all_reduce_async(flat, group), ws if average else 1,
                               check=not all(has))
    if async_op:
        return pending
    pending.wait()
    return None


def all_reduce_gradients(module: nn.Module, group=None,
                         async_op: bool = False) -> Optional[PendingGradients]:
    """Average the gradients of ``module``'s parameters over ranks (one flat all-reduce).

    Parameters without a gradient on this rank count as zero gradient, so every rank
    contributes a buffer of the same size; one without a gradient on every rank keeps
    none (collective).

    With ``async_op=True`` it returns at once a :class:`PendingGradients`; call its
    ``wait()`` before the optimizer step. Other collectives can run meanwhile:
    :func:`tgl_dist.ctdg.run_epoch` writes the mailbox back while the gradients travel
    (on gloo the two proceed together; measured in ``benchmarks/RESULTS.md``).
    """
    return reduce_gradients((p for p in module.parameters() if p.requires_grad), group,
                            average=True, async_op=async_op)
