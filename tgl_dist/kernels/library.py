"""A kernel library: what it is built from, how it is opened and checked, built once per process.

:class:`Library` declares one library (its source, flags, OpenMP, whether it calls
torch's BLAS) and builds and opens it on first request. Opening checks the library's
``tgl_abi_hash()`` against :func:`tgl_dist.kernels.build.source_hash` of today's sources
and declares every exported function's ctypes ``restype``/``argtypes`` from the source's
own prototypes (:mod:`tgl_dist.kernels.signatures`). ``TGL_DIST_NO_KERNEL=1`` turns every
library off (:func:`disabled`): the ops run their torch reference.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from tgl_dist.kernels import build as _build
from tgl_dist.kernels.runtime import openmp_threads, set_blas
from tgl_dist.kernels.signatures import Signature, parse

log = logging.getLogger("tgl_dist.kernels")

HERE = Path(__file__).parent


def disabled() -> bool:
    """Whether ``TGL_DIST_NO_KERNEL`` (set, not ``0``) asks for the torch paths."""
    return os.environ.get("TGL_DIST_NO_KERNEL", "0") not in ("", "0")


def data_ptr(t) -> Optional[int]:
    """``t.data_ptr()``, or ``None`` (a C ``NULL``) for ``t = None``: a kernel's optional
    array argument."""
    return None if t is None else t.data_ptr()


def pointer_array(tensors: Sequence) -> ctypes.Array:
    """A C array of the tensors' data pointers (a ``T **`` argument)."""
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


def int64_array(values: Sequence[int]) -> ctypes.Array:
    """A C ``int64_t`` array of ``values`` (a ``const int64_t *`` argument kept alive by the caller)."""
    return (ctypes.c_int64 * len(values))(*values)


def open_library(path: Path, source: Path, what: str = "kernel") -> ctypes.CDLL:
    """Open a library built from ``source``, check its ABI stamp and declare the
    signatures of the functions ``source`` exports.

    Raises:
        RuntimeError: its stamp is not the hash of ``source`` now (a stale or foreign build).
    """
    lib = ctypes.CDLL(str(path))
    stamp = lib.tgl_abi_hash
    stamp.restype, stamp.argtypes = ctypes.c_int64, []
    want = _build.source_hash(source)
    if stamp() != want:
        raise RuntimeError(f"{path} has {what} ABI {stamp():#x}, expected {want:#x} "
                           f"(built from another {source.name})")
    for sig in parse(source).values():
        fn = getattr(lib, sig.name)
        fn.restype, fn.argtypes = sig.ctypes()
    return lib


class Library:
    """One compiled library, built on first request, once per process, shared by threads.

    Args:
        what: its name in messages (``'attention kernel'``).
        source: its C file (default directory: this package).
        fallback: what the callers do without it, for the warning.
        openmp: build with ``-fopenmp`` when the compiler has it (then the opened
            library's ``threads()`` is the worker count to pass; 1 otherwise).
        flags, libs: compiler flags and link libraries (``model=True`` adds the model
            kernels' ``-fno-trapping-math``).
        blas: ``(set_fn, check_fn)`` when the library calls torch's ``sgemm_``: after
            opening, ``lib.blas`` says whether it found it and its check passed.

    The opened library (``ctypes.CDLL``) also carries ``openmp`` and ``threads``.
    :meth:`load` raises ``RuntimeError`` with the reason when it cannot be built (the
    outcome is remembered: one build attempt per process); :meth:`get` returns ``None``
    instead and logs ONE warning per process saying why and how to fix it (none when
    ``TGL_DIST_NO_KERNEL=1`` asked for the torch paths).
    """

    def __init__(self, what: str, source: str, fallback: str, *, openmp: bool = False,
                 model: bool = True, flags: Sequence[str] = (), libs: Sequence[str] = (),
                 blas: Optional[Tuple[str, str]] = None) -> None:
        self.what, self.fallback = what, fallback
        self.source = HERE / source
        self.openmp, self.libs, self.blas = openmp, tuple(libs), blas
        self.flags = (*(_build.MODEL_FLAGS if model else _build.FLAGS), *flags)
        self.lock = threading.Lock()
        self.value: Any = None
        self.error: Optional[str] = None
        self.warned = False

    def signatures(self) -> Dict[str, Signature]:
        """The exported functions, parsed from :attr:`source`."""
        return parse(self.source)

    def build(self, cc: Optional[Sequence[str]] = None, directory: Optional[Path] = None,
              openmp: Optional[bool] = None) -> Tuple[Path, bool]:
        """Build (or reuse from the cache, or from ``directory``): ``(path, with OpenMP)``."""
        cc = _build.require_compiler() if cc is None else cc
        omp = self.openmp if openmp is None else openmp
        if directory is not None:
            flags = (*self.flags, _build.OPENMP) if omp else self.flags
            return _build.build(cc, Path(directory), self.source, flags, self.libs), omp
        if omp:
            return _build.build_openmp(cc, self.source, self.flags, self.libs)
        return _build.build_cached(cc, self.source, self.flags, self.libs), False

    def open(self, path: Path, openmp: bool = False) -> ctypes.CDLL:
        """Open a build of this library (:func:`open_library`) and give it its attributes."""
        lib = open_library(path, self.source, self.what)
        lib.openmp, lib.threads = openmp, openmp_threads(lib, openmp)
        lib.blas = bool(self.blas) and set_blas(lib, *self.blas)
        return lib

    def make(self) -> ctypes.CDLL:
        return self.open(*self.build())

    def load(self) -> ctypes.CDLL:
        if disabled():
            raise RuntimeError(f"the compiled {self.what} is disabled by TGL_DIST_NO_KERNEL")
        with self.lock:
            if self.value is None and self.error is None:
                try:
                    self.value = self.make()
                    log.debug("%s: built", self.what)
                except Exception as e:  # noqa: BLE001 - any failure means: no kernel
                    msg = str(e).strip()
                    self.error = msg.splitlines()[0] if msg else type(e).__name__
            if self.value is None:
                raise RuntimeError(self.error)
            return self.value

    def get(self) -> Optional[ctypes.CDLL]:
        if self.value is not None and not disabled():   # built: no lock (hot path)
            return self.value
        try:
            return self.load()
        except RuntimeError as e:
            if not disabled() and not self.warned:
                self.warned = True
                log.warning("tgl_dist: the compiled %s is unavailable (%s); %s. To fix: install "
                            "a C compiler (e.g. `apt install gcc`, or Xcode's command line tools) "
                            "or set CC to one; set TGL_DIST_NO_KERNEL=1 to use the torch paths "
                            "without this warning.", self.what, e, self.fallback)
            return None


# The libraries, one per C file in this package.
SAMPLER = Library("sampling kernel", "sampler.c",
                  "NeighborSampler falls back to its pure-torch path (same samples, several "
                  "times slower)", model=False)
ATTENTION = Library("attention kernel", "attention.c",
                    "the attention layers use their torch formulation (same values, slower)",
                    openmp=True, libs=("-lm",), blas=("tgl_att_set_sgemm", "tgl_att_gemm_check"))
POINTWISE = Library("pointwise kernel", "pointwise.c",
                    "time encodings and dropout use torch (same values, slower)",
                    openmp=True, blas=("tgl_pw_set_sgemm", "tgl_pw_gemm_check"))
# -fno-math-errno: sqrtf never sets errno here (its arguments are >= 0), and without the
# flag GCC will not vectorise a loop that calls it
ADAM = Library("Adam kernel", "adam.c", "Adam steps with torch's fused kernel (same values)",
               openmp=True, flags=("-fno-math-errno",), libs=("-lm",))
WRITEBACK = Library("write-back kernel", "writeback.c",
                    "the mailbox writes each step's updates with torch's operators (same values)",
                    model=False)
LIBRARIES = (SAMPLER, ATTENTION, POINTWISE, ADAM, WRITEBACK)
