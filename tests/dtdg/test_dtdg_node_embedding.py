"""DTDG models with ``node_embedding=D``: a learnable per-node input sharded like the graph.

2 ranks follow 1 process (table, dense parameters, metrics) within 1e-5; featureless
graphs train; the first-layer cache of Â x is not used for the learnable input.
"""
import numpy as np
import pytest
import torch

from tgl_dist.context import DistributedContext
from tgl_dist.dtdg import DistGraph, Splitter, Trainer, build_model, build_task, get_graph
from tgl_dist.optim import TrainOptimizer
from tgl_dist.nn import DistEmbedding
from tgl_dist.optim import SparseOptimizer
from tgl_dist.testing import run_distributed

from dtdg_graphs import small_graph

MODELS = ["gcn", "evolvegcn-o", "tgcn"]


class SparseSGD(SparseOptimizer):
    """w -= lr * g on the touched rows: not scale-invariant (unlike Adam), so a wrong
    reduction of the ranks' gradient rows (mean instead of sum) would show."""

    def init_state(self, emb):
        return {}

    def update(self, emb, rows, grad, state):
        emb.weight.index_add_(0, rows, grad, alpha=-self.lr)


def _featureless(name="noemb"):
    g = small_graph(N=50, T=10, E=600, name=name)
    del g.node()["x"]
    return g


def test_build_dims_and_sharding():
    g = small_graph(N=30, T=6, F=3)
    graph = DistGraph.from_graph_data(g)
    m = build_model({"model": "gcn", "hidden_dims": [6], "node_embedding": 4}, graph)
    assert isinstance(m.node_embedding, DistEmbedding) and m.node_embedding.grad_reduction == "sum"
    assert m.convs[0].in_dim == 3 + 4
    assert torch.equal(m.node_embedding.owned_ids, graph.owned_ids)
    plain = build_model({"model": "gcn", "hidden_dims": [6]}, graph)
    assert plain.node_embedding is None and "node_embedding.weight" not in plain.state_dict()
    assert "node_embedding.weight" in m.state_dict()
    fl = DistGraph.from_graph_data(_featureless())
    with pytest.raises(ValueError, match="node_embedding=D"):
        build_model({"model": "gcn"}, fl)
    m2 = build_model({"model": "tgcn", "hidden_dim": 5, "node_embedding": 6}, fl)
    assert m2.wx.shape[0] == 6 and m2(range(4)).shape == (fl.num_owned, 5)
    with pytest.raises(ValueError, match=">= 0"):
        build_model({"model": "gcn", "node_embedding": -1}, graph)


@pytest.mark.parametrize("name", MODELS)
def test_input_is_features_and_embedding_without_the_cache(name):
    """[x || e] through the model equals the model on that input given explicitly (no cache)."""
    graph = DistGraph.from_graph_data(small_graph(N=30, T=6, F=3))
    torch.manual_seed(0)
    m = build_model({"model": name, "hidden_dim": 6, "node_embedding": 4}, graph)
    ts = [1, 2, 3]
    x = torch.cat([graph.features(ts), m.node_embedding.weight.unsqueeze(0).expand(3, -1, -1)], -1)
    with torch.no_grad():
        assert torch.allclose(m(ts), m.window(ts, x)[-1], atol=1e-6)
    graph._ax.clear()
    out = m(ts)
    assert not graph._ax  # the learnable input never went through propagated_features
    out.sum().backward()
    ids, grad = m.node_embedding.take_grads()
    assert torch.equal(ids.sort().values, graph.owned_ids) and grad.abs().sum() > 0


def _fit(graph, task, name, optimizer):
    torch.manual_seed(0)
    args = {"model": name, "hidden_dims": [8, 8], "node_embedding": 6}
    model = build_model(args, graph).double()
    head = build_task(task, graph, 8, **({"neg_eval": 5} if task == "link_pred" else {})).double()
    sp = Splitter.from_graph(graph, hist_len=3, task=task)
    tr = Trainer(model, head, sp, lr=0.01, epochs=2, patience=5)
    if optimizer == "sgd":
        tr.opt = TrainOptimizer(torch.optim.SGD(tr.params, lr=0.05),
                                SparseSGD([model.node_embedding], lr=0.05))
    w0 = model.node_embedding.full_table()
    for epoch in range(2):
        tr.train_epoch(epoch)
    metrics = tr.evaluate("test")
    dense = torch.cat([p.detach().reshape(-1) for m in (model, head) for p in m.parameters()])
    return {"table": model.node_embedding.full_table().numpy(), "w0": w0.numpy(),
            "dense": dense.numpy(), "metrics": {k: float(v) for k, v in metrics.items()},
            "owned": model.node_embedding.owned_ids.numpy().copy(),
            "graph_owned": graph.owned_ids.numpy().copy()}


# (task, model, featureless graph, optimizer)
CASES = [("link_pred", "evolvegcn-o", True, "adam"), ("node_regression", "gcn", False, "sgd"),
         ("link_pred", "tgcn", False, "adam"), ("node_regression", "gcn", True, "sgd")]


def _worker(paths):
    DistributedContext.init()
    return [_fit(get_graph(paths[i]), task, name, opt)
            for i, (task, name, _, opt) in enumerate(CASES)]


def _graph_for(i, fl):
    return _featureless(f"emb{i}") if fl else small_graph(N=50, T=10, E=600, name=f"emb{i}")


@pytest.mark.distributed
def test_two_ranks_train_like_one_process(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ref, paths = [], []
    try:
        for i, (task, name, fl, opt) in enumerate(CASES):
            g = _graph_for(i, fl)
            paths.append(str(g.save_partition(tmp_path, 2, "metis")))
            ref.append(_fit(DistGraph.from_graph_data(g), task, name, opt))
    finally:
        torch.set_num_threads(threads)
    got = run_distributed(_worker, 2, paths)
    for i, case in enumerate(CASES):
        r = ref[i]
        assert np.abs(r["table"] - r["w0"]).max() > 1e-3, case     # the embedding trained
        owned = np.concatenate([got[0][i]["owned"], got[1][i]["owned"]])
        assert np.array_equal(np.sort(owned), np.arange(r["table"].shape[0]))  # each row once
        for rank in (0, 1):
            x = got[rank][i]
            assert np.array_equal(x["owned"], x["graph_owned"])    # sharded like the graph
            assert np.array_equal(x["w0"], r["w0"])                # same init in any world
            np.testing.assert_allclose(x["table"], r["table"], atol=1e-5, rtol=0, err_msg=str(case))
            np.testing.assert_allclose(x["dense"], r["dense"], atol=1e-5, rtol=0, err_msg=str(case))
            for k, v in r["metrics"].items():
                assert abs(x["metrics"][k] - v) < 1e-5, (case, k, x["metrics"][k], v)


@pytest.mark.slow
def test_node_regression_example_with_embedding(tmp_path, datasets_root):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[2] / "examples" / "dtdg" / "train_node_regression.py"
    out = subprocess.run([sys.executable, str(script), "--data", "pedalme_london", "--root",
                          str(datasets_root), "--lags", "4", "--hidden-dim", "8",
                          "--node-embedding", "4", "--parts", str(tmp_path / "parts"),
                          "--epochs", "1", "--device", "cpu"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads([ln for ln in out.stdout.splitlines() if ln.strip()][-1])
    assert res["task"] == "node_regression" and res["test_mse"] == res["test_mse"]  # not NaN
