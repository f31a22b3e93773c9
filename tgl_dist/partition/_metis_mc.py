"""Multi-constraint METIS through the METIS library that ships inside pymetis.

Why this exists: pymetis 2025.2 accepts ``vweights`` of any length but always calls
METIS with ``ncon = 1`` (METIS's own log, ``dbglvl=1``, prints "Number of balancing
constraints: 1" whatever is passed), so an ``[N, 2]`` weight array is silently read
as ``2N`` single weights -- garbage balance. METIS's C entry points are exported by
pymetis's extension module, so we call ``METIS_PartGraphRecursive`` /
``METIS_PartGraphKway`` with the right ``ncon`` through ctypes. Every failure is an
error (never a fallback to one constraint); ``tests/partition`` checks that both
constraints come out balanced on real data.
"""
from __future__ import annotations

import ctypes
import glob
import os
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

METIS_OK = 1
_ERRORS = {-2: "METIS_ERROR_INPUT", -3: "METIS_ERROR_MEMORY", -4: "METIS_ERROR"}
_NOPTIONS = 64  # >= METIS_NOPTIONS (40 in METIS 5.1); METIS_SetDefaultOptions fills its part


@lru_cache(maxsize=1)
def _library():
    import pymetis
    from pymetis import _internal

    width = _internal._idx_type_width() if hasattr(_internal, "_idx_type_width") else 64
    if width not in (32, 64):
        raise RuntimeError(f"pymetis reports an idx_t width of {width} bits; expected 32 or 64")
    paths = glob.glob(os.path.join(os.path.dirname(pymetis.__file__), "_internal*"))
    paths = [p for p in paths if p.endswith((".so", ".pyd", ".dylib"))]
    if not paths:
        raise RuntimeError("cannot find pymetis's compiled module to call multi-constraint METIS")
    lib = ctypes.CDLL(paths[0])
    for name in ("METIS_SetDefaultOptions", "METIS_PartGraphKway", "METIS_PartGraphRecursive"):
        if not hasattr(lib, name):
            raise RuntimeError(f"{paths[0]} does not export {name}; multi-constraint METIS "
                               f"(metis_for_tgnn) needs it (pymetis version changed?)")
    lib.METIS_PartGraphKway.restype = ctypes.c_int
    lib.METIS_PartGraphRecursive.restype = ctypes.c_int
    lib.METIS_SetDefaultOptions.restype = ctypes.c_int
    return lib, (np.int64 if width == 64 else np.int32), (ctypes.c_int64 if width == 64 else ctypes.c_int32)


def part_graph_multiconstraint(xadj: Tensor, adjncy: Tensor, adjwgt: Tensor, vwgt: Tensor,
                               num_parts: int, seed: int = 0, recursive: bool = True) -> Tensor:
    """METIS with ``C = vwgt.size(1)`` balance constraints, minimising the weighted edge cut.

    Args:
        xadj: CSR row pointers ``[N + 1]``; adjncy: neighbours ``[2M]``; adjwgt: edge weights ``[2M]``.
        vwgt: vertex weights ``[N, C]`` (vertex-major, as METIS wants), non-negative, each
            column with a positive sum.
        num_parts: P >= 2.
        seed: METIS random seed.
        recursive: recursive bisection (``True``) or k-way.

    Returns:
        part of each vertex, ``[N]``, int64.
    """
    import pymetis

    lib, dtype, cidx = _library()
    N, C = vwgt.shape
    arr = lambda t: np.ascontiguousarray(t.numpy(), dtype=dtype)  # noqa: E731
    xadj_a, adjncy_a, vwgt_a = arr(xadj), arr(adjncy), arr(vwgt.reshape(-1))
    adjwgt_a = arr(adjwgt) if adjncy.numel() else None
    options = np.zeros(_NOPTIONS, dtype=dtype)
    lib.METIS_SetDefaultOptions(options.ctypes.data_as(ctypes.c_void_p))
    options[int(pymetis.OptionKey.SEED)] = int(seed)
    options[int(pymetis.OptionKey.NUMBERING)] = 0
    nvtxs, ncon, nparts, objval = cidx(N), cidx(C), cidx(num_parts), cidx(0)
    part = np.zeros(N, dtype=dtype)
    ptr = lambda a: None if a is None else a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    fn = lib.METIS_PartGraphRecursive if recursive else lib.METIS_PartGraphKway
    rc = fn(ctypes.byref(nvtxs), ctypes.byref(ncon), ptr(xadj_a), ptr(adjncy_a), ptr(vwgt_a),
            None, ptr(adjwgt_a), ctypes.byref(nparts), None, None, ptr(options),
            ctypes.byref(objval), ptr(part))
    if rc != METIS_OK:
        raise RuntimeError(f"METIS failed with {_ERRORS.get(rc, rc)} (N={N}, ncon={C}, P={num_parts})")
    return torch.from_numpy(part.astype(np.int64))
