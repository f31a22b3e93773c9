"""torch's own BLAS (``sgemm_``) and OpenMP runtime, reached for the kernels through ctypes."""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Callable, Optional

import torch

log = logging.getLogger(__name__)


def _torch_cpu() -> ctypes.CDLL:
    """torch's ``libtorch_cpu``, opened: its symbols resolve as torch's own calls resolve
    them. ``ValueError`` when there is not exactly one, ``OSError`` when it cannot be opened."""
    (path,) = Path(torch.__file__).parent.joinpath("lib").glob("libtorch_cpu.*")
    return ctypes.CDLL(str(path))


def torch_sgemm() -> Optional[int]:
    """The address of the ``sgemm_`` torch's own CPU matrix products call (the BLAS linked
    into ``libtorch_cpu`` and exported by it, as in the PyPI wheels: MKL on x86-64), or
    ``None``. The model kernels' whole-node calls run their products through it, so they
    compute the products torch would."""
    try:
        return ctypes.cast(_torch_cpu().sgemm_, ctypes.c_void_p).value
    except (ValueError, OSError, AttributeError):
        return None


def set_blas(lib: ctypes.CDLL, set_fn: str, check_fn: str) -> bool:
    """Hand :func:`torch_sgemm` to a kernel library (``set_fn``) and run its small-product
    check (``check_fn``); ``False`` (and the library's products turned off again) when
    there is no such BLAS or the check fails."""
    fn = torch_sgemm()
    ok = bool(fn and getattr(lib, set_fn)(fn) and getattr(lib, check_fn)())
    if fn and not ok:
        getattr(lib, set_fn)(None)
        log.debug("%s: torch's sgemm_ failed the check; whole-node calls off", lib._name)
    return ok


def shares_torch_openmp(lib: ctypes.CDLL) -> bool:
    """Whether ``lib`` calls the same OpenMP runtime as torch: its ``omp_get_max_threads``
    resolves to the very function torch's ``libtorch_cpu`` resolves it to."""
    try:
        ours = ctypes.cast(lib.omp_get_max_threads, ctypes.c_void_p).value
        theirs = ctypes.cast(_torch_cpu().omp_get_max_threads, ctypes.c_void_p).value
    except (ValueError, OSError, AttributeError):  # no single libtorch_cpu, no symbol
        return False
    return ours is not None and ours == theirs


def openmp_threads(lib: ctypes.CDLL, built_with_openmp: bool) -> Callable[[], int]:
    """The worker count to pass to an OpenMP kernel: torch's own
    (``torch.get_num_threads()``, read at each call) when the kernel shares torch's
    OpenMP runtime (:func:`shares_torch_openmp`), else 1.

    Sharing matters on a small machine: the kernel's parallel regions then run on the
    workers torch's own operators just used (still spinning, ready), where a second
    runtime's threads would compete with them for the same cores. A kernel built by GCC
    needs ``libgomp.so.1``, the soname of the ``libgomp`` torch's Linux wheels bundle,
    so the loader binds it to torch's copy; anything else (torch on ``libiomp5``, a
    kernel built against ``libomp``) gets 1 thread.
    """
    if built_with_openmp and shares_torch_openmp(lib):
        return torch.get_num_threads
    return lambda: 1


def serial_openmp_thread() -> bool:
    """Make torch's operators called from THIS thread run on one OpenMP thread.

    For a background thread (the loader's). When a second thread runs a torch operator
    large enough to go parallel, GNU OpenMP gives that thread its own team of
    ``torch.get_num_threads()`` workers. Once there are more OpenMP threads than cores,
    libgomp stops spin-waiting between parallel regions: every later region, the training
    thread's too, wakes sleeping workers. A TGN step on 2 cores then takes twice as long
    (``benchmarks/RESULTS.md``). The training thread's setting is left alone.

    torch sets a thread's OpenMP count from its global setting on the thread's first
    query (``torch.get_num_threads()``), so the count is set to 1 after that query.
    Returns whether torch now runs this thread's operators on one thread. Returns False
    when torch's OpenMP runtime could not be reached; nothing is changed then.
    """
    try:
        set_threads = _torch_cpu().omp_set_num_threads
    except (ValueError, OSError, AttributeError):  # no single libtorch_cpu, no OpenMP
        return False
    if torch.get_num_threads() > 1:
        set_threads(1)
    return torch.get_num_threads() == 1
