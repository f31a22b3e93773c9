"""Checkpoint policy of a training run, where the run is, and failing loudly when a peer dies.

:class:`RunCheckpoint` is what the examples use: it wraps a :class:`CheckpointManager`,
decides when to save (``--checkpoint-every``: every N training steps or every N
epochs), loads the committed version on ``--resume``, remembers the run's position
(epoch, split, step) and turns a :class:`~tgl_dist.errors.PeerFailureError` raised
anywhere inside :meth:`RunCheckpoint.guard` into one that names that position::

    ck = RunCheckpoint("runs/ck", every="500", run_meta={...}, resume=True)
    saved = ck.load()              # (dense, shard, meta) or None: nothing committed yet
    with ck.guard():
        for epoch in ...:
            ck.at(epoch, "train", step)                   # after every step
            if ck.step_due(global_step): ck.save(dense, shard, meta)

Fault injection for the recovery tests: :mod:`tgl_dist.testing.faults` (``TGL_DIST_FAULT``),
checked by :meth:`RunCheckpoint.at` after every step.
"""
from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

from tgl_dist.checkpoint.manager import CheckpointManager
from tgl_dist.dist.exchange import world
from tgl_dist.errors import PeerFailureError, TGLDistError
from tgl_dist.testing.faults import maybe_inject_fault

log = logging.getLogger(__name__)

_EVERY = re.compile(r"^\s*(\d+)\s*(e|ep|epoch|epochs|s|step|steps)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Every:
    """A checkpoint frequency: every ``n`` training steps or every ``n`` epochs."""

    n: int
    unit: str  # 'steps' | 'epochs'

    @classmethod
    def parse(cls, text: str) -> "Every":
        """``'500'`` / ``'500s'`` / ``'500steps'``: every 500 training steps (counted over
        the whole run); ``'1e'`` / ``'2epochs'``: at the end of every 1st / 2nd epoch."""
        m = _EVERY.match(str(text))
        if not m or int(m.group(1)) < 1:
            raise ValueError(f"--checkpoint-every: expected N (steps), Ns or Ne (epochs) "
                             f"with N >= 1, e.g. '500' or '1e'; got {text!r}")
        unit = "epochs" if (m.group(2) or "s").lower().startswith("e") else "steps"
        return cls(int(m.group(1)), unit)

    def __str__(self) -> str:
        return f"{self.n}{'e' if self.unit == 'epochs' else ''}"


# ------------------------------------------------------------------- the policy
class RunCheckpoint:
    """When to save, what was committed, and where the run is (every rank builds one).

    Args:
        path: checkpoint folder, or ``None`` (no checkpoints; position tracking and
            :meth:`guard` still work).
        every: ``--checkpoint-every`` text or :class:`Every` (default every epoch).
        run_meta: what must match on resume (partition identity, config, seed...).
        keep_every: keep a snapshot every N epochs (0: only the latest; see CheckpointManager).
        resume: :meth:`load` returns the committed version (``None`` when nothing was
            committed yet: a fresh start, so ``--resume`` is safe on a first launch).
        group: process group (default: world).
    """

    def __init__(self, path=None, every: Any = "1e", run_meta: Optional[Dict[str, Any]] = None,
                 keep_every: int = 0, resume: bool = False, group=None) -> None:
        self.every = every if isinstance(every, Every) else Every.parse(every)
        self.resume = bool(resume)
        self.rank = world(group)[0]
        self.mgr = (CheckpointManager(path, keep_every=keep_every, run_meta=run_meta, group=group)
                    if path is not None else None)
        if resume and self.mgr is None:
            raise TGLDistError("--resume needs --checkpoint-dir")
        if self.mgr is not None and not resume and self.rank == 0:
            v = self.mgr.committed_version()
            if v is not None:
                log.warning("%s holds a committed run (version %d); this NEW run will replace it "
                            "(pass --resume to continue it instead)", self.mgr.path, v)
        self.where: Tuple[int, str, int] = (-1, "setup", 0)
        self.phase = "step"
        self.last_version: Optional[int] = None

    @property
    def enabled(self) -> bool:
        return self.mgr is not None

    # ------------------------------------------------------------ load / save
    def load(self) -> Optional[Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]]:
        """``(dense, shard, meta)`` of the committed version when resuming, else ``None``."""
        if not self.resume:
            return None
        v = self.mgr.agreed_version()   # collective: a node lacking it stops every rank
        if v is None:
            log.warning("--resume: nothing committed in %s yet: starting from the beginning",
                        self.mgr.path)
            return None
        dense, shard, meta = self.mgr.load(version=v)
        log.warning("resuming from %s version %d: epoch %s, step %s", self.mgr.path,
                    v, meta.get("epoch"), meta.get("step"))
        return dense, shard, meta

    def step_due(self, global_step: int) -> bool:
        """Save after this training step? (every N steps, counted over the run)."""
        return self.enabled and self.every.unit == "steps" and global_step % self.every.n == 0

    def epoch_due(self, epoch: int, last: bool = False) -> bool:
        """Save after epoch ``epoch``? (every N epochs, and always after the last one)."""
        return self.enabled and (last or (self.every.unit == "epochs" and (epoch + 1) % self.every.n == 0))

    def save(self, dense: Optional[Dict[str, Any]], shard: Dict[str, Any],
             meta: Dict[str, Any]) -> int:
        """Write and commit one version (collective); a peer failure names the position."""
        prev, self.phase = self.phase, "checkpoint save"
        try:
            self.last_version = self.mgr.save(dense, shard, meta)
        finally:
            self.phase = prev
        log.info("checkpoint version %d committed: %s", self.last_version, meta)
        return self.last_version

    # ------------------------------------------------------------- position
    def at(self, epoch: int, split: str, step: int) -> None:
        """Record that ``step`` steps of ``split`` in ``epoch`` are done (``-1``: the
        split started, steps not counted) and run the fault-injection hook."""
        self.where = (int(epoch), split, int(step))
        maybe_inject_fault(self.rank, int(epoch), split, int(step))

    def describe(self) -> str:
        epoch, split, step = self.where
        if split == "setup":
            return "during setup (before the first step)"
        if step < 0:  # a phase without step numbers (e.g. a DTDG evaluation)
            return f"at epoch {epoch}, during split {split}"
        if self.phase == "checkpoint save":
            return f"at epoch {epoch}, split {split}, writing the checkpoint after step {step}"
        return f"at epoch {epoch}, split {split}, step {step + 1} ({step} steps of it done)"

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Re-raise a :class:`PeerFailureError` with this rank and the run's position."""
        try:
            yield
        except PeerFailureError as e:
            raise PeerFailureError(f"rank {self.rank} stopped {self.describe()}: a peer rank "
                                   f"failed or stopped responding ({e})") from e
