"""tgl_dist.metrics.Evaluator against py-tgb's Evaluator (ties included), and TGBMetrics
over a split (two ranks: tests/metrics/test_edgebank.py)."""
import math

import numpy as np
import pytest
import torch

from tgl_dist.metrics import Evaluator, TGBMetrics, mrr_hits_from_ranks, tgb_ranks

NO_TGB = "py-tgb is not installed (pip install py-tgb, in the 'test' extra)"


def _tgb_eval():
    return pytest.importorskip("tgb.linkproppred.evaluate", reason=NO_TGB)

NAMES = ["tgbl-wiki", "tgbl-review", "tgbl-coin", "tgbl-comment", "tgbl-flight"]


def _cases(seed):
    rng = np.random.default_rng(seed)
    for P, q in ((1, 20), (1, 1), (7, 100), (50, 20), (3, 1000)):
        # few distinct values: many ties between a positive and its negatives
        yield rng.integers(0, 4, size=P).astype(np.float32), \
            rng.integers(0, 4, size=(P, q)).astype(np.float32)
        yield rng.random(P), rng.random((P, q))
    yield np.array([0.5]), np.array([0.5, 0.5, 0.1, 0.9])      # one positive, [q] negatives


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("k", [10, 3])
def test_eval_equals_py_tgb(name, k):
    ours, theirs = Evaluator(name=name, k_value=k), _tgb_eval().Evaluator(name=name, k_value=k)
    assert ours.metric == "mrr"
    for pos, neg in _cases(hash((name, k)) % 1000):
        for conv in (lambda x: x, torch.from_numpy):
            d = {"y_pred_pos": conv(pos), "y_pred_neg": conv(neg), "eval_metric": [ours.metric]}
            got, ref = ours.eval(d), theirs.eval(dict(d))
            assert set(got) == set(ref) == {f"hits@{k}", "mrr"}
            for key in ref:
                assert got[key] == ref[key], (key, got[key], ref[key])
                assert isinstance(got[key], float)


def test_eval_ties_by_hand():
    ev = Evaluator("tgbl-wiki")
    # rank = 1 + #greater (1) + 0.5 * #equal (2) = 3
    out = ev.eval({"y_pred_pos": np.array([0.5]), "y_pred_neg": np.array([[0.9, 0.5, 0.5, 0.1]]),
                   "eval_metric": ["mrr"]})
    assert out == {"hits@10": 1.0, "mrr": pytest.approx(1 / 3)}
    assert float(tgb_ranks(torch.tensor([0.5]), torch.tensor([[0.9, 0.5, 0.5, 0.1]]))[0]) == 3.0


def test_eval_errors_as_tgb():
    with pytest.raises(NotImplementedError):
        Evaluator("wikipedia")
    ev = Evaluator("tgbl-coin")
    with pytest.raises(RuntimeError):
        ev.eval({"y_pred_pos": np.zeros(1), "y_pred_neg": np.zeros((1, 2))})
    with pytest.raises(ValueError):
        ev.eval({"y_pred_pos": np.zeros(1), "y_pred_neg": np.zeros((1, 2)), "eval_metric": ["ap"]})
    with pytest.raises(RuntimeError):
        ev.eval({"y_pred_pos": [0.1], "y_pred_neg": [[0.2]], "eval_metric": ["mrr"]})


def test_split_mrr_is_the_mean_of_per_positive_tgb_calls():
    # TGB's examples call Evaluator once per positive (its own, ragged, negative list) and
    # average: TGBMetrics gives that mean over a whole split, padding masked out
    rng = np.random.default_rng(5)
    ev = _tgb_eval().Evaluator(name="tgbl-wiki")
    P, q = 40, 30
    pos = rng.integers(0, 5, size=P).astype(np.float32)
    neg = rng.integers(0, 5, size=(P, q)).astype(np.float32)
    lens = rng.integers(1, q + 1, size=P)
    mask = np.arange(q)[None, :] < lens[:, None]
    per = [ev.eval({"y_pred_pos": pos[i:i + 1], "y_pred_neg": neg[i, :lens[i]],
                    "eval_metric": ["mrr"]}) for i in range(P)]
    m = TGBMetrics()
    junk = np.where(mask, neg, 99.0)           # padded entries hold anything: masked out
    for lo in range(0, P, 16):
        m.update(torch.from_numpy(pos[lo:lo + 16]), torch.from_numpy(junk[lo:lo + 16]),
                 torch.from_numpy(mask[lo:lo + 16]))
    m.update(torch.zeros(0), torch.zeros(0, q))
    out = m.compute()
    assert out["num"] == P
    assert out["mrr"] == pytest.approx(math.fsum(float(r["mrr"]) for r in per) / P, abs=1e-12)
    assert out["hits@10"] == pytest.approx(math.fsum(float(r["hits@10"]) for r in per) / P, abs=1e-12)
    assert out["mrr"] == pytest.approx(float(np.mean([r["mrr"] for r in per])), abs=1e-6)


def test_nonfinite_scores_raise():
    from tgl_dist.metrics.tgb import NonFiniteTGBScoresError
    m = TGBMetrics()
    m.update(torch.tensor([float("nan")]), torch.tensor([[0.1]]))
    with pytest.raises(NonFiniteTGBScoresError):
        m.compute()
    assert math.isnan(mrr_hits_from_ranks(torch.zeros(0))["mrr"])

