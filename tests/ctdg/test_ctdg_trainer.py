"""ctdg.Trainer: hooks, custom metrics, a model of one's own, the batch split on 1 and 2 ranks."""
# named test_ctdg_trainer, not test_trainer: tests/dtdg/test_trainer.py holds that module
# name, and the 2-rank worker below is pickled by its module's name
import csv
from pathlib import Path

import pytest
import torch

from tgl_dist.ctdg import (LinkPredOutput, RunSetupError, Trainer, parse_config, split_batch,
                           summary_json)
from tgl_dist.data import generate_synthetic
from tgl_dist.metrics import average_precision
from tgl_dist.testing import run_distributed

SMALL = {"num_nodes": 60, "num_events": 900}


def _raw():
    """A memory model on the roots only (fast)."""
    return {"sampling": {"no_sample": True},
            "memory": {"type": "node", "dim_out": 8, "dim_time": 4, "memory_update": "rnn"},
            "gnn": {"arch": "identity"}}


def _config(epochs=2):
    return parse_config({**_raw(), "train": {"epoch": epochs, "batch_size": 100, "lr": 1e-2}},
                        name="tiny")


class MeanAP:
    """A custom metric: the mean of per-batch APs, and what it was given."""

    def __init__(self, seen):
        self.aps, self.seen = [], seen

    def update(self, pos, neg, neg_k=None):
        self.seen.append((pos.shape, neg.shape, None if neg_k is None else neg_k.shape))
        if pos.numel():
            self.aps.append(average_precision(pos, neg))

    def compute(self, group=None):
        return sum(self.aps) / len(self.aps)


def test_hooks_custom_metrics_csv_and_summary(tmp_path):
    calls, seen = [], []
    tr = Trainer(_config(), "synthetic", parts=tmp_path / "parts", dataset_kwargs=SMALL,
                 eval_neg=3, progress=False, metrics={"mean_ap": lambda: MeanAP(seen)},
                 on_step=[lambda t, e, s: calls.append(("step", e, s))],
                 on_evaluate=[lambda t, e, split: calls.append(("eval", e, split))],
                 on_epoch_end=[lambda t, e, rec: calls.append(("end", e, rec["val_ap"]))],
                 metrics_csv=str(tmp_path / "m.csv"))
    n = len(tr.loaders["train"])
    out = tr.fit()
    expected = []
    for e in range(2):
        expected += [("step", e, s) for s in range(1, n + 1)]
        expected += [("eval", e, "val"), ("eval", e, "test"), ("end", e, tr.history[e]["val_ap"])]
    assert calls == expected
    assert tr.global_step == 2 * n
    # the metric saw every evaluation batch: pos [B], the first negatives [B], all k [B, 3]
    assert seen and all(p == q and k == (p[0], 3) for p, q, k in seen)
    assert 0 < out["test_mean_ap"] <= 1 and out["val_mean_ap"] == tr.best["val_mean_ap"]
    with open(tmp_path / "m.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert float(rows[1]["test_mean_ap"]) == pytest.approx(tr.history[1]["test_mean_ap"], abs=1e-6)
    assert '"test_mean_ap"' in summary_json(out) and out["batch_size"] == 100


class DotMemory(torch.nn.Module):
    """A memory-free model of one's own: scores by a learnable per-node vector (no mailbox)."""

    def __init__(self, num_nodes):
        super().__init__()
        self.emb = torch.nn.Embedding(num_nodes, 4)

    def forward(self, mfgs, meta):
        h = self.emb(mfgs[0].srcdata["ID"])
        src, dst, neg = meta["src_pos_index"], meta["dst_pos_index"], meta["dst_neg_index"]
        k = neg.numel() // max(src.numel(), 1)
        pos = (h[src] * h[dst]).sum(1)
        return LinkPredOutput(pos, (h[src.repeat(k)] * h[neg]).sum(1), None, h.detach())


def test_a_module_of_ones_own_on_a_temporal_graph(tmp_path):
    g = generate_synthetic(60, 900, seed=1, name="mine")
    # a config without memory: its gnn section is checked, never built (the model is ours)
    cfg = parse_config({"sampling": {"layer": 1, "neighbor": [2]}, "memory": {"type": "none"},
                        "gnn": {"dim_out": 4, "att_head": 1, "dim_time": 2},
                        "train": {"epoch": 1, "batch_size": 150}}, name="dot")
    tr = Trainer(cfg, g, parts=tmp_path / "parts", model=DotMemory(g.num_nodes), progress=False)
    assert tr.mailbox is None and tr.folder.name == "mine"
    out = tr.fit()
    assert out["data"] == "mine" and out["model"] == "dot" and out["epochs"] == 1


def test_split_batch_and_local_batch_size(tmp_path):
    assert split_batch(600, 1) == (600, None) and split_batch(600, 4, reorder=3) == (150, 200)
    with pytest.raises(RunSetupError, match="the batch size 101 .* multiple of the 2 processes"):
        split_batch(101, 2)
    tr = Trainer(parse_config({**_raw(), "train": {"epoch": 1, "local_batch_size": 75}}),
                 "synthetic", parts=tmp_path / "parts", dataset_kwargs=SMALL, progress=False)
    assert (tr.batch_size, tr.per_rank_batch, tr.loaders["train"].batch_size) == (75, 75, 75)
    tr.close()


def _two_ranks(parts):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    out = {}
    for key, train in (("global", {"batch_size": 100}), ("local", {"local_batch_size": 50})):
        cfg = parse_config({**_raw(), "train": {"epoch": 1, **train}})
        tr = Trainer(cfg, "synthetic", parts=parts, context=ctx, dataset_kwargs=SMALL,
                     partition_algo="hash", progress=False)
        s = tr.fit()
        out[key] = (tr.batch_size, tr.per_rank_batch, tr.loaders["train"].window,
                    len(tr.loaders["train"]), s["test_ap"])
        out[key + "_edgebank"] = {k: v for k, v in s.items() if k.startswith("edgebank_")}
    return out


@pytest.mark.distributed
def test_two_ranks_split_the_global_batch_and_multiply_the_local_one(tmp_path):
    r0, r1 = run_distributed(_two_ranks, 2, str(tmp_path / "parts"))
    assert r0 == r1
    # batch_size 100 over 2 ranks: 50 each, windows of 100 events; local 50: the same run
    assert r0["global"][:4] == r0["local"][:4] == (100, 50, 100, 7)
    assert r0["global"][4] == r0["local"][4]
    # EdgeBank on the model's val/test negatives: 2 ranks give the figures of 1
    cfg = parse_config({**_raw(), "train": {"epoch": 1, "batch_size": 100}})
    one = Trainer(cfg, "synthetic", parts=tmp_path / "parts1", dataset_kwargs=SMALL,
                  partition_algo="hash", progress=False).fit()
    eb1 = {k: v for k, v in one.items() if k.startswith("edgebank_")}
    assert set(eb1) == {"edgebank_val_ap", "edgebank_test_ap", "edgebank_test_auc",
                        "edgebank_test_mrr"}
    assert r0["global_edgebank"] == pytest.approx(eb1, abs=1e-12), (r0, eb1)
    assert r0["local_edgebank"] == r0["global_edgebank"]


def test_edgebank_once_per_run_on_the_model_negatives(tmp_path):
    """EdgeBank's figures: in [0, 1], from the first epoch's passes only (the evaluation
    negatives are the same every epoch), equal to evaluate_edgebank on the val and test
    splits with the loader's negatives and the evaluation batches."""
    from tgl_dist.metrics import EdgeBank, EdgeBankMetrics
    tr = Trainer(_config(2), "synthetic", parts=tmp_path / "parts", dataset_kwargs=SMALL,
                 eval_neg=3, progress=False)
    out = tr.fit()
    for k in ("val_ap", "test_ap", "test_auc", "test_mrr"):
        assert 0.0 <= out[f"edgebank_{k}"] <= 1.0, out
    assert tr._eb_bank is None   # the bank is dropped after the first epoch
    bank = EdgeBank()
    tr_ev = tr.loaders["train"].data
    bank.update(tr_ev.src, tr_ev.dst)
    ref = {}
    for split in ("val", "test"):
        ld = tr.loaders[split]
        ld.set_epoch(5)   # another epoch: the same negatives
        src, dst, neg, step = [], [], [], []
        for i, (roots, _, meta, _) in enumerate(ld):
            B, k = meta["num_pos"], meta["neg_k"]
            src.append(roots.src), dst.append(roots.dst)
            neg.append(roots.extra["neg_dst"].view(k, B).t())
            step.append(torch.full((B,), i))
        m = EdgeBankMetrics(bank)
        m.update(torch.cat(step), torch.cat(src), torch.cat(dst), torch.cat(neg))
        ref[split] = m.compute(None)
    tr.close()
    assert out["edgebank_val_ap"] == pytest.approx(ref["val"]["ap"], abs=1e-9)
    assert out["edgebank_test_ap"] == pytest.approx(ref["test"]["ap"], abs=1e-9)
    assert out["edgebank_test_mrr"] == pytest.approx(ref["test"]["mrr"], abs=1e-9)


def test_hooks_and_metric_names_are_checked(tmp_path):
    kw = dict(parts=tmp_path / "parts", dataset_kwargs=SMALL, progress=False)
    with pytest.raises(ValueError, match=r"metrics: \['ap'\] would replace the built-in"):
        Trainer(_config(1), "synthetic", metrics={"ap": lambda: None}, **kw)
    with pytest.raises(TypeError, match="on_step: expected callables"):
        Trainer(_config(1), "synthetic", on_step=[1], **kw)
    seen = []
    tr = Trainer(_config(1), "synthetic", on_epoch_end=lambda t, e, r: seen.append(e), **kw)
    tr.fit()                                   # one callable is a list of one
    assert seen == [0]


def test_the_run_folder_holds_csv_summary_config_and_curves(tmp_path):
    import json

    import yaml

    from tgl_dist.ctdg.curves import have_matplotlib
    tr = Trainer(_config(1), "synthetic", parts=tmp_path / "parts", dataset_kwargs=SMALL,
                 eval_neg=3, progress=False, out=tmp_path / "run")
    out = tr.fit()
    run = tmp_path / "run"
    assert out["run_dir"] == str(run) and out["metrics_csv"] == str(run / "metrics.csv")
    with open(run / "metrics.csv") as fh:
        assert [r["epoch"] for r in csv.DictReader(fh)] == ["0"]
    assert json.loads((run / "summary.json").read_text()) == json.loads(summary_json(out))
    cfg = yaml.safe_load((run / "config.yml").read_text())
    assert cfg["name"] == "tiny" and cfg["train"]["epoch"] == 1
    assert cfg["run"]["data"] == "synthetic" and cfg["run"]["eval_neg"] == 3
    if not have_matplotlib():
        pytest.skip("matplotlib is not installed (pip install 'tgl_dist[plot]'): no curves.png")
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_default_run_folder_is_named_by_data_model_and_time(tmp_path, monkeypatch):
    from tgl_dist.ctdg.run import make_run_dir
    monkeypatch.chdir(tmp_path)
    a = make_run_dir(None, "synthetic", "TGN")
    b = make_run_dir(None, "synthetic", "TGN")   # (in the same second: "-2" appended)
    assert a.parent == Path("runs") and a.name.startswith("synthetic_TGN_") and a.is_dir()
    assert b != a and b.is_dir() and b.name.startswith("synthetic_TGN_")
    assert make_run_dir(tmp_path / "mine", "x", "y") == tmp_path / "mine"


def test_without_matplotlib_the_run_works_and_says_how_to_get_plots(tmp_path, monkeypatch,
                                                                     caplog):
    import tgl_dist.ctdg.trainer as trainer_mod
    monkeypatch.setattr(trainer_mod, "have_matplotlib", lambda: False)
    monkeypatch.setattr(trainer_mod, "_PLOT_HINTED", False)
    caplog.set_level("INFO", logger="tgl_dist.ctdg.trainer")
    for name in ("r1", "r2"):
        Trainer(_config(1), "synthetic", parts=tmp_path / "parts", dataset_kwargs=SMALL,
                eval_neg=3, progress=False, out=tmp_path / name).fit()
        assert (tmp_path / name / "summary.json").is_file()
        assert not (tmp_path / name / "curves.png").exists()
    hints = [r for r in caplog.records if 'pip install "tgl_dist[plot]"' in r.getMessage()]
    assert len(hints) == 1   # once per process
    assert any("(EdgeBank " in r.getMessage() for r in caplog.records)
