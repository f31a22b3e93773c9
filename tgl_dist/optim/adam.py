"""``Adam``: ``torch.optim.Adam`` whose step on CPU float32 parameters is one compiled pass.

Same class, arguments, state and checkpoints as ``torch.optim.Adam(fused=True)``; only
the step differs in how it runs. torch's fused CPU step launches one parallel loop per
tensor and its Python wrapper walks the tensors several times: for a TGN's 22 small
tensors (222k floats) ~260 us of a ~10 ms training step. Here one call of a compiled
kernel (``tgl_dist/kernels/adam.c``, built and cached like the other kernels) updates every tensor of a
parameter group: ~100 us (``benchmarks/RESULTS.md``). The arithmetic follows torch's
fused CPU kernel operation by operation, so the results are the same bits on x86-64
(torch's AVX2 and AVX-512 kernels; ``tests/optim/test_adam.py``) and within float
rounding elsewhere.

Anything the kernel does not cover runs torch's own step unchanged: parameters or
gradients that are not contiguous float32 on the CPU, ``amsgrad``, ``maximize``,
``capturable``, ``differentiable``, decoupled weight decay, tensor learning rates or
betas, a ``closure``, sparse gradients, no compiler, ``TGL_DIST_NO_KERNEL=1``.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from tgl_dist.kernels import ADAM as KERNEL
from tgl_dist.kernels import int64_array, pointer_array as _pointers


def _torch_vectors() -> tuple:
    """``(floats per vector, fused multiply-adds)`` of torch's fused Adam on this CPU: where
    its vector body ends and its scalar tail begins, and whether it contracts products and
    sums (its x86-64 AVX2 and AVX-512 kernels step in vectors of 8 floats, both measured)."""
    cap = torch.backends.cpu.get_cpu_capability()
    return 8, cap.startswith("AVX2") or cap.startswith("AVX512")


class Adam(torch.optim.Adam):
    """:class:`torch.optim.Adam` with ``fused=True``, stepped by one compiled pass per group.

    Args:
        params: parameters or parameter groups.
        lr, betas, eps, weight_decay: as :class:`torch.optim.Adam`.

    Parameters that are not floating point on the CPU or CUDA cannot use torch's fused
    state either: the optimizer is then ``torch.optim.Adam(foreach=True)`` in all but
    name, and steps with it.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0) -> None:
        params = list(params)
        flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
        fusable = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in flat)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         **({"fused": True} if fusable else {"foreach": True}))
        self._vec = _torch_vectors()
        self._plans: dict = {}

    def step(self, closure=None) -> Optional[Tensor]:
        if closure is not None or not self._kernel_step():
            return super().step(closure)
        return None

    def __setstate__(self, state: dict) -> None:   # unpickling: torch keeps its own fields
        super().__setstate__(state)
        self._vec, self._plans = _torch_vectors(), {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._plans.clear()   # new state tensors
        super().load_state_dict(state_dict)

    @torch.no_grad()
    def _kernel_step(self) -> bool:
        """Step every group with the kernel; ``False`` (nothing changed) when some group
        or tensor is outside what it covers."""
        calls = []
        for i, group in enumerate(self.param_groups):
            if not _covered(group):
                return False
            ps = [p for p in group["params"] if p.grad is not None]
            gs = [p.grad for p in ps]   # dtype, device and shape are the parameter's (torch)
            if not all(g.layout is torch.strided and g.is_contiguous() for g in gs):
                return False
            plan = self._plan(i, ps)
            if plan is None:
                return False
            if ps:
                calls.append((group, plan, gs))
        if not calls:   # no gradient anywhere: torch's step changes nothing either
            return True
        lib = KERNEL.get()
        if lib is None:
            return False
        vec, fma = self._vec
        for group, (n, numel, p_ptr, m_ptr, v_ptr, s_ptr), gs in calls:
            b1, b2 = group["betas"]
            rc = lib.tgl_adam(n, numel, p_ptr, _pointers(gs), m_ptr, v_ptr, s_ptr,
                              float(group["lr"]), float(b1), float(b2), float(group["eps"]),
                              float(group["weight_decay"]), vec, int(fma), lib.threads())
            if rc != 0:
                raise MemoryError("tgl_dist.optim.Adam: the kernel could not allocate its "
                                  "work list")
        return True

    def _plan(self, i: int, ps: List[Tensor]):
        """``(n, numel, param, exp_avg, exp_avg_sq, step pointer arrays)`` for group ``i``'s
        parameters with a gradient, cached while the same parameters (same storage) have
        a gradient and the state is the same (:meth:`load_state_dict` clears it); ``None``
        when one is not a contiguous float32 CPU tensor."""
        key = (id(self.state), tuple(map(id, ps)), tuple(p.data_ptr() for p in ps))
        hit = self._plans.get(i)
        if hit is not None and hit[0] == key:
            return hit[1]
        plan = None   # remembered too: a group on a GPU is not re-examined every step
        if all(p.is_cpu and p.dtype is torch.float32 and p.is_contiguous() for p in ps):
            states = [self._state_of(p) for p in ps]
            if all(s[k].is_contiguous() and s[k].dtype is torch.float32 for s in states
                   for k in ("exp_avg", "exp_avg_sq", "step")):
                plan = (len(ps), int64_array([p.numel() for p in ps]),
                        _pointers(ps), _pointers([s["exp_avg"] for s in states]),
                        _pointers([s["exp_avg_sq"] for s in states]),
                        _pointers([s["step"] for s in states]))
        self._plans[i] = (key, plan)
        return plan

    def _state_of(self, p: Tensor) -> dict:
        """``self.state[p]``, created as torch's fused Adam creates it on first use."""
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state


def _covered(group: dict) -> bool:
    """Whether the kernel covers a parameter group's options."""
    return (group["fused"] and not (group["amsgrad"] or group["maximize"] or group["capturable"]
                                    or group["differentiable"]
                                    or group.get("decoupled_weight_decay", False))
            and all(type(group[k]) in (float, int) for k in ("lr", "eps", "weight_decay"))
            and all(type(b) in (float, int) for b in group["betas"]))
