"""The compiled pointwise kernels (tgl_dist/kernels/pointwise.c): the cosine time encoding
against a float64 reference and torch's own formula, and the dropout masks."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from tgl_dist.nn import TimeEncode
from tgl_dist.nn._pointwise import (KERNEL, CosineTimeEncoding, Dropout, cosine_time_encoding,
                                    dropout_mask, gru_cell)

LIB = KERNEL.get()
needs_kernel = pytest.mark.skipif(LIB is None, reason="TGL_DIST_NO_KERNEL=1 or no C compiler: the pointwise kernel "
                                  "cannot be built (time encodings and dropout use torch)")


def _inputs(M, d, scale, seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = (torch.rand(M, generator=g) ** 3 * scale).float()
    w = torch.from_numpy(1 / 10 ** np.linspace(0, 9, d, dtype=np.float32))
    b = torch.randn(d, generator=g) * 0.5
    return dt, w, b


def _z(dt, w, b):
    """``z = dt w + b`` in float32 as the kernel rounds it: the product, then the sum.

    Not ``torch.addmm``: whether its product and sum are rounded once (one FMA) or twice
    depends on the CPU and the BLAS (twice with torch 2.13 on an AMD EPYC; once with
    torch 2.11 on the H100 machine's CPU, where this test then saw the cosines of z one
    unit apart, 6e-5 at z ~ 1e3). Two elementwise ops round twice everywhere."""
    return dt.view(-1, 1) * w.view(1, -1) + b


def _reference(dt, w, b):
    """cos of the kernel's float32 z, evaluated in float64."""
    z = _z(dt, w, b)
    return torch.cos(z.double()), z


@needs_kernel
@pytest.mark.parametrize("d", [50, 300])   # 300: a row wider than the kernel's column chunk
@pytest.mark.parametrize("scale", [1.0, 1e3, 3e6, 1e9])
def test_time_encoding_matches_float64_reference(scale, d):
    dt, w, b = _inputs(700, d, scale)
    ref, z = _reference(dt, w, b)
    out = CosineTimeEncoding.apply(dt, w, b, LIB)
    assert out.dtype == torch.float32 and out.shape == (700, d)
    # within ~1.5 units in the last place of the exact cosine of the same float32 z
    # (the polynomials run in float; one unit is 6e-8 for values in [0.5, 1))
    assert (out.double() - ref).abs().max() <= 1e-7
    # and within 2.5 units of torch's own float32 cos (itself within one unit)
    assert (out - torch.cos(z)).abs().max() <= 1.5e-7


@needs_kernel
@pytest.mark.parametrize("d", [30, 300])
@pytest.mark.parametrize("scale", [1.0, 1e5])
def test_time_encoding_gradients_match_float64_reference(scale, d):
    dt, w, b = _inputs(400, d, scale, seed=1)
    dt64, w64, b64 = (t.double().requires_grad_() for t in (dt, w, b))
    dt32, w32, b32 = (t.clone().requires_grad_() for t in (dt, w, b))
    g = torch.randn(400, d, dtype=torch.float64)
    # the reference takes the sine at the same float32 z as the kernel
    z = _z(dt, w, b).double()
    gz = -g * torch.sin(z)
    ref = {"dt": (gz * w64.detach()).sum(1), "w": (gz * dt64.detach().unsqueeze(1)).sum(0),
           "b": gz.sum(0)}
    CosineTimeEncoding.apply(dt32, w32, b32, LIB).backward(g.float())
    for name, t in (("dt", dt32), ("w", w32), ("b", b32)):
        r = ref[name]
        assert torch.allclose(t.grad.double(), r, rtol=1e-5, atol=1e-6 * float(r.abs().max())), name


@needs_kernel
def test_time_encoding_keeps_the_sine_only_when_a_gradient_is_wanted():
    dt, w, b = _inputs(300, 20, 1e4, seed=2)
    wg = w.clone().requires_grad_()
    out = CosineTimeEncoding.apply(dt, wg, b, LIB)
    sinz = out.grad_fn.saved_tensors[2]
    z = _z(dt, w, b).double()
    assert (sinz.double() - torch.sin(z)).abs().max() <= 1e-7
    with torch.no_grad():
        assert torch.equal(CosineTimeEncoding.apply(dt, wg, b, LIB), out.detach())
    pre = torch.randn(300, 3, requires_grad=True)  # only the prefix wants a gradient
    out = CosineTimeEncoding.apply(dt, w, b, LIB, pre)
    assert out.grad_fn.saved_tensors[2] is None
    out.sum().backward()
    assert torch.equal(pre.grad, torch.ones(300, 3))


@needs_kernel
def test_time_encoding_empty_and_non_contiguous_inputs():
    dt, w, b = _inputs(10, 8, 100.0)
    w = w.clone().requires_grad_()
    out = CosineTimeEncoding.apply(dt[:0], w, b, LIB)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert torch.equal(w.grad, torch.zeros(8))
    strided = torch.stack([dt, dt], 1)[:, 0]        # non-contiguous view
    assert not strided.is_contiguous()
    assert torch.equal(CosineTimeEncoding.apply(strided, w, b, LIB),
                       CosineTimeEncoding.apply(dt, w, b, LIB))


@needs_kernel
def test_time_encode_module_kernel_equals_torch_formula():
    """TimeEncode on CPU float32 (the kernel) and on float64 (torch's cos) agree."""
    enc = TimeEncode(20)
    with torch.no_grad():
        enc.w.bias.uniform_(-1, 1)
    dt = torch.rand(3, 50) * 1e4
    out = enc(dt)
    assert out.shape == (3, 50, 20)
    (out * torch.arange(20.0)).sum().backward()
    gw, gb = enc.w.weight.grad.clone(), enc.w.bias.grad.clone()
    enc.zero_grad()
    with torch.no_grad():   # torch's Linear (addmm): up to one unit of z apart where it
        z = enc.w(dt.reshape(-1, 1).float())     # rounds once (one FMA), the kernel twice
        ulp = (torch.nextafter(z.abs(), torch.tensor(float("inf"))) - z.abs()).reshape(3, 50, 20)
        assert ((out - torch.cos(z).reshape(3, 50, 20)).abs() - ulp).max() <= 1.2e-7
    # torch's formula with the kernel's rounding of z (elementwise), through autograd
    z = _z(dt.reshape(-1), enc.w.weight.view(-1), enc.w.bias)
    ref = torch.cos(z).reshape(3, 50, 20)
    (ref * torch.arange(20.0)).sum().backward()
    assert (out - ref).abs().max() <= 1.2e-7
    assert torch.allclose(gw, enc.w.weight.grad, rtol=1e-4, atol=1e-3)
    assert torch.allclose(gb, enc.w.bias.grad, rtol=1e-4, atol=1e-4)


def test_time_encoding_falls_back_to_torch_off_the_kernel():
    """float64 inputs take torch's path (same formula)."""
    dt, w, b = (t.double() for t in _inputs(20, 6, 10.0))
    out = cosine_time_encoding(dt, w, b)
    assert out.dtype == torch.float64
    assert torch.allclose(out, torch.cos(dt.view(-1, 1) * w + b))


@needs_kernel
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_mask_distribution_and_values(p):
    torch.manual_seed(0)
    m = dropout_mask((1000, 1000), p, torch.empty(1))
    assert m.shape == (1000, 1000)
    vals = torch.unique(m)
    assert torch.equal(vals, torch.tensor([0.0, 1.0 / (1.0 - p)]))
    frac = float((m == 0).double().mean())
    assert abs(frac - p) < 3e-3                      # 10^6 draws: std ~5e-4
    # rows and columns are not correlated with the position (a counter-based stream)
    assert abs(float((m[:, ::2] == 0).double().mean()) - p) < 5e-3
    assert abs(float((m[::2] == 0).double().mean()) - p) < 5e-3


@needs_kernel
def test_dropout_mask_follows_torch_seed():
    torch.manual_seed(3)
    a, b = dropout_mask((5000,), 0.3, torch.empty(1)), dropout_mask((5000,), 0.3, torch.empty(1))
    torch.manual_seed(3)
    a2 = dropout_mask((5000,), 0.3, torch.empty(1))
    assert torch.equal(a, a2) and not torch.equal(a, b)
    # outside (0, 1), for float64 or off the CPU the caller uses torch's dropout
    assert dropout_mask((3,), 0.0, torch.empty(1)) is None
    assert dropout_mask((3,), 1.0, torch.empty(1)) is None
    assert dropout_mask((3,), 0.5, torch.empty(1, dtype=torch.float64)) is None


@needs_kernel
def test_results_do_not_depend_on_the_thread_count():
    """Rows run in fixed blocks (sums in block order), masks are counter-based: 1, 2 and 3
    OpenMP workers give bitwise the same encodings, gradients and masks."""
    dt, w, b = _inputs(5000, 100, 1e6)                  # > 32k elements: several workers
    g = torch.randn(5000, 100, generator=torch.Generator().manual_seed(1))
    saved = LIB.threads
    outs = []
    try:
        for n in (1, 2, 3):
            LIB.threads = lambda n=n: n
            dt_, w_, b_ = (t.clone().requires_grad_() for t in (dt, w, b))
            out = CosineTimeEncoding.apply(dt_, w_, b_, LIB)
            out.backward(g)
            torch.manual_seed(0)
            outs.append((out.detach(), dt_.grad, w_.grad, b_.grad,
                         dropout_mask((300, 300), 0.3, torch.empty(1))))
    finally:
        LIB.threads = saved
    for other in outs[1:]:
        assert all(torch.equal(x, y) for x, y in zip(outs[0], other))


def test_kernels_share_torch_openmp_runtime():
    """Built with OpenMP, the kernels' parallel regions run on torch's own workers: the
    kernel binds torch's libgomp even when another copy is loaded (scikit-learn bundles
    its own), on Linux with GCC (what CI runs)."""
    import sklearn.metrics  # noqa: F401  (maps scikit-learn's libgomp copy)
    from tgl_dist.kernels import shares_torch_openmp
    if LIB is None or not LIB.openmp or not sys.platform.startswith("linux"):
        pytest.skip("no kernel (TGL_DIST_NO_KERNEL=1 or no compiler), a compiler without OpenMP, or not Linux")
    assert shares_torch_openmp(LIB)
    assert LIB.threads() == torch.get_num_threads()
    assert not shares_torch_openmp(ctypes.CDLL("libc.so.6"))   # a library without OpenMP


def test_dropout_module_train_eval_and_gradient():
    drop = Dropout(0.25)
    x = torch.randn(200, 30, requires_grad=True)
    torch.manual_seed(1)
    y = drop(x)
    keep = y != 0
    assert torch.allclose(y[keep], x[keep] / 0.75)
    assert 0.15 < 1 - float(keep.float().mean()) < 0.35
    y.sum().backward()
    assert torch.allclose(x.grad, keep.float() / 0.75)
    drop.eval()
    assert drop(x) is x
    assert Dropout(0.0)(x) is x
    assert torch.equal(Dropout(1.0)(x), torch.zeros_like(x))
    assert Dropout(0.5).state_dict() == torch.nn.Dropout(0.5).state_dict()


def test_no_kernel_env_selects_torch_silently():
    code = ("import logging, sys, torch; logging.basicConfig(stream=sys.stdout);"
            "from tgl_dist.nn._pointwise import KERNEL, dropout_mask;"
            "from tgl_dist.nn import TimeEncode;"
            "print('KERNEL', KERNEL.get(), dropout_mask((3,), 0.5, torch.empty(1)));"
            "print('SHAPE', tuple(TimeEncode(4)(torch.rand(5)).shape))")
    env = {**os.environ, "TGL_DIST_NO_KERNEL": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines() == ["KERNEL None None", "SHAPE (5, 4)"]


def _gru_reference(gi, gh, h):
    H = h.size(1)
    r = torch.sigmoid(gi[:, :H] + gh[:, :H])
    z = torch.sigmoid(gi[:, H:2 * H] + gh[:, H:2 * H])
    n = torch.tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
    return n + z * (h - n)


@needs_kernel
@pytest.mark.parametrize("scale", [0.1, 3.0, 60.0])   # 60: saturated gates, exp clamped
def test_gru_time_cell_matches_float64_reference(scale):
    """Values and gradients (of the cell's parameters, h and x0) of the compiled time cell
    against torch.nn.GRUCell on [h || x0 || cos(dt w + b)] in float64; identical for 1
    and 2 workers, and within what torch's own float32 ops give."""
    from tgl_dist.nn._pointwise import GRUTimeCell, whole_time_cell
    g = torch.Generator().manual_seed(0)
    U, H, F0, F1 = 700, 32, 24, 16
    x0, h = torch.randn(U, F0, generator=g) * scale, torch.randn(U, H, generator=g)
    dt = (torch.rand(U, generator=g) * 1e3).float()
    cell = torch.nn.GRUCell(H + F0 + F1, H)
    with torch.no_grad():
        for p in cell.parameters():
            p.mul_(scale)
    enc = TimeEncode(F1)
    tw, tb = enc.w.weight.detach(), enc.w.bias.detach()
    go = torch.randn(U, H, generator=g)
    # the encoding's argument dt w + b rounded to float32 as the kernel rounds it (a float64
    # argument of ~1e3 would differ from it by more than the cell's own rounding)
    phi32 = torch.cos(dt.view(-1, 1) * tw.view(1, -1) + tb)

    def reference(dtype):
        ps = [p.detach().to(dtype).requires_grad_() for p in cell.parameters()]
        xs = [t.detach().to(dtype).clone().requires_grad_() for t in (x0, h)]
        phi = phi32.to(dtype)
        out = gru_cell(xs[0], phi, xs[1], *ps, own_state=True)
        out.backward(go.to(dtype))
        return [out.detach()] + [t.grad for t in xs + ps]
    exact, ref32 = reference(torch.float64), reference(torch.float32)
    saved, outs = LIB.threads, []
    try:
        for n in (1, 2):
            LIB.threads = lambda n=n: n
            ps = [p.detach().clone().requires_grad_() for p in cell.parameters()]
            xs = [t.detach().clone().requires_grad_() for t in (x0, h)]
            lib = whole_time_cell(xs[0], dt, xs[1], *ps, tw, tb)
            if lib is None:
                pytest.skip("torch exports no sgemm_: the cell runs its torch reference only")
            out = GRUTimeCell.apply(xs[0], dt, xs[1], *ps, tw, tb, lib)
            out.backward(go)
            outs.append([out.detach()] + [t.grad for t in xs + ps])
    finally:
        LIB.threads = saved
    assert all(torch.equal(a, b) for a, b in zip(*outs))
    # (the parameters' gradients are sums over the 700 rows, in the kernel's own fixed
    # order: float32 rounding of such a sum, ~4e-6 of its size, comes on top)
    for i, (mine, theirs, want) in enumerate(zip(outs[0], ref32, exact)):
        err = float((mine.double() - want).abs().max())
        err_torch = float((theirs.double() - want).abs().max())
        rel = 1e-6 if i < 3 else 4e-6
        assert err <= 2 * err_torch + rel * max(1.0, float(want.abs().max())), (i, err, err_torch)


@needs_kernel
def test_time_encoding_with_prefix_is_the_concatenation():
    """``[prefix || cos(...)]`` written in one output equals ``torch.cat`` of the parts, with
    the same gradients (w, b, dt and the prefix's own)."""
    dt, w, b = _inputs(300, 16, 1e5)
    pre = torch.randn(300, 7)
    g = torch.randn(300, 23)
    grads = []
    for fused in (True, False):
        leaves = [t.clone().requires_grad_() for t in (dt, w, b, pre)]
        if fused:
            out = CosineTimeEncoding.apply(*leaves[:3], LIB, leaves[3])
        else:
            out = torch.cat([leaves[3], CosineTimeEncoding.apply(*leaves[:3], LIB)], 1)
        (out * g).sum().backward()
        grads.append([out.detach()] + [t.grad for t in leaves])
    assert all(torch.equal(x, y) for x, y in zip(*grads))
    # a gradient with a row pitch (the output read through a view) is accepted as it is
    leaves = [t.clone().requires_grad_() for t in (dt, w, b)]
    out = CosineTimeEncoding.apply(*leaves, LIB, pre)
    out[:, 2:].sum().backward()
    ref = [t.clone().requires_grad_() for t in (dt, w, b)]
    CosineTimeEncoding.apply(*ref, LIB).sum().backward()
    assert all(torch.equal(x.grad, y.grad) for x, y in zip(leaves, ref))


@pytest.mark.parametrize("own_state", [False, True])
@pytest.mark.parametrize("grads", [("x1",), ("x0", "x1", "h"), ("h",), ()])
def test_gru_cell_reference_equals_torch_gru_cell(grads, own_state):
    """The torch reference cell against torch.nn.GRUCell on the concatenated input, in
    float64: value and the gradient of every parameter and of each input that asks for
    one (and none for the others). ``own_state``: the input is ``[h || x0 || x1]``."""
    g = torch.Generator().manual_seed(4)
    U, F0, F1, H = 300, 20, 7, 16
    cell = torch.nn.GRUCell(F0 + F1 + (H if own_state else 0), H).double()
    x0, x1, h = (torch.randn(U, n, generator=g) for n in (F0, F1, H))
    go = torch.randn(U, H, generator=g)
    ins = {k: v.double().requires_grad_(k in grads) for k, v in (("x0", x0), ("x1", x1),
                                                                   ("h", h))}
    parts = [ins["x0"], ins["x1"]]
    ref = cell(torch.cat([ins["h"]] * own_state + parts, 1), ins["h"])
    ref.backward(go.double())
    params = [p.detach().float().requires_grad_() for p in
              (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)]
    mine = {k: v.float().detach().requires_grad_(k in grads) for k, v in ins.items()}
    out = gru_cell(mine["x0"], mine["x1"], mine["h"], *params, own_state=own_state)
    out.backward(go)
    assert torch.allclose(out.double(), ref, atol=2e-6)
    for p, q in zip(params, (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)):
        assert torch.allclose(p.grad.double(), q.grad, rtol=1e-4, atol=1e-4)
    for k in ("x0", "x1", "h"):
        if k in grads:
            assert torch.allclose(mine[k].grad.double(), ins[k].grad, rtol=1e-4, atol=1e-5), k
        else:
            assert mine[k].grad is None


@needs_kernel
def test_gru_time_cell_at_step_size_on_two_threads():
    """At a TGN step's size (800 rows, memory 100, mail 200, time 100) the compiled calls
    split their row copies and bias sums over two threads: still torch.nn.GRUCell's
    values and gradients (float64)."""
    from tgl_dist.nn._pointwise import GRUTimeCell, whole_time_cell
    g = torch.Generator().manual_seed(8)
    U, F0, F1, H = 800, 100, 100, 100
    cell = torch.nn.GRUCell(H + F0 + F1, H).double()
    x0, h = torch.randn(U, F0, generator=g), torch.randn(U, H, generator=g)
    dt = (torch.rand(U, generator=g) * 1e4).float()
    enc = TimeEncode(F1)
    tw, tb = enc.w.weight.detach(), enc.w.bias.detach().uniform_(0, 1)
    go = torch.randn(U, H, generator=g)
    phi = torch.cos(dt.view(-1, 1) * tw.view(1, -1) + tb).double()   # float32 argument, as the kernel
    ref = cell(torch.cat([h.double(), x0.double(), phi], 1), h.double())
    ref.backward(go.double())
    params = [p.detach().float().requires_grad_() for p in
              (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)]
    lib = whole_time_cell(x0, dt, h, *params, tw, tb)
    if lib is None:
        pytest.skip("this torch build exports no sgemm_: the cell runs its torch reference")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        out = GRUTimeCell.apply(x0, dt, h, *params, tw, tb, lib)
        out.backward(go)
    finally:
        torch.set_num_threads(threads)
    assert torch.allclose(out.double(), ref, atol=1e-5)
    for p, q in zip(params, (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)):
        assert torch.allclose(p.grad.double(), q.grad, rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("own_state", [False, True])
def test_gru_cell_without_kernel_is_torch_gru_cell(own_state):
    g = torch.Generator().manual_seed(5)
    cell = torch.nn.GRUCell(9 + 4 * own_state, 4).double()
    x0, x1, h = (torch.randn(6, n, generator=g, dtype=torch.float64) for n in (5, 4, 4))
    out = gru_cell(x0, x1, h, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh,
                   own_state=own_state)
    assert torch.allclose(out, cell(torch.cat([h] * own_state + [x0, x1], 1), h))


def test_rows_equal_is_torch_equal_on_column_slices():
    """rows_equal (the kernel's row pass for the mail-starts-with-memory test) answers as
    torch.equal: equal slices, one differing element anywhere, -0.0 == 0.0, NaN != NaN,
    empty tensors, and non-float32 inputs (torch's own equal)."""
    from tgl_dist.nn._pointwise import rows_equal
    g = torch.Generator().manual_seed(7)
    mail = torch.randn(40, 12, generator=g)
    mem = mail[:, :5].contiguous()
    assert rows_equal(mail[:, :5], mem)
    for i, j in ((0, 0), (39, 4), (17, 2)):
        other = mem.clone()
        other[i, j] += 1.0
        assert not rows_equal(mail[:, :5], other)
    z = torch.zeros(3, 4)
    assert rows_equal(z, -z) == torch.equal(z, -z)
    n = torch.full((2, 3), float("nan"))
    assert rows_equal(n, n.clone()) == torch.equal(n, n.clone())
    assert rows_equal(torch.zeros(0, 5), torch.zeros(0, 5))
    d = mail.double()
    assert rows_equal(d[:, :5], d[:, :5].contiguous())


@needs_kernel
@pytest.mark.parametrize("train_time", [True, False])
def test_gru_time_cell_equals_time_encoding_then_cell(train_time):
    """GRUTimeCell (the encoding inside the cell's compiled calls) against
    CosineTimeEncoding followed by the torch reference cell: outputs and the gradients of the cell's and
    the encoding's parameters and of h, the mail read in place (a column slice)."""
    from tgl_dist.nn._pointwise import GRUTimeCell, whole_time_cell
    g = torch.Generator().manual_seed(8)
    U, H, F0, F1 = 60, 8, 8, 6
    mail = torch.randn(U, H + F0, generator=g)
    dt = (torch.rand(U, generator=g) * 1e4).float()
    enc = TimeEncode(F1)
    enc.w.weight.requires_grad_(train_time)
    enc.w.bias.requires_grad_(train_time)
    cell = torch.nn.GRUCell(H + F0 + F1, H)
    h0 = mail[:, :H].contiguous()
    res = []
    for fused in (True, False):
        ps = [p.detach().clone().requires_grad_() for p in cell.parameters()]
        tw, tb = (t.detach().clone().requires_grad_(train_time) for t in (enc.w.weight, enc.w.bias))
        h = h0.clone().requires_grad_()
        if fused:
            lib = whole_time_cell(mail[:, H:], dt, h, *ps, tw, tb)
            if lib is None:
                pytest.skip("torch exports no sgemm_: the cell runs its torch form only")
            out = GRUTimeCell.apply(mail[:, H:], dt, h, *ps, tw, tb, lib)
        else:
            phi = cosine_time_encoding(dt, tw.view(-1), tb)
            out = gru_cell(mail[:, H:], phi, h, *ps, own_state=True)
        leaves = [h] + ps + ([tw, tb] if train_time else [])
        res.append((out, torch.autograd.grad(out.square().sum(), leaves)))
    (o1, g1), (o2, g2) = res
    assert torch.allclose(o1, o2, atol=1e-6)
    for a, b in zip(g1, g2):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5)
