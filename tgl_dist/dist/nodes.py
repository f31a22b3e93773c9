"""Nodes and their folders: which ranks see one folder, errors that name the node, and
copying a folder from rank 0 to the nodes that do not see rank 0's.

In a run over several machines (``torchrun --nnodes=N``) a path such as ``--parts`` or
``--checkpoint-dir`` names either one shared folder (NFS, a parallel file system) or, on
nodes that share no file system, a private folder at the same path on every node. The
writers of durable state ask :func:`folder_writers` which rank writes each rank's copy:

- rank 0 writes a probe file with a random nonce into the folder; every rank that reads
  the same nonce back sees rank 0's folder, and rank 0 writes for it;
- every other rank sees a private copy, written by the lowest rank on its node (same
  host name and torchrun ``GROUP_RANK``): one writer per node, its local rank 0.

So a shared folder is written once and private ones once per node. Every function here
is a collective over ``group`` (every rank calls it; a world of one runs locally); each
waits at most the group's timeout, and an error on one rank is raised on every rank with
the rank, host and node that had it (:func:`raise_everywhere`), so no rank waits for a
peer that gave up.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import List, Optional, Type

from tgl_dist.dist.exchange import all_gather_object, broadcast_object, new_group, world
from tgl_dist.errors import TGLDistError
from tgl_dist.integrity import atomic_dir

log = logging.getLogger(__name__)

PROBE = ".tgl_dist-probe-"
CHUNK = 16 << 20   # bytes per broadcast when a folder is copied


def node_key() -> str:
    """This process's node: host name and torchrun's node rank (``GROUP_RANK``)."""
    node = os.environ.get("GROUP_RANK")
    return socket.gethostname() + (f" (node {node})" if node not in (None, "") else "")


def where(group=None) -> str:
    """``'rank R on host H (node G)'``: the words that name this process in an error."""
    return f"rank {world(group)[0]} on host {node_key()}"


def raise_everywhere(err: Optional[str], exc: Type[Exception] = TGLDistError,
                     group=None) -> None:
    """Gather every rank's ``err`` (``None``: fine) and raise ``exc`` on every rank when any
    rank had one, naming each failing rank's rank, host and node (in a world of one:
    ``err`` as it is). Also a barrier."""
    if world(group)[1] == 1:
        if err is not None:
            raise exc(err)
        return
    errs = all_gather_object(None if err is None else f"{where(group)}: {err}", group)
    bad = [e for e in errs if e]
    if bad:
        raise exc("; ".join(bad) if len(bad) > 1 else bad[0])


def folder_writers(path: Path, group=None) -> List[int]:
    """For every rank, the rank that writes its copy of the folder ``path`` (collective).

    ``0`` for the ranks that see rank 0's folder (a shared file system, or the same
    machine); for the others, the lowest rank of their node (see the module doc). When
    rank 0 cannot write its probe (a read-only folder) nothing is known and every node is
    taken as private (its lowest rank writes for it; a writer that finds what it was to
    write already there writes nothing).

    Returns:
        ``writers``, a list of ``world_size`` ranks; rank ``r`` writes iff ``writers[r] == r``.
    """
    path = Path(path)
    rank, ws = world(group)
    if ws == 1:
        return [0]
    nonce, probe = None, None
    if rank == 0:
        nonce = secrets.token_hex(16)
        probe = path / f"{PROBE}{nonce}"
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe.write_text(nonce)
        except OSError as e:
            log.warning("%s: cannot write a probe file (%s); taking every node's folder as "
                        "its own", path, e.strerror or e)
            nonce, probe = None, None
    nonce = broadcast_object(nonce, 0, group)
    sees = False
    if nonce is not None:
        try:
            sees = (path / f"{PROBE}{nonce}").read_text() == nonce
        except OSError:
            sees = False
    facts = all_gather_object((sees, node_key()), group)   # no nonce: by node alone
    if probe is not None:
        probe.unlink(missing_ok=True)
    first = {}
    writers = []
    for r, (shared, key) in enumerate(facts):
        writers.append(0 if shared else first.setdefault(key, r))
    return writers


def copy_folder(src: Path, dest: Path, receive: bool, group=None,
                exc: Type[Exception] = TGLDistError) -> None:
    """Copy rank 0's folder ``src`` to ``dest`` on every rank with ``receive`` (collective).

    Rank 0 reads each file of ``src`` and broadcasts it in pieces of :data:`CHUNK` bytes
    (so at most one piece is held at a time) in a gloo group of rank 0 and the receiving
    ranks (made for the copy, with ``DEFAULT_TIMEOUT``); a receiving rank writes them into
    a temporary folder that replaces ``dest`` atomically when complete
    (:func:`tgl_dist.integrity.atomic_dir`). Nothing is sent when no rank receives. An
    error on any rank (``dest`` not writable, a full disk) is raised as ``exc`` on every
    rank once the copy is over, naming the rank, host, node and path.

    Args:
        src: rank 0's folder (read on rank 0 only).
        dest: where a receiving rank puts its copy (replaced if present).
        receive: whether this rank writes a copy (ignored on rank 0).
        group: the world's group (``None`` or ``ctx.get_default_group()``): the copy's
            group is made from its ranks.
        exc: the error class raised on every rank.
    """
    rank, ws = world(group)
    if ws == 1:
        return
    wants = all_gather_object(bool(receive) and rank != 0, group)
    if not any(wants):
        return
    # the bytes travel in a gloo group of rank 0 and the receivers only (host bytes, and
    # no other rank receives a copy it would drop)
    members = [0] + [r for r, w in enumerate(wants) if w]
    sub = new_group(ranks=members, backend="gloo")
    err = None
    if rank in members:
        files = None
        if rank == 0:
            src = Path(src)
            files = [(str(p.relative_to(src)), p.stat().st_size)
                     for p in sorted(src.rglob("*")) if p.is_file()]
        files = broadcast_object(files, 0, sub)
        if rank == 0:
            _stream(src, files, None, dest, sub)
        else:
            streamed = False
            try:
                with atomic_dir(Path(dest), force=True) as tmp:
                    streamed, err = True, _stream(None, files, tmp, dest, sub)
                    if err is not None:
                        raise _Abort()           # atomic_dir removes the temporary folder
                log.info("received %d files from rank 0 into %s", len(files), dest)
            except _Abort:
                pass
            except OSError as e:   # creating the temporary folder or renaming it into place
                err = f"{dest}: cannot be written ({e.strerror or e})"
                if not streamed:
                    _stream(None, files, None, dest, sub)
    raise_everywhere(err, exc, group)


class _Abort(Exception):
    pass


def _stream(src: Optional[Path], files, tmp: Optional[Path], dest: Path,
            group) -> Optional[str]:
    """Broadcast the files (rank 0 reads them from ``src``); write them under ``tmp`` when
    given. Every rank goes through every piece, also after a write error (returned)."""
    err = None
    for rel, size in files:
        out = None
        if tmp is not None:
            try:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                out = open(tmp / rel, "wb")
            except OSError as e:
                err = err or f"{Path(dest) / rel}: cannot be written ({e.strerror or e})"
        with (open(src / rel, "rb") if src is not None else contextlib.nullcontext()) as f:
            for _ in range(max(1, -(-size // CHUNK))):
                piece = broadcast_object(f.read(CHUNK) if f is not None else None, 0, group)
                if out is not None:
                    try:
                        out.write(piece)
                    except OSError as e:
                        err = err or f"{Path(dest) / rel}: cannot be written ({e.strerror or e})"
                        out.close()
                        out = None
        if out is not None:
            try:
                out.flush()
                os.fsync(out.fileno())
            except OSError as e:
                err = err or f"{Path(dest) / rel}: cannot be written ({e.strerror or e})"
            out.close()
    return err
