"""CTDG models with a config ``node_embedding``: building, optimizer wiring, 2 ranks == 1 process."""
import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from blocks_util import make_batch
from tgl_dist.ctdg import ConfigError, build_model, load_config, parse_config
from tgl_dist.optim import TrainOptimizer, build_optimizer
from tgl_dist.ctdg.builder import FeatureEmbeddingLinkModel
from tgl_dist.ctdg.training import link_loss
from tgl_dist.nn import DistEmbedding
from tgl_dist.optim import SparseAdagrad, SparseAdam, SparseOptimizer
from tgl_dist.testing import run_distributed

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EMB_CONFIG = CONFIGS / "TGN-embedding.yml"


def _raw(name="TGN"):
    return yaml.safe_load((CONFIGS / f"{name}.yml").read_text())


class SparseSGD(SparseOptimizer):
    """w -= lr * g on the touched rows: unlike Adam/Adagrad it is not scale-invariant, so
    a wrong gradient scale shows up in the parameters."""

    def init_state(self, emb):
        return {}

    def update(self, emb, rows, grad, state):
        emb.weight.index_add_(0, rows, grad, alpha=-self.lr)


# ---------------------------------------------------------------- config and build
def test_shipped_embedding_config():
    cfg = load_config(EMB_CONFIG)
    assert cfg.node_embedding.enabled and cfg.node_embedding.dim == 100
    assert cfg.node_embedding.optimizer == "adam" and cfg.node_embedding.lr == 0.001
    base = load_config(CONFIGS / "TGN.yml")
    assert not base.node_embedding.enabled  # absent section = off
    for sec in ("sampling", "memory", "gnn", "train"):  # otherwise the TGN config
        assert getattr(cfg, sec) == getattr(base, sec)


def test_every_shipped_embedding_config_is_its_base_plus_the_section():
    for path in sorted(CONFIGS.glob("*-embedding.yml")):
        cfg, base = load_config(path), load_config(CONFIGS / f"{path.stem.split('-')[0]}.yml")
        assert cfg.node_embedding.enabled, path
        for sec in ("sampling", "memory", "gnn"):
            assert getattr(cfg, sec) == getattr(base, sec), (path, sec)
        train = cfg.train
        if path.stem == "TGN_DyGLib-embedding":   # the example's default: its own budget
            assert (train.epoch, train.patience) == (30, 5)
            train = dataclasses.replace(train, epoch=base.train.epoch, patience=base.train.patience)
        assert train == base.train, path
        build_model(cfg, 0, 0, num_nodes=10)


@pytest.mark.parametrize("section, path", [
    ({"dim": -1}, "node_embedding.dim"),
    ({"dim": 8, "optimizer": "sgd"}, "node_embedding.optimizer"),
    ({"dim": 8, "lr": "fast"}, "node_embedding.lr"),  # ("1e-3", a string to YAML 1.1, is read)
    ({"dim": 8, "size": 3}, "node_embedding.size"),
])
def test_node_embedding_config_errors_name_the_field(section, path):
    raw = _raw()
    raw["node_embedding"] = [section]
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        parse_config(raw)


def test_build_featureless_and_with_features():
    cfg = load_config(EMB_CONFIG)
    m = build_model(cfg, 0, 4, num_nodes=40)
    assert isinstance(m.node_embedding, DistEmbedding) and type(m).__name__ == "TemporalLinkModel"
    assert m.node_embedding.grad_reduction == "mean"
    assert m.memory_updater.node_feat_map is None  # D = d_m: s^ + embedding, no projection
    assert not any(p is m.node_embedding.weight for p in m.parameters())  # not a dense parameter
    # features: the input is [features || embedding]
    m2 = build_model(cfg, 8, 4, num_nodes=40)
    assert isinstance(m2, FeatureEmbeddingLinkModel)
    assert m2.memory_updater.node_feat_map.in_features == 108
    _, mfgs, _ = make_batch(5, 40, [10], dim_node=8, dim_edge=4, seed=1)
    x = m2.node_input(mfgs[0])
    ids = mfgs[0].srcdata["ID"]
    assert torch.equal(x[:, :8], mfgs[0].srcdata["h"])
    assert torch.equal(x[:, 8:], m2.node_embedding.weight[ids])


def test_build_errors():
    cfg = load_config(EMB_CONFIG)
    with pytest.raises(ConfigError, match="num_nodes"):
        build_model(cfg, 0, 0)
    raw = _raw("APAN")
    raw["node_embedding"] = {"dim": 8}
    with pytest.raises(ConfigError, match="combine_node_feature"):
        build_model(parse_config(raw), 0, 0, num_nodes=10)
    with pytest.raises(ConfigError, match="node_embedding module too"):
        build_model(cfg, 0, 0, torch.nn.Linear(1, 1), num_nodes=10)


def test_build_optimizer_honours_the_section():
    cfg = load_config(EMB_CONFIG)
    opt = build_optimizer(build_model(cfg, 0, 0, num_nodes=30), lr=1e-4)
    assert isinstance(opt.sparse, SparseAdam) and opt.sparse.lr == 1e-3
    assert opt.dense.param_groups[0]["lr"] == 1e-4
    cfg2 = cfg.replace(node_embedding={"optimizer": "adagrad", "lr": None})
    opt2 = build_optimizer(build_model(cfg2, 0, 0, num_nodes=30), lr=1e-4)
    assert isinstance(opt2.sparse, SparseAdagrad) and opt2.sparse.lr == 1e-4  # lr: train.lr
    # explicit arguments win over the section
    opt3 = build_optimizer(build_model(cfg, 0, 0, num_nodes=30), lr=1e-4, sparse_lr=0.5,
                           sparse_optimizer="adagrad")
    assert isinstance(opt3.sparse, SparseAdagrad) and opt3.sparse.lr == 0.5
    with pytest.raises(ValueError, match="unknown sparse optimizer"):
        build_optimizer(build_model(cfg, 0, 0, num_nodes=30), lr=1e-4, sparse_optimizer="sgd")


def _train_steps(model, opt, steps=3, num_nodes=40, B=6):
    seen = []
    model.node_embedding.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
    from tgl_dist.memory import SharedMailBox
    mb = SharedMailBox(num_nodes, load_config(EMB_CONFIG).memory, 0)
    for step in range(steps):
        roots, mfgs, meta = make_batch(B, num_nodes, [10], t0=100.0 + 20 * step, seed=step)
        mb.prepare_input(mfgs)
        out = model(mfgs, meta)
        opt.zero_grad()
        link_loss(*out).backward()
        opt.step()
        mb.update(out.memory, roots, meta["src_pos_index"], meta["dst_pos_index"], None,
                  out.embedding, out.mail_uses_embedding, mfgs[-1])
    return torch.cat(seen).unique()


def test_training_moves_only_looked_up_rows_and_checkpoints():
    torch.manual_seed(0)
    cfg = load_config(EMB_CONFIG).replace(train={"dropout": 0.0, "att_dropout": 0.0})
    model = build_model(cfg, 0, 0, num_nodes=400)
    opt = build_optimizer(model, lr=1e-3)
    w0 = model.node_embedding.weight.clone()
    used = _train_steps(model, opt, num_nodes=400, B=4)
    moved = (model.node_embedding.weight != w0).any(1)
    untouched = torch.ones(400, dtype=torch.bool)
    untouched[used] = False
    assert untouched.sum() > 100 and moved.sum() > 0
    assert not moved[untouched].any()          # rows never looked up never change
    # checkpoint: {'dense', 'sparse'}; a restored model + optimizer continues identically
    state = {"model": {k: v.clone() for k, v in model.state_dict().items()},
             "opt": copy.deepcopy(opt.state_dict())}  # as torch.save would: no shared tensors
    assert set(state["opt"]) == {"dense", "sparse"}
    torch.manual_seed(1)
    clone = build_model(cfg, 0, 0, num_nodes=400)
    clone.load_state_dict(state["model"])
    opt2 = build_optimizer(clone, lr=1e-3)
    opt2.load_state_dict(state["opt"])
    torch.manual_seed(5)
    _train_steps(model, opt, steps=1, num_nodes=400, B=4)
    torch.manual_seed(5)
    _train_steps(clone, opt2, steps=1, num_nodes=400, B=4)
    assert torch.equal(model.node_embedding.weight, clone.node_embedding.weight)
    for (n, a), b in zip(model.named_parameters(), clone.parameters()):
        assert torch.equal(a, b), n


def test_empty_batch_still_looks_up():
    """A rank with no events in a step must still call the (collective) lookup.

    TGAT (no memory): the memory updaters do not accept an empty batch yet (reported)."""
    raw = _raw("TGAT")
    raw["node_embedding"] = {"dim": 8}
    model = build_model(parse_config(raw), 0, 0, num_nodes=20)
    calls = []
    model.node_embedding.register_forward_pre_hook(lambda m, a: calls.append(a[0].numel()))
    _, mfgs, meta = make_batch(0, 20, [10, 10])
    pos, neg = model(mfgs, meta)
    assert calls == [0] and pos.numel() == 0 and neg.numel() == 0
    (pos.sum() + neg.sum()).backward()          # an empty step records no gradient rows
    ids, grad = model.node_embedding.take_grads()
    assert ids.numel() == 0 and grad.shape == (0, 8)


# ---------------------------------------------------------------- 2 ranks == 1 process
GLOBAL_BATCH = 40


def _graph():
    """Event i has a source of parity i % 2: with hash partitions over 2 ranks (owner = id % 2)
    every window of an even number of events gives both ranks the same number of events, so
    the mean of the ranks' mean losses is the 1-process loss."""
    from tgl_dist.data import TemporalGraph
    g = torch.Generator().manual_seed(7)
    E, N = 520, 60
    src = 2 * torch.randint(0, N // 2, (E,), generator=g) + torch.arange(E) % 2
    dst = torch.randint(0, N, (E,), generator=g)
    return TemporalGraph(src, dst, torch.arange(E, dtype=torch.float64), num_nodes=N + 20,
                         name="parity")  # 20 nodes without events


def _train_run(root: str, optimizer: str, steps: int):
    from tgl_dist import DistributedContext
    from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
    from tgl_dist.loader import DistributedDataLoader
    from tgl_dist.memory import SharedMailBox
    from tgl_dist.ctdg import run_epoch
    from tgl_dist.dist import broadcast_parameters
    from tgl_dist.partition import partition_load
    from tgl_dist.sampling import NegativeSampling, NeighborSampler

    ctx = DistributedContext.init()
    pdata = partition_load(root, "hash")
    graph = DistributedGraphStore(pdata)
    cfg = load_config(EMB_CONFIG).replace(train={"dropout": 0.0, "att_dropout": 0.0},
                                          node_embedding={"dim": 16})
    sampler = NeighborSampler(graph.num_nodes, 1, [5],
                              TemporalNeighborSampleGraph(pdata, mode="partitioned"))
    mb = SharedMailBox(int(pdata.ids.numel()), cfg.memory, graph.edge_feat_dim,
                       partition_book=pdata.book)
    loader = DistributedDataLoader(graph, "train", sampler=sampler,
                                   neg_sampler=NegativeSampling("triplet", "random", 1),
                                   batch_size=GLOBAL_BATCH // ctx.world_size, train=True,
                                   drop_last=True, mailbox=mb, queue_size=0)
    torch.manual_seed(ctx.rank)  # different dense init per rank: broadcast_parameters fixes it
    model = build_model(cfg, graph.node_feat_dim, graph.edge_feat_dim,
                        num_nodes=graph.num_nodes, partition_book=pdata.book)
    broadcast_parameters(model)
    emb = model.node_embedding
    w0 = emb.full_table()
    lookups = []
    emb.register_forward_pre_hook(lambda m, a: lookups.append(a[0].clone()))
    if optimizer == "sgd":  # not scale-invariant: checks the gradient scaling exactly
        opt = TrainOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                             SparseSGD([emb], lr=0.05))
    else:
        opt = build_optimizer(model, lr=1e-3)
        # Adam's first steps move every weight by ~lr x sign(g): with the default eps a
        # near-zero gradient whose sign depends on summation order (1 vs 2 ranks) would
        # move a weight by lr either way. eps=1e-6 keeps the update Lipschitz in g, so
        # the comparison below checks the distributed optimizer state, not roundoff
        for group in opt.dense.param_groups:
            group["eps"] = 1e-6
        opt.sparse.eps = 1e-6
    steps_done = 0

    class _Limited:
        def __iter__(self):
            nonlocal steps_done
            for i, step in enumerate(loader):
                if i < steps:
                    steps_done += 1
                    yield step
    run_epoch(model, _Limited(), mb, opt)
    loader._join()
    from tgl_dist.dist import all_gather_v
    seen = all_gather_v(torch.cat(lookups).unique()).unique()
    table = emb.full_table()
    dense = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    out = (table.numpy(), w0.numpy(), dense.numpy(), seen.numpy(), steps_done, len(lookups),
           emb.num_owned)
    return tuple(np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in out)


def _two_runs(root: str, steps: int):
    return [_train_run(root, opt, steps) for opt in ("sgd", "config")]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_train_like_one_process(tmp_path):
    from tgl_dist.partition import partition_graph
    g = _graph()
    for P in (1, 2):
        partition_graph(g, P, "hash", tmp_path)
    root = str(tmp_path / g.name)
    steps = 5
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the workers: the same reduction order inside each op
    try:
        ref = _two_runs(root, steps)
    finally:
        torch.set_num_threads(threads)
    got = run_distributed(_two_runs, 2, root, steps)
    N = g.num_nodes
    for k, name in enumerate(("sgd", "config")):
        table1, w0, dense1, seen1, n1, calls1, owned1 = ref[k]
        assert n1 == steps and calls1 == steps and owned1 == N
        r0, r1 = got[0][k], got[1][k]
        assert r0[4] == r1[4] == steps and r0[5] == r1[5] == steps  # a lookup every step
        assert r0[6] + r1[6] == N and 0 < r0[6] < N                 # each rank: its own rows
        assert np.array_equal(r0[1], w0)                            # same init in any world
        assert np.array_equal(seen1, r0[3])                         # same rows looked up
        # SGD is exact up to summation order (this run checks the gradient scaling); Adam
        # (eps 1e-6, see _train_run) within 1e-5 over lr x steps = 5e-3 of movement
        tol = 2e-6 if name == "sgd" else 1e-5
        for r in (r0, r1):
            np.testing.assert_allclose(r[0], table1, atol=tol, rtol=0, err_msg=name)
            np.testing.assert_allclose(r[2], dense1, atol=tol, rtol=0, err_msg=name)
        untouched = np.ones(N, dtype=bool)
        untouched[seen1] = False
        assert untouched.sum() >= 20
        assert np.array_equal(table1[untouched], w0[untouched])     # never looked up: unchanged
        assert np.abs(table1[~untouched] - w0[~untouched]).max() > 1e-4  # the rest trained


@pytest.mark.slow
@pytest.mark.distributed
def test_train_tgn_example_with_embedding_two_processes(tmp_path):
    """examples/ctdg/train_tgn.py with configs/TGN-embedding.yml under torchrun (featureless data)."""
    import json
    import os
    import subprocess
    import sys
    repo = CONFIGS.parent
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(repo / "examples" / "ctdg" / "train_tgn.py"), "--config", str(EMB_CONFIG),
           "--partition-algo", "hash", "--parts", str(tmp_path / "parts"), "--num-nodes", "60",
           "--num-events", "1500", "--batch-size", "100", "--eval-neg", "3", "--epochs", "1",
           "--no-progress", "--threads", "1", "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(repo))
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads([ln for ln in p.stdout.splitlines() if ln.strip()][-1])
    assert out["model"] == "TGN-embedding" and out["world_size"] == 2
    assert 0.0 <= out["test_ap"] <= 1.0 and out["epochs"] == 1
