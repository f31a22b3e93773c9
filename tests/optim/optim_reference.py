"""Shared pieces of the sparse-optimizer tests: batches, the loss, reference runs with torch."""
from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor

# One lookup pair per rank and step: (ids_a [n], w_a [n, 1], ids_b [m], w_b [m, 1]).
Batch = Tuple[Tensor, Tensor, Tensor, Tensor]


def make_batches(steps: int, world_size: int, touched: int, seed: int,
                 same_rows_each_step: bool = False) -> List[List[Batch]]:
    """``batches[step][rank]``: ids in ``[0, touched)`` with duplicates; rank 1 is empty at step 1.

    With ``same_rows_each_step`` the union over ranks of every step is exactly
    ``0 .. touched-1`` (each row touched in every step), still with duplicates.
    """
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in range(steps):
        per_rank = []
        for r in range(world_size):
            if r == 1 and s == 1:
                per_rank.append((torch.empty(0, dtype=torch.long), torch.empty(0, 1),
                                 torch.empty(0, dtype=torch.long), torch.empty(0, 1)))
                continue
            if same_rows_each_step:
                share = torch.arange(r, touched, world_size)
                if s == 1 and r == 0 and world_size > 1:  # rank 1 is empty: take its rows
                    share = torch.cat([share, torch.arange(1, touched, world_size)])
                a = torch.cat([share, share[torch.randint(0, share.numel(), (4,), generator=g)]])
                a = a[torch.randperm(a.numel(), generator=g)]
            else:
                a = torch.randint(0, touched, (9,), generator=g)
                a = torch.cat([a, a[:3]])  # certain duplicates
            b = torch.randint(0, touched, (5,), generator=g)
            per_rank.append((a, torch.rand(a.numel(), 1, generator=g) + 0.5,
                             b, torch.rand(b.numel(), 1, generator=g) - 0.5))
        out.append(per_rank)
    return out


def merged(batches: List[List[Batch]]) -> List[Batch]:
    """The same steps in a world of one: every rank's lookups concatenated."""
    return [tuple(torch.cat([b[k] for b in step]) for k in range(4)) for step in batches]


def loss_fn(rows_a: Tensor, w_a: Tensor, rows_b: Tensor, w_b: Tensor) -> Tensor:
    """A loss that is a sum over looked-up rows (so ranks' gradients add up)."""
    return (w_a * (rows_a - 0.3) ** 2).sum() + (w_b * torch.tanh(rows_b)).sum()


def run_torch_sparse_adam(init: Tensor, batches: List[Batch], **kw) -> Tensor:
    """``nn.Embedding(sparse=True)`` + ``torch.optim.SparseAdam``; returns the final table."""
    ref = torch.nn.Embedding(init.size(0), init.size(1), sparse=True)
    with torch.no_grad():
        ref.weight.copy_(init)
    opt = torch.optim.SparseAdam(ref.parameters(), **kw)
    for a, wa, b, wb in batches:
        opt.zero_grad()
        loss_fn(ref(a), wa, ref(b), wb).backward()
        opt.step()
    return ref.weight.detach().clone()


def run_torch_dense_adagrad(init: Tensor, batches: List[Batch], **kw) -> Tensor:
    """Dense ``torch.optim.Adagrad`` on a full copy (untouched rows get zero gradient)."""
    p = torch.nn.Parameter(init.clone())
    opt = torch.optim.Adagrad([p], **kw)
    for a, wa, b, wb in batches:
        opt.zero_grad()
        loss_fn(p[a], wa, p[b], wb).backward()
        opt.step()
    return p.detach().clone()


def run_dist(emb, opt, batches: List[Batch]) -> None:
    """Train a DistEmbedding with a sparse optimizer over this rank's batches."""
    for a, wa, b, wb in batches:
        opt.zero_grad()
        loss_fn(emb(a), wa, emb(b), wb).backward()
        opt.step()
