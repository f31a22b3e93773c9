"""Partitioning and loading in bounded memory: the chunked statistics and METIS input
equal the one-pass ones, parts are memory-mapped at load and edge_index is not copied."""
import os

import torch

from tgl_dist.data import generate_synthetic
from tgl_dist.partition import partition_graph, partition_load, partition_stats
from tgl_dist.partition.metis import aggregate_graph


def test_chunked_stats_and_aggregate_equal_one_pass():
    g = generate_synthetic(num_nodes=300, num_events=5000, seed=4)
    owner = torch.randint(0, 3, (g.num_nodes,), generator=torch.Generator().manual_seed(0))
    one = partition_stats(g.src, g.dst, owner, 3)
    assert partition_stats(g.src, g.dst, owner, 3, chunk=777) == one
    a, b = aggregate_graph(g), aggregate_graph(g, chunk=500)
    for k in ("xadj", "adjncy", "weight"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k
    assert int(a.xadj[-1]) == a.adjncy.numel() and bool((a.weight >= 1).all())


def test_parts_load_memory_mapped_and_edge_index_is_a_view(tmp_path):
    g = generate_synthetic(num_nodes=100, num_events=2000, edge_dim=3)
    partition_graph(g, 2, "hash", tmp_path)
    for r in range(2):
        p = partition_load(tmp_path / g.name, "hash", rank=r, world_size=2)
        ei = p.edge_index
        assert ei.shape == (2, p.num_local_events) and ei.is_contiguous()
        assert torch.equal(ei[0], g.src[p.eids]) and torch.equal(ei[1], g.dst[p.eids])
        assert torch.equal(p.edge_attr, g.edge_attr[p.eids])
        # one storage for both rows: the [2, e] tensor the writer saved, not a stacked copy
        assert ei.untyped_storage().data_ptr() == ei[1].untyped_storage().data_ptr()
        # the tensors map the part's files (torch.load(mmap=True)): the mapping is listed
        if os.path.exists("/proc/self/maps"):
            maps = open("/proc/self/maps").read()
            assert str(tmp_path / g.name / "hash_2" / f"part_{r}" / "events.pt") in maps
        ei[0, 0] += 1           # private mapping: writing copies the page, the file is kept
    again = partition_load(tmp_path / g.name, "hash", rank=0, world_size=2)
    assert torch.equal(again.edge_index[0], g.src[again.eids])
