"""``python -m tgl_dist.partition``: help and a run on synthetic data (subprocesses), errors (in process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tgl_dist.partition import partition_load
from tgl_dist.partition.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "tgl_dist.partition", *args], capture_output=True,
                          text=True, env=env, cwd=cwd or REPO, timeout=120)


def test_help():
    r = _cli("--help")
    assert r.returncode == 0
    for opt in ("--data", "--format", "--root", "--num-parts", "--algo", "--out", "--force",
                "--seed", "--num-nodes", "--num-events"):
        assert opt in r.stdout
    assert "metis_for_tgnn" in r.stdout and "random" in r.stdout


def test_run_on_synthetic(tmp_path):
    args = ("--data", "synthetic", "--num-nodes", "300", "--num-events", "3000", "--num-parts", "2",
            "--algo", "metis_for_tgnn", "--out", str(tmp_path))
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["num_parts"] == 2 and summary["num_events"] == 3000 and summary["algo"] == "metis_for_tgnn"
    assert sum(summary["events_per_part"]) == 3000 and 0 <= summary["edge_cut"] < 1
    for key in ("balance_nodes", "balance_events", "replication", "seconds"):
        assert key in summary
    assert "edge_cut" in r.stdout and "part" in r.stdout          # the summary table
    assert "metis_for_tgnn P=2" in r.stderr                        # the progress bar
    path = Path(summary["path"])
    assert path == tmp_path / "synthetic" / "metis_for_tgnn_2"
    assert partition_load(path.parent, "metis_for_tgnn", rank=1, world_size=2).num_events == 3000


def test_existing_output_needs_force(tmp_path, capsys):
    args = ["--data", "synthetic", "--num-nodes", "200", "--num-events", "1000", "--num-parts", "2",
            "--algo", "hash", "--out", str(tmp_path), "--quiet"]
    assert main(args) == 0
    assert main(args) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(args + ["--force"]) == 0


def test_unknown_algorithm_is_an_error(tmp_path, capsys):
    assert main(["--data", "synthetic", "--num-parts", "2", "--algo", "fennel", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown partitioning algorithm 'fennel'" in err
    assert "hash, metis, metis_for_tgnn, random" in err
    assert not any(tmp_path.iterdir())


def test_missing_dataset_is_an_error(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "nope.csv"), "--num-parts", "2", "--out", str(tmp_path / "o")]) == 2
    assert "nope.csv" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_an_out_that_is_a_file_is_a_usage_error(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    for out in (f, f / "sub"):
        with pytest.raises(SystemExit) as e:
            main(["--data", "synthetic", "--num-parts", "2", "--out", str(out)])
        assert e.value.code == 2
        assert f"argument --out: {f} is not a folder" in capsys.readouterr().err


def test_an_unwritable_output_is_an_error_not_a_trace(tmp_path, capsys, monkeypatch):
    from tgl_dist.partition import writer
    args = ["--data", "synthetic", "--num-nodes", "100", "--num-events", "500", "--num-parts", "2",
            "--algo", "hash", "--out", str(tmp_path), "--quiet"]
    (tmp_path / "synthetic").write_text("a file where the dataset folder goes")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(tmp_path / "synthetic") in err

    def denied(*a, **k):   # what --out /sys/kernel/x gives
        raise PermissionError(1, "Operation not permitted", "/sys/kernel/x")
    monkeypatch.setattr(writer, "partition_graph", denied)
    assert main(args) == 2
    assert capsys.readouterr().err == "error: [Errno 1] Operation not permitted: '/sys/kernel/x'\n"


def test_synthetic_only_flags_with_a_file_are_an_error(tmp_path, capsys):
    """--num-nodes / --num-events / --data-seed belong to the synthetic dataset: with a file
    they are one error line (exit 2), not a TypeError from inside the loader."""
    f = tmp_path / "a.txt"
    f.write_text("0 1 1\n1 2 2\n2 0 3\n")
    rc = main(["--data", str(f), "--format", "snap", "--num-nodes", "500", "--num-parts", "2",
               "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "error: the snap loader takes no argument num_nodes" in err
    assert "'synthetic' dataset" in err and not (tmp_path / "o").exists()
    from tgl_dist.data import load_dataset
    with pytest.raises(ValueError, match="synthetic generator takes no argument colour"):
        load_dataset("synthetic", colour=1)


def test_algo_seed_and_name_reach_the_partition(tmp_path, capsys):
    args = ["--data", "synthetic", "--num-nodes", "100", "--num-events", "600", "--num-parts",
            "2", "--algo", "random", "--seed", "3", "--name", "foo", "--out", str(tmp_path),
            "--quiet"]
    assert main(args) == 0
    manifest = json.loads((tmp_path / "foo" / "random_2" / "manifest.json").read_text())
    assert manifest["algorithm"] == "random" and manifest["seed"] == 3
    assert manifest["name"] == "foo"
