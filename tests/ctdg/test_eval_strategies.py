"""ctdg.Trainer(eval_strategies=...): DyGLib's random / historical / inductive evaluation of
the best epoch's state, its restore, EdgeBank on the same negatives, 1 vs 2 processes."""
import json
import math

import pytest
import torch

from tgl_dist.ctdg import RunSetupError, Trainer, parse_config
from tgl_dist.testing import run_distributed

# the README's second pytest run re-checks the models' torch path; the negative strategies
# are evaluation logic above the kernels, checked once in the first run
pytestmark = pytest.mark.skipif(__import__("os").environ.get("TGL_DIST_NO_KERNEL") == "1",
                                reason="TGL_DIST_NO_KERNEL=1: evaluation logic, tested in the first run")

SMALL = {"num_nodes": 60, "num_events": 900}
ALL = ("random", "historical", "inductive")
KEYS = ("val_ap", "test_ap", "test_auc", "test_mrr", "edgebank_test_ap", "edgebank_test_auc",
        "edgebank_test_mrr")


def _config(epochs=3, lr=1e-2):
    """A memory model on the roots only (fast), as in test_ctdg_trainer.py."""
    return parse_config({"sampling": {"no_sample": True},
                         "memory": {"type": "node", "dim_out": 8, "dim_time": 4,
                                    "memory_update": "rnn"},
                         "gnn": {"arch": "identity"},
                         "train": {"epoch": epochs, "batch_size": 100, "lr": lr}},
                        name="tiny")


def _keys(s):
    return [f"{k}_{s}" for k in KEYS]


def _state(tr):
    return ({k: v.clone() for k, v in tr.model.state_dict().items()},
            tr.mailbox.state_dict())


def _same_state(a, b):
    return all(torch.equal(a[0][k], b[0][k]) for k in a[0]) and \
        all(torch.equal(a[1][k], b[1][k]) for k in a[1])


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One 3-epoch run with all three protocols (shared by the tests below)."""
    tmp = tmp_path_factory.mktemp("evalneg")
    tr = Trainer(_config(3), "synthetic", parts=tmp / "parts", dataset_kwargs=SMALL,
                 eval_neg=3, progress=False, out=tmp / "run", eval_strategies=ALL)
    return tr, tr.fit(), tmp / "run"


def test_the_summary_holds_finite_figures_per_strategy(run):
    tr, out, folder = run
    for s in ("historical", "inductive"):
        for k in _keys(s):
            assert math.isfinite(out[k]) and 0.0 <= out[k] <= 1.0, (k, out[k])
        assert out[f"eval_{s}_s"] > 0
    assert "val_ap_random" not in out       # random: the usual val_ap, test_ap... keys
    saved = json.loads((folder / "summary.json").read_text())
    assert saved["test_ap_historical"] == pytest.approx(out["test_ap_historical"], abs=1e-5)
    assert saved["edgebank_test_mrr_inductive"] == pytest.approx(
        out["edgebank_test_mrr_inductive"], abs=1e-5)
    # the per-epoch figures are random negatives; the other protocols see other negatives
    assert out["test_ap"] == tr.best["test_ap"]
    assert out["edgebank_test_ap_historical"] != out["edgebank_test_ap"]


def test_the_restored_best_state_gives_the_best_epochs_figures_again(run):
    """evaluate('random') runs val then test from the captured state of the best epoch:
    exactly the figures that epoch recorded, whichever epoch it was (the model trained on
    after it); the trainer's state afterwards is as before."""
    tr, out, _ = run
    before = _state(tr)
    r = tr.evaluate("random")
    for k in ("val_ap", "val_auc", "val_mrr", "test_ap", "test_auc", "test_mrr"):
        assert r[k] == tr.best[k], (k, r[k], tr.best[k])
    for k in ("val_ap", "test_ap", "test_auc", "test_mrr"):   # EdgeBank's bank built again
        assert r[f"edgebank_{k}"] == pytest.approx(out[f"edgebank_{k}"], abs=1e-12)
    assert _same_state(before, _state(tr))
    h = tr.evaluate("historical")           # deterministic: the summary's figures again
    assert (h["val_ap"], h["test_ap"], h["edgebank_test_ap"]) == (
        out["val_ap_historical"], out["test_ap_historical"], out["edgebank_test_ap_historical"])
    assert _same_state(before, _state(tr))
    assert tr.edgebank["test_ap"] == out["edgebank_test_ap"]   # the run's own figures kept


def test_historical_negatives_are_harder_for_edgebank(run):
    """Historical negatives are pairs seen before, which EdgeBank scores 1 (DyGLib's point)."""
    _, out, _ = run
    assert out["edgebank_test_ap_historical"] < out["edgebank_test_ap"] - 0.05, out
    assert out["edgebank_test_auc_historical"] < out["edgebank_test_auc"] - 0.05, out


def test_a_bad_strategy_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"eval_strategies: unknown negative-sampling strategy "
                                         r"'histroical'; expected names from \('random'"):
        Trainer(_config(1), "synthetic", parts=tmp_path / "parts", dataset_kwargs=SMALL,
                progress=False, eval_strategies=("random", "histroical"))
    assert not (tmp_path / "parts").exists()       # refused before partitioning


def test_without_a_best_state_the_figures_are_nan_not_wrong(tmp_path, caplog):
    """A finished run resumed from its checkpoint has no best-epoch state in memory: the
    figures are NaN with a WARNING, and evaluate() says why; a default run keeps none."""
    kw = dict(parts=tmp_path / "parts", dataset_kwargs=SMALL, eval_neg=3, progress=False,
              checkpoint_dir=str(tmp_path / "ck"))
    first = Trainer(_config(1), "synthetic", out=tmp_path / "a", **kw)
    first.fit()
    assert first._best_state is None             # random only: nothing captured
    with pytest.raises(RunSetupError, match="no best-epoch state in memory"):
        first.evaluate("random")
    caplog.set_level("WARNING", logger="tgl_dist.ctdg.trainer")
    again = Trainer(_config(1), "synthetic", resume=True, out=tmp_path / "b",
                    eval_strategies=("historical",), **kw)
    out = again.fit()
    assert all(math.isnan(out[k]) for k in _keys("historical"))
    assert any("historical negatives: no figures (NaN)" in r.getMessage() for r in caplog.records)
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["test_ap_historical"] is None


def _strategies_run(parts):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    # lr 1e-9: Adam turns the float noise of the all-reduced gradients (another summation
    # order on 2 ranks) into lr-sized steps, which at 1e-2 part the runs after a few steps
    # (also with random negatives); at 1e-9 the parameters stay within 1e-8 of each other,
    # so the model's figures compare as EdgeBank's do
    tr = Trainer(_config(2, lr=1e-9), "synthetic", parts=parts, context=ctx,
                 dataset_kwargs=SMALL, partition_algo="hash", eval_neg=3, progress=False,
                 eval_strategies=ALL, out=parts + "_run")
    out = tr.fit()
    return {k: out[k] for s in ("historical", "inductive") for k in _keys(s)}


@pytest.mark.distributed
def test_two_processes_give_the_figures_of_one(tmp_path):
    """The historical / inductive negatives are drawn per global window, the same on any
    number of ranks: EdgeBank's figures are equal (as test_ctdg_trainer.py's 1-vs-2 test),
    the model's equal up to float summation order (see _strategies_run)."""
    r0, r1 = run_distributed(_strategies_run, 2, str(tmp_path / "parts2"))
    assert r0 == r1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # as the workers
    try:
        one = _strategies_run(str(tmp_path / "parts1"))
    finally:
        torch.set_num_threads(threads)
    for k, v in one.items():
        tol = 1e-12 if k.startswith("edgebank_") else 1e-6
        assert r0[k] == pytest.approx(v, abs=tol), (k, r0[k], v)


def test_the_command_line_passes_the_strategies_through(tmp_path):
    import argparse
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tgl_dist.cli import add_eval_strategies
    p = argparse.ArgumentParser()
    add_eval_strategies(p)
    assert p.parse_args([]).eval_strategies == ("random",)
    assert p.parse_args(["--eval-strategies", "random, inductive"]).eval_strategies == (
        "random", "inductive")
    with pytest.raises(SystemExit):
        p.parse_args(["--eval-strategies", "random,hist"])
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(repo))
    r = subprocess.run([sys.executable, str(repo / "examples" / "ctdg" / "train_tgn.py"),
                        "--num-nodes", "60", "--num-events", "900", "--batch-size", "100",
                        "--eval-neg", "3", "--epochs", "1", "--no-progress", "--threads", "1",
                        "--device", "cpu", "--eval-strategies", "random,historical",
                        "--parts", str(tmp_path / "parts"), "--out", str(tmp_path / "run")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(0.0 <= out[k] <= 1.0 for k in _keys("historical")), out
    assert "test_ap_inductive" not in out
    assert "historical negatives, best epoch 0: val AP" in r.stderr
