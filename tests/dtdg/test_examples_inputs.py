"""The DTDG examples accept a snapshot edge-list CSV and PGT's node-link (Montevideo) JSON
(1 epoch, tiny generated files)."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _snapshot_csv(path: Path, N: int = 30, T: int = 10, per: int = 40) -> Path:
    rng = random.Random(0)
    rows = ["snapshot,src,dst,weight"]
    rows += [f"{t},{rng.randrange(N)},{rng.randrange(N)},{rng.random():.3f}"
             for t in range(T) for _ in range(per)]
    path.write_text("\n".join(rows) + "\n")
    return path


def _montevideo(path: Path, N: int = 12, T: int = 30) -> Path:
    rng = random.Random(0)
    nodes = []
    for n in range(N):
        series = [float(rng.randrange(50)) for _ in range(T)]
        nodes.append({"bus_stop": 1000 + n, "X": {"y": series}, "y": series})
    links = [{"source": 1000 + n, "target": 1000 + (n + 1) % N, "weight": 1.0 + n} for n in range(N)]
    path.write_text(json.dumps({"nodes": nodes, "links": links}))
    return path


def _run(script, args, tmp_path):
    return subprocess.run([sys.executable, str(REPO / "examples" / "dtdg" / script), *args,
                           "--parts", str(tmp_path / "parts"), "--epochs", "1", "--device", "cpu",
                           "--algo", "random", "--hidden-dim", "8"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def _json(out):
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads([ln for ln in out.stdout.splitlines() if ln.strip()][-1])


@pytest.mark.slow
def test_link_pred_on_a_snapshot_csv_inferred_and_explicit(tmp_path):
    data = _snapshot_csv(tmp_path / "gen.csv")
    res = _json(_run("train_link_pred.py", ["--data", str(data), "--hist-len", "3"], tmp_path))
    assert res["data"] == "gen-lp" and res["task"] == "link_pred" and res["epochs"] == 1
    assert 0 <= res["test_ap"] <= 1 and res["train_windows"] > 0
    other = _snapshot_csv(tmp_path / "edges.txt")
    res = _json(_run("train_link_pred.py", ["--data", str(other), "--format", "snapshot-csv",
                                            "--hist-len", "3"], tmp_path))
    assert res["data"] == "edges-lp"


@pytest.mark.slow
def test_node_regression_on_a_node_link_json(tmp_path):
    data = _montevideo(tmp_path / "montevideo_bus.json")
    res = _json(_run("train_node_regression.py", ["--data", str(data), "--lags", "2",
                                                  "--hist-len", "3"], tmp_path))
    assert res["data"] == "montevideo_bus" and res["task"] == "node_regression"
    assert res["test_mse"] > 0 and res["baseline_test_mse"] > 0


def test_node_regression_refuses_a_file_without_targets(tmp_path):
    data = _snapshot_csv(tmp_path / "gen.csv")
    out = _run("train_node_regression.py", ["--data", str(data), "--hist-len", "3"], tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "has no node targets (y) for node regression (layout 'snapshot_csv')" in out.stderr
    bad = tmp_path / "bad.csv"
    bad.write_text("snapshot,src,dst\n0,1,x\n")
    out = _run("train_link_pred.py", ["--data", str(bad)], tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"{bad}, line 2, field 'dst': 'x' is not a number [read as snapshot-csv" in out.stderr
