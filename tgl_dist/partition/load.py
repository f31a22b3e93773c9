"""``partition_load``: read the calling rank's part of a partitioned graph.

Every file the rank reads (its ``part_<r>/`` and ``book.pt``) is checked against
the manifest's size and SHA-256 before it is unpickled; a partition written for
another world size, an unknown format version or a corrupt/truncated file is
refused with a :class:`~tgl_dist.errors.PartitionError` that says what to do.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Union

import torch
from torch import Tensor

from tgl_dist.data.negatives import EventNegatives
from tgl_dist.dist import EventBook, PartitionBook, world
from tgl_dist.errors import PartitionError
from tgl_dist.integrity import unreadable_reason
from tgl_dist.partition.storage import (MANIFEST, check_manifest_ints, existing_folder,
                                        read_manifest, verify_files)

OptTensor = Optional[Tensor]
MASK_NAMES = ("train", "val", "test", "inductive_train", "new_node_val", "new_node_test")
_EVENT_KEYS = ("src", "dst", "t", "eid", "edge_attr", "labels", "masks")


@dataclass
class SampleGraph:
    """Every event with its source or destination owned by this rank (chronological).

    The neighbourhoods of the owned nodes, as the partitioned neighbour sampler needs them.

    Shapes:
        S: number of events touching an owned node.

    Attributes:
        src, dst: endpoints, global ids, shape ``[S]``, int64.
        t: times, shape ``[S]``, float64.
        eid: event ids, shape ``[S]``, int64.
    """

    src: Tensor
    dst: Tensor
    t: Tensor
    eid: Tensor

    @property
    def num_events(self) -> int:
        return int(self.src.numel())


class PartitionData:
    """One rank's part of a partitioned temporal graph (returned by :func:`partition_load`).

    Shapes:
        N / E: global node / event counts; n: owned nodes; e: owned events
        (events whose source is owned); F_n / F_e: feature sizes.

    Attributes:
        rank, num_parts: this part and the number of parts (= world size).
        name, algo: dataset name and partitioning algorithm.
        manifest: the parsed ``manifest.json``.
        num_nodes, num_events: N and E (global).
        book: node :class:`PartitionBook` (global id -> (owner, local row)), ``[N]``.
        edge_book: this rank's share of the event directory (:class:`EventBook`: eid ->
            (owner, local row) for the eids ``rank, rank + P, ...``); local rows are
            increasing eid, i.e. chronological.
        ids: owned global node ids in local-row order, ``[n]``.
        node_feat: owned node features ``[n, F_n]`` or ``None``.
        edge_index: owned events ``[2, e]`` (global ids, row 0 = src, row 1 = dst).
        edge_ts: their times ``[e]`` (float64); eids: their event ids ``[e]``.
        edge_attr: their features ``[e, F_e]`` or ``None``; labels: ``[e]`` or ``None``.
        train_mask, val_mask, test_mask, inductive_train_mask, new_node_val_mask,
            new_node_test_mask: split masks over the owned events, ``[e]`` bool.
        sample_graph: :class:`SampleGraph` of all events touching an owned node.
        eval_negatives: pre-generated negatives stored with the partition (TGB's
            val/test lists), ``{split: EventNegatives}`` of the OWNED events of the
            split (``eid [p]``, ``dst [p, q]`` int32, ``-1`` padding); ``{}`` when the
            partition was written without them.
        stats: partition statistics from the manifest.
    """

    def __init__(self, rank: int, manifest: Dict, book: PartitionBook, edge_book: EventBook,
                 nodes: Dict, events: Dict, sample: Dict,
                 eval_negatives: Optional[Dict[str, EventNegatives]] = None) -> None:
        self.rank = rank
        self.manifest = manifest
        self.num_parts = int(manifest["num_parts"])
        self.name = manifest["name"]
        self.algo = manifest["algorithm"]
        self.num_nodes = int(manifest["num_nodes"])
        self.num_events = int(manifest["num_events"])
        self.stats = manifest.get("stats", {})
        self.book = book
        self.edge_book = edge_book
        self.ids: Tensor = nodes["ids"]
        self.node_feat: OptTensor = nodes["node_feat"]
        self.edge_index: Tensor = _rows(events["src"], events["dst"])
        self.edge_ts: Tensor = events["t"]
        self.eids: Tensor = events["eid"]
        self.edge_attr: OptTensor = events["edge_attr"]
        self.labels: OptTensor = events["labels"]
        masks = events["masks"]
        self.train_mask: Tensor = masks["train"]
        self.val_mask: Tensor = masks["val"]
        self.test_mask: Tensor = masks["test"]
        self.inductive_train_mask: Tensor = masks["inductive_train"]
        self.new_node_val_mask: Tensor = masks["new_node_val"]
        self.new_node_test_mask: Tensor = masks["new_node_test"]
        self.sample_graph = SampleGraph(**sample)
        self.eval_negatives: Dict[str, EventNegatives] = dict(eval_negatives or {})

    @property
    def num_local_nodes(self) -> int:
        """n, the number of owned nodes."""
        return int(self.ids.numel())

    @property
    def num_local_events(self) -> int:
        """e, the number of owned events."""
        return int(self.eids.numel())

    def __repr__(self) -> str:
        return (f"PartitionData(name={self.name!r}, algo={self.algo!r}, rank={self.rank}/"
                f"{self.num_parts}, nodes={self.num_local_nodes}/{self.num_nodes}, "
                f"events={self.num_local_events}/{self.num_events})")


def _rows(a: Tensor, b: Tensor) -> Tensor:
    """``torch.stack([a, b])``, without a copy when ``a`` and ``b`` are the two rows of one
    ``[2, e]`` tensor (as the writer saves them: they load as views of one mapped storage)."""
    n = a.numel()
    if (n and a.dim() == b.dim() == 1 and b.numel() == n and a.dtype == b.dtype
            and a.is_contiguous() and b.is_contiguous()
            and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
            and b.storage_offset() == a.storage_offset() + n):
        return a.as_strided((2, n), (n, 1))
    return torch.stack([a, b])


def _existing(root: Path) -> str:
    found = sorted(p.name for p in root.iterdir() if (p / MANIFEST).is_file()) if root.is_dir() else []
    return ", ".join(found) if found else "none"


def _load(path: Path):
    # memory-mapped (private, copy-on-write): a tensor's pages are read from the file (and
    # counted in the rank's RSS, as reclaimable page cache) only when touched, so loading
    # holds no second copy of what is on disk
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # checksum matched but the payload is unreadable
        raise PartitionError(f"{path}: {unreadable_reason(path, e)}") from None


def partition_load(root: Union[str, Path], algo: str, rank: Optional[int] = None,
                   world_size: Optional[int] = None) -> PartitionData:
    """Load this rank's part of ``root/<algo>_<world_size>``.

    Args:
        root: the dataset's partition folder ``OUT/<name>`` (as written by
            ``python -m tgl_dist.partition --out OUT``).
        algo: the algorithm the partition was written with (e.g. ``'metis_for_tgnn'``).
        rank: which part to load (default: this process's rank, 0 without a process group).
        world_size: number of parts expected (default: the world size, 1 without a process group).

    Returns:
        :class:`PartitionData` of part ``rank``.

    Raises:
        PartitionError: the folder is missing (lists the partitions that exist), its
            manifest was written for another number of parts or algorithm, has an unknown
            format version (one written by an older tgl_dist: partition again), or a file
            of this rank or ``book.pt`` fails its size/checksum check.
    """
    r0, w0 = world()
    rank = r0 if rank is None else int(rank)
    world_size = w0 if world_size is None else int(world_size)
    if not 0 <= rank < world_size:
        raise PartitionError(f"rank {rank} is outside [0, {world_size})")
    root = Path(root)
    folder = existing_folder(root / f"{algo}_{world_size}")
    if not folder.is_dir():
        where = f"{root} does not exist" if not root.is_dir() else f"partitions in {root}: {_existing(root)}"
        raise PartitionError(f"{folder} not found ({where}); write it with `python -m "
                             f"tgl_dist.partition --data {root.name} --algo {algo} --num-parts "
                             f"{world_size} --out {root.parent}`")
    manifest = read_manifest(folder)
    if int(manifest["num_parts"]) != world_size:
        raise PartitionError(f"{folder / MANIFEST}: written for {manifest['num_parts']} parts, "
                             f"but the world size is {world_size}; re-partition with "
                             f"--num-parts {world_size}")
    if manifest.get("algorithm") != algo:
        raise PartitionError(f"{folder / MANIFEST}: algorithm is {manifest.get('algorithm')!r}, "
                             f"expected {algo!r}")
    for key in ("name", "num_nodes", "num_events"):
        if key not in manifest:
            raise PartitionError(f"{folder / MANIFEST}: missing key '{key}'")
    check_manifest_ints(folder / MANIFEST, manifest, ("num_nodes", "num_events"))
    part = f"part_{rank}/"
    needed = ["book.pt"] + [part + f for f in ("nodes.pt", "events.pt", "sample_graph.pt",
                                               "event_book.pt")]
    missing = [f for f in needed if f not in manifest["files"]]
    if missing:
        raise PartitionError(f"{folder / MANIFEST}: does not list {', '.join(missing)}")
    verify_files(folder, manifest, prefix="book.pt")
    verify_files(folder, manifest, prefix=part)
    node_owner = _load(folder / "book.pt")["node_owner"]
    if node_owner.numel() != int(manifest["num_nodes"]):
        raise PartitionError(f"{folder / 'book.pt'}: {node_owner.numel()} node owners, but the "
                             f"manifest's num_nodes is {manifest['num_nodes']}")
    nodes, events = _load(folder / part / "nodes.pt"), _load(folder / part / "events.pt")
    sample = _load(folder / part / "sample_graph.pt")
    directory = _load(folder / part / "event_book.pt")
    for path, obj, keys in ((part + "nodes.pt", nodes, ("ids", "node_feat")),
                            (part + "events.pt", events, _EVENT_KEYS),
                            (part + "sample_graph.pt", sample, ("src", "dst", "t", "eid")),
                            (part + "event_book.pt", directory, ("owner", "row"))):
        lacking = [k for k in keys if k not in obj]
        if lacking:
            raise PartitionError(f"{folder / path}: lacks {', '.join(lacking)}")
    lacking = [k for k in MASK_NAMES if k not in events["masks"]]
    if lacking:
        raise PartitionError(f"{folder / part}events.pt: lacks the masks {', '.join(lacking)}")
    negatives = _eval_negatives(folder, part, manifest)
    try:
        edge_book = EventBook(int(manifest["num_events"]), world_size, rank, directory["owner"],
                              directory["row"])
    except ValueError as e:
        raise PartitionError(f"{folder / part}event_book.pt: {e}") from None
    return PartitionData(rank, manifest, PartitionBook(node_owner, num_parts=world_size),
                         edge_book, nodes, events, sample, negatives)


def _eval_negatives(folder: Path, part: str, manifest: Dict) -> Dict[str, EventNegatives]:
    """The part's ``eval_negatives.pt`` (mapped) as ``{split: EventNegatives}``, checked
    against the manifest; ``{}`` when the manifest records none."""
    info = manifest.get("eval_negatives") or {}
    if not info:
        return {}
    path = folder / part / "eval_negatives.pt"
    if part + "eval_negatives.pt" not in manifest["files"]:
        raise PartitionError(f"{folder / MANIFEST}: records eval_negatives but does not list "
                             f"{part}eval_negatives.pt")
    obj = _load(path)
    out = {}
    for split, meta in info.items():
        rows = obj.get(split) if isinstance(obj, dict) else None
        if not isinstance(rows, dict) or "eid" not in rows or "dst" not in rows:
            raise PartitionError(f"{path}: lacks the {split} negatives ({{'eid', 'dst'}})")
        eid, dst = rows["eid"], rows["dst"]
        if eid.dim() != 1 or dst.dim() != 2 or dst.size(0) != eid.numel() \
                or dst.size(1) != int(meta["num_neg"]):
            raise PartitionError(f"{path}: {split} negatives of shape {tuple(dst.shape)} for "
                                 f"{eid.numel()} events; the manifest says "
                                 f"{meta['num_neg']} per event")
        out[split] = EventNegatives(split, eid, dst, meta.get("source"))
    return out
