"""run_epoch on 2 ranks takes the optimizer steps of 1 process, with uneven and empty shares."""
import pytest
import torch

from tgl_dist.testing import run_distributed

# 3 steps (windows) of global events, each event a feature row; rank r takes the events
# whose owner is r: window 0 splits 3 / 1, window 1 gives rank 0 nothing, window 2 is 2 / 2
X = torch.tensor([[1.0, 2.0], [0.5, -1.0], [2.0, 0.0], [-1.0, 1.0],
                  [0.3, 0.3], [1.5, -0.5],
                  [0.2, 1.0], [-0.4, 0.1], [1.0, 1.0], [0.0, -2.0]])
OWNER = torch.tensor([0, 0, 1, 0, 1, 1, 0, 1, 1, 0])
WINDOWS = [(0, 4), (4, 6), (6, 10)]


class Scores(torch.nn.Module):
    """pos = x w, neg = -x w + b: a model whose loss is not the same for every event."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.3, -0.2]))
        self.b = torch.nn.Parameter(torch.tensor(0.1))

    def forward(self, x, meta):
        return x @ self.w, -(x @ self.w) + self.b


def _steps(rank: int, ws: int):
    for lo, hi in WINDOWS:
        mine = torch.arange(lo, hi)[OWNER[lo:hi] % ws == rank]
        yield None, X[mine], {"window": (lo, hi)}, 0.0


def _train():
    from tgl_dist import DistributedContext
    from tgl_dist.ctdg import run_epoch

    ctx = DistributedContext.init()
    model = Scores()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out = run_epoch(model, list(_steps(ctx.rank, ctx.world_size)), optimizer=opt)
    return model.w.detach().clone(), model.b.detach().clone(), out["loss"]


@pytest.mark.distributed
def test_two_ranks_with_uneven_and_empty_shares_step_like_one_process():
    w1, b1, loss1 = _train()
    (w0, b0, l0), (w1r, b1r, l1r) = run_distributed(_train, 2)
    assert torch.equal(w0, w1r) and torch.equal(b0, b1r)
    assert torch.allclose(w0, w1, atol=1e-6) and torch.allclose(b0, b1, atol=1e-6)
    assert not torch.equal(w1, Scores().w.detach())          # the steps moved it
    # the reported loss is the mean over steps of the loss over each whole window
    assert abs(l0 - loss1) < 1e-6 and abs(l1r - loss1) < 1e-6


def test_link_loss_share_scaling():
    from tgl_dist.ctdg import link_loss
    pos, neg = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([0.1, 0.3, -0.2])
    plain = link_loss(pos, neg)
    assert torch.equal(link_loss(pos, neg, {"window": (10, 18)}, 1), plain)
    # 3 of the window's 8 events on this rank of 2: its share is 3 * 2 / 8 of its mean
    assert torch.allclose(link_loss(pos, neg, {"window": (10, 18)}, 2), plain * 0.75)
    empty = torch.zeros(0, requires_grad=True)
    loss = link_loss(empty, empty, {"window": (10, 18)}, 2)
    loss.backward()
    assert float(loss.detach()) == 0.0 and empty.grad is not None and empty.grad.numel() == 0


def test_link_loss_on_several_ranks_needs_the_window():
    from tgl_dist.ctdg import link_loss
    pos = neg = torch.tensor([0.5])
    with pytest.raises(ValueError, match="window"):
        link_loss(pos, neg, None, 2)
    with pytest.raises(ValueError, match="window"):
        link_loss(pos, neg, {"num_pos": 1}, 2)


def test_memory_model_without_the_loaders_mailbox_is_a_clear_error():
    from types import SimpleNamespace

    from tgl_dist.ctdg import run_epoch

    model = Scores()
    model.memory_updater = torch.nn.Identity()           # a model that keeps node memory
    mailbox, other = object(), object()
    with pytest.raises(ValueError, match="pass its SharedMailBox to run_epoch"):
        run_epoch(model, SimpleNamespace(mailbox=mailbox))
    with pytest.raises(ValueError, match="reads node memory from no mailbox"):
        run_epoch(model, SimpleNamespace(mailbox=None), mailbox)
    with pytest.raises(ValueError, match="from another mailbox"):
        run_epoch(model, SimpleNamespace(mailbox=other), mailbox)
    assert run_epoch(Scores(), [])["events"] == 0         # no memory, no mailbox: fine


def _evaluate():
    from tgl_dist import DistributedContext
    from tgl_dist.metrics import LinkPredMetrics
    from tgl_dist.ctdg import run_epoch

    ctx = DistributedContext.init()
    metrics = LinkPredMetrics()
    out = run_epoch(Scores(), list(_steps(ctx.rank, ctx.world_size)), metrics=metrics)
    return out["ap_batch_mean"], metrics.compute()


@pytest.mark.distributed
def test_batch_mean_ap_counts_only_the_ranks_non_empty_shares():
    from tgl_dist.metrics import average_precision
    m = Scores()
    with torch.no_grad():
        aps = []   # each rank's non-empty share of a window is one batch
        for r in range(2):
            for lo, hi in WINDOWS:
                mine = torch.arange(lo, hi)[OWNER[lo:hi] % 2 == r]
                if mine.numel():
                    aps.append(average_precision(*m(X[mine], None)))
    (mean0, whole0), (mean1, whole1) = run_distributed(_evaluate, 2)
    assert mean0 == mean1 and abs(mean0 - sum(aps) / len(aps)) < 1e-12
    mean_1p, whole_1p = _evaluate()
    assert whole0 == whole1 == whole_1p           # whole-split figures: any world size


def test_mrr_ranks_each_positive_against_its_own_negatives():
    # k = 2 negatives per event, negative-major as the loader lists them: event 0's are
    # rows 0 and 2 (scores 2, 0), event 1's rows 1 and 3 (3, 0). Each positive (score 1)
    # ranks 2nd: MRR 0.5 (pairing rows 0-1 and 2-3 instead would give (1/3 + 1) / 2)
    from tgl_dist.metrics import LinkPredMetrics
    from tgl_dist.ctdg import run_epoch

    class Fixed(torch.nn.Module):
        def forward(self, x, meta):
            return torch.tensor([1.0, 1.0]), torch.tensor([2.0, 3.0, 0.0, 0.0])
    metrics = LinkPredMetrics()
    run_epoch(Fixed(), [(None, None, {}, 0.0)], metrics=metrics)
    assert metrics.compute()["mrr"] == pytest.approx(0.5)


def test_link_loss_is_one_node_with_torchs_bce_value_and_gradient():
    """link_loss: the value of torch's two BCE terms, their gradients, one autograd node."""
    import torch.nn.functional as F
    from tgl_dist.ctdg import link_loss
    g = torch.Generator().manual_seed(3)
    pos, neg = torch.randn(7, generator=g) * 3, torch.randn(14, generator=g) * 3
    a, b = pos.clone().requires_grad_(), neg.clone().requires_grad_()
    loss = link_loss(a, b)
    assert type(loss.grad_fn).__name__ == "_LinkBCEBackward"
    (loss * 1.7).backward()
    c, d = pos.clone().requires_grad_(), neg.clone().requires_grad_()
    ref = (F.binary_cross_entropy_with_logits(c, torch.ones_like(c))
           + F.binary_cross_entropy_with_logits(d, torch.zeros_like(d)))
    (ref * 1.7).backward()
    assert torch.equal(loss.detach(), ref.detach())
    assert torch.allclose(a.grad, c.grad, atol=1e-7) and torch.allclose(b.grad, d.grad, atol=1e-7)
