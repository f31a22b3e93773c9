"""One pass of link-prediction training or evaluation over a loader (the shared loop).

``run_epoch`` is the loop the example and the benchmarks use; it is short because the
mailbox write-back is one call (:meth:`SharedMailBox.update`) and the metrics are
collected over the whole split (:class:`tgl_dist.metrics.LinkPredMetrics`), not
averaged per batch.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tgl_dist.dist import all_reduce_, world
from tgl_dist.metrics import LinkPredMetrics, average_precision
from tgl_dist.dist.parallel import all_reduce_gradients


def link_loss(pos: Tensor, neg: Tensor, meta: Optional[dict] = None,
              world_size: int = 1) -> Tensor:
    """``BCE(pos, 1) + BCE(neg, 0)`` (TGL's loss), means over each side.

    On ``world_size > 1`` ranks, given the step's ``meta`` (the loader's metadata), it is
    scaled by this rank's share of the step: ``B_r * W / N`` for its ``B_r = pos.numel()``
    of the window's ``N`` events. A window is split between ranks by event owner, so the
    shares differ (or are empty); with the scaling, gradients averaged over ranks are the
    gradient of the mean loss over all ``N`` events, as one process computes it. A rank
    with no event gets a zero loss (and zero gradients).
    """
    loss = _LinkBCE.apply(pos, neg)
    if world_size == 1:
        return loss
    if meta is None or "window" not in meta:
        raise ValueError(
            f"link_loss on {world_size} ranks needs the step's metadata with 'window' (the "
            f"global positions of the step's events, as DistributedDataLoader yields it) to "
            f"scale this rank's share; got {None if meta is None else sorted(meta)}")
    B = pos.numel()
    if not B:
        return (pos.sum() + neg.sum()) * 0.0
    start, end = meta["window"]
    return loss * (B * world_size / max(int(end) - int(start), 1))


class _LinkBCE(torch.autograd.Function):
    """``BCE(pos, 1) + BCE(neg, 0)`` (means) as one autograd node: torch's own
    ``binary_cross_entropy_with_logits`` forward, and its gradient
    ``(sigmoid(x) - y) / n`` for both sides in one backward (two BCE nodes and their sum
    are three nodes for the engine to run every step)."""

    @staticmethod
    def forward(ctx, pos: Tensor, neg: Tensor) -> Tensor:
        ctx.save_for_backward(pos, neg)
        return (F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos))
                + F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg)))

    @staticmethod
    def backward(ctx, g: Tensor):
        pos, neg = ctx.saved_tensors
        g_pos = g_neg = None
        if ctx.needs_input_grad[0]:
            g_pos = (torch.sigmoid(pos) - 1.0).mul_(g / pos.numel())
        if ctx.needs_input_grad[1]:
            g_neg = torch.sigmoid(neg).mul_(g / neg.numel())
        return g_pos, g_neg


def _check_mailbox(model: nn.Module, loader: Iterable, mailbox) -> None:
    """A memory model needs the mailbox, and the loader must fetch from that same one
    (it attaches the state to each batch): say so here, not as a ``KeyError: 'mem'``
    from inside the model."""
    uses_memory = getattr(model, "memory_updater", None) is not None
    attached = getattr(loader, "mailbox", mailbox)
    if uses_memory and mailbox is None:
        raise ValueError("the model keeps node memory: pass its SharedMailBox to run_epoch "
                         "(and to the DistributedDataLoader as mailbox=)")
    if mailbox is not None and attached is not mailbox:
        raise ValueError("the loader reads node memory from "
                         f"{'no mailbox' if attached is None else 'another mailbox'}: build the "
                         "DistributedDataLoader with mailbox= the SharedMailBox given to "
                         "run_epoch, so each batch arrives with its memory")


def run_epoch(model: nn.Module, loader: Iterable, mailbox=None,
              optimizer: Optional[torch.optim.Optimizer] = None,
              metrics: Optional[LinkPredMetrics] = None, group=None,
              progress=None, on_step: Optional[Callable[[Dict[str, float]], None]] = None,
              resume: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """Train (``optimizer`` given) or evaluate (no gradient) over every step of ``loader``.

    Each step: forward -> (loss, backward, start of the gradient all-reduce) ->
    ``mailbox.update`` with the positive events (memory read before, written after) ->
    (end of the all-reduce, optimizer step, ``on_step``). The mailbox update reads only
    the forward's outputs, so running it before the optimizer step changes nothing but
    the time; on several ranks the loader's next step (sampling, memory read) is also
    made before it, while the gradients travel, and the step ends just before the next
    forward: the same parameters reach every forward. On several ranks the loop also
    runs inside :meth:`SharedMailBox.deferred_writes`: a step's
    write-back is sent with the next step's memory request (every owner writes before it
    serves: the same values, two all-to-alls a step fewer).
    Every rank runs every step (the loader gives all ranks the same number of steps).

    On ``W > 1`` ranks a step's window of ``N`` events is split unevenly (each rank takes
    its own ``B_r`` events, possibly none), so each rank's loss is scaled by
    ``B_r * W / N`` before ``backward()`` (:func:`link_loss` with ``meta``): the averaged
    gradient is then the gradient of the mean loss over all ``N`` events, as one process
    computes it on the same window (a plain average of the ranks' means would weight each
    rank's events by ``N / (W B_r)`` instead). A rank with no event contributes zero
    gradients.

    Args:
        model: a :class:`TemporalLinkModel` (or anything returning ``LinkPredOutput``).
        loader: yields ``(roots, mfgs, metadata, sample_time)``; on several ranks
            ``metadata['window']`` (the step's global positions, see
            :class:`DistributedDataLoader`) sets each rank's share of the loss.
        mailbox: the :class:`SharedMailBox` the loader fetches from, or ``None``. After
            each step it is written back by ``model.write_back(mailbox, roots, mfgs,
            metadata, out)`` when the model has that method (a custom model's own use of
            the Mailbox API: ``get_update_memory``, ``get_update_mail``,
            ``set_mailbox_all_to_all``; a collective, every rank calls it every step), else
            by ``mailbox.update(out.memory, roots, ...)`` (the built-in models).
        optimizer: train when given.
        metrics: collects ``pos [B]``, first negatives ``[B]`` and all ``k`` negatives.
        group: process group for the gradient and event-count all-reduces.
        progress: optional tqdm-like object with ``update(n)`` (rank 0).
        on_step: called on every rank after every step (after the mailbox update) with
            this rank's accumulators so far, ``{'steps': steps done in this epoch, 'total':
            loss sum, 'events', 'ap_sum', 'ap_batches'}`` (e.g. to write a step checkpoint;
            it may run collectives, every rank calls it at the same step).
        resume: accumulators an ``on_step`` call saved, to continue a partial epoch (the
            loader must start at step ``resume['steps']``, see ``loader.set_epoch``).
    Returns:
        ``{'loss': mean over steps of the loss over each step's whole window (all ranks),
        'events': events over all ranks, 'seconds',
        'events_per_s', 'events_per_cpu_s'}`` (CPU seconds of all ranks' processes: robust
        on a shared machine), and in evaluation with ``metrics`` the mean of per-batch APs
        ``'ap_batch_mean'`` (for comparison with published per-batch figures only).
    """
    _check_mailbox(model, loader, mailbox)
    train = optimizer is not None
    model.train(train)
    ws = world(group)[1]
    total, steps, events, ap_sum, ap_batches = 0.0, 0, 0, 0.0, 0
    if resume is not None:
        total, steps = float(resume["total"]), int(resume["steps"])
        events, ap_sum = int(resume["events"]), float(resume["ap_sum"])
        ap_batches = int(resume.get("ap_batches", steps))   # older checkpoints: every step
    write_back = getattr(model, "write_back", None) if mailbox is not None else None
    t0, c0 = time.perf_counter(), time.process_time()
    # a step's write-back rides on the next step's memory read (3 all-to-alls a step, not 5)
    deferred = mailbox.deferred_writes() if mailbox is not None else contextlib.nullcontext()
    waiting = None   # the last step's end: its gradients in flight, then opt step and hooks

    def finish(w) -> None:
        pending, acc = w
        if pending is not None:
            pending.wait()
            optimizer.step()
        if progress is not None:
            progress.update(1)
        if on_step is not None:
            on_step(acc)

    with torch.set_grad_enabled(train), deferred:
        for roots, mfgs, meta, _ in loader:
            if waiting is not None:   # the loader's step k + 1 was made while step k's
                finish(waiting)       # gradients travelled; step k ends before its forward
                waiting = None
            out = model(mfgs, meta)
            pos, neg = out
            loss = link_loss(pos, neg, meta, ws)  # scaled by this rank's share of the window
            B = pos.numel()
            pending = None
            if train:
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                # the gradients travel while the metrics, the mailbox update and the next
                # step's sampling and memory read run (none reads a parameter); the
                # optimizer steps once they have arrived, before the next forward
                pending = all_reduce_gradients(model, group, async_op=True)
            total += float(loss.detach())
            steps += 1
            events += B
            if metrics is not None:
                k = neg.numel() // max(B, 1)
                neg_k = neg.detach().view(k, B).t() if k > 1 else None
                metrics.update(pos.detach(), neg.detach()[:B], neg_k)
                if not train and B:   # a rank's empty share of a window is no batch
                    ap_sum += average_precision(pos.detach(), neg.detach()[:B])
                    ap_batches += 1
            if write_back is not None:
                write_back(mailbox, roots, mfgs, meta, out)
            elif mailbox is not None:
                mailbox.update(out.memory, roots, meta["src_pos_index"], meta["dst_pos_index"],
                               roots.extra.get("f"), out.embedding, out.mail_uses_embedding,
                               mfgs[-1])
            acc = {"steps": steps, "total": total, "events": events, "ap_sum": ap_sum,
                   "ap_batches": ap_batches}
            if pending is None or ws == 1:
                finish((pending, acc))   # nothing in flight to overlap
            else:
                waiting = (pending, acc)
        if waiting is not None:
            finish(waiting)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0  # all threads of this process (loader thread included)
    cnt = torch.tensor([float(events), total, float(steps), ap_sum, cpu, float(ap_batches)],
                       dtype=torch.float64)
    all_reduce_(cnt, group=group)
    ev = int(cnt[0])
    out = {"loss": float(cnt[1] / max(cnt[2], 1)), "events": ev, "seconds": seconds,
           "events_per_s": ev / max(seconds, 1e-9),
           "events_per_cpu_s": ev / max(float(cnt[4]), 1e-9)}
    if metrics is not None and not train:
        # the mean of per-batch APs (each rank's share of a step is one batch): what TGN,
        # TGL, DyGLib and PyG print; reported beside the whole-split AP for comparison only
        out["ap_batch_mean"] = float(cnt[3] / cnt[5]) if cnt[5] else float("nan")
    return out
