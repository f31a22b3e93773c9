"""Partition-parallel models equal the single-process full-graph computation; the route's gradient.

Under 2 ranks each rank computes its owned nodes over a whole sequence of snapshots;
outputs and (all-reduced) parameter gradients must equal one process on the whole graph.
"""
import pytest
import torch
from torch_geometric.nn import GCNConv

from tgl_dist.context import DistributedContext
from tgl_dist.dist import AllToAllV, PartitionBook
from tgl_dist.dtdg import DistGraph, Route, build_model, get_graph
from tgl_dist.dtdg.trainer import all_reduce_gradients
from tgl_dist.testing import run_distributed

from dtdg_graphs import small_graph, to_numpy, to_torch

MODELS = ["gcn", "evolvegcn-o", "evolvegcn-h", "tgcn", "gconvgru"]
T, DIMS = 6, [5, 4]


def _run_models(graph, dtype=torch.float64):
    """Outputs [n, T, F] and parameter gradients of every model on ``graph``."""
    gen = torch.Generator().manual_seed(7)
    coef = torch.randn(graph.num_nodes, T, DIMS[-1], generator=gen, dtype=torch.float64)
    out = {}
    for name in MODELS:
        torch.manual_seed(0)
        m = build_model({"model": name, "hidden_dims": DIMS}, graph).to(dtype)
        y = m.forward_sequence(range(T))            # features from the graph: cached first layer
        (y * coef[graph.owned_ids].to(dtype)).sum().backward()
        params = list(m.parameters())
        all_reduce_gradients(params, graph.group)
        out[name] = (y.detach(), {k: p.grad.clone() for (k, _), p in zip(m.named_parameters(), params)})
    return graph.owned_ids, out


def _exact_worker(path, tiny_path):
    DistributedContext.init()
    return to_numpy(_run_models(get_graph(path))), _gradcheck(tiny_path)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    g = small_graph()
    root = tmp_path_factory.mktemp("parts")
    path = g.save_partition(root, 2, "random", seed=1)
    tiny = small_graph(N=12, T=3, E=30, name="tiny").save_partition(root, 2, "random")
    res = run_distributed(_exact_worker, 2, str(path), str(tiny))
    return (g, _run_models(DistGraph.from_graph_data(g))[1], to_torch([r[0] for r in res]),
            [r[1] for r in res])


@pytest.mark.distributed
@pytest.mark.parametrize("name", MODELS)
def test_two_ranks_equal_single_process(results, name):
    g, ref, dist_res, _ = results
    out = torch.zeros_like(ref[name][0])
    for owned, res in dist_res:
        assert res[name][0].shape[0] == owned.numel() > 0
        out[owned] = res[name][0]
    assert _rel(out, ref[name][0]) < 1e-5
    for k, grad in ref[name][1].items():
        for _, res in dist_res:                 # all-reduced: every rank has the full gradient
            assert _rel(res[name][1][k], grad) < 1e-5, k
        assert float(grad.abs().max()) > 0, k


@pytest.mark.parametrize("name", MODELS)
def test_cached_first_layer_equals_explicit_inputs(name):
    graph = DistGraph.from_graph_data(small_graph())
    torch.manual_seed(0)
    m = build_model({"model": name, "hidden_dims": DIMS}, graph).double()
    ts = [1, 2, 4]                                   # also a non-contiguous window
    a = m.forward_sequence(ts)
    b = m.forward_sequence(ts, graph.features(ts).double())
    assert _rel(a, b) < 1e-10


def test_gcn_matches_pyg_gcnconv():
    g = small_graph()
    graph = DistGraph.from_graph_data(g)
    torch.manual_seed(0)
    m = build_model({"model": "gcn", "hidden_dims": [4]}, graph).double()
    out = m.forward_sequence(range(T), graph.features(range(T)).double())
    conv = GCNConv(3, 4).double()
    conv.lin.weight.data = m.convs[0].weight.data.t().clone()
    conv.bias.data = m.convs[0].bias.data.clone()
    for t in range(T):
        s = g.get_snapshot(t)
        ref = conv(s.x.double(), s.edge_index, s.edge_weight.double())
        assert torch.allclose(out[:, t], ref, atol=1e-12)


def _gradcheck(path):
    """gradcheck of the route inside a function that is the same on every rank.

    Per-process gradcheck needs one global function: every rank holds the same input
    ``x [N, F]``; its rows reach their owners averaged over the ranks' copies (so each
    copy carries 1/P of the derivative), the route runs, and every rank's padded output is
    gathered on every rank (so each rank's backward seeds the same output element).
    Both helpers are ``AllToAllV``; the checked Jacobian is the route's.
    """
    graph = get_graph(path)
    N, F, P = graph.num_nodes, 2, graph.world_size
    book = PartitionBook(graph.owner)
    owned = [book.owned_ids(r) for r in range(P)]
    x = torch.randn(N, F, generator=torch.Generator().manual_seed(3), dtype=torch.float64,
                    requires_grad=True)

    def f(xg):
        copies = AllToAllV.apply(torch.cat([xg[o] for o in owned]), [o.numel() for o in owned],
                                 [graph.num_owned] * P, graph.group)
        x_own = copies.view(P, graph.num_owned, F).mean(0)
        h_all = graph.route(x_own)
        pad = torch.cat([h_all, h_all.new_zeros(N - h_all.size(0), F)])
        return AllToAllV.apply(pad.repeat(P, 1), [N] * P, [N] * P, graph.group)

    ok = torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-7)
    h_all = graph.route(x.detach()[graph.owned_ids])
    values_ok = torch.equal(h_all, x.detach()[graph.all_ids])
    # a per-step route for arbitrary ids (used for negatives)
    want = torch.tensor([N - 1, 0, 3, 0, N // 2])
    r, idx = Route.for_ids(want, graph.owner, graph.local, graph.rank, graph.num_owned, graph.group)
    ids_ok = torch.equal(r(x.detach()[graph.owned_ids])[idx], x.detach()[want])
    return ok, values_ok, ids_ok, graph.num_halo


@pytest.mark.distributed
def test_route_gradcheck_two_ranks(results):
    for ok, values_ok, ids_ok, halo in results[3]:
        assert ok and values_ok and ids_ok
        assert halo > 0


def test_route_world_of_one_is_identity():
    graph = DistGraph.from_graph_data(small_graph())
    h = torch.randn(graph.num_owned, 3, 2)
    assert graph.num_halo == 0 and graph.route(h) is h
    with pytest.raises(ValueError, match="owned rows"):
        graph.route(h[:-1])
