"""The synthetic generator in chunks: long streams are drawn in bounded memory, with the
same shape as the one-chunk stream, and the one-chunk stream is unchanged."""
import numpy as np
import torch

from tgl_dist.data import generate_synthetic
from tgl_dist.data.synthetic import CHUNK

from test_synthetic import seen_before_ap


def test_one_chunk_is_the_default_stream():
    g = generate_synthetic()
    assert g.num_events <= CHUNK
    h = generate_synthetic(chunk_size=g.num_events)          # exactly one chunk
    assert g.fingerprint() == h.fingerprint()


def test_chunked_stream_is_deterministic_sorted_and_learnable():
    g = generate_synthetic(chunk_size=3000, edge_dim=3)      # 7 chunks of the default 20,000
    h = generate_synthetic(chunk_size=3000, edge_dim=3)
    assert g.fingerprint() == h.fingerprint()
    assert g.fingerprint() != generate_synthetic().fingerprint()
    assert (g.num_nodes, g.num_events) == (1000, 20000) and g.edge_attr.shape == (20000, 3)
    assert bool((g.src != g.dst).all()) and bool((g.t[1:] >= g.t[:-1]).all())
    assert int(torch.cat([g.src, g.dst]).max()) < g.num_nodes
    src, dst = g.src.numpy(), g.dst.numpy()
    deg = np.bincount(np.r_[src, dst], minlength=g.num_nodes)
    assert np.sort(deg)[::-1][: g.num_nodes // 10].sum() / deg.sum() > 0.3
    gaps = np.diff(g.t.numpy())
    assert gaps.std() / gaps.mean() > 1.3
    assert seen_before_ap(src, dst, g.test_mask.numpy(), g.num_nodes) > 0.65


def test_chunked_generation_holds_no_full_size_temporaries():
    # the chunked path allocates its [E] results once; its peak is the results plus
    # chunk-sized buffers (measured through tracemalloc, which numpy reports to)
    import tracemalloc
    E = 400_000
    tracemalloc.start()
    generate_synthetic(num_nodes=20_000, num_events=E, chunk_size=20_000)
    _, peak_chunked = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tracemalloc.start()
    generate_synthetic(num_nodes=20_000, num_events=E, chunk_size=E)
    _, peak_one = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # results: src, dst, t (24 B) + eid (8 B) + 6 masks (6 B) per event
    assert peak_chunked < 2.0 * 38 * E, peak_chunked
    assert peak_chunked < 0.75 * peak_one, (peak_chunked, peak_one)
