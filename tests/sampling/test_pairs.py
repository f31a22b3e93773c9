"""PairShards: distinct pairs cut over ranks; the window draws equal one process's."""
import pytest
import torch

from tgl_dist.sampling.negative import NegativeSampling, Stream
from tgl_dist.sampling.pairs import PairShards, draw_distinct
from tgl_dist.testing import run_distributed

N = 60


def random_stream(seed=0, e=4000):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 30, (e,), generator=g)
    dst = torch.randint(30, N, (e,), generator=g)
    t = torch.sort(torch.randint(0, 900, (e,), generator=g).double()).values   # ties
    # a skewed owner: rank 2 owns nothing in the first fifth, rank 0 most of the rest
    owner = torch.randint(0, 4, (e,), generator=g).clamp(max=2)
    owner[: e // 5] = owner[: e // 5] % 2
    return src, dst, t, owner


WINDOWS = [(0, 60), (700, 790), (790, 880), (2000, 2001), (3900, 4000)]


def draws(src, dst, t, owner, rank):
    """Each window's negatives (historical, inductive; sizes below and above the
    candidates) from this rank's events, and this rank's share of the pairs."""
    mine = owner == rank
    s = Stream(src[mine], dst[mine], t[mine], N)
    out = {}
    for strategy, t_obs in (("historical", None), ("inductive", 300.0)):
        b = NegativeSampling(strategy=strategy, seed=5).bind("test", False, s, None,
                                                             last_observed_time=t_obs)
        out[strategy + "_share"] = (b.pairs.keys.numel(), b.pairs.num_pairs)
        for lo, hi in WINDOWS:
            sel = mine.clone()
            sel[:lo] = False
            sel[hi:] = False
            for size in (5, 400, 3000):
                hint = None if size == 5 else hi - lo    # both forms of step 1
                ns, nd = b.window(src[sel], dst[sel], t[sel], size, lo, 0, hint)
                out[(strategy, lo, size)] = (ns, nd)
    return out


def _worker():
    from tgl_dist import DistributedContext
    from tgl_dist.dist import world
    DistributedContext.init()
    rank, _ = world()
    return draws(*random_stream(), rank)


@pytest.mark.distributed
def test_three_ranks_draw_what_one_process_draws():
    src, dst, t, owner = random_stream()
    one = draws(src, dst, t, torch.zeros_like(owner), 0)
    results = run_distributed(_worker, 3, timeout=180)
    for key, (ns, nd) in ((k, v) for k, v in one.items() if not str(k).endswith("_share")):
        for r in results:
            assert torch.equal(r[key][0], ns) and torch.equal(r[key][1], nd), key
    for strategy in ("historical", "inductive"):
        shares = [r[strategy + "_share"] for r in results]
        total = one[strategy + "_share"][1]
        assert all(tot == total for _, tot in shares) and sum(n for n, _ in shares) == total
        assert max(n for n, _ in shares) < 0.45 * total, shares   # about a third each


def test_pairs_are_cut_in_first_seen_order():
    src, dst, t, _ = random_stream(1, 500)
    sh = PairShards(src, dst, t, N)
    key = src * N + dst
    first = {}
    for k, tt in zip(key.tolist(), t.tolist()):
        first.setdefault(k, tt)
    ref = sorted(first.items(), key=lambda kv: (kv[1], kv[0]))
    assert sh.keys.tolist() == [k for k, _ in ref] and sh.first.tolist() == [f for _, f in ref]
    assert sh.num_pairs == len(ref) and sh.offsets.tolist() == [0, len(ref)]


def test_draw_distinct_is_a_uniform_subset():
    g = torch.Generator().manual_seed(0)
    import tgl_dist.sampling.pairs as pairs_mod
    for m, size in ((10, 10), (10, 3), (5_000_000, 1000), (3_000_000, 2_000_000)):
        d = draw_distinct(m, size, g)
        assert d.numel() == size == d.unique().numel() and int(d.min()) >= 0 and int(d.max()) < m
    assert pairs_mod.SMALL < 5_000_000   # the 5M case took the O(size) path
    hits = torch.bincount(torch.cat([draw_distinct(3_000_000, 3, g) % 3 for _ in range(3000)]),
                          minlength=3).float()
    assert float((hits / hits.sum() - 1 / 3).abs().max()) < 0.03
