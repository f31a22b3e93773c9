"""``EdgePredictor``: the link scorer of TGL and PyG's TGN example.

.. math::
    \\mathrm{logit}(u, v) = w_o^\\top \\mathrm{ReLU}(W_s h_u + b_s + W_d h_v + b_d) + b_o

:meth:`EdgePredictor.score` computes the same logits from rows of one embedding table as
ONE autograd node (:class:`ScoreRows`): the row gathers, the three products, the ReLU
and their backward, written out. Composed of torch's differentiable ops the same
computation records ~20 nodes, whose bookkeeping costs more than their arithmetic at
TGN's sizes (600 rows of 100).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from tgl_dist.nn._attention_kernel import get_attention_kernel
from tgl_dist.kernels import data_ptr


class EdgePredictor(nn.Module):
    """Score positive and negative destinations of each source.

    Args:
        dim: embedding size d.

    Shapes:
        ``forward(h_src [B, d], h_pos [B, d], h_neg [k*B, d], h_neg_src [k*B, d] | None)``
        returns logits ``([B], [k*B])``. Negatives are laid out negative-major (TGL's
        ``tile``): row ``j*B + i`` is the j-th negative of positive i. Without
        ``h_neg_src`` (random negatives: only the destination is drawn) it is scored
        against source i, reusing its projection; with it (historical and inductive
        negatives: drawn ``(src, dst)`` pairs) against its own source.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.src_fc = nn.Linear(dim, dim)
        self.dst_fc = nn.Linear(dim, dim)
        self.out_fc = nn.Linear(dim, 1)

    def forward(self, h_src: Tensor, h_pos: Tensor, h_neg: Tensor,
                h_neg_src: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        B = h_src.size(0)
        if h_neg_src is not None:
            s_all = self.src_fc(torch.cat([h_src, h_neg_src], 0))
        else:
            s = self.src_fc(h_src)
            k = h_neg.size(0) // max(B, 1)
            s_all = torch.cat([s, s.repeat(k, 1)], 0) if k else s
        d = self.dst_fc(torch.cat([h_pos, h_neg], 0))
        logits = self.out_fc(torch.relu(s_all + d)).view(-1)
        return logits[:B], logits[B:]

    def score(self, emb: Tensor, src: Tensor, pos: Tensor, neg: Tensor,
              neg_src: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """``forward(emb[src], emb[pos], emb[neg], emb[neg_src])`` in one autograd node.

        Args:
            emb: ``[R, d]`` embeddings. src, pos: ``[B]`` and neg: ``[k*B]`` row numbers
                (int64; negatives negative-major, as :meth:`forward`).
            neg_src: ``[k*B]`` rows of the negatives' own sources, or ``None`` to score
                negative ``j*B + i`` against ``src[i]``.
        Returns:
            ``([B], [k*B])`` logits, the values and gradients of :meth:`forward`'s.
        """
        B = src.numel()
        if neg_src is not None and neg_src.numel() != neg.numel():
            raise ValueError(f"neg_src has {neg_src.numel()} rows, neg has {neg.numel()}")
        if B == 0 or neg.numel() % B or pos.numel() != B:
            return self(emb.index_select(0, src), emb.index_select(0, pos),
                        emb.index_select(0, neg),
                        None if neg_src is None else emb.index_select(0, neg_src))
        if neg_src is not None:
            src = torch.cat([src, neg_src])
        return ScoreRows.apply(emb, src, torch.cat([pos, neg]), self.src_fc.weight,
                               self.src_fc.bias, self.dst_fc.weight, self.dst_fc.bias,
                               self.out_fc.weight, self.out_fc.bias, B)


def _whole_scores(emb: Tensor, src: Tensor, dst: Tensor, *params: Tensor):
    """The attention kernel when :class:`ScoreRows` runs as one compiled call each way
    (``tgl_score_fwd`` / ``_bwd``: torch's BLAS found, contiguous float32 CPU tensors,
    int64 rows), else ``None`` (its torch operators)."""
    ts = (emb, *params)
    if not (all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
                for t in ts) and src.dtype == torch.long and dst.dtype == torch.long
            and src.is_contiguous() and dst.is_contiguous() and src.device.type == "cpu"
            and dst.device.type == "cpu"):
        return None
    lib = get_attention_kernel()
    return lib if lib is not None and getattr(lib, "blas", False) else None


class ScoreRows(torch.autograd.Function):
    """``apply(emb, src, dst, W_s, b_s, W_d, b_d, w_o, b_o, npos) -> (logits[:npos],
    logits[npos:])`` of ``logits [n]``, two separate tensors (no slicing nodes after it).

    ``emb [R, d]``; ``src [B]`` or ``[n]``, ``dst [n]`` row numbers with ``n = (1 + k) B``
    (with ``B`` sources, row j*B + i of ``dst`` is scored against source i; with ``n``,
    row r against source r); the parameters of :class:`EdgePredictor`
    (``w_o [1, d]``, ``b_o [1]``). Gradients flow to ``emb`` and the parameters.
    """

    @staticmethod
    def forward(ctx, emb: Tensor, src: Tensor, dst: Tensor, w_s: Tensor, b_s: Tensor,
                w_d: Tensor, b_d: Tensor, w_o: Tensor, b_o: Tensor, npos: int):
        B, n = src.numel(), dst.numel()
        ctx.rows, ctx.npos = emb.size(0), npos
        lib = _whole_scores(emb, src, dst, w_s, b_s, w_d, b_d, w_o, b_o)
        ctx.lib = lib
        if lib is not None:   # one compiled call (tgl_score_fwd): the same arithmetic
            d = emb.size(1)
            hs, hd, z, s = torch.empty(B, d), torch.empty(n, d), torch.empty(n, d), torch.empty(B, d)
            lp, ln = torch.empty(npos), torch.empty(n - npos)
            rc = lib.tgl_score_fwd(B, n, npos, emb.size(0), d, emb.data_ptr(), src.data_ptr(),
                                   dst.data_ptr(), w_s.data_ptr(), b_s.data_ptr(),
                                   w_d.data_ptr(), b_d.data_ptr(), w_o.data_ptr(),
                                   b_o.data_ptr(), hs.data_ptr(), hd.data_ptr(), z.data_ptr(),
                                   s.data_ptr(), lp.data_ptr(), ln.data_ptr(),
                                   max(1, int(lib.threads())))
            if rc == -1:
                raise IndexError(f"ScoreRows: rows must lie in 0..{emb.size(0) - 1}")
            if rc != 0:
                raise RuntimeError(f"ScoreRows: the compiled call failed ({rc})")
            ctx.save_for_backward(src, dst, hs, hd, z, w_s, w_d, w_o)
            return lp, ln
        hs, hd = emb.index_select(0, src), emb.index_select(0, dst)
        s = torch.addmm(b_s, hs, w_s.t())                                 # [B, d]
        z = torch.addmm(b_d, hd, w_d.t())                                 # [n, d]
        z.view(n // B, B, -1).add_(s)                                     # B = n: one each
        z.relu_()
        ctx.save_for_backward(src, dst, hs, hd, z, w_s, w_d, w_o)
        logits = torch.addmv(b_o, z, w_o.view(-1))
        return logits[:npos].clone(), logits[npos:].clone()   # two tensors, not views

    @staticmethod
    def backward(ctx, g_pos: Tensor, g_neg: Tensor):
        src, dst, hs, hd, z, w_s, w_d, w_o = ctx.saved_tensors
        need = ctx.needs_input_grad
        B, n = src.numel(), dst.numel()
        g = torch.cat([g_pos, g_neg])   # [n]: the logits' gradient
        if ctx.lib is not None:   # tgl_score_bwd: every gradient in one call
            d, e = hs.size(1), torch.empty
            g_emb = e(ctx.rows, d) if need[0] else None
            g_ws, g_bs, g_wd, g_bd, g_wo, g_bo = e(d, d), e(d), e(d, d), e(d), e(1, d), e(1)
            gz, gs, tmp = e(n, d), e(B, d), e(n, d)
            rc = ctx.lib.tgl_score_bwd(B, n, ctx.rows, d, g.data_ptr(), src.data_ptr(),
                                       dst.data_ptr(), hs.data_ptr(), hd.data_ptr(),
                                       z.data_ptr(), w_s.data_ptr(), w_d.data_ptr(),
                                       w_o.data_ptr(), data_ptr(g_emb),
                                       g_ws.data_ptr(), g_bs.data_ptr(), g_wd.data_ptr(),
                                       g_bd.data_ptr(), g_wo.data_ptr(), g_bo.data_ptr(),
                                       gz.data_ptr(), gs.data_ptr(), tmp.data_ptr(),
                                       max(1, int(ctx.lib.threads())))
            if rc != 0:
                raise RuntimeError(f"ScoreRows: the compiled backward failed ({rc})")
            return (g_emb, None, None, g_ws if need[3] else None, g_bs if need[4] else None,
                    g_wd if need[5] else None, g_bd if need[6] else None,
                    g_wo if need[7] else None, g_bo if need[8] else None, None)
        gz = torch.ops.aten.threshold_backward(torch.outer(g, w_o.view(-1)), z, 0.0)  # [n, d]
        gs = gz.view(n // B, B, -1).sum(0) if B < n else gz              # [B, d]
        g_emb = None
        if need[0]:
            g_emb = hs.new_zeros(ctx.rows, hs.size(1))
            g_emb.index_add_(0, src, gs.mm(w_s))
            g_emb.index_add_(0, dst, gz.mm(w_d))
        return (g_emb, None, None,
                gs.t().mm(hs) if need[3] else None, gs.sum(0) if need[4] else None,
                gz.t().mm(hd) if need[5] else None, gz.sum(0) if need[6] else None,
                z.t().mv(g).view_as(w_o) if need[7] else None,
                g.sum().view(1) if need[8] else None, None)
