"""A stopped-and-resumed example run ends exactly like one that never stopped.

The final committed checkpoints (model, optimizer, every rank's memory / mailbox
shard, RNG states, metrics history, early stopping, best model) are compared bitwise;
the JSON lines' metrics must be equal. Runs are stopped with the TGL_DIST_FAULT
testing hook (a raised exception or a SIGKILL at a given step).
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ckcompare import checkpoint_diff

REPO = Path(__file__).resolve().parents[2]
TGN = REPO / "examples" / "ctdg" / "train_tgn.py"
TINY = ["--data", "synthetic", "--num-nodes", "50", "--num-events", "1000", "--batch-size", "100",
        "--eval-neg", "3", "--no-progress", "--threads", "1",
        "--device", "cpu"]  # the CPU path (tests/gpu covers the GPU one)
METRICS = ("epochs", "best_epoch", "val_ap", "val_auc", "test_ap", "test_auc", "test_mrr",
           "test_ap_batch_mean")


def _run(cmd, cwd, fault=None, ok=True, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TGL_DIST_NO_KERNEL="1")
    env.pop("TGL_DIST_FAULT", None)
    if fault:
        env["TGL_DIST_FAULT"] = fault
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if ok:
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
    assert p.returncode != 0, "the run should have failed"
    return p


def _tgn(tmp, ck, *extra):
    return [sys.executable, str(TGN), *TINY, "--parts", str(tmp / "parts"),
            "--checkpoint-dir", str(tmp / ck), *extra]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """An uninterrupted 2-epoch run with a checkpoint every 3 steps (7 train steps an epoch)."""
    tmp = tmp_path_factory.mktemp("full")
    out = _run(_tgn(tmp, "ck", "--epochs", "2", "--checkpoint-every", "3", "--metrics-csv",
                    str(tmp / "full.csv")), tmp)
    return tmp, out


@pytest.mark.slow
def test_one_process_resume_to_more_epochs_and_mid_epoch_is_bitwise(full_run):
    tmp, full = full_run
    # a finished 1-epoch run (its last checkpoint is after epoch 0) ...
    _run(_tgn(tmp, "part", "--epochs", "1", "--checkpoint-every", "3"), tmp)
    # ... continued to 2 epochs, SIGKILLed at epoch 1 after train step 5: the last commit is
    # global step 9 = step 2 of epoch 1 (7 steps an epoch; epoch 0 ended at global step 7)
    args = ["--epochs", "2", "--checkpoint-every", "3", "--resume"]
    _run(_tgn(tmp, "part", *args), tmp, fault="rank=0,epoch=1,step=5,action=kill", ok=False)
    meta = json.loads(next((tmp / "part").glob("v*/manifest_0.json")).read_text())["meta"]
    assert meta == {"epoch": 1, "step": 2, "global_step": 9, "done": False}
    assert checkpoint_diff(tmp / "ck", tmp / "part")  # the comparison can fail
    res = _run(_tgn(tmp, "part", *args, "--metrics-csv", str(tmp / "part.csv")), tmp)
    assert checkpoint_diff(tmp / "ck", tmp / "part") == []
    assert {k: res[k] for k in METRICS} == {k: full[k] for k in METRICS}
    # the resumed run's metrics CSV holds every epoch, the restored ones included
    def rows(name):
        with open(tmp / name) as fh:
            return [{k: v for k, v in r.items() if k not in ("train_events_per_s", "epoch_s")}
                    for r in csv.DictReader(fh)]
    assert [r["epoch"] for r in rows("part.csv")] == ["0", "1"]
    assert rows("part.csv") == rows("full.csv")


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_max_restarts_resumes_bitwise_two_processes(tmp_path):
    """2 ranks; rank 1 is SIGKILLed once mid-epoch; torchrun restarts both with --resume.

    TGN with a sharded node-embedding table (configs/TGN-embedding.yml): each rank's
    memory, mailbox, embedding rows and sparse Adam rows must come back exactly."""
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2"]
    cfg = ["--config", str(REPO / "configs" / "TGN-embedding.yml")]
    full = _run([*base, "--standalone", str(TGN), *TINY, *cfg, "--parts",
                 str(tmp_path / "parts"), "--checkpoint-dir", str(tmp_path / "ck"),
                 "--epochs", "2", "--checkpoint-every", "3"], tmp_path)
    marker = tmp_path / "fault-done"
    res = _run([*base, "--max-restarts=1", "--standalone", str(TGN), *TINY, *cfg,
                "--parts", str(tmp_path / "parts"), "--checkpoint-dir", str(tmp_path / "part"),
                "--epochs", "2", "--checkpoint-every", "3", "--resume"], tmp_path,
               fault=f"rank=1,epoch=1,step=2,action=kill,once={marker}")
    assert marker.is_file()  # the fault did happen (and the restart got past it)
    assert checkpoint_diff(tmp_path / "ck", tmp_path / "part") == []
    assert {k: res[k] for k in METRICS} == {k: full[k] for k in METRICS}
    assert res["world_size"] == 2
    shard = torch.load(next((tmp_path / "part").glob("v*/shard_1.pt")), weights_only=False)
    assert "node_embedding.weight" in shard["model"][0] and shard["optim"] is not None


DTDG = REPO / "examples" / "dtdg"


def _tiny_dtdg(path: Path, N: int = 30, T: int = 12) -> Path:
    import random
    rng = random.Random(0)
    d = {"time_periods": T, "node_ids": {f"n{i}": i for i in range(N)}}
    for t in range(T):
        edges = [[rng.randrange(N), rng.randrange(N)] for _ in range(40)]
        d[str(t)] = {"index": t, "edges": edges, "weights": [1.0] * 40,
                     "X": [[rng.random(), rng.random()] for _ in range(N)],
                     "y": [rng.randrange(5) for _ in range(N)]}
    path.write_text(json.dumps(d))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("script,model", [("train_link_pred.py", "evolvegcn-o")])
def test_dtdg_resume_mid_epoch_is_bitwise(tmp_path, script, model):
    data = _tiny_dtdg(tmp_path / "tiny.json")
    args = [sys.executable, str(DTDG / script), "--data", str(data), "--hist-len", "3",
            "--algo", "random", "--hidden-dim", "8", "--model", model, "--lags", "1",
            "--node-embedding", "4",  # a sharded table: its rows and sparse Adam rows resume too
            "--parts", str(tmp_path / "parts"), "--epochs", "3", "--checkpoint-every", "2",
            "--device", "cpu"]
    full = _run([*args, "--checkpoint-dir", str(tmp_path / "ck")], tmp_path)
    _run([*args, "--checkpoint-dir", str(tmp_path / "part")], tmp_path,
         fault="rank=0,epoch=1,step=3,action=raise", ok=False)
    assert checkpoint_diff(tmp_path / "ck", tmp_path / "part")
    # resumed with the same run spelled differently: a model alias, the device and backend
    # named (where a run executes is not part of what must match), the default part count
    same = [a for a in args if a not in ("--device", "cpu")]
    same[same.index(model)] = {"evolvegcn-o": "egcn_o"}[model]
    res = _run([*same, "--device", "auto", "--backend", "gloo", "--num-parts", "1",
                "--checkpoint-dir", str(tmp_path / "part"), "--resume"], tmp_path)
    assert checkpoint_diff(tmp_path / "ck", tmp_path / "part") == []
    keys = [k for k in full if k.startswith(("test_", "dev_", "baseline_"))] + ["best_epoch", "epochs"]
    assert keys and {k: res[k] for k in keys} == {k: full[k] for k in keys}
    # another learning rate is another run: refused, not continued
    p = _run([*args, "--lr", "0.02", "--checkpoint-dir", str(tmp_path / "part"), "--resume"],
             tmp_path, ok=False)
    assert "run_meta['args']" in p.stderr and "lr" in p.stderr, p.stderr[-2000:]
