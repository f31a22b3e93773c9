"""CheckpointManager on 2 gloo ranks whose checkpoint folders are private (rank r's own
path stands in for node r's own disk): each folder gets the replicated files and its
rank's shard, both ranks resume from their own, and a folder that lacks the committed
version stops both ranks naming it."""
import socket
from pathlib import Path

import pytest
import torch

from tgl_dist.testing import run_distributed


def _private(tmp):
    from tgl_dist import DistributedContext
    from tgl_dist.checkpoint import CheckpointError, CheckpointManager, RunCheckpoint
    ctx = DistributedContext.init(use_gpu=False)
    r = ctx.rank
    path = Path(tmp) / f"node{r}" / "ck"
    mgr = CheckpointManager(path, run_meta={"partition": "abc"})
    assert mgr.writers == [0, 1] and mgr.private
    dense = {"w": torch.arange(4.0)} if r == 0 else None      # rank 0's only, as the trainers
    mgr.save(dense, {"mine": torch.full((2,), r)}, {"epoch": 1, "step": 0})
    mgr.save(dense, {"mine": torch.full((2,), 10 + r)}, {"epoch": 2, "step": 0})
    out = {"files": sorted(p.name for p in (path / "v000002").iterdir()),
           "kept": sorted(p.name for p in path.iterdir()),
           "replicas": [(path / "v000002" / f).read_bytes() for f in ("dense.pt", "manifest_0.json")]}
    ck = RunCheckpoint(path, "1e", run_meta={"partition": "abc"}, resume=True)
    d, s, meta = ck.load()
    out["loaded"] = (d["w"].tolist(), s["mine"].tolist(), meta)
    # node 1's copy is gone: both ranks stop at once, naming it
    ctx.barrier()
    if r == 1:
        import shutil
        shutil.rmtree(path)
    try:
        RunCheckpoint(path, "1e", run_meta={"partition": "abc"}, resume=True).load()
    except CheckpointError as e:
        out["error"] = str(e)
    ctx.shutdown()
    return out


@pytest.mark.distributed
def test_private_checkpoint_folders_resume_per_node(tmp_path):
    o0, o1 = run_distributed(_private, 2, str(tmp_path))
    assert o0["files"] == ["dense.pt", "manifest_0.json", "shard_0.pt"]
    assert o1["files"] == ["dense.pt", "manifest_0.json", "manifest_1.json", "shard_1.pt"]
    assert o0["kept"] == o1["kept"] == ["VERSION", "v000002"]        # each node pruned its own
    assert o0["replicas"] == o1["replicas"]          # rank 0's bytes on node 1
    assert o0["loaded"] == ([0.0, 1.0, 2.0, 3.0], [10, 10], {"epoch": 2, "step": 0})
    assert o1["loaded"] == ([0.0, 1.0, 2.0, 3.0], [11, 11], {"epoch": 2, "step": 0})
    for o in (o0, o1):
        assert "the ranks do not see the same committed checkpoint" in o["error"], o["error"]
        assert f"rank 0 on host {socket.gethostname()}: version 2 in " \
               f"{tmp_path / 'node0' / 'ck' / 'VERSION'}" in o["error"], o["error"]
        assert f"rank 1 on host {socket.gethostname()}: nothing committed in " \
               f"{tmp_path / 'node1' / 'ck' / 'VERSION'}" in o["error"], o["error"]
