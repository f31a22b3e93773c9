"""Rank 0's partition on every node: nodes that share no file system get a copy.

After rank 0 wrote (or found) a partition folder, :func:`replicate_partition` makes sure
every rank reads the same one at the same path. Each rank's copy is written by the rank
:func:`tgl_dist.dist.nodes.folder_writers` names: nobody on a shared file system (rank 0
wrote it), the node's lowest rank (its local rank 0) on a node with its own ``--parts``.
A node's writer that already holds a partition with rank 0's manifest (byte for byte:
the same files, checksums and metadata) writes nothing; one that holds another (other
data, seed, algorithm version) gets rank 0's in its place, with a warning. The files
come from rank 0 over the process group (:func:`tgl_dist.dist.nodes.copy_folder`), so the
dataset is needed on rank 0's node only and nothing depends on every node computing the
same partition. Then every rank checks that its manifest is rank 0's; any rank that
cannot have it (``--parts`` not writable there, a full disk) stops every rank with a
:class:`~tgl_dist.errors.PartitionError` naming its rank, host, node and path.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Optional

from tgl_dist.dist import broadcast_object, world
from tgl_dist.dist.nodes import copy_folder, folder_writers, raise_everywhere
from tgl_dist.errors import PartitionError
from tgl_dist.partition.storage import MANIFEST

log = logging.getLogger(__name__)


def manifest_digest(folder: Path) -> Optional[str]:
    """SHA-256 of ``folder/manifest.json`` (it lists every file's checksum, so two
    partitions with one digest hold the same files), ``None`` when unreadable."""
    try:
        return hashlib.sha256((Path(folder) / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return None


def replicate_partition(part: Path, group=None) -> None:
    """Give every rank rank 0's partition folder ``part`` at the same path (collective).

    Args:
        part: the partition folder (``<parts>/<name>/<algo>_<P>``, holding the manifest),
            complete on rank 0; the same path on every rank.
        group: process group (default: world).

    Raises:
        PartitionError: on every rank, when a rank's copy cannot be written or read
            (names that rank, its host and node, and the path).
    """
    rank, ws = world(group)
    if ws == 1:
        return
    part = Path(part)
    want = broadcast_object(manifest_digest(part) if rank == 0 else None, 0, group)
    if want is None:
        raise PartitionError(f"{part / MANIFEST}: rank 0 cannot read its own partition")
    writers = folder_writers(part.parent, group)
    have = manifest_digest(part)
    receive = writers[rank] == rank != 0 and have != want
    if receive:
        if have is not None:
            log.warning("%s holds another partition than rank 0's (manifest differs); "
                        "replacing it with rank 0's", part)
        log.info("%s: this node's copy is missing or stale; receiving rank 0's", part)
    copy_folder(part, part, receive, group, PartitionError)
    have = manifest_digest(part)
    err = None
    if have != want:
        err = (f"{part / MANIFEST}: " + ("missing" if have is None else "differs from rank 0's")
               + f" (this rank's copy is written by rank {writers[rank]}; check that --parts "
               f"is the same kind of folder on every node)")
    raise_everywhere(err, PartitionError, group)
