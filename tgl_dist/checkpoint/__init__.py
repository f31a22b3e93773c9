"""Versioned, crash-safe checkpoints: commit by one small version file after every rank wrote."""
from tgl_dist.checkpoint.manager import (CheckpointError, CheckpointManager, rng_state,
                                         set_rng_state)

__all__ = ["CheckpointManager", "CheckpointError", "rng_state", "set_rng_state"]
