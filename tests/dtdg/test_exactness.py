"""Partition-parallel models equal the single-process full-graph computation; the route's gradient.

Under 2 and 3 ranks (3: a rank's halo rows come from two owners, so an ordering by owner
that 2 ranks cannot tell from an ordering by id is checked) each rank computes its owned nodes over a whole sequence of snapshots;
outputs and (all-reduced) parameter gradients must equal one process on the whole graph.
"""
import pytest
import torch
from torch_geometric.nn import GCNConv

from tgl_dist.context import DistributedContext
from tgl_dist.dist import AllToAllV, PartitionBook
from tgl_dist.dtdg import DistGraph, Route, build_model, get_graph
from tgl_dist.dist.parallel import reduce_gradients
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
        reduce_gradients(params, graph.group, average=False)
        out[name] = (y.detach(), {k: p.grad.clone() for (k, _), p in zip(m.named_parameters(), params)})
    return graph.owned_ids, out


def _exact_worker(path, tiny_path):
    DistributedContext.init()
    return to_numpy(_run_models(get_graph(path))), _gradcheck(tiny_path)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def results(request, tmp_path_factory):
    P = request.param
    g = small_graph()
    root = tmp_path_factory.mktemp("parts")
    path = g.save_partition(root, P, "random", seed=1)
    tiny = small_graph(N=12, T=3, E=30, name="tiny").save_partition(root, P, "random")
    res = run_distributed(_exact_worker, P, str(path), str(tiny))
    return (g, _run_models(DistGraph.from_graph_data(g))[1], to_torch([r[0] for r in res]),
            [r[1] for r in res])


@pytest.mark.distributed
@pytest.mark.parametrize("name", MODELS)
def test_ranks_equal_single_process(results, name):
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
    c = m.forward_sequence(ts, graph.features(ts).float())   # cast to the parameters' dtype
    assert c.dtype == torch.float64 and _rel(a, c) < 1e-6


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
    want = torch.cat([torch.tensor([N - 1, 0, 3, 0, N // 2]), torch.arange(N).flip(0)])
    r, idx = Route.for_ids(want, graph.owner, graph.local, graph.rank, graph.num_owned, graph.group)
    ids_ok = torch.equal(r(x.detach()[graph.owned_ids])[idx], x.detach()[want])
    return ok, values_ok, ids_ok, graph.num_halo


@pytest.mark.distributed
def test_route_gradcheck(results):
    for ok, values_ok, ids_ok, halo in results[3]:
        assert ok and values_ok and ids_ok
        assert halo > 0


def test_route_world_of_one_is_identity():
    graph = DistGraph.from_graph_data(small_graph())
    h = torch.randn(graph.num_owned, 3, 2)
    assert graph.num_halo == 0 and graph.route(h) is h
    with pytest.raises(ValueError, match="owned rows"):
        graph.route(h[:-1])


# ---------------------------------------------- EvolveGCN-O against a dense reference
def _dense_norm_adj(g, t, dtype):
    """``D^-1/2 (A + I) D^-1/2`` of snapshot ``t`` as a dense ``[N, N]`` matrix.

    ``A[dst, src]`` sums the weights of repeated edges (messages flow src -> dst, the
    degree is the weighted in-degree); a node's existing self loop keeps its weight
    instead of getting another one of weight 1 (PyG ``gcn_norm``'s
    ``add_remaining_self_loops``).
    """
    N = g.num_nodes
    m = g.edge()["time"] == t
    src, dst = g.edge_index[:, m]
    w = g.edge()["weight"][m].to(dtype)
    loop = src == dst
    assert torch.unique(src[loop]).numel() == int(loop.sum()), "one self loop per node"
    A = torch.zeros(N, N, dtype=dtype).index_put_((dst[~loop], src[~loop]), w[~loop], accumulate=True)
    diag = torch.ones(N, dtype=dtype)
    diag[src[loop]] = w[loop]
    A = A + torch.diag(diag)
    dinv = A.sum(1).pow(-0.5)
    return dinv[:, None] * A * dinv[None, :]


class _DenseEvolveGCNO(torch.nn.Module):
    """EvolveGCN-O written out snapshot by snapshot (algorithms.md section 5; the gate
    layout of ``benchmarks/dtdg_throughput.py``'s ``MatGRU``, IBM ``mat_GRU_cell``): per
    layer a matrix GRU with separate gates, ``W_t = GRU(W_{t-1}, W_{t-1})`` before use,
    then ``H_t^{l+1} = relu(Â_t H_t^l W_t^l)`` (no activation after the last layer)."""

    def __init__(self, dims):
        super().__init__()
        P = torch.nn.Parameter
        self.w0 = torch.nn.ParameterList(P(torch.empty(a, b)) for a, b in zip(dims[:-1], dims[1:]))
        # per layer and gate g in (z, r, h): W[g] on the input X, U[g] on the state, B[g]
        self.W = torch.nn.ModuleList(torch.nn.ParameterList(P(torch.empty(a, a)) for _ in "zrh")
                                     for a in dims[:-1])
        self.U = torch.nn.ModuleList(torch.nn.ParameterList(P(torch.empty(a, a)) for _ in "zrh")
                                     for a in dims[:-1])
        self.B = torch.nn.ModuleList(torch.nn.ParameterList(P(torch.empty(a, b)) for _ in "zrh")
                                     for a, b in zip(dims[:-1], dims[1:]))

    def gru(self, layer, x, h):
        W, U, B = self.W[layer], self.U[layer], self.B[layer]
        z = torch.sigmoid(W[0] @ x + U[0] @ h + B[0])
        r = torch.sigmoid(W[1] @ x + U[1] @ h + B[1])
        h_cap = torch.tanh(W[2] @ x + U[2] @ (r * h) + B[2])
        return (1 - z) * h + z * h_cap

    def forward(self, adjs, xs):
        """``adjs``: dense ``[N, N]``, ``xs``: ``[N, F]``, per snapshot -> ``[N, Tw, F_out]``."""
        ws, out = list(self.w0), []
        for A, h in zip(adjs, xs):
            for layer in range(len(ws)):
                ws[layer] = self.gru(layer, ws[layer], ws[layer])
                h = torch.relu(A @ (h @ ws[layer]))   # sigma after every layer (IBM code)
            out.append(h)
        return torch.stack(out, 1)

    def copy_from(self, m):
        """Copy ``EvolveGCNO``'s weights (its z and r gates are stacked ``[z; r]``)."""
        with torch.no_grad():
            for layer, cell in enumerate(m.cells):
                rows = cell.rows
                self.w0[layer].copy_(m.w0[layer])
                for g, (u, v, b) in enumerate([(cell.U_zr[:rows], cell.V_zr[:rows], cell.B_zr[:rows]),
                                               (cell.U_zr[rows:], cell.V_zr[rows:], cell.B_zr[rows:]),
                                               (cell.U_h, cell.V_h, cell.B_h)]):
                    self.W[layer][g].copy_(u)
                    self.U[layer][g].copy_(v)
                    self.B[layer][g].copy_(b)

    def grads_like(self, m):
        """This model's gradients in ``EvolveGCNO``'s parameter layout, by its names."""
        out = {}
        for layer in range(len(self.w0)):
            gw = [p.grad for p in self.W[layer]]
            gu = [p.grad for p in self.U[layer]]
            gb = [p.grad for p in self.B[layer]]
            out[f"w0.{layer}"] = self.w0[layer].grad
            out[f"cells.{layer}.U_zr"] = torch.cat(gw[:2])
            out[f"cells.{layer}.V_zr"] = torch.cat(gu[:2])
            out[f"cells.{layer}.B_zr"] = torch.cat(gb[:2])
            out[f"cells.{layer}.U_h"] = gw[2]
            out[f"cells.{layer}.V_h"] = gu[2]
            out[f"cells.{layer}.B_h"] = gb[2]
        assert set(out) == {k for k, _ in m.named_parameters()}
        return out


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-5), (torch.float32, 2e-6)])
@pytest.mark.parametrize("ts", [list(range(T)), [2, 3, 4, 5]])
def test_evolvegcn_o_equals_dense_reference(dtype, tol, ts):
    """1 process, EvolveGCN-O over a sequence of snapshots: outputs and every parameter
    gradient equal an independent dense implementation with the same weights (float64:
    1e-5 relative, measured ~1e-15; float32 against the float64 reference: 2e-6,
    measured ~2.6e-7).
    The gate biases are randomised so they are exercised too (they start at zero)."""
    g = small_graph()
    graph = DistGraph.from_graph_data(g)
    torch.manual_seed(0)
    m = build_model({"model": "evolvegcn-o", "hidden_dims": DIMS}, graph).to(dtype)
    with torch.no_grad():
        for cell in m.cells:
            cell.B_zr.normal_(0, 0.3)
            cell.B_h.normal_(0, 0.3)
    ref = _DenseEvolveGCNO([3, *DIMS]).double()
    ref.copy_from(m)
    gen = torch.Generator().manual_seed(7)
    coef = torch.randn(graph.num_nodes, len(ts), DIMS[-1], generator=gen, dtype=torch.float64)

    y = m.forward_sequence(ts)                                 # [n, Tw, F_out], owned nodes
    (y * coef[graph.owned_ids].to(dtype)).sum().backward()
    adjs = [_dense_norm_adj(g, t, torch.float64) for t in ts]
    y_ref = ref(adjs, [g.node()["x"][:, t].double() for t in ts])
    (y_ref * coef).sum().backward()

    assert y.shape == (graph.num_nodes, len(ts), DIMS[-1])
    assert _rel(y.detach().double(), y_ref.detach()[graph.owned_ids]) < tol
    ref_grads = ref.grads_like(m)
    for k, p in m.named_parameters():
        assert float(ref_grads[k].abs().max()) > 0, k
        assert _rel(p.grad.double(), ref_grads[k]) < tol, k
    # the window's weights really evolve: the last snapshot's differ from the first's
    with torch.no_grad():
        w = m.evolve(0, len(ts))
    assert _rel(w[-1], w[0]) > 1e-3
