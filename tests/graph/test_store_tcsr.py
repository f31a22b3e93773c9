"""Graph store remote fetches and T-CSR 'full' vs 'partitioned' under 2 ranks, against one process."""
import io

import pytest
import torch

from tgl_dist.data import TemporalGraph
from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
from tgl_dist.partition import partition_graph, partition_load
from tgl_dist.sampling import NeighborSampler
from tgl_dist.testing import run_distributed


def featured_prefix(wiki, n):
    """The first n Wikipedia events with features that identify their row (node id, eid)."""
    ids = torch.arange(wiki.num_nodes, dtype=torch.float32)
    node_feat = torch.stack([ids, -2 * ids], 1)
    edge_attr = torch.arange(n, dtype=torch.float32).view(-1, 1) * 3 + 1
    return TemporalGraph(wiki.src[:n], wiki.dst[:n], wiki.t[:n], num_nodes=wiki.num_nodes,
                         node_feat=node_feat, edge_attr=edge_attr, name="wikiprefix")


@pytest.fixture(scope="module")
def parts(wiki, tmp_path_factory):
    g = featured_prefix(wiki, 6000)
    out = tmp_path_factory.mktemp("parts")
    partition_graph(g, 2, "random", out, seed=1)
    return g, out / g.name


def pack(obj) -> bytes:
    """Tensors cross the process boundary as bytes (shared-memory handles die with the worker)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def unpack(b: bytes):
    return torch.load(io.BytesIO(b), weights_only=False)


def _blocks(mfgs):
    return [(b.srcdata["ID"], b.srcdata["ts"], b.edata["ID"], b.edata["dt"], b.edge_index, b.num_dst)
            for b in mfgs]


def _rows(pdata, full, part):
    """Partitioned mode holds the rows of owned nodes only, each as in the full T-CSR; the
    kernel's records are the T-CSR's own storage."""
    from tgl_dist.sampling._ckernel import records
    nodes = torch.arange(full.num_nodes)
    own = part.owns(nodes)
    deg = part.degree(nodes)
    fr = torch.cat([torch.arange(int(full.indptr[n]), int(full.indptr[n + 1])) for n in nodes[own].tolist()])
    same = (torch.equal(part.nbr, full.nbr[fr]) and torch.equal(part.ts, full.ts[fr])
            and torch.equal(part.eid, full.eid[fr]))
    shared = all(records(g).rec.data_ptr() == g.rec.data_ptr() and g.ts.data_ptr() == g.rec.data_ptr() + 16
                 for g in (full, part))
    return dict(num_rows=part.num_rows, owned_rows=int(deg[own].sum()), other_rows=int(deg[~own].sum()),
                full_rows=full.num_rows, same=same, shared=shared,
                twins=int((part.twin >= 0).sum()), num_owned=int(own.sum()))


def _roots(pdata):
    m = pdata.train_mask
    src, dst, t = pdata.edge_index[0][m][-400:], pdata.edge_index[1][m][-400:], pdata.edge_ts[m][-400:]
    return torch.cat([src, dst]), torch.cat([t, t])


def _worker(root):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    pdata = partition_load(root, "random")
    graph = DistributedGraphStore(pdata)
    N, E = graph.num_nodes, graph.num_events
    # remote feature fetch: rank 0 asks every node (reversed, with repeats), rank 1 nothing;
    # for events it is the other way round
    ask_n = torch.cat([torch.arange(N).flip(0), torch.tensor([5, 5])]) if ctx.rank == 0 else torch.zeros(0, dtype=torch.long)
    ask_e = torch.arange(E).flip(0) if ctx.rank == 1 else torch.zeros(0, dtype=torch.long)
    nf = graph.get_node_feat(ask_n)
    ef = graph.get_edge_feat(ask_e)
    full = TemporalNeighborSampleGraph(pdata, "full")
    part = TemporalNeighborSampleGraph(pdata, "partitioned")
    nodes, ts = _roots(pdata)
    # the reference's graph.edge_attr[roots.eids]: global ids of this rank's own events
    own = graph.split_events("train").eid[-7:].flip(0)
    try:
        graph.edge_attr[DistributedGraphStore(partition_load(root, "random", rank=1 - ctx.rank)).eids[:1]]
        remote = "no error"
    except ValueError as e:
        remote = str(e)
    out = {"nf": (ask_n, nf), "ef": (ask_e, ef), "roots": (nodes, ts),
           "part_events": part.num_events, "full_events": full.num_events,
           "rows": _rows(pdata, full, part),
           "by_eid": (own, graph.edge_attr[own], graph.edge_attr.shape, remote)}
    for policy in ("recent", "uniform"):
        sf = NeighborSampler(N, 2, [10, 5], full, policy=policy, seed=7)
        sp = NeighborSampler(N, 2, [10, 5], part, policy=policy, seed=7)
        out[policy] = (_blocks(sf.sample(nodes, ts, epoch=3)), _blocks(sp.sample(nodes, ts, epoch=3)))
        st = NeighborSampler(N, 2, [10, 5], part, policy=policy, seed=7, backend="torch")
        out[policy + "_torch"] = _blocks(st.sample(nodes, ts, epoch=3))
    # a rank with no roots still takes part in the partitioned exchange
    empty = torch.zeros(0, dtype=torch.long)
    sp = NeighborSampler(N, 2, 10, part, policy="recent")
    if ctx.rank == 0:
        out["lonely"] = _blocks(sp.sample(nodes[:50], ts[:50]))
    else:
        out["lonely"] = _blocks(sp.sample(empty, torch.zeros(0, dtype=torch.float64)))
    return pack(out)


@pytest.mark.distributed
def test_two_ranks_match_one_process(parts):
    g, root = parts
    res = [unpack(b) for b in run_distributed(_worker, 2, str(root))]
    # features: exactly the rows of the whole-graph tables
    ids, nf = res[0]["nf"]
    assert torch.equal(nf, g.node_feat[ids])
    assert res[1]["nf"][1].shape == (0, 2)
    eids, ef = res[1]["ef"]
    assert torch.equal(ef, g.edge_attr[eids])
    for r in range(2):   # rank 1 used to get the rows of other events, silently
        own, rows, shape, remote = res[r]["by_eid"]
        assert own.numel() == 7 and torch.equal(rows, g.edge_attr[own])
        assert shape[1] == g.edge_attr.size(1) and "owned by another rank" in remote
    # full mode holds every event; partitioned only the rank's neighbourhoods
    assert res[0]["full_events"] == res[1]["full_events"] == g.num_events
    assert res[0]["part_events"] < g.num_events and res[1]["part_events"] < g.num_events
    # partitioned: only owned nodes' rows (both ranks' together: every row once)
    rows = [res[r]["rows"] for r in range(2)]
    for x in rows:
        assert x["same"] and x["shared"] and x["other_rows"] == 0 and x["num_rows"] == x["owned_rows"]
        assert 0 < x["twins"] < x["num_rows"]   # cross-partition events: twin -1
    assert rows[0]["num_rows"] + rows[1]["num_rows"] == rows[0]["full_rows"] == 2 * g.num_events
    # single-process reference on the whole graph
    ref_graph = TemporalNeighborSampleGraph(dict(src=g.src, dst=g.dst, t=g.t, eid=g.eid), "full",
                                            num_nodes=g.num_nodes)
    for r in range(2):
        nodes, ts = res[r]["roots"]
        for policy in ("recent", "uniform"):
            ref = _blocks(NeighborSampler(g.num_nodes, 2, [10, 5], ref_graph, policy=policy, seed=7)
                          .sample(nodes, ts, epoch=3))
            full, part = res[r][policy]
            part_torch = res[r][policy + "_torch"]
            for a, b in zip(ref, part_torch):
                assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5])) and a[5] == b[5], (r, policy, "torch")
            assert sum(b[2].numel() for b in ref) > 1000
            for a, b, c in zip(ref, full, part):
                for x, y, z in zip(a[:5], b[:5], c[:5]):
                    assert torch.equal(x, y) and torch.equal(x, z), (r, policy, [torch.equal(*p) for p in zip(a[:5], b[:5])], [torch.equal(*p) for p in zip(a[:5], c[:5])], [(u.shape, v.shape) for u, v in zip(a[:5], b[:5])])
                assert a[5] == b[5] == c[5]
    assert res[1]["lonely"][0][0].numel() == 0
    ref = _blocks(NeighborSampler(g.num_nodes, 2, 10, ref_graph).sample(res[0]["roots"][0][:50],
                                                                         res[0]["roots"][1][:50]))
    for a, b in zip(ref, res[0]["lonely"]):
        assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))


def test_store_single_process_views(parts, tmp_path):
    g, _ = parts
    partition_graph(g, 1, "random", tmp_path)
    pdata = partition_load(tmp_path / g.name, "random")
    graph = DistributedGraphStore(pdata)
    tr = graph.split_events("train")
    assert torch.equal(tr.eid, g.eid[g.train_mask])
    assert torch.equal(tr.src, g.src[g.train_mask]) and torch.equal(tr.t, g.t[g.train_mask])
    assert torch.equal(graph.get_node_feat(torch.tensor([3, 1, 3])), g.node_feat[[3, 1, 3]])
    assert torch.equal(graph.local_edge_feat(tr.eid[:5]), g.edge_attr[:5])
    # edge_attr: indexed by global event id; tensor methods act on the local table
    ea = graph.edge_attr
    assert torch.equal(ea[tr.eid[:5]], g.edge_attr[:5]) and ea[[]].shape == (0, ea.size(1))
    assert torch.equal(ea.float(), ea.local) and ea.ndim == 2 and len(ea) == ea.local.size(0)
    with pytest.raises(TypeError, match="slices and masks over this rank's rows index .local"):
        ea[:5]
    with pytest.raises(ValueError, match="unknown split"):
        graph.split_events("validation")


def test_one_part_of_two_in_a_world_of_one_is_refused(parts):
    # a part read from one process (for inspection) cannot serve features or build the
    # sampling graph: its local rows would answer for rows stored in the other part
    _, root = parts
    pdata = partition_load(root, "random", rank=1, world_size=2)
    store = DistributedGraphStore(pdata)
    with pytest.raises(ValueError, match="2 parts but the process group 1 ranks"):
        store.get_node_feat(torch.arange(10))
    with pytest.raises(ValueError, match="2 parts but the process group 1 ranks"):
        store.get_edge_feat(torch.arange(10))
    with pytest.raises(ValueError, match="2 parts but the process group 1 ranks"):
        TemporalNeighborSampleGraph(pdata, mode="full")
