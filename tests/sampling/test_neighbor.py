"""NeighborSampler against a brute-force reference, on hand-built streams and real data."""
import math

import pytest
import torch

from tgl_dist.graph import TemporalNeighborSampleGraph
from tgl_dist.sampling import NeighborSampler


def _graph(src, dst, t):
    src, dst, t = torch.tensor(src), torch.tensor(dst), torch.tensor(t, dtype=torch.float64)
    return dict(src=src, dst=dst, t=t, eid=torch.arange(src.numel()))


def _brute(ev, node, q):
    """All (time, eid, nbr) of `node` strictly before q, chronological (ties by eid)."""
    src, dst, t, eid = ev["src"], ev["dst"], ev["t"], ev["eid"]
    before = t < q
    out = []
    for side, other in ((src, dst), (dst, src)):
        m = before & (side == node)
        out += list(zip(t[m].tolist(), eid[m].tolist(), other[m].tolist()))
    return sorted(out)


def _per_root(block):
    """{dst index: [(t_edge, eid, nbr), ...]} from a block (edges of a root in order)."""
    res = {}
    ts = block.srcdata["ts"]
    for j in range(block.num_edges):
        s, d = int(block.edge_index[0, j]), int(block.edge_index[1, j])
        res.setdefault(d, []).append((float(ts[s]), int(block.edata["ID"][j]), int(block.srcdata["ID"][s])))
    return res


def test_recent_exact_hand_built_with_ties_and_self_loop():
    # node 0 has events at t=1,2,2,3,5; a self-loop at t=2 (eid 2) is listed twice
    ev = _graph([0, 1, 0, 0, 4, 0, 2], [1, 0, 0, 2, 0, 3, 3], [1, 2, 2, 2, 3, 5, 5])
    g = TemporalNeighborSampleGraph(ev, "full")
    s = NeighborSampler(g.num_nodes, 1, 3, g, policy="recent")
    nodes = torch.tensor([0, 0, 0, 3, 1])
    ts = torch.tensor([5.0, 2.0, 1.0, 6.0, 2.0], dtype=torch.float64)
    (b,) = s.sample(nodes, ts)
    got = _per_root(b)
    for i in range(nodes.numel()):
        ref = _brute(ev, int(nodes[i]), float(ts[i]))[-3:]
        assert got.get(i, []) == ref, (i, got.get(i), ref)
    # query at 2.0: only the event at t=1 qualifies (same-time events excluded)
    assert got[1] == [(1.0, 0, 1)]
    assert 2 not in got  # nothing before t=1
    assert torch.equal(b.srcdata["ID"][:5], nodes)
    assert bool((b.edata["dt"] > 0).all())


def _small_real(wiki, n):
    g = wiki
    sub = dict(src=g.src[:n], dst=g.dst[:n], t=g.t[:n], eid=g.eid[:n])
    return g.num_nodes, sub


def test_recent_matches_brute_force_real(wiki):
    N, ev = _small_real(wiki, 3000)
    g = TemporalNeighborSampleGraph(ev, "full", num_nodes=N)
    s = NeighborSampler(N, 1, 10, g, policy="recent")
    gen = torch.Generator().manual_seed(0)
    pick = torch.randint(500, 3000, (150,), generator=gen)
    nodes = torch.cat([ev["src"][pick], ev["dst"][pick]])
    ts = torch.cat([ev["t"][pick], ev["t"][pick]])
    (b,) = s.sample(nodes, ts)
    got = _per_root(b)
    for i in range(nodes.numel()):
        assert got.get(i, []) == _brute(ev, int(nodes[i]), float(ts[i]))[-10:]


@pytest.mark.parametrize("policy", ["recent", "uniform"])
def test_strictly_earlier_every_layer(wiki, policy):
    N, ev = _small_real(wiki, 5000)
    g = TemporalNeighborSampleGraph(ev, "full", num_nodes=N)
    s = NeighborSampler(N, 3, [10, 5, 3], g, policy=policy)
    i = torch.arange(4000, 4600)
    nodes = torch.cat([ev["src"][i], ev["dst"][i]])
    ts = torch.cat([ev["t"][i], ev["t"][i]])
    mfgs = s.sample(nodes, ts)
    assert len(mfgs) == 3
    et = ev["t"][mfgs[0].edata["ID"]]  # eids are positions in this prefix stream
    for b in mfgs:
        qt = b.srcdata["ts"][b.edge_index[1]]
        edge_t = ev["t"][b.edata["ID"]]
        assert bool((edge_t < qt).all()), "a neighbour is not strictly earlier than its query time"
        assert bool((b.edata["dt"] > 0).all())
        assert torch.allclose(b.edata["dt"].double(), qt - edge_t, rtol=1e-6)
        # the sampled source is queried at the edge time, and is an endpoint of the event
        assert torch.equal(b.srcdata["ts"][b.edge_index[0]], edge_t)
        dn = b.srcdata["ID"][b.edge_index[1]]
        sn = b.srcdata["ID"][b.edge_index[0]]
        es, ed = ev["src"][b.edata["ID"]], ev["dst"][b.edata["ID"]]
        assert bool((((es == dn) & (ed == sn)) | ((ed == dn) & (es == sn))).all())
    # nested prefix layout: each block's destinations are the next block's sources
    for deep, shallow in zip(mfgs[:-1], mfgs[1:]):
        assert deep.num_dst == shallow.num_src
        assert torch.equal(deep.srcdata["ID"][:deep.num_dst], shallow.srcdata["ID"])
        assert torch.equal(deep.srcdata["ts"][:deep.num_dst], shallow.srcdata["ts"])
    assert torch.equal(mfgs[-1].srcdata["ID"][:nodes.numel()], nodes)
    assert et.numel() > 0


def test_uniform_support_and_count_real(wiki):
    N, ev = _small_real(wiki, 4000)
    g = TemporalNeighborSampleGraph(ev, "full", num_nodes=N)
    s = NeighborSampler(N, 1, 10, g, policy="uniform", seed=3)
    i = torch.arange(3000, 3300)
    nodes = torch.cat([ev["src"][i], ev["dst"][i]])
    ts = torch.cat([ev["t"][i], ev["t"][i]])
    (b,) = s.sample(nodes, ts)
    got = _per_root(b)
    for r in range(nodes.numel()):
        cand = _brute(ev, int(nodes[r]), float(ts[r]))
        mine = got.get(r, [])
        assert len(mine) == min(10, len(cand))
        assert len(set(mine)) == len(mine), "sampled with replacement"
        assert set(mine) <= set(cand)
        assert mine == sorted(mine), "neighbours not chronological"
    # deterministic for a seed and epoch, different across epochs
    (b2,) = s.sample(nodes, ts)
    assert torch.equal(b.edata["ID"], b2.edata["ID"])
    s.set_epoch(1)
    (b3,) = s.sample(nodes, ts)
    assert not torch.equal(b.edata["ID"], b3.edata["ID"])


def test_uniform_distribution_chi_square():
    # node 0 has 20 events (t = 1..20) with distinct neighbours; query k=5 at t=100 over many epochs
    c, k, reps = 20, 5, 1500
    ev = _graph([0] * c, list(range(1, c + 1)), list(range(1, c + 1)))
    g = TemporalNeighborSampleGraph(ev, "full")
    s = NeighborSampler(g.num_nodes, 1, k, g, policy="uniform", seed=11)
    counts = torch.zeros(c)
    pair = torch.zeros(c, c)
    for e in range(reps):
        s.set_epoch(e)
        (b,) = s.sample(torch.tensor([0]), torch.tensor([100.0], dtype=torch.float64))
        ids = b.edata["ID"]
        assert ids.numel() == k and ids.unique().numel() == k
        counts[ids] += 1
        pair[ids.unsqueeze(1), ids.unsqueeze(0)] += 1
    expected = reps * k / c
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 19 degrees of freedom: P(chi2 > 43.8) = 0.001
    assert chi2 < 43.8, chi2
    # pairs: each unordered pair appears with probability k(k-1)/(c(c-1))
    off = pair[~torch.eye(c, dtype=torch.bool)]
    pe = reps * k * (k - 1) / (c * (c - 1))
    assert abs(float(off.mean()) - pe) < 1e-6 * pe + 1e-9 or abs(float(off.mean()) - pe) / pe < 0.01
    assert float(off.std()) < 3 * math.sqrt(pe)


def test_bad_arguments():
    ev = _graph([0, 1], [1, 2], [1, 2])
    g = TemporalNeighborSampleGraph(ev, "full")
    with pytest.raises(ValueError, match="policy"):
        NeighborSampler(g.num_nodes, 1, 3, g, policy="latest")
    with pytest.raises(ValueError, match="fanout"):
        NeighborSampler(g.num_nodes, 2, [3], g)
    with pytest.raises(ValueError, match="mode"):
        TemporalNeighborSampleGraph(ev, "replicated")
    with pytest.raises(ValueError, match="book"):
        TemporalNeighborSampleGraph(ev, "partitioned")
    s = NeighborSampler(g.num_nodes, 1, 3, g)
    with pytest.raises(ValueError, match="root ids"):
        s.sample(torch.tensor([7]), torch.tensor([1.0]))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["recent", "uniform"])
def test_compiled_kernel_equals_torch_path(wiki, policy):
    from tgl_dist.sampling.kernel import get_kernel
    if get_kernel() is None:
        pytest.skip("no C++ compiler: the compiled kernel cannot be built here")
    N, ev = _small_real(wiki, 20000)
    g = TemporalNeighborSampleGraph(ev, "full", num_nodes=N)
    i = torch.arange(15000, 16000)
    nodes = torch.cat([ev["src"][i], ev["dst"][i], ev["dst"][i.flip(0)]])
    ts = torch.cat([ev["t"][i], ev["t"][i], ev["t"][i] + 0.5])
    a = NeighborSampler(N, 2, [10, 4], g, policy=policy, backend="torch").sample(nodes, ts, epoch=2)
    b = NeighborSampler(N, 2, [10, 4], g, policy=policy, backend="cpp").sample(nodes, ts, epoch=2)
    for x, y in zip(a, b):
        assert x.num_dst == y.num_dst
        for d1, d2 in ((x.srcdata, y.srcdata), (x.edata, y.edata)):
            assert all(torch.equal(d1[key], d2[key]) for key in d1)
        assert torch.equal(x.edge_index, y.edge_index)
