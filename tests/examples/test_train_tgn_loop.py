"""examples/ctdg/train_tgn.py's epoch loop, run in-process with scripted metrics.

Each split's metrics come from a script instead of the model, so the best-epoch choice,
early stopping, the metrics CSV, the JSON summary, the memory reset schedule and a
resume after an early stop are checked against known values, not ranges.
"""
import csv
import json
from pathlib import Path

import pytest

from scripts_util import load_script
from tgl_dist.checkpoint import CheckpointError
from tgl_dist.loader import DistributedDataLoader
from tgl_dist.memory import SharedMailBox
from tgl_dist.metrics import LinkPredMetrics

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "ctdg" / "train_tgn.py"
VAL = [0.5, 0.7, 0.6, 0.65]     # best at epoch 1; with --patience 1 the run stops after epoch 2
TEST = [0.1, 0.2, 0.3, 0.4]


@pytest.fixture
def scripted(monkeypatch):
    """Scripted metrics per (split, epoch), and a log of resets and split starts."""
    log = []
    state = {"split": None, "epoch": None}
    set_epoch, reset = DistributedDataLoader.set_epoch, SharedMailBox.reset

    def on_set_epoch(self, epoch, start_step=0):
        state.update(split=self.data.name, epoch=epoch)
        log.append(("split", self.data.name, epoch))
        return set_epoch(self, epoch, start_step)

    def on_reset(self):
        log.append(("reset",))
        return reset(self)

    def compute(self, group=None):   # EdgeBankMetrics passes the group
        split, e = state["split"], state["epoch"]
        ap = 0.9 if split == "train" else (VAL if split == "val" else TEST)[e]
        log.append(("compute", split, e))
        return {"ap": ap, "auc": ap, "mrr": ap / 2}
    monkeypatch.setattr(DistributedDataLoader, "set_epoch", on_set_epoch)
    monkeypatch.setattr(SharedMailBox, "reset", on_reset)
    monkeypatch.setattr(LinkPredMetrics, "compute", compute)
    return log


def _args(tmp_path, *extra):
    return ["--num-nodes", "40", "--num-events", "600", "--batch-size", "100", "--eval-neg",
            "3", "--no-progress", "--threads", "1", "--device", "cpu", "--parts",
            str(tmp_path / "parts"), "--metrics-csv", str(tmp_path / "m.csv"), *extra]


def test_best_epoch_early_stop_csv_summary_and_memory_schedule(tmp_path, scripted):
    mod = load_script(SCRIPT, "_tgn_loop")
    out = mod.main(_args(tmp_path, "--epochs", "4", "--patience", "1"))
    assert (out["epochs"], out["best_epoch"]) == (3, 1)
    assert (out["val_ap"], out["test_ap"], out["test_auc"]) == (0.7, 0.2, 0.2)
    assert out["test_mrr"] == 0.1
    with open(tmp_path / "m.csv") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert reader.fieldnames == ["epoch", "train_loss", "train_ap", "train_events_per_s",
                                 "val_ap", "val_auc", "val_mrr", "test_ap", "test_auc",
                                 "test_mrr", "val_ap_batch_mean", "test_ap_batch_mean",
                                 "epoch_s"]
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert [float(r["val_ap"]) for r in rows] == VAL[:3]
    assert [float(r["test_ap"]) for r in rows] == TEST[:3]
    assert [float(r["test_mrr"]) for r in rows] == [t / 2 for t in TEST[:3]]
    # the memory starts from zero each epoch and evaluation continues it (no reset before
    # val or test)
    marks = [x for x in scripted if x[0] != "compute"]
    assert marks == [m for e in range(3) for m in (("reset",), ("split", "train", e),
                                                   ("split", "val", e), ("split", "test", e))]


def test_an_early_stopped_run_resumes_as_finished(tmp_path, scripted):
    mod = load_script(SCRIPT, "_tgn_loop")
    ck = str(tmp_path / "ck")
    first = mod.main(_args(tmp_path, "--epochs", "4", "--patience", "1", "--checkpoint-dir", ck,
                           "--checkpoint-every", "1000"))
    version = (tmp_path / "ck" / "VERSION").read_text().strip()
    meta = json.loads((tmp_path / "ck" / f"v{int(version):06d}" / "manifest_0.json").read_text())["meta"]
    assert (meta["epoch"], meta["step"], meta["done"]) == (3, 0, True)
    n = len(scripted)
    again = mod.main(_args(tmp_path, "--epochs", "4", "--patience", "1", "--checkpoint-dir", ck,
                           "--checkpoint-every", "1000", "--resume"))
    assert not [x for x in scripted[n:] if x[0] == "compute"]     # nothing trained again
    assert {k: again[k] for k in ("epochs", "best_epoch", "val_ap", "test_ap")} == \
        {k: first[k] for k in ("epochs", "best_epoch", "val_ap", "test_ap")}
    with pytest.raises(CheckpointError, match=r"run_meta\['seed'\]"):   # another run
        mod.main(_args(tmp_path, "--epochs", "4", "--patience", "1", "--checkpoint-dir", ck,
                       "--checkpoint-every", "1000", "--resume", "--seed", "1"))


def test_lr_and_eval_neg_reach_the_optimizer_and_the_evaluation_negatives(tmp_path, scripted,
                                                                         monkeypatch):
    mod = load_script(SCRIPT, "_tgn_loop")
    import tgl_dist.ctdg.trainer as trainer_mod   # the example's loop is the library's Trainer
    seen = {}
    build_optimizer, negative = trainer_mod.build_optimizer, trainer_mod.NegativeSampling

    def record_opt(model, lr, **kw):
        seen["lr"] = lr
        return build_optimizer(model, lr=lr, **kw)

    def record_neg(*a, **kw):
        seen.setdefault("neg", []).append(a)
        return negative(*a, **kw)
    monkeypatch.setattr(trainer_mod, "build_optimizer", record_opt)
    monkeypatch.setattr(trainer_mod, "NegativeSampling", record_neg)
    mod.main(_args(tmp_path, "--epochs", "1", "--lr", "0.0123", "--eval-neg", "4"))
    assert seen["lr"] == 0.0123
    assert sorted(a[2] for a in seen["neg"]) == [1, 4]     # training: 1; evaluation: --eval-neg
