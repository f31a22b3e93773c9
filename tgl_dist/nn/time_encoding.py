"""``TimeEncode``: the learnable cosine time encoding of TGAT / TGN / TGL.

.. math::
    \\phi(\\Delta) = \\cos(\\omega \\Delta + b), \\qquad
    \\omega_k = 10^{-9 k / (d - 1)},\\; b = 0 \\text{ at initialisation.}
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from tgl_dist.nn._pointwise import cosine_time_encoding


class TimeEncode(nn.Module):
    """Map time differences to ``dim`` cosine features (TGL's initialisation, learnable).

    Args:
        dim: output size ``d_t``.

    Shapes:
        input ``[*]`` (any float dtype; cast to float32), output ``[*, d_t]``.

    On CPU the compiled kernel of :mod:`tgl_dist.nn._pointwise` computes it (forward
    and backward; torch's ``cos`` slows down on the large arguments raw time gaps give).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.w = nn.Linear(1, dim)
        with torch.no_grad():
            self.w.weight.copy_(torch.from_numpy(
                1 / 10 ** np.linspace(0, 9, dim, dtype=np.float32)).reshape(dim, 1))
            self.w.bias.zero_()

    def forward(self, dt: Tensor, prefix: Optional[Tensor] = None) -> Tensor:
        """``phi(dt)`` ``[*, d_t]``; with ``prefix [n, F]`` (``dt [n]``) the row-wise
        concatenation ``[prefix || phi(dt)]`` ``[n, F + d_t]``, written in place (no copy)."""
        shape = dt.shape
        out = cosine_time_encoding(dt.reshape(-1).float(), self.w.weight.view(-1), self.w.bias,
                                   prefix)
        return out if prefix is not None else out.reshape(*shape, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
