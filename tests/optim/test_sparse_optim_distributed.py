"""Two processes: sharded tables and sparse optimizers equal the one-process run."""
import io

import pytest
import torch

from optim_reference import make_batches, merged, run_dist
from tgl_dist.dist import PartitionBook
from tgl_dist.nn import DistEmbedding
from tgl_dist.optim import SparseAdagrad, SparseAdam
from tgl_dist.testing import run_distributed

N, D, TOUCHED, STEPS = 40, 6, 25, 6
CONFIGS = {
    "adam_row": (SparseAdam, dict(lr=0.05, betas=(0.8, 0.99), step_count="row")),
    "adam_global": (SparseAdam, dict(lr=0.05, betas=(0.8, 0.99), step_count="global")),
    "adagrad": (SparseAdagrad, dict(lr=0.1, initial_accumulator_value=0.05)),
}


def _owner() -> torch.Tensor:
    return torch.randperm(N, generator=torch.Generator().manual_seed(7)) % 2


def _train(world_size: int, rank: int, name: str, tmp: str = ""):
    """Train one config; in a world of two also save after 3 steps and resume a copy."""
    cls, kw = CONFIGS[name]
    owner = _owner() if world_size == 2 else torch.zeros(N, dtype=torch.long)
    book = PartitionBook(owner)
    steps = make_batches(STEPS, 2, TOUCHED, seed=11, same_rows_each_step=name == "adam_row")
    mine = [s[rank] for s in steps] if world_size == 2 else merged(steps)
    emb = DistEmbedding(N, D, book, name)
    opt = cls([emb], **kw)
    init = emb.full_table()
    run_dist(emb, opt, mine[:3])
    if tmp:
        torch.save({"emb": emb.state_dict(), "opt": opt.state_dict()}, f"{tmp}/{name}_{rank}.pt")
    run_dist(emb, opt, mine[3:])
    out = {"init": init, "final": emb.full_table(), "rows": emb.weight.size(0),
           "owned": book.owned_ids(rank).numel(),
           "state_rows": {k: v.size(0) for k, v in opt.state[name].items() if v.dim()},
           "state": {k: v.clone() for k, v in opt.state[name].items()},
           "ids": emb.owned_ids.clone()}
    if tmp:
        emb2 = DistEmbedding(N, D, book, name, init=torch.nn.init.zeros_)
        opt2 = cls([emb2], **kw)
        saved = torch.load(f"{tmp}/{name}_{rank}.pt")
        emb2.load_state_dict(saved["emb"])
        opt2.load_state_dict(saved["opt"])
        run_dist(emb2, opt2, mine[3:])
        out["resumed"] = emb2.full_table()
    return out


class _Model(torch.nn.Module):
    def __init__(self, emb: DistEmbedding) -> None:
        super().__init__()
        self.emb = emb
        self.lin = torch.nn.Linear(D, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lin(self.emb(ids)).pow(2).sum()


def _ddp(rank: int) -> dict:
    """A model holding a DistEmbedding wrapped in DDP: the table is left to the sparse optimizer."""
    torch.manual_seed(rank)  # different dense init per rank: DDP must broadcast rank 0's
    emb = DistEmbedding(N, D, PartitionBook(_owner()), "ddp")
    model = torch.nn.parallel.DistributedDataParallel(_Model(emb))
    sparse, dense = SparseAdagrad([emb], lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)
    init = emb.full_table()
    ids = torch.tensor([0, 5, 5, 9]) if rank == 0 else torch.tensor([9, 12])
    model(ids).backward()
    sparse.step()
    dense.step()
    return {"lin": model.module.lin.weight.detach().clone(), "init": init,
            "final": emb.full_table()}


def _worker(tmp: str) -> bytes:
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    out = {name: _train(2, ctx.rank, name, tmp) for name in CONFIGS}
    out["ddp"] = _ddp(ctx.rank)
    buf = io.BytesIO()  # tensors through the result queue need the sender alive: send bytes
    torch.save(out, buf)
    return buf.getvalue()


@pytest.mark.distributed
def test_two_ranks_equal_one_rank(tmp_path):
    r0, r1 = (torch.load(io.BytesIO(r)) for r in run_distributed(_worker, 2, str(tmp_path)))
    for name in CONFIGS:
        one = _train(1, 0, name)
        a, b = r0[name], r1[name]
        # the default init does not depend on the world size
        assert torch.equal(a["init"], one["init"]) and torch.equal(b["init"], one["init"])
        assert (a["final"] - one["final"]).abs().max() < 1e-6, name
        assert torch.equal(a["final"], b["final"])
        # rows never looked up never change
        assert torch.equal(a["final"][TOUCHED:], one["init"][TOUCHED:])
        # each rank holds only its own rows, in table and optimizer state
        for r, res in enumerate((a, b)):
            assert res["rows"] == res["owned"] < N
            assert set(res["state_rows"].values()) == {res["owned"]}
            for k, v in res["state"].items():
                want = one["state"][k][res["ids"]] if v.dim() else one["state"][k]
                # the owner sums gradients in another order: equal up to float32 rounding
                assert torch.allclose(v.double(), want.double(), rtol=1e-6, atol=1e-6), (name, k)
        assert a["rows"] + b["rows"] == N
        # save after 3 steps, load into fresh objects, continue: same as never stopping
        assert torch.equal(a["resumed"], a["final"]) and torch.equal(b["resumed"], b["final"])
    # DDP over a model holding the table: dense parts stay in sync, the table is sparse-updated
    d0, d1 = r0["ddp"], r1["ddp"]
    assert torch.equal(d0["lin"], d1["lin"])
    assert torch.equal(d0["final"], d1["final"])
    touched = torch.tensor([0, 5, 9, 12])
    assert (d0["final"][touched] != d0["init"][touched]).any(dim=1).all()
    rest = torch.ones(N, dtype=torch.bool)
    rest[touched] = False
    assert torch.equal(d0["final"][rest], d0["init"][rest])


def _mismatch_worker(field: str) -> str:
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    kw = {"dim": D, "grad_reduction": "sum"}
    if ctx.rank == 1:
        kw = {"dim": D + 1, "grad_reduction": "sum"} if field == "dim" else {"dim": D, "grad_reduction": "mean"}
    emb = DistEmbedding(N, kw["dim"], PartitionBook(_owner()), "e",
                        grad_reduction=kw["grad_reduction"])
    try:
        emb(torch.arange(5))
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.distributed
@pytest.mark.parametrize("field, shown", [("dim", f"[{D}, {D + 1}]"), ("grad_reduction", "['sum', 'mean']")])
def test_ranks_that_disagree_on_the_table_get_a_clear_error(field, shown):
    """Another width used to abort inside gloo (gloo::EnforceNotMet) at the first lookup;
    another reduction would have been applied silently by each row's owner."""
    for msg in run_distributed(_mismatch_worker, 2, field):
        assert msg == f"DistEmbedding 'e': the ranks built the table with different {field}: {shown} (rank order)"
