"""The compiled attention kernels (tgl_dist/kernels/attention.c) against torch references:
the segment kernel's own contract in float64, and each attention layer's two paths (the
compiled op its ``forward`` dispatches to on CPU float32, and its torch ``reference``,
per edge) on the same blocks, values and gradients."""
import os
import subprocess
import sys

import pytest
import torch

from blocks_util import make_batch
from tgl_dist.nn import TemporalAttention, TGNAttention
from tgl_dist.nn._attention_kernel import SegmentAttention, get_attention_kernel
from tgl_dist.nn.attention import csr_offsets
from tgl_dist.sampling.block import Block

LIB = get_attention_kernel()
needs_kernel = pytest.mark.skipif(LIB is None, reason="TGL_DIST_NO_KERNEL=1 or no C compiler: the attention kernel "
                                  "cannot be built (the layers run their torch reference)")


def _reference(qx, qb, hs, idx, X, ptr, mask, slope):
    """The kernel's contract, written with torch ops over edges (float64)."""
    D, H, _ = qx.shape
    M = int(ptr[-1])
    dst = torch.repeat_interleave(torch.arange(D), ptr[1:] - ptr[:-1])
    parts = ([hs[idx]] if hs is not None else []) + ([X] if X is not None else [])
    xe = torch.cat(parts, 1)                                            # [M, Cx]
    s = (qx[dst] * xe.unsqueeze(1)).sum(-1)                             # [M, H]
    if qb is not None:
        s = s + qb[dst]
    if slope is not None:
        s = torch.nn.functional.leaky_relu(s, slope)
    smax = torch.full((D, H), -float("inf"), dtype=s.dtype).scatter_reduce(
        0, dst.unsqueeze(1).expand(M, H), s, "amax")
    e = (s - smax[dst]).exp()
    den = torch.zeros(D, H, dtype=s.dtype).index_add(0, dst, e)
    w = e / den[dst]
    if mask is not None:
        w = w * mask
    aggx = torch.zeros(D, H, xe.size(1), dtype=s.dtype).index_add(0, dst, w.unsqueeze(-1) * xe.unsqueeze(1))
    asum = torch.zeros(D, H, dtype=s.dtype).index_add(0, dst, w)
    return aggx, asum


def _case(seed, D=7, H=3, dn=5, cx=4, U=9, with_qb=True, with_mask=False):
    g = torch.Generator().manual_seed(seed)
    deg = torch.randint(0, 5, (D,), generator=g)
    deg[1] = 0                                              # an empty destination
    ptr = torch.zeros(D + 1, dtype=torch.long)
    ptr[1:] = torch.cumsum(deg, 0)
    M = int(ptr[-1])
    qx = torch.randn(D, H, dn + cx, generator=g)
    qb = torch.randn(D, H, generator=g) if with_qb else None
    hs = torch.randn(U, dn, generator=g) if dn else None
    idx = torch.randint(0, U, (M,), generator=g) if dn else None
    X = torch.randn(M, cx, generator=g) if cx else None
    mask = (torch.rand(M, H, generator=g) > 0.3).float() / 0.7 if with_mask else None
    return qx, qb, hs, idx, X, ptr, mask


@needs_kernel
@pytest.mark.parametrize("dn,cx", [(5, 4), (0, 4), (5, 0)])
@pytest.mark.parametrize("slope", [None, 0.2])
@pytest.mark.parametrize("with_mask", [False, True])
def test_kernel_matches_its_contract(dn, cx, slope, with_mask):
    qx, qb, hs, idx, X, ptr, mask = _case(1, dn=dn, cx=cx, with_mask=with_mask)
    leaves = [t for t in (qx, qb, hs, X) if t is not None]
    for t in leaves:
        t.requires_grad_(True)
    aggx, asum = SegmentAttention.apply(qx, qb, hs, idx, X, ptr, mask, slope, LIB, 1)
    g1, g2 = torch.randn_like(aggx), torch.randn_like(asum)
    got = torch.autograd.grad((aggx * g1).sum() + (asum * g2).sum(), leaves)
    d64 = [t.detach().double().requires_grad_(True) for t in leaves]
    it = iter(d64)
    args = [next(it) if t is not None else None for t in (qx, qb, hs)]
    x64 = next(it) if X is not None else None
    raggx, rasum = _reference(args[0], args[1], args[2], idx, x64, ptr,
                              None if mask is None else mask.double(), slope)
    want = torch.autograd.grad((raggx * g1.double()).sum() + (rasum * g2.double()).sum(), d64)
    assert torch.allclose(aggx.double(), raggx, atol=1e-5)
    assert torch.allclose(asum.double(), rasum, atol=1e-5)
    assert float(aggx[1].abs().max()) == 0.0 and float(asum[1].abs().max()) == 0.0  # no edges
    for a, b in zip(got, want):
        assert torch.allclose(a.double(), b, atol=1e-4), float((a.double() - b).abs().max())


@needs_kernel
def test_kernel_threads_give_the_same_result():
    qx, qb, hs, idx, X, ptr, mask = _case(2, D=40)
    for t in (qx, hs, X):
        t.requires_grad_(True)
    res = []
    for threads in (1, 3):
        out = SegmentAttention.apply(qx, qb, hs, idx, X, ptr, mask, 0.2, LIB, threads)
        res.append([*out, *torch.autograd.grad(out[0].square().sum(), [qx, hs, X])])
    for a, b in zip(*res):
        assert torch.allclose(a, b, atol=1e-6)


@needs_kernel
def test_kernel_rejects_bad_indices_and_too_many_heads():
    qx, qb, hs, idx, X, ptr, mask = _case(3)
    bad = idx.clone()
    bad[0] = hs.size(0)
    with pytest.raises(ValueError, match="idx must hold"):
        SegmentAttention.apply(qx, qb, hs, bad, X, ptr, mask, None, LIB, 1)
    with pytest.raises(ValueError, match="qx has width"):
        SegmentAttention.apply(qx[..., 1:], qb, hs, idx, X, ptr, mask, None, LIB, 1)
    big = torch.randn(qx.size(0), 17, qx.size(2))
    with pytest.raises(ValueError, match="at most 16 heads"):
        SegmentAttention.apply(big, None, hs, idx, X, ptr, None, None, LIB, 1)


def _two_paths(layer, b, h, rows):
    """(output, grads) of the compiled path (``layer(...)``) and of ``layer.reference``."""
    res = []
    for fn in (layer, layer.reference):
        out = fn(b, h, rows)
        grads = torch.autograd.grad((out ** 2).sum(), [h] + list(layer.parameters()))
        res.append((out, grads))
    return res


def _compiled(layer, out):
    """Whether ``out`` came from the layer's compiled op (its one autograd node for
    TemporalAttention; the segment kernel's node inside TGNAttention's graph)."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        if type(f).__name__ in ("AttentionLayerBackward", "SegmentAttentionBackward"):
            return True
        todo.extend(g for g, _ in f.next_functions)
    return False


@needs_kernel
@pytest.mark.parametrize("cls", [TemporalAttention, TGNAttention])
@pytest.mark.parametrize("dim_edge", [0, 3])
@pytest.mark.parametrize("use_rows", [False, True])
def test_layers_compiled_equals_reference(cls, dim_edge, use_rows):
    torch.manual_seed(0)
    layer = cls(8, dim_edge, 4, 8, num_head=2).eval()
    _, mfgs, _ = make_batch(6, 30, [4], dim_edge=dim_edge, seed=1)
    b = mfgs[0]
    assert layer._segment(b, torch.zeros(1, 8)) is not None  # the kernel path is taken
    assert int(torch.bincount(b.edge_index[1], minlength=b.num_dst).min()) == 0
    rows = None
    h = torch.randn(b.num_src, 8, requires_grad=True)
    if use_rows:  # distinct-row input: source i reads h[rows[i]]
        rows = torch.randint(0, 5, (b.num_src,))
        h = torch.randn(5, 8, requires_grad=True)
    (o1, g1), (o2, g2) = _two_paths(layer, b, h, rows)
    assert _compiled(layer, o1) and not _compiled(layer, o2)
    assert torch.allclose(o1, o2, atol=1e-5)
    for a, e in zip(g1, g2):
        assert torch.allclose(a, e, atol=1e-4, rtol=1e-4)


@needs_kernel
def test_layer_attention_dropout_through_the_kernel_is_a_mask_on_the_weights():
    """Training mode: the kernel path's output equals the per-edge path's under the same
    dropout mask (the same generator state draws the same [M, H] mask in both)."""
    torch.manual_seed(0)
    layer = TemporalAttention(8, 3, 4, 8, num_head=2, att_dropout=0.5).train()
    layer.dropout.p = 0.0
    _, mfgs, _ = make_batch(6, 30, [4], dim_edge=3, seed=4)
    b = mfgs[0]
    h = torch.randn(b.num_src, 8)
    outs = []
    for fn in (layer, layer.reference):
        torch.manual_seed(7)
        outs.append(fn(b, h))
    torch.manual_seed(8)
    other = layer(b, h)
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    assert not torch.allclose(outs[0], other, atol=1e-3)  # the mask really is random


@needs_kernel
@pytest.mark.parametrize("dim_edge,num_head", [(0, 2), (3, 2), (3, 1), (0, 4)])
def test_fused_layer_in_training_equals_the_per_edge_path_with_the_same_masks(dim_edge, num_head):
    """Both dropouts on: the one-node layer (kernel path) draws the attention mask and
    then the output mask as the differentiable per-edge path does, so under the same
    seed outputs and every gradient agree (its products batched over any number of
    heads); and its graph is one node over the leaves."""
    torch.manual_seed(0)
    layer = TemporalAttention(8, dim_edge, 4, 8, num_head=num_head, dropout=0.3,
                              att_dropout=0.4).train()
    _, mfgs, _ = make_batch(6, 30, [4], dim_edge=dim_edge, seed=2)
    b = mfgs[0]
    rows = torch.randint(0, 7, (b.num_src,))
    h = torch.randn(7, 8, requires_grad=True)
    res = []
    for fn in (layer, layer.reference):
        torch.manual_seed(11)
        out = fn(b, h, rows)
        res.append((out, torch.autograd.grad((out ** 3).sum(), [h] + list(layer.parameters()))))
        if fn is layer:
            assert type(out.grad_fn).__name__ == "AttentionLayerBackward"
            assert all(f is None or type(f).__name__ == "AccumulateGrad"
                       for f, _ in out.grad_fn.next_functions)
    (o1, g1), (o2, g2) = res
    assert torch.allclose(o1, o2, atol=1e-5)
    with torch.no_grad():
        layer.dropout.eval()  # attention dropout still on: the output mask alone is off
        torch.manual_seed(11)
        assert not torch.allclose(layer(b, h, rows), o1, atol=1e-3)  # the output mask acted
        layer.dropout.train()
    for a, e in zip(g1, g2):
        assert torch.allclose(a, e, atol=1e-4, rtol=1e-4)


@needs_kernel
def test_unsorted_edges_run_the_torch_reference():
    torch.manual_seed(0)
    layer = TemporalAttention(8, 3, 4, 8, num_head=2).eval()
    _, mfgs, _ = make_batch(6, 30, [4], dim_edge=3, seed=5)
    b = mfgs[0]
    perm = torch.randperm(b.num_edges)
    shuffled = Block(b.srcdata, {k: v[perm] for k, v in b.edata.items()}, b.edge_index[:, perm],
                     b.num_dst)
    assert csr_offsets(shuffled) is None and csr_offsets(b) is not None
    h = torch.randn(b.num_src, 8)
    assert layer._segment(shuffled, h) is None
    with torch.no_grad():
        assert torch.allclose(layer(shuffled, h), layer(b, h), atol=1e-5)


def test_no_kernel_env_selects_the_torch_reference_silently():
    code = ("import logging, sys; logging.basicConfig(stream=sys.stdout);"
            "from tgl_dist.nn._attention_kernel import get_attention_kernel as g;"
            "print('KERNEL', g())")
    env = {**os.environ, "TGL_DIST_NO_KERNEL": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "KERNEL None"  # no warning line either


def test_missing_compiler_warns_once_and_layers_still_work(tmp_path):
    code = ("import logging, sys, torch; logging.basicConfig(stream=sys.stdout);"
            "sys.path.insert(0, 'tests/ctdg');"
            "from blocks_util import make_batch;"
            "from tgl_dist.nn import TemporalAttention;"
            "from tgl_dist.nn._attention_kernel import get_attention_kernel as g;"
            "print('KERNEL', g()); print('KERNEL', g());"
            "_, m, _ = make_batch(4, 20, [3], seed=1);"
            "out = TemporalAttention(8, 0, 4, 8, num_head=2)(m[0], torch.randn(m[0].num_src, 8));"
            "print('SHAPE', tuple(out.shape))")
    env = {**os.environ, "CC": "/nonexistent/cc", "TGL_DIST_CACHE_DIR": str(tmp_path)}
    env.pop("TGL_DIST_NO_KERNEL", None)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=repo).stdout
    lines = out.strip().splitlines()
    assert lines.count("KERNEL None") == 2
    warnings = [ln for ln in lines if "attention kernel is unavailable" in ln]
    assert len(warnings) == 1
    assert lines[-1] == "SHAPE (12, 8)"  # 4 x (src, dst, neg) destinations


@needs_kernel
def test_kernel_softmax_is_stable_for_large_scores():
    # TGL's scores are not scaled by 1/sqrt(d): scores of several hundred occur, and
    # exp() of them overflows float32 unless each destination's maximum is subtracted
    g = torch.Generator().manual_seed(0)
    qx, X = torch.randn(3, 2, 4, generator=g) * 60, torch.randn(5, 4, generator=g)
    ptr = torch.tensor([0, 2, 2, 5])
    aggx, asum = SegmentAttention.apply(qx, None, None, None, X, ptr, None, 0.2, LIB, LIB.threads())
    ref = _reference(qx.double(), None, None, None, X.double(), ptr, None, 0.2)
    assert bool(torch.isfinite(aggx).all()) and torch.allclose(asum[[0, 2]], torch.ones(2, 2))
    assert torch.allclose(aggx.double(), ref[0], atol=1e-4)


def test_torch_edge_softmax_is_stable_for_large_scores():
    from tgl_dist.nn.attention import edge_softmax
    w = edge_softmax(torch.tensor([[1000.0], [999.0], [-5.0]]), torch.tensor([0, 0, 1]), 2)
    assert torch.allclose(w.view(-1), torch.tensor([0.7311, 0.2689, 1.0]), atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("cls", [TemporalAttention, TGNAttention])
def test_layers_with_a_trained_time_phase(cls):
    # TimeEncode starts with a zero phase b, which hides every term in b (phi(0) = cos b
    # and its gradient -sin b): set b as training would, then compare the two paths
    torch.manual_seed(0)
    layer = cls(8, 3, 4, 8, num_head=2).eval()
    with torch.no_grad():
        layer.time_enc.w.bias.uniform_(0.5, 1.5)
    _, mfgs, _ = make_batch(6, 30, [4], dim_edge=3, seed=1)
    h = torch.randn(mfgs[0].num_src, 8, requires_grad=True)
    (o1, g1), (o2, g2) = _two_paths(layer, mfgs[0], h, None)
    assert torch.allclose(o1, o2, atol=1e-5)
    for a, e in zip(g1, g2):
        assert torch.allclose(a, e, atol=1e-4, rtol=1e-4)


def test_tgn_attention_matches_its_formula():
    # one destination (node 0, at time 10) with two neighbours; the DyGLib variant
    # written out: scaled dot product per head, W_r + residual + LayerNorm, the merge MLP
    torch.manual_seed(0)
    layer = TGNAttention(2, 0, 2, 3, num_head=2).eval()
    with torch.no_grad():
        layer.time_enc.w.bias.uniform_(0.5, 1.5)
    b = Block({"ID": torch.tensor([0, 1, 2]), "ts": torch.tensor([10.0, 7.0, 4.0]).double()},
              {"ID": torch.tensor([0, 1]), "dt": torch.tensor([3.0, 6.0])},
              torch.tensor([[1, 2], [0, 0]]), 1)
    h = torch.randn(3, 2)
    te = layer.time_enc

    def phi(dt):
        return torch.cos(dt.view(-1, 1) * te.w.weight.view(1, -1) + te.w.bias)
    x = torch.cat([h[0], phi(torch.zeros(1))[0]])                             # [W = 4]
    xe = torch.cat([h[1:], phi(torch.tensor([3.0, 6.0]))], 1)                 # [2, 4]
    q = layer.w_q.weight @ x
    k, v = (xe @ layer.w_kv.weight.t()).split([4, 4], 1)
    agg = torch.cat([torch.softmax(k[:, c] @ q[c] / 2 ** 0.5, 0) @ v[:, c]
                     for c in (slice(0, 2), slice(2, 4))])
    o = layer.layer_norm(layer.w_res(agg) + x)
    want = layer.merge2(torch.relu(layer.merge1(torch.cat([o, h[0]]))))
    for fn in (layer, layer.reference):
        assert torch.allclose(fn(b, h)[0], want, atol=1e-5), fn


@needs_kernel
def test_csr_from_dst_matches_bincount_and_rejects_bad_input():
    from tgl_dist.nn._attention_kernel import csr_from_dst
    g = torch.Generator().manual_seed(0)
    for D in (1, 5, 40):
        deg = torch.randint(0, 4, (D,), generator=g)
        dst = torch.arange(D).repeat_interleave(deg)
        want = torch.zeros(D + 1, dtype=torch.long)
        want[1:] = torch.cumsum(deg, 0)
        assert torch.equal(csr_from_dst(dst, D), want)
    assert torch.equal(csr_from_dst(torch.zeros(0, dtype=torch.long), 3), torch.zeros(4).long())
    assert csr_from_dst(torch.tensor([0, 2, 1]), 3) is None            # not grouped
    with pytest.raises(IndexError, match="0..2"):
        csr_from_dst(torch.tensor([0, 3]), 3)
    with pytest.raises(IndexError):
        csr_from_dst(torch.tensor([-1, 0]), 3)


@needs_kernel
def test_whole_layer_calls_find_torchs_blas():
    """The compiled whole-layer calls run their products through the sgemm_ torch's own
    matrix products call; where libtorch_cpu exports it (the PyPI wheels) they are on."""
    from tgl_dist.nn._pointwise import KERNEL as POINTWISE
    from tgl_dist.kernels import torch_sgemm
    if torch_sgemm() is None:
        pytest.skip("this torch build exports no sgemm_: the layer runs its torch form")
    assert LIB.blas and LIB.tgl_att_gemm_check() == 1
    pw = POINTWISE.get()
    assert pw is None or (pw.blas and pw.tgl_pw_gemm_check() == 1)   # the GRU cell too


@needs_kernel
@pytest.mark.parametrize("dim_edge,num_head,dropout,train_time", [
    (0, 2, 0.0, True), (3, 2, 0.3, True), (0, 1, 0.3, False), (3, 4, 0.0, False)])
def test_whole_layer_call_equals_the_reference(dim_edge, num_head, dropout, train_time):
    """tgl_att_layer_fwd / _bwd (one compiled call each way) against the layer's torch
    reference under the same seed: outputs and the gradients of
    the node rows and of every parameter (the time encoding's frozen or not), with and
    without both dropouts, a destination without edges and destinations reading the same
    node row (the compiled call computes their query side once) included."""
    torch.manual_seed(0)
    layer = TemporalAttention(8, dim_edge, 4, 8, num_head=num_head, dropout=dropout,
                              att_dropout=dropout).train()
    layer.time_enc.w.weight.requires_grad_(train_time)
    layer.time_enc.w.bias.requires_grad_(train_time)
    _, mfgs, _ = make_batch(6, 30, [4], dim_edge=dim_edge, seed=2)
    b = mfgs[0]
    rows = torch.randint(0, 7, (b.num_src,))
    rows[2:b.num_dst:2] = rows[0]   # destinations sharing a node row share their query side
    h = torch.randn(7, 8, requires_grad=True)
    params = [p for p in layer.parameters() if p.requires_grad]
    res = []
    for fn in (layer, layer.reference):
        torch.manual_seed(11)
        out = fn(b, h, rows)
        assert (type(out.grad_fn).__name__ == "AttentionLayerBackward") == (fn is layer)
        res.append((out, torch.autograd.grad((out ** 3).sum(), [h] + params)))
        with torch.no_grad():   # evaluation runs the same forward
            torch.manual_seed(11)
            assert torch.allclose(fn(b, h, rows), out, atol=1e-6)
    (o1, g1), (o2, g2) = res
    assert torch.allclose(o1, o2, atol=1e-5)
    for a, e in zip(g1, g2):
        assert torch.allclose(a, e, atol=1e-4, rtol=1e-4), float((a - e).abs().max())


def test_build_cache_keys_on_the_local_headers_a_source_includes(tmp_path):
    """The model kernels share kernels/blas.h: a cached library is rebuilt when a header it
    includes changes, not only when its own source does."""
    from tgl_dist.kernels.build import MODEL_FLAGS, build, require_compiler
    try:
        cc = require_compiler()
    except Exception as e:   # noqa: BLE001 - a clone without a compiler
        pytest.skip(f"no C compiler: {e}")
    (tmp_path / "part.h").write_text("static int part(void) { return 1; }\n")
    src = tmp_path / "lib.c"
    src.write_text('#include "part.h"\nint value(void) { return part(); }\n')
    first = build(cc, tmp_path / "cache", src, MODEL_FLAGS)
    assert build(cc, tmp_path / "cache", src, MODEL_FLAGS) == first     # reused
    (tmp_path / "part.h").write_text("static int part(void) { return 2; }\n")
    second = build(cc, tmp_path / "cache", src, MODEL_FLAGS)
    assert second != first
    import ctypes
    assert ctypes.CDLL(str(second)).value() == 2


@needs_kernel
@pytest.mark.parametrize("dim_edge", [0, 24])
def test_whole_layer_call_at_step_size_on_two_threads_equals_the_reference(dim_edge):
    """At a training step's size (600 destinations, ~3,000 edges, 100-wide rows, roots
    repeating nodes, edge features read in place or none) the compiled calls split their
    row and column loops over two threads: outputs and gradients still equal the torch
    reference's."""
    torch.manual_seed(0)
    layer = TemporalAttention(100, dim_edge, 100, 100, num_head=2, dropout=0.1,
                              att_dropout=0.1).train()
    _, mfgs, _ = make_batch(200, 3000, [10], dim_edge=dim_edge, seed=5)
    b = mfgs[0]
    # one feature row per event id, as in a real block (the reference reads an id's
    # features once; make_batch draws ids and features independently)
    b.edata["ID"] = torch.arange(b.num_edges)
    _, rows = torch.unique(b.srcdata["ID"], return_inverse=True)   # one row per node
    h = torch.randn(int(rows.max()) + 1, 100, requires_grad=True)
    assert rows[:b.num_dst].unique().numel() < b.num_dst
    params = list(layer.parameters())
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        res = []
        for fn in (layer, layer.reference):
            torch.manual_seed(3)
            out = fn(b, h, rows)
            res.append((out, torch.autograd.grad((out ** 3).sum(), [h] + params)))
    finally:
        torch.set_num_threads(threads)
    (o1, g1), (o2, g2) = res
    assert torch.allclose(o1, o2, atol=1e-5)
    for a, e in zip(g1, g2):
        assert torch.allclose(a, e, atol=1e-3, rtol=1e-4), float((a - e).abs().max())
