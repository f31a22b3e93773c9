"""CTDG: memory-based temporal GNNs (TGN, JODIE, APAN, DyRep, TGAT) from TGL-style YAML, their training loop, and the Trainer."""
from tgl_dist.ctdg.builder import build_model, embedding_dim
from tgl_dist.ctdg.config import (ConfigError, GNNConfig, MemoryConfig, ModelConfig,
                                  SamplingConfig, TrainConfig, parse_config)
from tgl_dist.ctdg.config_file import load_config
from tgl_dist.ctdg.tgnn import LinkPredOutput, TemporalLinkModel
from tgl_dist.ctdg.training import link_loss, run_epoch
from tgl_dist.ctdg.run import RunSetupError, ensure_partition, split_batch
from tgl_dist.ctdg.trainer import Trainer, summary_json

__all__ = ["build_model", "embedding_dim", "ConfigError", "ModelConfig", "SamplingConfig",
           "MemoryConfig", "GNNConfig", "TrainConfig", "load_config", "parse_config",
           "TemporalLinkModel", "LinkPredOutput", "run_epoch", "link_loss",
           "Trainer", "summary_json", "ensure_partition", "split_batch", "RunSetupError"]
