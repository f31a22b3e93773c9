"""``SharedMailBox``: node memory and mailbox of the nodes this rank owns, kept in sync by all-to-all.

State per owned node (algorithms.md §1), zeroed by :meth:`SharedMailBox.reset`::

    memory        [n_owned, d_m]        float32
    memory_ts     [n_owned]             float64   time of the last memory write ('query'),
                                                or of the last mail folded into memory ('mail')
    mailbox       [n_owned, K, d_mail]  float32   d_mail = 2 d_m + d_e
    mail_ts       [n_owned, K]          float64
    next_mail_pos [n_owned]             int64     ring-buffer pointer (moves only if K > 1)

The Mailbox API (the names users of StarryGL / the reference docs know):

* :meth:`prepare_input` (the loader calls it before yielding a batch): fetch the
  state of every input node from its owner (one all-to-all, one row per distinct
  node) and attach it to the input block as ``'mem'``, ``'mem_ts'``, ``'mail'``,
  ``'mail_ts'`` (per source row, gathered on first access) and as the compact
  ``srcdata.memdata`` (per distinct node, what the built-in models read).
* :meth:`get_update_memory` / :meth:`get_update_mail`: build this step's updates,
  one per node (the latest by timestamp).
* :meth:`set_mailbox_all_to_all`: send every update to its owner, which resolves
  duplicates from several ranks and writes.

Semantics: within a step, memory is read (``prepare_input``) before the step's events
are applied; the updates of step k are written on every owner during step k (inside
:meth:`SharedMailBox.deferred_writes`: at the start of step k + 1's read, before it is
served), so every rank reads them from step k + 1 on.

Worked example (2 ranks, owners of nodes 0..3 = ``[0, 1, 0, 1]``)::

    step k, rank 0 events (0 -> 1, t=5)      rank 1 events (3 -> 1, t=6)
    get_update_memory: rank 0 -> nodes [0, 1] @ t 5; rank 1 -> nodes [1, 3] @ t 6
    set_mailbox_all_to_all: rank 0 receives node 0 (from itself); rank 1 receives
      node 1 twice (t 5 from rank 0, t 6 from rank 1: t 6 wins) and node 3
    step k + 1: any rank reading node 1 sees memory_ts 6 and rank 1's mail
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from tgl_dist.dist import PartitionBook, Plan, fetch_rows, push_then_fetch, world
from tgl_dist.memory import _writeback
from tgl_dist.memory.dedup import latest_per_key, mean_per_key
from tgl_dist.nn.unique import unique_first
from tgl_dist.sampling.block import Block, Roots

log = logging.getLogger(__name__)


def _param(p: Any, key: str, default=None):
    if isinstance(p, Mapping):
        return p.get(key, default)
    return getattr(p, key, default)


def _bits(x: Tensor) -> Tensor:
    """float64 / int64 ``[n]`` -> its bits as float32 ``[n, 2]`` (exact, for packing payloads)."""
    return x.contiguous().view(torch.float32).view(-1, 2)


def _unbits(x: Tensor, dtype) -> Tensor:
    """:func:`_bits` undone: float32 ``[n, 2 k]`` columns of a packed payload -> ``[n k]``.
    Always copied into fresh memory: a column slice of a one-row payload counts as
    contiguous whatever its row stride, which ``view(dtype)`` cannot reinterpret."""
    return x.clone(memory_format=torch.contiguous_format).view(dtype).view(-1)


# Stream positions of mails (ties in time go to the later one, as in one process):
# occurrence u_i, v_i of event eid -> 2 eid (+ 1); a neighbour copy (APAN) of the mail of
# side s of event eid, through the j-th edge of that root -> after every root mail, in
# the order of one process's block: all source rows' edges, then all destination rows'.
_COPY, _SIDE, _J = 1 << 62, 41, 20


def _event_order(eids: Tensor) -> Tensor:
    """``[2B]``: positions of the occurrences u_1, v_1, u_2, v_2, ... of events ``eids [B]``."""
    e = 2 * eids.long()
    return torch.stack([e, e + 1], 1).view(-1)


def _copy_order(eids: Tensor, occ: Tensor, j: Tensor) -> Tensor:
    """Positions of neighbour copies of occurrences ``occ`` (``2 i + side``) via their
    root's ``j``-th edge (eids < 2^41, fewer than 2^20 edges a root)."""
    side, ev = occ % 2, eids.long()[occ // 2]
    return _COPY + (((side << _SIDE) | ev) << _J) + j


def _rank_in_row(e_dst: Tensor) -> Tensor:
    """Each edge's rank among the edges of its destination row, in edge order."""
    perm = torch.sort(e_dst, stable=True).indices
    d = e_dst[perm]
    start = torch.searchsorted(d, d, right=False)
    out = torch.empty_like(perm)
    out[perm] = torch.arange(d.numel(), device=d.device) - start
    return out


MEMORY_KEYS = ("mem", "mem_ts", "mail", "mail_ts")


class MemorySrcData(dict):
    """A block's ``srcdata`` whose memory entries are gathered on first access.

    :meth:`SharedMailBox.prepare_input` fetches one row of state per **distinct** node
    of the input block (a node occurs many times: as a root and as the neighbour of
    other roots; ~700 distinct among ~4,800 sources in a Wikipedia batch of 200) and
    keeps them in ``memdata``:

    * ``'ID' [U]`` distinct global ids (sorted), ``'first' [U]`` the source row of each
      one's first occurrence, ``'index' [S]`` the distinct row of each source row;
    * ``'mem' [U, d_m]``, ``'mem_ts' [U]``, ``'mail' [U, K, d_mail]``, ``'mail_ts' [U, K]``.

    ``srcdata['mem']`` (and the other three) is ``memdata['mem'][memdata['index']]``,
    built when first read and then stored, so code written against per-source rows
    works unchanged while the built-in models read ``memdata`` and never pay for it.
    """

    def __init__(self, base: Mapping[str, Tensor], memdata: dict) -> None:
        super().__init__({k: v for k, v in base.items() if k not in MEMORY_KEYS})
        self.memdata = memdata

    def __missing__(self, key: str) -> Tensor:
        if key in MEMORY_KEYS:
            v = self.memdata[key].index_select(0, self.memdata["index"])
            dict.__setitem__(self, key, v)
            return v
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in MEMORY_KEYS

    def get(self, key, default=None):
        return self[key] if key in self else default

    def keys(self):
        return list(dict.keys(self)) + [k for k in MEMORY_KEYS if not dict.__contains__(self, k)]

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def values(self):
        return [self[k] for k in self.keys()]


class SharedMailBox:
    """Memory and mailbox of the owned nodes, read and written through all-to-all.

    Args:
        num_nodes: number of nodes this rank owns (``pdata.ids.shape[0]``); the whole
            graph's node count in a world of one.
        memory_param: the YAML ``memory`` section (dict or
            :class:`tgl_dist.ctdg.MemoryConfig`): ``dim_out`` (d_m),
            ``mailbox_size`` (K, default 1), ``mail_combine`` (``'last'`` | ``'mean'``),
            ``deliver_to`` (``'self'`` | ``'neighbors'``), ``time_delta`` (``'query'``:
            a memory write stamps ``memory_ts`` with the event time, TGL; ``'mail'``: with
            the time of the mail it replaces, i.e. of the last event folded into the
            memory, TGN code / DyGLib / PyG).
        dim_edge_feat: d_e (0 when the events have no features).
        partition_book: global id -> (owner, local row). ``None``: a world of one that
            owns every node (local row = global id).
        group: process group of the exchanges (``None`` = world).
        device: where the state lives.
    """

    def __init__(self, num_nodes: int, memory_param: Any, dim_edge_feat: int = 0,
                 partition_book: Optional[PartitionBook] = None, group=None,
                 device="cpu") -> None:
        self.rank, self.world_size = world(group)
        self.group = group
        self.book = partition_book
        if partition_book is not None:
            if partition_book.num_parts != self.world_size:
                raise ValueError(f"partition book has {partition_book.num_parts} parts but the "
                                 f"world has {self.world_size} ranks")
            owned = int(partition_book.counts[self.rank])
            if owned != num_nodes:
                raise ValueError(f"num_nodes={num_nodes} but the partition book gives rank "
                                 f"{self.rank} {owned} owned nodes")
        elif self.world_size > 1:
            raise ValueError("a SharedMailBox in a world of several ranks needs partition_book: "
                             "the partition's node book, pdata.book (it says which rank owns "
                             "each node's memory)")
        self.num_nodes = int(num_nodes)
        self.dim_memory = int(_param(memory_param, "dim_out"))
        self.mailbox_size = int(_param(memory_param, "mailbox_size", 1) or 1)
        self.mail_combine = _param(memory_param, "mail_combine", "last") or "last"
        self.deliver_to = _param(memory_param, "deliver_to", "self") or "self"
        self.time_delta = _param(memory_param, "time_delta", "query") or "query"
        if self.time_delta not in ("query", "mail"):
            raise ValueError(f"memory.time_delta must be 'query' or 'mail', got {self.time_delta!r}")
        if self.mail_combine not in ("last", "mean"):
            raise ValueError(f"memory.mail_combine must be 'last' or 'mean', got {self.mail_combine!r}")
        if self.deliver_to not in ("self", "neighbors"):
            raise ValueError(f"memory.deliver_to must be 'self' or 'neighbors', got {self.deliver_to!r}")
        self.dim_edge_feat = int(dim_edge_feat or 0)
        self.dim_mail = 2 * self.dim_memory + self.dim_edge_feat
        self.device = torch.device(device)
        n, K = self.num_nodes, self.mailbox_size
        self.memory = torch.zeros(n, self.dim_memory, device=self.device)
        self.memory_ts = torch.zeros(n, dtype=torch.float64, device=self.device)
        self.mailbox = torch.zeros(n, K, self.dim_mail, device=self.device)
        self.mail_ts = torch.zeros(n, K, dtype=torch.float64, device=self.device)
        self.next_mail_pos = torch.zeros(n, dtype=torch.long, device=self.device)
        self._defer = False     # inside deferred_writes(): the last exchange of updates waits
        self._pending = None    # (owner [n], packed rows [n, C], layout, reduce_Op)

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Zero memory, mailbox and timestamps (every epoch start)."""
        self._pending = None    # overwritten anyway
        for t in (self.memory, self.memory_ts, self.mailbox, self.mail_ts, self.next_mail_pos):
            t.zero_()

    def state_dict(self) -> dict:
        """This rank's shard (for checkpoints; collective while a write is deferred)."""
        self.flush()
        return {k: getattr(self, k).clone() for k in
                ("memory", "memory_ts", "mailbox", "mail_ts", "next_mail_pos")}

    def load_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self._pending = None    # the loaded state replaces it
        for k, v in state.items():
            cur = getattr(self, k)
            if cur.shape != v.shape:
                raise ValueError(f"mailbox state '{k}' has shape {tuple(v.shape)}, this rank "
                                 f"holds {tuple(cur.shape)}")
            cur.copy_(v)

    @contextmanager
    def deferred_writes(self):
        """Within this block, the all-to-all of the last :meth:`set_mailbox_all_to_all` (or
        :meth:`update`) waits and rides on the next read's request (:meth:`prepare_input`,
        :func:`tgl_dist.dist.push_then_fetch`): 3 all-to-alls a step for the memory instead
        of 5, the same values (every owner writes before it serves). A second write, or
        :meth:`state_dict`, sends a waiting one first; leaving the block sends it
        (collective: every rank leaves together). :func:`tgl_dist.ctdg.run_epoch` trains
        and evaluates inside it. On an exception the waiting write is dropped (no
        collective on the way out of a failing step)."""
        prev, self._defer = self._defer, True
        try:
            yield self
        except BaseException:
            self._pending = None
            raise
        finally:
            self._defer = prev
        if not prev:
            self.flush()

    def flush(self) -> None:
        """Send a write waiting under :meth:`deferred_writes` (collective; a no-op otherwise)."""
        if self._pending is not None:
            owner, packed, layout, op = self._pending
            self._pending = None
            self._apply(Plan(owner, self.group).forward(packed), layout, op)

    def _local(self, ids: Tensor) -> Tensor:
        return ids if self.book is None else self.book.to_local(ids)

    # ------------------------------------------------------------------- read
    def _rows(self, rows: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        # index_select: much cheaper than advanced indexing on CPU
        return (self.memory.index_select(0, rows), self.memory_ts.index_select(0, rows),
                self.mailbox.index_select(0, rows), self.mail_ts.index_select(0, rows))

    def _serve(self, rows: Tensor) -> Tensor:
        n, K = rows.numel(), self.mailbox_size
        mem, mts, mail, mailts = self._rows(rows)     # n may be 0: asked for nothing
        return torch.cat([mem, _bits(mts), mail.reshape(n, K * self.dim_mail),
                          _bits(mailts.reshape(-1)).reshape(n, 2 * K)], 1)

    def read_unique(self, global_ids: Tensor) -> dict:
        """State of the distinct nodes among ``global_ids`` (collective on several ranks).

        Args:
            global_ids: ``[n]`` node ids (repeats allowed).
        Returns:
            ``{'ID' [U], 'first' [U], 'index' [n], 'mem' [U, d_m], 'mem_ts' [U],
            'mail' [U, K, d_mail], 'mail_ts' [U, K]}``: distinct ids (sorted), the position
            of each one's first occurrence, the distinct row of each position, and their
            state (see :class:`MemorySrcData`).
        """
        global_ids = global_ids.to(self.device)
        first, index = unique_first(global_ids)
        uniq = global_ids.index_select(0, first)
        if self.world_size == 1:
            mem, mts, mail, mailts = self._rows(self._local(uniq))
        else:
            owner, local = self.book.locate(uniq)
            if self._pending is not None:    # this step's read carries the last step's write
                p_owner, p_rows, layout, op = self._pending
                self._pending = None
                packed = push_then_fetch(p_owner, p_rows, owner, local,
                                         lambda got: self._apply(got, layout, op),
                                         self._serve, self.group)
            else:
                packed = fetch_rows(owner, local, self._serve, self.group)
            d, K, dm = self.dim_memory, self.mailbox_size, self.dim_mail
            mem, mts, mail, mailts = packed.split([d, 2, K * dm, 2 * K], 1)
            # contiguous, as the local rows are: the compiled cells and the attention
            # kernel take their fast path only on contiguous memory and mail ([U, d] copies)
            mem, mail = mem.contiguous(), mail.reshape(-1, K, dm).contiguous()
            mts = _unbits(mts, torch.float64)
            mailts = _unbits(mailts, torch.float64).view(-1, K)
        return {"ID": uniq, "first": first, "index": index, "mem": mem, "mem_ts": mts,
                "mail": mail, "mail_ts": mailts}

    def read(self, global_ids: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """State of any nodes, one row per id (a collective when the world has several ranks).

        Args:
            global_ids: ``[n]`` node ids.
        Returns:
            ``memory [n, d_m]``, ``memory_ts [n]``, ``mail [n, K, d_mail]``, ``mail_ts [n, K]``.
        """
        md = self.read_unique(global_ids)
        return tuple(md[k].index_select(0, md["index"]) for k in MEMORY_KEYS)

    def prepare_input(self, mfgs: List[Block]) -> None:
        """Attach the state of every input node to ``mfgs[0]``.

        ``mfgs[0]`` (the input layer) contains every node of the batch; the state of
        its distinct ``srcdata['ID']`` is fetched from their owners (one all-to-all; a
        plain index in a world of one) and attached as ``srcdata.memdata``, with
        ``srcdata['mem']``, ``['mem_ts']``, ``['mail']``, ``['mail_ts']`` readable per
        source row (:class:`MemorySrcData`). Collective: every rank calls it once per step.
        """
        b = mfgs[0]
        b.srcdata = MemorySrcData(b.srcdata, self.read_unique(b.srcdata["ID"]))

    # ---------------------------------------------------------------- updates
    def get_update_memory(self, index: Tensor, memory: Tensor, memory_ts: Tensor
                          ) -> Tuple[Tensor, Tensor, Tensor]:
        """This step's memory writes: one per node, the latest by timestamp.

        Args:
            index: ``[n]`` global ids of the updated rows (the positive roots).
            memory: ``[n, d_m]`` their updated memory ``s^`` (detached here).
            memory_ts: ``[n]`` the event time of each row.
        Returns:
            ``(index [u], memory [u, d_m], memory_ts [u])`` with distinct ids. Among
            rows of equal time the later row wins (the value is the same: ``s^`` of a
            node depends only on the node and the query time).
        """
        sel = latest_per_key(index, memory_ts)
        return index[sel], memory[sel].detach(), memory_ts[sel]

    def get_update_mail(self, index: Tensor, src: Tensor, dst: Tensor, ts: Tensor,
                        edge_feats: Optional[Tensor], memory: Tensor,
                        embedding: Optional[Tensor] = None, use_src_emb: bool = False,
                        use_dst_emb: bool = False, block: Optional[Block] = None,
                        eids: Optional[Tensor] = None):
        """This step's mails (algorithms.md §1 step 5), without gradient.

        Event i (``u = index[src[i]]``, ``v = index[dst[i]]``) mails
        ``[s^_u || s^_v || e_i]`` to u and ``[s^_v || s^_u || e_i]`` to v, time ``ts[i]``.
        With ``use_dst_emb`` the second part is the other endpoint's ``embedding``
        (DyRep); with ``use_src_emb`` the first part is the receiver's ``embedding``.
        With ``deliver_to='neighbors'`` (APAN) each root's mail is also copied to its
        sampled neighbours in ``block`` (edges whose destination row is ``src[i]`` or
        ``dst[i]``).

        Args:
            index: ``[S]`` global ids of the rows of ``memory`` (e.g. ``roots.nodes``).
            src, dst: ``[B]`` row positions of the positive events' endpoints.
            ts: ``[B]`` event times. edge_feats: ``[B, d_e]`` or ``None``.
            memory: ``[S', d_m]`` updated memory of the rows (``S' >= max(src, dst) + 1``).
            embedding: ``[S', d]`` optional embeddings of the rows (needs ``d = d_m``).
            block: block whose destination rows are the rows of ``memory`` (``'neighbors'``).
            eids: ``[B]`` global event ids (stream positions) of the events: then a fourth
                tensor, ``order [u]``, gives each mail's position in the stream, to pass on
                to :meth:`set_mailbox_all_to_all`, so that mails from several ranks at equal
                times resolve as in one process.
        Returns:
            ``(index [u], mail [u, d_mail], mail_ts [u])`` (``+ (order [u],)`` with ``eids``):
            with ``mail_combine='last'`` one mail per node (latest time; ties: events in
            order u_1, v_1, u_2, v_2, ... then neighbour copies, later wins); with
            ``'mean'`` every mail (the owners average them).
        """
        B = src.numel()
        if dst.numel() != B or ts.numel() != B or (eids is not None and eids.numel() != B):
            raise ValueError(
                f"get_update_mail: src, dst, ts{', eids' if eids is not None else ''} need one "
                f"entry per positive event; got {B}, {dst.numel()}, {ts.numel()}"
                f"{'' if eids is None else f', {eids.numel()}'} (the events' times are "
                f"roots.t; roots.ts has one time per root, also for negatives)")
        with torch.no_grad():
            me_u = (embedding if use_src_emb else memory)[src].detach()
            me_v = (embedding if use_src_emb else memory)[dst].detach()
            ot_v = (embedding if use_dst_emb else memory)[dst].detach()
            ot_u = (embedding if use_dst_emb else memory)[src].detach()
            parts_u, parts_v = [me_u, ot_v], [me_v, ot_u]
            if self.dim_edge_feat:
                parts_u.append(self._edge_feats(edge_feats))
                parts_v.append(parts_u[-1])
            mail = torch.stack([torch.cat(parts_u, 1), torch.cat(parts_v, 1)], 1).view(2 * B, self.dim_mail)
            ids = torch.stack([index[src], index[dst]], 1).view(-1)
            mail_ts = ts.to(torch.float64).repeat_interleave(2)
            order = None if eids is None else _event_order(eids.to(ids.device))
            if self.deliver_to == "neighbors" and block is not None and block.num_edges:
                row_mail = torch.full((int(memory.size(0)),), -1, dtype=torch.long,
                                      device=mail.device)
                row_mail[src] = torch.arange(0, 2 * B, 2, device=mail.device)
                row_mail[dst] = torch.arange(1, 2 * B, 2, device=mail.device)
                e_src, e_dst = block.edge_index[0], block.edge_index[1]
                inside = e_dst < row_mail.numel()
                m = torch.full_like(e_dst, -1)
                m[inside] = row_mail[e_dst[inside]]
                keep = m >= 0
                m = m[keep]
                ids = torch.cat([ids, block.srcdata["ID"][e_src[keep]].to(ids.device)])
                mail = torch.cat([mail, mail[m]])
                mail_ts = torch.cat([mail_ts, mail_ts[m]])
                if order is not None:
                    order = torch.cat([order, _copy_order(eids.to(ids.device), m,
                                                          _rank_in_row(e_dst)[keep])])
            if self.mail_combine == "last":
                sel = latest_per_key(ids, mail_ts, order)
                ids, mail, mail_ts = ids[sel], mail[sel], mail_ts[sel]
                order = None if order is None else order[sel]
            return (ids, mail, mail_ts) if eids is None else (ids, mail, mail_ts, order)

    def _edge_feats(self, edge_feats: Optional[Tensor]) -> Tensor:
        """The positive events' features ``[B, d_e]`` (float) for the mails."""
        if edge_feats is None:
            raise ValueError(f"the mailbox was built with dim_edge_feat={self.dim_edge_feat} "
                             f"but edge_feats is None")
        return edge_feats.float()

    # ------------------------------------------------------------------ write
    def set_mailbox_all_to_all(self, index: Tensor, memory: Optional[Tensor],
                               memory_ts: Optional[Tensor], mail: Optional[Tensor],
                               mail_ts: Optional[Tensor], reduce_Op: str = "max",
                               order: Optional[Tensor] = None) -> None:
        """Send updates to the owners of ``index``; each owner resolves duplicates and writes.

        Collective: every rank calls it, also with nothing to send.

        Args:
            index: ``[n]`` global ids. memory/memory_ts: ``[n, d_m]`` / ``[n]`` or ``None``
                (mail only). mail/mail_ts: ``[n, d_mail]`` / ``[n]`` or ``None`` (memory only).
            reduce_Op: ``'max'``: the latest timestamp wins; ``'mean'``: mails to the same
                node are averaged (memory still takes the latest).
            order: ``[n]`` int64 stream position of each row (``get_update_mail(...,
                eids=...)`` returns it): equal timestamps go to the later position, and
                ``'mean'`` sums in that order, so several ranks write exactly what one
                process writes (on the CPU; CUDA's sums are atomic, exact only up to
                rounding). ``None``: ties go to the higher sender rank, then the later
                row (deterministic, but not one process's choice when events from
                different ranks share a timestamp).
        """
        if reduce_Op not in ("max", "mean"):
            raise ValueError(f"reduce_Op must be 'max' or 'mean', got {reduce_Op!r}")
        has_mem, has_mail = memory is not None, mail is not None
        index = index.to(self.device)
        n = index.numel()
        if self.world_size == 1:
            self._write(self._local(index), memory, memory_ts, mail, mail_ts, order, reduce_Op)
            return
        owner, local = self.book.locate(index)
        cols = [_bits(local)]
        if order is not None:
            cols.append(_bits(order.to(local.device, torch.long)))
        if has_mem:
            cols += [memory.detach().float().reshape(n, self.dim_memory), _bits(memory_ts.to(torch.float64))]
        if has_mail:
            cols += [mail.detach().float().reshape(n, self.dim_mail), _bits(mail_ts.to(torch.float64))]
        packed = torch.cat(cols, 1)
        layout = (order is not None, has_mem, has_mail)
        self.flush()                      # an earlier waiting write goes first
        if self._defer:
            self._pending = (owner, packed, layout, reduce_Op)
            return
        self._apply(Plan(owner, self.group).forward(packed), layout, reduce_Op)

    def _apply(self, got: Tensor, layout: Tuple[bool, bool, bool], reduce_Op: str) -> None:
        """Write received packed updates ``[n, C]`` (rows grouped by source rank)."""
        has_order, has_mem, has_mail = layout
        sizes = [2] + ([2] if has_order else []) + \
            ([self.dim_memory, 2] if has_mem else []) + ([self.dim_mail, 2] if has_mail else [])
        parts = list(got.split(sizes, 1))
        rows = _unbits(parts.pop(0), torch.long)
        got_order = _unbits(parts.pop(0), torch.long) if has_order else None
        m = mts = ml = mlts = None
        if has_mem:
            m, mts = parts.pop(0), _unbits(parts.pop(0), torch.float64)
        if has_mail:
            ml, mlts = parts.pop(0), _unbits(parts.pop(0), torch.float64)
        self._write(rows, m, mts, ml, mlts, got_order, reduce_Op)

    def _write(self, rows, memory, memory_ts, mail, mail_ts, order, reduce_Op: str,
               distinct: bool = False) -> None:
        """Write received updates; duplicates resolved by ``reduce_Op`` (ties in time by
        ``order``, see :meth:`set_mailbox_all_to_all`) unless the caller knows ``rows``
        are ``distinct`` already."""
        with torch.no_grad():
            if memory is not None:
                if distinct:
                    r = rows
                else:
                    sel = latest_per_key(rows, memory_ts, order)
                    r, memory, memory_ts = rows[sel], memory[sel], memory_ts[sel]
                self.memory[r] = memory.to(self.memory.dtype)
                if self.time_delta == "mail":
                    # s^ folded in the mail held until now: the memory stands at its time
                    last = (self.next_mail_pos[r] - 1) % self.mailbox_size
                    self.memory_ts[r] = self.mail_ts[r, last]
                else:
                    self.memory_ts[r] = memory_ts.to(torch.float64)
            if mail is not None:
                if distinct:
                    r = rows
                elif reduce_Op == "mean":
                    if order is not None:   # sum in stream order
                        o = torch.sort(order, stable=True).indices
                        rows, mail, mail_ts = rows[o], mail[o], mail_ts[o]
                    r, mail, mail_ts = mean_per_key(rows, mail.float(), mail_ts.to(torch.float64))
                else:
                    sel = latest_per_key(rows, mail_ts, order)
                    r, mail, mail_ts = rows[sel], mail[sel], mail_ts[sel]
                pos = self.next_mail_pos[r]
                self.mailbox[r, pos] = mail.to(self.mailbox.dtype).view(-1, self.dim_mail)
                self.mail_ts[r, pos] = mail_ts.to(torch.float64)
                if self.mailbox_size > 1:
                    self.next_mail_pos[r] = (pos + 1) % self.mailbox_size

    # ------------------------------------------------------------ short form
    def update(self, memory: Tensor, roots: Roots, src_pos: Tensor, dst_pos: Tensor,
               edge_feats: Optional[Tensor] = None, embedding: Optional[Tensor] = None,
               use_dst_emb: bool = False, block: Optional[Block] = None) -> None:
        """The whole write-back of one step in one call (collective).

        Writes what :meth:`get_update_memory`, :meth:`get_update_mail` and
        :meth:`set_mailbox_all_to_all` write for the positive events of ``roots`` (with
        ``deliver_to='self'`` and ``mail_combine='last'`` by a shorter route that finds
        each node's latest occurrence once: same values, tested).

        Args:
            memory: ``[R', d_m]`` updated memory ``s^`` of the root rows (``R' >= 2B``).
            roots: the batch's roots (``roots.nodes`` global ids, ``roots.t`` event times).
            src_pos, dst_pos: ``[B]`` root rows of the positive events
                (``metadata['src_pos_index']``, ``metadata['dst_pos_index']``).
            edge_feats: ``[B, d_e]`` features of the positive events, or ``None``.
            embedding, use_dst_emb: DyRep mails (see :meth:`get_update_mail`).
            block: the block whose destinations are the roots (``deliver_to='neighbors'``).
        """
        nodes, t = roots.nodes.to(self.device), roots.t.to(self.device)
        if self.deliver_to == "self" and self.mail_combine == "last":
            self._update_last(memory, nodes, t, roots.eids, src_pos, dst_pos, edge_feats, embedding,
                              use_dst_emb)
            return
        pos = torch.stack([src_pos, dst_pos], 1).view(-1)
        mem_ts = t.to(torch.float64).repeat_interleave(2)
        idx_m, mem, mts = self.get_update_memory(nodes[pos], memory[pos], mem_ts)
        idx_l, mail, mlts, order = self.get_update_mail(nodes, src_pos, dst_pos, t, edge_feats,
                                                        memory, embedding, False, use_dst_emb,
                                                        block, eids=roots.eids)
        self.set_mailbox_all_to_all(idx_m, mem, mts, None, None, "max")
        self.set_mailbox_all_to_all(idx_l, None, None, mail, mlts,
                                    "mean" if self.mail_combine == "mean" else "max", order)

    def _update_last(self, memory: Tensor, nodes: Tensor, t: Tensor, eids: Tensor,
                     src_pos: Tensor, dst_pos: Tensor, edge_feats: Optional[Tensor],
                     embedding: Optional[Tensor], use_dst_emb: bool) -> None:
        """:meth:`update` for mails to the endpoints kept last (``deliver_to='self'``,
        ``mail_combine='last'``): the memory and the mail of a node come from the same
        occurrence (same ids, same times, same tie rule in :meth:`get_update_memory` and
        :meth:`get_update_mail`), so the latest occurrence of each node is found once and
        only its mail is built; one exchange carries both (none in a world of one, where
        the compiled write-back, :mod:`tgl_dist.memory._writeback`, does it all in one
        call on the CPU: the same values)."""
        other_rows = embedding if use_dst_emb else memory
        feats = self._edge_feats(edge_feats) if self.dim_edge_feat else None
        pos = torch.stack([src_pos, dst_pos], 1).view(-1)          # u_1, v_1, u_2, v_2, ...
        other = torch.stack([dst_pos, src_pos], 1).view(-1)
        if self.world_size == 1 and _writeback.usable(self, memory, other_rows, feats):
            lib = _writeback.KERNEL.get()
            if lib is not None:
                _writeback.update_last(lib, self, self._local(nodes.index_select(0, pos)), pos,
                                       other, t, memory, other_rows, feats)
                return
        self._update_last_torch(memory, nodes, t, eids, pos, other, feats, other_rows)

    def _update_last_torch(self, memory: Tensor, nodes: Tensor, t: Tensor, eids: Tensor,
                           pos: Tensor, other: Tensor, feats: Optional[Tensor],
                           other_rows: Tensor) -> None:
        """:meth:`_update_last` with torch's operators (any device; several ranks), given
        each occurrence's root row ``pos`` and its other endpoint's ``other`` ``[2B]``."""
        with torch.no_grad():
            ts = t.to(torch.float64).repeat_interleave(2)
            sel = latest_per_key(nodes.index_select(0, pos), ts)
            mine, other = pos.index_select(0, sel), other.index_select(0, sel)
            idx, mts = nodes.index_select(0, mine), ts.index_select(0, sel)
            mem = memory.detach().index_select(0, mine)
            parts = [mem, other_rows.detach().index_select(0, other)]
            if feats is not None:   # event of occurrence j: j // 2
                parts.append(feats.index_select(0, torch.div(sel, 2, rounding_mode="floor")))
            mail = torch.cat(parts, 1)
        if self.world_size == 1:
            self._write(self._local(idx), mem, mts, mail, mts, None, "max", distinct=True)
        else:   # the owners break ties in time by stream position, as one process does
            order = _event_order(eids.to(idx.device)).index_select(0, sel)
            self.set_mailbox_all_to_all(idx, mem, mts, mail, mts, "max", order)

    def __repr__(self) -> str:
        return (f"SharedMailBox(owned={self.num_nodes}, dim_memory={self.dim_memory}, "
                f"mailbox_size={self.mailbox_size}, dim_mail={self.dim_mail}, "
                f"rank={self.rank}/{self.world_size})")
