"""Versioned, crash-safe checkpoints: commit by one small version file after every rank wrote;
what a training checkpoint holds (:mod:`.state`); the run's checkpoint policy, position and
peer-failure errors (:mod:`.recovery`)."""
from tgl_dist.checkpoint.manager import (CheckpointError, CheckpointManager, rng_state,
                                         set_rng_state)
from tgl_dist.checkpoint.recovery import Every, RunCheckpoint
from tgl_dist.checkpoint.state import (capture, config_dict, join_nested, load_split_state_dict,
                                       partition_identity, restore, split_nested,
                                       split_state_dict)

__all__ = ["CheckpointManager", "CheckpointError", "rng_state", "set_rng_state",
           "RunCheckpoint", "Every",
           "capture", "restore", "split_state_dict", "load_split_state_dict", "split_nested",
           "join_nested", "config_dict", "partition_identity"]
