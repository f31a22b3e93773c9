"""Checkpoint content (dense vs per-rank parts), the checkpoint policy, and the fault hook."""
import copy
import random

import numpy as np
import pytest
import torch
from torch import nn

from tgl_dist.checkpoint import (CheckpointError, Every, RunCheckpoint, capture, join_nested,
                                 restore, split_nested, split_state_dict)
from tgl_dist.dist import PartitionBook
from tgl_dist.optim import build_optimizer
from tgl_dist.testing import maybe_inject_fault
from tgl_dist.nn import DistEmbedding


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.emb = DistEmbedding(10, 4, PartitionBook(torch.zeros(10, dtype=torch.long)), "emb")

    def forward(self, ids):
        return self.lin(self.emb(ids)).sum()


class Box:  # a stand-in mailbox (state_dict / load_state_dict of this rank's rows)
    def __init__(self):
        self.memory = torch.zeros(5, 3)

    def state_dict(self):
        return {"memory": self.memory.clone()}

    def load_state_dict(self, s):
        self.memory.copy_(s["memory"])


def _train(net, opt, steps):
    for i in range(steps):
        opt.zero_grad()
        net(torch.tensor([i % 10, (3 * i) % 10])).backward()
        opt.step()


def test_sharded_keys_and_capture_restore_round_trip():
    torch.manual_seed(0)
    net = Net()
    dense, sharded = split_state_dict(net)
    assert set(sharded) == {"emb.weight", "emb.owned_ids"} and set(dense) == {"lin.weight", "lin.bias"}
    opt = build_optimizer(net, lr=0.1)
    box = Box()
    _train(net, opt, 3)
    box.memory += 1
    random.random(), np.random.rand(), torch.rand(1)
    d, s = copy.deepcopy(capture(net, opt, box, rank=0, loop={"history": [1]}, partial={"steps": 3}))
    assert d["optim"] is not None and s["optim"] is not None  # Adam state / sparse rows
    ref_next = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    _train(net, opt, 2)
    after = {k: v.clone() for k, v in net.state_dict().items()}
    # a fresh model, restored, takes the same two steps bitwise
    torch.manual_seed(123)
    net2, box2 = Net(), Box()
    opt2 = build_optimizer(net2, lr=0.1)
    loop, partial = restore(d, s, net2, opt2, box2)
    assert loop == {"history": [1]} and partial == {"steps": 3}
    assert torch.equal(box2.memory, box.memory)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == ref_next
    _train(net2, opt2, 2)
    assert all(torch.equal(after[k], v) for k, v in net2.state_dict().items())
    assert capture(net, opt, box, rank=1)[0] is None  # dense state comes from rank 0 only


def test_split_nested_best_model_snapshot():
    net = Net()
    opt = build_optimizer(net, lr=0.1)
    _train(net, opt, 1)
    best = {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": 4}
    d, s = split_nested([net], best, ("model",))
    assert "emb.weight" in s["model"] and "emb.weight" not in d["model"]
    assert set(d["optimizer"]) == {"dense"} and set(s["optimizer"]) == {"sparse"}
    back = join_nested(d, s)
    assert back["epoch"] == 4 and set(back["model"]) == set(best["model"])
    assert set(back["optimizer"]) == {"dense", "sparse"}


def test_every_syntax():
    assert Every.parse("500") == Every(500, "steps") == Every.parse("500steps")
    assert Every.parse("1e") == Every(1, "epochs") == Every.parse("1 epochs")
    for bad in ("0", "e", "1x", "-3", ""):
        with pytest.raises(ValueError, match="checkpoint-every"):
            Every.parse(bad)


def test_run_checkpoint_policy_and_refusal(tmp_path):
    ck = RunCheckpoint(tmp_path / "ck", "3", run_meta={"config": {"lr": 0.1}})
    assert [g for g in range(1, 10) if ck.step_due(g)] == [3, 6, 9]
    assert not ck.epoch_due(0) and ck.epoch_due(0, last=True)
    assert RunCheckpoint(tmp_path / "x", "2e").epoch_due(1)
    assert RunCheckpoint(None, "1e").epoch_due(0, last=True) is False  # no folder: never
    resumed = RunCheckpoint(tmp_path / "ck", "3", run_meta={"config": {"lr": 0.1}}, resume=True)
    assert resumed.load() is None  # nothing committed: a fresh start
    ck.save({"w": 1}, {"m": 2}, {"epoch": 0, "step": 3})
    assert resumed.load()[2] == {"epoch": 0, "step": 3}
    other = RunCheckpoint(tmp_path / "ck", "3", run_meta={"config": {"lr": 0.2}}, resume=True)
    with pytest.raises(CheckpointError, match="run_meta\\['config'\\] differs"):
        other.load()


def test_fault_hook_and_position_message(tmp_path, monkeypatch):
    from tgl_dist.errors import PeerFailureError
    marker = tmp_path / "once"
    monkeypatch.setenv("TGL_DIST_FAULT", f"rank=0,epoch=1,split=val,step=2,action=raise,once={marker}")
    maybe_inject_fault(0, 1, "train", 2)  # another split: nothing
    maybe_inject_fault(1, 1, "val", 2)  # another rank: nothing
    with pytest.raises(RuntimeError, match="injected failure on rank 0 at epoch 1, val step 2"):
        maybe_inject_fault(0, 1, "val", 2)
    maybe_inject_fault(0, 1, "val", 2)  # once: the marker exists now
    monkeypatch.setenv("TGL_DIST_FAULT", "rank=0,bogus=1")
    with pytest.raises(ValueError, match="unknown keys"):
        maybe_inject_fault(0, 0, "train", 1)
    monkeypatch.delenv("TGL_DIST_FAULT")
    ck = RunCheckpoint(None)
    with pytest.raises(PeerFailureError, match="rank 0 stopped at epoch 2, split train, step 6 "
                                               "\\(5 steps of it done\\): a peer rank failed"):
        with ck.guard():
            ck.at(2, "train", 5)
            raise PeerFailureError("collective 'counts' failed")


def test_partition_identity_tells_repartitions_apart(tmp_path):
    # same data, algorithm and part count, another partition seed: node ownership differs,
    # so a checkpoint's memory shards would land on other nodes: the identity must differ
    from tgl_dist.checkpoint.state import partition_identity
    from tgl_dist.data import generate_synthetic
    from tgl_dist.partition import partition_graph
    from tgl_dist.partition.storage import read_manifest
    g = generate_synthetic(num_nodes=60, num_events=400)
    a = partition_graph(g, 2, "random", tmp_path / "a", seed=0)
    b = partition_graph(g, 2, "random", tmp_path / "b", seed=1)
    ia, ib = partition_identity(read_manifest(a)), partition_identity(read_manifest(b))
    assert {k: ia[k] for k in ("name", "algorithm", "num_parts", "fingerprint")} == \
        {k: ib[k] for k in ("name", "algorithm", "num_parts", "fingerprint")}
    assert ia["files_sha256"] != ib["files_sha256"]
    assert partition_identity(read_manifest(a)) == ia


def test_a_new_run_over_a_committed_one_warns(tmp_path, caplog):
    import logging

    import torch

    from tgl_dist.checkpoint import CheckpointManager
    from tgl_dist.checkpoint.recovery import RunCheckpoint
    CheckpointManager(tmp_path / "ck").save({"w": torch.ones(1)}, {}, {"epoch": 1})
    with caplog.at_level(logging.WARNING):
        RunCheckpoint(tmp_path / "ck", resume=False)
    assert "holds a committed run (version 1)" in caplog.text and "--resume" in caplog.text
