"""Temporal graph data: the ``TemporalGraph`` container, format loaders and the built-in dataset."""
from tgl_dist.data.loaders import (from_pyg, guess_format, infer_format, load_dyglib, load_jodie,
                                   load_konect, load_named_csv, load_pyg, load_snap,
                                   load_snap_signed, to_pyg)
from tgl_dist.data.registry import DatasetNotFoundError, default_root, known_datasets, load_dataset
from tgl_dist.data.synthetic import generate_synthetic
from tgl_dist.data.temporal import TemporalGraph

__all__ = [
    "TemporalGraph", "load_dataset", "known_datasets", "default_root", "DatasetNotFoundError", "generate_synthetic",
    "load_jodie", "load_dyglib", "load_snap", "load_snap_signed", "load_konect", "load_pyg",
    "from_pyg", "to_pyg", "infer_format", "guess_format", "load_named_csv",
]
