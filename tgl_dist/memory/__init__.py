"""Node memory and mailbox of owned nodes (all-to-all sync), and memory updaters."""
from tgl_dist.memory.dedup import latest_per_key
from tgl_dist.memory.mailbox import SharedMailBox
from tgl_dist.memory.updaters import (GRUMemoryUpdater, MemoryUpdater, RNNMemoryUpdater,
                                      TransformerMemoryUpdater)

__all__ = ["SharedMailBox", "MemoryUpdater", "GRUMemoryUpdater", "RNNMemoryUpdater",
           "TransformerMemoryUpdater", "latest_per_key"]
