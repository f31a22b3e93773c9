"""Helpers for tests: run a function on several gloo processes on one machine."""
from tgl_dist.testing.multiprocess import free_port, run_distributed

__all__ = ["run_distributed", "free_port"]
