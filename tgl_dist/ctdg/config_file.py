"""Reading a TGL-style YAML config file: a key repeated in one mapping is refused, TGL's ``# local`` batch comment is honoured.

:func:`load_config` parses the file and validates it with
:func:`tgl_dist.ctdg.config.parse_config`. TGL's distributed configs write the per-GPU
batch as ``batch_size: 4000 # local batch_size``: a ``batch_size`` line whose comment
says ``local`` is read as ``train.local_batch_size`` (events per step PER RANK) and
logged, so such a config trains as TGL means it.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Dict, Union

import yaml

from tgl_dist.ctdg.config import ConfigError, ModelConfig, parse_config

log = logging.getLogger(__name__)


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (plain YAML loading
    keeps the last one, so ``lr: 0.0001`` then ``lr: 0.1`` would train at 0.1 silently)."""

    def construct_mapping(self, node, deep=False):
        lines: Dict[Any, int] = {}
        for key_node, _ in node.value:   # the keys written here; merged ones (<<) may be overridden
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                first = lines.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:       # an unhashable key: the base class reports it
                break
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping (lines {first} and "
                    f"{key_node.start_mark.line + 1}); the second would silently replace the "
                    f"first", key_node.start_mark)
        return super().construct_mapping(node, deep)


def load_config(path: Union[str, Path]) -> ModelConfig:
    """Read and validate a YAML config; the model name is the file stem. A key given twice
    in one mapping is an error."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise ConfigError("<file>", "config file not found", str(path)) from None
    except IsADirectoryError:
        raise ConfigError("<file>", "is a folder, expected a YAML config file", str(path)) from None
    except OSError as e:
        raise ConfigError("<file>", f"cannot be read ({e.strerror or e})", str(path)) from None
    except UnicodeDecodeError as e:
        raise ConfigError("<file>", f"not a text file (byte {e.start} is not UTF-8); expected a "
                                    f"YAML config", str(path)) from None
    except yaml.YAMLError as e:
        raise ConfigError("<yaml>", f"not valid YAML ({e})", str(path)) from None
    line = _local_batch_line(path.read_text())
    if line and isinstance(raw, dict):
        train = raw.get("train")
        sec = train[0] if isinstance(train, list) and len(train) == 1 else train
        if isinstance(sec, dict) and "batch_size" in sec and "local_batch_size" not in sec:
            sec = dict(sec)
            sec["local_batch_size"] = sec.pop("batch_size")
            raw = {**raw, "train": [sec] if isinstance(train, list) else sec}
            log.info("%s line %d: 'batch_size: %s' is commented as local (TGL's dist configs): "
                     "read as train.local_batch_size, events per step PER RANK (a step covers "
                     "it x the number of ranks)", path, line, sec["local_batch_size"])
    return parse_config(raw, name=path.stem, source=str(path))


# TGL's dist configs: ``batch_size: 4000 # local batch_size`` (per GPU)
_LOCAL_COMMENT = re.compile(r"^[^#]*\bbatch_size\s*:[^#]*#.*\blocal\b", re.IGNORECASE)


def _local_batch_line(text: str) -> int:
    """The 1-based line of a ``batch_size`` key whose comment says ``local``, or 0."""
    for i, ln in enumerate(text.splitlines(), 1):
        if _LOCAL_COMMENT.search(ln):
            return i
    return 0
