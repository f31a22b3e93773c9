"""Each format on tiny hand-written files: exact values, remapping, features, separators."""
import gzip
import math

import numpy as np
import pytest
import torch

from tgl_dist.data import (from_pyg, infer_format, load_dataset, load_dyglib, load_jodie, load_konect,
                           load_pyg, load_snap, load_snap_signed, to_pyg, TemporalGraph)


def write(path, text, gz=False):
    data = text.encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_jodie_with_features_shifts_items(tmp_path):
    p = write(tmp_path / "toy.csv",
              "user_id,item_id,timestamp,state_label,comma_separated_list_of_features\n"
              "0,0,0.0,0,0.5,1.5\n"
              "2,1,10.0,1,-1.0,2.0\n"
              "0,1,5.0,0,3.0,4.0\n")
    g = load_jodie(p)
    assert g.name == "toy" and infer_format(p) == "jodie"
    # users 0, 2 (user 1 never occurs), items shifted by max(user) + 1 = 3; remapped in order
    assert g.num_nodes == 4
    assert g.node_map.tolist() == [0, 2, 3, 4]
    # sorted by time: rows 0, 2, 1
    assert g.t.tolist() == [0.0, 5.0, 10.0]
    assert g.node_map[g.src].tolist() == [0, 0, 2]
    assert g.node_map[g.dst].tolist() == [3, 4, 4]
    assert g.labels.tolist() == [0, 0, 1]
    assert g.edge_attr.tolist() == [[0.5, 1.5], [3.0, 4.0], [-1.0, 2.0]]


def test_snap_mixed_separators_comments_gzip(tmp_path):
    p = write(tmp_path / "edges.txt.gz", "# a comment\n10 20 100\n20\t30\t50\n% other comment\n10,30,100\n\n",
              gz=True)
    g = load_snap(p)
    assert infer_format(p) == "snap" and g.name == "edges"
    assert g.node_map.tolist() == [10, 20, 30]
    assert g.t.tolist() == [50.0, 100.0, 100.0]              # stable: line 2 before line 5
    assert g.src.tolist() == [1, 0, 0] and g.dst.tolist() == [2, 1, 2]
    assert g.edge_attr is None and g.num_nodes == 3


def test_snap_signed_rating_feature_and_stable_sort(tmp_path):
    p = write(tmp_path / "soc-sign-toy.csv.gz", "7,8,-10,300\n8,7,5,100\n7,9,1,100\n", gz=True)
    g = load_snap_signed(p)
    assert infer_format(p) == "snap-signed"
    assert g.t.tolist() == [100.0, 100.0, 300.0]
    assert g.edge_attr[:, 0].tolist() == [5.0, 1.0, -10.0]
    assert g.node_map[g.src].tolist() == [8, 7, 7]


def test_konect_weights_kept_only_when_not_all_ones(tmp_path):
    ones = write(tmp_path / "out.ones", "% sym unweighted\n% 3 3 3\n1 2 1 30\n2 3 1 10\n3 1 1 20\n")
    g = load_konect(ones)
    assert infer_format(ones) == "konect" and g.name == "ones"
    assert g.edge_attr is None and g.t.tolist() == [10.0, 20.0, 30.0]
    w = write(tmp_path / "out.weighted", "% directed weighted\n1\t2\t2.5\t30\n2\t3\t1\t10\n")
    g = load_konect(w)
    assert g.edge_attr[:, 0].tolist() == [1.0, 2.5]


def test_dyglib_features_follow_remap(tmp_path):
    write(tmp_path / "ml_toy.csv", ",u,i,ts,label,idx\n0,1,3,5.0,0,1\n1,2,3,1.0,1,2\n2,3,1,9.0,0,3\n")
    ef = np.arange(4 * 2, dtype=np.float64).reshape(4, 2)        # row 0 padding
    nf = np.arange(4 * 3, dtype=np.float64).reshape(4, 3) * 10   # nodes 1..3, row 0 padding
    np.save(tmp_path / "ml_toy.npy", ef)
    np.save(tmp_path / "ml_toy_node.npy", nf)
    g = load_dyglib(tmp_path / "ml_toy.csv")
    assert g.name == "toy" and g.num_nodes == 3
    assert g.t.tolist() == [1.0, 5.0, 9.0]
    assert g.src.tolist() == [1, 0, 2] and g.dst.tolist() == [2, 2, 0]
    assert g.edge_attr.tolist() == [ef[2].tolist(), ef[1].tolist(), ef[3].tolist()]
    assert torch.equal(g.node_feat, torch.from_numpy(nf[1:]).float())
    assert g.labels.tolist() == [1, 0, 0]


def test_dyglib_without_npy_files_remaps_ids(tmp_path, caplog):
    write(tmp_path / "ml_bare.csv", ",u,i,ts,label,idx\n0,5,9,1,0,1\n1,9,7,2,0,2\n")
    with caplog.at_level("WARNING", logger="tgl_dist.data.loaders.dyglib"):
        g = load_dyglib(tmp_path / "ml_bare.csv")
    assert g.node_map.tolist() == [5, 7, 9] and g.edge_attr is None and g.node_feat is None
    assert "no ml_bare.npy and no ml_bare_node.npy" in caplog.text  # a lost file is not silent
    caplog.clear()
    np.save(tmp_path / "ml_bare.npy", np.zeros((3, 2)))
    with caplog.at_level("WARNING", logger="tgl_dist.data.loaders.dyglib"):
        assert load_dyglib(tmp_path / "ml_bare.csv").edge_attr.shape == (2, 2)
    assert "no ml_bare_node.npy beside it, so the graph has no node features" in caplog.text


def test_pyg_round_trip_both_ways(tmp_path):
    from torch_geometric.data import TemporalData
    d = TemporalData(src=torch.tensor([0, 3, 1, 2]), dst=torch.tensor([1, 0, 2, 3]),
                     t=torch.tensor([1, 2, 2, 7]), msg=torch.randn(4, 3), y=torch.tensor([0, 1, 0, 1]))
    g = from_pyg(d, name="toy")
    assert g.num_nodes == 4 and g.node_map.tolist() == [0, 1, 2, 3]
    back = to_pyg(g)
    for k in ("src", "dst", "t", "msg", "y"):
        assert torch.equal(back[k], d[k]), k
    assert back.t.dtype == torch.long
    # TemporalGraph -> PyG -> TemporalGraph keeps everything, also for unsorted PyG input
    g2 = from_pyg(to_pyg(g))
    assert torch.equal(g2.src, g.src) and torch.equal(g2.t, g.t) and torch.equal(g2.edge_attr, g.edge_attr)
    unsorted = TemporalData(src=torch.tensor([0, 1]), dst=torch.tensor([1, 0]), t=torch.tensor([5, 3]),
                            msg=torch.tensor([[1.0], [2.0]]))
    assert from_pyg(unsorted).edge_attr[:, 0].tolist() == [2.0, 1.0]
    # files: a saved TemporalData and a saved dict, read without unpickling arbitrary code
    torch.save(d, tmp_path / "toy.pt")
    torch.save({"src": d.src, "dst": d.dst, "t": d.t}, tmp_path / "dict.pt")
    f = load_dataset(tmp_path / "toy.pt")
    assert f.name == "toy" and torch.equal(f.edge_attr, g.edge_attr)
    assert load_pyg(tmp_path / "dict.pt").num_events == 4


def test_to_pyg_float_times_and_subgraph():
    g = TemporalGraph(torch.tensor([0, 1]), torch.tensor([1, 2]), torch.tensor([0.5, 1.25]),
                      edge_attr=torch.tensor([[1.0], [2.0]]))
    d = to_pyg(g)
    assert d.t.dtype == torch.float64 and d.t.tolist() == [0.5, 1.25]
    sub = g.subgraph_events(torch.tensor([False, True]))
    assert to_pyg(sub).msg.tolist() == [[2.0]]                  # msg follows eid


def test_synthetic_by_name_is_a_format_free_dataset():
    g = load_dataset("synthetic", num_nodes=50, num_events=300, seed=3)
    assert (g.num_nodes, g.num_events) == (50, 300)
    with pytest.raises(ValueError, match="synthetic"):
        load_dataset("synthetic", format="snap")


def test_chunked_reading_matches_and_keeps_line_numbers(tmp_path, monkeypatch):
    """Files are parsed in chunks of lines; tiny chunks must give the same graph and lines."""
    from tgl_dist.data.loaders import _common
    rng = np.random.default_rng(0)
    rows = []
    for k in range(300):
        if k % 37 == 5:
            rows.append("# comment in the middle")
        if k % 53 == 7:
            rows.append("")
        rows.append(f"{rng.integers(0, 50)},{rng.integers(0, 50)}\t{rng.integers(0, 10**6)}")
    p = write(tmp_path / "chunks.txt", "\n".join(rows) + "\n")
    whole = load_snap(p)
    monkeypatch.setattr(_common, "_CHUNK", 64)
    tab = _common.read_table(p, names=("src", "dst", "time"), min_cols=3, header=False)
    assert tab.num_rows == 300
    text_lines = p.read_text().split("\n")
    assert all(text_lines[ln - 1][0].isdigit() for ln in tab.lines.tolist())
    chunked = load_snap(p)
    assert torch.equal(whole.src, chunked.src) and torch.equal(whole.t, chunked.t)
    bad_line = len(text_lines) - 10
    text_lines[bad_line - 1] = "1 2 x"
    p.write_text("\n".join(text_lines))
    from tgl_dist.errors import DataFormatError
    with pytest.raises(DataFormatError, match=f"line {bad_line}, field 'time'"):
        load_snap(p)
    text_lines[bad_line - 1] = "1 2"
    p.write_text("\n".join(text_lines))
    with pytest.raises(DataFormatError, match=f"line {bad_line}, field 'time'"):
        load_snap(p)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_temporal_graph_refuses_non_finite_times(bad):
    """A NaN time used to give empty split masks and, on the torch sampling path, other
    nodes' events; an infinite one an unusable split. Both constructors refuse them."""
    src, dst = torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])
    with pytest.raises(ValueError, match="must be finite numbers: event 2 has t = "):
        TemporalGraph(src, dst, torch.tensor([1.0, 2.0, bad]))
    with pytest.raises(ValueError, match="must be finite numbers: event 0 has t = "):
        TemporalGraph.sorted(src, dst, torch.tensor([bad, 2.0, 1.0]))
