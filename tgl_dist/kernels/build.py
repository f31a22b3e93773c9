"""Compiling a kernel library: compiler discovery, flags, OpenMP detection and the cache.

Why plain C built by the system compiler (not a torch C++ extension): the sources include
no torch header, so ``cc -O3 -std=c99 -shared -fPIC`` builds one in about a second
(0.5-1.1 s on a busy 2-core machine), where ``torch.utils.cpp_extension`` needed about
1.5 minutes for the sampling kernel alone.

A built library is cached under ``$TGL_DIST_CACHE_DIR`` (default ``$XDG_CACHE_HOME/tgl_dist``
or ``~/.cache/tgl_dist``; the temp dir when that is not writable), in a file named after
the hash of the source, the local headers it includes, the compiler command and the
platform, so an edited kernel or another compiler never reuses a stale build. Processes
that build at the same time each write a temporary file and rename it into place
(atomic), so concurrent ranks are safe. Every build passes ``-DTGL_ABI_HASH=<hash>``
(:func:`source_hash`, sources and headers only) for the library's ``tgl_abi_hash()``
(``abi.h``), which the loader checks.
"""
from __future__ import annotations

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
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

log = logging.getLogger(__name__)

FLAGS = ("-O3", "-std=c99", "-shared", "-fPIC", "-pthread")
# the model kernels: no floating-point traps assumed (lets GCC if-convert and vectorise
# branch-free selects; values are unchanged), with OpenMP when the compiler has it
MODEL_FLAGS = (*FLAGS, "-fno-trapping-math")
OPENMP = "-fopenmp"


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


def source_files(source: Path) -> List[Path]:
    """``source`` and the local headers it includes (``#include "..."``, recursively, each once)."""
    out: List[Path] = []
    todo = [Path(source)]
    while todo:
        p = todo.pop(0)
        if p in out:
            continue
        out.append(p)
        for name in re.findall(rb'^#include "([^"]+)"', p.read_bytes(), re.M):
            todo.append(p.parent / name.decode())
    return out


def source_hash(source: Path) -> int:
    """The library's ABI stamp: 60 bits of the SHA-256 of its source and local headers
    (a positive ``int64_t``). Any edit of a signature is an edit of these files."""
    h = hashlib.sha256()
    for p in source_files(source):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return int(h.hexdigest()[:15], 16)


def build(cc: Sequence[str], directory: Path, source: Path,
          flags: Sequence[str] = FLAGS, libs: Sequence[str] = ()) -> Path:
    """Compile ``source`` with ``cc`` and ``flags`` (and ``-DTGL_ABI_HASH``) into
    ``directory``, reused when already built there.

    Raises:
        RuntimeError: the compiler failed (its first error line in the message).
        OSError: the source cannot be read or nothing can be written.
    """
    code = b"\0".join(p.read_bytes() for p in source_files(source))
    abi = f"-DTGL_ABI_HASH={source_hash(source)}LL"
    key = hashlib.sha256(b"\0".join([code, " ".join(cc).encode(), " ".join([*flags, *libs]).encode(),
                                     sys.platform.encode(), platform.machine().encode()])).hexdigest()[:16]
    out = directory / f"{source.stem.lstrip('_')}-{key}.so"
    if out.exists():
        return out
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.stem + ".", suffix=".tmp.so", dir=directory)
    os.close(fd)
    try:
        cmd = [*cc, *flags, abi, str(source), "-o", tmp, *libs]
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


def build_cached(cc: Sequence[str], source: Path, flags: Sequence[str] = FLAGS,
                 libs: Sequence[str] = ()) -> Path:
    """:func:`build` into :func:`cache_dir`, or into the temp dir when the cache is not
    writable (read-only home, ...)."""
    try:
        return build(cc, cache_dir(), source, flags, libs)
    except OSError:
        uid = os.getuid() if hasattr(os, "getuid") else 0
        return build(cc, Path(tempfile.gettempdir()) / f"tgl_dist-{uid}", source, flags, libs)


def build_openmp(cc: Sequence[str], source: Path, flags: Sequence[str],
                 libs: Sequence[str] = ()) -> Tuple[Path, bool]:
    """:func:`build_cached` with ``-fopenmp`` added, or without it when the compiler has
    no OpenMP: ``(path, built with OpenMP)``."""
    try:
        return build_cached(cc, source, (*flags, OPENMP), libs), True
    except RuntimeError as e:
        log.debug("building %s without OpenMP: %s", source.name, e)
        return build_cached(cc, source, flags, libs), False
