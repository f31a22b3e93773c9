"""All-to-all exchanges: counts, then ids, then payload; with the inverse permutation.

This module and :mod:`tgl_dist.context` are the only places that call
``torch.distributed``. Every function here is a collective over ``group``: every
rank must call it, also with nothing to send (empty tensors), so no rank waits
forever. With ``group=None`` and no initialised process group (a world of one)
they run locally.

Worked example (2 ranks, node owners ``[0, 1, 0, 1]``)::

    rank 0: fetch_rows(ids=[3, 0, 1])   rank 1: fetch_rows(ids=[2])
      owners [1, 0, 1] -> sorted by owner: [0 | 3, 1]
      send counts:  rank 0 -> [1, 2]      rank 1 -> [1, 0]
      rank 0 serves [0 (its own), 2 (for rank 1)], rank 1 serves [3, 1]
      rank 0 gets rows of [0 | 3, 1] and un-permutes them to [3, 0, 1]
"""
from __future__ import annotations

import datetime
import logging
import os
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from tgl_dist.errors import PeerFailureError

DEFAULT_TIMEOUT = 600.0   # seconds a collective waits for a peer (DistributedContext.init)


def new_group(timeout: Optional[datetime.timedelta] = None, ranks: Optional[Sequence[int]] = None,
              backend: Optional[str] = None) -> Optional[dist.ProcessGroup]:
    """A new process group over all ranks (or over ``ranks``) with the world's backend (or
    ``backend``, e.g. ``'gloo'`` for host bytes in an NCCL run) (collective: every rank
    must call it, also one not in ``ranks``, which gets a group it must not use);
    ``None`` in a world of one. Default ``timeout``: ``DEFAULT_TIMEOUT``.
    :meth:`DistributedContext.new_group` passes the context's; this form needs no context
    (so it picks no device, unlike ``DistributedContext.init()``). The one place that
    makes process groups after the world's."""
    if not dist.is_initialized():
        return None
    td = timeout or datetime.timedelta(seconds=DEFAULT_TIMEOUT)
    return dist.new_group(ranks=None if ranks is None else sorted(ranks),
                          backend=backend or dist.get_backend(), timeout=td)


log = logging.getLogger(__name__)
_warned_no_group = False


def world(group: Optional[dist.ProcessGroup] = None) -> Tuple[int, int]:
    """``(rank, world_size)`` in ``group`` (``(0, 1)`` without a process group).

    Without a process group in a process that a launcher started as one of several
    (``WORLD_SIZE`` > 1 in its environment: torchrun forgot ``DistributedContext.init()``)
    this logs a warning, once: every process would silently run alone.
    """
    if not dist.is_initialized():
        global _warned_no_group
        if not _warned_no_group and os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1"):
            _warned_no_group = True
            log.warning("WORLD_SIZE=%s but no process group is initialised: this process runs "
                        "as a world of one, alone (call tgl_dist.DistributedContext.init() "
                        "first to train together)", os.environ["WORLD_SIZE"])
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def comm_device(group=None) -> Optional[torch.device]:
    """Where ``group``'s collectives take their tensors: the current GPU for an NCCL group,
    the CPU for a gloo group, ``None`` (wherever the tensor is) for a group with one
    backend per device type or no process group.

    Every collective here moves its inputs there and its results back to the caller's
    device, so callers keep their tensors where they compute (CPU sampling ids, GPU
    memory rows) with either backend; a tensor already on the right device is not copied.
    """
    if not dist.is_initialized():
        return None
    backend = str(dist.get_backend(group))
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if backend == "gloo":
        return torch.device("cpu")
    return None


def _to(t: Tensor, device: Optional[torch.device]) -> Tensor:
    return t if device is None or t.device == device else t.to(device)


def _guard(fn, what: str):
    try:
        return fn()
    except RuntimeError as e:  # gloo/NCCL raise RuntimeError on timeouts and closed peers
        raise PeerFailureError(
            f"collective '{what}' failed: a peer rank probably died or stopped "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e


def all_to_all_counts(send_counts: Tensor, group=None) -> Tensor:
    """Exchange per-destination counts: returns how many items each rank sends us."""
    _, ws = world(group)
    if ws == 1:
        return send_counts.clone()
    send = _to(send_counts, comm_device(group))
    recv = torch.empty_like(send)
    _guard(lambda: dist.all_to_all_single(recv, send, group=group), "counts")
    return _to(recv, send_counts.device)


def all_to_all_v(x: Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                 group=None) -> Tensor:
    """Variable-size all-to-all of rows of ``x`` (rows already sorted by destination).

    Args:
        x: rows to send, shape ``[sum(send_counts), *]``.
        send_counts: rows for each destination rank.
        recv_counts: rows arriving from each source rank.
    Returns:
        received rows, shape ``[sum(recv_counts), *]``, grouped by source rank.
    """
    _, ws = world(group)
    if ws == 1:
        return x.clone()
    home = x.device
    x = _to(x, comm_device(group)).contiguous()
    out = x.new_empty((int(sum(recv_counts)),) + tuple(x.shape[1:]))
    _guard(lambda: dist.all_to_all_single(out, x, output_split_sizes=list(recv_counts),
                                          input_split_sizes=list(send_counts), group=group),
           "payload")
    return _to(out, home)


def _route(dest: Tensor, ws: int) -> Tuple[Tensor, Tensor]:
    """``(perm, counts)``: the stable order that groups items by destination rank and the
    ``[W]`` items per rank (``ValueError`` for a rank outside ``0..W-1``)."""
    if dest.numel() and not (lambda mm: 0 <= int(mm[0]) and int(mm[1]) < ws)(torch.aminmax(dest)):
        bad = dest[(dest < 0) | (dest >= ws)][0]
        raise ValueError(f"destination rank {int(bad)} is outside the group's ranks "
                         f"0..{ws - 1}")
    return torch.sort(dest, stable=True).indices, torch.bincount(dest, minlength=ws)


class Plan:
    """A routing plan for ids going to their owners (computed once, used for ids and payload).

    Attributes:
        perm: order that sorts the caller's items by destination rank.
        send_counts / recv_counts: per-rank sizes (Python lists).
    """

    def __init__(self, dest: Tensor, group=None) -> None:
        _, ws = world(group)
        self.group = group
        self.perm, counts = _route(dest, ws)
        recv = all_to_all_counts(counts, group)
        self.send_counts: List[int] = counts.tolist()
        self.recv_counts: List[int] = recv.tolist()
        self.n = int(dest.numel())

    def forward(self, x: Tensor) -> Tensor:
        """Send the caller's rows (caller order) to their destinations."""
        return all_to_all_v(x[self.perm], self.send_counts, self.recv_counts, self.group)

    def backward(self, y: Tensor) -> Tensor:
        """Send reply rows (in received order) back; returns them in the caller's order."""
        back = all_to_all_v(y, self.recv_counts, self.send_counts, self.group)
        out = back.new_empty((self.n,) + tuple(back.shape[1:]))
        out[self.perm] = back
        return out


def fetch_rows(owner: Tensor, local_row: Tensor, serve: Callable[[Tensor], Tensor],
               group=None) -> Tensor:
    """Rows of any nodes (or edges), each served by its owner rank.

    Local items take the same route as remote ones: their ids go through the
    all-to-all's self slot (the caller's own segment of the send and receive
    buffers), ``serve`` answers them together with the other ranks' requests, and the
    rows come back through the self slot of the reply all-to-all. There is no
    separate shortcut for them: they pay the same buffer copies, and wait on the same
    collectives (counts, request, reply), as the remote ones. In a world of one all are local
    copies.

    Args:
        owner: owner rank of each requested item, shape ``[n]``.
        local_row: row of each item in its owner's table, shape ``[n]``.
        serve: called on every rank with the local rows others (and we) asked for;
            returns those rows, shape ``[m, *]``.
    Returns:
        the requested rows in the caller's order, shape ``[n, *]``.
    """
    plan = Plan(owner, group)
    asked = plan.forward(local_row)
    return plan.backward(serve(asked))


def push_then_fetch(push_owner: Tensor, push: Tensor, fetch_owner: Tensor, fetch_local: Tensor,
                    apply: Callable[[Tensor], None], serve: Callable[[Tensor], Tensor],
                    group=None) -> Tensor:
    """Rows pushed to their owners and rows fetched from theirs, in 3 all-to-alls instead of 5.

    What :func:`push_rows` then :func:`fetch_rows` do, with the push riding on the fetch's
    request: one all-to-all of the ``[W, 2]`` counts (pushed rows, requested rows per
    rank), one carrying each destination's pushed rows followed by the local rows it is
    asked for, then the reply. Every owner applies what it was pushed (``apply``, on the
    rows grouped by source rank as :func:`push_rows` returns them) before it serves
    (``serve``), so the fetch reads the pushed values: the same result as the two calls.

    Args:
        push_owner: ``[n]`` owner rank of each pushed row.
        push: ``[n, C]`` float32 rows (C the same on every rank; n may be 0).
        fetch_owner / fetch_local: ``[m]`` owner rank and row in its table of each
            requested item.
        apply: called on every rank with the ``[n', C]`` rows pushed to it.
        serve: as in :func:`fetch_rows`: local rows asked for -> ``[m', *]`` float32 rows.
    Returns:
        the requested rows in the caller's order, ``[m, *]``.
    """
    _, ws = world(group)
    C = int(push.size(1))
    if ws == 1:
        apply(push)
        return serve(fetch_local)
    home = push.device
    dev = comm_device(group)
    p_perm, p_counts = _route(push_owner, ws)
    f_perm, f_counts = _route(fetch_owner, ws)
    counts = torch.stack([p_counts, f_counts], 1)                              # [W, 2]
    recv = all_to_all_counts(counts.reshape(-1), group).view(ws, 2)
    sc, rc = counts.tolist(), recv.tolist()
    ids = fetch_local.index_select(0, f_perm).contiguous().view(torch.float32).view(-1, 2)
    rows = push.index_select(0, p_perm)
    pieces = []
    for a, b in zip(rows.split([c[0] for c in sc]), ids.split([c[1] for c in sc])):
        pieces += [a.reshape(-1), b.reshape(-1)]
    send = _to(torch.cat(pieces), dev)
    send_sizes = [a * C + 2 * b for a, b in sc]   # floats: pushed rows, then id bits
    recv_sizes = [a * C + 2 * b for a, b in rc]
    out = send.new_empty(sum(recv_sizes))
    _guard(lambda: dist.all_to_all_single(out, send, output_split_sizes=recv_sizes,
                                          input_split_sizes=send_sizes, group=group),
           "push and request")
    out = _to(out, home)
    got, asked = [], []
    for seg, (a, b) in zip(out.split(recv_sizes), rc):
        got.append(seg[:a * C].view(a, C))
        asked.append(seg[a * C:])
    apply(torch.cat(got))
    asked_rows = torch.cat(asked).view(torch.long)
    reply = serve(asked_rows)
    back = all_to_all_v(reply, [b for _, b in rc], [b for _, b in sc], group)
    res = back.new_empty((int(fetch_owner.numel()),) + tuple(back.shape[1:]))
    res[f_perm] = back
    return res


def push_rows(owner: Tensor, local_row: Tensor, *payloads: Tensor, group=None) -> Tuple[Tensor, ...]:
    """Send items with payloads to their owners (no reply).

    Returns ``(local_rows_received, *payloads_received)`` on each rank: the rows
    in this rank's tables that others (and we) addressed, grouped by source rank.
    """
    plan = Plan(owner, group)
    return (plan.forward(local_row),) + tuple(plan.forward(p) for p in payloads)


class AllToAllV(torch.autograd.Function):
    """Differentiable variable-size all-to-all.

    Forward sends ``x``'s rows (grouped by destination) with ``send_counts``; backward
    sends the gradient rows back the reverse way, so each sender receives the
    gradients of exactly the rows it sent.
    """

    @staticmethod
    def forward(ctx, x: Tensor, send_counts: List[int], recv_counts: List[int], group):
        ctx.counts = (send_counts, recv_counts)
        ctx.group = group
        return all_to_all_v(x, send_counts, recv_counts, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        send_counts, recv_counts = ctx.counts
        return all_to_all_v(grad.contiguous(), recv_counts, send_counts, ctx.group), None, None, None


def all_reduce_(t: Tensor, op=None, group=None) -> Tensor:
    """In-place all-reduce (sum by default); a no-op in a world of one."""
    return all_reduce_async(t, group, op).wait()


class Pending:
    """An all-reduce in flight (:func:`all_reduce_async`): ``wait()`` returns its tensor.

    ``sent`` is the tensor handed to the backend: ``t`` itself, or its copy on the
    group's device, copied back into ``t`` by ``wait()``."""

    def __init__(self, t: Tensor, work=None, sent: Optional[Tensor] = None) -> None:
        self.t, self.work, self.sent = t, work, t if sent is None else sent

    def wait(self) -> Tensor:
        if self.work is not None:
            work, self.work = self.work, None
            _guard(work.wait, "all_reduce")
            if self.sent is not self.t:
                self.t.copy_(self.sent)
        return self.t


def all_reduce_async(t: Tensor, group=None, op=None) -> Pending:
    """Start an in-place all-reduce of ``t`` (sum by default) and return at once (collective).

    Other collectives may run on ``group`` before ``wait()``: on gloo they proceed while
    this one is in flight (its worker threads take the queued operations in turn), on
    NCCL they queue behind it. ``t`` must not be read or written before ``wait()``. In a
    world of one nothing is sent and ``wait()`` returns ``t``. A non-contiguous ``t`` (a
    slice) is reduced through a contiguous copy, written back by ``wait()``.
    """
    if world(group)[1] == 1:
        return Pending(t)
    c = _to(t, comm_device(group))
    if not c.is_contiguous():   # the backends reduce the storage, not the view
        c = c.contiguous()
    return Pending(t, _guard(lambda: dist.all_reduce(c, op=op or dist.ReduceOp.SUM, group=group,
                                                     async_op=True), "all_reduce"), c)


def all_gather_v(x: Tensor, group=None, sizes: Optional[Sequence[int]] = None) -> Tensor:
    """Concatenate every rank's ``x`` (sizes may differ) in rank order, on every rank.

    ``sizes``: every rank's row count, when every rank knows them (one collective instead
    of two: the sizes and row shapes are not exchanged; each rank's rows must then have
    the same shape, and ``x`` must have ``sizes[rank]`` rows).
    """
    if x.dim() == 0:
        raise ValueError("all_gather_v concatenates rows: x needs at least one dimension "
                         "(a scalar: x.view(1))")
    rank, ws = world(group)
    if ws == 1:
        return x.clone()    # a new tensor, as with several ranks
    home = x.device
    x = _to(x, comm_device(group))
    if sizes is not None:
        sizes = [int(v) for v in sizes]
        if len(sizes) != ws or sizes[rank] != x.size(0):
            raise ValueError(f"all_gather_v: sizes {sizes} do not give this rank's {x.size(0)} "
                             f"rows for a group of {ws}")
        return _to(_gather_padded(x, sizes, ws, group), home)
    if x.dim() > 8:
        raise ValueError(f"all_gather_v supports rows of at most 7 dimensions, got {x.dim() - 1}")
    # each rank's row count and row shape (-1 pads): another row shape is an error here,
    # not an abort inside the backend
    head = [x.size(0), x.dim(), *x.shape[1:]] + [-1] * (8 - x.dim())
    n = torch.tensor(head, dtype=torch.long, device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(ws)]
    _guard(lambda: dist.all_gather(sizes, n, group=group), "all_gather sizes")
    shapes = [tuple(s[1:].tolist()) for s in sizes]
    if len(set(shapes)) > 1:
        rows = [f"rank {r}: {list(sh[1:1 + sh[0] - 1])}" for r, sh in enumerate(shapes)]
        raise ValueError(f"all_gather_v: the ranks' rows differ in shape ({'; '.join(rows)})")
    sizes = [int(s[0]) for s in sizes]
    return _to(_gather_padded(x, sizes, ws, group), home)


def _gather_padded(x: Tensor, sizes: List[int], ws: int, group) -> Tensor:
    m = max(sizes)
    pad = x.new_zeros((m,) + tuple(x.shape[1:]))
    pad[: x.size(0)] = x
    out = [torch.empty_like(pad) for _ in range(ws)]
    _guard(lambda: dist.all_gather(out, pad, group=group), "all_gather")
    return torch.cat([o[:s] for o, s in zip(out, sizes)])


def broadcast_object(obj, src: int = 0, group=None):
    """Broadcast a picklable object from ``src``; returns it on every rank."""
    if world(group)[1] == 1:
        return obj
    lst = [obj]
    _guard(lambda: dist.broadcast_object_list(lst, src=src, group=group), "broadcast_object")
    return lst[0]


def all_gather_object(obj, group=None) -> List:
    """Every rank's picklable ``obj``, in rank order, on every rank (``[obj]`` in a world of one)."""
    ws = world(group)[1]
    if ws == 1:
        return [obj]
    out = [None] * ws
    _guard(lambda: dist.all_gather_object(out, obj, group=group), "all_gather_object")
    return out


def all_reduce_max_int(v: int, group=None) -> int:
    """Maximum of an integer over all ranks."""
    t = torch.tensor([v], dtype=torch.long)
    all_reduce_(t, dist.ReduceOp.MAX, group)
    return int(t)


def barrier(group=None) -> None:
    """Wait for every rank (a no-op in a world of one)."""
    if world(group)[1] > 1:
        _guard(lambda: dist.barrier(group=group), "barrier")


def same_as_rank0(message: str, wait_s: float = 3.0) -> bool:
    """Whether rank 0 posted the same ``message`` (an error text) to the process group's
    store: rank 0 posts its own and returns ``False``; another rank waits up to ``wait_s``
    seconds for rank 0's and compares. ``False`` without a process group, or when the
    store is gone or rank 0 posted nothing in time. Not a collective: a rank that fails
    alone does not wait for the others (used to print a job's error once,
    :func:`tgl_dist.cli.fail`)."""
    import datetime
    if not dist.is_available() or not dist.is_initialized():
        return False
    try:
        store = dist.distributed_c10d._get_default_store()
        if dist.get_rank() == 0:
            store.set("tgl_dist/error", message)
            return False
        store.wait(["tgl_dist/error"], datetime.timedelta(seconds=wait_s))
        return store.get("tgl_dist/error").decode() == message
    except Exception:   # a dead store, a timeout: the caller says it itself
        return False
