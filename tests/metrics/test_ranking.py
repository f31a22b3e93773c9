"""Metrics over the whole split: AP/AUC as sklearn, MRR with TGB's tie rule, gathered over
ranks, float64 scores kept, early stopping."""
import math

import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from tgl_dist.metrics import EarlyStopMonitor, LinkPredMetrics, average_precision, mrr, roc_auc
from tgl_dist.testing import run_distributed


def test_ap_auc_equal_sklearn_with_ties_and_mrr_tie_rule():
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 5, (200,), generator=g).double()   # many ties
    neg = torch.randint(0, 5, (200,), generator=g).double()
    y = [1] * 200 + [0] * 200
    s = torch.cat([pos, neg]).numpy()
    assert average_precision(pos, neg) == average_precision_score(y, s)
    assert roc_auc(pos, neg) == roc_auc_score(y, s)
    # rank = 1 + #greater + 0.5 #equal
    assert mrr(torch.tensor([1.0, 1.0]), torch.tensor([[0.0, 2.0], [1.0, 1.0]])) == \
        pytest.approx((1 / 2 + 1 / 2) / 2)
    assert math.isnan(mrr(torch.zeros(0), torch.zeros(0, 3)))


def test_ap_auc_are_sklearns_bit_for_bit():
    """Our AP / AUC (numpy, no scikit-learn import) equal scikit-learn's exactly: ties,
    float32-rounded scores, constant scores, one positive or one negative, large sizes
    (numpy's pairwise summation over the same arrays)."""
    import numpy as np
    rng = np.random.default_rng(0)
    cases = [(np.full(5, 0.3), np.full(7, 0.3)), (np.ones(1), np.zeros(1)),
             (np.zeros(1), np.ones(4)), (np.ones(6), np.zeros(1)),
             (rng.normal(size=50_000).astype(np.float32) + 0.5,
              rng.normal(size=150_000).astype(np.float32))]
    for trial in range(400):
        P, Q = (int(x) for x in rng.integers(1, 300, 2))
        if trial % 3 == 0:
            cases.append((rng.integers(0, 5, P), rng.integers(0, 5, Q)))
        elif trial % 3 == 1:
            cases.append((rng.normal(size=P).astype(np.float32),
                          rng.normal(size=Q).astype(np.float32)))
        else:
            cases.append((np.round(rng.normal(size=P), 1), np.round(rng.normal(size=Q) - 0.5, 1)))
    for pos, neg in cases:
        pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
        y, s = np.r_[np.ones(pos.size), np.zeros(neg.size)], np.r_[pos, neg]
        tp, tn = torch.from_numpy(pos), torch.from_numpy(neg)
        assert average_precision(tp, tn) == average_precision_score(y, s)
        assert roc_auc(tp, tn) == roc_auc_score(y, s)
    assert math.isnan(average_precision(torch.zeros(0), torch.ones(3)))
    assert math.isnan(roc_auc(torch.ones(2), torch.zeros(0)))


def test_the_library_does_not_import_scikit_learn():
    """scikit-learn (and the SciPy and pandas it loads) took 1.7 s of every process's
    start; the metrics no longer need it."""
    import subprocess
    import sys
    code = ("import sys, tgl_dist.ctdg, tgl_dist.dtdg, tgl_dist.metrics; "
            "print(sorted(m for m in ('sklearn', 'scipy', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_scores_are_ranked_at_float32_precision():
    """Rounding noise between world sizes must not break ties differently: float64
    scores equal to float32 precision tie (the documented price of that)."""
    m = LinkPredMetrics()
    m.update(torch.tensor([0.5 + 1e-12], dtype=torch.float64), torch.tensor([0.5], dtype=torch.float64),
             torch.tensor([[0.5, 0.5, 0.0]], dtype=torch.float64))
    assert m.compute()["mrr"] == pytest.approx(1 / 2)           # rank 1 + 0.5 * 2
    m.update(torch.tensor([0.75], dtype=torch.float64), torch.tensor([0.25], dtype=torch.float64),
             torch.tensor([[0.5, 0.8, 0.1]], dtype=torch.float64))
    s = LinkPredMetrics()
    s.load_state_dict(m.state_dict())
    assert s.compute() == m.compute()


def _gathered(chunks):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    m = LinkPredMetrics()
    for pos, neg, negk in chunks[ctx.rank]:   # rank 1 may have nothing at all
        m.update(pos, neg, negk)
    return m.compute()


@pytest.mark.distributed
def test_two_ranks_gather_the_whole_split():
    g = torch.Generator().manual_seed(1)
    parts = [(torch.rand(n, generator=g), torch.rand(n, generator=g), torch.rand(n, 4, generator=g))
             for n in (30, 17, 5)]
    one = LinkPredMetrics()
    for p in parts:
        one.update(*p)
    ref = one.compute()
    for split in ([parts[:2], parts[2:]], [parts, []]):
        for got in run_distributed(_gathered, 2, split):
            assert got["num"] == 52
            for k in ("ap", "auc", "mrr"):
                assert got[k] == pytest.approx(ref[k], abs=1e-12), k


def test_early_stop_patience_direction_and_nan():
    m = EarlyStopMonitor(patience=2)
    assert [m.step(v) for v in (0.5, 0.6, 0.6, 0.55)] == [False, False, False, True]
    assert m.best_epoch == 1
    low = EarlyStopMonitor(patience=1, higher_better=False)
    assert [low.step(v) for v in (3.0, 2.0, 2.5)] == [False, False, True]
    nan = EarlyStopMonitor(patience=2)       # a NaN first is no improvement, not the best
    assert [nan.step(v) for v in (float("nan"), 0.6, 0.7, 0.8)] == [False, False, False, False]
    assert nan.best_epoch == 3 and nan.best == 0.8


def test_an_empty_batch_with_k_negatives_is_skipped():
    # a rank without events in a step updates with [0] scores and [0, k] negatives
    # (once a reshape of 0 elements to [0, -1]); the figures are those without it
    from tgl_dist.metrics import LinkPredMetrics
    pos, neg_k = torch.tensor([0.9, 0.1, 0.5]), torch.tensor([[0.2, 0.3], [0.4, 0.0], [0.6, 0.1]])
    a, b = LinkPredMetrics(), LinkPredMetrics()
    a.update(torch.zeros(0), torch.zeros(0), torch.zeros(0, 2))
    a.update(pos, neg_k[:, 0], neg_k)
    a.update(torch.zeros(0), torch.zeros(0), torch.zeros(0))
    b.update(pos, neg_k[:, 0], neg_k)
    assert a.compute() == b.compute() and "mrr" in a.compute()


def test_mrr_does_not_depend_on_the_order_of_the_events():
    from tgl_dist.metrics import mrr
    for seed, n in ((2, 333), (4, 7), (11, 5000)):   # a plain mean differs by 5.6e-17 here
        g = torch.Generator().manual_seed(seed)
        pos, neg = torch.randn(n, generator=g), torch.randn(n, 9, generator=g)
        perm = torch.randperm(n, generator=g)
        assert mrr(pos, neg) == mrr(pos[perm], neg[perm])   # bitwise: any gathering order


@pytest.mark.parametrize("where", ["pos", "neg", "neg_k"])
def test_non_finite_scores_are_a_clear_error(where):
    """A diverged model (e.g. --lr 1e30) gives NaN logits: one error saying so, not
    scikit-learn's 'Input contains NaN' from deep inside the evaluation."""
    from tgl_dist.metrics import NonFiniteScoresError
    pos, neg, neg_k = torch.tensor([0.9, 0.1]), torch.tensor([0.2, 0.4]), torch.rand(2, 3)
    {"pos": pos, "neg": neg, "neg_k": neg_k}[where].view(-1)[1] = math.nan
    m = LinkPredMetrics()
    m.update(pos, neg, neg_k)
    with pytest.raises(NonFiniteScoresError, match="1 of .* scores are NaN or infinite: the "
                                                   "model diverged"):
        m.compute()
