"""CSV event lists with a header of known column names (format ``csv``), and format errors
that name the guessed format."""
import gzip

import pytest
import torch

from tgl_dist.data import load_dataset
from tgl_dist.data.loaders import guess_format, infer_format, load_named_csv
from tgl_dist.errors import DataFormatError


def write(path, text, gz=False):
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


ROWS = [(10, 20, 5), (20, 30, 1), (10, 30, 5)]      # (src, dst, t): sorted by t -> rows 1, 0, 2


@pytest.mark.parametrize("header", [
    "src,dst,t", "u,i,ts", "source,target,time", "src,dst,time", "source,destination,timestamp",
    "SRC,DST,T", "Source,Target,Time", "from,to,timestamp", " src , dst , t "])
def test_each_header_variant_maps_columns_by_name(tmp_path, header):
    p = write(tmp_path / "events.csv", header + "\n" + "".join(f"{s},{d},{t}\n" for s, d, t in ROWS))
    assert infer_format(p) == "csv"
    g = load_dataset(p)
    assert g.name == "events" and g.num_nodes == 3 and g.node_map.tolist() == [10, 20, 30]
    assert g.t.tolist() == [1.0, 5.0, 5.0]                       # stable: row 0 before row 2
    assert g.node_map[g.src].tolist() == [20, 10, 10]
    assert g.node_map[g.dst].tolist() == [30, 20, 30]
    assert g.edge_attr is None


def test_columns_in_any_order_and_extra_numeric_columns_are_edge_features(tmp_path):
    p = write(tmp_path / "w.csv", "time,weight,target,source,rating\n"
                                  "5,1.5,20,10,-1\n1,2.0,30,20,3\n", gz=True)
    g = load_dataset(p)
    assert g.t.tolist() == [1.0, 5.0]
    assert g.node_map[g.src].tolist() == [20, 10] and g.node_map[g.dst].tolist() == [30, 20]
    assert g.edge_attr.tolist() == [[2.0, 3.0], [1.5, -1.0]]   # weight, rating in header order
    assert g.edge_attr.dtype == torch.float32
    # tabs and spaces work as separators too
    q = write(tmp_path / "w.tsv", "src\tdst\tt\tweight\n1\t2\t3\t0.5\n")
    assert load_dataset(q).edge_attr.tolist() == [[0.5]]


def test_dyglib_header_still_goes_to_dyglib_and_jodie_to_jodie(tmp_path):
    assert infer_format(write(tmp_path / "a.csv", ",u,i,ts,label,idx\n0,1,2,3,0,1\n")) == "dyglib"
    assert infer_format(write(tmp_path / "b.csv", "u,i,ts,label,idx\n1,2,3,0,1\n")) == "dyglib"
    assert infer_format(write(tmp_path / "c.csv", "u,i,ts,label\n1,2,3,0\n")) == "csv"
    assert infer_format(write(tmp_path / "d.csv", "user_id,item_id,timestamp,state_label\n"
                                                  "1,2,3,0\n")) == "jodie"
    assert infer_format(write(tmp_path / "e.csv", "SOURCE,TARGET,RATING,TIME\n1,2,1,3\n")) \
        == "snap-signed"


def test_bad_value_names_file_line_and_column(tmp_path):
    p = write(tmp_path / "e.csv", "source,target,time,weight\n1,2,3,1.0\n2,3,4,heavy\n")
    with pytest.raises(DataFormatError) as ei:
        load_named_csv(p)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(p), 3, "weight")
    assert str(e) == f"{p}, line 3, field 'weight': 'heavy' is not a number"
    p = write(tmp_path / "f.csv", "src,dst,t\n1,2,3\n1,-2,4\n")
    with pytest.raises(DataFormatError, match="non-negative integer") as ei:
        load_named_csv(p)
    assert (ei.value.line, ei.value.field) == (3, "dst")
    p = write(tmp_path / "g.csv", "Src,Dst,Ts\n1,2,3\n1,2,nan\n")
    with pytest.raises(DataFormatError, match="timestamp is NaN") as ei:
        load_named_csv(p)
    assert (ei.value.line, ei.value.field) == (3, "Ts")
    p = write(tmp_path / "h.csv", "src,dst,t,w\n1,2,3,1\n1,2,3\n")
    with pytest.raises(DataFormatError, match="expected 4 fields like line 2, found 3") as ei:
        load_named_csv(p)
    assert (ei.value.line, ei.value.field) == (3, "w")


def test_header_without_a_role_or_with_one_twice_names_the_header(tmp_path):
    p = write(tmp_path / "a.csv", "src,dst,weight\n1,2,3\n")
    with pytest.raises(DataFormatError, match=r"header 'src,dst,weight' has no t column; "
                                              r"expected one named t / ts / time / timestamp") as ei:
        load_named_csv(p)
    assert (ei.value.line, ei.value.field) == (1, "t")
    p = write(tmp_path / "b.csv", "src,source,dst,t\n1,2,3,4\n")
    with pytest.raises(DataFormatError, match="names the src column twice"):
        load_named_csv(p)
    p = write(tmp_path / "c.csv", "1,2,3\n")
    with pytest.raises(DataFormatError, match="expected a header line naming the columns"):
        load_named_csv(p)
    # a header of other names is not guessed as anything: the error names it and --format
    p = write(tmp_path / "d.csv", "alpha,beta,gamma\n1,2,3\n")
    with pytest.raises(DataFormatError, match=r"the header 'alpha,beta,gamma' names no known "
                                              r"layout.*--format on the command line") as ei:
        load_dataset(p)
    assert ei.value.line == 1


@pytest.mark.parametrize("name, text, fmt, why, line, field", [
    ("e.txt", "1 2 3\n2 3 x\n", "snap", "3 fields per line", 2, "time"),
    ("e.csv", "src,dst,t\n1,2,3\n2,3,x\n", "csv", "the header 'src,dst,t'", 3, "t"),
    ("j.csv", "user_id,item_id,timestamp,state_label\n1,2,3,0.5\n", "jodie",
     "the header 'user_id,item_id,timestamp,state_label'", 2, "state_label"),
    ("out.x", "% sym\n1 2 1 -4\n", "konect", "the file name out.*", 2, "time"),
    ("soc-sign-x.csv", "1,2,1,nan\n", "snap-signed", "the file name soc-sign-*", 1, "TIME"),
])
def test_every_format_error_of_a_guess_names_the_guessed_format(tmp_path, name, text, fmt, why,
                                                                line, field):
    p = write(tmp_path / name, text)
    assert guess_format(p) == (fmt, why)
    with pytest.raises(DataFormatError) as ei:
        load_dataset(p)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(p), line, field)
    assert f"[read as {fmt}, guessed from {why}; pass format= (--format" in str(e), str(e)
    # an explicit format is not a guess: the message stays as the loader wrote it
    with pytest.raises(DataFormatError) as ei:
        load_dataset(p, format=fmt)
    assert "guessed" not in str(ei.value)


def test_a_directory_of_one_file_names_the_guess_too(tmp_path):
    d = tmp_path / "mydata"
    d.mkdir()
    write(d / "events.csv", "src,dst,t\n1,2,x\n")
    with pytest.raises(DataFormatError, match=r"read as csv, guessed from the header"):
        load_dataset(d)
    write(d / "events.csv", "src,dst,t\n1,2,3\n")
    assert load_dataset(d).name == "mydata"


def test_a_header_after_comment_lines_is_still_a_header(tmp_path):
    p = write(tmp_path / "c.csv", "# exported 2026-11-30\n\nsrc,dst,t\n1,2,3\n2,3,x\n")
    assert guess_format(p) == ("csv", "the header 'src,dst,t'")
    with pytest.raises(DataFormatError) as ei:
        load_dataset(p)
    assert (ei.value.line, ei.value.field) == (5, "t") and "read as csv" in str(ei.value)
