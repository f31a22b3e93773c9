"""Config files: every bad input is a ConfigError naming the file and the field."""
from pathlib import Path

import pytest
import yaml

from tgl_dist.ctdg import ConfigError, load_config, parse_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TGN = (CONFIGS / "TGN.yml").read_text()


def _write(tmp_path, text, name="cfg.yml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    assert load_config(path).name == path.stem


@pytest.mark.parametrize("old, new, field", [
    ("lr: 0.0001", "lr: .nan", "train.lr"),
    ("lr: 0.0001", "lr: .inf", "train.lr"),
    ("duration: 0", "duration: .nan", "sampling.duration"),
    ("duration: 0", "duration: .inf", "sampling.duration"),
])
def test_non_finite_numbers_are_refused(tmp_path, old, new, field):
    assert old in TGN
    path = _write(tmp_path, TGN.replace(old, new))
    with pytest.raises(ConfigError, match="expected a (positive|non-negative) finite number") as e:
        load_config(path)
    assert e.value.field_path == field and str(e.value).startswith(str(path))
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(CONFIGS / "TGN.yml").replace(train={"lr": float("nan")})


@pytest.mark.parametrize("drop", [["memory"], ["train"], ["sampling"], ["gnn"], ["memory", "train"]])
def test_a_missing_section_is_an_error_not_the_defaults(tmp_path, drop):
    raw = yaml.safe_load(TGN)
    for k in drop:
        del raw[k]
    path = _write(tmp_path, yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: <root>: missing section") and ", ".join(drop) in msg
    assert "node_embedding is optional" in msg


def test_node_embedding_section_is_optional_and_empty_sections_take_defaults():
    raw = yaml.safe_load(TGN)
    assert "node_embedding" not in raw and not parse_config(raw).node_embedding.enabled
    cfg = parse_config({"sampling": None, "memory": {}, "gnn": {"dim_out": 8}, "train": [{}]})
    assert cfg.train.epoch == 100 and not cfg.has_memory
    raw["node_embedding"] = {"dim": 8, "lr": "1e-3"}           # Optional[float] too
    assert parse_config(raw).node_embedding.lr == 1e-3


@pytest.mark.parametrize("old, new, field, value", [
    ("lr: 0.0001", "lr: 1e-4", "lr", 1e-4), ("lr: 0.0001", "lr: 1.0e4", "lr", 1e4),
    ("lr: 0.0001", "lr: '2E-3'", "lr", 2e-3), ("epoch: 100", "epoch: 1e2", "epoch", 100),
    ("dropout: 0.2", "dropout: 5e-1", "dropout", 0.5),
])
def test_numbers_pyyaml_reads_as_strings_are_numbers(tmp_path, old, new, field, value):
    path = _write(tmp_path, TGN.replace(old, new))
    got = getattr(load_config(path).train, field)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("old, new, field", [
    ("lr: 0.0001", "lr: 1e-4x", "train.lr"), ("lr: 0.0001", "lr: nan", "train.lr"),
    ("lr: 0.0001", "lr: 1_0e-4", "train.lr"), ("epoch: 100", "epoch: 1.5e0", "train.epoch"),
])
def test_other_strings_in_numeric_fields_are_still_refused(tmp_path, old, new, field):
    path = _write(tmp_path, TGN.replace(old, new))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.field_path == field


def test_a_folder_or_binary_file_is_a_config_error(tmp_path):
    (tmp_path / "dir.yml").mkdir()
    with pytest.raises(ConfigError, match=r"dir.yml: <file>: is a folder"):
        load_config(tmp_path / "dir.yml")
    (tmp_path / "bin.yml").write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(ConfigError, match=r"bin.yml: <file>: not a text file"):
        load_config(tmp_path / "bin.yml")


APAN = (CONFIGS / "APAN.yml").read_text()


@pytest.mark.parametrize("text, old, new, field, match", [
    (TGN, "    lr: 0.0001\n", "    lr: 0.0001\n    lr: 0.1\n", "<yaml>",
     r"key 'lr' appears twice in one mapping \(lines \d+ and \d+\)"),
    (APAN, "attention_head: 2", "attention_head: 3", "memory.attention_head",
     "dim_out 100 is not divisible by attention_head 3"),
    (APAN, "layer: 1", "layer: 2", "sampling.neighbor", r"expected 2 fan-outs .* got \[10\]"),
    (TGN, "duration: 0", "duration: 10000", "sampling.duration", "not implemented"),
])
def test_what_a_config_file_cannot_mean_is_refused_when_read(tmp_path, text, old, new, field, match):
    """Each used to load: a repeated key silently kept its last value, the others failed
    later inside the model or sampler (a trace naming no file) or were silently ignored."""
    assert old in text
    path = _write(tmp_path, text.replace(old, new, 1))
    with pytest.raises(ConfigError, match=match) as e:
        load_config(path)
    assert e.value.field_path == field and str(e.value).startswith(str(path))


@pytest.mark.parametrize("over, field", [
    ({"sampling": {"prop_time": True}}, "sampling.prop_time"),
    ({"sampling": {"history": 3}}, "sampling.history"),
    ({"train": {"reorder": 7}}, "train.reorder"),
    ({"gnn": {"layer": 2}}, "gnn.layer"),
    ({"gnn": {"att_head": 3}}, "gnn.att_head"),
])
def test_replace_checks_the_fields_together_as_a_file_is(over, field):
    with pytest.raises(ConfigError) as e:
        load_config(CONFIGS / "TGN.yml").replace(**over)
    assert e.value.field_path == field
    ok = load_config(CONFIGS / "TGAT.yml").replace(sampling={"layer": 1, "neighbor": [10]},
                                                   gnn={"layer": 1})
    assert (ok.sampling.layer, ok.gnn.layer) == (1, 1)


def test_tgn_attention_heads_must_divide_its_query_when_built():
    """The 'tgn' attention's query width (node + time) depends on the data's features, so
    its check runs in build_model, as a ConfigError naming gnn.att_head."""
    from tgl_dist.ctdg import build_model
    cfg = load_config(CONFIGS / "TGN_DyGLib.yml")
    assert cfg.gnn.att_variant == "tgn"
    bad = cfg.replace(gnn={"att_head": 7})
    with pytest.raises(ConfigError, match=r"172 \(node\) \+ 100 \(time\) = 272 values over heads: not divisible by att_head 7") as e:
        build_model(bad, 0, 0)
    assert e.value.field_path == "gnn.att_head"


def test_a_node_embedding_that_could_never_train_is_refused(tmp_path):
    """DyRep scores its updated memory; a node_embedding table there got no gradient and
    kept its initial values, silently."""
    text = (CONFIGS / "DyRep.yml").read_text() + "node_embedding: {dim: 16, lr: 0.01}\n"
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match="would never be trained") as e:
        load_config(path)
    assert e.value.field_path == "node_embedding"


def test_yaml_merge_keys_still_load(tmp_path):
    """The repeated-key check looks at the keys written in a mapping, so YAML's merge key
    (<<: *anchor) works and a key may override a merged one."""
    from tgl_dist.ctdg.config_file import _UniqueKeyLoader
    text = "a: &base {lr: 0.1, epoch: 3}\nb:\n  <<: *base\n  lr: 0.2\n"
    assert yaml.load(text, Loader=_UniqueKeyLoader) == yaml.safe_load(text) == {
        "a": {"lr": 0.1, "epoch": 3}, "b": {"lr": 0.2, "epoch": 3}}
    with pytest.raises(yaml.YAMLError, match="appears twice"):
        yaml.load("b:\n  lr: 0.1\n  lr: 0.2\n", Loader=_UniqueKeyLoader)


def test_the_builder_passes_every_model_field_on():
    # every shipped config uses att_head 2 and the same dim_time in memory and gnn: other
    # values must reach the modules, not be replaced by a default or another section's
    from tgl_dist.ctdg import build_model
    from tgl_dist.nn import TemporalAttention, TGNAttention
    cfg = load_config(CONFIGS / "TGN.yml").replace(
        gnn={"att_head": 4, "dim_time": 12}, train={"dropout": 0.3, "att_dropout": 0.05})
    assert cfg.memory.dim_time != 12
    layer = build_model(cfg, 0, 0).gnn_layers[0]
    assert type(layer) is TemporalAttention and layer.num_head == 4
    assert layer.time_enc.dim == 12 and layer.dim_time == 12
    assert layer.dropout.p == 0.3 and layer.att_dropout.p == 0.05
    assert type(build_model(load_config(CONFIGS / "TGN_DyGLib.yml"), 0, 0).gnn_layers[0]) \
        is TGNAttention
    apan = load_config(CONFIGS / "APAN.yml").replace(train={"dropout": 0.3, "att_dropout": 0.05})
    up = build_model(apan, 0, 0).memory_updater
    assert (up.dropout.p, up.att_dropout.p) == (0.3, 0.05)
    assert up.num_head == apan.memory.attention_head and up.mailbox_size == apan.memory.mailbox_size


def test_dropout_of_one_is_refused():
    # p = 1 zeroes every activation: the model would silently learn nothing
    for field in ("dropout", "att_dropout"):
        with pytest.raises(ConfigError, match=r"train.%s.*\[0, 1\)" % field):
            load_config(CONFIGS / "TGN.yml").replace(train={field: 1.0})


# TGL's distributed configs (tgl/config/dist/*.yml) write the per-GPU batch this way
TGL_DIST_TRAIN = """train:
  - epoch: 100
    batch_size: 4000 # local batch_size
    lr: 0.0008
    dropout: 0.2
    att_dropout: 0.2
    all_on_gpu: True
"""


def test_tgl_dist_configs_local_batch_size_comment_is_read_per_rank(tmp_path, caplog):
    head = TGN.split("train:")[0]
    path = _write(tmp_path, head + TGL_DIST_TRAIN)
    with caplog.at_level("INFO", logger="tgl_dist.ctdg.config_file"):
        tr = load_config(path).train
    assert (tr.local_batch_size, tr.batch_size) == (4000, 600)   # batch_size: the default
    assert [tr.global_batch_size(w) for w in (1, 2, 8)] == [4000, 8000, 32000]
    assert "line" in caplog.text and "read as train.local_batch_size" in caplog.text
    # without the comment the same number is the global batch (TGL's single-GPU configs)
    tr = load_config(_write(tmp_path, head + TGL_DIST_TRAIN.replace(" # local batch_size", ""),
                            "plain.yml")).train
    assert (tr.local_batch_size, tr.global_batch_size(2)) == (None, 4000)
    # another comment on the line, or "local" on another line, changes nothing
    other = TGL_DIST_TRAIN.replace("# local batch_size", "# events").replace(
        "lr: 0.0008", "lr: 0.0008  # local minimum")
    assert load_config(_write(tmp_path, head + other, "other.yml")).train.local_batch_size is None


def test_local_batch_size_key_and_its_checks(tmp_path):
    head = TGN.split("train:")[0]
    cfg = parse_config(yaml.safe_load(head + "train: [{local_batch_size: 300, reorder: 3}]"))
    assert cfg.train.global_batch_size(4) == 1200
    with pytest.raises(ConfigError, match="train.local_batch_size: give batch_size .* not both"):
        parse_config(yaml.safe_load(head + "train: [{local_batch_size: 300, batch_size: 600}]"))
    with pytest.raises(ConfigError, match="train.local_batch_size: expected a positive integer"):
        parse_config(yaml.safe_load(head + "train: [{local_batch_size: 0}]"))
    with pytest.raises(ConfigError, match=r"train.reorder: must divide train.local_batch_size 300"):
        parse_config(yaml.safe_load(head + "train: [{local_batch_size: 300, reorder: 7}]"))
    # an override of the global batch clears the per-rank one (what --batch-size does)
    over = cfg.replace(train={"batch_size": 900, "local_batch_size": None})
    assert over.train.global_batch_size(4) == 900
