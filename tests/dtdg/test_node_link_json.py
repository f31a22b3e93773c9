"""PyG Temporal's node-link layout with per-node series (Montevideo bus), on tiny files."""
import json

import pytest
import torch

from tgl_dist.dtdg import load_dtdg, load_pgt_json, past_signal_features
from tgl_dist.errors import DataFormatError

T_TOTAL, LAGS = 8, 3


def _series(n, k=0):
    return [float(100 * n + 10 * k + p) for p in range(T_TOTAL)]


def _doc(ids=("s7", "s3", "s9"), weights=True):
    nodes = [{"bus_stop": b, "X": {"y": _series(n), "load": _series(n, 5)}, "y": _series(n, 1)}
             for n, b in enumerate(ids)]
    links = [{"source": "s7", "target": "s3"}, {"source": "s3", "target": "s9"},
             {"source": "s9", "target": "s7"}]
    if weights:
        for w, ln in zip((0.5, 1.0, 2.5), links):
            ln["weight"] = w
    return {"directed": True, "multigraph": False, "graph": {}, "nodes": nodes, "links": links}


def _write(tmp_path, doc, name="montevideo_bus.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_exact_values_without_standardization(tmp_path):
    g = load_pgt_json(_write(tmp_path, _doc()), lags=LAGS, standardize=False)
    T = T_TOTAL - LAGS
    assert g.meta()["layout"] == "node_series" and g.meta()["node_ids"] == ["s7", "s3", "s9"]
    assert (g.num_nodes, g.num_snapshots, g.num_edges) == (3, T, 3 * T)
    assert g.get_snapshot(0).edge_index.tolist() == [[0, 1, 2], [1, 2, 0]]   # ids -> positions
    assert g.get_snapshot(T - 1).edge_weight.tolist() == [0.5, 1.0, 2.5]      # static graph
    x, y = g.node()["x"], g.node()["y"]
    assert x.shape == (3, T, LAGS) and y.shape == (3, T)
    for s in range(T):            # features: X['y'] at s .. s+L-1; target: node 'y' at s+L
        for n in range(3):
            assert x[n, s].tolist() == _series(n)[s:s + LAGS]
            assert y[n, s].item() == _series(n, 1)[s + LAGS]


def test_several_feature_vars_and_another_target(tmp_path):
    p = _write(tmp_path, _doc())
    g = load_pgt_json(p, lags=2, standardize=False, feature_vars=("y", "load"), target_var="y")
    assert g.node()["x"].shape == (3, T_TOTAL - 2, 4)
    assert g.node()["x"][1, 0].tolist() == _series(1)[:2] + _series(1, 5)[:2]   # variable-major
    # link-prediction inputs end at each snapshot's own period, per variable
    f = past_signal_features(g)
    assert f.shape == (3, T_TOTAL - 2, 4)
    assert f[1, 0].tolist() == [0.0, _series(1)[0], 0.0, _series(1, 5)[0]]
    assert f[1, 3].tolist() == _series(1)[2:4] + _series(1, 5)[2:4]


def test_standardization_uses_the_training_share_only(tmp_path):
    doc = _doc()
    g = load_pgt_json(_write(tmp_path, doc), lags=LAGS, fit_fraction=0.5)
    fit = g.meta()["standardized_on_periods"]
    assert fit == T_TOTAL // 2
    raw = torch.tensor(_series(0, 1), dtype=torch.float64)
    z = (raw - raw[:fit].mean()) / (raw[:fit].std(unbiased=False) + 1e-10)
    assert torch.allclose(g.node()["y"][0], z[LAGS:].float())
    for n in doc["nodes"]:                   # later periods changed: training inputs unchanged
        n["y"][-1] += 1000.0
        n["X"]["y"][-1] += 1000.0
    h = load_pgt_json(_write(tmp_path, doc, "later.json"), lags=LAGS, fit_fraction=0.5)
    assert torch.equal(g.node()["x"][:, :2], h.node()["x"][:, :2])


def test_positions_or_networkx_ids(tmp_path):
    doc = _doc(weights=False)
    for n in doc["nodes"]:
        n["id"] = n.pop("bus_stop")
    g = load_pgt_json(_write(tmp_path, doc), lags=LAGS)
    assert "weight" not in g.edge() and g.get_snapshot(0).edge_index.tolist() == [[0, 1, 2], [1, 2, 0]]
    for n in doc["nodes"]:
        del n["id"]
    doc["links"] = [{"source": 2, "target": 0}]
    assert load_pgt_json(_write(tmp_path, doc), lags=LAGS).edge_index[:, 0].tolist() == [2, 0]


@pytest.mark.parametrize("edit, field, match", [
    (lambda d: d["links"].__setitem__(1, {"source": "s3", "target": "nope"}), "links[1].target",
     "'nope' is not the id of a node"),
    (lambda d: d["nodes"][1].pop("X"), "X", r"missing key 'X' in nodes\[1\]"),
    (lambda d: d["nodes"][2]["X"].pop("y"), "y", r"missing key 'y' in nodes\[2\].X"),
    (lambda d: d["nodes"][2]["y"].pop(), "nodes[2].y", "same length"),
    (lambda d: d["nodes"][0]["y"].__setitem__(3, "many"), "nodes[*].y", "numbers"),
    (lambda d: d["links"][2].pop("weight"), "links[2].weight", "2 of 3 links have a weight"),
    (lambda d: d["nodes"][1].__setitem__("bus_stop", "s7"), "nodes[1].bus_stop", "distinct"),
    (lambda d: d.__setitem__("links", []), "links", "non-empty list"),
])
def test_bad_input_names_the_key(tmp_path, edit, field, match):
    doc = _doc()
    edit(doc)
    p = _write(tmp_path, doc)
    with pytest.raises(DataFormatError, match=match) as ei:
        load_pgt_json(p, lags=LAGS)
    assert ei.value.field == field and str(p) in str(ei.value)
    with pytest.raises(DataFormatError, match=r"\[read as pgt-json, guessed from the file name"):
        load_dtdg(p)


def test_registered_name_reads_the_folder(tmp_path):
    (tmp_path / "montevideo_bus").mkdir()
    _write(tmp_path / "montevideo_bus", _doc())
    g = load_dtdg("montevideo-bus", tmp_path, lags=LAGS)
    assert g.name == "montevideo_bus" and g.meta()["lags"] == LAGS


def test_an_unhashable_link_endpoint_is_a_format_error(tmp_path):
    doc = _doc()
    doc["links"][0]["source"] = ["s7"]
    with pytest.raises(DataFormatError, match="is not the id of a node") as ei:
        load_pgt_json(_write(tmp_path, doc), lags=LAGS)
    assert ei.value.field == "links[0].source"
