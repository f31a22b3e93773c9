"""``EdgePredictor``: the link scorer of TGL and PyG's TGN example.

.. math::
    \\mathrm{logit}(u, v) = w_o^\\top \\mathrm{ReLU}(W_s h_u + b_s + W_d h_v + b_d) + b_o
"""
from __future__ import annotations

from typing import Tuple

import torch
from torch import Tensor, nn


class EdgePredictor(nn.Module):
    """Score positive and negative destinations of each source.

    Args:
        dim: embedding size d.

    Shapes:
        ``forward(h_src [B, d], h_pos [B, d], h_neg [k*B, d])`` returns logits
        ``([B], [k*B])``. Negatives are laid out negative-major (TGL's ``tile``):
        row ``j*B + i`` is the j-th negative of positive i, and reuses source i's
        projection.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.src_fc = nn.Linear(dim, dim)
        self.dst_fc = nn.Linear(dim, dim)
        self.out_fc = nn.Linear(dim, 1)

    def forward(self, h_src: Tensor, h_pos: Tensor, h_neg: Tensor) -> Tuple[Tensor, Tensor]:
        B = h_src.size(0)
        s = self.src_fc(h_src)
        d = self.dst_fc(torch.cat([h_pos, h_neg], 0))
        k = h_neg.size(0) // max(B, 1)
        s_all = torch.cat([s, s.repeat(k, 1)], 0) if k else s
        logits = self.out_fc(torch.relu(s_all + d)).view(-1)
        return logits[:B], logits[B:]
