"""Snapshot edge-list CSV (``snapshot,src,dst[,weight]``): exact values, bad input, load_dtdg."""
import gzip

import pytest
import torch

from tgl_dist.dtdg import load_dtdg, load_snapshot_csv
from tgl_dist.errors import DataFormatError

TINY = ("# snapshots of a toy graph\n"
        "snapshot,src,dst,weight\n"
        "3,0,1,0.5\n"
        "1,1,2,1.0\n"
        "\n"
        "1,2,0,2.0\n"
        "3,4,2,1.5\n")


def write(path, text, gz=False):
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    return path


def test_exact_values_of_a_tiny_file(tmp_path):
    g = load_snapshot_csv(write(tmp_path / "toy.csv", TINY))
    assert (g.num_nodes, g.num_edges, g.num_snapshots) == (5, 4, 3)
    assert g.meta()["name"] == "toy" and g.meta()["layout"] == "snapshot_csv"
    assert g.meta()["first_snapshot"] == 1                  # file numbers 1..3 -> snapshots 0..2
    # sorted stably by snapshot: lines 4, 6 (snapshot 1), then 3, 7 (snapshot 3)
    assert g.edge_index.tolist() == [[1, 2, 0, 4], [2, 0, 1, 2]]
    assert g.edge()["time"].tolist() == [0, 0, 2, 2]
    assert g.edge()["weight"].tolist() == [1.0, 2.0, 0.5, 1.5]
    assert g.get_snapshot(1).edge_index.numel() == 0         # number 2 has no edge: kept, empty
    x = g.node()["x"]                                        # log1p [in, out] degree per snapshot
    assert x.shape == (5, 3, 2)
    assert torch.allclose(x[2, 0], torch.log1p(torch.tensor([1.0, 1.0])))
    assert torch.allclose(x[2, 2], torch.log1p(torch.tensor([1.0, 0.0])))
    assert x[3].abs().sum() == 0                             # node 3 has no edge at all


def test_columns_by_name_any_case_no_weight_gzip_and_num_nodes(tmp_path):
    p = write(tmp_path / "s.csv.gz", "DST\tSnapshot\tSrc\n1\t0\t2\n0\t0\t1\n", gz=True)
    g = load_snapshot_csv(p, num_nodes=10)
    assert g.name == "s" and g.num_nodes == 10 and "weight" not in g.edge()
    assert g.edge_index.tolist() == [[2, 1], [1, 0]] and g.num_snapshots == 1
    with pytest.raises(ValueError, match="num_nodes=2 but .* has node id 2"):
        load_snapshot_csv(p, num_nodes=2)


@pytest.mark.parametrize("text, line, field, match", [
    ("snapshot,src,weight\n0,1,2\n", 1, "dst",
     r"header 'snapshot,src,weight' has no column 'dst'; expected snapshot,src,dst\[,weight\]"),
    ("snapshot,src,dst,label\n0,1,2,0\n", 1, "label", r"unknown column 'label'"),
    ("snapshot,src,dst,src\n0,1,2,3\n", 1, "src", r"names column 'src' twice"),
    ("0,1,2\n1,2,3\n", 1, None, r"expected a header snapshot,src,dst\[,weight\] on the first "
                                r"line, found the data row '0,1,2'"),
    ("snapshot,src,dst\n0,1,2\n0,1.5,2\n", 3, "src", r"node id must be a non-negative integer, "
                                                      r"got 1.5"),
    ("snapshot,src,dst\n0,1,2\n-1,1,2\n", 3, "snapshot", r"snapshot must be a non-negative "
                                                         r"integer, got -1.0"),
    ("snapshot,src,dst,weight\n0,1,2,1\n0,1,2,heavy\n", 3, "weight", r"'heavy' is not a number"),
    ("snapshot,src,dst,weight\n0,1,2,nan\n", 2, "weight", r"weight must be a finite number"),
    ("snapshot,src,dst,weight\n0,1,2,1\n0,1,2\n", 3, "weight", r"expected 4 fields like line 2, "
                                                               r"found 3"),
    ("snapshot,src,dst\n", None, None, r"no data rows"),
])
def test_bad_input_names_file_line_and_field(tmp_path, text, line, field, match):
    p = write(tmp_path / "bad.csv", text)
    with pytest.raises(DataFormatError, match=match) as ei:
        load_snapshot_csv(p)
    e = ei.value
    assert (e.path, e.line, e.field) == (str(p), line, field), str(e)
    # through load_dtdg the guess is named (no silent fallback to an event format)
    if line != 1 or field is not None:
        with pytest.raises(DataFormatError, match=r"\[read as snapshot-csv, guessed from a header "
                                                  r"starting with 'snapshot'; pass format="):
            load_dtdg(p)


def test_load_dtdg_infers_or_takes_the_format(tmp_path):
    p = write(tmp_path / "toy.csv", TINY)
    assert load_dtdg(p).edge_index.tolist() == load_snapshot_csv(p).edge_index.tolist()
    q = write(tmp_path / "toy.data", TINY)                   # any name: the header decides
    assert load_dtdg(q).meta()["layout"] == "snapshot_csv"
    assert load_dtdg(q, format="snapshot_csv").num_edges == 4
    # an explicit format is not a guess, and a wrong one says what it read
    r = write(tmp_path / "events.txt", "1 2 3\n2 3 4\n")
    with pytest.raises(DataFormatError, match=r"expected a header snapshot,src,dst") as ei:
        load_dtdg(r, format="snapshot-csv")
    assert "guessed" not in str(ei.value)
    assert load_dtdg(r, num_snapshots=2).meta()["num_snapshots"] == 2   # an event file, binned
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_dtdg(tmp_path / "absent.csv")


def test_an_unknown_format_lists_the_snapshot_and_event_formats(tmp_path):
    p = write(tmp_path / "toy.csv", TINY)
    with pytest.raises(ValueError, match=r"unknown format 'parquet'; snapshot formats: pgt-json, "
                                         r"snapshot-csv; event formats .*: jodie, .*csv"):
        load_dtdg(p, format="parquet")
