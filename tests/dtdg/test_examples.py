"""The DTDG examples run end to end (1 epoch, tiny data) and print one JSON line."""
import json
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


def _run(script, args, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(REPO / "examples" / "dtdg" / script), *args,
                          "--parts", str(tmp_path / "parts"), "--epochs", "1"],
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
