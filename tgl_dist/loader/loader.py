"""``DistributedDataLoader``: time-aligned mini-batches with background sampling.

Per step the loader yields ``(roots, mfgs, metadata, sample_time)``:

* ``roots``: :class:`~tgl_dist.sampling.Roots`; ``roots.nodes = [src | dst | neg_dst
  (| neg_src)]`` queried at the events' times; ``roots.extra['f']`` holds the batch
  events' own features when the graph has edge features, ``roots.extra['neg_dst']``
  ``[k*B]`` the negative destinations and, with :class:`~tgl_dist.sampling.fixed.FixedNegatives`
  (TGB's lists), ``roots.extra['neg_mask']`` ``[k*B]`` (False: padding of a short list);
* ``mfgs``: the sampler's blocks (input-first) with ``srcdata['h']`` node features and
  ``edata['f']`` edge features attached (fetched from their owners); without a
  sampler a single edge-less block over the roots (for memory-only models, JODIE);
* ``metadata``: positions of the roots in every block's sources (root ``i`` is source
  ``i`` of every block): ``src_pos_index`` ``[B]``, ``dst_pos_index`` ``[B]``,
  ``dst_neg_index`` ``[k*B]`` and ``src_neg_index`` ``[k*B]`` (negatives j-major:
  entry ``j*B + i`` is negative j of event i), ``neg_k`` = k, ``num_pos`` = B;
* ``sample_time``: seconds spent building the step (in the background thread).

Ranks advance together (:mod:`tgl_dist.loader.schedule`). Structure sampling, negative
sampling and feature fetches for the next ``queue_size`` steps run in a background
thread whose collectives use the loader's own process group, so they never interleave
with the training loop's collectives. The mailbox is NOT read there: memory must be
read after the previous step's update was applied, so ``mailbox.prepare_input(mfgs)``
runs in the caller's thread when the step is handed out.
"""
from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

import torch
from torch import Tensor

from tgl_dist.dist import all_gather_v, new_group, world
from tgl_dist.graph.store import DistributedGraphStore, EventSet
from tgl_dist.loader.schedule import GlobalSchedule, Window
from tgl_dist.kernels import serial_openmp_thread
from tgl_dist.sampling.block import Block, Roots
from tgl_dist.sampling.hashing import hash_keys
from tgl_dist.sampling.fixed import FixedNegatives
from tgl_dist.sampling.negative import BoundNegatives, NegativeSampling, Stream
from tgl_dist.sampling.neighbor import NeighborSampler

log = logging.getLogger(__name__)

Step = Tuple[Roots, List[Block], dict, float]
_END = object()


class SampleType(enum.Enum):
    """What a batch's roots are (``sampler_fn``); only temporal edges for CTDG link prediction."""

    SAMPLE_FROM_TEMPORAL_EDGES = "temporal_edges"


SAMPLE_TYPE = SampleType


def _step_to(step: Step, device: torch.device) -> Step:
    """A step with every tensor on ``device`` (blocks, roots, metadata)."""
    roots, mfgs, meta, t = step
    mv = lambda v: v.to(device, non_blocking=True) if isinstance(v, Tensor) else v  # noqa: E731
    roots = Roots(*(mv(getattr(roots, k)) for k in ("nodes", "ts", "eids", "src", "dst", "t")),
                  {k: mv(v) for k, v in roots.extra.items()})
    return roots, [b.to(device) for b in mfgs], {k: mv(v) for k, v in meta.items()}, t


def _global_unique(x: Tensor, group) -> Tensor:
    return torch.unique(all_gather_v(torch.unique(x), group))


def _global_max(x: Tensor, group) -> float:
    m = torch.tensor([float(x.max()) if x.numel() else float("-inf")], dtype=torch.float64)
    return float(all_gather_v(m, group).max())


def _stop_producer(th: threading.Thread, stop: threading.Event, q: "queue.Queue") -> None:
    """Stop a background producer and wait for it, emptying its queue so that a producer
    blocked on a full queue can finish (on several ranks it first builds the epoch's
    remaining steps, whose collectives the other ranks are running too)."""
    stop.set()
    while th.is_alive():
        try:
            q.get(timeout=0.05)
        except queue.Empty:
            pass
    th.join()


class DistributedDataLoader:
    """Iterates this rank's events of a split in time-aligned global windows.

    Args:
        graph: this rank's :class:`DistributedGraphStore`.
        data: the rank's events of the split (:class:`EventSet`) or a split name
            (``'train'``, ``'val'``, ``'test'``, ...; built with ``graph.split_events``).
        sampler: a :class:`NeighborSampler` or ``None`` (no neighbours).
        sampler_fn: ``None`` / ``SAMPLE_TYPE.SAMPLE_FROM_TEMPORAL_EDGES`` (roots are the
            events' endpoints), or a callable ``fn(sampler, roots, group, epoch) -> mfgs``.
        neg_sampler: a :class:`NegativeSampling` or ``None`` (no negatives); for
            evaluation also a :class:`~tgl_dist.sampling.fixed.FixedNegatives` (each
            event's pre-generated list, e.g. TGB's).
        batch_size: events PER RANK per step (default 600): each step's window holds
            ``batch_size * world_size`` global events. A config's ``train.batch_size`` is
            the global size: pass ``split_batch(cfg.train.batch_size, world_size)[0]``
            (:func:`tgl_dist.ctdg.run.split_batch`), as :class:`tgl_dist.ctdg.Trainer` does.
        shuffle: visit windows in a random order (seeded, same on all ranks); only
            without a mailbox (memory needs chronological order).
        drop_last: drop a last window smaller than ``batch_size * world_size``.
        chunk_size: TGL random chunk scheduling (training only; see schedule.py).
        train: training (new negatives/uniform draws each epoch, chunk scheduling) or
            evaluation (fixed draws).
        queue_size: steps sampled ahead in the background thread (0: no thread).
        mailbox: object with ``prepare_input(mfgs)`` (filled by the memory module) or None.
        seed: seeds chunk offsets and shuffling.
        group: process group of the background collectives (default: a new one).
        device: where the steps are handed out (``None``: where they were built, the
            CPU). Sampling and feature fetches run on the CPU, in the background thread
            when ``queue_size > 0``; each step is copied to ``device`` when it is handed
            out, just before the mailbox attaches memory (which then lives there too).
    """

    def __init__(self, graph: DistributedGraphStore, data: Union[EventSet, str],
                 sampler: Optional[NeighborSampler] = None,
                 sampler_fn: Union[None, SampleType, Callable] = None,
                 neg_sampler: Optional[NegativeSampling] = None, batch_size: int = 600,
                 shuffle: bool = False, drop_last: bool = False, chunk_size: Optional[int] = None,
                 train: bool = True, queue_size: int = 4, mailbox: Any = None, seed: int = 0,
                 group: Any = "new", device: Union[None, str, torch.device] = None) -> None:
        if isinstance(data, str):
            data = graph.split_events(data)
        if not isinstance(data, EventSet):
            raise TypeError(f"data must be an EventSet or a split name, got {type(data).__name__}")
        for name, v, low in (("batch_size", batch_size, 1), ("queue_size", queue_size, 0),
                             ("chunk_size", 1 if chunk_size is None else chunk_size, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}")
        if sampler is not None and not callable(getattr(sampler, "sample", None)):
            raise TypeError(f"sampler must be a NeighborSampler or None, got "
                            f"{type(sampler).__name__} (build one with NeighborSampler(num_nodes, "
                            f"num_layers, fanout, graph_data))")
        if neg_sampler is not None and not isinstance(neg_sampler, NegativeSampling):
            raise TypeError(f"neg_sampler must be a NegativeSampling or None, got {neg_sampler!r} "
                            f"(e.g. NegativeSampling('triplet', 'random'))")
        if shuffle and mailbox is not None:
            raise ValueError("shuffle=True with a mailbox: node memory needs chronological batches")
        if sampler_fn not in (None, SampleType.SAMPLE_FROM_TEMPORAL_EDGES) and not callable(sampler_fn):
            raise ValueError(f"sampler_fn must be SAMPLE_TYPE.SAMPLE_FROM_TEMPORAL_EDGES, None or a "
                             f"callable, got {sampler_fn!r}")
        self.graph = graph
        self.data = data
        self.sampler = sampler
        self.sampler_fn = sampler_fn if callable(sampler_fn) else None
        self.neg_sampler = neg_sampler
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.train = bool(train)
        self.chunk_size = chunk_size
        self.queue_size = queue_size
        self.mailbox = mailbox
        self.device = None if device is None else torch.device(device)
        self.seed = int(seed)
        self.rank, self.world_size = world()
        self.group = new_group() if group == "new" else group
        self.window = self.batch_size * self.world_size
        if self.chunk_size is not None and self.window % self.chunk_size:
            raise ValueError(f"chunk_size={chunk_size} must divide batch_size * world_size = {self.window}")
        self._check_same_on_all_ranks()
        self.schedule = GlobalSchedule(data.eid, self.group)
        self.negatives = self._bind_negatives() if neg_sampler is not None else None
        self.epoch = -1
        self._thread: Optional[threading.Thread] = None

    def _check_same_on_all_ranks(self) -> None:
        """Every rank must build the loader with the same schedule arguments: different
        batch sizes give different step counts (a collective then waits forever), a
        different seed or chunk size silently breaks the time alignment of the windows."""
        if self.world_size == 1:
            return
        fields = ("batch_size", "chunk_size", "seed", "shuffle", "drop_last", "train")
        mine = torch.tensor([[int(getattr(self, f) or 0) for f in fields]], dtype=torch.long)
        every = all_gather_v(mine, self.group)                       # [W, fields]
        for j, f in enumerate(fields):
            col = every[:, j]
            if not bool((col == col[0]).all()):
                raise ValueError(f"DistributedDataLoader({self.data.name!r}): {f} differs between "
                                 f"ranks ({', '.join(f'rank {r}: {v}' for r, v in enumerate(col.tolist()))}); "
                                 f"every rank must pass the same value")

    # -------------------------------------------------------------- negatives
    def _bind_negatives(self) -> BoundNegatives:
        ns, g, grp = self.neg_sampler, self.graph, self.group
        split = self.data.name
        if isinstance(ns, FixedNegatives):   # each event's own list (TGB's): nothing to gather
            return ns.bind(split, self.train)
        if self.train or split.startswith("new_node"):
            own = self.data
        else:
            own = g.split_events("all")
        if ns.strategy == "random":   # the distinct destinations only: O(N)
            pool = _global_unique(own.dst, grp)
            stream = Stream(own.src[:0], own.dst[:0], own.t[:0], g.num_nodes)
        else:   # this rank's events; the pairs get sharded over the ranks (PairShards)
            pool, stream = None, Stream(own.src, own.dst, own.t, g.num_nodes)
        t_obs = None
        if ns.strategy == "inductive":
            prev = "train" if split in ("val", "new_node_val") else "val"
            t_obs = _global_max(g.split_events(prev).t, grp)
        return ns.bind(split, self.train, stream, pool, t_obs, grp)

    # ----------------------------------------------------------------- epochs
    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """The next iteration runs epoch ``epoch`` (default: one more than the last).

        Args:
            epoch: the epoch the next ``iter(loader)`` runs.
            start_step: resume inside the epoch: the next iteration skips its first
                ``start_step`` steps WITHOUT building them (negatives and uniform draws
                are counter-based on ``(seed, epoch, event)``, so steps ``start_step..``
                are the same as in an uninterrupted epoch). Applies to that one
                iteration only.
        """
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.epoch = int(epoch) - 1
        self._start_step = int(start_step)

    @property
    def position(self) -> Tuple[int, int]:
        """``(epoch, start_step)`` the next iteration will run (see :meth:`set_epoch`)."""
        return self.epoch + 1, getattr(self, "_start_step", 0)

    def _plan(self, epoch: int) -> List[Window]:
        offset = 0
        key = int(hash_keys(self.seed, int(epoch))) & ((1 << 62) - 1)
        if self.train and self.chunk_size:
            offset = (key % (self.window // self.chunk_size)) * self.chunk_size
        wins = self.schedule.windows(self.schedule.boundaries(self.window, offset, self.drop_last))
        if self.shuffle:
            g = torch.Generator().manual_seed(key)
            wins = [wins[i] for i in torch.randperm(len(wins), generator=g).tolist()]
        return wins

    def __len__(self) -> int:
        """Steps per epoch (same on every rank); chunk scheduling may add one short first step."""
        return len(self.schedule.windows(self.schedule.boundaries(self.window, 0, self.drop_last)))

    # ------------------------------------------------------------------ steps
    def _roots(self, w: Window, epoch: int) -> Tuple[Roots, dict]:
        ev = self.data.select(slice(w.lo, w.hi))
        B = len(ev)
        nodes, ts = [ev.src, ev.dst], [ev.t, ev.t]
        ar = torch.arange(B)
        meta = {"src_pos_index": ar, "dst_pos_index": ar + B, "num_pos": B, "neg_k": 0}
        extra = {}
        ng = self.negatives
        if ng is not None:
            k = ng.cfg.num_neg
            if ng.cfg.strategy == "random":
                # evaluation: no negative equals its event's destination (TGB's filter)
                neg_dst = ng.random(ev.eid, epoch, None if self.train else ev.dst).reshape(-1)
                neg_src = None
            elif ng.cfg.strategy == FixedNegatives.strategy_name:
                neg_dst, mask = ng.rows(ev.eid, ev.dst)
                neg_dst, neg_src = neg_dst.reshape(-1), None
                extra["neg_mask"] = mask.reshape(-1)
            else:
                gs, ge = w.start, w.end   # collective: the window's pairs are drawn together
                pairs = ng.window(ev.src, ev.dst, ev.t, (ge - gs) * k, gs, epoch, ge - gs)
                pos = (self.schedule.local_pos[w.lo:w.hi] - gs)
                sel = (torch.arange(k).view(k, 1) * (ge - gs) + pos.view(1, -1)).reshape(-1)
                neg_src, neg_dst = pairs[0][sel], pairs[1][sel]
            tk = ev.t.repeat(k)
            nodes.append(neg_dst)
            ts.append(tk)
            meta["dst_neg_index"] = torch.arange(2 * B, 2 * B + k * B)
            if neg_src is None:
                meta["src_neg_index"] = ar.repeat(k)
            else:
                nodes.append(neg_src)
                ts.append(tk)
                meta["src_neg_index"] = torch.arange(2 * B + k * B, 2 * B + 2 * k * B)
                extra["neg_src"] = neg_src
            extra["neg_dst"] = neg_dst
            meta["neg_k"] = k
        roots = Roots(torch.cat(nodes), torch.cat(ts), ev.eid, ev.src, ev.dst, ev.t, extra)
        if self.graph.edge_feat_dim:
            roots.extra["f"] = self.graph.local_edge_feat(ev.eid)
        return roots, meta

    def _make(self, w: Window, epoch: int) -> Step:
        t0 = time.perf_counter()
        roots, meta = self._roots(w, epoch)
        samp_epoch = epoch if self.train else -1
        if self.sampler_fn is not None:
            mfgs = self.sampler_fn(self.sampler, roots, self.group, samp_epoch)
        elif self.sampler is not None:
            mfgs = self.sampler.sample(roots.nodes, roots.ts, self.group, samp_epoch)
        else:
            e = torch.zeros(0, dtype=torch.long)
            mfgs = [Block({"ID": roots.nodes, "ts": roots.ts},
                          {"ID": e, "dt": torch.zeros(0)}, torch.zeros(2, 0, dtype=torch.long),
                          int(roots.nodes.numel()))]
        self._attach_features(mfgs)
        meta["window"] = (w.start, w.end)
        return roots, mfgs, meta, time.perf_counter() - t0

    def _attach_features(self, mfgs: List[Block]) -> None:
        g = self.graph
        if g.node_feat_dim and mfgs:
            h = g.get_node_feat(mfgs[0].srcdata["ID"], self.group)  # sources of all blocks
            for b in mfgs:
                b.srcdata["h"] = h[:b.num_src]
        if g.edge_feat_dim and mfgs:
            f = g.get_edge_feat(torch.cat([b.edata["ID"] for b in mfgs]), self.group)
            for b, part in zip(mfgs, torch.split(f, [b.num_edges for b in mfgs])):
                b.edata["f"] = part

    # -------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Step]:
        self._join()
        self.epoch += 1
        epoch = self.epoch
        start, self._start_step = getattr(self, "_start_step", 0), 0
        wins = self._plan(epoch)
        if start > len(wins):
            raise ValueError(f"set_epoch(start_step={start}) but epoch {epoch} of "
                             f"{self.data.name!r} has {len(wins)} steps")
        wins = wins[start:]
        if self.queue_size <= 0:
            for w in wins:
                yield self._hand_out(self._make(w, epoch))
            return
        q: "queue.Queue" = queue.Queue(maxsize=self.queue_size)
        stop = threading.Event()
        # CUDA's current device is per thread (a new one starts on GPU 0): the producer runs
        # the sampler's and the store's collectives, so it takes this thread's GPU
        gpu = torch.cuda.current_device() if torch.cuda.is_initialized() else None
        th = threading.Thread(target=self._produce, args=(wins, epoch, q, stop, gpu),
                              name=f"tgl_dist-loader-{self.data.name}", daemon=True)
        self._thread, self._stop, self._queue = th, stop, q
        th.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield self._hand_out(item)
        finally:
            _stop_producer(th, stop, q)
            if self._thread is th:
                self._thread = None

    def _hand_out(self, step: Step) -> Step:
        if self.device is not None:
            step = _step_to(step, self.device)
        if self.mailbox is not None:
            self.mailbox.prepare_input(step[1])
        return step

    def _produce(self, wins: List[Window], epoch: int, q: "queue.Queue", stop: threading.Event,
                 gpu: Optional[int] = None) -> None:
        # torch's intra-op thread count is process-wide: the sampler's ``workers`` is not
        # applied here (it would change the training thread's setting too). This thread's
        # operators run on one OpenMP thread: a second team of workers would stop the
        # training thread's from spin-waiting (steps 2x slower on 2 cores).
        try:
            if not serial_openmp_thread():
                log.debug("loader thread: torch's OpenMP runtime not reachable, its "
                          "operators may start their own team of workers")
            if gpu is not None:
                torch.cuda.set_device(gpu)
            for w in wins:
                if stop.is_set() and self.world_size == 1:
                    return
                step = self._make(w, epoch)  # after a stop on >1 ranks: finish the epoch's collectives
                while not stop.is_set():
                    try:
                        q.put(step, timeout=0.1)
                        break
                    except queue.Full:
                        continue
            q.put(_END)
        except BaseException as e:  # hand the failure to the consumer
            log.exception("loader background thread failed")
            q.put(e)

    def _join(self) -> None:
        """Stop the producer of an iteration abandoned with its iterator still alive."""
        if self._thread is not None:
            _stop_producer(self._thread, self._stop, self._queue)
        self._thread = None

    def close(self) -> None:
        """Stop the background thread of an iteration left unfinished (an abandoned
        iterator, an exception in the loop); safe to call at any time, and again."""
        self._join()

    def __repr__(self) -> str:
        return (f"DistributedDataLoader(split={self.data.name!r}, events={len(self.data)}, "
                f"steps={len(self)}, batch_size={self.batch_size}, world_size={self.world_size}, "
                f"train={self.train})")
