"""TGN on real partitions: 2 ranks end an epoch with the memory and mailbox of 1 process,
with fixed parameters and when training them; every memory model when a rank has no
event in many steps."""
from pathlib import Path

import numpy as np
import pytest
import torch

from tgl_dist.testing import run_distributed

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
GLOBAL_BATCH = 120


def _epoch(root: str, train: bool = False, config: str = "TGN.yml", split: str = "train",
           global_batch: int = GLOBAL_BATCH, deferred: bool = True):
    from tgl_dist import DistributedContext
    from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
    from tgl_dist.loader import DistributedDataLoader
    from tgl_dist.memory import SharedMailBox
    from tgl_dist.ctdg import build_model, load_config, run_epoch
    from tgl_dist.optim import build_optimizer
    from tgl_dist.partition import partition_load
    from tgl_dist.sampling import NegativeSampling, NeighborSampler

    ctx = DistributedContext.init()
    pdata = partition_load(root, "hash")
    graph = DistributedGraphStore(pdata)
    cfg = load_config(CONFIGS / config)
    smp = cfg.sampling
    sampler = NeighborSampler(graph.num_nodes, smp.layer, list(smp.neighbor),
                              TemporalNeighborSampleGraph(pdata, mode="partitioned"))
    mb = SharedMailBox(int(pdata.ids.numel()), cfg.memory, graph.edge_feat_dim,
                       partition_book=pdata.book)
    if not deferred:   # each step's write-back sent at once (5 all-to-alls a step)
        import contextlib
        mb.deferred_writes = contextlib.nullcontext
    loader = DistributedDataLoader(graph, split, sampler=sampler,
                                   neg_sampler=NegativeSampling("triplet", "random", 1),
                                   batch_size=global_batch // ctx.world_size, train=False,
                                   mailbox=mb, queue_size=0)
    torch.manual_seed(0)  # same parameters on every rank and in the 1-process run
    model = build_model(cfg, graph.node_feat_dim, graph.edge_feat_dim)
    if train:  # no dropout: the only randomness left is the negatives, keyed by event id
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
            if name.endswith("time_enc"):
                # frozen: TGN encodes raw seconds, so a rounding-size change of a trained
                # frequency moves cos(dt w) by ~1e-4 and two exact-in-theory runs drift
                # apart chaotically within a few Adam steps (measured); everything else trains
                m.requires_grad_(False)
        opt = build_optimizer(model, lr=1e-3)
        run_epoch(model, loader, mb, opt)
    else:
        with torch.no_grad():  # deterministic updates: eval mode, no dropout, fixed parameters
            run_epoch(model, loader, mb)
    ids = pdata.ids if pdata.ids is not None else torch.arange(graph.num_nodes)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return tuple(np.array(x.numpy(), copy=True) for x in
                 (ids, mb.memory, mb.memory_ts, mb.mailbox, mb.mail_ts, params))


def _graph(tmp_path):
    from tgl_dist.data import TemporalGraph, generate_synthetic
    from tgl_dist.partition import partition_graph

    s = generate_synthetic(num_nodes=80, num_events=1200, seed=3)
    # distinct event times, so "latest" orders every pair of updates the same way in any run
    g = TemporalGraph(s.src, s.dst, s.t + torch.arange(s.num_events) * 1e-3,
                      num_nodes=s.num_nodes, name="synthetic")
    assert g.t.unique().numel() == g.num_events  # no equal times: one order for every run
    for P in (1, 2):
        partition_graph(g, P, "hash", tmp_path)
    return g, str(tmp_path / g.name)


def _gather(results, N):
    """Both ranks' node state in global node order, and rank 0's parameters."""
    got, owned, params = None, torch.zeros(N, dtype=torch.long), []
    for arrays in results:
        ids, *state, p = (torch.from_numpy(a) for a in arrays)
        assert state[0].size(0) == ids.numel() < N  # each rank holds its own nodes only
        if got is None:
            got = [torch.zeros((N,) + tuple(x.shape[1:]), dtype=x.dtype) for x in state]
        owned[ids] += 1
        for dst, src in zip(got, state):
            dst[ids] = src
        params.append(p)
    assert bool((owned == 1).all())
    return got, params


def _same_state(got, ref, atol):
    """2 ranks' gathered node state equals 1 process's: memory and mailbox within ``atol``
    (float rounding), their timestamps exactly."""
    assert torch.allclose(got[0], ref[1], atol=atol)       # memory
    assert torch.equal(got[1], ref[2])                     # memory_ts
    assert torch.allclose(got[2], ref[3], atol=atol)       # mailbox
    assert torch.equal(got[3], ref[4])                     # mail_ts


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_equal_one_process_on_real_partitions(tmp_path):
    g, root = _graph(tmp_path)
    ref = [torch.from_numpy(a) for a in _epoch(root)]
    assert float(ref[1].abs().sum()) > 0
    got, _ = _gather(run_distributed(_epoch, 2, root), g.num_nodes)
    _same_state(got, ref, atol=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_train_like_one_process(tmp_path):
    # an epoch of training (Adam, no dropout): run_epoch scales each rank's loss by its
    # share of the window's events, so the averaged gradients are the 1-process gradients
    # and both runs take the same optimizer steps (up to float rounding); the gradient
    # all-reduce overlaps the mailbox update, which must not change what the next step reads
    g, root = _graph(tmp_path)
    ref = [torch.from_numpy(a) for a in _epoch(root, True)]
    init = torch.from_numpy(_epoch(root)[5])               # evaluation leaves them as built
    got, params = _gather(run_distributed(_epoch, 2, root, True), g.num_nodes)
    assert torch.equal(params[0], params[1])               # replicas stay identical
    assert (ref[5] - init).abs().max() > 1e-3              # training moved the parameters
    # measured: 3.6e-6 apart after moving 7e-3 (Intel Xeon VM); without the loss scaling
    # of run_epoch (plain mean of the ranks' means over their 61 / 59 events) 7.5e-3 apart.
    # On an AMD EPYC VM with the compiled kernels the two runs part at one late step: 1.1 %
    # of the entries end up to 0.9e-3 (one Adam step) apart, and the memory as much, while
    # batch sizes 130-2000 agree within 3e-6 and the torch paths within 4e-6 at this one;
    # a unit whose input is within rounding of 0 (a ReLU, a gradient's sign under Adam)
    # took another side. So: nearly every entry within rounding, none beyond two steps.
    d = (params[0] - ref[5]).abs()
    assert float((d > 5e-5).float().mean()) < 0.02 and float(d.max()) < 2e-3, float(d.max())
    _same_state(got, ref, atol=2e-3)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("config", ["TGN.yml", "JODIE.yml", "APAN.yml"])
def test_a_rank_without_events_in_a_step_takes_part_with_an_empty_batch(tmp_path, config):
    # one event per rank per window: in many windows both events belong to one rank and
    # the other runs the model, the mailbox update and every collective on an empty batch
    # (the GRU / RNN / attention updaters once failed there on reshapes to [0, -1])
    g, root = _graph(tmp_path)
    ref = [torch.from_numpy(a) for a in _epoch(root, False, config, "test", 2)]
    got, _ = _gather(run_distributed(_epoch, 2, root, False, config, "test", 2, timeout=180),
                     g.num_nodes)
    assert float(ref[1].abs().sum()) > 0
    _same_state(got, ref, atol=1e-5)


def _deferred_and_not(root: str):
    """Each config's epoch with the write-back deferred and sent at once, in one spawn."""
    return [(_epoch(root, False, config, "train", GLOBAL_BATCH, False),
             _epoch(root, False, config)) for config in ("TGN.yml", "APAN.yml")]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.skipif(__import__("os").environ.get("TGL_DIST_NO_KERNEL") == "1",
                    reason="TGL_DIST_NO_KERNEL=1: exchange logic above the kernels, tested in the first run")
def test_deferred_write_back_changes_nothing(tmp_path):
    # run_epoch sends a step's write-back with the next step's memory request: every
    # owner writes before it serves, so the state is bit for bit that of sending it at
    # once (TGN: one write a step; APAN: mails to neighbours, mean-combined, two writes)
    g, root = _graph(tmp_path)
    per_rank = run_distributed(_deferred_and_not, 2, root)
    for c in range(2):
        now = _gather([r[c][0] for r in per_rank], g.num_nodes)[0]
        later = _gather([r[c][1] for r in per_rank], g.num_nodes)[0]
        assert float(now[0].abs().sum()) > 0
        for a, b in zip(now, later):
            assert torch.equal(a, b)


def _read_worker():
    from tgl_dist import DistributedContext
    from tgl_dist.dist import PartitionBook
    from tgl_dist.memory import SharedMailBox

    ctx = DistributedContext.init()
    book = PartitionBook(torch.tensor([0, 1, 0, 1, 1, 0]))
    mb = SharedMailBox(3, {"dim_out": 4, "mailbox_size": 2}, 0, partition_book=book)
    mb.memory += ctx.rank + 1
    got = mb.read_unique(torch.tensor([1, 2, 2, 5]))
    return got["mem"].is_contiguous(), got["mail"].is_contiguous(), got["mem"][:, 0].tolist()


@pytest.mark.distributed
def test_remote_reads_are_contiguous():
    # the compiled GRU cell and attention take their fast path only on contiguous rows: a
    # column slice of the received buffer once sent 2 ranks down torch's slower ops
    for mem_c, mail_c, first in run_distributed(_read_worker, 2):
        assert mem_c and mail_c
        assert first == [2.0, 1.0, 1.0]
