"""Memory updaters: compute each input node's updated memory on the fly from its mail.

TGL's step 3 (algorithms.md §1): every input node x of a batch (roots and their
neighbours) reads its stored memory ``s_x``, ``memory_ts_x`` and mailbox, and the
updater computes ``s^_x`` with gradient. Nothing is stored here: the training loop
writes the positive roots' ``s^`` back through the :class:`SharedMailBox` after the
step, so there is no hidden ``last_updated_*`` state to reset.

Shapes (one batch's input layer ``mfgs[0]``):
    S: input nodes, d_m: memory size, K: mailbox slots, d_mail = 2 d_m + d_e,
    d_t: time-encoding size, F: node-feature size.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgl_dist.nn._pointwise import (Dropout, GRUTimeCell, gru_cell, own_state_weights,
                                    rows_equal, whole_time_cell)
from tgl_dist.nn.time_encoding import TimeEncode
from tgl_dist.nn.unique import unique_first


class MemoryUpdater(nn.Module):
    """Base class: ``forward(srcdata) -> s^ [S, d_m]``; ``combine(s^, h) -> node input``.

    Args:
        dim_memory: d_m. dim_mail: d_mail. mailbox_size: K. dim_time: d_t (0 = none).
        dim_node_feat: F (0 = the dataset has no node features).
        combine_node_feature: add the node features to ``s^`` (``Linear(f)`` when F != d_m).
        time_delta: the updater's time input. ``'query'`` (TGL): ``phi(t - memory_ts)`` at
            each occurrence's query time ``t``, so ``s^`` depends on (node, query time).
            ``'mail'`` (TGN code, DyGLib, PyG): ``phi(mail_ts - memory_ts)``, the gap between
            the pending mail's event and the last event folded into the memory (the
            :class:`SharedMailBox` then stores that time as ``memory_ts``), so ``s^``
            depends on the node only and callers pass one row per node.

    ``srcdata`` must hold ``'mem' [S, d_m]``, ``'mem_ts' [S]``, ``'mail' [S, K, d_mail]``,
    ``'mail_ts' [S, K]``, ``'ts' [S]`` (attached by :meth:`SharedMailBox.prepare_input`)
    and ``'ID' [S]`` (global ids, used to compute shared terms once per node).
    """

    def __init__(self, dim_memory: int, dim_mail: int, mailbox_size: int, dim_time: int,
                 dim_node_feat: int = 0, combine_node_feature: bool = True,
                 time_delta: str = "query") -> None:
        super().__init__()
        if time_delta not in ("query", "mail"):
            raise ValueError(f"time_delta must be 'query' or 'mail', got {time_delta!r}")
        self.time_delta = time_delta
        self.dim_memory, self.dim_mail, self.mailbox_size = dim_memory, dim_mail, mailbox_size
        self.dim_time, self.dim_node_feat = dim_time, dim_node_feat
        self.combine_node_feature = combine_node_feature
        self.time_enc = TimeEncode(dim_time) if dim_time > 0 else None
        self.node_feat_map = (nn.Linear(dim_node_feat, dim_memory)
                              if combine_node_feature and 0 < dim_node_feat != dim_memory else None)

    def combine(self, mem: Tensor, h: Optional[Tensor]) -> Tensor:
        """Node representation fed to the embedding module: ``s^ (+ f)``, shape ``[S, d_m]``."""
        if not self.combine_node_feature or h is None or h.size(1) == 0:
            return mem
        return mem + (self.node_feat_map(h) if self.node_feat_map is not None else h)


class _CellUpdater(MemoryUpdater):
    """GRU / RNN cell on ``[mail || phi(t - memory_ts)]`` with hidden state ``s`` (needs K = 1).

    The input-to-hidden product is split into a mail part and a time part. The mail
    part and the hidden-to-hidden part depend only on the node (its stored state is
    the same wherever it occurs in the batch), so they are computed once per unique
    node; only the time part is computed per occurrence. Mathematically this is the
    cell applied to the concatenated input.
    """

    gates = 1

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.mailbox_size != 1:
            raise ValueError(f"{type(self).__name__} needs mailbox_size 1, got {self.mailbox_size}")
        G, H = self.gates, self.dim_memory
        self.weight_ih = nn.Parameter(torch.empty(G * H, self.dim_mail + self.dim_time))
        self.weight_hh = nn.Parameter(torch.empty(G * H, H))
        self.bias_ih = nn.Parameter(torch.empty(G * H))
        self.bias_hh = nn.Parameter(torch.empty(G * H))
        bound = 1.0 / H ** 0.5  # torch.nn.GRUCell / RNNCell initialisation
        for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh):
            nn.init.uniform_(p, -bound, bound)

    def _node_part(self, srcdata):
        """``(node-only gate inputs [U, *], inverse [S] or None, mem [S, d_m])``: the
        :meth:`_node_terms` of each distinct node."""
        ids, mem = srcdata["ID"], srcdata["mem"]
        mail = srcdata["mail"].flatten(1)  # [S, d_mail] (K = 1); S may be 0
        inv, mem_u, mail_u = None, mem, mail
        if self.time_delta == "query":  # 'mail': one row per node already
            first, inv = unique_first(ids)
            if first.numel() < ids.numel():
                mem_u, mail_u = mem.index_select(0, first), mail.index_select(0, first)
            else:
                inv = None
        return self._node_terms(mem_u, mail_u), inv, mem

    def _node_terms(self, mem: Tensor, mail: Tensor) -> Tensor:
        """The products of the stored state ``mem [U, d_m]``, ``mail [U, d_mail]``."""
        raise NotImplementedError

    def _time_part(self, srcdata, base: Tensor) -> Tensor:
        """``base + W_t phi(t - memory_ts)`` per occurrence."""
        if self.time_enc is None:
            return base
        if self.time_delta == "mail":
            phi = self.time_enc(srcdata["mail_ts"][:, -1] - srcdata["mem_ts"])
        else:
            phi = self.time_enc(srcdata["ts"] - srcdata["mem_ts"])
        w_t = self.weight_ih[:, self.dim_mail:]
        H = self.dim_memory
        if base.size(1) == w_t.size(0):
            return torch.addmm(base, phi, w_t.t())
        # GRU layout [r+z (2H) | i_n (H) | h_n (H)]: time enters r, z and i_n
        b_in, b_hn = base.split([3 * H, H], 1)
        return torch.cat([torch.addmm(b_in, phi, w_t.t()), b_hn], 1)


class GRUMemoryUpdater(_CellUpdater):
    """TGN's updater: ``s^ = GRUCell([mail || phi(t - memory_ts)], s)`` (TGL ``GRUMemeoryUpdater``).

    Parameters are laid out as in :class:`torch.nn.GRUCell` (gates r, z, n).
    """

    gates = 3

    def forward(self, srcdata) -> Tensor:
        H = self.dim_memory
        if self.time_delta == "mail" and self.time_enc is not None:
            # one row per node: the cell on [mail || phi] in one autograd node, whose
            # backward computes input gradients for phi only (mail and memory are stored
            # constants)
            mem = srcdata["mem"]
            dt = (srcdata["mail_ts"][:, -1] - srcdata["mem_ts"]).float()
            mail = srcdata["mail"].flatten(1)  # [S, d_mail] (K = 1); S may be 0
            params = (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
            own = _starts_with(mail, mem)
            if own and isinstance(self.time_enc, TimeEncode):
                te = self.time_enc.w
                lib = whole_time_cell(mail[:, H:], dt, mem, *params, te.weight, te.bias)
                if lib is not None:   # the encoding inside the cell's compiled calls
                    return GRUTimeCell.apply(mail[:, H:], dt, mem, *params, te.weight,
                                             te.bias, lib)
            # elsewhere (GPU, other dtypes, no kernel): the torch reference of the same cell;
            # TGN's mails start with the receiver's own memory, which it reads from h
            phi = self.time_enc(dt)
            if own:
                return gru_cell(mail[:, H:], phi, mem, *params, own_state=True)
            return gru_cell(mail, phi, mem, *params)
        node, inv, h = self._node_part(srcdata)    # gathered once per occurrence
        if inv is not None:
            node = node.index_select(0, inv)
        g_rz, g_in, g_hn = self._time_part(srcdata, node).split([2 * H, H, H], 1)
        r, z = torch.sigmoid(g_rz).chunk(2, 1)  # split/chunk: their backward allocates no zeros
        n = torch.tanh(g_in + r * g_hn)
        return n + z * (h - n)

    def _node_terms(self, mem: Tensor, mail: Tensor) -> Tensor:
        """``[U, 4H]``: ``[gi_rz + gh_rz | gi_n | gh_n]`` without the time part. When the
        mails start with the memory (TGN's), the products of ``mem`` are one product
        with the r and z weights summed (as :class:`tgl_dist.nn._pointwise.GRUTimeCell`
        does)."""
        H, dm = self.dim_memory, self.dim_mail
        w_mail = self.weight_ih[:, :dm]
        if _starts_with(mail, mem):
            own = F.linear(mem, *own_state_weights(self.weight_ih, self.weight_hh,
                                                   self.bias_ih, self.bias_hh))
            own_i, own_hn = own.split([3 * H, H], 1)
            return torch.cat([torch.addmm(own_i, mail[:, H:], w_mail[:, H:].t()), own_hn], 1)
        gi_rz, gi_n = F.linear(mail, w_mail, self.bias_ih).split([2 * H, H], 1)
        gh_rz, gh_n = F.linear(mem, self.weight_hh, self.bias_hh).split([2 * H, H], 1)
        return torch.cat([gi_rz + gh_rz, gi_n, gh_n], 1)


def _starts_with(mail: Tensor, mem: Tensor) -> bool:
    """Whether every row of ``mail [U, d_mail]`` begins with that row of ``mem [U, d_m]``
    exactly (checked on the values, so it holds whatever wrote the mailbox)."""
    H = mem.size(1)
    return (mail.size(1) > H and mail.dtype == mem.dtype and not mail.requires_grad
            and rows_equal(mail[:, :H], mem))


class RNNMemoryUpdater(_CellUpdater):
    """JODIE / DyRep updater: ``s^ = tanh(W_ih [mail || phi(t - memory_ts)] + W_hh s + b)``.

    Parameters are laid out as in :class:`torch.nn.RNNCell`.
    """

    gates = 1

    def forward(self, srcdata) -> Tensor:
        node, inv, _ = self._node_part(srcdata)
        if inv is not None:
            node = node.index_select(0, inv)
        return torch.tanh(self._time_part(srcdata, node))

    def _node_terms(self, mem: Tensor, mail: Tensor) -> Tensor:
        """``W_ih,mail mail + b_ih + W_hh mem + b_hh`` ``[U, H]``; one product of ``mem``
        when the mails start with the memory."""
        H, dm = self.dim_memory, self.dim_mail
        w_mail = self.weight_ih[:, :dm]
        if _starts_with(mail, mem):
            w_s, w_rest = w_mail.split([H, dm - H], 1)
            own = F.linear(mem, w_s + self.weight_hh, self.bias_ih + self.bias_hh)
            return torch.addmm(own, mail[:, H:], w_rest.t())
        return F.linear(mail, w_mail, self.bias_ih) + F.linear(mem, self.weight_hh, self.bias_hh)


class TransformerMemoryUpdater(MemoryUpdater):
    """APAN's updater: attention of the memory over the K mailbox slots (TGL).

    .. math::
        q = W_q s, \\; k_k, v_k = W_k, W_v [\\mathrm{mail}_k \\| \\phi(t - \\mathrm{mail\\_ts}_k)]

        \\hat s = \\mathrm{ReLU}(\\mathrm{Dropout}(W(\\mathrm{LayerNorm}(
        \\textstyle\\sum_k \\alpha_k v_k + s))))

    with ``alpha = softmax_k(LeakyReLU(q . k))`` per head; empty slots are not masked
    (as in TGL).

    Args (beyond :class:`MemoryUpdater`): num_head, dropout, att_dropout.
    """

    def __init__(self, dim_memory: int, dim_mail: int, mailbox_size: int, dim_time: int,
                 dim_node_feat: int = 0, combine_node_feature: bool = False, num_head: int = 2,
                 dropout: float = 0.0, att_dropout: float = 0.0) -> None:
        super().__init__(dim_memory, dim_mail, mailbox_size, dim_time, dim_node_feat,
                         combine_node_feature)
        if dim_memory % num_head:
            raise ValueError(f"memory dim {dim_memory} is not divisible by num_head={num_head}")
        self.num_head = num_head
        self.w_q = nn.Linear(dim_memory, dim_memory)
        self.w_k = nn.Linear(dim_mail + dim_time, dim_memory)
        self.w_v = nn.Linear(dim_mail + dim_time, dim_memory)
        self.layer_norm = nn.LayerNorm(dim_memory)
        self.mlp = nn.Linear(dim_memory, dim_memory)
        self.dropout = Dropout(dropout)
        self.att_dropout = Dropout(att_dropout)

    def forward(self, srcdata) -> Tensor:
        mem, mail = srcdata["mem"], srcdata["mail"]
        S, K, H = mem.size(0), self.mailbox_size, self.num_head
        C = self.dim_memory // H  # explicit widths: S may be 0 (a rank with no event)
        q = self.w_q(mem).view(S, 1, H, C)
        if self.time_enc is not None:
            phi = self.time_enc(srcdata["ts"].view(-1, 1) - srcdata["mail_ts"])
            mail = torch.cat([mail, phi], 2)
        k = self.w_k(mail).view(S, K, H, C)
        v = self.w_v(mail).view(S, K, H, C)
        att = F.softmax(F.leaky_relu((q * k).sum(-1), 0.2), dim=1)
        att = self.att_dropout(att)
        rst = (att.unsqueeze(-1) * v).sum(1).reshape(S, H * C) + mem
        return F.relu(self.dropout(self.mlp(self.layer_norm(rst))))


UPDATERS = {"gru": GRUMemoryUpdater, "rnn": RNNMemoryUpdater, "transformer": TransformerMemoryUpdater}
