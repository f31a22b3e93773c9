"""Loaders: time-aligned distributed mini-batches of temporal events with background sampling."""
from tgl_dist.loader.loader import SAMPLE_TYPE, DistributedDataLoader, SampleType, new_group
from tgl_dist.loader.schedule import GlobalSchedule, Window

__all__ = ["DistributedDataLoader", "SAMPLE_TYPE", "SampleType", "GlobalSchedule", "Window", "new_group"]
