import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tgl_dist.checkpoint import CheckpointError, CheckpointManager
from tgl_dist.testing import run_distributed


def test_save_load_round_trip_and_pruning(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep_every=2, run_meta={"partition": "abc"})
    assert mgr.committed_version() is None
    for step in range(1, 5):
        v = mgr.save({"w": torch.full((3,), float(step))}, {"mem": torch.arange(step)}, {"step": step})
        assert v == step
    dense, shard, meta = mgr.load()
    assert torch.equal(dense["w"], torch.full((3,), 4.0))
    assert torch.equal(shard["mem"], torch.arange(4))
    assert meta == {"step": 4}
    kept = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("v"))
    assert kept == ["v000002", "v000004"]  # v2 kept as a snapshot, v4 committed
    assert mgr.load(version=2)[2] == {"step": 2}


def test_refuses_other_run_truncated_and_corrupt(tmp_path):
    ck = tmp_path / "ck"
    CheckpointManager(ck, run_meta={"partition": "abc"}).save({"w": torch.ones(100)}, {"m": torch.ones(100)})
    with pytest.raises(CheckpointError, match="run_meta\\['partition'\\]"):
        CheckpointManager(ck, run_meta={"partition": "xyz"}).load()
    shard = ck / "v000001" / "shard_0.pt"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        CheckpointManager(ck).load()
    corrupt = bytearray(data)
    corrupt[len(corrupt) // 2] ^= 0xFF
    shard.write_bytes(bytes(corrupt))
    with pytest.raises(CheckpointError, match="corrupt"):
        CheckpointManager(ck).load()
    (ck / "VERSION").unlink()
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        CheckpointManager(ck).load()


def test_other_world_size_refused(tmp_path):
    ck = tmp_path / "ck"
    CheckpointManager(ck).save({"w": 1}, {"m": 1})
    m = json.loads((ck / "v000001" / "manifest_0.json").read_text())
    m["world_size"] = 2
    (ck / "v000001" / "manifest_0.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="written by 2 ranks"):
        CheckpointManager(ck).load()


_CHILD = r"""
import sys, torch
from tgl_dist.checkpoint import CheckpointManager
mgr = CheckpointManager(sys.argv[1])
mgr.save({"w": torch.ones(4)}, {"mem": torch.arange(10)}, {"step": 1})
print("committed", flush=True)
mgr.save({"w": torch.zeros(4)}, {"mem": torch.zeros(60_000_000)}, {"step": 2})  # ~240 MB, killed meanwhile
print("second committed", flush=True)
"""


def test_sigkill_mid_write_keeps_previous_version(tmp_path):
    ck = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(ck)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "committed"
    deadline = time.monotonic() + 60
    while not (ck / "v000002").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    mgr = CheckpointManager(ck)
    assert mgr.committed_version() == 1
    dense, shard, meta = mgr.load()
    assert meta == {"step": 1} and torch.equal(shard["mem"], torch.arange(10))
    # the next save replaces the half-written folder and commits version 2
    assert mgr.save({"w": 2}, {"mem": torch.arange(3)}, {"step": 2}) == 2
    assert mgr.load()[2] == {"step": 2}


def _two_rank_ckpt(path):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init(use_gpu=False)
    mgr = CheckpointManager(path)
    mgr.save({"w": torch.ones(2)} if ctx.rank == 0 else None, {"mine": torch.full((2,), ctx.rank)})
    dense, shard, _ = CheckpointManager(path).load()
    return dense["w"].tolist(), shard["mine"].tolist()


@pytest.mark.distributed
def test_two_ranks_each_get_their_shard(tmp_path):
    out = run_distributed(_two_rank_ckpt, 2, str(tmp_path / "ck"))
    assert out == [([1.0, 1.0], [0, 0]), ([1.0, 1.0], [1, 1])]


def test_refuses_corrupt_manifest_and_missing_or_truncated_dense(tmp_path):
    ck = tmp_path / "ck"
    CheckpointManager(ck).save({"w": torch.ones(1000)}, {"m": torch.ones(10)}, {"step": 1})
    d = ck / "v000001"
    dense = (d / "dense.pt").read_bytes()
    (d / "dense.pt").write_bytes(dense[:-10])
    with pytest.raises(CheckpointError, match="dense.pt: truncated"):
        CheckpointManager(ck).load()
    (d / "dense.pt").unlink()
    with pytest.raises(CheckpointError, match="dense.pt: missing"):
        CheckpointManager(ck).load()
    (d / "dense.pt").write_bytes(dense)
    (d / "manifest_0.json").write_text('{"format_version": 1, "files": ')
    with pytest.raises(CheckpointError, match="manifest_0.json: corrupt manifest"):
        CheckpointManager(ck).load()
    (d / "manifest_0.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(CheckpointError, match="format_version 99 is not supported"):
        CheckpointManager(ck).load()
    (ck / "VERSION").write_text("garbage")
    with pytest.raises(CheckpointError, match="expected a version number"):
        CheckpointManager(ck).load()
