"""``SparseAdam``: Adam on the touched rows of :class:`DistEmbedding` tables, per-row state."""
from __future__ import annotations

import math
from typing import Dict, Iterable, Tuple

import torch
from torch import Tensor

from tgl_dist.nn.dist_embedding import DistEmbedding, empty_rows
from tgl_dist.optim.base import SparseOptimizer


class SparseAdam(SparseOptimizer):
    r"""Adam for sharded embeddings: only rows that received gradient change.

    Each owner sums the gradient rows of duplicate ids (see
    :class:`~tgl_dist.optim.base.SparseOptimizer`) and then, for each touched row
    :math:`i` with summed gradient :math:`g_i` and step count :math:`t_i`:

    .. math::
        m_i &\leftarrow \beta_1 m_i + (1-\beta_1) g_i, \qquad
        v_i \leftarrow \beta_2 v_i + (1-\beta_2) g_i^2 \\
        w_i &\leftarrow w_i - \mathrm{lr}\,\frac{\sqrt{1-\beta_2^{t_i}}}{1-\beta_1^{t_i}}
              \cdot \frac{m_i}{\sqrt{v_i} + \epsilon}

    (Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015), written
    in the same order of operations as ``torch.optim.SparseAdam``. Rows that receive
    no gradient keep their values, moments and step count (no decay of the moments).

    Args:
        params: :class:`DistEmbedding` tables.
        lr: learning rate (default: ``1e-3``).
        betas: :math:`(\beta_1, \beta_2)` (default: ``(0.9, 0.999)``).
        eps: :math:`\epsilon` (default: ``1e-8``).
        step_count: how :math:`t_i` is counted (default: ``"row"``):

            - ``"row"``: each row counts the steps in which *it* received gradient
              (state ``step`` of shape ``[n_owned]``). A row first touched late gets
              the full bias correction of a fresh row, as in DGL's sparse Adam.
            - ``"global"``: one counter per table, increased by every ``step()`` in which
              any rank recorded a gradient for the table (state ``step`` of shape ``[]``);
              this is ``torch.optim.SparseAdam``'s convention.

            Both give the same result as ``torch.optim.SparseAdam`` when every touched
            row is touched in every step; ``"global"`` matches it always.

    State per table on each rank (its own rows only): ``exp_avg`` and ``exp_avg_sq``
    ``[n_owned, D]`` (preallocated, zero) and ``step``.
    """

    hyper_names = ("lr", "betas", "eps", "step_count")
    structural_names = ("step_count",)

    def __init__(self, params: Iterable[DistEmbedding], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 step_count: str = "row") -> None:
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"invalid betas {betas}: each must be in [0, 1)")
        if not eps > 0.0:
            raise ValueError(f"invalid eps {eps}: must be > 0")
        if step_count not in ("row", "global"):
            raise ValueError(f"step_count must be 'row' or 'global', got {step_count!r}")
        self.betas = (float(betas[0]), float(betas[1]))
        self.eps = float(eps)
        self.step_count = step_count
        self.needs_global_grad_flag = step_count == "global"
        super().__init__(params, lr)

    def init_state(self, emb: DistEmbedding) -> Dict[str, Tensor]:
        w = emb.weight
        step = (empty_rows(w.size(0), 1, torch.long, w.device).zero_().view(-1)
                if self.step_count == "row" else torch.zeros((), dtype=torch.long))
        zeros = lambda: empty_rows(w.size(0), w.size(1), w.dtype, w.device).zero_()  # noqa: E731
        return {"step": step, "exp_avg": zeros(), "exp_avg_sq": zeros()}

    def begin_step(self, emb: DistEmbedding, any_grad: bool) -> None:
        if any_grad:  # torch.optim.SparseAdam counts a step whenever the parameter has a grad
            self.state[emb.name]["step"] += 1

    def update(self, emb: DistEmbedding, rows: Tensor, grad: Tensor,
               state: Dict[str, Tensor]) -> None:
        beta1, beta2 = self.betas
        if self.step_count == "row":
            step = state["step"]
            step.index_add_(0, rows, torch.ones_like(rows, dtype=step.dtype))
            t = step.index_select(0, rows).to(torch.float64)
            bc1 = 1.0 - torch.pow(beta1, t)
            bc2 = 1.0 - torch.pow(beta2, t)
            step_size = (self.lr * bc2.sqrt() / bc1).to(grad.dtype).view(-1, 1)
        else:
            t = int(state["step"])
            step_size = self.lr * math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)
        exp_avg, exp_avg_sq, w = state["exp_avg"], state["exp_avg_sq"], emb.weight
        # index_select / index_add_: row gathers and scatters, several times faster than
        # advanced indexing or index_copy_; ``rows`` are unique, so ``t.index_add_(0, rows,
        # u)`` sets ``t[rows] = t[rows] + u``, the same sum torch's SparseAdam computes.
        old_m = exp_avg.index_select(0, rows)
        upd_m = (grad - old_m).mul_(1.0 - beta1)
        old_v = exp_avg_sq.index_select(0, rows)
        upd_v = (grad * grad).sub_(old_v).mul_(1.0 - beta2)
        exp_avg.index_add_(0, rows, upd_m)
        exp_avg_sq.index_add_(0, rows, upd_v)
        numer = upd_m.add_(old_m)
        denom = upd_v.add_(old_v).sqrt_().add_(self.eps)
        w.index_add_(0, rows, numer.div_(denom).mul_(-step_size))
