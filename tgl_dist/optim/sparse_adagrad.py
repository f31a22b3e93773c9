"""``SparseAdagrad``: Adagrad on the touched rows of :class:`DistEmbedding` tables."""
from __future__ import annotations

from typing import Dict, Iterable

from torch import Tensor

from tgl_dist.nn.dist_embedding import DistEmbedding, empty_rows
from tgl_dist.optim.base import SparseOptimizer


class SparseAdagrad(SparseOptimizer):
    r"""Adagrad for sharded embeddings: only rows that received gradient change.

    Each owner sums the gradient rows of duplicate ids (see
    :class:`~tgl_dist.optim.base.SparseOptimizer`) and then, for each touched row
    :math:`i` with summed gradient :math:`g_i`:

    .. math::
        s_i \leftarrow s_i + g_i^2, \qquad
        w_i \leftarrow w_i - \mathrm{lr}\,\frac{g_i}{\sqrt{s_i} + \epsilon}

    (Duchi et al., "Adaptive Subgradient Methods", JMLR 2011). This equals
    ``torch.optim.Adagrad`` (``lr_decay=0``, ``weight_decay=0``) on a dense copy of the
    table whose untouched rows get a zero gradient, since those rows do not move there
    either.

    Args:
        params: :class:`DistEmbedding` tables.
        lr: learning rate (default: ``1e-2``).
        eps: :math:`\epsilon` (default: ``1e-10``).
        initial_accumulator_value: starting value of :math:`s` (default: ``0``).

    State per table on each rank (its own rows only): ``sum`` ``[n_owned, D]``.
    """

    hyper_names = ("lr", "eps", "initial_accumulator_value")

    def __init__(self, params: Iterable[DistEmbedding], lr: float = 1e-2, eps: float = 1e-10,
                 initial_accumulator_value: float = 0.0) -> None:
        if not eps >= 0.0:
            raise ValueError(f"invalid eps {eps}: must be >= 0")
        if not initial_accumulator_value >= 0.0:
            raise ValueError(f"invalid initial_accumulator_value {initial_accumulator_value}: "
                             "must be >= 0")
        self.eps = float(eps)
        self.initial_accumulator_value = float(initial_accumulator_value)
        super().__init__(params, lr)

    def init_state(self, emb: DistEmbedding) -> Dict[str, Tensor]:
        w = emb.weight
        return {"sum": empty_rows(w.size(0), w.size(1), w.dtype, w.device)
                .fill_(self.initial_accumulator_value)}

    def update(self, emb: DistEmbedding, rows: Tensor, grad: Tensor,
               state: Dict[str, Tensor]) -> None:
        acc = state["sum"]
        sq = grad * grad
        s = acc.index_select(0, rows).add_(sq)
        acc.index_add_(0, rows, sq)  # rows are unique: acc[rows] += g^2
        std = s.sqrt_().add_(self.eps)
        emb.weight.index_add_(0, rows, (grad / std).mul_(-self.lr))
