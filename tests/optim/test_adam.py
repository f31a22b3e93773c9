"""tgl_dist.optim.Adam: one compiled pass, the same bits and state as torch.optim.Adam(fused=True)."""
import copy
import pickle
import platform

import pytest
import torch

from tgl_dist.optim import Adam
from tgl_dist.optim.adam import KERNEL

LIB = KERNEL.get()
needs_kernel = pytest.mark.skipif(LIB is None, reason="TGL_DIST_NO_KERNEL=1 or no C compiler: the Adam kernel cannot "
                                  "be built (tgl_dist.optim.Adam steps with torch's kernel)")
# torch's x86-64 kernels are reproduced operation by operation; elsewhere within rounding
EXACT = platform.machine().lower() in ("x86_64", "amd64")
SIZES = (300, 37, 1, 16, 4099, 90_000, (30, 7))   # vector tails of 0-7 floats, work split


def _same(a, b):
    if EXACT:
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=1e-6, atol=1e-9)


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(n, generator=g)) for n in SIZES]


def _run(opt_cls, steps, kw, grad_seed=1, skip=(), lr_at=None, **opt_kw):
    """``steps`` steps on fresh parameters with seeded gradients; parameter ``i`` gets no
    gradient at the steps listed in ``skip[i]`` (its step count falls behind); the
    learning rate changes at step ``lr_at``."""
    ps = _params()
    opt = opt_cls(ps, **kw, **opt_kw)
    g = torch.Generator().manual_seed(grad_seed)
    for s in range(steps):
        if lr_at is not None and s == lr_at:
            for group in opt.param_groups:
                group["lr"] = group["lr"] * 0.5
        opt.zero_grad(set_to_none=True)
        for i, p in enumerate(ps):
            grad = torch.randn(p.shape, generator=g)
            if s not in (skip[i] if i < len(skip) else ()):
                p.grad = grad
        opt.step()
    return ps, opt


def _assert_same_run(ours, theirs):
    (ps, opt), (qs, ref) = ours, theirs
    for p, q in zip(ps, qs):
        assert _same(p.detach(), q.detach())
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert _same(opt.state[p][key], ref.state[q][key]), key


@needs_kernel
@pytest.mark.parametrize("kw", [dict(lr=1e-3), dict(lr=1e-2, weight_decay=0.01),
                                dict(lr=3e-4, betas=(0.8, 0.99), eps=1e-6)])
def test_same_bits_and_state_as_torch_fused_adam(monkeypatch, kw):
    """Parameters and state (step, both moments) after 40 steps equal torch's fused Adam's,
    bit for bit on x86-64, including tensors that skip steps and a learning-rate change;
    and the steps ran in the kernel (torch's step is never called)."""
    skip = [(), (3, 4, 5), (), (0,), (10,)]
    theirs = _run(torch.optim.Adam, 40, kw, skip=skip, lr_at=25, fused=True)
    monkeypatch.setattr(torch.optim.Adam, "step", lambda *a, **k: pytest.fail("torch's step ran"))
    ours = _run(Adam, 40, kw, skip=skip, lr_at=25)
    _assert_same_run(ours, theirs)


@needs_kernel
def test_state_dict_moves_between_torch_and_ours():
    """A state saved by one continues in the other with the same result (same layout)."""
    ps, opt = _run(Adam, 10, dict(lr=1e-3))
    qs = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    ref = torch.optim.Adam(qs, lr=1e-3, fused=True)
    ref.load_state_dict(copy.deepcopy(opt.state_dict()))   # state_dict() shares tensors
    back = Adam([torch.nn.Parameter(p.detach().clone()) for p in ps], lr=1e-3)
    back.load_state_dict(copy.deepcopy(ref.state_dict()))
    rs = back.param_groups[0]["params"]
    g = torch.Generator().manual_seed(7)
    for _ in range(5):
        for a, b, c in zip(ps, qs, rs):
            grad = torch.randn(a.shape, generator=g)
            a.grad, b.grad, c.grad = grad.clone(), grad.clone(), grad.clone()
        opt.step()
        ref.step()
        back.step()
    for a, b, c in zip(ps, qs, rs):
        assert _same(a.detach(), b.detach()) and _same(c.detach(), b.detach())


@needs_kernel
def test_loading_a_state_replaces_the_tensors_the_kernel_writes():
    """After load_state_dict the kernel writes the new state tensors, not the old ones."""
    ps, opt = _run(Adam, 3, dict(lr=1e-3))
    saved = copy.deepcopy(opt.state_dict())
    for p in ps:
        p.grad = torch.ones_like(p)
    old = [opt.state[p]["exp_avg"] for p in ps]
    before = [t.clone() for t in old]
    opt.load_state_dict(saved)
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(old, before)), "wrote the replaced tensors"
    assert all(float(opt.state[p]["step"]) == 4.0 for p in ps)


@pytest.mark.parametrize("case", ["amsgrad", "maximize", "float64", "strided_grad", "closure",
                                  "no_kernel"])
def test_what_the_kernel_does_not_cover_runs_torch_step(monkeypatch, case):
    """Options, dtypes and layouts outside the kernel: torch's own step, same results."""
    kw, opt_kw = dict(lr=1e-3), {}
    if case in ("amsgrad", "maximize"):
        opt_kw[case] = True
    if case == "no_kernel":
        monkeypatch.setenv("TGL_DIST_NO_KERNEL", "1")
    ps, qs = _params(), _params()
    if case == "float64":
        ps, qs = [torch.nn.Parameter(p.double()) for p in ps], [torch.nn.Parameter(q.double())
                                                                for q in qs]
    ours = Adam(ps, **kw)
    for group in ours.param_groups:
        group.update(opt_kw)
    ref = torch.optim.Adam(qs, **kw, **opt_kw, fused=True)
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        for p, q in zip(ps, qs):
            grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if case == "strided_grad" and grad.dim() == 2:
                grad = grad.t().contiguous().t()
            p.grad, q.grad = grad, grad.clone()
        if case == "closure":
            assert ours.step(lambda: torch.tensor(1.0)) == torch.tensor(1.0)
        else:
            ours.step()
        ref.step()
    for p, q in zip(ps, qs):
        assert torch.equal(p.detach(), q.detach())


@needs_kernel
def test_pickles_and_copies():
    ps, opt = _run(Adam, 2, dict(lr=1e-3))
    for other in (pickle.loads(pickle.dumps(opt)), copy.deepcopy(opt)):
        assert isinstance(other, Adam)
        for p in other.param_groups[0]["params"]:
            p.grad = torch.ones_like(p)
        other.step()   # its own parameters and state, stepped by the kernel
        assert all(float(s["step"]) == 3.0 for s in other.state.values())
    assert all(float(opt.state[p]["step"]) == 2.0 for p in ps)
