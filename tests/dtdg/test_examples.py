"""The DTDG examples run end to end (1 epoch, tiny data) and print one JSON line."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]


def _tiny_json(path: Path, N: int = 30, T: int = 12) -> Path:
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


def _run(script, args, tmp_path, epochs=1, launcher=()):
    """Run an example (``launcher``: e.g. torchrun's module and options) -> its last JSON line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, *launcher, str(REPO / "examples" / "dtdg" / script), *args,
                          "--parts", str(tmp_path / "parts"), "--epochs", str(epochs),
                          "--device", "cpu"],  # the CPU path (tests/gpu covers the GPU one)
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])


@pytest.mark.slow
def test_link_pred_example(tmp_path):
    data = _tiny_json(tmp_path / "tiny.json")
    res = _run("train_link_pred.py", ["--data", str(data), "--hist-len", "3", "--algo", "random",
                                      "--hidden-dim", "8"], tmp_path)
    for k in ("model", "data", "world_size", "epochs", "test_ap", "test_auc", "test_mrr",
              "baseline_test_ap", "snapshots_per_s"):
        assert k in res, k
    assert res["world_size"] == 1 and res["epochs"] == 1 and 0 <= res["test_ap"] <= 1
    assert (tmp_path / "parts" / "tiny-lp" / "dtdg_random_1" / "manifest.json").is_file()


@pytest.mark.slow
def test_node_regression_example(tmp_path, datasets_root):
    res = _run("train_node_regression.py", ["--data", "pedalme_london", "--root", str(datasets_root),
                                            "--lags", "4", "--hidden-dim", "8", "--model", "gconvgru"],
               tmp_path)
    assert res["model"] == "gconvgru" and res["data"] == "pedalme_london"
    assert res["test_mse"] > 0 and res["baseline_test_mse"] > 0 and res["snapshots_per_s"] > 0


@pytest.mark.slow
@pytest.mark.distributed
def test_node_regression_example_torchrun_two_processes(tmp_path, datasets_root):
    """``torchrun --nproc_per_node=2`` runs the example end to end and ends where 1 process
    does: in float64 the models and the trainer follow the 1-process path (docs/dtdg.md:
    identical metrics; checked here to 1e-5 relative, the exactness tests' tolerance)."""
    args = ["--data", "pedalme_london", "--root", str(datasets_root), "--lags", "4",
            "--hidden-dim", "8", "--dtype", "float64", "--algo", "random"]
    one = _run("train_node_regression.py", args, tmp_path, epochs=2)
    two = _run("train_node_regression.py", args, tmp_path, epochs=2,
               launcher=["-m", "torch.distributed.run", "--nproc_per_node=2",
                         "--standalone"])
    for k in ("model", "data", "task", "world_size", "epochs", "best_epoch", "test_mse",
              "baseline_test_mse", "dev_mse", "snapshots_per_s", "train_windows", "test_windows"):
        assert k in two, k
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert two["epochs"] == one["epochs"] == 2 and two["best_epoch"] == one["best_epoch"]
    assert two["train_windows"] == one["train_windows"] > 0
    for k in ("test_mse", "dev_mse", "baseline_test_mse"):
        assert math.isclose(two[k], one[k], rel_tol=1e-5), (k, one[k], two[k])
    assert (tmp_path / "parts" / "pedalme_london" / "dtdg_random_2" / "manifest.json").is_file()


def _common():
    import importlib.util
    path = REPO / "examples" / "dtdg" / "_common.py"
    spec = importlib.util.spec_from_file_location("_dtdg_common_args", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv, message", [
    (["--hist-len", "0"], "argument --hist-len: expected a positive integer, got '0'"),
    (["--hidden-dim", "0"], "argument --hidden-dim: expected a positive integer"),
    (["--num-layers", "0"], "argument --num-layers: expected a positive integer"),
    (["--epochs", "0"], "argument --epochs: expected a positive integer, got '0'"),
    (["--patience", "0"], "argument --patience: expected a positive integer"),
    (["--lr", "-1"], "argument --lr: expected a positive finite number, got '-1'"),
    (["--lr", "nan"], "argument --lr: expected a positive finite number, got 'nan'"),
    (["--weight-decay", "-1"], "argument --weight-decay: expected a non-negative finite number"),
    (["--weight-decay", "inf"], "argument --weight-decay: expected a non-negative finite number"),
    (["--model", "foo"], "argument --model: unknown DTDG model 'foo'; known: ['evolvegcn-h'"),
    (["--node-embedding", "-1"], "argument --node-embedding: expected a non-negative integer"),
    (["--threads", "0"], "argument --threads: expected a positive integer, got '0'"),
    (["--threads", "-1"], "argument --threads: expected a positive integer"),
    (["--num-parts", "0"], "argument --num-parts: expected a positive integer"),
    (["--log-level", "LOUD"], "argument --log-level: invalid choice: 'LOUD'"),
])
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    from tgl_dist.cli import parse_run_arguments
    p = _common().build_parser("Train.", "d", "evolvegcn-o", 10, 0.01, 30, 4)
    with pytest.raises(SystemExit) as e:
        parse_run_arguments(p, argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_good_arguments_and_aliases_still_parse():
    from tgl_dist.cli import parse_run_arguments
    p = _common().build_parser("Train.", "d", "evolvegcn-o", 10, 0.01, 30, 4)
    args, _ = parse_run_arguments(p, ["--model", "egcn_o", "--log-level", "info",
                                      "--weight-decay", "0", "--node-embedding", "0"])
    assert (args.model, args.log_level, args.weight_decay) == ("evolvegcn-o", "INFO", 0.0)


def test_a_hist_len_longer_than_the_data_is_an_error_not_a_trace(tmp_path):
    data = _tiny_json(tmp_path / "tiny.json")
    out = subprocess.run([sys.executable, str(REPO / "examples" / "dtdg" / "train_link_pred.py"),
                          "--data", str(data), "--hist-len", "100000", "--algo", "random",
                          "--parts", str(tmp_path / "parts"), "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "error: --hist-len 100000: " in out.stderr and "lower hist_len" in out.stderr


def test_the_example_wires_its_arguments_into_the_trainer(tmp_path, monkeypatch):
    """--lr, --patience and --dtype reach the Trainer and the model; an early stop still
    commits a final checkpoint; the JSON line reports the epochs that ran. The Trainer is a
    stub that stops after its second epoch (no training: the wiring is what is checked)."""
    import torch
    mod = _common()
    seen = {}

    class StubTrainer:
        def __init__(self, model, task, splitter, lr, weight_decay, epochs, patience, progress):
            seen.update(lr=lr, weight_decay=weight_decay, patience=patience,
                        dtype={p.dtype for p in model.parameters()})
            self.splitter, self.epochs, self.start_epoch, self.partial = splitter, epochs, 0, None
            self.stopped, self.hooks, self.step_hooks, self.eval_hooks = False, [], [], []

        def checkpoint_state(self):
            return {"w": torch.zeros(1)}, {}, {"epoch": 2, "step": 0, "done": self.stopped}

        def fit(self):
            for epoch in range(2):
                self.stopped = epoch == 1
                for hook in self.hooks:
                    hook(self, epoch, {})
            return {"epochs_run": 2, "best_epoch": 0, "snapshots_per_s": 1.0}
    monkeypatch.setattr(mod, "Trainer", StubTrainer)
    data = _tiny_json(tmp_path / "tiny.json")
    monkeypatch.setattr(sys, "argv", [
        "train_link_pred.py", "--data", str(data), "--algo", "random", "--parts",
        str(tmp_path / "parts"), "--device", "cpu", "--epochs", "30", "--lr", "0.0321",
        "--patience", "7", "--weight-decay", "0.001", "--dtype", "float64", "--hist-len", "3",
        "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "10e"])
    out = mod._run("Train.", "link_pred", data="x", model="evolvegcn-o", hist_len=3, lr=0.01,
                   epochs=30, lags=4)
    assert seen == {"lr": 0.0321, "weight_decay": 0.001, "patience": 7, "dtype": {torch.float64}}
    assert out["epochs"] == 2 and out["dtype"] == "float64"
    assert (tmp_path / "ck" / "VERSION").read_text().strip() == "1"   # the early stop's save


def test_the_partition_is_written_again_for_edited_data_or_another_seed(tmp_path):
    """As for CTDG: the cached DTDG partition is reused only for the same data (its
    fingerprint) and the same --seed; otherwise it is written again."""
    from tgl_dist.cli import parse_run_arguments
    from tgl_dist.context import DistributedContext
    from tgl_dist.partition.storage import read_manifest
    mod = _common()
    data = _tiny_json(tmp_path / "tiny.json")
    ctx = DistributedContext.init(use_gpu=False)
    p = mod.build_parser("Train.", "d", "evolvegcn-o", 3, 0.01, 30, 1)

    def prepare(*extra):
        args, _ = parse_run_arguments(p, ["--data", str(data), "--algo", "random", "--parts",
                                          str(tmp_path / "parts"), *extra])
        return Path(mod._prepare(args, ctx, "node_regression")[1]["path"])
    path = prepare()
    written = (path / "manifest.json").stat().st_mtime_ns
    fp = read_manifest(path)["fingerprint"]
    assert prepare() == path and (path / "manifest.json").stat().st_mtime_ns == written  # reused
    doc = json.loads(data.read_text())
    e = doc["0"]["edges"][0]
    doc["0"]["edges"][0] = [e[1], (e[0] + 1) % 30]       # one edge edited
    data.write_text(json.dumps(doc))
    assert prepare() == path and read_manifest(path)["fingerprint"] != fp
    assert read_manifest(prepare("--seed", "1"))["seed"] == 1
