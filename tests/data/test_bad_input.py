"""Bad input: one clear DataFormatError naming the file, the line (or row) and the field."""
import gzip
import json
import re

import numpy as np
import pytest
import torch

from tgl_dist.data import (DatasetNotFoundError, load_dataset, load_dyglib, load_jodie, load_konect,
                           load_pyg, load_snap, load_snap_signed)
from tgl_dist.data.loaders import require_keys
from tgl_dist.errors import DataFormatError, TGLDistError


def write(path, text, gz=False):
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def check(exc_info, path, line, field):
    e = exc_info.value
    assert e.path == str(path) and e.line == line and e.field == field, (e.path, e.line, e.field, str(e))
    assert str(path) in str(e)
    if line is not None:
        assert f"line {line}" in str(e)
    if field is not None:
        assert f"'{field}'" in str(e)


JODIE_HEAD = "user_id,item_id,timestamp,state_label\n"


def test_malformed_line_wrong_column_count(tmp_path):
    p = write(tmp_path / "w.csv", JODIE_HEAD + "0,0,1.0,0\n1,1,2.0\n2,2,3.0,0\n")
    with pytest.raises(DataFormatError, match="expected 4 fields") as ei:
        load_jodie(p)
    check(ei, p, 3, "state_label")


def test_malformed_line_extra_field_snap(tmp_path):
    p = write(tmp_path / "e.txt", "1 2 3\n4 5 6\n7 8 9 10\n")
    with pytest.raises(DataFormatError, match="found 4") as ei:
        load_snap(p)
    check(ei, p, 3, "column 4 (unexpected)")


def test_too_many_fields_on_the_first_row_names_the_first_extra(tmp_path):
    p = write(tmp_path / "e.txt", "# c\n1 2 3 4 5\n4 5 6 7 8\n")
    with pytest.raises(DataFormatError, match="expected 3 fields .*found 5") as ei:
        load_snap(p)
    check(ei, p, 2, "column 4 (unexpected)")


def test_empty_field_is_named(tmp_path):
    """An empty comma-separated field is an error naming that field, also when the line's
    field count still matches (an extra field after it used to shift the values)."""
    p = write(tmp_path / "out.x", "% h\n1,2,1,5\n1,,1,6\n")
    with pytest.raises(DataFormatError, match="field 2 is empty") as ei:
        load_konect(p, check_header=False)
    check(ei, p, 3, "dst")
    for text, line, field in (("1,,3\n", 1, "dst"),          # count off by one
                              ("0,1,10\n5,,6,7\n", 2, "dst"),  # count matches: 5, 6, 7 shifted
                              ("0,1,10\n5,6,7,\n", 2, "feature_0"),
                              (",1,2\n", 1, "src")):
        p = write(tmp_path / "e.txt", text)
        with pytest.raises(DataFormatError, match="is empty; expected a number") as ei:
            load_snap(p)
        check(ei, p, line, field)
    p = write(tmp_path / "j.csv", JODIE_HEAD.replace("\n", ",f0,f1\n")
              + "0,0,1,0,0.5,0.7\n1,1,2,,5,6,7\n")
    with pytest.raises(DataFormatError, match="field 4 is empty") as ei:
        load_jodie(p)
    check(ei, p, 3, "state_label")
    # a comment or header line may hold empty fields (DyGLib's header starts with a comma)
    p = write(tmp_path / "c.txt", "# a,,b\n1,2,3\n")
    assert load_snap(p).num_events == 1


def test_non_numeric_id(tmp_path):
    p = write(tmp_path / "e.txt.gz", "# c\n1 2 3\n4 alice 6\n", gz=True)
    with pytest.raises(DataFormatError, match="'alice' is not a number") as ei:
        load_snap(p)
    check(ei, p, 3, "dst")


def test_non_integer_and_negative_ids(tmp_path):
    p = write(tmp_path / "s.csv", "1,2,1,10\n1.5,2,1,11\n")
    with pytest.raises(DataFormatError, match="non-negative integer") as ei:
        load_snap_signed(p)
    check(ei, p, 2, "SOURCE")
    p = write(tmp_path / "n.txt", "1 2 3\n-4 5 6\n")
    with pytest.raises(DataFormatError, match="non-negative integer") as ei:
        load_snap(p)
    check(ei, p, 2, "src")


@pytest.mark.parametrize("bad,what", [("nan", "NaN"), ("-5", "negative"), ("inf", "infinite")])
def test_nan_or_negative_timestamp(tmp_path, bad, what):
    p = write(tmp_path / "w.csv", JODIE_HEAD + f"0,0,1.0,0\n1,1,{bad},0\n")
    with pytest.raises(DataFormatError, match=what) as ei:
        load_jodie(p)
    check(ei, p, 3, "timestamp")


def test_nan_or_infinite_weight_and_rating(tmp_path):
    p = write(tmp_path / "out.w", "% h\n1 2 1 5\n1 3 inf 6\n")
    with pytest.raises(DataFormatError, match="weight must be a finite number, got inf") as ei:
        load_konect(p, check_header=False)
    check(ei, p, 3, "weight")
    p = write(tmp_path / "s.csv", "1,2,1,10\n1,3,-1,11\n2,3,nan,12\n")
    with pytest.raises(DataFormatError, match="rating must be a finite number, got nan") as ei:
        load_snap_signed(p)
    check(ei, p, 3, "RATING")


def test_nan_timestamp_konect_time_column(tmp_path):
    p = write(tmp_path / "out.t", "% x\n1 2 1 5\n2 3 1 NaN\n")
    with pytest.raises(DataFormatError, match="NaN") as ei:
        load_konect(p)
    check(ei, p, 3, "time")


def dyglib_files(tmp_path, edge_rows=4, node_rows=4):
    write(tmp_path / "ml_d.csv", ",u,i,ts,label,idx\n0,1,2,1,0,1\n1,2,3,2,0,2\n2,3,1,3,0,3\n")
    np.save(tmp_path / "ml_d.npy", np.zeros((edge_rows, 2)))
    np.save(tmp_path / "ml_d_node.npy", np.zeros((node_rows, 2)))
    return tmp_path / "ml_d.csv"


def test_edge_feature_rows_do_not_match_edges(tmp_path):
    csv = dyglib_files(tmp_path, edge_rows=3)
    with pytest.raises(DataFormatError, match="has 3 rows, expected 4") as ei:
        load_dyglib(csv)
    check(ei, tmp_path / "ml_d.npy", None, "rows")


def test_node_feature_rows_too_few_for_ids(tmp_path):
    csv = dyglib_files(tmp_path, node_rows=3)
    with pytest.raises(DataFormatError, match="outside 1..2") as ei:
        load_dyglib(csv)
    check(ei, csv, 3, "i")                 # line 3 holds node id 3


def test_dyglib_header_lacks_column(tmp_path):
    p = write(tmp_path / "ml_h.csv", ",u,i,time,label,idx\n0,1,2,1,0,1\n")
    with pytest.raises(DataFormatError, match="lacks column 'ts'") as ei:
        load_dyglib(p)
    check(ei, p, 1, "ts")


def test_json_missing_key(tmp_path):
    p = tmp_path / "snap.json"
    obj = {"edges": [[0, 1]], "node_ids": {"a": 0}}
    p.write_text(json.dumps(obj))
    with pytest.raises(DataFormatError, match="missing required key") as ei:
        require_keys(json.loads(p.read_text()), ["edges", "node_ids", "FX"], p)
    check(ei, p, None, "FX")
    require_keys(obj, ["edges", "node_ids"], p)                  # present keys: no error
    with pytest.raises(DataFormatError, match="in snapshot 3"):
        require_keys({"index": 3}, ["X"], p, where="snapshot 3")
    with pytest.raises(DataFormatError, match="expected a JSON object"):
        require_keys([1, 2], ["X"], p)


def test_pyg_dict_file_missing_key(tmp_path):
    p = tmp_path / "d.pt"
    torch.save({"src": torch.tensor([0]), "dst": torch.tensor([1])}, p)
    with pytest.raises(DataFormatError) as ei:
        load_pyg(p)
    check(ei, p, None, "t")


def test_pyg_not_a_temporaldata(tmp_path):
    p = tmp_path / "x.pt"
    p.write_bytes(b"not a torch file")
    with pytest.raises(DataFormatError, match="cannot read it") as ei:
        load_pyg(p)
    # a corrupt file is called so; trusted=True (which would not help) is not suggested
    assert "corrupt or truncated" in str(ei.value) and "trusted" not in str(ei.value)
    torch.save({"src": torch.tensor([0]), "dst": torch.tensor([1]), "t": torch.tensor([1.0])}, p)
    p.write_bytes(p.read_bytes()[:60])                   # truncated
    with pytest.raises(DataFormatError, match="corrupt or truncated"):
        load_pyg(p)
    import argparse
    torch.save({"src": torch.tensor([0]), "dst": torch.tensor([1]), "t": torch.tensor([1.0]),
                "extra": argparse.Namespace(a=1)}, p)     # a class safe loading refuses
    with pytest.raises(DataFormatError, match="trusted=True"):
        load_pyg(p)


def test_konect_without_time_column_and_truncated_file(tmp_path):
    p = write(tmp_path / "out.static", "% sym\n1 2\n2 3\n")
    with pytest.raises(DataFormatError, match="not a temporal network") as ei:
        load_konect(p)
    check(ei, p, 2, "time")
    p = write(tmp_path / "out.cut", "% sym\n% 5 3 3\n1 2 1 1\n2 3 1 2\n")
    with pytest.raises(DataFormatError, match="header says 5 edges but the file has 2"):
        load_konect(p)
    assert load_konect(p, check_header=False).num_events == 2


def test_no_rows_and_bad_gzip(tmp_path):
    p = write(tmp_path / "e.txt", "# only comments\n\n")
    with pytest.raises(DataFormatError, match="no data rows"):
        load_snap(p)
    p = tmp_path / "e.txt.gz"
    p.write_bytes(gzip.compress(b"1 2 3\n" * 100)[:30])
    with pytest.raises(DataFormatError, match="gzip"):
        load_snap(p)


def test_error_is_one_line_not_a_numpy_trace(tmp_path):
    p = write(tmp_path / "e.txt", "1 2 3\n" * 1000 + "1 2 x3\n")
    with pytest.raises(DataFormatError) as ei:
        load_snap(p)
    assert str(ei.value) == f"{p}, line 1001, field 'time': 'x3' is not a number"
    assert ei.value.__cause__ is None and ei.value.__suppress_context__


def test_unknown_format_and_uninferable_file(tmp_path):
    p = write(tmp_path / "five.txt", "1 2 3 4 5\n")
    with pytest.raises(DataFormatError, match="cannot infer the format"):
        load_dataset(p)
    with pytest.raises(ValueError, match="known formats"):
        load_dataset(p, format="parquet")


def test_missing_dataset_says_what_to_put_where(tmp_path):
    with pytest.raises(DatasetNotFoundError) as ei:
        load_dataset("bitcoin-alpha", root=tmp_path, download=False)
    msg = str(ei.value)
    assert "soc-sign-bitcoinalpha.csv.gz" in msg and str(tmp_path / "bitcoin_alpha") in msg
    assert "https://snap.stanford.edu/data/soc-sign-bitcoinalpha.csv.gz" in msg
    assert isinstance(ei.value, FileNotFoundError) and isinstance(ei.value, TGLDistError)
    assert not any(tmp_path.iterdir())                          # nothing written
    with pytest.raises(DatasetNotFoundError, match="ml_uci.npy, ml_uci_node.npy"):
        load_dataset("uci", root=tmp_path, download=False)
    with pytest.raises(DatasetNotFoundError, match="out.facebook-wosn-wall"):
        load_dataset("facebook_wall", root=tmp_path, download=False)
    with pytest.raises(DatasetNotFoundError, match="no such file"):
        load_dataset(tmp_path / "nope.csv")
    with pytest.raises(ValueError, match="known names: .*wikipedia"):
        load_dataset("no-such-dataset", root=tmp_path, download=False)


def test_id_beyond_int64_and_glued_fields(tmp_path):
    p = write(tmp_path / "big.txt", "1 2 3\n99999999999999999999 2 4\n")
    with pytest.raises(DataFormatError, match="too large") as ei:
        load_snap(p)
    check(ei, p, 2, "src")
    p = write(tmp_path / "glued.txt", "1 2 3\n1 2 3-4\n")
    with pytest.raises(DataFormatError, match="'3-4' is not a number") as ei:
        load_snap(p)
    check(ei, p, 2, "time")


def test_missing_file_for_direct_loaders_and_pyg_nan_time(tmp_path):
    from tgl_dist.data import from_pyg, infer_format
    for f in (load_snap, load_jodie, load_pyg, infer_format):
        with pytest.raises(DatasetNotFoundError, match="no such file"):
            f(tmp_path / "absent.txt")
    with pytest.raises(DataFormatError, match="finite") as ei:
        from_pyg({"src": torch.tensor([0, 1]), "dst": torch.tensor([1, 0]),
                  "t": torch.tensor([1.0, float("nan")])})
    assert ei.value.field == "t" and ei.value.line == 1


def test_jodie_header_without_a_column_names_it(tmp_path):
    p = write(tmp_path / "j.csv", "user_id,item_id,state_label\n0,1,0\n1,2,0\n")
    with pytest.raises(DataFormatError, match="no 'timestamp'") as ei:
        load_jodie(p)
    check(ei, p, 1, "timestamp")


def test_a_json_file_is_pointed_to_the_snapshot_loaders(tmp_path):
    from tgl_dist.data.loaders import infer_format
    p = write(tmp_path / "covid.json", '{"edges": [[0, 1]], "FX": [[1.0, 2.0]]}')
    with pytest.raises(DataFormatError, match="load_pgt_json"):
        infer_format(p)
    q = write(tmp_path / "odd.dat", "a b c d e f\n")
    with pytest.raises(DataFormatError, match=r"--format on the command line"):
        infer_format(q)


def test_four_comma_fields_are_not_guessed_as_snap_signed(tmp_path):
    """src,dst,time,weight is as common as SNAP's SOURCE,TARGET,RATING,TIME: guessing the
    latter read the weights as times and trained on one timestamp without an error."""
    from tgl_dist.data.loaders import infer_format
    p = write(tmp_path / "events.csv", "# src,dst,time,weight\n\n24,48,0,1.0\n1,2,3,1.0\n")
    with pytest.raises(DataFormatError, match="ambiguous.*--format snap-signed") as ei:
        infer_format(p)
    check(ei, p, 3, None)
    # what does decide it: SNAP's file name, its header, or three fields
    assert infer_format(write(tmp_path / "soc-sign-x.csv", "24,48,0,1\n")) == "snap-signed"
    assert infer_format(write(tmp_path / "h.csv", "SOURCE,TARGET,RATING,TIME\n1,2,1,10\n")) \
        == "snap-signed"
    assert infer_format(write(tmp_path / "three.csv", "24,48,0\n1,2,3\n")) == "snap"


def test_a_header_where_none_is_taken_is_named_as_one(tmp_path):
    p = write(tmp_path / "e.csv", "src,dst,time\n1,2,3\n2,3,4\n")
    with pytest.raises(DataFormatError, match=r"'src' is not a number \(a header line\?.*'#'") as ei:
        load_snap(p)
    check(ei, p, 1, "src")
    assert load_snap(write(tmp_path / "c.csv", "# src,dst,time\n1,2,3\n")).num_events == 1
    p = write(tmp_path / "t.csv", "1,2,3\n2,x,4\n")       # a typo in a data row: no hint
    with pytest.raises(DataFormatError, match=r"'x' is not a number$"):
        load_snap(p)


def test_auto_header_is_a_line_without_numbers_and_a_typo_is_reported(tmp_path):
    """A first row with one mistyped field is data (reported), not a header (dropped)."""
    p = write(tmp_path / "s.csv", "1,2,5,1O0\n2,3,4,101\n3,4,1,102\n")
    with pytest.raises(DataFormatError, match="'1O0' is not a number") as ei:
        load_snap_signed(p)
    check(ei, p, 1, "TIME")
    p = write(tmp_path / "j.csv", "0,0,1.O,0\n1,0,2,0\n2,1,3,0\n")
    with pytest.raises(DataFormatError, match="'1.O' is not a number") as ei:
        load_jodie(p)
    check(ei, p, 1, "timestamp")
    # snap-signed: the only header taken is SOURCE,TARGET,RATING,TIME (any case)
    assert load_snap_signed(write(tmp_path / "h.csv", "source,target,rating,time\n1,2,1,10\n")).num_events == 1
    p = write(tmp_path / "b.csv", "a,b,c,d\n1,2,1,10\n")
    with pytest.raises(DataFormatError, match="not a data row and not the header") as ei:
        load_snap_signed(p)
    check(ei, p, 1, None)


def test_utf8_bom_before_a_header_is_ignored(tmp_path):
    p = tmp_path / "j.csv"
    p.write_bytes(b"\xef\xbb\xbfitem_id,user_id,timestamp,state_label\n0,1,1.0,0\n")
    with pytest.raises(DataFormatError, match="header's first columns are .'item_id'") as ei:
        load_jodie(p)
    check(ei, p, 1, None)
    p.write_bytes(b"\xef\xbb\xbf" + JODIE_HEAD.encode() + b"0,1,1.0,0\n1,1,2.0,0\n")
    assert load_jodie(p).num_events == 2
    q = tmp_path / "e.txt"
    q.write_bytes(b"\xef\xbb\xbf1 2 3\n2 3 4\n")
    assert load_snap(q).num_events == 2


@pytest.mark.parametrize("tok", ["1_000", "\u0661\u0660\u0661", "0x10"])
def test_bad_field_is_found_for_what_python_float_would_take(tmp_path, tok):
    p = write(tmp_path / "e.txt", f"1 2 3\n2 3 {tok}\n")
    with pytest.raises(DataFormatError, match="is not a number") as ei:
        load_snap(p)
    check(ei, p, 2, "time")


def test_temporal_graph_sorted_checks_lengths_before_indexing():
    from tgl_dist.data import TemporalGraph
    with pytest.raises(ValueError, match="same length"):
        TemporalGraph.sorted([3], [2], [3.0, 1.0])
    with pytest.raises(ValueError, match=r"edge_attr has shape \[2, 4\], expected 3 rows"):
        TemporalGraph.sorted([0, 1, 2], [1, 2, 0], [1.0, 2.0, 3.0], edge_attr=torch.zeros(2, 4))
    with pytest.raises(ValueError, match="labels has shape .5., expected 3 rows"):
        TemporalGraph.sorted([0, 1, 2], [1, 2, 0], [1.0, 2.0, 3.0], labels=torch.zeros(5))


PYG_OK = {"src": [0, 1, 2], "dst": [1, 2, 0], "t": [1.0, 2.0, 3.0]}


@pytest.mark.parametrize("change,field,line,match", [
    ({"src": [3], "dst": [2]}, "t", None, r"like src \[1\], got shape \[3\]"),
    ({"dst": [1, 2]}, "dst", None, r"one entry per event like src \[3\], got shape \[2\]"),
    ({"msg": torch.zeros(2, 4)}, "msg", None, r"expected \[3, F\]"),
    ({"y": torch.zeros(5, dtype=torch.long)}, "y", None, r"expected \[3\] \(one row per event\)"),
    ({"src": [0.5, 1, 2]}, "src", 0, "non-negative integer, got 0.5"),
    ({"dst": [1, -2, 0]}, "dst", 1, "non-negative integer, got -2"),
    ({"t": [1.0, float("inf"), 3.0]}, "t", 1, "finite"),
    ({"msg": torch.tensor([[0.0], [1.0], [float("nan")]])}, "msg", 2, "must be finite"),
    ({"src": ["a", "b", "c"]}, "src", None, "expected a tensor of numbers"),
    ({"src": [0.0, 1e30, 2.0]}, "src", 1, "non-negative integer, got 1.0000"),   # beyond int64
    ({"dst": [1, 2, 10**12]}, "dst", 2, "node id 1000000000000: ids are kept as given"),
])
def test_pyg_file_shapes_and_values_are_checked(tmp_path, change, field, line, match):
    p = tmp_path / "d.pt"
    torch.save({k: torch.tensor(v) if isinstance(v, list) and not isinstance(v[0], str) else v
                for k, v in {**PYG_OK, **change}.items()}, p)
    with pytest.raises(DataFormatError, match=match) as ei:
        load_pyg(p)
    check(ei, p, line, field)


def test_pyg_file_of_lists_and_integral_float_ids_loads(tmp_path):
    p = tmp_path / "d.pt"
    torch.save({**PYG_OK, "src": [0.0, 1.0, 2.0]}, p)
    g = load_pyg(p)
    assert g.src.tolist() == [0, 1, 2] and g.num_nodes == 3


def test_pyg_file_without_events_is_rejected_like_a_text_file(tmp_path):
    p = tmp_path / "d.pt"
    torch.save({"src": torch.zeros(0, dtype=torch.long), "dst": torch.zeros(0, dtype=torch.long),
                "t": torch.zeros(0)}, p)
    with pytest.raises(DataFormatError, match="holds no events") as ei:
        load_pyg(p)
    check(ei, p, None, "src")


@pytest.mark.parametrize("label,line", [("nan", 3), ("0.7", 2), ("1e30", 2), ("-9.3e18", 3)])
def test_dyglib_label_must_be_an_integer_class(tmp_path, label, line):
    rows = ["0,1,2,1,0,1", "1,2,3,2,0,2", "2,3,1,3,0,3"]
    rows[line - 2] = rows[line - 2].replace(",0,", f",{label},", 1)
    p = write(tmp_path / "ml_l.csv", ",u,i,ts,label,idx\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataFormatError, match=f"label must be an integer below 2\\^63 in size, "
                                              + re.escape(f"got {float(label)!r}")) as ei:
        load_dyglib(p)
    check(ei, p, line, "label")


@pytest.mark.parametrize("which,array,match", [
    ("ml_d.npy", np.array([["a", "b"]] * 4), "got dtype <U1"),
    ("ml_d_node.npy", np.array([["a", "b"]] * 4), "got dtype <U1"),
    ("ml_d.npy", np.ones((4, 2), dtype=np.complex64), "got dtype complex64"),
])
def test_dyglib_feature_file_that_is_not_real_numbers(tmp_path, which, array, match):
    csv = dyglib_files(tmp_path)
    np.save(tmp_path / which, array)
    with pytest.raises(DataFormatError, match=match) as ei:
        load_dyglib(csv)
    check(ei, tmp_path / which, None, None)


@pytest.mark.parametrize("which,what", [("ml_d.npy", "edge"), ("ml_d_node.npy", "node")])
def test_dyglib_nan_or_infinite_features(tmp_path, which, what):
    csv = dyglib_files(tmp_path)
    a = np.zeros((4, 2))
    a[2, 1] = np.inf if what == "edge" else np.nan
    np.save(tmp_path / which, a)
    with pytest.raises(DataFormatError, match=f"{what} features must be finite numbers") as ei:
        load_dyglib(csv)
    check(ei, tmp_path / which, 2, "column 1")          # row 2 of the .npy


def test_jodie_nan_feature_names_line_and_column(tmp_path):
    p = write(tmp_path / "f.csv", JODIE_HEAD + "0,0,1.0,0,0.5,1.0\n1,1,2.0,0,0.5,nan\n")
    with pytest.raises(DataFormatError, match="edge features must be finite numbers, got nan") as ei:
        load_jodie(p)
    check(ei, p, 3, "feature_1")
