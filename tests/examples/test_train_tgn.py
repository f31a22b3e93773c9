"""examples/ctdg/train_tgn.py runs end to end (plain python and torchrun) and prints one JSON line."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts_util import load_script
from tgl_dist.ctdg.run import RunSetupError, ensure_partition
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "ctdg" / "train_tgn.py"
KEYS = {"model", "data", "world_size", "epochs", "val_ap", "test_ap", "test_auc", "test_mrr",
        "train_events_per_s", "peak_rss_mib", "edgebank_val_ap", "edgebank_test_ap",
        "edgebank_test_auc", "edgebank_test_mrr"}
TINY = ["--num-nodes", "60", "--num-events", "1500", "--batch-size", "100", "--eval-neg", "3",
        "--epochs", "1", "--no-progress", "--threads", "1",
        "--device", "cpu"]  # the CPU path (tests/gpu covers the GPU one)


def _run(cmd, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    out = json.loads(lines[-1])
    assert KEYS <= set(out), set(out) ^ KEYS
    assert all(0.0 <= out[k] <= 1.0 for k in KEYS if k.startswith("edgebank_")), out
    return out


@pytest.mark.slow
def test_plain_python_world_of_one(tmp_path):
    out = _run([sys.executable, str(SCRIPT), "--parts", str(tmp_path / "parts"), *TINY], tmp_path)
    assert out["world_size"] == 1 and out["model"] == "TGN_DyGLib-embedding" and out["epochs"] == 1
    assert 0.0 <= out["test_ap"] <= 1.0 and 0.0 < out["test_mrr"] <= 1.0
    assert out["train_events_per_s"] > 0
    # the run folder (default runs/<data>_<model>_<time>/ under the working directory)
    run = tmp_path / out["run_dir"]
    assert run.parent == tmp_path / "runs" and run.name.startswith("synthetic_TGN_DyGLib-embedding_")
    assert tmp_path / out["metrics_csv"] == run / "metrics.csv"
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert len(rows) == 1 and float(rows[0]["val_ap"]) == pytest.approx(out["val_ap"], abs=1e-5)
    assert json.loads((run / "summary.json").read_text()) == out
    assert (run / "config.yml").is_file()
    # the partition was written on first use
    assert (tmp_path / "parts" / "synthetic" / "metis_for_tgnn_1" / "manifest.json").is_file()


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_two_processes_jodie(tmp_path):
    # JODIE with TGL's random chunk scheduling (train.reorder) on
    cfg = tmp_path / "JODIE.yml"
    cfg.write_text((REPO / "configs" / "JODIE.yml").read_text().replace(
        "  - epoch:", "  - reorder: 4\n    epoch:"))
    out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                "--standalone", str(SCRIPT),
                "--config", str(cfg), "--partition-algo", "hash",
                "--parts", str(tmp_path / "parts"), "--checkpoint-dir", str(tmp_path / "ck"),
                *TINY], tmp_path)
    assert out["world_size"] == 2 and out["model"] == "JODIE"
    # each step's window is --batch-size events over both ranks (not per rank): 1,050
    # training events in windows of 100 (reorder 4 shifts the first by a chunk) -> 11 steps
    meta = json.loads(next((tmp_path / "ck").glob("v*/manifest_0.json")).read_text())["meta"]
    assert meta["global_step"] == 11
    assert len(out["peak_rss_mib_per_rank"]) == 2
    assert 0.0 <= out["test_ap"] <= 1.0


@pytest.mark.skipif(os.environ.get("TGL_DIST_NO_KERNEL") == "1",
                    reason="TGL_DIST_NO_KERNEL=1: the command line's batch sizes, tested in the first run")
@pytest.mark.slow
@pytest.mark.distributed
def test_a_tgl_dist_config_local_batch_size_is_per_process(tmp_path):
    # TGL's dist configs write "batch_size: 4000 # local batch_size" (per GPU): 2 processes
    # then train on windows of 2 x 50 events; --batch-size (global) replaces it
    cfg = tmp_path / "JODIE-dist.yml"
    cfg.write_text((REPO / "configs" / "JODIE.yml").read_text().replace(
        "batch_size: 600", "batch_size: 50 # local batch_size"))
    tiny = [a for a in TINY]
    del tiny[tiny.index("--batch-size"):tiny.index("--batch-size") + 2]
    base = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
            str(SCRIPT), "--config", str(cfg), "--partition-algo", "hash"]
    out = _run([*base, "--parts", str(tmp_path / "parts"), *tiny], tmp_path)
    assert (out["world_size"], out["batch_size"]) == (2, 100)
    one = _run([sys.executable, str(SCRIPT), "--config", str(cfg), "--partition-algo", "hash",
                "--parts", str(tmp_path / "parts"), *tiny], tmp_path)
    assert (one["world_size"], one["batch_size"]) == (1, 50)
    over = _run([*base, "--parts", str(tmp_path / "parts"), *tiny, "--batch-size", "60"],
                tmp_path)
    assert over["batch_size"] == 60


@pytest.mark.skipif(os.environ.get("TGL_DIST_NO_KERNEL") == "1",
                    reason="TGL_DIST_NO_KERNEL=1: refused before any model runs, tested in the first run")
@pytest.mark.distributed
def test_torchrun_batch_not_a_multiple_of_the_processes_is_refused(tmp_path):
    # before: 2 processes silently trained on 100-event windows for --batch-size 101 (and
    # reported 101), where one process trains on 101
    tiny = [a for a in TINY]
    tiny[tiny.index("--batch-size") + 1] = "101"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                        "--standalone", str(SCRIPT), "--parts", str(tmp_path / "parts"), *tiny],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "the batch size 101 (events per step over all ranks) must be a multiple of the 2 " \
           "processes" in p.stderr
    assert not (tmp_path / "parts").exists()       # refused before partitioning


def _ensure(mod, argv):
    """The trainer's partition-on-first-use (rank 0 of a world of one) with the example's
    flags, as ``Trainer`` calls it."""
    a = mod.build_parser().parse_args(argv)
    kw = {k: v for k, v in (("num_nodes", a.num_nodes), ("num_events", a.num_events),
                            ("seed", a.data_seed)) if v is not None}
    return ensure_partition(a.data, a.parts, a.partition_algo, world_size=1, rank=0,
                            repartition=a.repartition, root=a.root, format=a.format,
                            dataset_kwargs=kw)


def test_a_partition_of_other_data_is_written_again(tmp_path):
    """The partition cache is keyed by the data's fingerprint, not only its name: another
    --num-events (or an edited file) partitions again instead of training on stale parts."""
    mod = load_script(SCRIPT, "_tgn_parts")
    from tgl_dist.partition.storage import read_manifest
    parts = ["--parts", str(tmp_path / "parts"), "--num-nodes", "60"]
    folder = _ensure(mod, parts + ["--num-events", "900"])
    part = folder / "metis_for_tgnn_1"
    assert read_manifest(part)["num_events"] == 900
    written = (part / "manifest.json").stat().st_mtime_ns
    _ensure(mod, parts + ["--num-events", "900"])
    assert (part / "manifest.json").stat().st_mtime_ns == written       # same data: reused
    _ensure(mod, parts + ["--num-events", "700"])
    assert read_manifest(part)["num_events"] == 700                     # other data: rewritten
    fp = read_manifest(part)["fingerprint"]
    _ensure(mod, parts + ["--num-events", "700", "--data-seed", "3"])
    assert read_manifest(part)["fingerprint"] != fp                     # another seed: rewritten
    written = (part / "manifest.json").stat().st_mtime_ns
    _ensure(mod, parts + ["--num-events", "700", "--data-seed", "3", "--repartition"])
    assert (part / "manifest.json").stat().st_mtime_ns != written       # --repartition: rewritten


def test_parts_below_the_root_and_a_split_without_events_are_refused(tmp_path):
    """--parts given the printed partition folder used to get a new partition written
    inside it; a stream on one timestamp (a weight column read as time) used to train and
    end with NaN metrics and exit status 0."""
    mod = load_script(SCRIPT, "_tgn_refused")
    run = lambda *a: _ensure(mod, list(a))  # noqa: E731
    root = tmp_path / "parts"
    folder = run("--parts", str(root), "--num-nodes", "60", "--num-events", "900")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    for below, hint in ((folder / "metis_for_tgnn_1", "is one partition"),
                        (folder, "holds one dataset's partitions")):
        with pytest.raises(RunSetupError, match=f"{hint}.*--parts {root}$"):
            run("--parts", str(below), "--num-nodes", "60", "--num-events", "900")
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before   # nothing nested
    csv_path = tmp_path / "events.csv"   # SOURCE,TARGET,RATING,TIME with a constant "time"
    csv_path.write_text("SOURCE,TARGET,RATING,TIME\n" +
                        "".join(f"{i % 7},{7 + i % 5},{i},1\n" for i in range(200)))
    with pytest.raises(RunSetupError, match=r"leaves val and test without events "
                                            r"\(train/val/test 200/0/0 of 200; 1 distinct "
                                            r"timestamps"):
        run("--parts", str(tmp_path / "p2"), "--data", str(csv_path))
    assert not (tmp_path / "p2").exists()
