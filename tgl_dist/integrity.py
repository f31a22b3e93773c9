"""Crash-safe files: atomic folder writes, fsync, SHA-256 checksums, readable-file checks.

Manifests are read with :func:`read_json_object` (one message per way a JSON file breaks).
Used by every writer of durable state (partitions, DTDG snapshot partitions, checkpoints)
and by the loaders that read ``torch.save`` files. A folder is written into a temporary
sibling ``.<name>.tmp-<pid>`` and renamed into place only when complete
(:func:`atomic_dir`); replacing an existing folder swaps the two in one atomic
``renameat2(RENAME_EXCHANGE)`` on Linux, elsewhere the old folder is renamed aside first.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import logging
import os
import re
import shutil
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Type

import torch

log = logging.getLogger(__name__)

def read_json_object(path: Path, error: Type[Exception], what: str = "manifest") -> Dict:
    """The JSON object in ``path``, or ``error`` naming the file and what is wrong: not
    UTF-8 (the byte), not JSON (the line), not an object ("corrupt <what> (...)")."""
    path = Path(path)
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise error(f"{path}: corrupt {what} (byte {e.start} is not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: corrupt {what} (not valid JSON, line {e.lineno}: {e.msg})") from None
    if not isinstance(obj, dict):
        raise error(f"{path}: corrupt {what} (expected a JSON object, found "
                    f"{type(obj).__name__})")
    return obj


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_tensors(path: Path, obj) -> None:
    """``torch.save`` followed by fsync (the folder is renamed into place later)."""
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())


def _remove(path: Path) -> None:
    """Remove a folder tree, or a file or link (best effort: errors are ignored)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:
            pass


@contextmanager
def atomic_dir(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``out`` atomically.

    Raises:
        FileExistsError: ``out`` exists and ``force`` is False.
    """
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists; pass force=True (--force) to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists() or tmp.is_symlink():
        _remove(tmp)
    tmp.mkdir()
    try:
        yield tmp
        fsync_dir(tmp)
        if not out.exists():
            os.replace(tmp, out)
        elif _exchange(tmp, out):          # out: the new version; tmp: the old one (or a file)
            _remove(tmp)
        else:
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:
                os.replace(old, out)       # the previous version back in place
                raise
            _remove(old)
        fsync_dir(out.parent)
    except BaseException:
        _remove(tmp)
        raise
    _drop_leftovers(out)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where the
    system or the file system does not offer it."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _drop_leftovers(out: Path) -> None:
    """Remove ``.<name>.tmp-<pid>`` / ``.<name>.old-<pid>`` folders of writers that died
    (``out`` itself is whole again: a new version was just put in place)."""
    for p in out.parent.glob(f".{out.name}.*-*"):
        kind, _, pid = p.name[len(out.name) + 2:].partition("-")
        if kind in ("tmp", "old") and pid.isdigit() and not _pid_alive(int(pid)):
            _remove(p)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def file_entry_ok(info) -> bool:
    """Whether a manifest's ``files`` entry reads ``{"sha256": str, "bytes": int >= 0}``
    (partition and checkpoint manifests alike)."""
    return (isinstance(info, dict) and isinstance(info.get("sha256"), str)
            and _is_int(info.get("bytes")) and info["bytes"] >= 0)


def unreadable_reason(path: Path, exc: BaseException) -> str:
    """Why ``torch.load(path)`` failed, in words: a class that safe loading refuses, or a
    corrupt / truncated file (not a zip archive as ``torch.save`` writes), or else the
    error's first line."""
    text = str(exc)
    refused = re.search(r"Unsupported (?:global|class):? (?:GLOBAL )?(\S+)", text)
    if refused:
        return f"holds {refused.group(1)}, which safe loading refuses (not written by tgl_dist)"
    try:
        whole = zipfile.is_zipfile(path)
    except OSError:
        whole = False
    if not whole:
        return "corrupt or truncated: not a file that torch.save wrote"
    detail = text.split("WeightsUnpickler error:")[-1]
    first = next((ln.strip() for ln in detail.splitlines() if ln.strip()), "")
    return f"cannot be read ({type(exc).__name__}: {first[:200]})"
