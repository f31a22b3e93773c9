"""The built-in synthetic stream: deterministic, shaped like real data, and learnable."""
import numpy as np
import torch
from sklearn.metrics import average_precision_score

from tgl_dist.data import generate_synthetic, load_dataset


def seen_before_ap(src: np.ndarray, dst: np.ndarray, test: np.ndarray, num_nodes: int, seed: int = 1) -> float:
    """AP of the heuristic "this pair interacted earlier in the stream" (EdgeBank, unlimited
    memory) on the test events against one uniformly random destination per event."""
    key = src * num_nodes + dst
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    pos_seen = first[inv] < np.arange(key.size)
    idx = np.flatnonzero(test)
    neg = np.random.default_rng(seed).integers(0, num_nodes, idx.size)
    nkey = src[idx] * num_nodes + neg
    at = np.minimum(np.searchsorted(uniq, nkey), uniq.size - 1)
    neg_seen = (uniq[at] == nkey) & (first[at] < idx)
    y = np.r_[np.ones(idx.size), np.zeros(idx.size)]
    return float(average_precision_score(y, np.r_[pos_seen[idx], neg_seen].astype(float)))


def test_defaults_and_determinism():
    g = load_dataset("synthetic")
    assert (g.num_nodes, g.num_events, g.name) == (1000, 20000, "synthetic")
    h = generate_synthetic(seed=0)
    assert g.fingerprint() == h.fingerprint() and torch.equal(g.dst, h.dst)
    assert generate_synthetic(seed=1).fingerprint() != g.fingerprint()
    assert bool((g.src != g.dst).all())                          # no self-loops
    assert bool((g.t[1:] >= g.t[:-1]).all()) and float(g.t.min()) >= 0


def test_sizes_and_features_options():
    g = load_dataset("synthetic", num_nodes=200, num_events=3000, seed=5, edge_dim=4, node_dim=3)
    assert (g.num_nodes, g.num_events) == (200, 3000)
    assert g.edge_attr.shape == (3000, 4) and g.node_feat.shape == (200, 3)
    assert int(torch.cat([g.src, g.dst]).max()) < 200


def test_heavy_tailed_activity_and_bursts():
    g = generate_synthetic()
    deg = np.bincount(torch.cat([g.src, g.dst]).numpy(), minlength=g.num_nodes)
    top = np.sort(deg)[::-1][: g.num_nodes // 10].sum() / deg.sum()
    assert top > 0.3                                            # top 10 % of nodes: > 30 % of endpoints
    gaps = np.diff(g.t.numpy())
    # bursty: inter-event gaps vary far more than a Poisson stream's (coefficient of variation 1)
    assert gaps.std() / gaps.mean() > 1.3


def test_stream_is_learnable_by_a_simple_heuristic():
    g = generate_synthetic()
    src, dst, test = g.src.numpy(), g.dst.numpy(), g.test_mask.numpy()
    ap = seen_before_ap(src, dst, test, g.num_nodes)
    assert ap > 0.65, ap
    # control: the same sources with shuffled destinations are not learnable this way
    shuffled = np.random.default_rng(0).permutation(dst)
    assert seen_before_ap(src, shuffled, test, g.num_nodes) < 0.56


def test_fingerprint_sees_feature_label_and_mask_values():
    # partitions are reused when the fingerprint matches: the same events with other
    # feature values or labels (an edited .npy, a label column) must not match
    import dataclasses
    base = generate_synthetic(num_nodes=50, num_events=400, seed=2)
    E, N = base.num_events, base.num_nodes
    g = dataclasses.replace(base, edge_attr=torch.randn(E, 3, generator=torch.Generator().manual_seed(0)),
                            node_feat=torch.randn(N, 2, generator=torch.Generator().manual_seed(1)),
                            labels=torch.zeros(E, dtype=torch.long))
    same = dataclasses.replace(g, edge_attr=g.edge_attr.clone(), node_feat=g.node_feat.clone(),
                               labels=g.labels.clone())
    assert same.fingerprint() == g.fingerprint()
    for field in ("edge_attr", "node_feat", "labels"):
        x = getattr(g, field).clone()
        x.view(-1)[0] += 1
        assert dataclasses.replace(g, **{field: x}).fingerprint() != g.fingerprint(), field


def test_split_quantiles_match_torch_and_have_no_size_limit():
    """The split times are torch.quantile's values bit for bit, and a stream longer than
    torch.quantile's 2^24 limit still splits (its boundaries at 70 % and 85 % of t)."""
    from tgl_dist.data.temporal import sorted_quantiles
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 100, 1001, 59_835):
        t = torch.sort(torch.rand(n, generator=g, dtype=torch.float64) * 1e6).values.round()
        for qs in ([0.7, 0.85], [0.0, 1.0], [0.3, 0.5]):
            want = torch.quantile(t, torch.tensor(qs, dtype=torch.float64)).tolist()
            assert sorted_quantiles(t, qs) == want
    E = 2**24 + 1
    t = torch.arange(E, dtype=torch.float64)
    assert sorted_quantiles(t, [0.7, 0.85]) == [0.7 * (E - 1), 0.85 * (E - 1)]


def test_inductive_masks_follow_the_dyglib_protocol():
    """``new_node_{val,test}`` are the evaluation events with an endpoint that no
    inductive-training event touches; the held-out nodes' training events are left out."""
    from tgl_dist.data import TemporalGraph
    gen = torch.Generator().manual_seed(0)
    N, E = 30, 400
    g = TemporalGraph(torch.randint(0, N, (E,), generator=gen), torch.randint(0, N, (E,), generator=gen),
                      torch.arange(E, dtype=torch.float64), num_nodes=N)
    for ratio in (0.0, 0.2):
        g.split(new_node_ratio=ratio)
        m = g.masks
        ind = m["inductive_train"]
        assert bool((ind <= m["train"]).all())
        seen = torch.zeros(N, dtype=torch.bool)
        seen[g.src[ind]] = True
        seen[g.dst[ind]] = True
        unseen = ~seen[g.src] | ~seen[g.dst]
        assert torch.equal(m["new_node_val"], m["val"] & unseen)
        assert torch.equal(m["new_node_test"], m["test"] & unseen)
        held_out = m["train"] & ~ind
        if ratio == 0.0:
            assert not held_out.any()
        else:   # 6 nodes held out: each left-out event has an endpoint never trained on
            assert held_out.any() and m["new_node_test"].any()
            assert not (seen[g.src[held_out]] & seen[g.dst[held_out]]).any()
