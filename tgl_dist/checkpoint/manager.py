"""``CheckpointManager``: versioned, crash-safe checkpoints for distributed runs.

Layout (``P`` ranks, committed version 7, version 5 kept as a snapshot)::

    ckpt/
      VERSION                 # "7": the committed version, replaced atomically
      v000005/                # a snapshot: the last version at or before epoch N, 2N, ...
      v000007/
        dense.pt              # model + optimizer state, written by rank 0
        shard_0.pt ... shard_{P-1}.pt   # each rank's own shards (memory, mailbox, embeddings, RNG...)
        manifest_0.json ... manifest_{P-1}.json   # per rank: its files' sha256 and sizes

A save writes version v+1 in full on every rank (each file written to a
temporary name, fsynced, renamed), then all ranks meet (an error on any rank is raised
on every rank, naming its rank, host and node), then rank 0 writes ``VERSION``
(temporary file, fsync, rename, fsync of the folder): that one small write commits the
version. On nodes that share no file system with rank 0 (found by
:func:`tgl_dist.dist.nodes.folder_writers`), each node's lowest rank also writes the
node's copy of ``dense.pt``, ``manifest_0.json`` and ``VERSION`` (rank 0's bytes), so
each node's folder holds what its ranks need to resume (docs/multinode.md). Only then
are older versions removed (by each folder's writer), except the epoch snapshots (see
:class:`CheckpointManager`). A crash at any point before
the commit leaves the previous version committed and loadable; the half-written
folder is ignored and removed by the next save.
"""
from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from tgl_dist.dist.exchange import all_gather_object, broadcast_object, new_group, world
from tgl_dist.dist.nodes import folder_writers, raise_everywhere, where
from tgl_dist.errors import TGLDistError
from tgl_dist.integrity import (file_entry_ok, fsync_dir, read_json_object, sha256_file,
                                unreadable_reason)

FORMAT_VERSION = 1
_VDIR = re.compile(r"^v(\d{6})$")


class CheckpointError(TGLDistError, ValueError):
    """A checkpoint that cannot be loaded (missing, truncated, corrupt, or from another run shape)."""


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, rename. An OS error (a
    full disk, a lost mount) removes the temporary file and is a :class:`CheckpointError`
    naming ``path``; the committed version is untouched (it is not ``path``'s folder)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"{path}: cannot be written ({e.strerror or e}); the previously "
                              f"committed version is kept") from None


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _write(path: Path, data: bytes) -> Dict[str, Any]:
    _atomic_write_bytes(path, data)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def _save(path: Path, obj: Any) -> Dict[str, Any]:
    return _write(path, _dumps(obj))


def _first_difference(a: Any, b: Any, path: str) -> Tuple[str, Any, Any]:
    """``(path, a's value, b's value)`` of the first place where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k, "<absent>") != b.get(k, "<absent>"):
                return _first_difference(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")
    return path, a, b


def rng_state() -> Dict[str, Any]:
    """The global random states (Python, NumPy, torch CPU and CUDA)."""
    s = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        s["cuda"] = torch.cuda.get_rng_state_all()
    return s


def set_rng_state(s: Dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.set_rng_state(s["torch"])
    if "cuda" in s and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


class CheckpointManager:
    """Save and load versioned checkpoints of a distributed run.

    Args:
        path: checkpoint folder: one folder all ranks share (a shared file system, or
            one machine), or the same path on every node of a multi-node run whose nodes
            share no file system. There each node's lowest rank writes the node's copy
            of the replicated files (``dense.pt``, ``manifest_0.json``, ``VERSION``:
            rank 0's bytes, sent over the process group) and each rank its own shard,
            so every node can resume from its own folder; a node whose folder lacks the
            committed version stops every rank with an error naming it
            (:meth:`agreed_version`).
        keep_every: ``N``: keep a snapshot every ``N`` epochs (0 = keep only the
            latest version). Snapshots are chosen by the epoch in each version's
            ``meta``, not by version number: for every boundary of ``N``, ``2N``, ...
            completed epochs, the **last version committed at or before it** is kept,
            i.e. the one whose position ``(meta['epoch'], meta['step'])`` is
            ``<= (k*N, 0)`` while the next version's is past it. With end-of-epoch
            checkpoints that is the checkpoint written after epoch ``k*N`` (meta
            ``{'epoch': k*N, 'step': 0}``); with step checkpoints it is the last one
            before the boundary (e.g. ``(k*N - 1, last step)``). A version is only
            known to be the last one once a later version has passed the boundary, so
            the decision is made when that later version is committed. Versions whose
            meta has no integer ``'epoch'`` are never snapshots. Snapshots stay until
            a save with ``keep_every=0`` removes them.
        run_meta: what must match on load: e.g. ``{"partition": fingerprint,
            "config": cfg}``. World size is always checked.
        group: process group (default: world).
    """

    def __init__(self, path, keep_every: int = 0, run_meta: Optional[Dict[str, Any]] = None,
                 group=None) -> None:
        self.path = Path(path)
        self.keep_every = keep_every
        self.run_meta = run_meta or {}
        self.group = group
        self.rank, self.world_size = world(group)
        err = None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            err = f"{self.path}: exists and is not a folder"
        except OSError as e:
            err = f"{self.path}: cannot create the checkpoint folder ({e.strerror or e})"
        raise_everywhere(err, CheckpointError, group)
        #: per rank, the rank that writes its copy of the replicated files (dense.pt,
        #: manifest_0.json, VERSION): 0 on a shared folder, the node's lowest rank on a
        #: node with its own (see tgl_dist.dist.nodes.folder_writers)
        self.writers = folder_writers(self.path, group)
        self.writes_replica = self.writers[self.rank] == self.rank
        self.private = len(set(self.writers)) > 1
        # the replicated files travel to the other nodes' writers in a gloo group of them
        self._replicas = (new_group(ranks=sorted(set(self.writers)), backend="gloo")
                          if self.private else None)

    # ------------------------------------------------------------------ query
    def committed_version(self) -> Optional[int]:
        """The committed version number, or ``None`` when nothing was committed."""
        f = self.path / "VERSION"
        if not f.is_file():
            # a crash before the first commit leaves at most v000001; later versions are
            # only written after VERSION exists, so they without it mean a partial copy
            later = sorted(p.name for p in self.path.glob("v*")
                           if _VDIR.match(p.name) and int(p.name[1:]) > 1)
            if later:
                raise CheckpointError(
                    f"{f}: missing, but the folder holds {', '.join(later)} (copied without "
                    f"VERSION?); write the number of the version to continue from into it "
                    f"(e.g. {int(later[-1][1:])}), or remove {self.path} to start over")
            return None
        text = f.read_bytes().decode("utf-8", "replace").strip()
        if not (text.isascii() and text.isdigit()):
            raise CheckpointError(f"{f}: expected a version number, found {text[:40]!r}")
        return int(text)

    def _vdir(self, v: int) -> Path:
        return self.path / f"v{v:06d}"

    # ------------------------------------------------------------------- save
    def save(self, dense: Optional[Dict[str, Any]], shard: Dict[str, Any],
             meta: Optional[Dict[str, Any]] = None) -> int:
        """Write a new version and commit it (a collective: every rank calls it).

        Args:
            dense: replicated state (model, optimizer, ...), written by rank 0 only
                (other ranks may pass ``None``).
            shard: this rank's own state (memory shard, embedding rows, RNG, ...).
            meta: small JSON-able facts (epoch, step, ...), stored in the manifest.
        Returns:
            the committed version number.
        """
        current = self.committed_version() if self.rank == 0 else None
        v = broadcast_object((current or 0) + 1, 0, self.group)
        d = self._vdir(v)
        err = None
        if self.writes_replica:   # rank 0, and on a node with its own folder its lowest rank
            try:
                if d.exists():  # left over from a crash before its commit
                    shutil.rmtree(d)
                d.mkdir(parents=True)
            except OSError as e:
                err = f"{d}: cannot be created ({e.strerror or e})"
        self._everywhere(err)
        # the replicated files: rank 0's bytes, sent to the other nodes' writers when
        # the folder is not shared, so every copy has the same checksums
        blob = _dumps(dense) if self.rank == 0 else None
        if self.private and self.writes_replica:
            blob = broadcast_object(blob, 0, self._replicas)
        files = {}
        try:
            if self.writes_replica:
                info = _write(d / "dense.pt", blob)
                if self.rank == 0:
                    files["dense.pt"] = info
            files[f"shard_{self.rank}.pt"] = _save(d / f"shard_{self.rank}.pt", shard)
        except CheckpointError as e:
            err = str(e)
        manifest = {"format_version": FORMAT_VERSION, "version": v, "rank": self.rank,
                    "world_size": self.world_size, "run_meta": self.run_meta,
                    "meta": meta or {}, "files": files}
        text = json.dumps(manifest, indent=1, default=str).encode()
        first = broadcast_object(text if self.rank == 0 else None, 0, self._replicas) \
            if self.private and self.writes_replica else text
        try:
            if err is None:
                _atomic_write_bytes(d / f"manifest_{self.rank}.json", text)
                if self.writes_replica and self.rank != 0:
                    _atomic_write_bytes(d / "manifest_0.json", first)
                fsync_dir(d)
        except CheckpointError as e:
            err = str(e)
        self._everywhere(err)   # every rank has written version v in full
        if self.writes_replica:
            try:
                _atomic_write_bytes(self.path / "VERSION", f"{v}\n".encode())
                fsync_dir(self.path)
            except CheckpointError as e:
                err = str(e)
        self._everywhere(err)
        # older versions go only once every folder committed v: a save interrupted between
        # two nodes' commits leaves every node the version before
        if self.writes_replica:
            self._prune(v)
        self._everywhere(None)
        return v

    def _everywhere(self, err: Optional[str]) -> None:
        """Raise ``err`` (``None``: fine) on every rank, naming the rank, host and node
        that had it; also a barrier."""
        raise_everywhere(err, CheckpointError, self.group)

    def _position(self, v: int) -> Optional[Tuple[int, int]]:
        """``(epoch, step)`` from version ``v``'s rank-0 manifest ``meta`` (``step``
        defaults to 0); ``None`` when unreadable or without an integer epoch."""
        try:
            meta = json.loads((self._vdir(v) / "manifest_0.json").read_text()).get("meta") or {}
            epoch, step = meta["epoch"], meta.get("step", 0)
            if isinstance(epoch, bool) or isinstance(step, bool):
                return None
            return int(epoch), int(step)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _is_snapshot(self, v: int, present) -> bool:
        """Is version ``v`` (older than the committed one) the last version at or before
        an epoch boundary ``k * keep_every`` (``k >= 1``), the next version past it?"""
        if v + 1 not in present:
            # versions are committed in sequence: v + 1 was committed and already
            # pruned while v stayed, so v was found to be a snapshot then
            return True
        a, b = self._position(v), self._position(v + 1)
        if a is None:
            return False                                 # no epoch in its meta: never
        if b is None:
            return True                                  # v + 1 unreadable (half-removed): keep v
        n = self.keep_every
        first = a[0] if a[1] == 0 else a[0] + 1          # first whole epoch >= v's position
        boundary = max(n, -(-first // n) * n)            # first multiple of N at or after it
        return b > (boundary, 0)                         # v + 1 is past that boundary

    def _prune(self, committed: int) -> None:
        """Remove every version but ``committed`` and the epoch snapshots (rank 0)."""
        present = {}
        for p in self.path.iterdir():
            m = _VDIR.match(p.name)
            if m:
                present[int(m.group(1))] = p
        for n, p in sorted(present.items()):
            if n == committed or (self.keep_every > 0 and n < committed
                                  and self._is_snapshot(n, present)):
                continue
            shutil.rmtree(p, ignore_errors=True)

    # ------------------------------------------------------------------- load
    def agreed_version(self) -> Optional[int]:
        """The committed version every rank sees (collective), ``None`` when no rank sees one.

        Raises:
            CheckpointError: on every rank, when the ranks see different versions, e.g. a
                node whose own checkpoint folder lacks what rank 0's holds (names each
                rank's host, node, version and path).
        """
        try:
            mine, err = self.committed_version(), None
        except CheckpointError as e:
            mine, err = None, str(e)
        self._everywhere(err)
        seen = all_gather_object((where(self.group), str(self.path / "VERSION"), mine), self.group)
        if len({v for _, _, v in seen}) > 1:
            lines = [f"{who}: {'version %d' % v if v is not None else 'nothing committed'} "
                     f"in {f}" for who, f, v in seen]
            raise CheckpointError(
                f"the ranks do not see the same committed checkpoint ({'; '.join(lines)}); "
                f"every node needs the checkpoint folder it wrote at this path: put "
                f"--checkpoint-dir on a file system all nodes share, or resume on the nodes "
                f"that wrote it, each with its own copy; after a save interrupted between "
                f"two nodes' commits every node still holds the lower version: write that "
                f"number into VERSION on the nodes ahead")
        return seen[0][2]

    def load(self, version: Optional[int] = None,
             map_location="cpu") -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        """Load ``(dense, shard, meta)`` of the committed (or a given kept) version
        (collective: every rank calls it; an error on one rank is raised on every rank,
        naming the rank, host and node that had it).

        Every file this rank reads is checked against its manifest (format
        version, world size, run metadata, size, sha256) first.

        Raises:
            CheckpointError: nothing committed, another world size or run, a
                missing, truncated or corrupt file.
        """
        out, err = None, None
        try:
            out = self._load(version, map_location)
        except CheckpointError as e:
            err = str(e)
        self._everywhere(err)
        return out

    def _load(self, version: Optional[int], map_location):
        v = self.committed_version() if version is None else version
        if v is None:
            raise CheckpointError(f"{self.path}: no committed checkpoint (no VERSION file)")
        d = self._vdir(v)
        m0 = self._manifest(d, 0)
        if m0["world_size"] != self.world_size:   # before this rank's own manifest: every
            raise CheckpointError(                 # rank gives this one reason
                f"{d}: written by {m0['world_size']} ranks, this run has {self.world_size}; "
                f"resume with --nproc_per_node={m0['world_size']} (shards belong to partitions)")
        mine = m0 if self.rank == 0 else self._manifest(d, self.rank)
        saved_meta = m0["run_meta"]
        for key in saved_meta.keys() - self.run_meta.keys() | self.run_meta.keys() - saved_meta.keys():
            side = "this run has no" if key in saved_meta else "the checkpoint has no"
            raise CheckpointError(f"{d}: run_meta['{key}']: {side} such entry (checkpoint "
                                  f"keys {sorted(saved_meta)}, this run's {sorted(self.run_meta)})")
        for key, val in self.run_meta.items():
            saved = saved_meta.get(key)
            now = json.loads(json.dumps(val, default=str))
            if now != saved:
                where, a, b = _first_difference(saved, now, key)
                raise CheckpointError(f"{d}: run_meta['{key}'] differs from this run at {where}: "
                                      f"checkpoint {str(a)[:80]!r}, now {str(b)[:80]!r}")
        dense = self._read(d, "dense.pt", m0, map_location)
        shard = self._read(d, f"shard_{self.rank}.pt", mine, map_location)
        return dense, shard, m0["meta"]

    def _manifest(self, d: Path, rank: int) -> Dict[str, Any]:
        p = d / f"manifest_{rank}.json"
        if not p.is_file():
            raise CheckpointError(f"{p}: missing (checkpoint version not complete)")
        m = read_json_object(p, CheckpointError)
        if m.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"{p}: format_version {m.get('format_version')} is not "
                                  f"supported (this tgl_dist reads {FORMAT_VERSION})")
        for key, kind, what in (("world_size", int, "an integer"), ("run_meta", dict, "an object"),
                                ("meta", dict, "an object"), ("files", dict, "an object")):
            if key not in m:
                raise CheckpointError(f"{p}: corrupt manifest (missing field '{key}')")
            if not isinstance(m[key], kind) or isinstance(m[key], bool):
                raise CheckpointError(f"{p}: corrupt manifest (field '{key}': expected {what}, "
                                      f"got {m[key]!r:.40})")
        for name, info in m["files"].items():
            if not file_entry_ok(info):
                raise CheckpointError(f"{p}: corrupt manifest (field 'files.{name}': expected "
                                      f"{{\"sha256\": str, \"bytes\": int}}, got {info!r:.60})")
        return m

    @staticmethod
    def _read(d: Path, name: str, manifest: Dict[str, Any], map_location):
        p = d / name
        info = manifest["files"].get(name)
        if info is None or not p.is_file():
            raise CheckpointError(f"{p}: missing")
        size = p.stat().st_size
        if size != info["bytes"]:
            raise CheckpointError(f"{p}: truncated or replaced ({size} bytes, manifest says "
                                  f"{info['bytes']})")
        if sha256_file(p) != info["sha256"]:
            raise CheckpointError(f"{p}: corrupt (checksum mismatch)")
        try:
            return torch.load(p, map_location=map_location, weights_only=False)
        except Exception as e:   # the checksum matched a file that is not a torch.save
            raise CheckpointError(f"{p}: {unreadable_reason(p, e)}") from None
