"""Data-parallel training of the dense parameters: explicit gradient all-reduce.

Every rank holds a full copy of the dense parameters (updaters, attention, predictor).
:func:`broadcast_parameters` makes the copies equal at the start; after each
``backward()``, :func:`all_reduce_gradients` averages the gradients over ranks in one
flat all-reduce, so identical optimizer steps keep them equal. No-ops in a world of one.
"""
from __future__ import annotations

import torch
from torch import nn

from tgl_dist.dist import all_reduce_, broadcast_object, world


def broadcast_parameters(module: nn.Module, src: int = 0, group=None) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank (collective)."""
    if world(group)[1] == 1:
        return
    state = broadcast_object({k: v.detach().cpu() for k, v in module.state_dict().items()},
                             src, group)
    module.load_state_dict(state)


def all_reduce_gradients(module: nn.Module, group=None) -> None:
    """Average the gradients of ``module``'s parameters over ranks (one flat all-reduce).

    Parameters without a gradient on this rank count as zero gradient, so every rank
    contributes a buffer of the same size (collective).
    """
    ws = world(group)[1]
    if ws == 1:
        return
    params = [p for p in module.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in params])
    all_reduce_(flat, group=group)
    flat /= ws
    off = 0
    for p in params:
        n = p.numel()
        g = flat[off:off + n].view_as(p)
        if p.grad is None:
            p.grad = g.clone()
        else:
            p.grad.copy_(g)
        off += n
