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
    for epoch in range(1, 5):  # end-of-epoch checkpoints: meta (epoch, 0) = epochs done
        v = mgr.save({"w": torch.full((3,), float(epoch))}, {"mem": torch.arange(epoch)},
                     {"epoch": epoch, "step": 0})
        assert v == epoch
    dense, shard, meta = mgr.load()
    assert torch.equal(dense["w"], torch.full((3,), 4.0))
    assert torch.equal(shard["mem"], torch.arange(4))
    assert meta == {"epoch": 4, "step": 0}
    kept = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("v"))
    assert kept == ["v000002", "v000004"]  # epoch 2 kept as a snapshot, v4 committed
    assert mgr.load(version=2)[2] == {"epoch": 2, "step": 0}


def _kept(ck):
    return sorted(int(p.name[1:]) for p in ck.iterdir() if p.name.startswith("v"))


def test_snapshots_are_chosen_by_epoch_not_version(tmp_path):
    """keep_every=N keeps, per boundary of N, 2N... epochs, the last version at or before it."""
    ck = tmp_path / "ck"
    # step checkpoints every 2 steps of 5-step epochs, then the final end-of-epoch one;
    # (e, 5) is the position after an epoch's last step (the examples' step hooks)
    positions = [(0, 2), (0, 4), (1, 1), (1, 3), (1, 5), (2, 2), (2, 4), (3, 1), (3, 3),
                 (3, 5), (4, 2), (4, 4), (5, 0)]
    mgr = CheckpointManager(ck, keep_every=2)
    for i, (epoch, step) in enumerate(positions, 1):
        if i == 7:  # a resumed run: a new manager on the same folder decides the same
            mgr = CheckpointManager(ck, keep_every=2)
        assert mgr.save({"w": i}, {"m": i}, {"epoch": epoch, "step": step, "done": False}) == i
    # v5 = (1, 5): last before 2 epochs; v10 = (3, 5): last before 4; v13 committed.
    # Every 2nd *version* (v2, v4, v6...) is not what is kept.
    assert _kept(ck) == [5, 10, 13]
    assert mgr.load(version=5)[2]["epoch"] == 1 and mgr.load(version=10)[2]["step"] == 5
    assert mgr.load()[2] == {"epoch": 5, "step": 0, "done": False}

    # end-of-epoch checkpoints among step ones: the boundary checkpoint itself is kept
    ck2 = tmp_path / "ck2"
    mgr = CheckpointManager(ck2, keep_every=3)
    for epoch, step in [(1, 0), (2, 0), (2, 3), (3, 0), (3, 2), (4, 0), (5, 0), (6, 0), (7, 0)]:
        mgr.save(None, {}, {"epoch": epoch, "step": step})
    assert _kept(ck2) == [4, 8, 9]  # (3, 0) and (6, 0); (2, 3) before (3, 0) is not kept

    # versions without an epoch in meta are never snapshots; keep_every=0 drops snapshots
    ck3 = tmp_path / "ck3"
    mgr = CheckpointManager(ck3, keep_every=1)
    for step in range(1, 4):
        mgr.save(None, {}, {"step": step})
    assert _kept(ck3) == [3]
    CheckpointManager(ck2, keep_every=0).save(None, {}, {"epoch": 8, "step": 0})
    assert _kept(ck2) == [10]


def test_refuses_other_run_truncated_and_corrupt(tmp_path):
    ck = tmp_path / "ck"
    CheckpointManager(ck, run_meta={"partition": "abc"}).save({"w": torch.ones(100)}, {"m": torch.ones(100)})
    with pytest.raises(CheckpointError, match="run_meta\\['partition'\\]"):
        CheckpointManager(ck, run_meta={"partition": "xyz"}).load()
    # a key on one side only is another run too (a loop passing fewer keys, or more)
    with pytest.raises(CheckpointError, match="run_meta\\['partition'\\]: this run has no"):
        CheckpointManager(ck).load()
    with pytest.raises(CheckpointError, match="run_meta\\['config'\\]: the checkpoint has no"):
        CheckpointManager(ck, run_meta={"partition": "abc", "config": {"lr": 0.1}}).load()
    shard = ck / "v000001" / "shard_0.pt"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        CheckpointManager(ck, run_meta={"partition": "abc"}).load()
    corrupt = bytearray(data)
    corrupt[len(corrupt) // 2] ^= 0xFF
    shard.write_bytes(bytes(corrupt))
    with pytest.raises(CheckpointError, match="corrupt"):
        CheckpointManager(ck, run_meta={"partition": "abc"}).load()
    (ck / "VERSION").unlink()
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        CheckpointManager(ck, run_meta={"partition": "abc"}).load()


def test_other_world_size_refused(tmp_path):
    ck = tmp_path / "ck"
    CheckpointManager(ck).save({"w": 1}, {"m": 1})
    m = json.loads((ck / "v000001" / "manifest_0.json").read_text())
    m["world_size"] = 2
    (ck / "v000001" / "manifest_0.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="written by 2 ranks"):
        CheckpointManager(ck).load()
    # rank 1 of a 2-rank run resuming a 1-rank checkpoint: the same reason (there is no
    # manifest_1.json, and that is not what to tell the user)
    m["world_size"] = 1
    (ck / "v000001" / "manifest_0.json").write_text(json.dumps(m))
    two = CheckpointManager(ck)
    two.rank, two.world_size = 1, 2
    with pytest.raises(CheckpointError, match="written by 1 ranks, this run has 2"):
        two.load()


# The writer: commits version 1, then writes version 2 with a 32 MB shard through a slow
# disk (each write lands in 512 KiB pieces, 20 ms apart: ~1.3 s for the shard), so the
# parent can SIGKILL it while the shard's temporary file is half written. The manager's
# code is unchanged; only its module-level ``open`` is wrapped.
_CHILD = r"""
import builtins, sys, time, torch
import tgl_dist.checkpoint.manager as M

class SlowFile:
    def __init__(self, f):
        self.f = f
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.f.close()
    def write(self, data):
        mv = memoryview(data)
        for i in range(0, len(mv), 1 << 19):
            self.f.write(mv[i:i + (1 << 19)])
            self.f.flush()
            time.sleep(0.02)
        return len(mv)
    def __getattr__(self, name):
        return getattr(self.f, name)

M.open = lambda path, mode="r", *a, **k: SlowFile(builtins.open(path, mode, *a, **k))
mgr = M.CheckpointManager(sys.argv[1])
mgr.save({"w": torch.ones(4)}, {"mem": torch.arange(10)}, {"step": 1})
mgr.save({"w": torch.zeros(4)}, {"mem": torch.zeros(8_000_000)}, {"step": 2})  # killed meanwhile
"""
_PAYLOAD = 8_000_000 * 4  # bytes of the shard's tensor alone: a complete shard file is larger


def test_sigkill_mid_write_keeps_previous_version(tmp_path):
    ck = tmp_path / "ck"
    err = open(tmp_path / "child.err", "w+")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(ck)], stdout=subprocess.DEVNULL,
                            stderr=err)
    tmp = ck / "v000002" / f".shard_0.pt.tmp-{proc.pid}"   # _atomic_write_bytes' temporary name
    try:
        deadline = time.monotonic() + 15
        while not (tmp.is_file() and tmp.stat().st_size > 0):
            err.seek(0)
            assert proc.poll() is None, f"writer exited early: {err.read()[-2000:]}"
            assert time.monotonic() < deadline, "timed out waiting for the shard write to start"
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)                   # in the middle of writing the shard
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        err.close()
    # the shard was half written and never renamed; version 2 has no manifest
    assert 0 < tmp.stat().st_size < _PAYLOAD
    assert not (ck / "v000002" / "shard_0.pt").exists()
    assert not (ck / "v000002" / "manifest_0.json").exists()
    mgr = CheckpointManager(ck)
    assert mgr.committed_version() == 1
    dense, shard, meta = mgr.load()
    assert meta == {"step": 1} and torch.equal(shard["mem"], torch.arange(10))
    with pytest.raises(CheckpointError, match="manifest_0.json: missing"):
        mgr.load(version=2)                                  # the half-written version is refused
    # the next save replaces the half-written folder (debris removed) and commits version 2
    assert mgr.save({"w": 2}, {"mem": torch.arange(3)}, {"step": 2}) == 2
    assert sorted(p.name for p in (ck / "v000002").iterdir()) == [
        "dense.pt", "manifest_0.json", "shard_0.pt"]
    assert mgr.load()[2] == {"step": 2} and torch.equal(mgr.load()[1]["mem"], torch.arange(3))
    assert _kept(ck) == [2]


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
    # one flipped top bit (bit rot, a bad copy): not UTF-8, still a CheckpointError
    (d / "manifest_0.json").write_bytes(b'{"format_version": \xb1}')
    with pytest.raises(CheckpointError, match="manifest_0.json: corrupt manifest .byte 19 is not UTF-8"):
        CheckpointManager(ck).load()
    for text in (b"garbage", b"\xb1", "\u0661".encode()):   # the last: an Arabic-Indic digit
        (ck / "VERSION").write_bytes(text)
        with pytest.raises(CheckpointError, match="VERSION: expected a version number"):
            CheckpointManager(ck).load()


@pytest.mark.parametrize("field", ["world_size", "files", "run_meta", "meta"])
def test_hand_edited_manifest_without_a_field_names_it(tmp_path, field):
    ck = tmp_path / "ck"
    CheckpointManager(ck).save({"w": torch.ones(3)}, {"m": torch.ones(2)}, {"epoch": 1})
    mpath = ck / "v000001" / "manifest_0.json"
    m = json.loads(mpath.read_text())
    del m[field]
    mpath.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=f"manifest_0.json: corrupt manifest "
                                              f"\\(missing field '{field}'\\)"):
        CheckpointManager(ck).load()
    m[field] = "two"
    mpath.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=f"field '{field}': expected an"):
        CheckpointManager(ck).load()


def test_hand_edited_files_entry_and_unreadable_file(tmp_path):
    from tgl_dist.integrity import sha256_file
    ck = tmp_path / "ck"
    CheckpointManager(ck).save({"w": torch.ones(3)}, {"m": torch.ones(2)}, {"epoch": 1})
    mpath = ck / "v000001" / "manifest_0.json"
    m = json.loads(mpath.read_text())
    good = dict(m["files"]["dense.pt"])
    del m["files"]["dense.pt"]["sha256"]
    mpath.write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=r"field 'files.dense.pt': expected"):
        CheckpointManager(ck).load()
    dense = ck / "v000001" / "dense.pt"
    for content in (b"\0" * 512, dense.read_bytes()[:200]):   # zero-filled, truncated
        dense.write_bytes(content)
        m["files"]["dense.pt"] = {"sha256": sha256_file(dense), "bytes": len(content)}
        mpath.write_text(json.dumps(m))
        with pytest.raises(CheckpointError, match="dense.pt: corrupt or truncated") as e:
            CheckpointManager(ck).load()
        assert "trusted" not in str(e.value)
    assert good["bytes"] > 200


def test_a_checkpoint_path_that_is_a_file_is_a_checkpoint_error(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(CheckpointError, match="afile: exists and is not a folder"):
        CheckpointManager(f)
    with pytest.raises(CheckpointError, match="cannot create the checkpoint folder"):
        CheckpointManager(f / "ck")


def test_versions_without_version_file_are_refused_not_replaced(tmp_path):
    """A copy that lost VERSION is not 'nothing committed': no silent restart that would
    prune the copied versions. A lone v000001 (a crash before the first commit) still is."""
    ck = tmp_path / "ck"
    m = CheckpointManager(ck, keep_every=1)
    for epoch in range(3):
        m.save({"w": torch.full((3,), float(epoch))}, {"m": torch.ones(2)}, {"epoch": epoch + 1})
    (ck / "VERSION").unlink()
    kept = sorted(p.name for p in ck.iterdir())
    for call in (lambda: CheckpointManager(ck).load(), lambda: CheckpointManager(ck).save({}, {})):
        with pytest.raises(CheckpointError, match=r"VERSION: missing, but the folder holds "
                                                  r"v000002, v000003 .*\(e.g. 3\)"):
            call()
    assert sorted(p.name for p in ck.iterdir()) == kept
    (ck / "VERSION").write_text("3")
    assert torch.equal(CheckpointManager(ck).load()[0]["w"], torch.full((3,), 2.0))
    lone = tmp_path / "lone"
    CheckpointManager(lone).save({"w": torch.ones(1)}, {}, {"epoch": 1})
    (lone / "VERSION").unlink()
    assert CheckpointManager(lone).committed_version() is None


def test_a_full_disk_is_a_checkpoint_error_and_keeps_the_committed_version(tmp_path, monkeypatch):
    import errno
    ck = tmp_path / "ck"
    CheckpointManager(ck).save({"w": torch.ones(3)}, {"m": torch.ones(2)}, {"step": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointError, match=r"v000002/dense.pt: cannot be written \(No space "
                                              r"left on device\); the previously committed"):
        CheckpointManager(ck).save({"w": torch.zeros(3)}, {"m": torch.zeros(2)}, {"step": 2})
    monkeypatch.undo()
    assert not [p for p in (ck / "v000002").iterdir() if p.name.startswith(".")]
    dense, _, meta = CheckpointManager(ck).load()
    assert torch.equal(dense["w"], torch.ones(3)) and meta == {"step": 1}


def test_a_crash_before_the_commit_keeps_the_committed_version_loadable(tmp_path, monkeypatch):
    # version 2 is written in full but the process dies while writing VERSION: nothing
    # may have been pruned yet, so version 1 (the committed one) still loads
    import tgl_dist.checkpoint.manager as M
    ck = tmp_path / "ck"
    CheckpointManager(ck).save({"w": torch.ones(3)}, {"m": torch.ones(2)}, {"epoch": 1})
    write = M._atomic_write_bytes

    def crash_on_commit(path, data):
        if path.name == "VERSION":
            raise KeyboardInterrupt("killed while committing")
        write(path, data)
    monkeypatch.setattr(M, "_atomic_write_bytes", crash_on_commit)
    with pytest.raises(KeyboardInterrupt):
        CheckpointManager(ck).save({"w": torch.zeros(3)}, {"m": torch.zeros(2)}, {"epoch": 2})
    monkeypatch.undo()
    dense, shard, meta = CheckpointManager(ck).load()
    assert torch.equal(dense["w"], torch.ones(3)) and meta == {"epoch": 1}
    assert torch.equal(shard["m"], torch.ones(2))
