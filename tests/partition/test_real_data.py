"""Structural partitioners on real streams (read with ``load_dataset``): cut and balance."""
import pytest

from tgl_dist.data import load_dataset
from tgl_dist.partition import get_partitioner, partition_stats


@pytest.fixture(scope="module", params=["wikipedia", "facebook-wall"])
def real_graph(request, datasets_root):
    return load_dataset(request.param, root=datasets_root, download=False)


def test_counts(real_graph):
    expected = {"wikipedia": (9227, 157474), "facebook-wall": (46952, 876993)}[real_graph.name]
    assert (real_graph.num_nodes, real_graph.num_events) == expected


@pytest.mark.parametrize("P", [2, 4])
def test_metis_cuts_3x_fewer_events_than_random(real_graph, P):
    g = real_graph
    cut = {a: partition_stats(g.src, g.dst, get_partitioner(a)(g, P, 0), P)
           for a in ("random", "metis", "metis_for_tgnn")}
    assert cut["random"]["edge_cut"] > 0.4
    for algo in ("metis", "metis_for_tgnn"):
        assert 3 * cut[algo]["edge_cut"] <= cut["random"]["edge_cut"], (algo, cut[algo]["edge_cut"])
    # metis balances nodes only; metis_for_tgnn balances nodes AND owned events
    assert cut["metis"]["balance_nodes"] <= 1.05
    assert cut["metis_for_tgnn"]["balance_nodes"] <= 1.05
    assert cut["metis_for_tgnn"]["balance_events"] <= 1.05
    assert cut["metis_for_tgnn"]["replication"] < cut["random"]["replication"]
