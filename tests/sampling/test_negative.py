"""NegativeSampling against DyGLib's definitions on small hand-built streams."""
import pytest
import torch

from tgl_dist.sampling import NegativeSampling
from tgl_dist.sampling.negative import Stream

#          pair:  (0,5) (1,6) (0,5) (2,7) (3,8) (1,6) (4,9) (2,7) (3,9)
SRC = torch.tensor([0, 1, 0, 2, 3, 1, 4, 2, 3])
DST = torch.tensor([5, 6, 5, 7, 8, 6, 9, 7, 9])
T = torch.tensor([1., 2., 3., 4., 5., 6., 7., 8., 9.], dtype=torch.float64)
N = 10


def stream():
    return Stream(SRC, DST, T, N)


def pairs(s, d):
    return set(zip(s.tolist(), d.tolist()))


def test_historical_candidates_are_h_minus_c():
    ns = NegativeSampling(strategy="historical", seed=1)
    b = ns.bind("val", False, stream(), None)
    assert torch.equal(b.pool, torch.unique(DST))
    # batch [6, 8]: H = pairs with t <= 6: (0,5),(1,6),(2,7),(3,8); C = pairs in [6, 8]: (1,6),(4,9),(2,7)
    w = (SRC[5:8], DST[5:8], T[5:8])
    s, d = b.window(*w, 2, window_id=5, epoch=0)
    assert pairs(s, d) == {(0, 5), (3, 8)}  # enough candidates: drawn without replacement
    # too few candidates: all of them plus fill from unique src x unique dst minus positives
    s, d = b.window(*w, 6, window_id=5, epoch=0)
    got = list(zip(s.tolist(), d.tolist()))
    assert len(got) == 6
    assert set(got[-2:]) == {(0, 5), (3, 8)}  # DyGLib order: random fill first, then historical
    for p in got[:4]:
        assert p[0] in set(SRC.tolist()) and p[1] in set(DST.tolist())
        assert p not in pairs(SRC[5:8], DST[5:8])
    # deterministic for a window; evaluation ignores the epoch
    assert torch.equal(b.window(*w, 6, 5, 0)[1], b.window(*w, 6, 5, 9)[1])


def test_ties_at_the_window_ends_are_in_c():
    """C holds the pairs of every stream event in [t_s, t_e], also events outside the
    window that share its first or last time."""
    src, dst = torch.tensor([0, 1, 2, 3]), torch.tensor([5, 6, 7, 8])
    t = torch.tensor([1., 2., 2., 3.], dtype=torch.float64)
    b = NegativeSampling(strategy="historical").bind("val", False, Stream(src, dst, t, N), None)
    # window = event 2 alone (t = 2): H = (0,5),(1,6),(2,7); event 1 ties at t = 2: C = (1,6),(2,7)
    s, d = b.window(src[2:3], dst[2:3], t[2:3], 1, 2, 0)
    assert pairs(s, d) == {(0, 5)}


def test_inductive_candidates_first_seen_after_observation():
    ns = NegativeSampling(strategy="inductive")
    with pytest.raises(ValueError, match="T_obs"):
        ns.bind("test", False, stream(), None)
    b = ns.bind("test", False, stream(), None, last_observed_time=3.0)
    # batch [9, 9]: H = all pairs with t <= 9; O = pairs with t <= 3: (0,5),(1,6); C = (3,9)
    s, d = b.window(SRC[8:], DST[8:], T[8:], 3, 8, 0)
    assert pairs(s, d) == {(2, 7), (3, 8), (4, 9)}
    # a pair first seen exactly at T_obs is observed: (2,7) at t = 4
    b4 = ns.bind("test", False, stream(), None, last_observed_time=4.0)
    s, d = b4.window(SRC[8:], DST[8:], T[8:], 2, 8, 0)
    assert pairs(s, d) == {(3, 8), (4, 9)}


@pytest.mark.parametrize("small", [1 << 20, 4])
def test_window_draws_follow_the_definition(monkeypatch, small):
    """On a random stream: every draw lies in H \\ O \\ C of its window, a window's draws are
    distinct while the candidates suffice, and both draw paths (a permutation for small
    candidate sets, repeat-dropping random positions for large ones) keep to that."""
    import tgl_dist.sampling.pairs as pairs_mod
    monkeypatch.setattr(pairs_mod, "SMALL", small)
    g = torch.Generator().manual_seed(0)
    n, e = 40, 3000
    src, dst = torch.randint(0, 20, (e,), generator=g), torch.randint(20, n, (e,), generator=g)
    t = torch.sort(torch.randint(0, 600, (e,), generator=g).double()).values   # many ties
    key = src * n + dst
    first = {}
    for k, tt in zip(key.tolist(), t.tolist()):
        first.setdefault(k, tt)
    for strategy, t_obs in (("historical", None), ("inductive", 150.0)):
        b = NegativeSampling(strategy=strategy, seed=4).bind("test", False, Stream(src, dst, t, n),
                                                             None, last_observed_time=t_obs)
        for lo in range(0, e, 250):
            hi = lo + 50
            ts, te = float(t[lo]), float(t[hi - 1])
            cur = set(key[(t >= ts) & (t <= te)].tolist())
            cand = {k for k, f in first.items() if f <= ts and (t_obs is None or f > t_obs)} - cur
            size = min(len(cand), 30)
            s, d = b.window(src[lo:hi], dst[lo:hi], t[lo:hi], size, lo, 0)
            got = (s * n + d).tolist()
            assert len(set(got)) == size and set(got) <= cand, (strategy, lo)


def test_random_per_event_deterministic_and_in_pool():
    pool = torch.tensor([5, 7, 9])
    ns = NegativeSampling(strategy="random", num_neg=4, seed=3)
    ev = ns.bind("val", False, Stream(SRC[:0], DST[:0], T[:0], N), pool)
    eid = torch.arange(2000)
    a = ev.random(eid, epoch=0)
    assert a.shape == (4, 2000) and bool(torch.isin(a, pool).all())
    # the same event gets the same negatives whatever batch it is in; evaluation ignores epochs
    assert torch.equal(ev.random(eid[1000:1100], epoch=5), a[:, 1000:1100])
    counts = torch.bincount(a.reshape(-1), minlength=10)[pool].float()
    assert float((counts - 8000 / 3).abs().max()) < 200  # uniform over the pool
    tr = ns.bind("train", True, Stream(SRC[:0], DST[:0], T[:0], N), pool)
    assert not torch.equal(tr.random(eid, 0), tr.random(eid, 1))
    assert torch.equal(tr.random(eid, 1), tr.random(eid, 1))
    assert not torch.equal(tr.random(eid, 0), a)


def test_fill_draws_without_replacement_and_never_a_positive():
    """|H \\ C| too small: the fill comes from unique src x unique dst minus the batch's
    positives without replacement (algorithms.md §3); with replacement only when that
    pool itself is too small."""
    ns = NegativeSampling(strategy="historical", seed=0)
    b = ns.bind("val", False, stream(), None)                 # 5 src x 5 dst = 25 pairs
    pos_s, pos_d = SRC[5:8], DST[5:8]                        # 3 positives, all in the product
    for w in range(200):
        s, d = b._fill(22, pos_s * N + pos_d, torch.Generator().manual_seed(w))
        got = list(zip(s.tolist(), d.tolist()))
        assert len(set(got)) == 22                            # the whole pool, no repeat
        assert not set(got) & pairs(pos_s, pos_d)
    s, d = b._fill(30, pos_s * N + pos_d, torch.Generator().manual_seed(0))
    got = list(zip(s.tolist(), d.tolist()))                   # 30 > 22: repeats, still no positive
    assert len(got) == 30 and len(set(got)) < 30 and not set(got) & pairs(pos_s, pos_d)
    # a product too large to enumerate: drawn, repeats dropped
    big = NegativeSampling(strategy="historical", seed=0).bind(
        "val", False, Stream(torch.arange(2000), torch.arange(2000, 4000),
                             torch.arange(2000, dtype=torch.float64), 4000), None)
    pos = torch.arange(2000) * 4000 + torch.arange(2000, 4000)
    s, d = big._fill(5000, pos, torch.Generator().manual_seed(1))
    keys = s * 4000 + d
    assert keys.unique().numel() == 5000 and not bool(torch.isin(keys, pos).any())


def test_evaluation_random_negatives_avoid_the_positive_destination():
    pool = torch.tensor([5, 7, 9])
    ns = NegativeSampling(strategy="random", num_neg=9, seed=3)
    ev = ns.bind("test", False, Stream(SRC[:0], DST[:0], T[:0], N), pool)
    eid = torch.arange(3000)
    dst = pool[eid % 3]
    plain, kept = ev.random(eid, 0), ev.random(eid, 0, dst)
    assert bool((plain == dst).any())                  # a third of the plain draws collide
    assert not bool((kept == dst).any()) and bool(torch.isin(kept, pool).all())
    # only collisions with the positive redrawn: a pool of 3 cannot give 9 distinct
    # candidates, so repeats stay (see the next test)
    assert torch.equal(kept[plain != dst], plain[plain != dst])
    assert torch.equal(ev.random(eid[100:200], 0, dst[100:200]), kept[:, 100:200])
    one = ns.bind("test", False, Stream(SRC[:0], DST[:0], T[:0], N), torch.tensor([5]))
    assert torch.equal(one.random(eid[:4], 0, torch.full((4,), 5)), torch.full((9, 4), 5))


def test_evaluation_candidates_of_an_event_are_distinct():
    # TGB's generator draws an event's k candidates without replacement: no repeats among
    # them when the pool has k + 1 ids or more, and a draw stays as drawn unless it repeats
    # an earlier one or equals the positive
    from tgl_dist.sampling.negative import _repeats
    pool = torch.arange(100, 130)
    ns = NegativeSampling(strategy="random", num_neg=9, seed=3)
    ev = ns.bind("test", False, Stream(SRC[:0], DST[:0], T[:0], N), pool)
    eid = torch.arange(4000)
    dst = pool[eid % 30]
    plain, kept = ev.random(eid, 0), ev.random(eid, 0, dst)
    assert bool(_repeats(plain).any())                 # ~70 % of events repeat an id
    srt = kept.sort(0).values
    assert not bool((srt[1:] == srt[:-1]).any()) and not bool((kept == dst).any())
    fine = (plain != dst) & ~_repeats(plain)
    assert torch.equal(kept[fine], plain[fine])
    assert torch.equal(ev.random(eid, 0, dst), kept)   # deterministic
    # _repeats marks the later copies only
    x = torch.tensor([[1, 2], [1, 3], [4, 2], [1, 2]])
    assert _repeats(x).tolist() == [[False, False], [True, False], [False, True], [True, True]]


@pytest.mark.parametrize("n,k", [(10, 9), (11, 9), (12, 9), (100, 99), (6, 9)])
def test_evaluation_candidates_when_the_pool_is_about_k(n, k):
    # redraws alone leave the positive or repeats for pools of about k ids (with k = 9:
    # 406 of 20,000 events held their positive at n = 10); the completion gives every
    # event k distinct ids other than its positive whenever the pool has k + 1 ids
    from tgl_dist.sampling.negative import _repeats
    pool = torch.arange(n) * 3 + 7
    ns = NegativeSampling(strategy="random", num_neg=k, seed=1)
    ev = ns.bind("test", False, Stream(SRC[:0], DST[:0], T[:0], N), pool)
    eid = torch.arange(3000 if k < 50 else 300)
    dst = pool[eid % n]
    neg = ev.random(eid, 0, dst)
    assert not bool((neg == dst).any()) and bool(torch.isin(neg, pool).all())
    if n > k:
        assert not bool(_repeats(neg).any())
    else:   # fewer ids than k besides the positive: repeats unavoidable
        assert bool(_repeats(neg).any(0).all())
    assert torch.equal(ev.random(eid[40:90], 0, dst[40:90]), neg[:, 40:90])


def test_bad_arguments():
    with pytest.raises(ValueError, match="strategy"):
        NegativeSampling(strategy="hard")
    with pytest.raises(ValueError, match="mode"):
        NegativeSampling(mode="pair")
    with pytest.raises(ValueError, match="num_neg"):
        NegativeSampling(num_neg=0)
