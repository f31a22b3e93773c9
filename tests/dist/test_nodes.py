"""tgl_dist.dist.nodes and replicate_partition on 3 gloo ranks: a folder each rank sees as
shared (one path) or private (rank r's own path stands in for node r's own disk)."""
import json
import os
from pathlib import Path

import pytest
import torch

from tgl_dist.testing import run_distributed


def _nodes(tmp):
    import tgl_dist.dist.nodes as nodes
    from tgl_dist import DistributedContext
    from tgl_dist.data.synthetic import generate_synthetic
    from tgl_dist.errors import PartitionError, TGLDistError
    from tgl_dist.partition import partition_graph
    from tgl_dist.partition.replicate import replicate_partition
    ctx = DistributedContext.init(use_gpu=False)
    r, tmp = ctx.rank, Path(tmp)
    out = {"shared": nodes.folder_writers(tmp / "shared"),
           # ranks 1 and 2 do not see rank 0's folder and share one node: rank 1 writes
           "one_node": nodes.folder_writers(tmp / f"own{r}")}
    os.environ["GROUP_RANK"] = str(r)         # from here on each rank plays a node of its own
    out["private"] = nodes.folder_writers(tmp / f"own{r}")
    assert not list((tmp / "shared").iterdir()), "the probe file stayed"
    # copy_folder in pieces smaller than the files (nested, empty and 3-piece files)
    nodes.CHUNK = 5
    src = tmp / "src"
    if r == 0:
        (src / "a" / "b").mkdir(parents=True)
        (src / "a" / "b" / "x.bin").write_bytes(bytes(range(13)))
        (src / "empty").write_bytes(b"")
    nodes.copy_folder(src, tmp / f"dest{r}", receive=r == 1)   # rank 2 is left out
    out["dest"] = (tmp / f"dest{r}").exists()
    if r == 1:
        out["copied"] = sorted(str(p.relative_to(tmp / "dest1"))
                               for p in (tmp / "dest1").rglob("*") if p.is_file())
        assert (tmp / "dest1" / "a" / "b" / "x.bin").read_bytes() == bytes(range(13))
    # a receiver that cannot write: every rank gets the error naming rank 1 and the path
    (tmp / "blocker").write_text("a file, not a folder")
    try:
        nodes.copy_folder(src, tmp / "blocker" / "dest", receive=r == 1)
    except TGLDistError as e:
        out["copy_error"] = str(e)
    # rank 0 cannot write its probe: nothing known, the ranks are grouped by node
    out["no_probe"] = nodes.folder_writers(tmp / "blocker" / "x")
    nodes.CHUNK = 16 << 20
    # replicate_partition: rank 1's own --parts gets rank 0's partition, then is left alone
    g = generate_synthetic(num_nodes=40, num_events=400, seed=0, progress=False)
    g.split()
    part = tmp / f"parts{r}" / g.name / "hash_3"
    if r == 0:
        partition_graph(g, 3, "hash", tmp / "parts0")
    replicate_partition(part)
    out["manifest"] = (part / "manifest.json").read_bytes()
    before = (part / "book.pt").stat().st_mtime_ns
    replicate_partition(part)
    out["rewritten"] = (part / "book.pt").stat().st_mtime_ns != before
    # a stale partition on rank 1's node (another seed) is replaced by rank 0's
    if r == 1:
        partition_graph(g, 3, "hash", tmp / "parts1", force=True, seed=3)
    replicate_partition(part)
    out["after_stale"] = (part / "manifest.json").read_bytes()
    try:
        replicate_partition(tmp / "blocker" / g.name / "hash_3" if r == 1 else part)
    except PartitionError as e:
        out["replicate_error"] = str(e)
    ctx.shutdown()
    return out


@pytest.mark.distributed
def test_folder_writers_copy_and_replicate_partition(tmp_path):
    o0, o1, o2 = run_distributed(_nodes, 3, str(tmp_path))
    assert o0["shared"] == o1["shared"] == o2["shared"] == [0, 0, 0]
    assert o0["one_node"] == o1["one_node"] == o2["one_node"] == [0, 1, 1]
    assert o0["private"] == o1["private"] == o2["private"] == [0, 1, 2]
    assert o1["copied"] == ["a/b/x.bin", "empty"]
    assert (o0["dest"], o1["dest"], o2["dest"]) == (False, True, False)
    assert o0["no_probe"] == o1["no_probe"] == o2["no_probe"] == [0, 1, 2]
    for o in (o0, o1, o2):
        assert o["copy_error"].startswith("rank 1 on host "), o["copy_error"]
        assert "(node 1)" in o["copy_error"]
        assert f"{tmp_path / 'blocker' / 'dest'}: cannot be written" in o["copy_error"]
        assert "rank 1 on host " in o["replicate_error"]
        assert str(tmp_path / "blocker") in o["replicate_error"]
    assert o0["manifest"] == o1["manifest"] == o2["manifest"] == o1["after_stale"]
    assert json.loads(o0["manifest"])["seed"] == 0
    assert not o1["rewritten"]
