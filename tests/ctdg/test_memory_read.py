"""The compact memory read: ``read_unique`` fetches one row per distinct node, the block's
``srcdata`` (``MemorySrcData``) still reads per source row, and the models give the same
results from the compact rows as from per-row state."""
import pytest
import torch

from blocks_util import make_batch
from tgl_dist.dist import PartitionBook
from tgl_dist.memory import SharedMailBox
from tgl_dist.memory.mailbox import MEMORY_KEYS, MemorySrcData
from tgl_dist.ctdg import build_model, parse_config
from tgl_dist.testing import run_distributed

N = 12
OWNER = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0])
IDS = torch.tensor([5, 3, 5, 11, 0, 3, 3, 7, 2, 5])


def _filled(n=N, book=None, ids=None):
    """A mailbox (K=2) whose state at global node g is a function of g."""
    mb = SharedMailBox(n, dict(dim_out=3, mailbox_size=2), 2, partition_book=book)
    g = torch.arange(N, dtype=torch.float64) if ids is None else ids.double()
    mb.memory[:] = g.float().view(-1, 1) * torch.tensor([1.0, -1.0, 0.5])
    mb.memory_ts[:] = g + 0.25
    mb.mailbox[:] = g.float().view(-1, 1, 1) + torch.arange(mb.mailbox[0].numel()).view(mb.mailbox[0].shape)
    mb.mail_ts[:] = g.view(-1, 1) * 10 + torch.tensor([1.0, 2.0], dtype=torch.float64)
    return mb


def _check(md, per_row, ids):
    assert torch.equal(md["ID"], torch.unique(ids))                   # distinct, sorted
    assert torch.equal(ids[md["first"]], md["ID"])                    # first occurrences ...
    for u, f in zip(md["ID"].tolist(), md["first"].tolist()):
        assert f == int((ids == u).nonzero()[0])                      # ... really the first
    assert torch.equal(md["ID"][md["index"]], ids)                    # every row's distinct row
    for k, v in zip(MEMORY_KEYS, per_row):
        assert md[k].size(0) == md["ID"].numel()
        assert torch.equal(md[k][md["index"]], v)


def test_read_unique_one_process():
    mb = _filled()
    md = mb.read_unique(IDS)
    per_row = mb.read(IDS)
    _check(md, per_row, IDS)
    assert torch.equal(per_row[1], IDS.double() + 0.25)               # the state of each id


def _dist_worker():
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    book = PartitionBook(OWNER)
    owned = book.owned_ids(ctx.rank)
    mb = _filled(int(owned.numel()), book, owned)
    ids = IDS if ctx.rank == 0 else IDS.flip(0)[:7]
    md = mb.read_unique(ids)
    return {k: v.numpy().copy() for k, v in md.items()}, ids.numpy().copy()


@pytest.mark.distributed
def test_read_unique_two_ranks_equals_one_process():
    ref = _filled()
    for md, ids in run_distributed(_dist_worker, 2):
        md = {k: torch.from_numpy(v) for k, v in md.items()}
        ids = torch.from_numpy(ids)
        _check(md, ref.read(ids), ids)


def test_srcdata_reads_per_source_row_on_demand():
    mb = _filled()
    _, mfgs, _ = make_batch(4, N, [3], seed=3)
    b = mfgs[0]
    ids = b.srcdata["ID"].clone()
    mb.prepare_input(mfgs)
    sd = b.srcdata
    assert isinstance(sd, MemorySrcData)
    assert not any(dict.__contains__(sd, k) for k in MEMORY_KEYS)     # nothing gathered yet
    assert all(k in sd for k in MEMORY_KEYS) and set(sd.keys()) >= {"ID", "ts", *MEMORY_KEYS}
    per_row = mb.read(ids)
    for k, v in zip(MEMORY_KEYS, per_row):
        assert torch.equal(sd[k], v) and torch.equal(sd.get(k), v)
    assert dict.__contains__(sd, "mem")                               # stored once read
    assert sd["mem"] is sd["mem"]
    assert dict(sd.items()).keys() == set(sd.keys())
    assert sd.get("h") is None and "h" not in sd
    with pytest.raises(KeyError):
        sd["h"]


@pytest.mark.parametrize("time_delta", ["mail", "query"])
@pytest.mark.parametrize("gnn", [True, False])
def test_models_give_the_same_result_from_compact_and_per_row_state(time_delta, gnn):
    raw = {"sampling": {"layer": 1, "neighbor": [3], "strategy": "recent"},
           "memory": {"type": "node", "dim_out": 3, "dim_time": 4, "memory_update": "gru",
                      "mailbox_size": 1, "time_delta": time_delta},
           "train": {"dropout": 0.0, "att_dropout": 0.0}}
    if gnn:
        raw["gnn"] = {"arch": "transformer_attention", "layer": 1, "att_head": 1, "dim_time": 4,
                      "dim_out": 6}
    else:
        raw["gnn"] = {"arch": "identity"}
    cfg = parse_config(raw)
    torch.manual_seed(0)
    mb = SharedMailBox(N, cfg.memory, 0)
    mb.memory.normal_(), mb.mailbox.normal_()
    mb.memory_ts[:] = torch.rand(N, dtype=torch.float64) * 10
    mb.mail_ts[:] = mb.memory_ts.view(-1, 1) + torch.rand(N, 1, dtype=torch.float64)
    model = build_model(cfg).eval()
    outs = []
    for compact in (True, False):
        _, mfgs, meta = make_batch(5, N, [3], seed=6)
        mb.prepare_input(mfgs)
        if not compact:  # a plain dict with every per-row entry materialised
            mfgs[0].srcdata = {k: mfgs[0].srcdata[k] for k in mfgs[0].srcdata.keys()}
        with torch.no_grad():
            outs.append(model(mfgs, meta))
    (p1, n1), (p2, n2) = outs[0], outs[1]
    assert torch.allclose(p1, p2, atol=1e-6) and torch.allclose(n1, n2, atol=1e-6)
    assert torch.allclose(outs[0].memory, outs[1].memory, atol=1e-6)
