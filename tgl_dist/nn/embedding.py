"""Embedding modules without neighbours: identity (LayerNorm) and JODIE's time projection.

TGL (``layers.py``): ``IdentityNormLayer`` is ``LayerNorm(h)``; JODIE's projection
multiplies it by ``1 + Linear(dt~)`` with ``dt~ = (t - memory_ts) / (t + 1)``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class IdentityEmbedding(nn.Module):
    """``LayerNorm(h)``.

    Args:
        dim: size of ``h``.

    Shapes: ``h [N, dim] -> [N, dim]``.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, h: Tensor) -> Tensor:
        return self.norm(h)


class JODIETimeProjection(nn.Module):
    """JODIE's projection of a node representation forward in time.

    .. math::
        \\mathrm{emb} = \\mathrm{LayerNorm}(h) \\odot (1 + W \\tilde\\Delta + b),
        \\quad \\tilde\\Delta = (t - t_{\\mathrm{mem}}) / (t + 1)

    ``W, b`` (a 1 -> dim linear map) are drawn from ``N(0, 1/sqrt(fan_in)) = N(0, 1)``
    as in TGL's ``NormalLinear`` (Kumar et al. 2019, JODIE).

    Args:
        dim: size of ``h``.

    Shapes: ``h [N, dim]``, ``ts [N]`` query times, ``mem_ts [N]`` last memory
    update times (float64 or float32) ``-> [N, dim]``.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.time_emb = nn.Linear(1, dim)
        std = 1.0 / math.sqrt(self.time_emb.weight.size(1))
        with torch.no_grad():
            self.time_emb.weight.normal_(0, std)
            self.time_emb.bias.normal_(0, std)

    def forward(self, h: Tensor, ts: Tensor, mem_ts: Tensor) -> Tensor:
        dt = ((ts - mem_ts) / (ts + 1)).float().view(-1, 1)
        return self.norm(h) * (1 + self.time_emb(dt))
