"""Temporal GNN models (TGN, JODIE, APAN, DyRep, TGAT) built from TGL-style YAML configs."""
from tgl_dist.models.builder import build_model, embedding_dim
from tgl_dist.models.config import (ConfigError, GNNConfig, MemoryConfig, ModelConfig,
                                    SamplingConfig, TrainConfig, load_config, parse_config)
from tgl_dist.models.optim import TrainOptimizer, build_optimizer, sharded_modules
from tgl_dist.models.parallel import all_reduce_gradients, broadcast_parameters
from tgl_dist.models.tgnn import LinkPredOutput, TemporalLinkModel
from tgl_dist.models.training import link_loss, run_epoch

__all__ = ["build_model", "embedding_dim", "ConfigError", "ModelConfig", "SamplingConfig",
           "MemoryConfig", "GNNConfig", "TrainConfig", "load_config", "parse_config",
           "TemporalLinkModel", "LinkPredOutput", "all_reduce_gradients", "broadcast_parameters", "run_epoch", "link_loss",
           "TrainOptimizer", "build_optimizer", "sharded_modules"]
