"""PGT JSON loaders on the four real files, bad input, and CTDG binning."""
import json

import pytest
import torch

from tgl_dist.data import TemporalGraph
from tgl_dist.dtdg import GraphData, Splitter, degree_features, from_temporal, load_pgt_json
from tgl_dist.errors import DataFormatError


def _path(root, name):
    return root / name / f"{name}.json"


def test_twitter_tennis_counts(datasets_root):
    g = load_pgt_json(_path(datasets_root, "twitter_tennis_rg17"))
    assert (g.num_nodes, g.num_snapshots, g.num_edges) == (1000, 120, 40839)
    assert g.node()["x"].shape == (1000, 120, 2) and g.node()["y"].shape == (1000, 120)
    assert g.edge()["weight"].shape == (40839,)
    raw = json.loads(_path(datasets_root, "twitter_tennis_rg17").read_text())
    s = g.get_snapshot(7)
    assert s.edge_index.t().tolist() == raw["7"]["edges"]
    assert torch.allclose(s.x, torch.tensor(raw["7"]["X"], dtype=torch.float32))


@pytest.mark.parametrize("name,periods,nodes,edges,lags", [
    ("england_covid", 61, 129, None, 8), ("chickenpox", 521, 20, 102, 4),
    ("pedalme_london", 35, 15, 225, 4)])
def test_signal_files(datasets_root, name, periods, nodes, edges, lags):
    g = load_pgt_json(_path(datasets_root, name), lags=lags, standardize=False)
    T = periods - lags
    assert g.meta()["periods"] == periods and g.num_nodes == nodes and g.num_snapshots == T
    assert g.node()["x"].shape == (nodes, T, lags) and g.node()["y"].shape == (nodes, T)
    raw = json.loads(_path(datasets_root, name).read_text())
    sig = torch.tensor(raw[g.meta()["signal_key"]], dtype=torch.float32)
    # features of snapshot s are the lags before the target, as PGT builds them
    assert torch.allclose(g.node()["x"][:, 3], sig[3:3 + lags].t())
    assert torch.allclose(g.node()["y"][:, 3], sig[3 + lags])
    if edges is not None:
        assert g.num_edges == edges * T
    else:
        per = raw["edge_mapping"]["edge_index"]
        assert sum(len(per[str(t)]) for t in range(periods)) == 82529      # README count
        assert g.num_edges == sum(len(per[str(t)]) for t in range(T))


def test_standardized_signal(datasets_root):
    g = load_pgt_json(_path(datasets_root, "england_covid"), lags=8)
    assert g.meta()["standardized"]
    assert abs(float(g.node()["y"].mean())) < 0.2


@pytest.mark.parametrize("name,lags,hist_len", [("england_covid", 8, 4), ("chickenpox", 4, 4)])
def test_standardization_sees_no_value_after_the_training_windows(datasets_root, tmp_path,
                                                                 name, lags, hist_len):
    """The z-score is fitted on the leading periods only: rewriting every period after
    the last training window's target leaves the training features and targets as they
    were (a z-score over the whole series would move them)."""
    g = load_pgt_json(_path(datasets_root, name), lags=lags)
    last = max(w["label_ts"] for w in Splitter(g.num_snapshots, hist_len, "node_regression").train)
    raw = json.loads(_path(datasets_root, name).read_text())
    key = next(k for k in ("y", "FX", "X") if k in raw)
    raw[key] = raw[key][:last + lags + 1] + [[v * 3.0 + 100.0 for v in row]
                                             for row in raw[key][last + lags + 1:]]
    (tmp_path / "future.json").write_text(json.dumps(raw))
    h = load_pgt_json(tmp_path / "future.json", lags=lags)
    for k in ("x", "y"):
        assert torch.equal(g.node()[k][:, :last + 1], h.node()[k][:, :last + 1]), k
        assert not torch.equal(g.node()[k], h.node()[k])
    assert g.meta()["standardized_on_periods"] <= last + lags + 1
    with pytest.raises(ValueError, match="fit_fraction"):
        load_pgt_json(_path(datasets_root, name), lags=lags, fit_fraction=0.0)


def test_unknown_name_lists_what_there_is(datasets_root, tmp_path):
    from tgl_dist.data import DatasetNotFoundError
    from tgl_dist.dtdg import load_dtdg
    with pytest.raises(DatasetNotFoundError, match=r"holds no twitter_tenis/twitter_tenis.json; "
                       r"snapshot \(PGT JSON\) datasets there: .*twitter_tennis_rg17.*wikipedia"):
        load_dtdg("twitter_tenis", datasets_root)
    with pytest.raises(DatasetNotFoundError, match=r"datasets folder .*nowhere does not exist"):
        load_dtdg("england_covid", tmp_path / "nowhere")


def test_bad_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"0": {"edges": [[0, 1]], ')
    with pytest.raises(DataFormatError, match="bad.json.*line 1"):
        load_pgt_json(p)
    p.write_text(json.dumps({"0": {"weights": [1.0]}}))
    with pytest.raises(DataFormatError, match="missing key 'edges' in snapshot '0'"):
        load_pgt_json(p)
    p.write_text(json.dumps({"edges": [[0, 1]], "weights": [1.0, 2.0], "FX": [[1, 2]] * 6}))
    with pytest.raises(DataFormatError, match="2 weights for 1 edges") as e:
        load_pgt_json(p)
    assert e.value.field == "weights"
    for edges in ([[0, 5]], [[-1, 1]]):
        p.write_text(json.dumps({"edges": edges, "FX": [[1, 2]] * 6}))
        with pytest.raises(DataFormatError, match=r"ids must lie in \[0, 2\)") as e:
            load_pgt_json(p)
        assert e.value.field == "edges"
    p.write_text(json.dumps({"edge_mapping": {"edge_index": {"0": [[0, 1]]}}, "y": [[1, 2]] * 6}))
    with pytest.raises(DataFormatError, match="no edges for period 1"):
        load_pgt_json(p)
    p.write_text(json.dumps({"foo": 1}))
    with pytest.raises(DataFormatError, match="unknown PyTorch Geometric Temporal layout"):
        load_pgt_json(p)
    # the snapshot layout's own fields: each refused by name, none silently dropped
    snap = {"edges": [[0, 1], [1, 2]], "X": [[0.0], [1.0], [2.0]], "y": [0.0, 1.0, 2.0]}
    for doc, field, match in (
            ({"0": snap, "1": {**snap, "y": [[0.0], [1.0], [2.0]]}}, "1.y",
             r"expected 3 targets \(one number per node\), got shape \[3, 1\]"),
            ({"0": snap, "1": snap, "3": snap}, "3", "'2' is missing but '3' is present"),
            ({"0": snap, "time_periods": "one"}, "time_periods", "expected an integer"),
            ({"0": snap, "time_periods": float("inf")}, "time_periods", "expected an integer"),
            ({"0": snap, "node_ids": 3}, "node_ids", "expected a list of node ids")):
        p.write_text(json.dumps(doc))
        with pytest.raises(DataFormatError, match=match) as e:
            load_pgt_json(p)
        assert e.value.field == field
    p.write_bytes(b'{"0": "\xe9"}')
    with pytest.raises(DataFormatError, match="byte 7 is not UTF-8"):
        load_pgt_json(p)


def test_from_temporal_span_and_count():
    day = 86400.0
    tg = TemporalGraph(torch.tensor([0, 1, 2, 0, 3]), torch.tensor([1, 2, 3, 3, 0]),
                       torch.tensor([0.0, 0.5 * day, 1.2 * day, 3.9 * day, 4.0 * day]), num_nodes=5)
    g = from_temporal(tg, span="day")
    assert g.edge()["time"].tolist() == [0, 0, 1, 3, 4] and g.num_snapshots == 5
    assert g.node()["x"].shape == (5, 5, 2)
    assert torch.allclose(g.node()["x"][1, 0], torch.tensor([1.0, 1.0]).log1p())   # in 1, out 1
    assert torch.equal(g.node()["x"], degree_features(g))
    g2 = from_temporal(tg, num_snapshots=2)
    assert g2.edge()["time"].tolist() == [0, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="exactly one"):
        from_temporal(tg)
    with pytest.raises(ValueError, match="span must be"):
        from_temporal(tg, span="fortnight")


def test_bitcoin_alpha_by_month(datasets_root):
    from tgl_dist.data import load_dataset
    tg = load_dataset("bitcoin-alpha", root=datasets_root, download=False)
    g = from_temporal(tg, span="month")
    assert g.num_snapshots == 63                       # 2010-11 .. 2016-01
    assert g.num_edges == tg.num_events == 24186
    assert int(torch.bincount(g.edge()["time"]).sum()) == 24186
    assert g.edge()["attr"].shape == (24186, 1)


def test_graph_data_validation():
    with pytest.raises(ValueError, match="outside"):
        GraphData(torch.tensor([[0, 5]]).t(), 3)
    g = GraphData(torch.tensor([[0, 1], [1, 2]]), 3)
    with pytest.raises(ValueError, match="time"):
        g.validate()
    g.edge()["time"] = torch.tensor([0, 1])
    g.node()["x"] = torch.zeros(3, 4, 1)
    g.validate()
    g.node()["y"] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"node\(\)\['y'\] has 2 rows"):
        g.validate()
    # no silent truncation: 1.9 is not node 1, and snapshot 0.5 is no snapshot
    with pytest.raises(ValueError, match="edge_index must hold integer node ids, got 1.9"):
        GraphData(torch.tensor([[0.0, 1.9], [1.0, 2.0]], dtype=torch.float64), 3)
    assert GraphData(torch.tensor([[0.0, 1.0], [1.0, 2.0]]), 3).edge_index.dtype == torch.long
    g.node()["y"] = torch.zeros(3, 4)
    g.edge()["time"] = torch.tensor([0.5, 1.5])
    with pytest.raises(ValueError, match="integer snapshot indices, got dtype torch.float32"):
        g.validate()


def test_nan_or_infinite_signal_and_fractional_edge_ids(tmp_path):
    p = tmp_path / "sig.json"
    fx = [[1.0, 2.0]] * 6
    p.write_text(json.dumps({"edges": [[0, 1]], "FX": fx[:3] + [[1.0, float("nan")]] + fx[4:]}))
    with pytest.raises(DataFormatError, match=r"sig.json, field 'FX': .*finite.*nan at FX\[3\]\[1\]"):
        load_pgt_json(p)
    p.write_text(json.dumps({"0": {"edges": [[0, 1]], "X": [[1.0], [float("inf")]]}}))
    with pytest.raises(DataFormatError, match=r"field '0.X': .*finite.*inf") as e:
        load_pgt_json(p)
    assert e.value.path == str(p)
    p.write_text(json.dumps({"edges": [[0, 1], [1, 1.5]], "FX": fx}))
    with pytest.raises(DataFormatError, match=r"field 'edges': node ids must be integers, got 1.5 at "
                       r"edges\[1\]\[1\]"):
        load_pgt_json(p)
    p.write_text(json.dumps({"edges": [[0, 1.0]], "FX": fx}))       # integral floats are ids
    assert load_pgt_json(p).edge_index[:, 0].tolist() == [0, 1]


def test_link_prediction_signal_features_end_at_their_snapshot(tmp_path):
    """past_signal_features: snapshot s holds periods s-L+1..s, so a window predicting the
    edges of period t (snapshots up to t-1) sees no signal of period t or later; the PGT
    layout's own x looks L-1 periods ahead (right for node regression only)."""
    from tgl_dist.dtdg import past_signal_features
    T_total, N, L = 12, 3, 4
    sig = [[float(100 * p + n) for n in range(N)] for p in range(T_total)]
    doc = {"edges": [[0, 1], [1, 2]], "FX": sig}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(doc))
    g = load_pgt_json(p, lags=L, standardize=False)
    f = past_signal_features(g)
    assert f.shape == (N, T_total - L, L)
    for s in range(T_total - L):
        want = [[0.0 if q < 0 else sig[q][n] for q in range(s - L + 1, s + 1)] for n in range(N)]
        assert f[:, s].tolist() == want
    # the PGT features of snapshot s do reach period s + L - 1
    assert g.node()["x"][0, 0].tolist() == [sig[q][0] for q in range(L)]
    with pytest.raises(ValueError, match="needs a node-signal graph"):
        past_signal_features(GraphData(torch.tensor([[0], [1]]), 2))
