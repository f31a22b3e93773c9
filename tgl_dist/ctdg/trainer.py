"""``Trainer``: link-prediction training of a CTDG model over epochs, with evaluation, early stopping, checkpoints and hooks.

The counterpart of :class:`tgl_dist.dtdg.Trainer`. Each epoch: the memory is reset, the
model trains over the training split (one optimizer step per global window of
``batch_size`` events, split over the ranks), then validation continues the memory from
training and test from validation; AP / AUC / MRR are computed over each WHOLE split
gathered from all ranks. The reported test figures are those of the epoch with the best
validation AP (early stopping on it); with ``eval_protocol='tgb'`` validation and test rank
each positive against TGB's own negatives and the selection is on validation MRR
(:mod:`tgl_dist.ctdg.tgb_protocol`). Examples: ``examples/ctdg/train_tgn.py`` (the
built-in models), ``examples/ctdg/custom_model.py`` (a model of one's own); guide:
``docs/training.md``.
"""
from __future__ import annotations

import csv
import json
import logging
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from tgl_dist.checkpoint import RunCheckpoint, capture, config_dict, partition_identity, restore
from tgl_dist.checkpoint.manager import rng_state, set_rng_state
from tgl_dist.ctdg.builder import build_model
from tgl_dist.ctdg.config import ModelConfig
from tgl_dist.ctdg.curves import CURVES, PLOT_HINT, have_matplotlib, plot_runs, read_run
from tgl_dist.ctdg.run import (LoaderTap, RunSetupError, ensure_partition, make_run_dir,
                               split_batch)
from tgl_dist.ctdg import tgb_protocol
from tgl_dist.ctdg.training import run_epoch
from tgl_dist.dist import all_gather_v, broadcast_parameters, new_group, world
from tgl_dist.dist.exchange import all_reduce_max_int
from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
from tgl_dist.graph.tcsr import choose_mode
from tgl_dist.loader import DistributedDataLoader
from tgl_dist.memory import SharedMailBox
from tgl_dist.metrics import EarlyStopMonitor, EdgeBank, EdgeBankMetrics, LinkPredMetrics
from tgl_dist.optim import build_optimizer
from tgl_dist.partition import partition_load
from tgl_dist.sampling import NegativeSampling, NeighborSampler
from tgl_dist.sampling.negative import STRATEGIES

log = logging.getLogger(__name__)

StepHook = Callable[["Trainer", int, int], None]            # (trainer, epoch, steps done)
EpochHook = Callable[["Trainer", int, Dict[str, Any]], None]  # (trainer, epoch, record)
EvalHook = Callable[["Trainer", int, str], None]             # (trainer, epoch, split)
CSV_FIELDS = ["epoch", "train_loss", "train_ap", "train_events_per_s", "val_ap", "val_auc",
              "val_mrr", "test_ap", "test_auc", "test_mrr", "val_ap_batch_mean",
              "test_ap_batch_mean", "epoch_s"]


def _median(xs: List[float]) -> float:
    """The upper median (NaN for no values)."""
    return sorted(xs)[len(xs) // 2] if xs else float("nan")


def summary_json(summary: Mapping[str, Any]) -> str:
    """One line of strict JSON: floats rounded to 5 digits, NaN as ``null``."""
    return json.dumps({k: (None if isinstance(v, float) and v != v else
                           round(v, 5) if isinstance(v, float) else v)
                       for k, v in summary.items()})


class _Scores:
    """Fans each batch's scores out to the split's :class:`LinkPredMetrics` and custom metrics."""

    def __init__(self, main: LinkPredMetrics, extra: Mapping[str, Any]) -> None:
        self.main, self.extra = main, extra

    def update(self, pos, neg, neg_k=None) -> None:
        self.main.update(pos, neg, neg_k)
        for m in self.extra.values():
            m.update(pos, neg, neg_k)


class _Tap(LoaderTap):
    """The loader handing each step's positives and negatives to EdgeBank's metrics."""

    def __init__(self, loader, eb: EdgeBankMetrics) -> None:
        super().__init__(loader)
        self._eb = eb

    def on_step(self, step: int, roots, meta) -> None:
        B, k = int(meta["num_pos"]), int(meta["neg_k"])
        if k:
            ns = roots.extra.get("neg_src")
            self._eb.update(step, roots.src, roots.dst, roots.extra["neg_dst"].view(k, B).t(),
                            None if ns is None else ns.view(k, B).t())


class Trainer:
    """Train a temporal link predictor on a dataset partitioned over the ranks.

    Args:
        config: a TGL-style :class:`ModelConfig` (:func:`load_config`); ``train`` sets
            epochs, lr, patience, ``reorder`` and the batch size (``batch_size``: events per
            step over ALL ranks; ``local_batch_size``: per rank, as TGL's dist configs);
            ``sampling`` the neighbour sampler (``no_sample``: roots only); ``memory`` the
            :class:`SharedMailBox` (``type: node``).
        data: dataset name or file (:func:`tgl_dist.data.load_dataset`) or a
            :class:`~tgl_dist.data.TemporalGraph` (default the built-in ``'synthetic'``).
        parts: partition root; ``<parts>/<name>/<partition_algo>_<P>`` is written on first
            use (rank 0; see :func:`tgl_dist.ctdg.run.ensure_partition`).
        model: ``None`` (build the config's model), an ``nn.Module``, or a factory
            ``model(trainer) -> nn.Module`` called once the graph and mailbox exist (it
            reads ``trainer.graph.node_feat_dim``, ``trainer.mailbox.dim_mail``...). The
            model takes ``(mfgs, metadata)`` and returns :class:`LinkPredOutput`
            ``(pos [B], neg [k*B])`` logits with ``.memory [R, d_m]`` (or ``None``) and
            ``.embedding``; a model with a ``write_back(mailbox, roots, mfgs, metadata, out)``
            method writes its own memory and mails (Mailbox API), else
            ``mailbox.update(out.memory, ...)`` does (see :func:`run_epoch`).
        context: the :class:`DistributedContext` (device and process-group timeout);
            default: the world as it is, on the CPU.
        metrics: custom evaluation metrics ``{name: factory}``; ``factory()`` gives an
            object with ``update(pos [B], neg [B], neg_k [B, k] or None)`` (every eval
            batch) and ``compute(group) -> float`` (collective, whole split); recorded as
            ``val_<name>`` / ``test_<name>`` (history, CSV, summary).
        on_step: hooks (a list, or one callable) ``hook(trainer, epoch, steps_done)`` on
            every rank after each training step (optimizer step and write-back done).
        on_evaluate: hooks ``hook(trainer, epoch, split)`` on every rank when the
            evaluation of ``'val'`` or ``'test'`` starts.
        on_epoch_end: hooks ``hook(trainer, epoch, record)`` on every rank after each
            epoch's bookkeeping (record: the CSV row, which a hook may extend).
        checkpoint_dir, checkpoint_every, checkpoint_keep_every, resume: versioned
            checkpoints (``'500'`` steps or ``'1e'`` epochs; one after the last epoch); a
            resumed run ends exactly as one that never stopped.
        out: the run folder (default ``runs/<name>_<model>_<timestamp>``, rank 0's time):
            ``metrics.csv``, ``summary.json``, ``config.yml`` (the resolved config and
            the run's settings) and ``curves.png`` (with matplotlib installed).
        metrics_csv: per-epoch CSV (default ``<out>/metrics.csv``).
        progress: tqdm bars on rank 0. eval_neg: negatives per positive for MRR.
        eval_protocol: ``'random'`` (val/test negatives drawn here, ``eval_neg`` per
            positive; model selection on val AP) or ``'tgb'`` (a TGB dataset,
            ``tgbl-*``: each val/test positive ranked against TGB's own pre-generated
            negatives; ``val_mrr`` / ``test_mrr`` and ``val_hits@10`` / ``test_hits@10``
            as TGB's ``Evaluator`` computes them, over the whole split; model selection
            and early stopping on val MRR, as TGB; EdgeBank on the same negatives; see
            :mod:`tgl_dist.ctdg.tgb_protocol`). Training uses random negatives either way.
        seed: parameters, negatives, chunk offsets. sampling_mode: ``'auto'``
            (:func:`tgl_dist.graph.tcsr.choose_mode`: full where it fits, else partitioned),
            ``'full'`` or
            ``'partitioned'``. queue_size: steps sampled ahead (default 0 on <= 2 cores).
        partition_algo, repartition, root, format, dataset_kwargs: how ``data`` is read
            and partitioned (``dataset_kwargs`` e.g. ``{'num_nodes': 60}`` for synthetic).
        eval_strategies: DyGLib's negative-sampling protocols to report, names from
            ``('random', 'historical', 'inductive')`` (:mod:`tgl_dist.sampling.negative`).
            Training, the per-epoch validation, early stopping and the CSV always use
            ``'random'`` (the figures ``val_ap``, ``test_ap``...). For each other name
            ``s``, after the last epoch the best epoch's state is evaluated again on val
            then test with ``s`` negatives (:meth:`evaluate`): summary keys ``val_ap_<s>``,
            ``test_ap_<s>``, ``test_auc_<s>``, ``test_mrr_<s>``, EdgeBank's
            ``edgebank_test_{ap,auc,mrr}_<s>`` on the same negatives and the pass's
            seconds ``eval_<s>_s``. The state is cloned in memory only then; NaN (and a
            WARNING) when the best epoch ran before a resume (not in the checkpoint).

    ``fit()`` returns the summary (the keys ``train_tgn.py`` prints). Every rank must
    build the trainer and call ``fit()`` (collectives).
    """

    def __init__(self, config: ModelConfig, data: Union[str, Any] = "synthetic", *,
                 parts: Union[str, Path] = "parts",
                 model: Union[None, nn.Module, Callable[["Trainer"], nn.Module]] = None,
                 context: Any = None, metrics: Optional[Mapping[str, Callable[[], Any]]] = None,
                 on_step: Optional[List[StepHook]] = None,
                 on_evaluate: Optional[List[EvalHook]] = None,
                 on_epoch_end: Optional[List[EpochHook]] = None,
                 checkpoint_dir: Optional[str] = None, checkpoint_every: Any = "1e",
                 checkpoint_keep_every: int = 0, resume: bool = False,
                 out: Union[None, str, Path] = None,
                 metrics_csv: Optional[str] = None, progress: bool = True, eval_neg: int = 9,
                 eval_protocol: str = "random",
                 seed: int = 0, sampling_mode: str = "auto", queue_size: Optional[int] = None,
                 partition_algo: str = "metis_for_tgnn", repartition: bool = False,
                 root: Optional[str] = None, format: Optional[str] = None,
                 dataset_kwargs: Optional[Dict[str, Any]] = None,
                 eval_strategies: Union[str, Sequence[str]] = ("random",)) -> None:
        self.config, self.context = config, context
        self.eval_strategies = check_strategies(eval_strategies)
        self.extra_metrics = dict(metrics or {})
        taken = sorted(set(self.extra_metrics) & {"ap", "auc", "mrr", "ap_batch_mean",
                                                   "hits@10"})
        if taken:
            raise ValueError(f"metrics: {taken} would replace the built-in val_/test_ figures "
                             f"of that name; choose other names")
        self.step_hooks: List[StepHook] = _hook_list(on_step, "on_step")
        self.eval_hooks: List[EvalHook] = _hook_list(on_evaluate, "on_evaluate")
        self.hooks: List[EpochHook] = _hook_list(on_epoch_end, "on_epoch_end")
        if eval_protocol not in tgb_protocol.PROTOCOLS:
            raise ValueError(f"eval_protocol must be one of {tgb_protocol.PROTOCOLS}, got "
                             f"{eval_protocol!r}")
        if eval_protocol == "tgb":
            tgb_protocol.tgb_dataset_name(data)   # a clear error before any partitioning
            if set(self.eval_strategies) - {"random"}:
                raise ValueError(f"eval_strategies {list(self.eval_strategies)} with "
                                 f"eval_protocol='tgb': TGB's protocol has its own negatives; "
                                 f"ask for the historical/inductive strategies in a run with "
                                 f"eval_protocol='random'")
        self.eval_protocol = eval_protocol
        self.select_on = "val_mrr" if eval_protocol == "tgb" else "val_ap"
        self.rank, self.world_size = world()
        self.device = torch.device(context.device) if context is not None else torch.device("cpu")
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        tr = config.train
        self.batch_size = tr.global_batch_size(self.world_size)   # events per step, all ranks
        if tr.local_batch_size is not None:
            log.info("train.local_batch_size %d per rank: %d events per step over %d ranks",
                     tr.local_batch_size, self.batch_size, self.world_size)
        self.per_rank_batch, chunk = split_batch(self.batch_size, self.world_size, tr.reorder)
        self.folder = ensure_partition(data, parts, partition_algo, self.world_size, self.rank,
                                       repartition, root, format, dataset_kwargs,
                                       tgb_negatives=eval_protocol == "tgb")
        self.pdata = partition_load(self.folder, partition_algo)
        self.graph = DistributedGraphStore(self.pdata)
        smp = config.sampling
        self.sampler = None
        if not smp.no_sample:
            if sampling_mode == "auto":   # every rank must agree: full only where it fits all
                sampling_mode, why = choose_mode(int(self.pdata.manifest["num_events"]),
                                                 self.world_size)
                if all_reduce_max_int(int(sampling_mode != "full")):
                    sampling_mode = "partitioned"
                if self.rank == 0:
                    log.info("sampling mode %s (auto): %s on rank 0", sampling_mode, why)
            tcsr = TemporalNeighborSampleGraph(self.pdata, mode=sampling_mode)
            self.sampler = NeighborSampler(self.graph.num_nodes, smp.layer, list(smp.neighbor),
                                           tcsr, policy=smp.strategy, seed=seed,
                                           graph_name=self.folder.name)
        self.mailbox = None
        if config.has_memory:
            self.mailbox = SharedMailBox(int(self.pdata.ids.numel()), config.memory,
                                         self.graph.edge_feat_dim, partition_book=self.pdata.book,
                                         device=self.device)
        cores = max(1, (os.cpu_count() or 1) // self.world_size)
        qs = queue_size if queue_size is not None else (0 if cores <= 2 else 4)
        negs = {"train": NegativeSampling("triplet", "random", 1, seed=seed)}
        negs["val"] = negs["test"] = NegativeSampling("triplet", "random", eval_neg, seed=seed)
        self.tgb: Optional[tgb_protocol.TGBProtocol] = None
        if eval_protocol == "tgb":   # TGB's own val/test negatives, each rank its events'
            self.tgb = tgb_protocol.TGBProtocol(tgb_protocol.tgb_dataset_name(self.folder.name),
                                                self.graph)
            negs.update(self.tgb.negatives)
        self.loaders = {
            s: DistributedDataLoader(self.graph, s, sampler=self.sampler, neg_sampler=negs[s],
                                     batch_size=self.per_rank_batch, train=s == "train",
                                     mailbox=self.mailbox,
                                     chunk_size=chunk if s == "train" else None, seed=seed,
                                     queue_size=qs, device=self.device,
                                     group=context.new_group() if context is not None
                                     else new_group())   # with the context's timeout
            for s in ("train", "val", "test")}
        if model is None:
            model = build_model(config, self.graph.node_feat_dim, self.graph.edge_feat_dim,
                                num_nodes=self.graph.num_nodes, partition_book=self.pdata.book)
        elif not isinstance(model, nn.Module):
            model = model(self)
        self.model = model.to(self.device)
        broadcast_parameters(self.model)
        self.optimizer = build_optimizer(self.model, lr=tr.lr)
        self.stopper = EarlyStopMonitor(patience=tr.patience)
        self.progress = progress and self.rank == 0
        self.eval_neg, self.partition_algo = eval_neg, partition_algo
        self.checkpoint = RunCheckpoint(
            checkpoint_dir, checkpoint_every, keep_every=checkpoint_keep_every, resume=resume,
            run_meta={"partition": partition_identity(self.pdata.manifest),
                      "config": config_dict(config, drop=[("train", "epoch")]),
                      "seed": seed, "eval_neg": eval_neg, "sampling_mode": sampling_mode,
                      **({"eval_protocol": eval_protocol} if self.tgb is not None else {})})
        self.run_dir = make_run_dir(out, self.folder.name, config.name)
        self.csv_path = Path(metrics_csv or self.run_dir / "metrics.csv")
        self.run_settings = {"data": self.folder.name, "world_size": self.world_size,
                             "seed": seed, "eval_neg": eval_neg, "sampling_mode": sampling_mode,
                             "partition_algo": partition_algo, "batch_size": self.batch_size,
                             "metrics_csv": str(self.csv_path), "eval_protocol": eval_protocol,
                             "eval_strategies": list(self.eval_strategies)}
        # the loop's state (what a checkpoint holds besides the modules and the mailbox)
        self.history: List[Dict[str, Any]] = []
        self.best: Optional[Dict[str, Any]] = None
        self.speeds: List[float] = []
        self.cpu_speeds: List[float] = []
        self.epoch, self.global_step, self.stopped = 0, 0, False
        self._start_step, self._partial = 0, None
        # EdgeBank's val/test figures: computed in the first epoch this process runs (the
        # evaluation negatives and windows are the same every epoch, see fit())
        self.edgebank: Optional[Dict[str, float]] = None
        self._eb_bank: Optional[EdgeBank] = None
        # the other negative-sampling protocols (see evaluate()): the state at the start of
        # this epoch's val pass and that of the best epoch (epoch, model state, mailbox
        # shard), kept in memory only when a non-random strategy is asked for
        self._eval_state: Optional[Tuple[int, Dict[str, Any], Optional[Dict]]] = None
        self._best_state: Optional[Tuple[int, Dict[str, Any], Optional[Dict]]] = None
        self.strategy_results: Dict[str, float] = {}
        saved = self.checkpoint.load() if self.checkpoint.enabled else None
        if saved is not None:
            self.load_checkpoint_state(*saved)

    # ------------------------------------------------------------ checkpoints
    def checkpoint_state(self, step: int = 0, acc: Optional[Dict] = None,
                         metrics: Optional[LinkPredMetrics] = None) -> tuple:
        """``(dense, shard, meta)`` of the run now: model, optimizer, this rank's
        mailbox shard, RNG states, the loop's bookkeeping and (mid-epoch, ``step`` > 0)
        the epoch's accumulators ``acc`` and training ``metrics``; ``meta`` is
        ``{'epoch', 'step', 'global_step', 'done'}`` (where :meth:`fit` continues)."""
        loop = {"history": self.history, "best": self.best, "stopper": self.stopper.state_dict(),
                "speeds": self.speeds, "cpu_speeds": self.cpu_speeds,
                "edgebank": self.edgebank}
        part = None if acc is None else {"acc": dict(acc), "metrics": metrics.state_dict()}
        dense, shard = capture(self.model, self.optimizer, self.mailbox, self.rank, loop, part)
        return dense, shard, {"epoch": self.epoch, "step": step,
                              "global_step": self.global_step, "done": self.stopped}

    def load_checkpoint_state(self, dense: Dict, shard: Dict, meta: Dict) -> None:
        """Restore :meth:`checkpoint_state` (RNG states last); :meth:`fit` then continues."""
        loop, self._partial = restore(dense, shard, self.model, self.optimizer, self.mailbox)
        self.history, self.best = loop["history"], loop["best"]
        self.speeds, self.cpu_speeds = loop["speeds"], loop["cpu_speeds"]
        self.stopper.load_state_dict(loop["stopper"])
        self.edgebank = loop.get("edgebank")   # None from older checkpoints: computed again
        self.epoch, self._start_step = int(meta["epoch"]), int(meta["step"])
        self.global_step, self.stopped = int(meta["global_step"]), bool(meta["done"])

    def _save(self, step: int = 0, acc=None, metrics=None) -> None:
        self.checkpoint.save(*self.checkpoint_state(step, acc, metrics))

    # ------------------------------------------------------------ one split
    def run_split(self, epoch: int, split: str) -> Dict[str, Any]:
        """Train (``'train'``) or evaluate ``split`` of ``epoch``; its fields of the record."""
        ck, train = self.checkpoint, split == "train"
        m = LinkPredMetrics()
        extra = {} if train else {k: f() for k, f in self.extra_metrics.items()}
        first, acc0 = 0, None
        if train and self._partial is not None:   # the resumed partial epoch's accumulators
            first, acc0 = self._start_step, self._partial["acc"]
            m.load_state_dict(self._partial["metrics"])
        if not train:
            for hook in self.eval_hooks:
                hook(self, epoch, split)
        loader = self.loaders[split]
        loader.set_epoch(epoch, first)
        eb = tgb = None
        if not train and self._eb_bank is not None:   # EdgeBank on the model's negatives
            eb = EdgeBankMetrics(self._eb_bank)
        if not train and self.tgb is not None:   # TGB's negatives: masks, TGB's ranks
            loader = tgb = self.tgb.tap(loader, eb)
        elif eb is not None:
            loader = _Tap(loader, eb)
        scores = _Scores(m, extra) if tgb is None else tgb.scores(m, extra)
        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=len(loader), initial=first, desc=f"epoch {epoch} {split}",
                       leave=False, file=sys.stderr)
        ck.at(epoch, split, first)

        def on_step(acc: Dict[str, float]) -> None:
            ck.at(epoch, split, acc["steps"])
            if train:
                self.global_step += 1
                if ck.step_due(self.global_step):
                    self._save(acc["steps"], acc, m)
                for hook in self.step_hooks:
                    hook(self, epoch, acc["steps"])
        res = run_epoch(self.model, loader, self.mailbox, self.optimizer if train else None,
                        scores, progress=bar, on_step=on_step, resume=acc0)
        if bar is not None:
            bar.close()
        r = m.compute()
        if train:
            # a resumed partial epoch's speed counts events from before the resume
            eps = float("nan") if acc0 is not None else res["events_per_s"]
            if acc0 is None:
                self.speeds.append(res["events_per_s"])
                self.cpu_speeds.append(res["events_per_cpu_s"])
            return {"train_loss": res["loss"], "train_ap": r["ap"], "train_events_per_s": eps}
        out = {f"{split}_ap": r["ap"], f"{split}_auc": r["auc"],
               f"{split}_mrr": r.get("mrr", float("nan")),
               f"{split}_ap_batch_mean": res["ap_batch_mean"]}
        out.update({f"{split}_{k}": float(v.compute(None)) for k, v in extra.items()})
        if tgb is not None:   # collective: TGB's MRR and hits@10 over the whole split
            out.update(tgb.compute(split))
        if eb is not None:   # collective; the bank then holds the split's positives too
            r = eb.compute(None)
            self.edgebank.update({f"{split}_{m}": float(r[m])
                                  for m in ("ap", "auc", "mrr", "hits@10")})
        return out

    # ------------------------------------------------------------ the loop
    def fit(self) -> Dict[str, Any]:
        """Run the epochs left (``train.epoch`` in all) and return the summary."""
        fields = CSV_FIELDS + [f"{s}_{k}" for k in self.extra_metrics for s in ("val", "test")]
        if self.tgb is not None:
            fields += tgb_protocol.csv_fields()
        fh = writer = None
        if self.rank == 0:
            try:
                self.csv_path.parent.mkdir(parents=True, exist_ok=True)
                fh = open(self.csv_path, "w", newline="")
            except OSError as e:
                raise RunSetupError(f"--metrics-csv {self.csv_path}: cannot be written "
                                    f"({e.strerror or e})") from None
            self._write_config()
            writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            for row in self.history:   # a resumed run rewrites the epochs it restored
                writer.writerow(_csv_row(row))
            fh.flush()
        try:
            with self.checkpoint.guard():  # a dead peer: PeerFailureError naming the position
                self._epochs(writer, fh)
                self._evaluate_strategies()
        finally:
            if fh is not None:
                fh.close()
        # not on an error: a background producer may be in a collective with a dead peer
        self.close()
        out = self.summary()
        if self.rank == 0:
            _log_result(out)
            _log_strategies(out, self.eval_strategies)
            if self.tgb is not None:
                tgb_protocol.log_result(out)
            self._write_results(out)
        return out

    def _write_config(self) -> None:
        """``config.yml`` in the run folder: the resolved config and the run's settings."""
        import yaml
        cfg = json.loads(json.dumps({"name": self.config.name, **config_dict(self.config),
                                     "run": self.run_settings}, default=str))
        (self.run_dir / "config.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    def _write_results(self, out: Mapping[str, Any]) -> None:
        """``summary.json`` and, with matplotlib, ``curves.png`` in the run folder."""
        (self.run_dir / "summary.json").write_text(summary_json(out) + "\n")
        global _PLOT_HINTED
        if not have_matplotlib():
            if not _PLOT_HINTED:
                log.info("no training curves (%s): matplotlib is not installed; %s",
                         self.run_dir / CURVES, PLOT_HINT)
                _PLOT_HINTED = True
            return
        try:
            run = read_run(self.run_dir)
            run["rows"] = [{k: float(v) if isinstance(v, (int, float)) else float("nan")
                            for k, v in r.items()} for r in self.history]
            plot_runs([run], self.run_dir / CURVES,
                      f"{out['model']} on {out['data']}, {self.world_size} "
                      f"process{'es' if self.world_size > 1 else ''}")
        except Exception as e:   # a plot never fails the run
            log.warning("could not draw %s: %s: %s", self.run_dir / CURVES, type(e).__name__, e)

    def _epochs(self, writer, fh) -> None:
        last = self.config.train.epoch - 1
        for epoch in range(self.epoch, self.config.train.epoch):
            if self.stopped:
                break
            self.epoch, t_ep = epoch, time.perf_counter()
            if self.mailbox is not None and self._partial is None:
                self.mailbox.reset()   # memory starts from zero; val continues train, test val
            row: Dict[str, Any] = {"epoch": epoch}
            for split in ("train", "val", "test"):
                if split == "val" and self.edgebank is None:
                    self._start_edgebank()
                if split == "val":
                    self._capture_eval_state(epoch)
                row.update(self.run_split(epoch, split))
                self._partial = None
            self._eb_bank = None
            row["epoch_s"] = time.perf_counter() - t_ep
            self.history.append(row)
            key = self.select_on   # val AP, or val MRR under TGB's protocol
            if self.best is None or row[key] > self.best[key]:
                self.best = dict(row)
            if self.best["epoch"] == epoch:   # keep the best epoch's val-start state
                self._best_state = self._eval_state
            self._eval_state = None
            self.stopped = self.stopper.step(row[key])
            for hook in self.hooks:
                hook(self, epoch, row)
            if writer is not None:
                writer.writerow(_csv_row(row))
                fh.flush()
                log.info("epoch %d: loss %.4f  train AP %.4f  val AP %.4f  test AP %.4f  "
                         "(%.0f events/s)", epoch, row["train_loss"], row["train_ap"],
                         row["val_ap"], row["test_ap"], row["train_events_per_s"])
            self.epoch = epoch + 1
            if self.checkpoint.epoch_due(epoch, last=self.stopped or epoch == last):
                self._save()
            if self.stopped:
                log.info("early stop after epoch %d (best %d)", epoch, self.best["epoch"])

    def _start_edgebank(self) -> None:
        """EdgeBank's memory of the training pairs (each rank memorises its share, merged
        over all ranks); the next val and test passes score it on the model's negatives."""
        tr = self.loaders["train"].data
        bank = EdgeBank()
        bank.update(tr.src, tr.dst)
        bank.sync(None)
        self._eb_bank, self.edgebank = bank, {}

    # ------------------------------------------- other negative-sampling protocols
    def _capture_eval_state(self, epoch: int) -> None:
        """Clone the model's state and this rank's mailbox shard at the start of ``epoch``'s
        val pass (only when :meth:`evaluate` will be needed: a non-random strategy)."""
        if all(s == "random" for s in self.eval_strategies):
            return
        self._eval_state = (epoch, *self._snapshot())

    def _snapshot(self) -> Tuple[Dict[str, Any], Optional[Dict]]:
        """``(model state, mailbox shard)``, cloned (this rank's sharded rows included)."""
        model = {k: v.detach().clone() if torch.is_tensor(v) else v
                 for k, v in self.model.state_dict().items()}
        return model, None if self.mailbox is None else self.mailbox.state_dict()

    def _load_snapshot(self, model: Dict[str, Any], mail: Optional[Dict]) -> None:
        self.model.load_state_dict(model)
        if self.mailbox is not None:
            self.mailbox.load_state_dict(mail)

    def _strategy_loader(self, split: str, strategy: str) -> DistributedDataLoader:
        """An evaluation loader of ``split`` as ``self.loaders[split]``, whose negatives
        follow ``strategy`` (collective: binding gathers the split's stream)."""
        ref = self.loaders[split]
        neg = NegativeSampling("triplet", strategy, self.eval_neg, seed=ref.neg_sampler.seed)
        return DistributedDataLoader(self.graph, split, sampler=self.sampler, neg_sampler=neg,
                                     batch_size=ref.batch_size, train=False,
                                     mailbox=self.mailbox, seed=ref.seed,
                                     queue_size=ref.queue_size, device=ref.device,
                                     group=ref.group)   # idle meanwhile: its group is free

    def evaluate(self, strategy: str = "random") -> Dict[str, float]:
        """Evaluate the best epoch's state on val then test with ``strategy`` negatives.

        The model's parameters and this rank's mailbox shard are set to what they were at
        the start of the best epoch's val pass; val runs, then test continues its memory
        (as in the epoch), with ``eval_neg`` negatives per positive drawn by ``strategy``
        (``'random'``: the loaders of the epochs, so the figures are the best epoch's).
        EdgeBank scores the same negatives, its bank the training pairs (val pairs added
        before test). Afterwards the model, mailbox and RNG states are put back as they
        were. ``on_evaluate`` hooks and custom ``metrics`` run as in an epoch (the epoch
        is the best one). Every rank must call it (collectives).

        Returns:
            ``{'val_ap', 'val_auc', 'val_mrr', 'test_ap', 'test_auc', 'test_mrr', ...,
            'edgebank_val_ap', ..., 'edgebank_test_mrr'}`` (floats; the keys of
            :meth:`run_split` for val and test, EdgeBank's prefixed ``edgebank_``).

        Raises:
            ValueError: an unknown ``strategy``.
            RunSetupError: no best-epoch state is held: ``eval_strategies`` lists no
                non-random strategy (the state is then not kept), no epoch ran, or the
                best epoch ran before this process resumed from a checkpoint
                (checkpoints hold the latest state, not the best epoch's).
        """
        (strategy,) = check_strategies([strategy])
        if self._best_state is None:
            raise RunSetupError(
                "evaluate(): no best-epoch state in memory: it is kept only when "
                "eval_strategies lists 'historical' or 'inductive', from the epochs this "
                "process ran (a best epoch from before a resume is not in the checkpoint)")
        epoch, model, mail = self._best_state
        now, rng = self._snapshot(), rng_state()
        saved = (self.loaders, self.edgebank, self._eb_bank)
        extra: Dict[str, DistributedDataLoader] = {}
        try:
            if strategy != "random":
                extra = {s: self._strategy_loader(s, strategy) for s in ("val", "test")}
                self.loaders = {**self.loaders, **extra}
            self._load_snapshot(model, mail)
            self._start_edgebank()           # self.edgebank: a fresh dict for this pass
            out: Dict[str, float] = {}
            for split in ("val", "test"):
                out.update(self.run_split(epoch, split))
            out.update({f"edgebank_{k}": v for k, v in self.edgebank.items()})
        finally:
            for ld in extra.values():
                ld.close()
            self.loaders, self.edgebank, self._eb_bank = saved
            self._load_snapshot(*now)
            set_rng_state(rng)
        return out

    def _evaluate_strategies(self) -> None:
        """:meth:`evaluate` for each non-random ``eval_strategies`` entry, into
        :attr:`strategy_results` (the summary's ``*_<strategy>`` keys). Without a
        best-epoch state (the best epoch ran before a resume) the figures are NaN and a
        WARNING says why."""
        for s in self.eval_strategies:
            if s == "random":
                continue
            keys = {f"val_ap_{s}": "val_ap", f"test_ap_{s}": "test_ap",
                    f"test_auc_{s}": "test_auc", f"test_mrr_{s}": "test_mrr",
                    f"edgebank_test_ap_{s}": "edgebank_test_ap",
                    f"edgebank_test_auc_{s}": "edgebank_test_auc",
                    f"edgebank_test_mrr_{s}": "edgebank_test_mrr"}
            if self._best_state is None:
                if self.rank == 0:
                    log.warning("%s negatives: no figures (NaN): the best epoch %s ran before "
                                "this process resumed from a checkpoint, and its state is "
                                "not in the checkpoint; run again without --resume to get "
                                "them", s, None if self.best is None else self.best["epoch"])
                self.strategy_results.update({k: float("nan") for k in keys})
                continue
            t0 = time.perf_counter()
            r = self.evaluate(s)
            self.strategy_results.update({k: float(r[v]) for k, v in keys.items()})
            self.strategy_results[f"eval_{s}_s"] = time.perf_counter() - t0

    def summary(self) -> Dict[str, Any]:
        """The run's summary (collective): the best epoch's validation and test figures,
        median training speed, peak memory per rank, the run's settings."""
        best = self.best
        if best is None:
            raise RunSetupError("no epoch to report (--epochs 0, or a finished checkpoint "
                                "with no history)")
        rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0],
                           dtype=torch.float64)
        rss_all = all_gather_v(rss)
        out = {"model": self.config.name, "data": self.folder.name,
               "world_size": self.world_size, "epochs": len(self.history),
               "best_epoch": best["epoch"], "val_ap": best["val_ap"], "val_auc": best["val_auc"],
               "test_ap": best["test_ap"], "test_auc": best["test_auc"],
               "test_mrr": best["test_mrr"], "test_ap_batch_mean": best["test_ap_batch_mean"],
               "train_events_per_s": _median(self.speeds),
               "train_events_per_cpu_s": _median(self.cpu_speeds),
               "peak_rss_mib": float(rss_all.max()),
               "peak_rss_mib_per_rank": [round(float(x), 1) for x in rss_all],
               "device": str(self.device),
               "backend": getattr(self.context, "backend", None),
               "batch_size": self.batch_size, "partition_algo": self.partition_algo,
               "metrics_csv": str(self.csv_path), "run_dir": str(self.run_dir),
               "checkpoint_version": self.checkpoint.last_version}
        out.update({f"{s}_{k}": best.get(f"{s}_{k}") for k in self.extra_metrics
                    for s in ("val", "test")})
        eb = self.edgebank or {}
        out.update({f"edgebank_{k}": eb.get(k, float("nan"))
                    for k in ("val_ap", "test_ap", "test_auc", "test_mrr")})
        out.update(self.strategy_results)
        if self.tgb is not None:
            out.update(tgb_protocol.summary_fields(best, self.edgebank))
        if self.device.type == "cuda":
            gpu = torch.tensor([torch.cuda.max_memory_allocated(self.device) / 2**20],
                               dtype=torch.float64)
            out["peak_gpu_mib_per_rank"] = [round(float(x), 1) for x in all_gather_v(gpu)]
        return out

    def close(self) -> None:
        """Stop the loaders' background threads (``fit`` calls it at the end)."""
        for ld in self.loaders.values():
            ld.close()


ADVICE = "docs/training.md#when-edgebank-wins"
_PLOT_HINTED = False   # the missing-matplotlib hint is logged once per process


def _log_result(out: Mapping[str, Any]) -> None:
    """The run's last line, the model's test AP beside EdgeBank's, and a WARNING when the
    trivial baseline wins."""
    ap, eb = out["test_ap"], out.get("edgebank_test_ap", float("nan"))
    log.info("best epoch %d: test AP %.4f (EdgeBank %.4f)  AUC %.4f (EdgeBank %.4f)  MRR %.4f "
             "(EdgeBank %.4f)", out["best_epoch"], ap, eb, out["test_auc"],
             out.get("edgebank_test_auc", float("nan")), out["test_mrr"],
             out.get("edgebank_test_mrr", float("nan")))
    if ap == ap and eb == eb and ap < eb:
        log.warning("the model's test AP %.4f is below EdgeBank's %.4f (score 1 for a pair "
                    "seen before): the model has not learnt more than repeated pairs; see %s "
                    "for what to try (another config, more epochs)", ap, eb, ADVICE)


def check_strategies(names: Union[str, Sequence[str]]) -> Tuple[str, ...]:
    """``eval_strategies`` as a tuple of distinct names (a str is one name); an unknown
    name is a ValueError listing the known ones."""
    names = (names,) if isinstance(names, str) else tuple(names)
    bad = [n for n in names if n not in STRATEGIES]
    if bad:
        raise ValueError(f"eval_strategies: unknown negative-sampling strategy "
                         f"{', '.join(map(repr, bad))}; expected names from {STRATEGIES} "
                         f"(DyGLib's protocols, see docs/evaluation.md)")
    return tuple(dict.fromkeys(names))


def _log_strategies(out: Mapping[str, Any], strategies: Sequence[str]) -> None:
    """One line per non-random strategy: the model's figures beside EdgeBank's."""
    for s in strategies:
        if s == "random":
            continue
        log.info("%s negatives, best epoch %d: val AP %.4f  test AP %.4f (EdgeBank %.4f)  "
                 "AUC %.4f (EdgeBank %.4f)  MRR %.4f (EdgeBank %.4f)  [%.1f s]", s,
                 out["best_epoch"], out[f"val_ap_{s}"], out[f"test_ap_{s}"],
                 out[f"edgebank_test_ap_{s}"], out[f"test_auc_{s}"],
                 out[f"edgebank_test_auc_{s}"], out[f"test_mrr_{s}"],
                 out[f"edgebank_test_mrr_{s}"], out.get(f"eval_{s}_s", float("nan")))


def _hook_list(hooks: Any, name: str) -> List[Callable]:
    """A list of hooks from ``None``, one callable or a sequence of them."""
    hooks = [] if hooks is None else [hooks] if callable(hooks) else list(hooks)
    bad = [h for h in hooks if not callable(h)]
    if bad:
        raise TypeError(f"{name}: expected callables, got {bad!r:.80}")
    return hooks


def _csv_row(row: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}
