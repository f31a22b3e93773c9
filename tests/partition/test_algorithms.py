"""Partitioning algorithms: ownership invariants, exact values on tiny streams, statistics."""
import pytest
import torch

from tgl_dist.data import TemporalGraph
from tgl_dist.partition import (PARTITIONERS, available_partitioners, get_partitioner,
                                partition_graph, partition_stats)
from tgl_dist.partition.metis import aggregate_graph
from tgl_dist.partition.metis_for_tgnn import tgnn_vertex_weights

ALGOS = ["random", "hash", "metis", "metis_for_tgnn"]


def test_registry_lists_all_algorithms():
    assert available_partitioners() == sorted(ALGOS)
    assert set(PARTITIONERS) == set(ALGOS)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("P", [1, 2, 3])
def test_every_node_has_one_owner(algo, P, toy_graph):
    owner = get_partitioner(algo)(toy_graph, P, 0)
    assert owner.shape == (toy_graph.num_nodes,) and owner.dtype == torch.long
    assert int(owner.min()) >= 0 and int(owner.max()) < P
    if P > 1:  # every part gets nodes, including the isolated ones somewhere
        assert torch.bincount(owner, minlength=P).min() > 0
    assert torch.equal(owner, get_partitioner(algo)(toy_graph, P, 0))  # deterministic


def test_random_is_seeded_and_balanced(toy_graph):
    a, b = (get_partitioner("random")(toy_graph, 3, s) for s in (0, 1))
    assert not torch.equal(a, b)
    counts = torch.bincount(a, minlength=3)
    assert int(counts.max() - counts.min()) <= 1


def test_hash_is_id_mod_p(toy_graph):
    assert torch.equal(get_partitioner("hash")(toy_graph, 3, 0), torch.arange(toy_graph.num_nodes) % 3)


def test_unknown_algorithm_lists_known_names(toy_graph, tmp_path):
    with pytest.raises(ValueError, match="unknown partitioning algorithm 'kahip'.*hash.*metis.*random"):
        get_partitioner("kahip")
    with pytest.raises(ValueError, match="known: hash, metis, metis_for_tgnn, random"):
        partition_graph(toy_graph, 2, "round_robin", tmp_path)
    assert not any(tmp_path.iterdir())


def test_aggregate_graph_merges_duplicates_and_drops_self_loops():
    # events: 0-1 twice (both directions), 1-2 once, self-loop 2-2, node 3 isolated
    g = TemporalGraph([0, 1, 1, 2], [1, 0, 2, 2], [1.0, 2.0, 3.0, 4.0], num_nodes=4)
    agg = aggregate_graph(g)
    assert agg.xadj.tolist() == [0, 1, 3, 4, 4]
    assert agg.adjncy.tolist() == [1, 0, 2, 1]
    assert agg.weight.tolist() == [2, 2, 1, 1]
    assert tgnn_vertex_weights(g).tolist() == [[1, 1], [1, 2], [1, 1], [1, 0]]


@pytest.mark.parametrize("algo", ["metis", "metis_for_tgnn"])
def test_metis_cuts_the_single_bridge(algo):
    # two 5-cliques of repeated interactions joined by a single event
    a = torch.combinations(torch.arange(5), 2)
    pairs = torch.cat([torch.cat([a, a + 5]).repeat(3, 1), torch.tensor([[4, 5]])])
    src, dst = pairs[:, 0], pairs[:, 1]
    g = TemporalGraph(src, dst, torch.arange(src.numel(), dtype=torch.float64))
    owner = get_partitioner(algo)(g, 2, 0)
    assert owner[:5].unique().numel() == 1 and owner[5:].unique().numel() == 1
    assert int(owner[0]) != int(owner[5])
    stats = partition_stats(g.src, g.dst, owner, 2)
    assert stats["edge_cut"] == pytest.approx(1 / g.num_events, abs=1e-6)


def test_stats_exact_values():
    # owner: nodes 0,1 -> part 0; nodes 2,3 -> part 1
    owner = torch.tensor([0, 0, 1, 1])
    src = torch.tensor([0, 0, 1, 2, 3])
    dst = torch.tensor([1, 2, 3, 3, 3])
    s = partition_stats(src, dst, owner, 2)
    assert s["nodes_per_part"] == [2, 2]
    assert s["events_per_part"] == [3, 2]          # owned by the source's owner
    assert s["halo_per_part"] == [2, 2]            # part 0 needs 2,3; part 1 needs 0,1
    assert s["edge_cut"] == pytest.approx(2 / 5)
    assert s["balance_nodes"] == pytest.approx(1.0)
    assert s["balance_events"] == pytest.approx(3 / 2.5)
    assert s["replication"] == pytest.approx((4 + 4) / 4)


def test_metis_for_tgnn_balances_events_and_nodes(make_graph):
    # a heavy-tailed stream: node 0..3 are hubs sending most events
    g0 = make_graph(num_nodes=400, num_events=6000, seed=3, isolated=10)
    src = g0.src.clone()
    hub = torch.rand(src.numel(), generator=torch.Generator().manual_seed(0)) < 0.4
    src[hub] = src[hub] % 4
    g = TemporalGraph(src, g0.dst, g0.t, num_nodes=g0.num_nodes)
    s = partition_stats(g.src, g.dst, get_partitioner("metis_for_tgnn")(g, 4, 0), 4)
    assert s["balance_events"] < 1.1 and s["balance_nodes"] < 1.1
    plain = partition_stats(g.src, g.dst, get_partitioner("metis")(g, 4, 0), 4)
    assert plain["balance_nodes"] < 1.1 and plain["balance_events"] > 1.3   # hubs land together


def test_register_custom_partitioner(toy_graph, tmp_path):
    from tgl_dist.partition import register_partitioner
    from tgl_dist.partition.registry import PARTITIONERS

    def first_half(graph, num_parts, seed=0):
        return (torch.arange(graph.num_nodes) >= graph.num_nodes // 2).long()

    with pytest.raises(ValueError, match="already registered"):
        register_partitioner("hash", first_half)
    with pytest.raises(ValueError, match="folder name"):
        register_partitioner("../evil", first_half)
    register_partitioner("halves", first_half)
    try:
        path = partition_graph(toy_graph, 2, "halves", tmp_path)
        assert path.name == "halves_2"
    finally:
        del PARTITIONERS["halves"]


def test_bad_owner_from_custom_partitioner(toy_graph, tmp_path):
    from tgl_dist.partition import register_partitioner
    from tgl_dist.partition.registry import PARTITIONERS

    register_partitioner("broken", lambda g, P, seed=0: torch.full((g.num_nodes,), P))
    try:
        with pytest.raises(ValueError, match="owners outside"):
            partition_graph(toy_graph, 2, "broken", tmp_path)
    finally:
        del PARTITIONERS["broken"]
