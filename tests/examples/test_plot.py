"""``python -m tgl_dist.plot RUN [RUN ...]``: runs' curves overlaid in one PNG; ``--help``."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# the README's second pytest run (TGL_DIST_NO_KERNEL=1) re-checks the models' torch path;
# plotting runs no model: checked once, in the first run
pytestmark = pytest.mark.skipif(os.environ.get("TGL_DIST_NO_KERNEL") == "1",
                                reason="TGL_DIST_NO_KERNEL=1: plotting runs no model, tested in the first run")


def _plot(*argv, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "tgl_dist.plot", *map(str, argv)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def _run_folder(path: Path, shift: float) -> Path:
    """A run folder as the Trainer writes it (metrics.csv, summary.json), 3 epochs."""
    path.mkdir()
    with open(path / "metrics.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["epoch", "train_loss", "train_ap", "val_ap", "test_ap"])
        w.writeheader()
        for e in range(3):
            w.writerow({"epoch": e, "train_loss": 1.4 - 0.1 * e, "train_ap": 0.5 + shift * e,
                        "val_ap": 0.52 + shift * e, "test_ap": 0.51 + shift * e})
    (path / "summary.json").write_text(json.dumps({"edgebank_test_ap": 0.73,
                                                   "metrics_csv": str(path / "metrics.csv")}))
    return path


def test_help_names_runs_and_out(tmp_path):
    p = _plot("--help", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "RUN [RUN ...]" in p.stdout and "--out FILE" in p.stdout
    assert 'pip install "tgl_dist[plot]"' in p.stdout


def test_two_runs_overlaid(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib not installed: pip install "
                        "'tgl_dist[plot]'")
    a, b = _run_folder(tmp_path / "a", 0.05), _run_folder(tmp_path / "b", 0.02)
    p = _plot(a, b, "--out", tmp_path / "both.png", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "both.png").read_bytes()[:4] == b"\x89PNG"
    p = _plot(a, b / "metrics.csv", cwd=tmp_path)   # a CSV too; default --out curves.png
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "curves.png").is_file()


def test_a_missing_run_is_one_error_line(tmp_path):
    p = _plot(tmp_path / "nope", cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.startswith("error: ")
    assert "no metrics CSV" in p.stderr or "matplotlib" in p.stderr
