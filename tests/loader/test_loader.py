"""DistributedDataLoader: time-aligned windows, exactly-once visits, empty windows, features, hooks."""
import io
import os
import time
import threading

import pytest
import torch

from tgl_dist.data import TemporalGraph
from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
from tgl_dist.loader import DistributedDataLoader, GlobalSchedule
from tgl_dist.partition import partition_graph, partition_load
from tgl_dist.sampling import NegativeSampling, NeighborSampler
from tgl_dist.testing import run_distributed


def pack(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def unpack(b: bytes):
    return torch.load(io.BytesIO(b), weights_only=False)


def featured_prefix(wiki, n):
    ids = torch.arange(wiki.num_nodes, dtype=torch.float32)
    return TemporalGraph(wiki.src[:n], wiki.dst[:n], wiki.t[:n], num_nodes=wiki.num_nodes,
                         node_feat=torch.stack([ids, -2 * ids], 1),
                         edge_attr=torch.arange(n, dtype=torch.float32).view(-1, 1) * 3 + 1,
                         name="wikiprefix")


def skewed_graph():
    """Rank 1 (odd sources under `hash`) owns no event in the first 60 events."""
    g = torch.Generator().manual_seed(0)
    n = 200
    src = torch.randint(0, 10, (n,), generator=g) * 2
    src[60:] += torch.randint(0, 2, (n - 60,), generator=g)
    dst = 20 + torch.randint(0, 15, (n,), generator=g)
    return TemporalGraph(src, dst, torch.arange(n, dtype=torch.float64) / 2, num_nodes=35, name="skewed")


@pytest.fixture(scope="module")
def parts(wiki, tmp_path_factory):
    out = tmp_path_factory.mktemp("parts")
    g = featured_prefix(wiki, 5000)
    for p in (1, 2):
        partition_graph(g, p, "random", out, seed=2)
    s = skewed_graph()
    for p in (1, 2):
        partition_graph(s, p, "hash", out)
    return g, s, out


# ------------------------------------------------------------------------ unit
def test_schedule_boundaries_and_windows():
    sch = GlobalSchedule(torch.arange(10))
    assert sch.boundaries(4) == [0, 4, 8, 10]
    assert sch.boundaries(4, drop_last=True) == [0, 4, 8]
    # drop_last drops only a SHORT last window: a full one is kept
    full = GlobalSchedule(torch.arange(8))
    assert full.boundaries(4, drop_last=True) == [0, 4, 8]
    assert sch.boundaries(4, offset=2) == [0, 2, 6, 10]
    w = sch.windows([0, 4, 8, 10])
    assert [(x.start, x.end, x.lo, x.hi) for x in w] == [(0, 4, 0, 4), (4, 8, 4, 8), (8, 10, 8, 10)]


def _gathered_windows(eid, bounds):
    """The windows as the schedule computed them before it was sharded: all ranks' eids
    gathered, sorted, and each local event's position found in them."""
    from tgl_dist.dist import all_gather_v
    every = torch.sort(all_gather_v(eid)).values
    pos = torch.searchsorted(every, eid)
    local = torch.searchsorted(pos, torch.tensor(bounds)).tolist()
    return every.numel(), [(bounds[k], bounds[k + 1], local[k], local[k + 1])
                           for k in range(len(bounds) - 1)]


def _schedule_worker(seed):
    from tgl_dist import DistributedContext
    from tgl_dist.dist import world
    DistributedContext.init()
    rank, ws = world()
    g = torch.Generator().manual_seed(seed)
    out = []
    for n, owners, keep in ((0, 1, 1.0), (1, ws, 1.0), (97, ws, 1.0), (500, ws, 0.4),
                            (500, 1, 0.7), (1000, ws, 0.05)):
        # random owner of each of n events, some events not in the split (inductive
        # splits are not contiguous in eid), some ranks owning nothing
        owner = torch.randint(0, owners, (n,), generator=g)
        split = torch.rand(n, generator=g) < keep
        eid = torch.nonzero((owner == rank) & split).view(-1) + 3
        sch = GlobalSchedule(eid)
        for window, offset, drop in ((1, 0, False), (7, 3, False), (16, 0, True), (4000, 0, False)):
            b = sch.boundaries(window, offset, drop)
            ref_n, ref = _gathered_windows(eid, b)
            got = [(w.start, w.end, w.lo, w.hi) for w in sch.windows(b)]
            out.append((sch.num_events == ref_n, got == ref, len(got)))
    try:  # the same event on two ranks is refused on both, and neither hangs
        GlobalSchedule(torch.tensor([1, 2, 5 + rank]))
        out.append("accepted")
    except ValueError as e:
        out.append(str(e))
    return out


@pytest.mark.distributed
@pytest.mark.parametrize("nproc", [2, 3])
def test_schedule_equals_the_gathered_one(nproc):
    """The ring-counted global positions give exactly the windows of the gathered order."""
    results = run_distributed(_schedule_worker, nproc, 5, timeout=120)
    for r in results:
        *checks, dup = r
        assert all(a and b for a, b, _ in checks), checks
        assert sum(n for *_, n in checks) > 0
        assert "another rank holds too" in dup


def _collect(loader, epochs=1, stop_after=None):
    out = []
    for e in range(epochs):
        steps = []
        for i, (roots, mfgs, meta, st) in enumerate(loader):
            steps.append(dict(eid=roots.eids, window=meta["window"], nodes=roots.nodes,
                              neg=roots.extra.get("neg_dst"), neg_src=roots.extra.get("neg_src"),
                              k=meta["neg_k"], st=st))
            check_step(loader.graph, roots, mfgs, meta)
            if stop_after is not None and i + 1 == stop_after:
                break
        out.append(steps)
    return out


def check_step(graph, roots, mfgs, meta):
    B = len(roots)
    assert torch.equal(roots.nodes[meta["src_pos_index"]], roots.src)
    assert torch.equal(roots.nodes[meta["dst_pos_index"]], roots.dst)
    assert meta["dst_neg_index"].numel() == meta["neg_k"] * B
    for b in mfgs:
        assert torch.equal(b.srcdata["ID"][:roots.nodes.numel()], roots.nodes)
        if graph.node_feat_dim:
            assert torch.equal(b.srcdata["h"][:, 0], b.srcdata["ID"].float())
        if graph.edge_feat_dim:
            assert torch.equal(b.edata["f"][:, 0], b.edata["ID"].float() * 3 + 1)
        assert bool((b.edata["dt"] > 0).all())
    if graph.edge_feat_dim:
        assert torch.equal(roots.extra["f"][:, 0], roots.eids.float() * 3 + 1)


def _loader_worker(root, skew_root):
    from tgl_dist import DistributedContext
    DistributedContext.init()
    pdata = partition_load(root, "random")
    graph = DistributedGraphStore(pdata)
    tg = TemporalNeighborSampleGraph(pdata, "partitioned")
    sampler = NeighborSampler(graph.num_nodes, 2, [5, 3], tg, policy="uniform", workers=1)
    train = DistributedDataLoader(graph, "train", sampler, neg_sampler=NegativeSampling(),
                                  batch_size=150, chunk_size=50, queue_size=2)
    val = DistributedDataLoader(graph, "val", sampler, neg_sampler=NegativeSampling(),
                                batch_size=150, train=False, queue_size=2)
    res = {"train": _collect(train, 2), "val": _collect(val, 2), "len": len(train)}
    res["early"] = _collect(train, 1, stop_after=2)  # leaving early must not hang the next epoch
    res["after_early"] = _collect(train, 1)
    # skewed partition: rank 1 has no events in the first windows
    sp = partition_load(skew_root, "hash")
    sg = DistributedGraphStore(sp)
    ss = NeighborSampler(sg.num_nodes, 2, 4, TemporalNeighborSampleGraph(sp, "partitioned"),
                         policy="recent", workers=1)
    for strategy in ("random", "historical"):
        ld = DistributedDataLoader(sg, "train", ss, neg_sampler=NegativeSampling(strategy=strategy),
                                   batch_size=10, queue_size=3)
        res[f"skew_{strategy}"] = _collect(ld, 1)
    res.update(_pair_negatives(graph, sampler))
    return pack(res)


def _pair_negatives(graph, sampler, batch_size=120):
    """Historical / inductive negatives of val and test (k = 2), and how many distinct
    pairs each loader's rank holds."""
    out = {}
    for strategy in ("historical", "inductive"):
        for split in ("val", "test"):
            ld = DistributedDataLoader(graph, split, sampler, batch_size=batch_size, train=False,
                                       neg_sampler=NegativeSampling(strategy=strategy, num_neg=2, seed=7),
                                       queue_size=2)
            out[f"{strategy}_{split}"] = _collect(ld, 1)[0]
            sh = ld.negatives.pairs
            out[f"{strategy}_{split}_pairs"] = (sh.keys.numel(), sh.num_pairs)
    return out


def _per_event(steps):
    """``{eid: ((neg_src, neg_dst) x k)}`` of collected steps."""
    got = {}
    for x in steps:
        k, b = x["k"], x["eid"].numel()
        s, d = x["neg_src"].view(k, b).t(), x["neg"].view(k, b).t()
        got.update(zip(x["eid"].tolist(), zip(s.tolist(), d.tolist())))
    return got


@pytest.mark.distributed
def test_two_rank_loader(parts):
    g, s, out = parts
    r0, r1 = [unpack(b) for b in run_distributed(_loader_worker, 2, str(out / g.name),
                                                  str(out / s.name), timeout=240)]
    train_eids = g.eid[g.train_mask]
    for split, eids in (("train", train_eids), ("val", g.eid[g.val_mask])):
        for e in range(2):
            a, b = r0[split][e], r1[split][e]
            assert len(a) == len(b), "ranks ran different numbers of steps"
            seen = torch.cat([x["eid"] for x in a] + [x["eid"] for x in b])
            assert seen.numel() == eids.numel() and torch.equal(seen.sort().values, eids)
            for x, y in zip(a, b):
                assert x["window"] == y["window"]
                lo, hi = x["window"]
                for z in (x, y):  # global positions of the rank's events lie in the window
                    pos = torch.searchsorted(eids, z["eid"])
                    assert bool(((pos >= lo) & (pos < hi)).all())
    # chunk scheduling moved the boundaries between epochs; val windows did not move
    assert [x["window"] for x in r0["train"][0]] != [x["window"] for x in r0["train"][1]]
    assert [x["window"] for x in r0["val"][0]] == [x["window"] for x in r0["val"][1]]
    # evaluation negatives are fixed across epochs; training negatives change
    for rank in (r0, r1):
        assert all(torch.equal(x["neg"], y["neg"]) for x, y in zip(rank["val"][0], rank["val"][1]))
        n0 = torch.cat([x["neg"] for x in rank["train"][0]])
        n1 = torch.cat([x["neg"] for x in rank["train"][1]])
        assert not torch.equal(n0, n1)
    assert len(r0["early"][0]) == 2
    assert len(r0["after_early"][0]) == len(r1["after_early"][0])
    # skewed partition: rank 1 is empty in the first windows, yet both ranks finish together
    for strategy in ("random", "historical"):
        a, b = r0[f"skew_{strategy}"][0], r1[f"skew_{strategy}"][0]
        assert len(a) == len(b) == 7  # 140 training events / (10 * 2)
        assert b[0]["eid"].numel() == 0 and a[0]["eid"].numel() == 20
        seen = torch.cat([x["eid"] for x in a + b]).sort().values
        assert torch.equal(seen, s.eid[s.train_mask])
    # same negatives for the same event in one and two processes (val, random)
    pdata = partition_load(out / g.name, "random")
    graph = DistributedGraphStore(pdata)
    tg = TemporalNeighborSampleGraph(pdata, "full")
    sampler = NeighborSampler(graph.num_nodes, 2, [5, 3], tg, policy="uniform", workers=1)
    one = _collect(DistributedDataLoader(graph, "val", sampler, neg_sampler=NegativeSampling(),
                                         batch_size=300, train=False, queue_size=0))[0]
    neg1 = dict(zip(torch.cat([x["eid"] for x in one]).tolist(), torch.cat([x["neg"] for x in one]).tolist()))
    two = r0["val"][0] + r1["val"][0]
    neg2 = dict(zip(torch.cat([x["eid"] for x in two]).tolist(), torch.cat([x["neg"] for x in two]).tolist()))
    assert neg1 == neg2
    assert [x["window"] for x in one] == [x["window"] for x in r0["val"][0]]
    # historical / inductive: the same (src, dst) negatives for every event as one process
    # (whose batch is the 2-rank window), while each rank holds about half the pairs
    one = _pair_negatives(graph, NeighborSampler(graph.num_nodes, 1, 2, tg, workers=1), 240)
    for key in ("historical_val", "historical_test", "inductive_val", "inductive_test"):
        a, b = r0[key], r1[key]
        assert [x["window"] for x in a] == [x["window"] for x in b]
        two = _per_event(a + b)
        assert len(two) == sum(x["eid"].numel() for x in a + b)
        (n0, total), (n1, total1) = r0[key + "_pairs"], r1[key + "_pairs"]
        assert total == total1 == one[key + "_pairs"][1] and n0 + n1 == total
        assert max(n0, n1) < 0.6 * total, (n0, n1, total)
        assert one[key + "_pairs"][0] == total
        ref = _per_event(one[key])
        assert two.keys() == ref.keys()
        assert two == ref, key


def late_sources(graph, num_parts, seed=0):
    """A hand-made book for 2 parts: part 1 owns the nodes first seen as a source after the
    first quarter of the stream, so it owns no event (events go with their source) there."""
    q = graph.num_events // 4
    first = torch.full((graph.num_nodes,), graph.num_events, dtype=torch.long)
    first.scatter_reduce_(0, graph.src, torch.arange(graph.num_events), "amin")
    return (first >= q).long()


def _real_empty_rank_worker(root):
    from tgl_dist import DistributedContext
    DistributedContext.init()
    pdata = partition_load(root, "late_sources")
    graph = DistributedGraphStore(pdata)
    sampler = NeighborSampler(graph.num_nodes, 2, [5, 3], TemporalNeighborSampleGraph(pdata, "partitioned"),
                              policy="uniform", workers=1)
    res = {}
    for strategy in ("random", "historical"):
        ld = DistributedDataLoader(graph, "train", sampler, neg_sampler=NegativeSampling(strategy=strategy),
                                   batch_size=50, queue_size=2)
        res[strategy] = _collect(ld, 1)[0]
    val = DistributedDataLoader(graph, "val", sampler, neg_sampler=NegativeSampling(), batch_size=50,
                                train=False, queue_size=2)
    res["val"] = _collect(val, 1)[0]
    return pack(res)


@pytest.mark.distributed
def test_two_rank_loader_real_data_rank_without_events(datasets_root, tmp_path, monkeypatch):
    # CollegeMsg (real): rank 1 owns no event in the first quarter of the stream, i.e. in
    # the first windows; both ranks must still run the same steps and visit every event once
    from tgl_dist.data import load_dataset
    from tgl_dist.partition.registry import PARTITIONERS
    full = load_dataset("collegemsg", root=datasets_root, download=False)
    n = 3000
    g = TemporalGraph(full.src[:n], full.dst[:n], full.t[:n], num_nodes=full.num_nodes, name="collegemsg3k")
    monkeypatch.setitem(PARTITIONERS, "late_sources", late_sources)
    path = partition_graph(g, 2, "late_sources", tmp_path)
    owner = late_sources(g, 2)[g.src]
    assert not bool(owner[:n // 4].any()) and bool(owner.any())
    r0, r1 = [unpack(b) for b in run_distributed(_real_empty_rank_worker, 2, str(path.parent), timeout=120)]
    for split, eids in (("random", g.eid[g.train_mask]), ("historical", g.eid[g.train_mask]),
                        ("val", g.eid[g.val_mask])):
        a, b = r0[split], r1[split]
        assert len(a) == len(b) == -(-eids.numel() // 100), "ranks ran different numbers of steps"
        assert [x["window"] for x in a] == [x["window"] for x in b]
        seen = torch.cat([x["eid"] for x in a + b]).sort().values
        assert torch.equal(seen, eids)
        for x, y in zip(a, b):
            assert bool((owner[x["eid"]] == 0).all()) and bool((owner[y["eid"]] == 1).all())
    empty = [x["eid"].numel() == 0 for x in r1["random"]]
    assert sum(empty) >= 5 and empty[0] and not all(empty)


class RecordingMailbox:
    def __init__(self):
        self.calls = []

    def prepare_input(self, mfgs):
        self.calls.append((threading.current_thread() is threading.main_thread(), len(mfgs)))


def test_single_process_chronological_and_mailbox_hook(parts):
    g, _, out = parts
    pdata = partition_load(out / g.name, "random")
    graph = DistributedGraphStore(pdata)
    sampler = NeighborSampler(graph.num_nodes, 1, 10, TemporalNeighborSampleGraph(pdata, "full"),
                              workers=1)
    mb = RecordingMailbox()
    ld = DistributedDataLoader(graph, "train", sampler, neg_sampler=NegativeSampling(num_neg=3),
                               batch_size=256, queue_size=2, mailbox=mb)
    steps = _collect(ld)[0]
    assert len(steps) == len(ld) == -(-int(g.train_mask.sum()) // 256)
    eids = torch.cat([x["eid"] for x in steps])
    assert torch.equal(eids, g.eid[g.train_mask])  # plain chronological batching
    assert all(x["eid"].numel() == 256 for x in steps[:-1])
    assert mb.calls and all(main and n == 1 for main, n in mb.calls)
    assert len(mb.calls) == len(steps)
    with pytest.raises(ValueError, match="shuffle"):
        DistributedDataLoader(graph, "train", sampler, shuffle=True, mailbox=mb)
    with pytest.raises(ValueError, match="chunk_size"):
        DistributedDataLoader(graph, "train", sampler, batch_size=100, chunk_size=30)
    # drop_last and no sampler (memory-only models get one edge-less block over the roots)
    ld = DistributedDataLoader(graph, "val", None, neg_sampler=None, batch_size=256, drop_last=True,
                               train=False, queue_size=0)
    steps = list(ld)
    assert all(len(r) == 256 for r, _, _, _ in steps)
    r, mfgs, meta, _ = steps[0]
    assert len(mfgs) == 1 and mfgs[0].num_edges == 0 and mfgs[0].num_dst == 512


def test_evaluation_negatives_are_never_the_positive_destination(parts):
    """TGB filters the positive out of the candidates an MRR ranks; training keeps
    TGN/DyGLib's unfiltered draws."""
    g, _, out = parts
    pdata = partition_load(out / g.name, "random")
    graph = DistributedGraphStore(pdata)
    collide = {}
    for split, train in (("test", False), ("train", True)):
        ld = DistributedDataLoader(graph, split, None, neg_sampler=NegativeSampling(num_neg=30),
                                   batch_size=200, train=train, queue_size=0)
        n = 0
        for roots, _, meta, _ in ld:
            neg = roots.nodes[meta["dst_neg_index"]].view(30, -1)
            n += int((neg == roots.dst.view(1, -1)).sum())
        collide[split] = n
    assert collide["test"] == 0 and collide["train"] > 0, collide


def test_random_negatives_are_scored_against_their_own_events_source(parts):
    # k = 3 negatives per event, negative-major: negative j of event i is row j*B + i of
    # dst_neg_index, and its source must be event i's source
    g, _, out = parts
    graph = DistributedGraphStore(partition_load(out / g.name, "random"))
    ld = DistributedDataLoader(graph, "train", None, neg_sampler=NegativeSampling(num_neg=3),
                               batch_size=100, queue_size=0)
    roots, _, meta, _ = next(iter(ld))
    B = roots.src.numel()
    assert meta["neg_k"] == 3 and meta["dst_neg_index"].numel() == 3 * B
    assert torch.equal(roots.nodes[meta["src_neg_index"]], roots.src.repeat(3))
    assert torch.equal(roots.nodes[meta["dst_neg_index"]], roots.extra["neg_dst"])


def test_evaluation_draws_from_all_destinations_and_is_the_same_every_epoch(parts):
    # val / test negatives come from the destinations of the whole stream (not the
    # split's own), and evaluation batches, negatives and uniform neighbour draws do not
    # change between epochs (chunk offsets and sampling seeds are for training only)
    g, _, out = parts
    pdata = partition_load(out / g.name, "random")
    graph = DistributedGraphStore(pdata)
    sampler = NeighborSampler(graph.num_nodes, 1, 3, TemporalNeighborSampleGraph(pdata, "full"),
                              policy="uniform", workers=1)
    ld = DistributedDataLoader(graph, "val", sampler, neg_sampler=NegativeSampling(),
                               batch_size=200, chunk_size=50, train=False, queue_size=0)
    assert torch.equal(ld.negatives.pool, torch.unique(g.dst))
    assert not torch.equal(ld.negatives.pool, torch.unique(g.dst[g.val_mask]))

    def epoch():
        return [(roots.eids, roots.nodes, mfgs[0].edata["ID"]) for roots, mfgs, _, _ in ld]
    first, second = epoch(), epoch()
    assert len(first) == len(second) == len(ld)
    for a, b in zip(first, second):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    # training does change them: its chunk offset and neighbour draws depend on the epoch
    tr = DistributedDataLoader(graph, "train", sampler, neg_sampler=NegativeSampling(),
                               batch_size=200, chunk_size=50, queue_size=0, seed=1)
    e0 = [mfgs[0].edata["ID"] for _, mfgs, _, _ in tr]
    e1 = [mfgs[0].edata["ID"] for _, mfgs, _, _ in tr]
    assert not all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(e0, e1))


def test_prefetch_thread_uses_the_iterating_threads_gpu(parts, monkeypatch):
    # CUDA's current device is per thread and a new thread starts on GPU 0, so on rank r
    # of an NCCL run the producer's exchanges would go to GPU 0 unless it takes the
    # iterating thread's device (no GPU here: the CUDA state is faked)
    g, _, out = parts
    pdata = partition_load(out / g.name, "random")
    graph = DistributedGraphStore(pdata)
    sampler = NeighborSampler(graph.num_nodes, 1, 3, TemporalNeighborSampleGraph(pdata, "full"),
                              policy="recent", workers=1)
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda d: calls.append((threading.current_thread().name, d)))
    ld = DistributedDataLoader(graph, "val", sampler, neg_sampler=NegativeSampling(),
                               batch_size=500, train=False, queue_size=2)
    assert len(list(ld)) == len(ld)
    assert calls == [("tgl_dist-loader-val", 3)]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task")
                    or "parallel backend: OpenMP" not in torch.__config__.parallel_info(),
                    reason="counts the process's threads in Linux's /proc; torch on OpenMP")
def test_prefetch_thread_runs_its_operators_on_one_openmp_thread(parts, monkeypatch):
    # A parallel-sized operator in the producer (e.g. the sampler building its records on
    # first use) gave that thread an OpenMP team of its own. With more OpenMP threads than
    # cores libgomp stops spin-waiting, and the training thread's steps took twice as long.
    g, _, out = parts
    graph = DistributedGraphStore(partition_load(out / g.name, "random"))
    ld = DistributedDataLoader(graph, "val", None, neg_sampler=NegativeSampling(), batch_size=500,
                               train=False, queue_size=2)
    threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
    seen, make = [], DistributedDataLoader._make

    def big_make(self, w, epoch):
        torch.ones(1 << 20).mul_(2)  # parallel-sized on more than one thread
        seen.append((threading.current_thread().name, torch.get_num_threads(), threads()))
        return make(self, w, epoch)

    monkeypatch.setattr(DistributedDataLoader, "_make", big_make)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.ones(1 << 20).mul_(2)  # the iterating thread's own team exists before the count
        before = threads()
        assert len(list(ld)) == len(ld)
        assert torch.get_num_threads() == 2  # the iterating thread keeps its setting
    finally:
        torch.set_num_threads(old)
    assert seen and all(name == "tgl_dist-loader-val" and n == 1 for name, n, _ in seen)
    assert max(t for _, _, t in seen) <= before + 1, "the producer started OpenMP workers"


def test_iteration_abandoned_with_a_full_queue_does_not_hang_the_next(parts):
    # before: the producer blocked forever putting its end marker into the full queue,
    # and the next iteration waited for it
    g, _, out = parts
    graph = DistributedGraphStore(partition_load(out / g.name, "random"))
    ld = DistributedDataLoader(graph, "val", None, neg_sampler=NegativeSampling(), batch_size=60,
                               train=False, queue_size=4)
    it = iter(ld)
    first = next(it)                 # a peek at one batch; the iterator stays alive
    deadline = time.monotonic() + 20
    while ld._queue.qsize() < 4 and ld._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)             # the producer fills the queue
    done = []
    th = threading.Thread(target=lambda: done.append(len(list(ld))), daemon=True)
    th.start()
    th.join(60)
    assert done == [len(ld)], "the next iteration hung on the abandoned one's producer"
    assert torch.equal(list(ld)[0][0].eids, first[0].eids)
    del it                           # closing the old iterator leaves a newer iteration alone


def test_bad_loader_arguments_name_the_argument(parts):
    g, _, out = parts
    pdata = partition_load(out / g.name, "random")
    graph = DistributedGraphStore(pdata)
    for kw, match in ((dict(batch_size=2.7), "batch_size must be an integer >= 1, got 2.7"),
                      (dict(batch_size="100"), "batch_size must be an integer"),
                      (dict(queue_size=-3), "queue_size must be an integer >= 0, got -3"),
                      (dict(chunk_size=0), "chunk_size must be an integer >= 1, got 0")):
        with pytest.raises(ValueError, match=match):
            DistributedDataLoader(graph, "train", **kw)
    with pytest.raises(TypeError, match="sampler must be a NeighborSampler or None, got "
                                        "TemporalNeighborSampleGraph"):
        DistributedDataLoader(graph, "train", TemporalNeighborSampleGraph(pdata, "full"))
    with pytest.raises(TypeError, match="neg_sampler must be a NegativeSampling"):
        DistributedDataLoader(graph, "train", neg_sampler="random")
    ld = DistributedDataLoader(graph, "train", batch_size=1000, queue_size=0)
    ld.set_epoch(0, start_step=len(ld))
    assert list(ld) == []            # resuming at the end of an epoch: nothing left
    ld.set_epoch(0, start_step=len(ld) + 1)
    with pytest.raises(ValueError, match=rf"start_step={len(ld) + 1}\) but epoch 0 of 'train' "
                                         rf"has {len(ld)} steps"):
        list(ld)


def _mismatch_worker(root):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    graph = DistributedGraphStore(partition_load(root, "random"))
    errors = []
    for kw in (dict(batch_size=50 + 20 * ctx.rank), dict(seed=ctx.rank, chunk_size=10),
               dict(drop_last=bool(ctx.rank))):
        try:
            DistributedDataLoader(graph, "train", batch_size=kw.pop("batch_size", 50),
                                  queue_size=0, **kw)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    DistributedDataLoader(graph, "train", batch_size=50, queue_size=0)   # the same: fine
    return errors


@pytest.mark.distributed
def test_loader_arguments_that_differ_between_ranks_are_refused(parts):
    # before: different batch sizes deadlocked in a later collective; a per-rank seed with
    # chunk scheduling silently misaligned the windows
    g, _, out = parts
    r0, r1 = run_distributed(_mismatch_worker, 2, str(out / g.name), timeout=120)
    assert r0 == r1
    assert r0 == ["DistributedDataLoader('train'): batch_size differs between ranks (rank 0: 50, "
                  "rank 1: 70); every rank must pass the same value",
                  "DistributedDataLoader('train'): seed differs between ranks (rank 0: 0, rank 1: "
                  "1); every rank must pass the same value",
                  "DistributedDataLoader('train'): drop_last differs between ranks (rank 0: 0, "
                  "rank 1: 1); every rank must pass the same value"]
