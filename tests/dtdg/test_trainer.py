"""Splitter windows, world-size-free negatives, and the trainer: 2 ranks follow 1 rank's path."""
import pytest
import torch

from tgl_dist.context import DistributedContext
from tgl_dist.dtdg import DistGraph, Splitter, Trainer, build_model, build_task, get_graph
from tgl_dist.dtdg.tasks import hashed_nodes
from tgl_dist.testing import run_distributed

from dtdg_graphs import small_graph


def test_splitter_windows():
    sp = Splitter(20, hist_len=4, task="link_pred")
    assert sp.train[0] == {"hist_ts": [0, 1, 2, 3], "label_ts": 4}
    labels = [w["label_ts"] for w in sp.train + sp.dev + sp.test]
    assert labels == list(range(4, 20)) and len(sp.dev) >= 1 and len(sp.test) >= 1
    assert max(w["label_ts"] for w in sp.train) < min(w["label_ts"] for w in sp.dev)
    nr = Splitter(20, hist_len=4, task="node_regression")
    assert nr.train[0] == {"hist_ts": [0, 1, 2, 3], "label_ts": 3}
    # hist_len 1: the first window labels snapshot 1, so the baseline's previous value
    # (snapshot label_ts - 1) exists and is not the last, test-period snapshot
    assert Splitter(20, hist_len=1, task="node_regression").train[0] == {"hist_ts": [1],
                                                                          "label_ts": 1}
    empty = torch.ones(20, dtype=torch.long)
    empty[7] = 0
    assert 7 not in [w["label_ts"] for w in Splitter(20, 4, snapshot_edges=empty).train]
    with pytest.raises(ValueError, match="unknown task"):
        Splitter(20, task="classify")
    with pytest.raises(ValueError, match="lower hist_len"):
        Splitter(5, hist_len=4)


def test_negatives_are_a_pure_function():
    pos = torch.arange(50)
    a = hashed_nodes(3, "test", 7, -1, pos, 5, 1000)
    assert torch.equal(a, hashed_nodes(3, "test", 7, -1, pos, 5, 1000))
    assert torch.equal(a[10:20], hashed_nodes(3, "test", 7, -1, pos[10:20], 5, 1000))  # any subset
    assert not torch.equal(a, hashed_nodes(3, "test", 8, -1, pos, 5, 1000))
    assert not torch.equal(a, hashed_nodes(4, "test", 7, -1, pos, 5, 1000))
    assert int(a.min()) >= 0 and int(a.max()) < 1000 and a.unique().numel() > 200


def test_link_prediction_negatives_are_never_true_edges_or_the_source():
    # a dense graph: unfiltered, ~1 in 4 draws would be a true edge of the label snapshot
    g = small_graph(N=12, T=6, E=400, name="dense")
    graph = DistGraph.from_graph_data(g)
    task = build_task("link_pred", graph, 4, neg_eval=7)
    N = graph.num_nodes
    hits = 0
    for t in range(1, 6):
        s = graph.snapshot_slice(t)
        src = graph.all_ids[graph.edge_index[0, s]]
        dst = graph.owned_ids[graph.edge_index[1, s]]
        pos = graph.edge()["pos"][s]
        raw = hashed_nodes(task.seed, "test", t, -1, pos, 7, N)
        neg = task._negatives("test", t, -1, pos, 7, src, dst)
        assert torch.equal(neg, task._negatives("test", t, -1, pos, 7, src, dst))  # pure
        true = set((src * N + dst).tolist())
        q = (neg * N + dst.view(-1, 1)).view(-1).tolist()
        assert not any(x in true for x in q) and not bool((neg == src.view(-1, 1)).any())
        bad = torch.tensor([x in true for x in (raw * N + dst.view(-1, 1)).view(-1).tolist()])
        hits += int(bad.sum())
        keep = ~bad.view(raw.shape) & (raw != src.view(-1, 1))
        assert torch.equal(neg[keep], raw[keep])       # only the colliding draws change
    assert hits > 100                                  # the filter had work to do


def _empty_rank_worker():
    from tgl_dist.dtdg.partition import build_parts
    ctx = DistributedContext.init()
    parts = build_parts(_one_edge_graph(), torch.tensor([0, 1, 0, 1]))
    graph = DistGraph(parts[ctx.rank], ctx.get_default_group())
    torch.manual_seed(0)
    model = build_model({"model": "gcn", "hidden_dims": [4]}, graph)
    task = build_task("link_pred", graph, 4)
    return float(task(model, {"hist_ts": [0, 1], "label_ts": 2}, "train"))


def _one_edge_graph():
    from tgl_dist.dtdg import GraphData
    # 4 nodes, 3 snapshots; snapshot 2's only edge goes 1 -> 0, owned by rank 0 of 2
    g = GraphData(torch.tensor([[0, 1, 2, 3, 1], [1, 2, 3, 0, 0]]), 4)
    g.edge()["time"] = torch.tensor([0, 0, 1, 1, 2])
    g.node()["x"] = torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(0))
    g.meta().update(num_snapshots=3, name="one_edge")
    return g


def test_repeat_last_baseline_reads_the_previous_snapshot():
    # snapshot 1 holds 2 -> 3 and 3 -> 0; snapshot 2 (the label) holds only 1 -> 0
    task = build_task("link_pred", DistGraph.from_graph_data(_one_edge_graph()), 4)
    got = task._repeat_last(2, torch.tensor([1, 3, 2]), torch.tensor([0, 0, 3]))
    assert got.tolist() == [0.0, 1.0, 1.0]
    assert task._repeat_last(0, torch.tensor([1]), torch.tensor([0])).tolist() == [0.0]


@pytest.mark.distributed
def test_link_prediction_on_a_rank_without_label_edges():
    # rank 1 owns no destination of the label snapshot: it scores nothing (it once failed
    # on a reshape of 0 rows to [0, k, -1]) and the ranks' losses add up to 1 process's
    graph = DistGraph.from_graph_data(_one_edge_graph())
    torch.manual_seed(0)
    model = build_model({"model": "gcn", "hidden_dims": [4]}, graph)
    ref = float(build_task("link_pred", graph, 4)(model, {"hist_ts": [0, 1], "label_ts": 2}, "train"))
    r0, r1 = run_distributed(_empty_rank_worker, 2)
    assert r1 == 0.0 and abs(r0 + r1 - ref) < 1e-6


def _fit(graph, task):
    torch.manual_seed(0)
    model = build_model({"model": "evolvegcn-o", "hidden_dims": [8, 8]}, graph)
    t = build_task(task, graph, 8, **({"neg_eval": 5} if task == "link_pred" else {}))
    sp = Splitter.from_graph(graph, hist_len=3, task=task)
    calls = []
    out = Trainer(model, t, sp, lr=0.01, epochs=2, patience=5,
                  on_epoch_end=[lambda tr, e, rec: calls.append(e)]).fit()
    out["hook_calls"] = calls
    return out


def _fit_worker(path):
    DistributedContext.init()
    graph = get_graph(path)
    return {task: _fit(graph, task) for task in ("link_pred", "node_regression")}


@pytest.fixture(scope="module")
def fits(tmp_path_factory):
    g = small_graph(N=50, T=14, E=700, name="trainer")
    path = g.save_partition(tmp_path_factory.mktemp("trainer"), 2, "metis")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        graph = DistGraph.from_graph_data(g)
        ref = {task: _fit(graph, task) for task in ("link_pred", "node_regression")}
    finally:
        torch.set_num_threads(threads)
    return ref, run_distributed(_fit_worker, 2, str(path))


@pytest.mark.distributed
@pytest.mark.parametrize("task,keys", [("link_pred", ["test_ap", "test_auc", "test_mrr", "dev_ap"]),
                                       ("node_regression", ["test_mse", "dev_mse"])])
def test_two_ranks_train_like_one(fits, task, keys):
    ref_all, res_all = fits
    ref = ref_all[task]
    assert ref["hook_calls"] == [0, 1]
    for r in (res[task] for res in res_all):
        for k in keys + [k.replace("test", "baseline_test") for k in keys if k.startswith("test")]:
            assert abs(r[k] - ref[k]) < 1e-4, (k, r[k], ref[k])
        assert r["test_num"] == ref["test_num"] > 0


def test_build_model_by_name():
    graph = DistGraph.from_graph_data(small_graph())
    for name, cls in [("egcn_o", "EvolveGCNO"), ("EvolveGCN-H", "EvolveGCNH"), ("t-gcn", "TGCN"),
                      ("gcrn", "GConvGRU"), ("gcn", "GCN")]:
        m = build_model({"model": name, "hidden_dim": 6}, graph)
        assert type(m).__name__ == cls and m(range(3)).shape == (graph.num_owned, 6)
    with pytest.raises(ValueError, match=r"unknown DTDG model 'egcn'.*evolvegcn-o"):
        build_model({"model": "egcn"}, graph)
    with pytest.raises(ValueError, match="K in"):
        build_model({"model": "gconvgru", "K": 3}, graph)


def test_fit_ends_on_the_best_epochs_model():
    # the dev metric is made to fall after epoch 0, so epoch 0 is best: fit() must put its
    # weights back (and evaluate test with them), not keep the last epoch's
    graph = DistGraph.from_graph_data(small_graph(N=30, T=10, E=300, name="best"))
    torch.manual_seed(0)
    model = build_model({"model": "gcn", "hidden_dims": [6]}, graph)
    task = build_task("link_pred", graph, 6, neg_eval=3)
    seen = {}
    tr = Trainer(model, task, Splitter.from_graph(graph, hist_len=2), lr=0.05, epochs=3,
                 patience=5, on_epoch_end=[lambda t, e, rec: seen.__setitem__(
                     e, {k: v.clone() for k, v in t.model.state_dict().items()})])
    evaluate = tr.evaluate

    def falling_dev(split):
        out = evaluate(split)
        if split == "dev" and len(seen) < 3:     # during training: epoch 0 is the best
            out["dev_ap"] = 1.0 - 0.1 * tr.epoch
        return out
    tr.evaluate = falling_dev
    out = tr.fit()
    assert out["best_epoch"] == 0 and sorted(seen) == [0, 1, 2]
    final = model.state_dict()
    assert all(torch.equal(final[k], v) for k, v in seen[0].items())
    assert not all(torch.equal(final[k], v) for k, v in seen[2].items())
