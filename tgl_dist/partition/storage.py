"""The partition manifest (CTDG and DTDG alike): format version, checksums, reading and checking.

Atomic folder writes and checksums come from :mod:`tgl_dist.integrity`.

A partition folder is written into a temporary sibling ``.<name>.tmp-<pid>`` and
renamed into place only when every file and the ``manifest.json`` are written and
fsynced, so a crash never leaves a loadable half-partition. Replacing an existing
folder swaps the two in one atomic ``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere
the old folder is first renamed aside to ``.<name>.old-<pid>`` (put back if the second
rename fails, and read by :func:`existing_folder` if the process died in between), so
the previous version stays loadable at every moment. ``manifest.json`` records the
format version and a SHA-256 checksum of every file; loading checks both.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Dict, Optional

from tgl_dist.errors import PartitionError
from tgl_dist.integrity import _is_int, file_entry_ok, read_json_object, sha256_file

# 2: events' owners and rows in per-part ranges (``part_<r>/event_book.pt``), not in one
# table over all events in ``book.pt``
FORMAT_VERSION = 2
MANIFEST = "manifest.json"

log = logging.getLogger(__name__)


def existing_folder(out: Path) -> Path:
    """``out``, or the previous version a writer left at ``.<name>.old-<pid>`` when it died
    between its two renames (no ``RENAME_EXCHANGE``): that one is whole and checked like
    any other. ``out`` when neither exists (the caller reports it)."""
    out = Path(out)
    if out.exists():
        return out
    olds = sorted(out.parent.glob(f".{out.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if olds and (olds[-1] / MANIFEST).is_file():
        log.warning("%s is missing: a rewrite was interrupted; reading the previous version "
                    "left at %s (write the partition again to clean up)", out, olds[-1])
        return olds[-1]
    return out


def write_manifest(folder: Path, meta: Dict) -> Dict:
    """Checksum every file under ``folder`` and write ``manifest.json`` (fsynced)."""
    folder = Path(folder)
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[str(p.relative_to(folder))] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    manifest = {"format_version": FORMAT_VERSION, **meta, "files": files}
    with open(folder / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    return manifest


def read_manifest(folder: Path) -> Dict:
    """Read and validate ``manifest.json`` (format version and required keys)."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise PartitionError(f"{path} not found: {folder} is not a tgl_dist partition "
                             f"(write one with `python -m tgl_dist.partition`)")
    manifest = read_json_object(path, PartitionError)
    for key in ("format_version", "files", "num_parts"):
        if key not in manifest:
            raise PartitionError(f"{path}: missing key '{key}'")
    if manifest["format_version"] != FORMAT_VERSION:
        raise PartitionError(f"{path}: format_version {manifest['format_version']} is not "
                             f"supported (this tgl_dist reads version {FORMAT_VERSION}); "
                             f"partition again: `python -m tgl_dist.partition ... --force`, "
                             f"or --repartition to the CTDG examples (Trainer(repartition="
                             f"True)); the DTDG examples partition again by themselves")
    check_manifest_ints(path, manifest, ("num_parts",))
    files = manifest["files"]
    if not isinstance(files, dict):
        raise PartitionError(f"{path}: key 'files': expected an object (path -> sha256, bytes), "
                             f"got {files!r:.60}")
    for rel, info in files.items():
        if not file_entry_ok(info):
            raise PartitionError(f"{path}: key 'files.{rel}': expected {{\"sha256\": str, "
                                 f"\"bytes\": int}}, got {info!r:.80}; re-run the partitioner")
    return manifest


def check_manifest_ints(path: Path, manifest: Dict, keys) -> None:
    """:class:`PartitionError` naming ``path`` and the key unless every one of ``keys`` is
    an integer (``num_parts`` >= 1, the others >= 0)."""
    for key in keys:
        v = manifest.get(key)
        if not _is_int(v) or v < (1 if key == "num_parts" else 0):
            low = "a positive" if key == "num_parts" else "a non-negative"
            raise PartitionError(f"{path}: key '{key}': expected {low} integer, got {v!r:.40}")


def written_from(folder: Path, fingerprint: str, seed: Optional[int] = None) -> bool:
    """Whether ``folder`` holds a readable partition whose manifest records the data
    ``fingerprint`` (and, when given, the partitioning ``seed``). ``False``: absent,
    unreadable, or written from other data or with another seed, so a caller that
    partitions on first use writes it again."""
    try:
        m = read_manifest(folder)
    except PartitionError:
        return False
    return m.get("fingerprint") == fingerprint and (seed is None or m.get("seed") == seed)


def verify_files(folder: Path, manifest: Dict, prefix: str = "") -> None:
    """Check size and checksum of the manifest's files under ``prefix`` (e.g. ``'part_1/'``)."""
    folder = Path(folder)
    listed = [rel for rel in manifest["files"] if rel.startswith(prefix)]
    if prefix and not listed:
        raise PartitionError(f"{folder / MANIFEST}: lists no file under {prefix} (edited or "
                             f"from another writer); re-run the partitioner")
    for rel in listed:
        info = manifest["files"][rel]
        p = folder / rel
        if not p.is_file():
            raise PartitionError(f"{p}: listed in the manifest but missing")
        if p.stat().st_size != info["bytes"]:
            raise PartitionError(f"{p}: size {p.stat().st_size} bytes, manifest says "
                                 f"{info['bytes']} (truncated or replaced file)")
        if sha256_file(p) != info["sha256"]:
            raise PartitionError(f"{p}: checksum mismatch (corrupt file); re-run the partitioner")
