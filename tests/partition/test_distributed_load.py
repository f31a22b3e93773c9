"""``partition_load`` under 2 spawned ranks: each rank gets its own part (rank/world from the process group)."""
import pytest
import torch

from tgl_dist.partition import partition_graph
from tgl_dist.testing import run_distributed


def _load_worker(root: str):
    from tgl_dist.context import DistributedContext
    from tgl_dist.dist import all_gather_v
    from tgl_dist.partition import partition_load

    ctx = DistributedContext.init()
    p = partition_load(root, "metis_for_tgnn")          # rank and world size from the context
    # the parts are disjoint and cover everything: check it through a collective, too
    all_ids = all_gather_v(p.ids)
    all_eids = all_gather_v(p.eids)
    return {"rank": ctx.rank, "p_rank": p.rank, "num_parts": p.num_parts, "ids": p.ids,
            "eids": p.eids, "owner_ok": bool((p.book.to_owner(p.ids) == ctx.rank).all()),
            "all_ids": all_ids, "all_eids": all_eids}


@pytest.mark.distributed
def test_partition_load_two_ranks(toy_graph, tmp_path):
    path = partition_graph(toy_graph, 2, "metis_for_tgnn", tmp_path)
    out = run_distributed(_load_worker, 2, str(path.parent))
    owner = torch.load(path / "book.pt", weights_only=True)["node_owner"].long()
    for r, res in enumerate(out):
        assert res["rank"] == res["p_rank"] == r and res["num_parts"] == 2 and res["owner_ok"]
        assert torch.equal(res["ids"], torch.nonzero(owner == r).view(-1))
        assert torch.equal(res["eids"], torch.nonzero(owner[toy_graph.src] == r).view(-1))
        assert torch.equal(torch.sort(res["all_ids"]).values, torch.arange(toy_graph.num_nodes))
        assert torch.equal(torch.sort(res["all_eids"]).values, toy_graph.eid)
    assert not torch.equal(out[0]["ids"], out[1]["ids"])
