"""EdgeBank (unlimited memory and window): exact on hand-built streams, the vectorised split
scoring equal to TGB's batch-by-batch loop, sane on the built-in stream, and the same on
one and two ranks (TGBMetrics too)."""
import math

import numpy as np
import pytest
import torch

from tgl_dist.data import load_dataset
from tgl_dist.metrics import EdgeBank, EdgeBankMetrics, TGBMetrics, evaluate_edgebank
from tgl_dist.metrics.edgebank import pair_keys
from tgl_dist.testing import run_distributed

T = torch.tensor


def test_predict_and_update():
    b = EdgeBank()
    assert len(b) == 0 and b.predict(T([0]), T([1])).tolist() == [0.0]
    b.update(T([0, 1, 0]), T([1, 2, 1]))
    assert len(b) == 2
    # directed: (1, 0) was never seen; shape follows src
    assert b.predict(T([[0, 1], [1, 2]]), T([[1, 0], [2, 1]])).tolist() == [[1.0, 0.0], [1.0, 0.0]]
    with pytest.raises(ValueError, match="2\\^31"):
        b.predict(T([-1]), T([0]))


def test_many_small_updates_stay_exact():
    g = torch.Generator().manual_seed(0)
    b, seen = EdgeBank(), set()
    for _ in range(300):
        s, d = torch.randint(0, 50, (7,), generator=g), torch.randint(0, 50, (7,), generator=g)
        b.update(s, d)
        seen |= set(zip(s.tolist(), d.tolist()))
    assert len(b) == len(seen) and len(b._levels) <= 12
    qs, qd = torch.randint(0, 50, (2000,), generator=g), torch.randint(0, 50, (2000,), generator=g)
    want = [float((s, d) in seen) for s, d in zip(qs.tolist(), qd.tolist())]
    assert b.predict(qs, qd).tolist() == want
    c = EdgeBank()
    c.load_state_dict(b.state_dict())
    assert torch.equal(c.keys(), b.keys()) and torch.equal(c.predict(qs, qd), b.predict(qs, qd))


def test_split_by_hand():
    bank = EdgeBank()
    bank.update(T([0, 1]), T([1, 2]))              # training: (0,1), (1,2)
    # batch size 1: each positive is memorised after its own batch
    out = evaluate_edgebank(bank, T([0, 2, 2]), T([1, 0, 0]), T([[2, 3], [1, -1], [3, 1]]),
                            batch_size=1)
    # pos scores [1, 0, 1]; rank 1, 1 + 0.5 (the one real negative ties at 0), 1
    assert out["mrr"] == pytest.approx((1 + 1 / 1.5 + 1) / 3)
    assert out["hits@10"] == 1.0 and out["num"] == 3
    # AP/AUC against first negatives (0, 0, 0): AUC = (6 + 0.5 * 3) / 9; AP = 2/3 + 1/3 * 1/2
    assert out["auc"] == pytest.approx(7.5 / 9) and out["ap"] == pytest.approx(5 / 6)
    assert len(bank) == 3                          # (2, 0) memorised after the split


def test_same_batch_positives_do_not_see_each_other():
    # the second (2, 0) is in the same batch as the first: still unseen when scored
    s, d, neg = T([2, 2, 2]), T([0, 0, 0]), T([[5], [5], [5]])
    two = evaluate_edgebank(EdgeBank(), s, d, neg, batch_size=2)
    one = evaluate_edgebank(EdgeBank(), s, d, neg, batch_size=1)
    # batch 2: pos scores [0, 0, 1] -> ranks 1.5, 1.5, 1; batch 1: [0, 1, 1]
    assert two["mrr"] == pytest.approx((2 / 1.5 + 1) / 3)
    assert one["mrr"] == pytest.approx((1 / 1.5 + 2) / 3)


def test_negatives_with_their_own_sources():
    bank = EdgeBank()
    bank.update(T([7]), T([8]))
    # a historical negative (7, 8) is a seen pair: it scores 1, above the unseen positive
    out = evaluate_edgebank(bank, T([1]), T([2]), T([[8, 3]]), neg_src=T([[7, 1]]))
    assert out["mrr"] == pytest.approx(1 / 2.5)    # 1 + 1 greater + 0.5 * 1 equal
    assert out["auc"] == 0.0                       # first negative (7, 8) beats the positive


def _tgb_loop(hist, src, dst, negs, bs):
    """TGB's examples/linkproppred/*/edgebank.py: dict memory, per-positive Evaluator calls,
    memory updated with each batch's positives after it is scored."""
    tgb_eval = pytest.importorskip("tgb.linkproppred.evaluate", reason="py-tgb is not installed "
                                   "(pip install py-tgb, in the 'test' extra)")
    ev = tgb_eval.Evaluator(name="tgbl-wiki")
    mem = {(s, d): 1 for s, d in zip(*hist)}
    per = []
    for lo in range(0, len(src), bs):
        for i in range(lo, min(lo + bs, len(src))):
            q = [(src[i], dst[i])] + [(src[i], n) for n in negs[i]]
            y = np.array([1.0 if p in mem else 0.0 for p in q])
            per.append(ev.eval({"y_pred_pos": np.array([y[0]]), "y_pred_neg": y[1:],
                                "eval_metric": ["mrr"]})["mrr"])
        for i in range(lo, min(lo + bs, len(src))):
            mem.setdefault((src[i], dst[i]), 1)
    return per, mem


def test_vectorised_equals_tgbs_loop():
    g = load_dataset("synthetic", num_nodes=60, num_events=3000, seed=3)
    tr, te = g.train_mask, g.val_mask | g.test_mask
    rng = np.random.default_rng(0)
    P = int(te.sum())
    lens = rng.integers(1, 21, size=P)            # ragged, as TGB's short pools
    negs = [rng.choice(60, size=n, replace=False).tolist() for n in lens]
    pad = torch.full((P, 20), -1, dtype=torch.long)
    for i, n in enumerate(negs):
        pad[i, :len(n)] = T(n)
    hist = (g.src[tr].tolist(), g.dst[tr].tolist())
    per, mem = _tgb_loop(hist, g.src[te].tolist(), g.dst[te].tolist(), negs, 200)
    bank = EdgeBank()
    bank.update(g.src[tr], g.dst[tr])
    out = evaluate_edgebank(bank, g.src[te], g.dst[te], pad, batch_size=200)
    assert out["num"] == P
    assert out["mrr"] == pytest.approx(math.fsum(float(x) for x in per) / P, abs=1e-12)
    assert out["mrr"] == pytest.approx(float(np.mean(per)), abs=1e-6)   # the example's mean
    assert len(bank) == len(mem)
    # and the same through the public batch API (predict, then update)
    ref = EdgeBank()
    ref.update(g.src[tr], g.dst[tr])
    m = TGBMetrics()
    for lo in range(0, P, 200):
        s, d, n = g.src[te][lo:lo + 200], g.dst[te][lo:lo + 200], pad[lo:lo + 200]
        valid = n >= 0
        ns = ref.predict(s.view(-1, 1).expand_as(n)[valid], n[valid])
        neg = torch.zeros(n.shape)
        neg[valid] = ns
        m.update(ref.predict(s, d), neg, valid)
        ref.update(s, d)
    assert m.compute()["mrr"] == out["mrr"]


def test_sane_on_the_builtin_stream():
    g = load_dataset("synthetic")
    bank = EdgeBank()
    bank.update(g.src[g.train_mask], g.dst[g.train_mask])
    val = evaluate_edgebank(bank, g.src[g.val_mask], g.dst[g.val_mask],
                            torch.randint(0, g.num_nodes, (int(g.val_mask.sum()), 9),
                                          generator=torch.Generator().manual_seed(0)))
    s, d = g.src[g.test_mask], g.dst[g.test_mask]
    neg = torch.randint(0, g.num_nodes, (s.numel(), 9), generator=torch.Generator().manual_seed(1))
    out = evaluate_edgebank(bank, s, d, neg)
    # about half the evaluation events repeat a seen pair, random negatives rarely do: a
    # seen positive ranks 1, an unseen one ties with ~9 unseen negatives (rank ~5.5), so
    # MRR ~ 0.5 + 0.5 / 5.5; a constant scorer gets 1 / 5.5 = 0.18, a perfect one 1
    for r in (val, out):
        assert 0.45 < r["mrr"] < 0.8 and 0.6 < r["ap"] < 0.9 and 0.65 < r["auc"] < 0.9, r
    assert out["num"] == s.numel()


def _both(chunks, hist):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    m = TGBMetrics()
    for pos, neg, mask in chunks[ctx.rank]["tgb"]:
        m.update(pos, neg, mask)
    bank = EdgeBank()
    h = hist[ctx.rank::2]                         # each rank memorises its share, then syncs
    bank.update(h[:, 0], h[:, 1])
    bank.sync()
    from tgl_dist.dist import hash_owner
    from tgl_dist.metrics.edgebank import pair_keys
    other = hist[hash_owner(pair_keys(hist[:, 0], hist[:, 1]), 2) != ctx.rank][:1]
    try:   # a synced bank answers for its own pairs only, and says so
        bank.contains(other[:, 0], other[:, 1])
        refused = ""
    except ValueError as e:
        refused = str(e)
    eb = EdgeBankMetrics(bank)
    for step, s, d, n in chunks[ctx.rank]["eb"]:
        eb.update(step, s, d, n)
    return m.compute(), eb.compute(), len(bank), refused


@pytest.mark.distributed
def test_two_ranks_equal_one():
    g = torch.Generator().manual_seed(2)
    parts = [(torch.randint(0, 3, (n,), generator=g).float(),
              torch.randint(0, 3, (n, 6), generator=g).float(),
              torch.rand(n, 6, generator=g) < 0.8) for n in (25, 11, 4)]
    one = TGBMetrics()
    for p in parts:
        one.update(*p)
    ref = one.compute()
    hist = torch.randint(0, 12, (40, 2), generator=g)
    ev = torch.randint(0, 12, (60, 2), generator=g)
    negs = torch.randint(-1, 12, (60, 4), generator=g)
    bank = EdgeBank()
    bank.update(hist[:, 0], hist[:, 1])
    ref_eb = evaluate_edgebank(bank, ev[:, 0], ev[:, 1], negs, batch_size=10)
    # step s = events 10s..10s+9, split unevenly: rank 0 the first 7, rank 1 the rest
    eb = [[], []]
    for s in range(6):
        lo, mid, hi = 10 * s, 10 * s + 7, 10 * s + 10
        eb[0].append((s, ev[lo:mid, 0], ev[lo:mid, 1], negs[lo:mid]))
        eb[1].append((s, ev[mid:hi, 0], ev[mid:hi, 1], negs[mid:hi]))
    eb[1][2] = (2, ev[:0, 0], ev[:0, 1], negs[:0])   # rank 1 has no event in step 2
    ev2 = torch.cat([ev[:27], ev[30:]])
    bank = EdgeBank()
    bank.update(hist[:, 0], hist[:, 1])
    ref_eb2 = EdgeBankMetrics(bank)
    for r in (0, 1):
        for step, s, d, n in eb[r]:
            ref_eb2.update(step, s, d, n)
    ref_eb2 = ref_eb2.compute()
    chunks = [{"tgb": parts[:2], "eb": eb[0]}, {"tgb": parts[2:], "eb": eb[1]}]
    held = []
    for tgb_out, eb_out, n, refused in run_distributed(_both, 2, chunks, hist):
        assert "held by rank" in refused and "EdgeBankMetrics.compute" in refused, refused
        assert tgb_out == ref
        assert eb_out["num"] == ev2.size(0)
        for k in ("ap", "auc", "mrr", "hits@10"):
            assert eb_out[k] == pytest.approx(ref_eb2[k], abs=1e-12), k
        held.append(n)
    # the memory is sharded: each pair on one rank, none holds them all
    total = len(set(map(tuple, hist.tolist())) | set(map(tuple, ev2.tolist())))
    assert sum(held) == total and max(held) < total, (held, total)
    assert ref_eb["num"] == 60


def test_pair_keys_are_unique():
    s, d = torch.meshgrid(T([0, 1, 2**31 - 1]), T([0, 5, 2**31 - 1]), indexing="ij")
    k = pair_keys(s.reshape(-1), d.reshape(-1))
    assert k.unique().numel() == 9
