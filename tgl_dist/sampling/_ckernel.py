"""The compiled sampling kernel: a small C file built on first use, called through ctypes.

Why plain C and ctypes (not a torch C++ extension): ``_sampler.c`` includes no torch
header, so the system C compiler builds it in about a second or less
(``cc -O3 -std=c99 -shared -fPIC -pthread``; 0.5-1.1 s on a busy 2-core machine), where ``torch.utils.cpp_extension``
needed about 1.5 minutes for the same kernel. The shared library is cached under
``$TGL_DIST_CACHE_DIR`` (default ``$XDG_CACHE_HOME/tgl_dist`` or
``~/.cache/tgl_dist``), in a file named after the hash of the source, the compiler
command and the platform, so an edited kernel or another compiler never reuses a
stale build. Processes that build at the same time each write a temporary file and
rename it into place (atomic), so concurrent ranks are safe.

:func:`get_kernel` returns ``None`` (and logs ONE warning per process saying why and
how to fix it) when no compiler is found or the build fails; the sampler then uses
its pure-torch path, which returns identical samples (``tests/sampling`` compares
them). ``TGL_DIST_NO_KERNEL=1`` selects the torch path without a warning.

The functions below take and return torch tensors; they wrap the two passes of the
C kernel (count, then fill into exactly sized outputs). ctypes releases the GIL for
the duration of each call, so the loader's background thread samples in parallel
with training.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from tgl_dist.sampling.hashing import seed_state

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("_sampler.c")
ABI = 6
FLAGS = ("-O3", "-std=c99", "-shared", "-fPIC", "-pthread")
# the model kernels: no floating-point traps assumed (lets GCC if-convert and vectorise
# branch-free selects; values are unchanged), with OpenMP when the compiler has it
MODEL_FLAGS = (*FLAGS, "-fno-trapping-math")
OPENMP_FLAGS = (*MODEL_FLAGS, "-fopenmp")
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def cache_dir() -> Path:
    """Where compiled kernels are cached (``$TGL_DIST_CACHE_DIR`` or the user cache)."""
    if os.environ.get("TGL_DIST_CACHE_DIR"):
        return Path(os.environ["TGL_DIST_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tgl_dist"


def compiler() -> Optional[Sequence[str]]:
    """The C compiler command (``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH)."""
    if os.environ.get("CC"):
        return shlex.split(os.environ["CC"])
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    return None


def require_compiler() -> Sequence[str]:
    """:func:`compiler`, or ``RuntimeError`` saying none was found."""
    cc = compiler()
    if not cc:
        raise RuntimeError("no C compiler found (looked for $CC, cc, gcc, clang)")
    return cc


def build(cc: Sequence[str], directory: Path, source: Path = SOURCE,
          flags: Sequence[str] = FLAGS, libs: Sequence[str] = ()) -> Path:
    """Compile ``source`` with ``cc`` and ``flags`` into ``directory`` (reused when already
    built; the file is named after the source and the hash of source, command and platform).

    Raises:
        RuntimeError: the compiler failed (its first error line in the message).
        OSError: the source cannot be read or nothing can be written.
    """
    code = source.read_bytes()
    for name in re.findall(rb'^#include "([^"]+)"', code, re.M):   # local headers count too
        code += b"\0" + (source.parent / name.decode()).read_bytes()
    key = hashlib.sha256(b"\0".join([code, " ".join(cc).encode(), " ".join([*flags, *libs]).encode(),
                                     sys.platform.encode(), platform.machine().encode()])).hexdigest()[:16]
    out = directory / f"{source.stem.lstrip('_')}-{key}.so"
    if out.exists():
        return out
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.stem + ".", suffix=".tmp.so", dir=directory)
    os.close(fd)
    try:
        cmd = [*cc, *flags, str(source), "-o", tmp, *libs]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if res.returncode != 0:
            lines = [ln for ln in (res.stderr or res.stdout).splitlines() if ln.strip()]
            err = next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else "")
            raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {res.returncode}): {err.strip()}")
        os.replace(tmp, out)  # atomic: concurrent builders all end with a complete file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def open_library(path: Path, what: str, abi_symbol: str, abi: int,
                 signatures: Dict[str, Tuple[Any, list]]) -> ctypes.CDLL:
    """Open a built kernel library, check its ABI version and declare its C signatures.

    Args:
        what: its name in the error (``'attention kernel'``).
        abi_symbol: the C function returning the library's ABI version (int64).
        abi: the version this Python side expects.
        signatures: ``{function: (restype, argtypes)}``.
    Raises:
        RuntimeError: the library's ABI is not ``abi`` (a stale or foreign build).
    """
    lib = ctypes.CDLL(str(path))
    fn = getattr(lib, abi_symbol)
    fn.restype = _I64
    if fn() != abi:
        raise RuntimeError(f"{path} has {what} ABI {fn()}, expected {abi}")
    for name, (restype, argtypes) in signatures.items():
        getattr(lib, name).restype = restype
        getattr(lib, name).argtypes = argtypes
    return lib


def load(path: Path) -> ctypes.CDLL:
    """Open a built sampling kernel and declare its C signatures."""
    return open_library(path, "kernel", "tgl_abi", ABI, {
        "tgl_count": (_I64, [_P, _I64, _P, _P, _P, _P, _P, _I64, _I64, _INT, _P, _P, _P, _INT]),
        "tgl_fill": (_INT, [_P, _P, _P, _I64, _I64, _INT, _I64, _P, _P, _P,
                            _P, _P, _P, _P, _P, _P, _I64, _P, _I64, _INT]),
        "tgl_unique_first": (_I64, [_I64, _P, _P, _P, _P, _P]),
        "tgl_draw_below": (None, [ctypes.c_uint64, _I64, _P, _I64, _I64, _P])})


class Records:
    """What the kernel reads from one T-CSR, built once per graph (see :func:`records`).

    Attributes:
        indptr: ``[N + 1]``; ts: ``[2E]`` float64 (the T-CSR's own tensors, contiguous).
        rec: ``[2E, 4]`` int64 rows ``{nbr, eid, time bits, twin}``: one 32-byte record
            per T-CSR row, so a sampled edge costs one cache miss instead of three;
            ``twin`` is the row of the same event in the neighbour's list (-1 if the
            neighbour's list is not held here): the next hop's binary search for that
            neighbour starts there. 64 bytes per event.
        node_hint: ``[N]`` per node, the row where its last search (with no better hint)
            ended: in chronological replay the next query of the node lands near it.
            Updated by the kernel; a hint only changes the search's speed, never its
            answer, so concurrent samplers may share it.
    """

    def __init__(self, g) -> None:
        self.indptr = g.indptr.contiguous()
        self.ts = g.ts.contiguous()
        n = int(g.eid.numel())
        rec = torch.empty(n, 4, dtype=torch.long)
        rec[:, 0] = g.nbr
        rec[:, 1] = g.eid
        rec[:, 2] = self.ts.view(torch.long)
        rec[:, 3] = -1
        if n > 1:
            order = torch.sort(g.eid, stable=True).indices
            se = g.eid.index_select(0, order)
            i = (se[1:] == se[:-1]).nonzero().view(-1)
            a, b = order.index_select(0, i), order.index_select(0, i + 1)
            rec[a, 3] = b
            rec[b, 3] = a
        self.rec = rec
        self.num_nodes = int(self.indptr.numel()) - 1
        self.node_hint = torch.full((self.num_nodes,), -1, dtype=torch.long)

    def nbytes(self) -> int:
        return int(self.rec.numel() + self.node_hint.numel()) * 8


_records: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_records_lock = threading.Lock()


def records(g) -> Records:
    """The kernel's :class:`Records` of T-CSR ``g`` (built on first use, shared by samplers)."""
    with _records_lock:
        r = _records.get(g)
        if r is None:
            r = _records[g] = Records(g)
            log.info("sampling kernel: %.1f MB of packed records for %r", r.nbytes() / 2**20, g)
        return r


class Kernel:
    """Tensor-level wrapper of the compiled kernel (one sampling hop or block)."""

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.lib = lib
        self.path = path

    def unique_first(self, keys: Tensor) -> Tuple[Tensor, Tensor]:
        """:func:`tgl_dist.nn.unique.unique_first` of CPU int64 ``keys`` (radix sort)."""
        keys = keys.contiguous()
        n = keys.numel()
        buf = torch.empty(4 * n, dtype=torch.long)
        first, inv = buf[:n], buf[n:2 * n]
        U = self.lib.tgl_unique_first(n, keys.data_ptr(), buf[2 * n:3 * n].data_ptr(),
                                      buf[3 * n:].data_ptr(), first.data_ptr(), inv.data_ptr())
        return first[:U], inv

    def draw_below(self, seed: int, keys: Tensor, k: int, n: int) -> Tensor:
        """``uniform_below(hash_keys(seed, keys.view(1, -1), arange(k).view(k, 1)), n)``
        ``[k, B]`` (:mod:`tgl_dist.sampling.hashing`, the same values) for CPU int64
        ``keys [B]``, in one pass (~40 tensor operations in torch)."""
        keys = keys.contiguous()
        out = torch.empty(k, keys.numel(), dtype=torch.long)
        self.lib.tgl_draw_below(seed_state(seed) & ((1 << 64) - 1), keys.numel(), keys.data_ptr(),
                                k, n, out.data_ptr())
        return out

    def _count(self, r: Records, nodes: Tensor, ts: Tensor, hint: Optional[Tensor], k: int, uniform: bool,
               threads: int):
        D = nodes.numel()
        scratch = torch.empty(3 * D + 1, dtype=torch.long)
        first, avail, off = scratch[:D], scratch[D:2 * D], scratch[2 * D:]
        M = self.lib.tgl_count(r.indptr.data_ptr(), r.num_nodes, r.ts.data_ptr(), nodes.data_ptr(),
                               ts.data_ptr(), None if hint is None else hint.data_ptr(),
                               r.node_hint.data_ptr() if hint is None else None, D, k, int(uniform),
                               first.data_ptr(), avail.data_ptr(), off.data_ptr(), threads)
        return first, avail, off, int(M)

    def _fill(self, r: Records, nodes, ts, k, uniform, salt, cnt, threads, nbr, ets, eid, dt,
              hint=None, src=None, src_base=0, dst=None, dst_base=0) -> None:
        first, avail, off, _ = cnt
        ptr = lambda x: None if x is None else x.data_ptr()  # noqa: E731
        rc = self.lib.tgl_fill(r.rec.data_ptr(), nodes.data_ptr(), ts.data_ptr(), nodes.numel(), k,
                               int(uniform), salt, first.data_ptr(), avail.data_ptr(), off.data_ptr(),
                               nbr.data_ptr(), ets.data_ptr(), eid.data_ptr(), ptr(dt), ptr(hint), ptr(src),
                               src_base, ptr(dst), dst_base, threads)
        if rc != 0:
            raise MemoryError("sampling kernel: out of memory for its scratch space")

    def hop(self, g, nodes: Tensor, ts: Tensor, k: int, uniform: bool, salt: int, threads: int
            ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """One hop, flat: ``(row, nbr, eid, ts, dt)`` ``[M]`` each (row indexes ``nodes``)."""
        r = records(g)
        nodes, ts = nodes.contiguous(), ts.contiguous()
        cnt = self._count(r, nodes, ts, None, k, uniform, threads)
        M = cnt[3]
        row, nbr, eid = (torch.empty(M, dtype=torch.long) for _ in range(3))
        ets, dt = torch.empty(M, dtype=torch.float64), torch.empty(M, dtype=torch.float32)
        self._fill(r, nodes, ts, k, uniform, salt, cnt, threads, nbr, ets, eid, dt, dst=row)
        return row, nbr, eid, ets, dt

    def block(self, g, dst_id: Tensor, dst_ts: Tensor, k: int, uniform: bool, salt: int, threads: int,
              prev: Optional[tuple] = None, hint: Optional[Tensor] = None, want_hint: bool = False
              ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Optional[Tensor]]:
        """One block written in place: ``(src_id, src_ts, edge_index, eid, dt, src_hint)``.

        ``src_id``/``src_ts`` ``[D + M]`` start with the destinations; ``edge_index``
        ``[2, M]``; ``eid`` ``[M]``; ``dt`` ``[M]`` float32. ``hint`` ``[D]`` (or None):
        search hints of the destinations; ``src_hint`` ``[D + M]`` (when ``want_hint``):
        those of the sources, for the next block.

        ``prev``: the previous block's ``(P, *its return value)`` (the block next to the
        roots) when its ``P`` destinations, the first ``P`` here, were sampled with the
        same ``k``: their edges are copied from it instead of sampled again.
        """
        r = records(g)
        dst_id, dst_ts = dst_id.contiguous(), dst_ts.contiguous()
        D = dst_id.numel()
        P = 0 if prev is None else prev[0]
        nodes, ts = dst_id[P:], dst_ts[P:]
        cnt = self._count(r, nodes, ts, None if hint is None else hint[P:], k, uniform, threads)
        Mp = 0 if prev is None else prev[4].numel()
        M = Mp + cnt[3]
        src_id, src_ts = torch.empty(D + M, dtype=torch.long), torch.empty(D + M, dtype=torch.float64)
        edge_index, eid = torch.empty(2, M, dtype=torch.long), torch.empty(M, dtype=torch.long)
        dt = torch.empty(M, dtype=torch.float32)
        src_hint = torch.empty(D + M, dtype=torch.long) if want_hint else None
        src_id[:D] = dst_id
        src_ts[:D] = dst_ts
        if src_hint is not None:
            src_hint[:D] = -1 if hint is None else hint
        if prev is not None:
            _, p_id, p_ts, p_ei, p_eid, p_dt, p_hint = prev
            src_id[D:D + Mp] = p_id[P:]
            src_ts[D:D + Mp] = p_ts[P:]
            torch.arange(D, D + Mp, out=edge_index[0, :Mp])
            edge_index[1, :Mp] = p_ei[1]
            eid[:Mp] = p_eid
            dt[:Mp] = p_dt
            if src_hint is not None:
                src_hint[D:D + Mp] = -1 if p_hint is None else p_hint[P:]
        self._fill(r, nodes, ts, k, uniform, salt, cnt, threads, src_id[D + Mp:], src_ts[D + Mp:],
                   eid[Mp:], dt[Mp:], hint=None if src_hint is None else src_hint[D + Mp:],
                   src=edge_index[0, Mp:], src_base=D + Mp, dst=edge_index[1, Mp:], dst_base=P)
        return src_id, src_ts, edge_index, eid, dt, src_hint


def build_cached(cc: Sequence[str], source: Path = SOURCE, flags: Sequence[str] = FLAGS,
                 libs: Sequence[str] = ()) -> Path:
    """:func:`build` into :func:`cache_dir`, or into the temp dir when the cache is not
    writable (read-only home, ...)."""
    try:
        return build(cc, cache_dir(), source, flags, libs)
    except OSError:
        uid = os.getuid() if hasattr(os, "getuid") else 0
        return build(cc, Path(tempfile.gettempdir()) / f"tgl_dist-{uid}", source, flags, libs)


def load_openmp(source: Path, load: Callable[[Path], ctypes.CDLL],
                libs: Sequence[str] = (), flags: Sequence[str] = ()) -> ctypes.CDLL:
    """Build ``source`` with OpenMP (``-fopenmp``; without it when the compiler has none)
    and ``flags`` beyond the model kernels' own, and open it with ``load``. The library
    gets two attributes: ``openmp`` (built with it) and ``threads()``, the worker count to
    pass to its calls (:func:`openmp_threads`)."""
    cc = require_compiler()
    try:
        path, openmp = build_cached(cc, source, (*OPENMP_FLAGS, *flags), libs), True
    except RuntimeError as e:
        log.debug("building %s without OpenMP: %s", source.name, e)
        path, openmp = build_cached(cc, source, (*MODEL_FLAGS, *flags), libs), False
    lib = load(path)
    lib.openmp, lib.threads = openmp, openmp_threads(lib, openmp)
    return lib


def _torch_cpu() -> ctypes.CDLL:
    """torch's ``libtorch_cpu``, opened: its symbols resolve as torch's own calls resolve
    them. ``ValueError`` when there is not exactly one, ``OSError`` when it cannot be opened."""
    (path,) = Path(torch.__file__).parent.joinpath("lib").glob("libtorch_cpu.*")
    return ctypes.CDLL(str(path))


def data_ptr(t) -> Optional[int]:
    """``t.data_ptr()``, or ``None`` (a C ``NULL``) for ``t = None``: a kernel's optional
    array argument."""
    return None if t is None else t.data_ptr()


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


class LazyKernel:
    """A compiled library built on first request, once per process, shared by threads.

    Args:
        what: its name in messages (``'sampling kernel'``).
        make: builds and loads it (no argument); raises with the reason when it cannot.
        fallback: what the caller does without it, for the warning.

    :meth:`load` raises ``RuntimeError`` with the reason when it cannot be built (the
    outcome is remembered: one build attempt per process); :meth:`get` returns ``None``
    instead and logs ONE warning per process saying why and how to fix it (none when
    ``TGL_DIST_NO_KERNEL=1`` asked for the torch paths).
    """

    def __init__(self, what: str, make: Callable[[], Any], fallback: str) -> None:
        self.what, self.make, self.fallback = what, make, fallback
        self.lock = threading.Lock()
        self.value: Any = None
        self.error: Optional[str] = None
        self.warned = False

    def load(self) -> Any:
        if _disabled():
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

    def get(self) -> Any:
        if self.value is not None and not _disabled():   # built: no lock (hot path)
            return self.value
        try:
            return self.load()
        except RuntimeError as e:
            if not _disabled() and not self.warned:
                self.warned = True
                log.warning("tgl_dist: the compiled %s is unavailable (%s); %s. To fix: install "
                            "a C compiler (e.g. `apt install gcc`, or Xcode's command line tools) "
                            "or set CC to one; set TGL_DIST_NO_KERNEL=1 to use the torch paths "
                            "without this warning.", self.what, e, self.fallback)
            return None


def _disabled() -> bool:
    return os.environ.get("TGL_DIST_NO_KERNEL", "0") not in ("", "0")


def try_build(cc: Optional[Sequence[str]] = None, directory: Optional[Path] = None) -> Kernel:
    """Build (or reuse from the cache) and load the kernel; raises with the reason when it cannot."""
    cc = require_compiler() if cc is None else cc
    path = build(cc, Path(directory)) if directory is not None else build_cached(cc)
    return Kernel(load(path), path)


SAMPLER = LazyKernel("sampling kernel", try_build,
                     "NeighborSampler falls back to its pure-torch path (same samples, several "
                     "times slower)")


def load_kernel() -> Kernel:
    """The process's sampling kernel (:meth:`LazyKernel.load`)."""
    return SAMPLER.load()


def get_kernel() -> Optional[Kernel]:
    """The sampling kernel, or ``None`` with one warning per process (:meth:`LazyKernel.get`)."""
    return SAMPLER.get()
