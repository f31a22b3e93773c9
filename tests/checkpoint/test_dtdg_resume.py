"""DTDG Trainer on 2 ranks: resumed from a checkpoint taken inside an epoch, it ends bitwise
like the uninterrupted run (model, optimizer, history, best model, test metrics)."""
import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dtdg"))  # dtdg_graphs

from dtdg_graphs import small_graph  # noqa: E402

from ckcompare import diff  # noqa: E402
from tgl_dist.checkpoint import CheckpointManager  # noqa: E402
from tgl_dist.testing import run_distributed  # noqa: E402


def _trainer(graph):
    from tgl_dist.dtdg import Splitter, Trainer, build_model, build_task
    torch.manual_seed(0)
    model = build_model({"model": "evolvegcn-o", "hidden_dims": [8, 8]}, graph)
    task = build_task("link_pred", graph, 8, neg_eval=5)
    sp = Splitter.from_graph(graph, hist_len=3, task="link_pred")
    return Trainer(model, task, sp, lr=0.01, epochs=3, patience=5)


def _final(tr, res):
    hist = [{k: v for k, v in h.items() if k not in ("seconds", "snapshots_per_s")}
            for h in tr.history]
    return {"model": tr.model.state_dict(), "task": tr.task.state_dict(),
            "optim": tr.opt.state_dict(), "history": hist, "best_epoch": tr.best_epoch,
            "metrics": {k: v for k, v in res.items() if k.startswith(("test_", "dev_"))}}


def _resume_worker(path, ck):
    from tgl_dist import DistributedContext
    from tgl_dist.dtdg import get_graph
    torch.set_num_threads(1)
    DistributedContext.init(use_gpu=False)
    graph = get_graph(path)
    mgr = CheckpointManager(ck)
    tr = _trainer(graph)
    windows = len(tr.splitter.train)
    at_save = {}

    def save(t, epoch, done):
        if (epoch, done) == (1, windows // 2):
            mgr.save(*t.checkpoint_state())
            at_save.update(stop=copy.deepcopy(t.stop.state_dict()),
                           best=copy.deepcopy(t.best_state), best_epoch=t.best_epoch)
    tr.step_hooks.append(save)
    ref = _final(tr, tr.fit())
    again = _trainer(graph)  # a fresh process would build exactly this, then load
    dense, shard, meta = mgr.load()
    again.load_checkpoint_state(dense, shard, meta)
    # the early-stopping counters and the best-model snapshot are those of the save
    restored = diff({"stop": at_save["stop"], "best": at_save["best"]},
                    {"stop": again.stop.state_dict(), "best": again.best_state})
    assert at_save["best"] is not None and again.best_epoch == at_save["best_epoch"]
    res = _final(again, again.fit())
    return meta, diff(ref, res), ref["metrics"], restored


@pytest.mark.distributed
def test_dtdg_two_ranks_resume_mid_epoch_is_bitwise(tmp_path):
    g = small_graph(N=40, T=12, E=500, name="resume")
    path = g.save_partition(tmp_path / "parts", 2, "metis")
    out = run_distributed(_resume_worker, 2, str(path), str(tmp_path / "ck"))
    for meta, differences, metrics, restored in out:
        assert meta["epoch"] == 1 and meta["step"] > 0 and not meta["done"]
        assert differences == [] and restored == []
        assert metrics["test_ap"] == out[0][2]["test_ap"]
