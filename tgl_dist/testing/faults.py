"""Fault injection for recovery tests: ``TGL_DIST_FAULT`` makes one rank fail at one step.

:meth:`tgl_dist.checkpoint.RunCheckpoint.at` calls :func:`maybe_inject_fault` after every
step, so a test can make a torchrun job lose a rank at a chosen place, e.g.::

    TGL_DIST_FAULT="rank=1,epoch=1,split=train,step=5,action=kill,once=/tmp/fault-done"

``action``: ``kill`` (SIGKILL itself, the default), ``raise`` (a ``RuntimeError``),
``hang`` (sleep forever: the peers time out); ``once=<file>``: fail only if the file
does not exist yet, and create it (so a restarted run gets past the step). Unset, the
variable costs one ``os.environ`` lookup per step.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Dict

log = logging.getLogger(__name__)

FAULT_ENV = "TGL_DIST_FAULT"


def _parse_fault(text: str) -> Dict[str, str]:
    spec = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        if "=" not in item:
            raise ValueError(f"{FAULT_ENV}: expected key=value items, got {item!r}")
        k, v = item.split("=", 1)
        spec[k.strip()] = v.strip()
    unknown = set(spec) - {"rank", "epoch", "split", "step", "action", "once"}
    if unknown:
        raise ValueError(f"{FAULT_ENV}: unknown keys {sorted(unknown)}")
    if spec.get("action", "kill") not in ("kill", "raise", "hang"):
        raise ValueError(f"{FAULT_ENV}: action must be kill, raise or hang, got {spec['action']!r}")
    return spec


def maybe_inject_fault(rank: int, epoch: int, split: str, step: int) -> None:
    """Testing hook: fail here if ``$TGL_DIST_FAULT`` names this rank, epoch, split and step.

    ``step`` counts the steps done in the split (1 = after the first step); ``split``
    defaults to ``train``. Does nothing when the variable is unset.
    """
    text = os.environ.get(FAULT_ENV)
    if not text:
        return
    spec = _parse_fault(text)
    if (int(spec.get("rank", 0)) != rank or int(spec.get("epoch", 0)) != epoch
            or spec.get("split", "train") != split or int(spec.get("step", 1)) != step):
        return
    once = spec.get("once")
    if once:
        if Path(once).exists():
            return
        Path(once).write_text(f"rank {rank} failed at epoch {epoch} {split} step {step}\n")
    action = spec.get("action", "kill")
    log.error("%s: injected %s on rank %d at epoch %d, %s step %d", FAULT_ENV, action, rank,
              epoch, split, step)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":
        while True:
            time.sleep(3600)
    raise RuntimeError(f"{FAULT_ENV}: injected failure on rank {rank} at epoch {epoch}, "
                       f"{split} step {step}")
