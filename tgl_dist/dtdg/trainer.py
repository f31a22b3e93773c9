"""``Trainer``: epochs over the splitter's windows, gradient all-reduce, early stopping, hooks.

One optimiser step per training window (as EvolveGCN's trainer). Every rank runs
the same windows in the same order; the per-rank losses are normalised by global
counts, so summing the gradients (``all_reduce_``) gives the full-graph gradient.
Evaluation is over the whole split, gathered across ranks (never averaged per window).
"""
from __future__ import annotations

import copy
import logging
import time
from typing import Callable, Dict, List, Optional

import torch
from torch import nn

from tgl_dist.dist import all_reduce_, broadcast_object
from tgl_dist.metrics import EarlyStopMonitor
from tgl_dist.models.optim import build_optimizer

log = logging.getLogger(__name__)

EpochHook = Callable[["Trainer", int, Dict], None]


def sync_parameters(module: nn.Module, group=None) -> None:
    """Make every rank's parameters equal to rank 0's (collective)."""
    state = broadcast_object({k: v.detach().cpu() for k, v in module.state_dict().items()}, 0, group)
    module.load_state_dict(state)


def all_reduce_gradients(params: List[nn.Parameter], group=None) -> None:
    """Sum every parameter's gradient over the ranks, in one flat all-reduce (collective)."""
    from tgl_dist.dist import world
    if world(group)[1] == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    all_reduce_(flat, group=group)
    off = 0
    for p in params:
        n = p.numel()
        p.grad = flat[off:off + n].view_as(p).clone()
        off += n


class Trainer:
    """Train a snapshot model on a task.

    Args:
        model: a :class:`~tgl_dist.dtdg.models.SnapshotModel` (built with ``build_model``).
        task: :class:`~tgl_dist.dtdg.tasks.LinkPrediction` or ``NodeRegression``.
        splitter: a :class:`~tgl_dist.dtdg.splitter.Splitter`.
        lr, weight_decay: Adam settings.
        epochs: maximum epochs. patience: early-stopping patience on the dev metric.
        on_epoch_end: hooks ``hook(trainer, epoch, record)`` called on every rank after
            each epoch (e.g. checkpointing: ``trainer.state_dict()``).
        progress: show a tqdm bar over epochs on rank 0.

    ``fit()`` returns the summary: best epoch, dev and test metrics of the best model
    (``test_ap``/``test_auc``/``test_mrr`` or ``test_mse``), the trivial baseline's test
    metrics (``baseline_test_*``) and ``snapshots_per_s`` (history snapshots processed
    per second of training, mean over epochs).
    """

    def __init__(self, model: nn.Module, task: nn.Module, splitter, lr: float = 1e-2,
                 weight_decay: float = 0.0, epochs: int = 50, patience: int = 10,
                 on_epoch_end: Optional[List[EpochHook]] = None, progress: bool = False) -> None:
        self.model, self.task, self.splitter = model, task, splitter
        self.graph = model.graph
        self.group = self.graph.group
        self.epochs, self.patience = epochs, patience
        sync_parameters(model, self.group)
        sync_parameters(task, self.group)
        self.params = [p for m in (model, task) for p in m.parameters()]
        self.opt = build_optimizer([model, task], lr=lr, weight_decay=weight_decay)
        self.hooks: List[EpochHook] = list(on_epoch_end or [])
        self.progress = progress
        self.history: List[Dict] = []
        self.epoch = 0

    # ------------------------------------------------------------ one epoch
    def train_epoch(self, epoch: int) -> Dict[str, float]:
        self.model.train()
        self.task.train()
        t0, snaps, total = time.perf_counter(), 0, 0.0
        for w in self.splitter.train:
            self.opt.zero_grad(set_to_none=True)
            loss = self.task(self.model, w, "train", epoch)
            loss.backward()
            all_reduce_gradients(self.params, self.group)
            self.opt.step()
            snaps += len(w["hist_ts"])
            total += float(loss.detach())
        dt = time.perf_counter() - t0
        loss_sum = all_reduce_(torch.tensor([total], dtype=torch.float64), group=self.group)
        return {"loss": float(loss_sum) / max(len(self.splitter.train), 1), "seconds": dt,
                "snapshots_per_s": snaps / dt if dt > 0 else float("nan")}

    @torch.no_grad()
    def evaluate(self, split: str) -> Dict[str, float]:
        """Metrics of ``split`` (``'train'``, ``'dev'`` or ``'test'``) and of the baseline."""
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
        stop = EarlyStopMonitor(self.patience, higher_better=self.task.higher_better)
        best_state, best_epoch = None, -1
        epochs = range(self.epochs)
        if self.progress and self.graph.rank == 0:
            from tqdm import tqdm
            epochs = tqdm(epochs, desc=f"{getattr(self.model, 'model_name', 'model')}", leave=False)
        speeds = []
        for epoch in epochs:
            self.epoch = epoch
            rec = {"epoch": epoch, **self.train_epoch(epoch)}
            speeds.append(rec["snapshots_per_s"])
            if self.splitter.dev:
                rec.update({k: v for k, v in self.evaluate("dev").items() if not k.startswith("baseline")})
            self.history.append(rec)
            if hasattr(epochs, "set_postfix"):
                epochs.set_postfix(loss=f"{rec['loss']:.4f}", **({key: f"{rec[key]:.4f}"} if key in rec else {}))
            log.info("epoch %d: %s", epoch, rec)
            for hook in self.hooks:
                hook(self, epoch, rec)
            value = rec.get(key, -rec["loss"] if self.task.higher_better else rec["loss"])
            stopping = stop.step(value)
            if stop.best_epoch == stop.epoch:
                best_state, best_epoch = self.state_dict(), epoch
            if stopping:
                log.info("early stop at epoch %d (best %d)", epoch, best_epoch)
                break
        if best_state is not None:
            self.load_state_dict(best_state)
        out = {"best_epoch": best_epoch, "epochs_run": len(self.history)}
        if self.splitter.dev:
            out.update({k: v for k, v in self.evaluate("dev").items() if not k.startswith("baseline")})
        out.update(self.evaluate("test"))
        out["snapshots_per_s"] = sum(speeds) / len(speeds) if speeds else float("nan")
        return out

    # ------------------------------------------------------------ hooks
    def state_dict(self) -> Dict:
        """Model, task head and optimiser state (for checkpoints)."""
        return {"model": copy.deepcopy(self.model.state_dict()),
                "task": copy.deepcopy(self.task.state_dict()),
                "optimizer": copy.deepcopy(self.opt.state_dict()), "epoch": self.epoch}

    def load_state_dict(self, state: Dict) -> None:
        self.model.load_state_dict(state["model"])
        self.task.load_state_dict(state["task"])
        self.opt.load_state_dict(state["optimizer"])
