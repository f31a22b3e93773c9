"""Write a partitioned temporal graph: ``partition_graph`` and the on-disk layout.

Layout of ``OUT/<name>/<algo>_<P>/`` (written into a temporary sibling folder and
renamed into place at the end, see :func:`tgl_dist.integrity.atomic_dir`)::

    manifest.json        format version, algorithm, P, counts, feature dims,
                         dataset fingerprint, stats, sha256 + size of every file
    book.pt              {"node_owner": int32 [N]}
    part_<r>/nodes.pt    {"ids": int64 [n_r] owned global ids (increasing = local order),
                          "node_feat": float32 [n_r, F_n] or None}
    part_<r>/events.pt   owned events (source owned by r), chronological:
                         {"src", "dst": int64 [e_r] global ids, "t": float64 [e_r],
                          "eid": int64 [e_r], "edge_attr": [e_r, F_e] or None,
                          "labels": [e_r] or None, "masks": {name: bool [e_r]}}
    part_<r>/sample_graph.pt  every event with src OR dst owned by r, chronological:
                         {"src", "dst", "t", "eid"}
    part_<r>/event_book.pt    the directory entries of the eids r, r + P, r + 2P, ...:
                         {"owner": int32, "row": int64} (owner rank, row in its events.pt)
    part_<r>/eval_negatives.pt  (only when given, e.g. TGB's val/test lists) per split,
                         the pre-generated negatives of the part's OWN events of it:
                         {split: {"eid": int64 [p_r] increasing, "dst": int32 [p_r, q]}}

Event ownership: event ``i`` belongs to ``owner[src[i]]``. The source's memory and
mail update (the work every memory model does per event) is then local to the
owning rank, and ``metis_for_tgnn`` balances exactly the number of these events.
No file holds a table over all events that every rank reads: where event ``e`` lives is
in the ``event_book.pt`` of part ``e mod P`` (:class:`tgl_dist.dist.EventBook`).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor
from tqdm.auto import tqdm

from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.partition.load import MASK_NAMES
from tgl_dist.partition.registry import get_partitioner
from tgl_dist.partition.stats import partition_stats
from tgl_dist.integrity import atomic_dir, save_tensors
from tgl_dist.partition.storage import write_manifest

log = logging.getLogger(__name__)



def partition_dir(out: Union[str, Path], name: str, algo: str, num_parts: int) -> Path:
    """``out/<name>/<algo>_<num_parts>``, the folder one partitioning is written to."""
    return Path(out) / name / f"{algo}_{int(num_parts)}"


def _check_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"dataset name {name!r} cannot be used as a folder name; pass name=...")
    return name


def _check_owner(owner: Tensor, num_nodes: int, num_parts: int, algo: str) -> Tensor:
    owner = torch.as_tensor(owner).long().reshape(-1)
    if owner.numel() != num_nodes:
        raise ValueError(f"partitioner {algo!r} returned {owner.numel()} owners for {num_nodes} nodes")
    if num_nodes and (int(owner.min()) < 0 or int(owner.max()) >= num_parts):
        raise ValueError(f"partitioner {algo!r} returned owners outside [0, {num_parts}): "
                         f"[{int(owner.min())}, {int(owner.max())}]")
    return owner


def split_by_owner(owner: Tensor, num_parts: int) -> list:
    """Positions owned by each part, increasing within a part (the local order), as P tensors."""
    order = torch.sort(owner.long(), stable=True).indices
    counts = torch.bincount(owner.long(), minlength=num_parts)
    return list(torch.split(order, counts.tolist()))


def _owned_rows(owner: Tensor, r: int, chunk: int = 1 << 22) -> Tensor:
    """Positions ``i`` with ``owner[i] == r``, increasing, found chunk by chunk (no
    full-size temporary but the result)."""
    found = [torch.nonzero(owner[a:a + chunk] == r).view(-1) + a for a in range(0, owner.numel(), chunk)]
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.long)


def _touching_rows(src_owner: Tensor, dst_owner: Tensor, r: int, chunk: int = 1 << 22) -> Tensor:
    """Positions of the events with an endpoint owned by ``r``, increasing."""
    found = [torch.nonzero((src_owner[a:a + chunk] == r) | (dst_owner[a:a + chunk] == r)).view(-1) + a
             for a in range(0, src_owner.numel(), chunk)]
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.long)


def _part_payload(graph: TemporalGraph, node_ids: Tensor, event_idx: Tensor,
                  touching: Tensor) -> Iterator[Tuple[str, Dict]]:
    """The three files of a part, built one at a time (a generator), so at most one
    file's tensors are held besides the graph."""
    eid = graph.eid[event_idx]
    yield "nodes.pt", {"ids": node_ids.clone(),
                       "node_feat": None if graph.node_feat is None else graph.node_feat[node_ids]}
    # src and dst as the two rows of one [2, e] tensor: saved as one storage, they load as
    # views of it, and partition_load's edge_index is that tensor (no copy)
    ends = torch.stack([graph.src[event_idx], graph.dst[event_idx]])
    events = {
        "src": ends[0], "dst": ends[1], "t": graph.t[event_idx],
        "eid": eid,
        "edge_attr": None if graph.edge_attr is None else graph.edge_attr[eid],
        "labels": None if graph.labels is None else graph.labels[event_idx],
        "masks": {k: graph.masks[k][event_idx] for k in MASK_NAMES},
    }
    yield "events.pt", events
    del events, ends, eid
    yield "sample_graph.pt", {"src": graph.src[touching], "dst": graph.dst[touching],
                              "t": graph.t[touching], "eid": graph.eid[touching]}


def _negatives_of_part(tables: Mapping[str, Any], event_owner: Tensor, r: int,
                       dtype: torch.dtype) -> Dict:
    """``{split: {"eid", "dst"}}``: the rows of ``tables`` whose event part ``r`` owns,
    ``dst`` as ``dtype`` (int32 where the node ids fit: half the bytes)."""
    out = {}
    for split, tab in tables.items():
        keep = event_owner[tab.eid] == r
        out[split] = {"eid": tab.eid[keep].clone(), "dst": tab.dst[keep].to(dtype).contiguous()}
    return out


def _check_negatives(tables: Mapping[str, Any], graph: TemporalGraph) -> Dict[str, Dict]:
    """What the manifest records of ``tables`` (``ValueError`` where a table does not fit
    the graph): per split q, the number of events and the source file."""
    info = {}
    for split, tab in tables.items():
        if split not in MASK_NAMES:
            raise ValueError(f"eval_negatives: unknown split {split!r} (one of {MASK_NAMES})")
        eid, dst = torch.as_tensor(tab.eid), torch.as_tensor(tab.dst)
        if eid.dim() != 1 or dst.dim() != 2 or dst.size(0) != eid.numel():
            raise ValueError(f"eval_negatives[{split!r}]: eid must be [S] and dst [S, q], got "
                             f"{tuple(eid.shape)} and {tuple(dst.shape)}")
        if eid.numel() and (int(eid.min()) < 0 or int(eid.max()) >= graph.num_events
                            or not bool((eid[1:] > eid[:-1]).all())):
            raise ValueError(f"eval_negatives[{split!r}]: eid must be increasing event ids in "
                             f"[0, {graph.num_events})")
        if dst.numel() and (int(dst.min()) < -1 or int(dst.max()) >= graph.num_nodes):
            raise ValueError(f"eval_negatives[{split!r}]: negatives must be node ids in "
                             f"[0, {graph.num_nodes}) or -1 (padding)")
        info[split] = {"num_neg": int(dst.size(1)), "events": int(eid.numel()),
                       "source": getattr(tab, "source", None)}
    return info


def partition_graph(graph: TemporalGraph, num_parts: int, algo: str, out: Union[str, Path],
                    force: bool = False, seed: int = 0, name: Optional[str] = None,
                    progress: bool = False,
                    eval_negatives: Optional[Mapping[str, Any]] = None) -> Path:
    """Partition ``graph`` into ``num_parts`` parts with ``algo`` and write it to disk.

    Args:
        graph: the temporal graph (E events, N nodes).
        num_parts: P >= 1 (at most N).
        algo: a registered algorithm (``random``, ``hash``, ``metis``, ``metis_for_tgnn``).
        out: output root; the partition goes to ``out/<name>/<algo>_<P>/``.
        force: replace an existing output (otherwise ``FileExistsError``).
        seed: seed of the algorithm (``random`` shuffle, METIS seed).
        name: dataset folder name (default ``graph.name``).
        progress: show a tqdm progress bar on stderr.
        eval_negatives: pre-generated negatives to store with the partition, ``{split:
            table}`` with ``table.eid [S]`` (increasing) and ``table.dst [S, q]`` (``-1``
            padding), e.g. :func:`tgl_dist.data.loaders.tgb.load_tgb_negatives` of
            ``'val'`` and ``'test'``: each part keeps the rows of its own events
            (``part_<r>/eval_negatives.pt``), so no rank reads the whole table.

    Returns:
        the written folder ``out/<name>/<algo>_<P>``.

    Raises:
        ValueError: unknown ``algo`` (lists the known ones) or bad ``num_parts``.
        FileExistsError: the output exists and ``force`` is False.
    """
    fn = get_partitioner(algo)
    if isinstance(num_parts, bool) or not isinstance(num_parts, int) or num_parts < 1:
        raise ValueError(f"num_parts must be a positive int, got {num_parts!r}")
    if num_parts > max(graph.num_nodes, 1):
        raise ValueError(f"num_parts={num_parts} exceeds the number of nodes ({graph.num_nodes})")
    name = _check_name(name if name is not None else graph.name)
    missing = [k for k in MASK_NAMES if k not in graph.masks]
    if missing:
        raise ValueError(f"graph.masks lacks {', '.join(missing)}; call graph.split() first")
    if not torch.equal(graph.eid, torch.arange(graph.num_events, dtype=graph.eid.dtype)):
        raise ValueError("event ids must be 0..E-1 in stream order (a partition looks events "
                         "up by id), and this graph's are not (e.g. made by subgraph_events): "
                         "build a TemporalGraph from its src, dst, t (and edge_attr[eid]) first")
    neg_info = _check_negatives(eval_negatives, graph) if eval_negatives else None
    neg_dtype = torch.int32 if graph.num_nodes <= 2 ** 31 else torch.int64  # ids < num_nodes
    dest = partition_dir(out, name, algo, num_parts)
    if dest.exists() and not force:
        raise FileExistsError(f"{dest} already exists; pass force=True (--force) to overwrite it")

    P = num_parts
    bar = tqdm(total=P + 3, desc=f"{algo} P={P}", unit="step", disable=not progress, leave=False)
    bar.set_postfix_str("partitioning")
    t0 = time.perf_counter()
    owner = _check_owner(fn(graph, P, seed), graph.num_nodes, P, algo)
    seconds = time.perf_counter() - t0
    bar.update(1)

    bar.set_postfix_str("statistics")
    stats = partition_stats(graph.src, graph.dst, owner, P)
    stats["seconds"] = round(seconds, 4)
    # int32 owners (4 bytes an event each) and each event's row in its owner's events.pt
    # (int64); a part's rows are found when it is written, so what is held besides the
    # graph is 16 bytes an event plus one part's tensors
    owner32 = owner.to(torch.int32)
    event_owner = owner32[graph.src]
    dst_owner = owner32[graph.dst]
    event_row = torch.empty(graph.num_events, dtype=torch.long)
    for r in range(P):
        rows = _owned_rows(event_owner, r)
        event_row[rows] = torch.arange(rows.numel())
        del rows
    node_parts = split_by_owner(owner, P)
    bar.update(1)

    with atomic_dir(dest, force=force) as tmp:
        save_tensors(tmp / "book.pt", {"node_owner": owner32})
        for r in range(P):
            bar.set_postfix_str(f"part {r}")
            part = tmp / f"part_{r}"
            part.mkdir()
            for fname, obj in _part_payload(graph, node_parts[r], _owned_rows(event_owner, r),
                                            _touching_rows(event_owner, dst_owner, r)):
                save_tensors(part / fname, obj)
                del obj
            save_tensors(part / "event_book.pt", {"owner": event_owner[r::P].clone(),
                                                  "row": event_row[r::P].clone()})
            if eval_negatives:
                save_tensors(part / "eval_negatives.pt",
                             _negatives_of_part(eval_negatives, event_owner, r, neg_dtype))
            bar.update(1)
        del event_row
        bar.set_postfix_str("manifest")
        meta = {
            "name": name, "algorithm": algo, "num_parts": P, "seed": int(seed),
            "num_nodes": graph.num_nodes, "num_events": graph.num_events,
            "edge_feat_dim": 0 if graph.edge_attr is None else int(graph.edge_attr.size(1)),
            "node_feat_dim": 0 if graph.node_feat is None else int(graph.node_feat.size(1)),
            "has_labels": graph.labels is not None,
            "fingerprint": graph.fingerprint(),
            "event_owner": "source",
            "stats": stats,
        }
        if neg_info:
            meta["eval_negatives"] = neg_info
        write_manifest(tmp, meta)
        bar.update(1)
    bar.close()
    log.info("partitioned %s with %s into %d parts in %.2fs: edge_cut %.4f, balance nodes %.3f "
             "events %.3f -> %s", name, algo, P, seconds, stats["edge_cut"],
             stats["balance_nodes"], stats["balance_events"], dest)
    return dest
