"""The compiled kernels: C sources, their build, cache and loading, and torch's BLAS/OpenMP binding.

One subsystem, one folder. The C sources live here (``sampler.c``: neighbour sampling,
``unique_first``; ``attention.c``: the attention layer, segment attention, edge scores;
``pointwise.c``: time encoding, dropout masks, GRU cells; ``adam.c``: the Adam step;
``writeback.c``: the mailbox write-back; ``blas.h``: the products through torch's
``sgemm_``; ``abi.h``: the ABI stamp). The modules:

- :mod:`~tgl_dist.kernels.build`: compiler discovery, flags, OpenMP detection, the cache
  (keyed on the source hash; atomic rename, safe for concurrent ranks).
- :mod:`~tgl_dist.kernels.signatures`: each library's C functions, declared once (the C
  definitions), parsed into the ctypes ``restype``/``argtypes``.
- :mod:`~tgl_dist.kernels.library`: :class:`Library` (one per C file: built on first use,
  ABI stamp checked against the hash of today's sources, one warning per process when it
  cannot be built) and the five declarations.
- :mod:`~tgl_dist.kernels.runtime`: torch's ``sgemm_`` and OpenMP runtime, for the kernels
  and for the loader's background thread.

Only this package imports ``ctypes`` for the kernels or knows about compilers; the
modules that use a kernel (``tgl_dist.nn``, ``optim``, ``memory``, ``sampling``) take a
library from here and call its functions on tensors' data pointers, each behind one
dispatch function whose other branch is the torch reference. ``TGL_DIST_NO_KERNEL=1``
selects the torch references everywhere (:func:`disabled`). See ``docs/kernels.md``.
"""
from tgl_dist.kernels.build import cache_dir, compiler, require_compiler, source_hash
from tgl_dist.kernels.library import (ADAM, ATTENTION, LIBRARIES, POINTWISE, SAMPLER, WRITEBACK,
                                      Library, data_ptr, disabled, int64_array,
                                      open_library, pointer_array)
from tgl_dist.kernels.runtime import (serial_openmp_thread, set_blas, shares_torch_openmp,
                                      torch_sgemm)

__all__ = ["ADAM", "ATTENTION", "LIBRARIES", "POINTWISE", "SAMPLER", "WRITEBACK", "Library",
           "cache_dir", "compiler", "data_ptr", "disabled", "int64_array", "open_library",
           "pointer_array", "require_compiler",
           "serial_openmp_thread", "set_blas", "shares_torch_openmp", "source_hash",
           "torch_sgemm"]
