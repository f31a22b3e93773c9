"""``TemporalLinkModel``: memory updater -> embedding module -> edge predictor.

One class covers TGN, JODIE, APAN, DyRep and TGAT; the builder
(:func:`tgl_dist.ctdg.build_model`) picks the parts. The model takes blocks, not a
loader, and calls no collective: the loader and the :class:`SharedMailBox` move data.

Forward (algorithms.md §1 steps 3-4) on ``mfgs`` (input layer first, roots at rows
``0..R-1`` of every block)::

    x   = node features mfgs[0].srcdata['h'] | node_embedding(ids) | nothing  [S, F]
    s^  = memory_updater(mfgs[0].srcdata)       (memory models)             [S, d_m]
    h   = s^ (+ f)  or x                                                    [S, d]
    emb = attention layers over mfgs | LayerNorm(h[:R]) | JODIE(h[:R])       [R, d]
    pos, neg = predictor(emb[src], emb[dst], emb[neg])
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from tgl_dist.memory.mailbox import MEMORY_KEYS
from tgl_dist.memory.updaters import MemoryUpdater
from tgl_dist.nn.attention import TemporalAttention
from tgl_dist.nn.embedding import IdentityEmbedding, JODIETimeProjection
from tgl_dist.nn.predictor import EdgePredictor
from tgl_dist.nn.unique import unique_first, unique_node_time
from tgl_dist.sampling.block import Block


def _memory_state(b0: Block, first: Optional[Tensor]) -> Dict[str, Tensor]:
    """``ID``, ``ts`` and the memory state of source rows ``first`` (``None``: all) of
    ``b0``, read from the compact per-node ``srcdata.memdata`` when the mailbox attached
    one (no per-source copy), else from ``srcdata``."""
    sd, md = b0.srcdata, getattr(b0.srcdata, "memdata", None)
    out = {k: (sd[k] if first is None else sd[k].index_select(0, first)) for k in ("ID", "ts")}
    if md is None:
        for k in MEMORY_KEYS:
            out[k] = sd[k] if first is None else sd[k].index_select(0, first)
    elif first is md["first"]:
        out.update({k: md[k] for k in MEMORY_KEYS})
    else:
        idx = md["index"] if first is None else md["index"].index_select(0, first)
        out.update({k: md[k].index_select(0, idx) for k in MEMORY_KEYS})
    return out


class LinkPredOutput(tuple):
    """``(pos_logits [B], neg_logits [k*B])``, unpackable as a pair, with the step's state.

    Attributes:
        memory: ``[R, d_m]`` updated memory ``s^`` of the root rows (detached), or ``None``.
        embedding: ``[R, d]`` root embeddings (detached).
        mail_uses_embedding: DyRep: mails carry the other endpoint's embedding.
    """

    memory: Optional[Tensor]
    embedding: Tensor
    mail_uses_embedding: bool

    def __new__(cls, pos: Tensor, neg: Tensor, memory: Optional[Tensor], embedding: Tensor,
                mail_uses_embedding: bool = False):
        self = super().__new__(cls, (pos, neg))
        self.memory, self.embedding = memory, embedding
        self.mail_uses_embedding = mail_uses_embedding
        return self


class TemporalLinkModel(nn.Module):
    """A memory-based (or memory-free) temporal link predictor.

    Args:
        dim_out: embedding size d fed to the predictor.
        memory_updater: computes ``s^`` from the fetched memory and mail (``None``: no memory).
        gnn_layers: temporal attention layers, one per block (``None``: no GNN).
        projection: ``'identity'`` (LayerNorm) or ``'jodie'`` when there are no GNN layers.
        output: ``'gnn'`` (score the embeddings) or ``'memory'`` (score ``s^``, DyRep;
            the GNN embeddings then only go into the mails).
        mail_uses_embedding: DyRep mails (see :meth:`SharedMailBox.get_update_mail`).
        node_embedding: optional module mapping global ids ``[S]`` to ``[S, F]`` (e.g.
            :class:`tgl_dist.nn.DistEmbedding`), used when the blocks carry no ``'h'``.
    """

    def __init__(self, *, dim_out: int, memory_updater: Optional[MemoryUpdater] = None,
                 gnn_layers: Optional[Sequence[TemporalAttention]] = None,
                 projection: Optional[str] = None, output: str = "gnn",
                 mail_uses_embedding: bool = False,
                 node_embedding: Optional[nn.Module] = None) -> None:
        super().__init__()
        if memory_updater is None and not gnn_layers:
            raise ValueError("a model needs a memory updater, GNN layers, or both")
        if gnn_layers and projection is not None:
            raise ValueError("give either gnn_layers or projection, not both")
        if output not in ("gnn", "memory"):
            raise ValueError(f"output must be 'gnn' or 'memory', got {output!r}")
        self.memory_updater = memory_updater
        self.gnn_layers = nn.ModuleList(gnn_layers or [])
        self.projection = None
        if not gnn_layers:
            proj = projection or "identity"
            if proj == "identity":
                self.projection = IdentityEmbedding(dim_out)
            elif proj == "jodie":
                self.projection = JODIETimeProjection(dim_out)
            else:
                raise ValueError(f"projection must be 'identity' or 'jodie', got {projection!r}")
        self.output = output
        self.mail_uses_embedding = mail_uses_embedding
        self.node_embedding = node_embedding
        self.predictor = EdgePredictor(dim_out)

    def node_input(self, block: Block) -> Optional[Tensor]:
        """Node features of the input layer's nodes ``[S, F]`` (``None`` when there are none)."""
        h = block.srcdata.get("h")
        if h is None and self.node_embedding is not None:
            h = self.node_embedding(block.srcdata["ID"])
        return h

    def _memory_rows(self, b0: Block, R: int) -> Tuple[Optional[Tensor], Optional[Tensor]]:
        """Which source rows the memory updater computes ``s^`` for, once each.

        ``s^`` depends only on the node (``time_delta: mail``) or on (node, query time)
        (``query``), so it is computed once per distinct node / pair. Returns
        ``(first, rows)``: the source rows to compute (``None``: every row) and, for each
        source row considered, the computed row it reads (``None``: the identity). Without
        GNN layers only the R roots are considered (APAN's neighbours only receive mails).
        """
        ids, ts = b0.srcdata["ID"], b0.srcdata["ts"]
        md = getattr(b0.srcdata, "memdata", None)
        roots_only = not len(self.gnn_layers) and b0.num_src > R
        mail = self.memory_updater.time_delta == "mail"
        if md is not None and mail and not roots_only:
            first, rows = md["first"], md["index"]    # the distinct nodes, as fetched
        else:
            sel = slice(0, R) if roots_only else slice(None)
            uq = unique_first(ids[sel]) if mail else unique_node_time(ids[sel], ts[sel])
            first, rows = (None, None) if uq is None else uq
        n = R if roots_only else ids.numel()
        if first is not None and first.numel() == n:
            first, rows = None, None                   # all distinct: no gather
        if first is None and roots_only:
            first = torch.arange(R, device=ids.device)
        return first, rows

    def embed(self, mfgs: List[Block]):
        """Root embeddings ``[R, d]`` and the root rows' ``s^`` ``[R, d_m]`` (or ``None``)."""
        b0 = mfgs[0]
        R = mfgs[-1].num_dst
        x = self.node_input(b0)
        mem, rows = None, None
        if self.memory_updater is not None:
            first, rows = self._memory_rows(b0, R)
            sd = _memory_state(b0, first)
            if x is not None and first is not None:
                x = x.index_select(0, first)
            mem = self.memory_updater(sd)
            h = self.memory_updater.combine(mem, x)
        elif x is not None:
            h = x.float()
        else:
            h = torch.zeros(b0.num_src, 0, device=b0.srcdata["ID"].device)
        root_rows = torch.arange(R, device=h.device) if rows is None else rows[:R]
        if len(self.gnn_layers):
            if len(mfgs) != len(self.gnn_layers):
                raise ValueError(f"the model has {len(self.gnn_layers)} attention layers but the "
                                 f"batch has {len(mfgs)} blocks (check sampling.layer)")
            g, g_rows = h, rows
            for layer, block in zip(self.gnn_layers, mfgs):
                n = g.size(0) if g_rows is None else g_rows.numel()
                if n != block.num_src:
                    raise ValueError(f"block {block} expects {block.num_src} input rows, got "
                                     f"{n}: blocks must chain (dst of one = src of next)")
                g, g_rows = layer(block, g, g_rows), None
            emb = g[:R]
        elif isinstance(self.projection, JODIETimeProjection):
            # the time s^ stands at: the memory's ('query': s^ is the memory read at the
            # query) or the pending mail's, which s^ folds in ('mail', one slot)
            last = sd["mail_ts"][:, -1] if self.memory_updater.time_delta == "mail" \
                else sd["mem_ts"]
            emb = self.projection(h[root_rows], b0.srcdata["ts"][:R], last[root_rows])
        else:
            emb = self.projection(h[root_rows])
        gnn_emb = emb
        mem_roots = None if mem is None else mem.index_select(0, root_rows)
        if self.output == "memory":   # DyRep scores s^ itself (node features not added)
            emb = mem_roots
        return emb, mem_roots, gnn_emb

    def forward(self, mfgs: List[Block], metadata: Dict[str, Tensor]) -> LinkPredOutput:
        """Score the batch's positive and negative events.

        Args:
            mfgs: blocks, input layer first (memory attached to ``mfgs[0]`` by the mailbox).
            metadata: ``'src_pos_index' [B]``, ``'dst_pos_index' [B]``, ``'dst_neg_index'
                [k*B]`` root rows (negatives negative-major) and, optionally,
                ``'src_neg_index' [k*B]``: the negatives' sources (drawn pairs of
                historical / inductive sampling; absent or the positives' sources repeated
                for random negatives).
        Returns:
            :class:`LinkPredOutput` ``(pos [B], neg [k*B])`` logits.
        """
        emb, mem, gnn_emb = self.embed(mfgs)
        src, neg = metadata["src_pos_index"], metadata["dst_neg_index"]
        neg_src = metadata.get("src_neg_index")
        if neg_src is not None and src.numel() and neg.numel() % src.numel() == 0 and \
                torch.equal(neg_src, src.repeat(neg.numel() // src.numel())):
            neg_src = None  # random negatives: each is scored against its positive's source
        pos, neg = self.predictor.score(emb, src, metadata["dst_pos_index"], neg, neg_src)
        return LinkPredOutput(pos, neg, None if mem is None else mem.detach(),
                              gnn_emb.detach(), self.mail_uses_embedding)
