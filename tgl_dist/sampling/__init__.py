"""Sampling: temporal neighbour sampling into MFG blocks, negative sampling."""
from tgl_dist.sampling.block import Block, Roots
from tgl_dist.sampling.negative import NegativeSampling
from tgl_dist.sampling.neighbor import NeighborSampler

__all__ = ["Block", "Roots", "NeighborSampler", "NegativeSampling"]
