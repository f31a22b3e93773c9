"""Loader start positions (set_epoch(epoch, start_step)) and run_epoch's step hook / resume."""
import pytest
import torch

from tgl_dist.data import load_dataset
from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
from tgl_dist.loader import DistributedDataLoader
from tgl_dist.partition import partition_graph, partition_load
from tgl_dist.sampling import NegativeSampling, NeighborSampler


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    g = load_dataset("synthetic", num_nodes=50, num_events=900)
    root = tmp_path_factory.mktemp("parts")
    partition_graph(g, 1, "hash", root)
    pdata = partition_load(root / g.name, "hash")
    return pdata, DistributedGraphStore(pdata)


def _loader(pdata, store, policy, strategy, queue_size):
    sampler = NeighborSampler(store.num_nodes, 2, [4, 3], TemporalNeighborSampleGraph(pdata, "full"),
                              policy=policy, seed=3)
    return DistributedDataLoader(store, "train", sampler,
                                 neg_sampler=NegativeSampling("triplet", strategy, 2, seed=3),
                                 batch_size=64, chunk_size=16, seed=3, queue_size=queue_size)


def _key(step):
    roots, mfgs, meta, _ = step
    return [roots.nodes, roots.ts, roots.eids] + [t for b in mfgs for t in
                                                   (b.srcdata["ID"], b.edata["ID"], b.edge_index)]


@pytest.mark.parametrize("policy,strategy,queue_size", [("uniform", "random", 0),
                                                         ("recent", "historical", 2)])
def test_start_step_skips_without_changing_later_steps(graph, policy, strategy, queue_size):
    pdata, store = graph
    ld = _loader(pdata, store, policy, strategy, queue_size)
    ld.set_epoch(2)
    full = [_key(s) for s in ld]
    assert len(full) > 5
    ld.set_epoch(2, start_step=4)
    assert ld.position == (2, 4)
    part = [_key(s) for s in ld]
    assert len(part) == len(full) - 4
    for a, b in zip(full[4:], part):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert ld.position == (3, 0)  # the start step applies to one iteration only
    with pytest.raises(ValueError, match="start_step"):
        ld.set_epoch(0, -1)


def test_run_epoch_hook_and_resume_give_the_same_accumulators():
    from tgl_dist.ctdg.training import run_epoch

    class Out(tuple):
        pass

    def model(mfgs, meta):
        return Out((mfgs * torch.ones(3), mfgs * torch.zeros(3)))

    model.train = lambda flag: None
    seen = []
    res = run_epoch(model, [(None, float(i), {}, 0.0) for i in range(5)],
                    on_step=lambda acc: seen.append(dict(acc)))
    assert [a["steps"] for a in seen] == [1, 2, 3, 4, 5]
    res2 = run_epoch(model, [(None, float(i), {}, 0.0) for i in range(3, 5)], resume=seen[2])
    assert res2["loss"] == res["loss"] and res2["events"] == res["events"] == 15
