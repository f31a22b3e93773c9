"""Helpers for tests: gloo processes on one machine, and fault injection for recovery tests."""
from tgl_dist.testing.faults import FAULT_ENV, maybe_inject_fault
from tgl_dist.testing.multiprocess import free_port, run_distributed

__all__ = ["run_distributed", "free_port", "maybe_inject_fault", "FAULT_ENV"]
