"""A CTDG run's setup: partition on first use (rank 0 writes, the others wait; other nodes get a copy) and the per-rank batch split.

:func:`ensure_partition` is what :class:`tgl_dist.ctdg.Trainer` calls before it loads its
rank's part; :func:`split_batch` turns the global batch size (events per step over all
ranks, ``train.batch_size``) into the loader's per-rank ``batch_size``. Both are usable
alone, e.g. in a hand-written loop::

    folder = ensure_partition("synthetic", "parts", world_size=ctx.world_size)
    per_rank, chunk = split_batch(600, ctx.world_size)
    loader = DistributedDataLoader(graph, "train", batch_size=per_rank, chunk_size=chunk)
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

from tgl_dist.dist import broadcast_object, world
from tgl_dist.errors import TGLDistError
from tgl_dist.partition import partition_graph
from tgl_dist.partition.replicate import replicate_partition
from tgl_dist.partition.storage import MANIFEST, read_manifest, written_from

log = logging.getLogger(__name__)


class RunSetupError(TGLDistError, ValueError):
    """A run that cannot start as asked (a bad ``parts`` root, empty splits, a batch size
    that does not split over the ranks); raised on every rank alike."""


def check_parts_root(root: Path) -> None:
    """``ValueError`` when ``root`` names a level below the partition root: one partition
    (``<root>/<name>/<algo>_<P>``, which holds the manifest) or one dataset's partitions
    (``<root>/<name>``). Either would get a new partition written inside it."""
    root = Path(root)
    if (root / MANIFEST).is_file():
        raise RunSetupError(f"--parts {root} is one partition (it holds {MANIFEST}); --parts "
                            f"takes the root that python -m tgl_dist.partition --out wrote "
                            f"into: --parts {root.parent.parent}")
    if root.is_dir() and any((d / MANIFEST).is_file() for d in root.iterdir() if d.is_dir()):
        raise RunSetupError(f"--parts {root} holds one dataset's partitions; --parts takes the "
                            f"folder above it (the --out of python -m tgl_dist.partition): "
                            f"--parts {root.parent}")


def check_splits(g, data: str) -> None:
    """``ValueError`` when the chronological split leaves train, validation or test empty:
    validation and test are the events after the 70 % and 85 % quantiles of time, so a
    stream with (nearly) one timestamp, e.g. a column read as time that is not one, has
    no validation or test events, and every metric would be NaN."""
    counts = {k: int(g.masks[k].sum()) for k in ("train", "val", "test")}
    empty = [k for k, n in counts.items() if n == 0]
    if empty:
        raise RunSetupError(
            f"{data}: the chronological split leaves {' and '.join(empty)} without events "
            f"(train/val/test {counts['train']}/{counts['val']}/{counts['test']} of "
            f"{g.num_events}; {int(g.t.unique().numel())} distinct timestamps from "
            f"{float(g.t.min()) if g.num_events else 0:g} to "
            f"{float(g.t.max()) if g.num_events else 0:g}). Validation and test are the "
            f"events after the 70 % and 85 % quantiles of time: check that the column read "
            f"as time is the time (--format)")


def ensure_partition(data: Union[str, Any], parts: Union[str, Path], algo: str = "metis_for_tgnn",
                     world_size: Optional[int] = None, rank: Optional[int] = None,
                     repartition: bool = False, root: Optional[str] = None,
                     format: Optional[str] = None,
                     dataset_kwargs: Optional[Dict[str, Any]] = None,
                     tgb_negatives: bool = False) -> Path:
    """The dataset's partition folder ``parts/<name>`` holding ``<algo>_<world_size>``,
    written on first use (collective: every rank calls it).

    Rank 0 loads ``data`` (a name or path for :func:`tgl_dist.data.load_dataset`, or a
    :class:`~tgl_dist.data.TemporalGraph`) and partitions it when the partition is
    absent or was written from other data (its manifest's fingerprint differs: an edited
    file, another ``num_events`` or ``seed``), or when ``repartition``; the other ranks
    wait for it. An error on rank 0 (a bad ``parts`` level, empty splits, an unreadable
    file, ``parts`` not writable) is raised on every rank as :class:`RunSetupError`.
    On nodes that do not see rank 0's ``parts`` (no shared file system), the node's
    lowest rank receives rank 0's partition over the process group
    (:func:`tgl_dist.partition.replicate.replicate_partition`); a node that cannot have
    it stops every rank with a :class:`~tgl_dist.errors.PartitionError` naming the
    node and the path.

    Args:
        data: dataset name, file path, or a ``TemporalGraph``.
        parts: the partition root (the ``--out`` of ``python -m tgl_dist.partition``).
        algo: partitioner run on first use.
        world_size, rank: default: the world's.
        repartition: partition again even if a matching partition exists.
        root, format, dataset_kwargs: passed to ``load_dataset`` (``root`` folder of the
            named datasets, file ``format``, e.g. ``{'num_nodes': 60}`` for synthetic).
        tgb_negatives: the partition must hold TGB's validation and test negatives
            (``eval_protocol='tgb'``): rank 0 reads ``<root>/<tgbl_name>/*_ns*.pkl`` once
            and each part stores its own events' lists (``part_<r>/eval_negatives.pt``);
            a partition without them, or with those of another file (the size its
            manifest records differs), is written again.
    """
    r, w = world()
    rank = r if rank is None else rank
    world_size = w if world_size is None else world_size
    folder, part, err = None, None, None
    if rank == 0:
        try:
            check_parts_root(Path(parts))
            if isinstance(data, str):
                from tgl_dist.data import load_dataset
                g = load_dataset(data, root=root, format=format, **(dataset_kwargs or {}))
            else:
                g = data
            check_splits(g, data if isinstance(data, str) else g.name)
            folder = Path(parts) / g.name
            part = folder / f"{algo}_{world_size}"
            same = written_from(part, g.fingerprint())
            negs = _tgb_sources(g.name, root) if tgb_negatives else None
            if repartition or not same or (negs and not _holds_negatives(part, negs)):
                if part.is_dir() and not repartition:
                    if not same:
                        log.warning("%s was written from other data than %s; partitioning "
                                    "again", part, getattr(g, "name", data))
                    else:
                        log.info("%s holds no TGB negatives of %s; partitioning again with "
                                 "them", part, ", ".join(v["file"] for v in negs.values()))
                log.info("partitioning %s into %d parts with %s", g.name, world_size, algo)
                from tgl_dist.data.loaders.tgb import tgb_eval_negatives
                partition_graph(g, world_size, algo, parts, force=True,
                                eval_negatives=tgb_eval_negatives(g, root) if negs else None)
        except (TGLDistError, ValueError, OSError) as e:   # OSError: parts not writable
            err = f"{type(e).__name__}: {e}" if not isinstance(e, RunSetupError) else str(e)
    if world(None)[1] > 1:
        folder, part, err = broadcast_object((folder, part, err))
    if err:
        raise RunSetupError(err)
    replicate_partition(part)   # nodes that do not see rank 0's --parts get a copy
    return Path(folder)


def _tgb_sources(name: str, root: Optional[str]) -> Dict[str, Dict]:
    """``{split: {'file', 'bytes'}}`` of TGB's val/test negatives files of dataset ``name``
    (``DatasetNotFoundError`` naming the file where one is absent)."""
    from tgl_dist.data.loaders.tgb import negatives_source, tgb_negatives_path
    return {s: negatives_source(tgb_negatives_path(name, s, root)) for s in ("val", "test")}


def _holds_negatives(part: Path, sources: Dict[str, Dict]) -> bool:
    """Whether the partition ``part`` stores the negatives read from ``sources``."""
    try:
        have = read_manifest(part).get("eval_negatives") or {}
    except TGLDistError:
        return False
    return all((have.get(s) or {}).get("source") == src for s, src in sources.items())


def make_run_dir(out: Union[None, str, Path], data: str, model: str,
                 runs: Union[str, Path] = "runs") -> Path:
    """The run folder (collective: every rank calls it): ``out``, or by default
    ``<runs>/<data>_<model>_<timestamp>`` with rank 0's timestamp (``YYYYmmdd-HHMMSS``,
    ``-2``, ``-3``... when that folder exists already) broadcast to the others. Rank 0
    creates it; an error there (not writable) is raised on every rank as
    :class:`RunSetupError`."""
    r, w = world()
    path, err = None, None
    if r == 0:
        try:
            if out is None:
                base = Path(runs) / f"{data}_{model}_{time.strftime('%Y%m%d-%H%M%S')}"
                path, n = base, 1
                while path.exists():
                    n += 1
                    path = base.with_name(f"{base.name}-{n}")
            else:
                path = Path(out)
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            err = f"--out {path}: cannot create the run folder ({e.strerror or e})"
    if w > 1:
        path, err = broadcast_object((path, err))
    if err:
        raise RunSetupError(err)
    return Path(path)


def split_batch(batch_size: int, world_size: int, reorder: int = 0) -> Tuple[int, Optional[int]]:
    """``(per_rank, chunk)``: the loader's per-rank ``batch_size`` for a GLOBAL batch of
    ``batch_size`` events per step over ``world_size`` ranks, and the chunk size of TGL's
    random chunk scheduling (``batch_size / reorder``; ``None`` when ``reorder`` is 0).

    Raises :class:`RunSetupError` unless ``world_size`` divides ``batch_size`` (each
    step's window is the per-rank batch x ranks: a smaller window would change what the
    run learns) and ``reorder`` divides it.

    >>> split_batch(600, 2, reorder=4)
    (300, 150)
    """
    if batch_size % world_size:
        raise RunSetupError(f"the batch size {batch_size} (events per step over all ranks) must "
                            f"be a multiple of the {world_size} processes (each step's window is "
                            f"the batch size per process x processes; a smaller window would "
                            f"change what the run learns)")
    chunk = None
    if reorder:  # TGL's random chunk scheduling: windows shift by chunks of B / reorder
        if batch_size % reorder:
            raise RunSetupError(f"train.reorder {reorder} must divide the batch size {batch_size}")
        chunk = batch_size // reorder
    return batch_size // world_size, chunk


class LoaderTap:
    """A loader as ``run_epoch`` sees it, showing each step to :meth:`on_step` on the way
    (before the step is scored; the same step index on every rank). Everything else
    (``len``, attributes) is the wrapped loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str):
        return getattr(self._loader, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self):
        for step, item in enumerate(self._loader):
            roots, _, meta, _ = item
            self.on_step(step, roots, meta)
            yield item

    def on_step(self, step: int, roots: Any, meta: Dict[str, Any]) -> None:
        """Called with each step's roots and metadata (override)."""

