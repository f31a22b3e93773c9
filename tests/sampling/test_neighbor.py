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


@pytest.mark.parametrize("backend", ["torch", "compiled"])
@pytest.mark.parametrize("scale", [1.0, 0.5])   # integer times, then fractional ones
def test_same_time_events_are_excluded_on_both_backends(backend, scale):
    # node 0's events at 1, 3, 5 (x scale); queries exactly at and between event times
    if backend == "compiled":
        _needs_kernel()
    ev = _graph([0, 0, 4, 0], [1, 2, 0, 3], [1 * scale, 3 * scale, 3 * scale, 5 * scale])
    g = TemporalNeighborSampleGraph(ev, "full")
    s = NeighborSampler(g.num_nodes, 1, 10, g, policy="recent", backend=backend)
    q = torch.tensor([1.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64) * scale
    (b,) = s.sample(torch.zeros(5, dtype=torch.long), q)
    got = {d: [e for _, e, _ in v] for d, v in _per_root(b).items()}
    assert got == {1: [0], 2: [0, 1, 2], 3: [0, 1, 2], 4: [0, 1, 2, 3]}
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
    # pairs: each unordered pair appears with probability k(k-1)/(c(c-1)). Their mean is
    # that by construction (k distinct ids give k(k-1) ordered pairs per draw), so only
    # the spread is informative: a sampler favouring some subsets inflates it.
    off = pair[~torch.eye(c, dtype=torch.bool)]
    pe = reps * k * (k - 1) / (c * (c - 1))
    assert float(off.std()) < 3 * math.sqrt(pe)


def _chi2_quantile_999(df: int) -> float:
    """The 0.999 quantile of chi-square with ``df`` degrees of freedom (Wilson-Hilferty;
    within 0.1% of the exact value for df >= 20)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + 3.0902 * math.sqrt(a)) ** 3


def test_uniform_distribution_chi_square_real(wiki):
    # the busiest node of a real prefix, queried after its last event at R distinct times
    # (draws are keyed by (seed, epoch, node, time), so each row is an independent draw
    # over the same candidate events); each event must be picked k/c of the time.
    n, k, reps = 4000, 10, 4000
    N, ev = _small_real(wiki, n)
    node = int(torch.bincount(torch.cat([ev["src"], ev["dst"]])).argmax())
    mine = (ev["src"] == node) | (ev["dst"] == node)
    c = int(mine.sum())
    assert c > 5 * k, c                             # enough candidates for the test to bite
    s = NeighborSampler(N, 1, k, TemporalNeighborSampleGraph(ev, "full", num_nodes=N),
                        policy="uniform", seed=7)
    ts = float(ev["t"].max()) + 1.0 + torch.arange(reps, dtype=torch.float64)
    (b,) = s.sample(torch.full((reps,), node), ts)
    assert b.num_edges == reps * k
    counts = torch.bincount(b.edata["ID"], minlength=n).double()
    assert float(counts[~mine].sum()) == 0, "sampled an event that is not the node's"
    counts = counts[mine]
    # each count is Binomial(reps, p), p = k/c, with covariance -reps p(1-p)/(c-1) between
    # events (k drawn without replacement), so this statistic is chi-square with c-1 dof
    p = k / c
    stat = float(((counts - reps * p) ** 2).sum() / (reps * p * (1 - p)) * (c - 1) / c)
    assert stat < _chi2_quantile_999(c - 1), (stat, c)


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
    # "strictly before NaN" selects nothing sensible: refused, not answered differently by
    # the two backends (the torch path used to return other nodes' rows)
    with pytest.raises(ValueError, match="root 1 is NaN"):
        s.sample(torch.tensor([0, 1]), torch.tensor([2.0, math.nan]))


def _same_blocks(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.num_dst == y.num_dst
        for d1, d2 in ((x.srcdata, y.srcdata), (x.edata, y.edata)):
            assert d1.keys() == d2.keys()
            for key in d1:
                assert d1[key].dtype == d2[key].dtype and torch.equal(d1[key], d2[key]), key
        assert torch.equal(x.edge_index, y.edge_index)


def _needs_kernel():
    from tgl_dist.sampling._ckernel import get_kernel
    if get_kernel() is None:
        pytest.skip("TGL_DIST_NO_KERNEL=1 or no working C compiler: the compiled kernel is off")


def test_default_backend_is_the_compiled_kernel(wiki):
    _needs_kernel()
    N, ev = _small_real(wiki, 100)
    s = NeighborSampler(N, 1, 10, TemporalNeighborSampleGraph(ev, "full", num_nodes=N))
    assert s.backend == "compiled"


@pytest.mark.parametrize("policy,fanout", [("recent", [10]), ("uniform", [10]), ("recent", [10, 10]),
                                           ("uniform", [10, 10]), ("uniform", [10, 10, 5]),
                                           ("recent", [3, 7]), ("uniform", [4, 4, 4])])
def test_compiled_kernel_equals_torch_path(wiki, policy, fanout):
    """The default backend (compiled kernel) returns bit-identical blocks to the torch path."""
    _needs_kernel()
    N, ev = _small_real(wiki, 20000)
    g = TemporalNeighborSampleGraph(ev, "full", num_nodes=N)
    gen = torch.Generator().manual_seed(1)
    i = torch.arange(15000, 16000)
    neg = torch.randint(N, (i.numel(),), generator=gen)
    nodes = torch.cat([ev["src"][i], ev["dst"][i], neg])
    ts = torch.cat([ev["t"][i], ev["t"][i], ev["t"][i] + 0.5])
    fast = NeighborSampler(N, len(fanout), fanout, g, policy=policy, workers=2, seed=5)
    ref = NeighborSampler(N, len(fanout), fanout, g, policy=policy, seed=5, backend="torch")
    # chronological, then backwards in time and shuffled: the kernel's search hints are
    # stale or far off, which may cost time but must never change a sample
    perm = torch.randperm(nodes.numel(), generator=gen)
    for nd, t in ((nodes, ts), (nodes.flip(0), ts.flip(0) - 1000.0), (nodes[perm], ts[perm])):
        _same_blocks(fast.sample(nd, t, epoch=2), ref.sample(nd, t, epoch=2))
    _same_blocks(fast.sample(nodes[:0], ts[:0]), ref.sample(nodes[:0], ts[:0]))


def test_compiled_kernel_partitioned_mode_world_of_one(wiki):
    """'partitioned' mode samples through the kernel's flat hop: same blocks as torch and as 'full'."""
    _needs_kernel()
    from tgl_dist.dist import PartitionBook
    N, ev = _small_real(wiki, 8000)
    book = PartitionBook(torch.zeros(N, dtype=torch.long), num_parts=1)
    part = TemporalNeighborSampleGraph(ev, "partitioned", num_nodes=N, book=book)
    full = TemporalNeighborSampleGraph(ev, "full", num_nodes=N)
    i = torch.arange(6000, 6400)
    nodes, ts = torch.cat([ev["src"][i], ev["dst"][i]]), torch.cat([ev["t"][i], ev["t"][i]])
    for policy in ("recent", "uniform"):
        a = NeighborSampler(N, 2, [10, 3], part, policy=policy).sample(nodes, ts)
        b = NeighborSampler(N, 2, [10, 3], part, policy=policy, backend="torch").sample(nodes, ts)
        c = NeighborSampler(N, 2, [10, 3], full, policy=policy).sample(nodes, ts)
        _same_blocks(a, b)
        _same_blocks(a, c)


def test_kernel_build_cache_and_failures(tmp_path):
    """Builds once per (source, compiler): a cached build is reused, an edited source rebuilds,
    and a failing compiler is a clear error."""
    from tgl_dist.kernels import SAMPLER, build as kb, source_hash
    cc = kb.compiler()
    if cc is None:
        pytest.skip("no C compiler")
    p1, _ = SAMPLER.build(cc, tmp_path)
    mtime = p1.stat().st_mtime_ns
    assert SAMPLER.build(cc, tmp_path)[0] == p1 and p1.stat().st_mtime_ns == mtime
    src = tmp_path / "edited.c"
    src.write_text(SAMPLER.source.read_text() + "\n/* edited */\n")
    (tmp_path / "abi.h").write_text((SAMPLER.source.parent / "abi.h").read_text())
    assert kb.build(cc, tmp_path, src, kb.FLAGS) != p1
    assert SAMPLER.open(p1).tgl_abi_hash() == source_hash(SAMPLER.source)
    bad = tmp_path / "bad.c"
    bad.write_text("int f(void) { return }\n")
    with pytest.raises(RuntimeError, match="failed"):
        kb.build(cc, tmp_path, bad)
    assert not list(tmp_path.glob("*.tmp.so"))


def test_no_compiler_falls_back_to_torch_with_one_warning(monkeypatch, tmp_path, caplog):
    from tgl_dist.kernels import SAMPLER
    monkeypatch.setattr(SAMPLER, "value", None)
    monkeypatch.setattr(SAMPLER, "error", None)
    monkeypatch.setattr(SAMPLER, "warned", False)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("TGL_DIST_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TGL_DIST_NO_KERNEL", raising=False)
    ev = _graph([0, 1, 0], [1, 2, 2], [1, 2, 3])
    g = TemporalNeighborSampleGraph(ev, "full")
    with caplog.at_level("WARNING", logger="tgl_dist.kernels"):
        s1 = NeighborSampler(g.num_nodes, 1, 2, g)
        s2 = NeighborSampler(g.num_nodes, 1, 2, g, policy="uniform")
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    msg = warnings[0].getMessage()
    assert "no-such-cc" in msg and "C compiler" in msg and "TGL_DIST_NO_KERNEL" in msg
    assert s1.backend == s2.backend == "torch"
    (b,) = s1.sample(torch.tensor([0]), torch.tensor([3.5], dtype=torch.float64))
    assert b.edata["ID"].tolist() == [0, 2]
    with pytest.raises(RuntimeError, match="backend='compiled'"):
        NeighborSampler(g.num_nodes, 1, 2, g, backend="compiled")
    monkeypatch.setenv("TGL_DIST_NO_KERNEL", "1")
    assert NeighborSampler(g.num_nodes, 1, 2, g).backend == "torch"
