"""``Trainer``: epochs over the splitter's windows, gradient all-reduce, early stopping, hooks.

One optimiser step per training window (as EvolveGCN's trainer). Every rank runs
the same windows in the same order; the per-rank losses are normalised by global
counts, so summing the gradients (``reduce_gradients(..., average=False)``) gives the
full-graph gradient.
Evaluation is over the whole split, gathered across ranks (never averaged per window).
"""
from __future__ import annotations

import copy
import logging
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

from tgl_dist.dist import all_reduce_
from tgl_dist.metrics import EarlyStopMonitor
from tgl_dist.optim import build_optimizer
from tgl_dist.dist import broadcast_parameters, reduce_gradients

log = logging.getLogger(__name__)

EpochHook = Callable[["Trainer", int, Dict], None]


def sync_parameters(module: nn.Module, group=None) -> None:
    """Make every rank's parameters equal to rank 0's (collective); sharded tables
    (``DistEmbedding``, each rank its own rows) stay as they are."""
    broadcast_parameters(module, 0, group)


StepHook = Callable[["Trainer", int, int], None]


class Trainer:
    """Train a snapshot model on a task.

    Args:
        model: a :class:`~tgl_dist.dtdg.models.SnapshotModel` (built with ``build_model``).
        task: :class:`~tgl_dist.dtdg.tasks.LinkPrediction` or ``NodeRegression``.
        splitter: a :class:`~tgl_dist.dtdg.splitter.Splitter`.
        lr, weight_decay: Adam settings.
        epochs: maximum epochs. patience: early-stopping patience on the dev metric.
        on_epoch_end: hooks ``hook(trainer, epoch, record)`` called on every rank after
            each epoch (e.g. checkpointing: ``trainer.checkpoint_state()``).
        on_step: hooks ``hook(trainer, epoch, windows_done)`` called on every rank after
            every training window's optimiser step (e.g. step checkpoints).
        on_evaluate: hooks ``hook(trainer, epoch, split)`` called on every rank when the
            evaluation of a split starts (e.g. to track the run's position).
        progress: show a tqdm bar over epochs on rank 0.

    ``fit()`` returns the summary: best epoch, dev and test metrics of the best model
    (``test_ap``/``test_auc``/``test_mrr`` or ``test_mse``), the trivial baseline's test
    metrics (``baseline_test_*``) and ``snapshots_per_s`` (history snapshots processed
    per second of training, mean over epochs).

    Resume: :meth:`checkpoint_state` (from a hook) gives ``(dense, shard, meta)`` for a
    :class:`~tgl_dist.checkpoint.CheckpointManager`; :meth:`load_checkpoint_state` on a
    freshly built trainer, then ``fit()``, continues the run exactly (also inside an
    epoch: training windows ``windows_done..`` of that epoch, with its partial loss).
    """

    def __init__(self, model: nn.Module, task: nn.Module, splitter, lr: float = 1e-2,
                 weight_decay: float = 0.0, epochs: int = 50, patience: int = 10,
                 on_epoch_end: Optional[List[EpochHook]] = None,
                 on_step: Optional[List[StepHook]] = None,
                 on_evaluate: Optional[List[Callable[["Trainer", int, str], None]]] = None,
                 progress: bool = False) -> None:
        self.model, self.task, self.splitter = model, task, splitter
        self.graph = model.graph
        self.group = self.graph.group
        self.epochs, self.patience = epochs, patience
        sync_parameters(model, self.group)
        sync_parameters(task, self.group)
        self.params = [p for m in (model, task) for p in m.parameters()]
        self.opt = build_optimizer([model, task], lr=lr, weight_decay=weight_decay)
        self.hooks: List[EpochHook] = list(on_epoch_end or [])
        self.step_hooks: List[StepHook] = list(on_step or [])
        self.eval_hooks = list(on_evaluate or [])
        self.progress = progress
        self.history: List[Dict] = []
        self.epoch = 0
        # the loop's state (what a checkpoint holds besides the modules)
        self.stop = EarlyStopMonitor(patience, higher_better=task.higher_better)
        self.best_state: Optional[Dict] = None
        self.best_epoch = -1
        self.speeds: List[float] = []
        self.stopped = False
        self.start_epoch = 0
        self.partial: Optional[Dict] = None  # {'windows', 'total', 'snaps'} of the current epoch

    # ------------------------------------------------------------ one epoch
    def train_epoch(self, epoch: int, partial: Optional[Dict] = None) -> Dict[str, float]:
        """One optimiser step per training window; ``partial`` continues an epoch
        (windows ``partial['windows']..`` with the loss sum so far)."""
        self.model.train()
        self.task.train()
        start = int(partial["windows"]) if partial else 0
        total = float(partial["total"]) if partial else 0.0
        snaps = int(partial["snaps"]) if partial else 0
        snaps0, t0 = snaps, time.perf_counter()
        for i, w in enumerate(self.splitter.train[start:], start):
            self.opt.zero_grad(set_to_none=True)
            loss = self.task(self.model, w, "train", epoch)
            loss.backward()
            reduce_gradients(self.params, self.group, average=False)  # losses: global counts
            self.opt.step()
            snaps += len(w["hist_ts"])
            total += float(loss.detach())
            self.partial = {"windows": i + 1, "total": total, "snaps": snaps}
            for hook in self.step_hooks:
                hook(self, epoch, i + 1)
        self.partial = None
        dt = time.perf_counter() - t0
        loss_sum = all_reduce_(torch.tensor([total], dtype=torch.float64), group=self.group)
        # speed of the windows run in this call (a resumed epoch ran only part of them)
        return {"loss": float(loss_sum) / max(len(self.splitter.train), 1), "seconds": dt,
                "snapshots_per_s": (snaps - snaps0) / dt if dt > 0 and snaps > snaps0 else float("nan")}

    @torch.no_grad()
    def evaluate(self, split: str) -> Dict[str, float]:
        """Metrics of ``split`` (``'train'``, ``'dev'`` or ``'test'``) and of the baseline."""
        for hook in self.eval_hooks:
            hook(self, self.epoch, split)
        self.model.eval()
        self.task.eval()
        self.task.reset_metrics()
        for w in getattr(self.splitter, split):
            self.task(self.model, w, split, evaluate=True)
        metrics, baseline = self.task.compute()
        return {**{f"{split}_{k}": v for k, v in metrics.items()},
                **{f"baseline_{split}_{k}": v for k, v in baseline.items()}}

    # ------------------------------------------------------------ the loop
    def fit(self) -> Dict:
        key = f"dev_{self.task.metric}"
        epochs = range(self.start_epoch, self.epochs)
        if self.progress and self.graph.rank == 0:
            from tqdm import tqdm
            epochs = tqdm(epochs, desc=f"{getattr(self.model, 'model_name', 'model')}", leave=False)
        for epoch in epochs:
            if self.stopped:
                break
            self.epoch = epoch
            partial, self.partial = self.partial, None
            rec = {"epoch": epoch, **self.train_epoch(epoch, partial)}
            self.speeds.append(rec["snapshots_per_s"])
            if self.splitter.dev:
                rec.update({k: v for k, v in self.evaluate("dev").items() if not k.startswith("baseline")})
            self.history.append(rec)
            if hasattr(epochs, "set_postfix"):
                epochs.set_postfix(loss=f"{rec['loss']:.4f}", **({key: f"{rec[key]:.4f}"} if key in rec else {}))
            log.info("epoch %d: %s", epoch, rec)
            value = rec.get(key, -rec["loss"] if self.task.higher_better else rec["loss"])
            self.stopped = self.stop.step(value)
            if self.stop.best_epoch == self.stop.epoch:
                self.best_state, self.best_epoch = self.state_dict(), epoch
            self.start_epoch = epoch + 1
            for hook in self.hooks:  # after the epoch's bookkeeping: a checkpoint here is whole
                hook(self, epoch, rec)
            if self.stopped:
                log.info("early stop at epoch %d (best %d)", epoch, self.best_epoch)
                break
        if hasattr(epochs, "close"):
            epochs.close()   # cleared now (also after an early stop), before anything is printed
        if self.best_state is not None:
            self.load_state_dict(self.best_state)
        out = {"best_epoch": self.best_epoch, "epochs_run": len(self.history)}
        if self.splitter.dev:
            out.update({k: v for k, v in self.evaluate("dev").items() if not k.startswith("baseline")})
        out.update(self.evaluate("test"))
        speeds = [v for v in self.speeds if v == v]  # NaN: an epoch resumed after its last window
        out["snapshots_per_s"] = sum(speeds) / len(speeds) if speeds else float("nan")
        return out

    # ------------------------------------------------------------ hooks
    def state_dict(self) -> Dict:
        """Model, task head and optimiser state (the best-model snapshot)."""
        return {"model": copy.deepcopy(self.model.state_dict()),
                "task": copy.deepcopy(self.task.state_dict()),
                "optimizer": copy.deepcopy(self.opt.state_dict()), "epoch": self.epoch}

    def load_state_dict(self, state: Dict) -> None:
        self.model.load_state_dict(state["model"])
        self.task.load_state_dict(state["task"])
        self.opt.load_state_dict(state["optimizer"])

    def checkpoint_state(self) -> Tuple[Optional[Dict], Dict, Dict]:
        """``(dense, shard, meta)`` of the whole run now (from an epoch or step hook).

        ``dense`` (``None`` off rank 0): replicated parameters, Adam state, history,
        early stopping, the best-model snapshot's replicated part; ``shard``: this
        rank's rows of sharded tables and their optimizer state, its part of the
        best-model snapshot, RNG states and a partial epoch's accumulators; ``meta``:
        ``{'epoch', 'step', 'done'}`` (where :meth:`fit` continues).
        """
        from tgl_dist.checkpoint.state import capture, split_nested
        best_d, best_s = (split_nested([self.model, self.task], self.best_state, ("model", "task"))
                          if self.best_state is not None else (None, None))
        loop = {"history": self.history, "stop": self.stop.state_dict(), "best": best_d,
                "best_epoch": self.best_epoch, "speeds": self.speeds, "stopped": self.stopped}
        dense, shard = capture([self.model, self.task], self.opt, None, self.graph.rank, loop,
                               {"epoch": dict(self.partial) if self.partial else None, "best": best_s})
        if self.partial:
            meta = {"epoch": self.epoch, "step": self.partial["windows"], "done": False}
        else:
            meta = {"epoch": self.start_epoch, "step": 0, "done": self.stopped}
        return dense, shard, meta

    def load_checkpoint_state(self, dense: Dict, shard: Dict, meta: Dict) -> None:
        """Restore :meth:`checkpoint_state` (RNG states included); ``fit()`` then continues."""
        from tgl_dist.checkpoint.state import join_nested, restore
        loop, part = restore(dense, shard, [self.model, self.task], self.opt, None)
        self.history, self.speeds = list(loop["history"]), list(loop["speeds"])
        self.stop.load_state_dict(loop["stop"])
        self.best_epoch, self.stopped = loop["best_epoch"], loop["stopped"]
        self.best_state = (join_nested(loop["best"], part["best"]) if loop["best"] is not None
                           else None)
        self.start_epoch = int(meta["epoch"])
        self.partial = part["epoch"]
        self.epoch = self.start_epoch
