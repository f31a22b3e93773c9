"""One process: DistEmbedding + sparse optimizers against torch's own optimizers."""
import io

import pytest
import torch

from optim_reference import (make_batches, merged, run_dist, run_torch_dense_adagrad,
                             run_torch_sparse_adam)
from tgl_dist.dist import PartitionBook
from tgl_dist.errors import PartitionError
from tgl_dist.nn import DistEmbedding
from tgl_dist.optim import SparseAdagrad, SparseAdam

N, D, TOUCHED = 40, 6, 25


def _emb(name="e", seed=0, n=N):
    return DistEmbedding(n, D, PartitionBook(torch.zeros(n, dtype=torch.long)), name, seed=seed)


@pytest.mark.parametrize("step_count", ["global", "row"])
def test_sparse_adam_matches_torch(step_count):
    # "global" is torch's convention: equal for any batches. "row" equals it when every
    # touched row is touched in every step.
    batches = merged(make_batches(6, 2, TOUCHED, seed=1,
                                  same_rows_each_step=step_count == "row"))
    emb = _emb()
    init = emb.weight.clone()
    opt = SparseAdam([emb], lr=0.05, betas=(0.8, 0.99), eps=1e-7, step_count=step_count)
    run_dist(emb, opt, batches)
    ref = run_torch_sparse_adam(init, batches, lr=0.05, betas=(0.8, 0.99), eps=1e-7)
    assert (emb.weight - ref).abs().max() < 1e-6
    assert not torch.equal(emb.weight[:TOUCHED], init[:TOUCHED])
    assert torch.equal(emb.weight[TOUCHED:], init[TOUCHED:])  # never looked up: unchanged
    st = opt.state_dict()["state"]["e"]
    assert torch.equal(st["exp_avg"][TOUCHED:], torch.zeros(N - TOUCHED, D))


def test_sparse_adam_row_step_counts_per_row():
    # rows 0..9 touched in steps 1-3; rows 10..14 only in step 3: with per-row steps the
    # late rows take one fresh Adam step, the early ones three steps.
    early, late = torch.arange(10), torch.arange(10, 15)
    w = lambda n: torch.linspace(0.5, 1.5, n).view(-1, 1)  # noqa: E731
    steps = [(early, w(10), torch.empty(0, dtype=torch.long), torch.empty(0, 1))] * 2
    steps.append((torch.cat([early, late]), w(15), late[:2], w(2)))
    emb = _emb()
    init = emb.weight.clone()
    opt = SparseAdam([emb], lr=0.1)
    run_dist(emb, opt, steps)
    ref_early = run_torch_sparse_adam(init, steps, lr=0.1)
    late_only = [(late, w(15)[10:], late[:2], w(2))]
    ref_late = run_torch_sparse_adam(init, late_only, lr=0.1)
    assert (emb.weight[early] - ref_early[early]).abs().max() < 1e-6
    assert (emb.weight[late] - ref_late[late]).abs().max() < 1e-6
    assert torch.equal(opt.state["e"]["step"], torch.tensor([3] * 10 + [1] * 5 + [0] * 25))
    # the global convention gives the late rows a third-step bias correction instead
    assert (emb.weight[late] - ref_early[late]).abs().max() > 1e-4


def test_sparse_adagrad_matches_dense_adagrad():
    batches = merged(make_batches(6, 2, TOUCHED, seed=2))
    emb = _emb()
    init = emb.weight.clone()
    opt = SparseAdagrad([emb], lr=0.1, eps=1e-8, initial_accumulator_value=0.05)
    run_dist(emb, opt, batches)
    ref = run_torch_dense_adagrad(init, batches, lr=0.1, eps=1e-8,
                                  initial_accumulator_value=0.05)
    assert (emb.weight - ref).abs().max() < 1e-6
    assert torch.equal(emb.weight[TOUCHED:], init[TOUCHED:])
    assert torch.equal(opt.state["e"]["sum"][TOUCHED:], torch.full((N - TOUCHED, D), 0.05))


def test_gradient_reaches_other_parameters_and_is_recorded_sparsely():
    emb = _emb()
    lin = torch.nn.Linear(D, 1)
    ids = torch.tensor([3, 7, 3])
    out = lin(emb(ids)).sum()
    out.backward()
    rec_ids, rec_grad = emb.take_grads()
    assert rec_ids.tolist() == [3, 7]                       # unique ids only
    assert torch.allclose(rec_grad, torch.stack([2 * lin.weight[0], lin.weight[0]]).detach())
    assert lin.weight.grad is not None
    with torch.no_grad():
        emb(ids)
    assert len(emb._grads) == 1                              # no recording without grad


def _roundtrip(make_opt, batches):
    emb = _emb()
    opt = make_opt(emb)
    run_dist(emb, opt, batches[:3])
    buf = io.BytesIO()
    torch.save({"emb": emb.state_dict(), "opt": opt.state_dict()}, buf)
    run_dist(emb, opt, batches[3:])
    buf.seek(0)
    saved = torch.load(buf)
    emb2 = _emb(seed=5)
    opt2 = make_opt(emb2)
    emb2.load_state_dict(saved["emb"])
    opt2.load_state_dict(saved["opt"])
    run_dist(emb2, opt2, batches[3:])
    return emb, opt, emb2, opt2


@pytest.mark.parametrize("make_opt", [
    lambda e: SparseAdam([e], lr=0.05),
    lambda e: SparseAdam([e], lr=0.05, step_count="global"),
    lambda e: SparseAdagrad([e], lr=0.1),
])
def test_state_dict_round_trip(make_opt):
    batches = merged(make_batches(6, 2, TOUCHED, seed=3))
    emb, opt, emb2, opt2 = _roundtrip(make_opt, batches)
    assert torch.equal(emb.weight, emb2.weight)
    for k, v in opt.state["e"].items():
        assert torch.equal(v, opt2.state["e"][k])


def test_errors():
    emb = _emb()
    with pytest.raises(ValueError, match="out of range"):
        emb(torch.tensor([0, N]))
    with pytest.raises(TypeError, match="integer"):
        emb(torch.tensor([0.0]))
    with pytest.raises(TypeError, match="DistEmbedding"):
        SparseAdam([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="unique"):
        SparseAdam([emb, emb])
    with pytest.raises(PartitionError, match="parts"):
        DistEmbedding(4, D, PartitionBook(torch.tensor([0, 1, 0, 1])), "two_parts")
    with pytest.raises(PartitionError, match="covers"):
        DistEmbedding(5, D, PartitionBook(torch.zeros(4, dtype=torch.long)), "short")
    with pytest.raises(ValueError, match="step_count"):
        SparseAdam([emb], step_count="epoch")
    row = SparseAdam([emb]).state_dict()
    with pytest.raises(ValueError, match="step_count"):
        SparseAdam([emb], step_count="global").load_state_dict(row)
    with pytest.raises(ValueError, match="saved by"):
        SparseAdagrad([emb]).load_state_dict(row)
    with pytest.raises(ValueError, match="do not match"):
        SparseAdam([_emb(name="f")]).load_state_dict(row)
    other = _emb(n=N + 1)  # same name, other rows
    with pytest.raises(PartitionError, match="other rows"):
        SparseAdam([other]).load_state_dict(row)
    with pytest.raises(PartitionError, match="other nodes"):
        other.load_state_dict(emb.state_dict())


def test_default_init_is_deterministic_and_uniform():
    a = _emb(n=5000)
    b = _emb(n=5000)
    assert torch.equal(a.weight, b.weight)
    assert not torch.equal(a.weight, _emb(n=5000, seed=1).weight)
    bound = 1.0 / D ** 0.5
    assert float(a.weight.min()) >= -bound and float(a.weight.max()) < bound
    assert abs(float(a.weight.mean())) < 0.01
    assert abs(float(a.weight.var()) - (2 * bound) ** 2 / 12) < 0.01 * bound ** 2 * 4
    # a row depends on the global id only: a smaller table has the same first rows
    assert torch.equal(_emb(n=100).weight, a.weight[:100])


def test_table_is_module_state_but_not_parameter_or_buffer():
    emb = _emb()
    model = torch.nn.Sequential(emb, torch.nn.Linear(D, 2))
    # dense optimizers and DDP (which broadcasts buffers) never touch the sharded table
    assert [n for n, _ in model.named_parameters()] == ["1.weight", "1.bias"]
    assert list(model.buffers()) == []
    sd = model.state_dict()
    assert torch.equal(sd["0.weight"], emb.weight) and torch.equal(sd["0.owned_ids"],
                                                                   torch.arange(N))
    other = torch.nn.Sequential(_emb(seed=3), torch.nn.Linear(D, 2))
    other.load_state_dict(sd)
    assert torch.equal(other[0].weight, emb.weight)
    with pytest.raises(RuntimeError, match="Missing key"):
        other.load_state_dict({k: v for k, v in sd.items() if k != "0.weight"})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        other.load_state_dict({**sd, "0.extra": torch.zeros(1)})
    emb.double()
    assert emb.weight.dtype == torch.float64 and emb.owned_ids.dtype == torch.long


def test_empty_rows_large_table_is_an_ordinary_tensor():
    from tgl_dist.nn.dist_embedding import empty_rows
    t = empty_rows(140_000, 64)  # 35 MB: huge pages advised on Linux
    assert t.shape == (140_000, 64) and t.dtype == torch.float32
    t.fill_(1.5)
    assert float(t.sum()) == 1.5 * t.numel()
