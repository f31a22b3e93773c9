"""TGL-style model configs: four YAML sections (``sampling``, ``memory``, ``gnn``, ``train``).

The YAML is parsed into frozen, keyword-only dataclasses; every field is checked and
a bad value raises :class:`ConfigError` naming its path (``memory.dim_out``) and the
file. Models never read configs: :func:`tgl_dist.ctdg.build_model` turns a config
into modules with explicit arguments.

Example (``configs/TGN.yml``)::

    sampling: [{layer: 1, neighbor: [10], strategy: recent, prop_time: False, history: 1, duration: 0}]
    memory: [{type: node, dim_time: 100, deliver_to: self, mail_combine: last,
              memory_update: gru, mailbox_size: 1, combine_node_feature: True, dim_out: 100}]
    gnn: [{arch: transformer_attention, layer: 1, att_head: 2, dim_time: 100, dim_out: 100}]
    train: [{epoch: 100, batch_size: 600, lr: 0.0001, dropout: 0.2, att_dropout: 0.2}]

TGL wraps each section in a one-element list; a plain mapping is accepted too. Files
are read by :func:`tgl_dist.ctdg.config_file.load_config` (re-exported here).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional, Tuple

from tgl_dist.errors import TGLDistError


class ConfigError(TGLDistError, ValueError):
    """A config value that cannot be used: names the file and the field path."""

    def __init__(self, path: str, message: str, source: Optional[str] = None) -> None:
        self.field_path = path
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{path}: {message}")


def _choice(*names):
    def check(v):
        if v not in names:
            return f"expected one of {list(names)}, got {v!r}"
    return check


def _pos_int(v):
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        return f"expected a positive integer, got {v!r}"


def _nonneg_int(v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return f"expected a non-negative integer, got {v!r}"


def _bool(v):
    if not isinstance(v, bool):
        return f"expected True or False, got {v!r}"


def _prob(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
        return f"expected a number in [0, 1), got {v!r}"


def _pos_num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
        return f"expected a positive finite number, got {v!r}"


def _nonneg_num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
        return f"expected a non-negative finite number, got {v!r}"


def _opt_pos_int(v):
    if v is not None:
        return _pos_int(v)


# a number as YAML 1.2 writes it; PyYAML (YAML 1.1) reads 1e-4 and 1.0e4 as strings
_NUMBER = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
_NUMERIC_TYPES = ("int", "float", "Optional[float]", "Optional[int]")


def _fanouts(v):
    if not isinstance(v, (list, tuple)) or not v or any(_pos_int(x) for x in v):
        return f"expected a non-empty list of positive integers (one per hop), got {v!r}"


def _any(v):
    return None


def _f(default, check=_any, help: str = ""):
    return field(default=default, metadata={"check": check, "help": help})


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """``sampling``: temporal neighbour sampling."""
    layer: int = _f(1, _pos_int, "number of hops L")
    neighbor: Tuple[int, ...] = _f((10,), _fanouts, "fan-out per hop")
    strategy: str = _f("recent", _choice("recent", "uniform"), "which earlier neighbours")
    prop_time: bool = _f(False, _bool, "deeper hops query at the root time (only False)")
    history: int = _f(1, _pos_int, "snapshots (only 1: CTDG models)")
    duration: float = _f(0, _nonneg_num, "snapshot length (0 = infinite)")
    num_thread: int = _f(1, _pos_int, "sampler threads")
    no_sample: bool = _f(False, _bool, "no neighbours (JODIE)")
    no_neg: bool = _f(False, _bool, "sample neighbours of positive roots only (APAN)")


@dataclass(frozen=True, kw_only=True)
class MemoryConfig:
    """``memory``: node memory and mailbox (``type: none`` = no memory)."""
    type: str = _f("none", _choice("node", "none"), "'node' keeps a memory per node")
    dim_out: int = _f(0, _nonneg_int, "memory size d_m")
    dim_time: int = _f(0, _nonneg_int, "time-encoding size of the updater")
    deliver_to: str = _f("self", _choice("self", "neighbors"), "who receives an event's mail")
    mail_combine: str = _f("last", _choice("last", "mean"), "several mails to a node in a step")
    memory_update: str = _f("gru", _choice("gru", "rnn", "transformer"), "updater")
    mailbox_size: int = _f(1, _pos_int, "mailbox slots K")
    combine_node_feature: bool = _f(True, _bool, "add node features to the memory")
    attention_head: int = _f(2, _pos_int, "heads of the transformer updater")
    mail_dst_embedding: bool = _f(False, _bool,
                                  "mails carry the other endpoint's embedding (DyRep)")
    time_delta: str = _f("query", _choice("query", "mail"),
                         "updater time input: 'query' phi(t - memory_ts) per (node, query time) "
                         "(TGL); 'mail' phi(mail_ts - last update), once per node (TGN code, "
                         "DyGLib, PyG)")


@dataclass(frozen=True, kw_only=True)
class GNNConfig:
    """``gnn``: the embedding module."""
    arch: str = _f("transformer_attention", _choice("transformer_attention", "identity"),
                   "temporal attention layers or none")
    layer: int = _f(1, _pos_int, "attention layers (= sampling.layer)")
    att_head: int = _f(2, _pos_int, "attention heads")
    dim_time: int = _f(100, _nonneg_int, "time-encoding size")
    dim_out: int = _f(0, _nonneg_int, "output size (0: memory.dim_out)")
    time_transform: Optional[str] = _f(None, _choice(None, "JODIE"), "JODIE time projection")
    att_variant: str = _f("tgl", _choice("tgl", "tgn"),
                          "attention layer: 'tgl' (TGL layers.py) or 'tgn' (TGN code / DyGLib: "
                          "scaled dot product, residual LayerNorm, merge MLP)")
    output: str = _f("gnn", _choice("gnn", "memory"),
                     "what the predictor scores: the GNN output or the updated memory (DyRep)")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """``train``: optimisation."""
    epoch: int = _f(100, _pos_int, "epochs")
    batch_size: int = _f(600, _pos_int, "GLOBAL batch: events per step over all ranks "
                                        "(split over them: batch_size / world_size each)")
    local_batch_size: Optional[int] = _f(None, _opt_pos_int,
                                         "PER-RANK batch, as TGL's dist configs mean "
                                         "'batch_size: 4000 # local batch_size': a step covers "
                                         "local_batch_size x world_size events; replaces "
                                         "batch_size when set (give one of the two)")
    lr: float = _f(1e-4, _pos_num, "Adam learning rate")
    dropout: float = _f(0.1, _prob, "dropout")
    att_dropout: float = _f(0.1, _prob, "attention dropout")
    all_on_gpu: bool = _f(False, _bool, "TGL option, accepted and ignored")
    reorder: int = _f(0, _nonneg_int, "TGL random chunk scheduling: the training windows shift "
                                       "by a random multiple of batch_size / reorder each epoch "
                                       "(0 = off)")
    patience: int = _f(5, _pos_int, "early stopping: epochs without a better validation AP")

    def global_batch_size(self, world_size: int) -> int:
        """Events per step over all ``world_size`` ranks: ``local_batch_size *
        world_size`` when the per-rank size is set, else ``batch_size``."""
        if self.local_batch_size is not None:
            return self.local_batch_size * int(world_size)
        return self.batch_size


def _opt_pos_num(v):
    if v is not None:
        return _pos_num(v)


@dataclass(frozen=True, kw_only=True)
class NodeEmbeddingConfig:
    """``node_embedding``: a learnable per-node input, sharded over ranks (absent or ``dim: 0`` = off).

    Example: ``node_embedding: {dim: 100, lr: 0.001, optimizer: adam}``. The table is a
    :class:`tgl_dist.nn.DistEmbedding` trained by a sparse optimizer
    (:func:`tgl_dist.ctdg.build_optimizer`); see ``docs/embeddings.md``.
    """
    dim: int = _f(0, _nonneg_int, "embedding size D (0 = no embedding)")
    lr: Optional[float] = _f(None, _opt_pos_num, "sparse optimizer learning rate (null: train.lr)")
    optimizer: str = _f("adam", _choice("adam", "adagrad"), "sparse optimizer of the table")

    @property
    def enabled(self) -> bool:
        return self.dim > 0


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The whole config; ``name`` is the file stem (``TGN``)."""
    sampling: SamplingConfig
    memory: MemoryConfig
    gnn: GNNConfig
    train: TrainConfig
    node_embedding: NodeEmbeddingConfig = field(default_factory=NodeEmbeddingConfig)
    name: str = "model"

    @property
    def has_memory(self) -> bool:
        return self.memory.type == "node"

    def replace(self, **sections: Mapping[str, Any]) -> "ModelConfig":
        """A copy with fields overridden, e.g. ``cfg.replace(train={'lr': 1e-3})``; checked
        as a config file is (each field, then the fields together)."""
        kw = {}
        for name, over in sections.items():
            if name not in _SECTIONS:
                raise ConfigError(name, f"unknown section; known: {list(_SECTIONS)}")
            cur = dataclasses.asdict(getattr(self, name))
            cur.update(over)
            kw[name] = _section(_SECTIONS[name], cur, name, None)
        _check_combination({n: kw.get(n, getattr(self, n)) for n in _SECTIONS}, None)
        return dataclasses.replace(self, **kw)


_SECTIONS = {"sampling": SamplingConfig, "memory": MemoryConfig, "gnn": GNNConfig,
             "train": TrainConfig, "node_embedding": NodeEmbeddingConfig}
_REQUIRED = ("sampling", "memory", "gnn", "train")


def _section(cls, raw: Any, name: str, source: Optional[str]):
    if isinstance(raw, list):
        if len(raw) != 1:
            raise ConfigError(name, f"expected one mapping (TGL writes a one-element list), "
                                    f"got a list of {len(raw)}", source)
        raw = raw[0]
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(name, f"expected a mapping, got {type(raw).__name__}", source)
    known = {f.name: f for f in fields(cls)}
    kw = {}
    for key, val in raw.items():
        if key not in known:
            raise ConfigError(f"{name}.{key}", f"unknown field; known: {sorted(known)}", source)
        f = known[key]
        if isinstance(val, str) and f.type in _NUMERIC_TYPES and _NUMBER.fullmatch(val.strip()):
            val = float(val)      # lr: 1e-4 (TGL and DyGLib configs write it so)
        if isinstance(val, float) and f.type in ("int", "Optional[int]") and val.is_integer():
            val = int(val)
        if isinstance(val, int) and not isinstance(val, bool) and f.type == "float":
            val = float(val)
        err = f.metadata["check"](val)
        if err:
            raise ConfigError(f"{name}.{key}", err, source)
        kw[key] = tuple(val) if isinstance(val, list) else val
    return cls(**kw)


def parse_config(raw: Mapping[str, Any], name: str = "model",
                 source: Optional[str] = None) -> ModelConfig:
    """Validate a TGL-style config mapping (what ``yaml.safe_load`` returns)."""
    if not isinstance(raw, Mapping):
        raise ConfigError("<root>", f"expected a mapping with sections {list(_SECTIONS)}, "
                                    f"got {type(raw).__name__}", source)
    for key in raw:
        if key not in _SECTIONS:
            raise ConfigError(str(key), f"unknown section; known: {list(_SECTIONS)}", source)
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise ConfigError("<root>", f"missing section{'s' * (len(missing) > 1)} "
                                    f"{', '.join(missing)}: a config needs {', '.join(_REQUIRED)} "
                                    f"(node_embedding is optional)", source)
    train = raw.get("train")
    train = train[0] if isinstance(train, list) and len(train) == 1 else train
    if isinstance(train, Mapping) and "batch_size" in train and "local_batch_size" in train:
        raise ConfigError("train.local_batch_size", f"give batch_size (events per step over all "
                                                    f"ranks) or local_batch_size (per rank), not "
                                                    f"both (got {train['batch_size']!r} and "
                                                    f"{train['local_batch_size']!r})", source)
    secs = {k: _section(cls, raw.get(k), k, source) for k, cls in _SECTIONS.items()}
    _check_combination(secs, source)
    return ModelConfig(name=name, **secs)


def _check_combination(secs: Mapping[str, Any], source: Optional[str]) -> None:
    """The checks that involve more than one field (``parse_config`` and
    ``ModelConfig.replace``): ``ConfigError`` naming the field."""
    mem, gnn, smp = secs["memory"], secs["gnn"], secs["sampling"]
    if smp.prop_time:
        raise ConfigError("sampling.prop_time", "True (deeper hops query at the root time) is "
                                                "not implemented: every hop queries at its "
                                                "own edge's time", source)
    if smp.history != 1:
        raise ConfigError("sampling.history", f"snapshot history is not implemented for "
                                              f"event streams: expected 1, got {smp.history}",
                          source)
    if smp.duration != 0:
        raise ConfigError("sampling.duration", f"a time window on the neighbours (TGL's "
                                               f"window_duration) is not implemented: expected "
                                               f"0 (all of the past), got {smp.duration}", source)
    if not smp.no_sample and len(smp.neighbor) != smp.layer:
        raise ConfigError("sampling.neighbor", f"expected {smp.layer} fan-outs (one per "
                                               f"layer), got {list(smp.neighbor)}", source)
    if mem.type == "node":
        if mem.dim_out <= 0:
            raise ConfigError("memory.dim_out", "a node memory needs dim_out > 0", source)
        if mem.memory_update in ("gru", "rnn") and mem.mailbox_size != 1:
            raise ConfigError("memory.mailbox_size", f"the {mem.memory_update} updater reads one "
                                                     f"mail: expected 1, got {mem.mailbox_size}",
                              source)
        if mem.memory_update == "transformer" and mem.dim_out % mem.attention_head:
            raise ConfigError("memory.attention_head", f"dim_out {mem.dim_out} is not divisible "
                                                       f"by attention_head {mem.attention_head}",
                              source)
        if mem.time_delta == "mail" and mem.memory_update not in ("gru", "rnn"):
            raise ConfigError("memory.time_delta", f"'mail' needs the gru or rnn updater, got "
                                                   f"{mem.memory_update!r}", source)
    elif gnn.arch == "identity":
        raise ConfigError("gnn.arch", "'identity' needs a node memory (memory.type: node)", source)
    if gnn.arch == "transformer_attention":
        if smp.no_sample:
            raise ConfigError("sampling.no_sample", "attention layers need sampled neighbours",
                              source)
        if gnn.layer != smp.layer:
            raise ConfigError("gnn.layer", f"must equal sampling.layer ({smp.layer}), got "
                                           f"{gnn.layer}", source)
        if gnn.dim_time <= 0:
            raise ConfigError("gnn.dim_time", "attention layers need dim_time > 0", source)
        dim_out = gnn.dim_out or mem.dim_out
        if dim_out <= 0:
            raise ConfigError("gnn.dim_out", "set gnn.dim_out (no memory to take it from)", source)
        if gnn.att_variant == "tgl" and dim_out % gnn.att_head:
            raise ConfigError("gnn.att_head", f"dim_out {dim_out} is not divisible by "
                                              f"att_head {gnn.att_head}", source)
    if gnn.output == "memory" and mem.type != "node":
        raise ConfigError("gnn.output", "'memory' needs memory.type: node", source)
    if gnn.output == "memory" and secs["node_embedding"].enabled:
        raise ConfigError("node_embedding", "gnn.output is 'memory' (DyRep): the scores read the "
                                            "updated memory, which no node input reaches with a "
                                            "gradient, so the table would never be trained: "
                                            "remove node_embedding", source)
    if mem.mail_dst_embedding and (gnn.arch != "transformer_attention"
                                   or (gnn.dim_out or mem.dim_out) != mem.dim_out):
        raise ConfigError("memory.mail_dst_embedding", "needs attention embeddings of size "
                                                       "memory.dim_out", source)
    tr = secs["train"]
    key, b = (("local_batch_size", tr.local_batch_size) if tr.local_batch_size is not None
              else ("batch_size", tr.batch_size))
    if tr.reorder and b % tr.reorder:
        raise ConfigError("train.reorder", f"must divide train.{key} {b}, got "
                                           f"{tr.reorder}", source)


def describe(cls) -> Dict[str, str]:
    """Field -> help text of a section class (for docs and ``--help``)."""
    return {f.name: f.metadata.get("help", "") for f in fields(cls)}


from tgl_dist.ctdg.config_file import load_config  # noqa: E402,F401  (re-exported: it reads files)
