"""Text files are read and parsed in blocks of lines (bounded memory): the result must
not depend on the block size, and errors must name the right line across blocks."""
import gzip

import numpy as np
import pytest
import torch

from tgl_dist.data import load_dataset, load_jodie, load_konect, load_named_csv, load_snap, load_snap_signed
from tgl_dist.data.loaders import _common
from tgl_dist.data.loaders._common import LineNumbers, read_table, sort_by_time
from tgl_dist.data.temporal import TemporalGraph
from tgl_dist.errors import DataFormatError

FIELDS = ("src", "dst", "time")


def _messy_snap(rng, n=400):
    """A SNAP file with comments, blank lines, mixed separators and CRLF line ends."""
    rows = ["# a comment first", ""]
    for k in range(n):
        if k % 37 == 5:
            rows.append("% a comment in the middle")
        if k % 53 == 7:
            rows.append("   ")
        sep = (" ", "\t", ",")[k % 3]
        rows.append(f"{rng.integers(0, 80)}{sep}{rng.integers(0, 80)} {rng.integers(0, 10**6)}"
                    + ("\r" if k % 11 == 0 else ""))
    return "\n".join(rows) + "\n"


def _same_graph(a: TemporalGraph, b: TemporalGraph) -> None:
    for key in ("src", "dst", "t", "eid", "node_map", "edge_attr", "labels"):
        x, y = getattr(a, key), getattr(b, key)
        assert (x is None) == (y is None), key
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), key
    assert a.num_nodes == b.num_nodes
    assert a.masks.keys() == b.masks.keys()
    assert all(torch.equal(a.masks[k], b.masks[k]) for k in a.masks)


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_table_does_not_depend_on_block_size(tmp_path, gz, chunk):
    text = ("\ufeff" + _messy_snap(np.random.default_rng(chunk))).encode()
    p = tmp_path / ("e.txt.gz" if gz else "e.txt")
    p.write_bytes(gzip.compress(text) if gz else text)
    whole = read_table(p, names=FIELDS, min_cols=3, header=False, chunk_bytes=1 << 30)
    part = read_table(p, names=FIELDS, min_cols=3, header=False, chunk_bytes=chunk)
    assert np.array_equal(whole.values, part.values) and whole.num_rows == 400
    assert np.array_equal(np.asarray(whole.lines), np.asarray(part.lines))
    file_lines = text.decode("utf-8-sig").split("\n")
    assert all(file_lines[ln - 1].strip()[0].isdigit() for ln in part.lines.tolist())
    _same_graph(load_snap(p), load_snap(p))


def test_line_numbers_object():
    ln = LineNumbers(np.array([0, 3, 4]), np.array([2, 5, 9]), 6)   # rows 0-2: +2, 3: +5, 4-5: +9
    want = np.array([2, 3, 4, 8, 13, 14])
    assert np.array_equal(np.asarray(ln), want) and ln.tolist() == want.tolist()
    assert [ln[r] for r in range(6)] == want.tolist() and ln[-1] == 14 and len(ln) == 6
    assert np.array_equal(ln[np.array([5, 0])], [14, 2]) and np.array_equal(ln[1:3], [3, 4])
    with pytest.raises(IndexError):
        ln[6]


@pytest.mark.parametrize("bad,match,field", [
    ("1 2 x", "'x' is not a number", "time"),
    ("1 2", "expected 3 fields like line 3, found 2 \\(missing\\)", "time"),
    ("1 2 3 4", "found 4 \\(extra fields\\)", "column 4 \\(unexpected\\)"),
    ("1,,3", "field 2 is empty", "dst"),
    ("1 -2 3", "node id must be a non-negative integer", "dst"),
    ("1 2 nan", "timestamp is NaN", "time"),
])
def test_bad_line_beyond_the_first_block(tmp_path, monkeypatch, bad, match, field):
    """The error names the file line even when it lies many blocks into the file."""
    lines = ["# header comment", ""] + [f"{k % 9} {k % 7} {k}" for k in range(2000)]
    at = 1500                                   # 1-based file line of the bad row
    lines[at - 1] = bad
    p = tmp_path / "bad.txt"
    p.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(_common, "_CHUNK", 256)   # ~30 lines a block: line 1500 is block ~50
    with pytest.raises(DataFormatError, match=match) as ei:
        load_snap(p)
    assert ei.value.line == at, str(ei.value)
    assert f"line {at}, field '" in str(ei.value) and ei.value.field is not None
    import re
    assert re.fullmatch(field, ei.value.field)


def test_header_after_a_long_preamble(tmp_path):
    """The header is found when comments fill the first blocks."""
    body = "\n".join(f"{k},{k + 1},{k * 2},{k % 3}" for k in range(300))
    p = tmp_path / "n.csv"
    p.write_text("#" + "c" * 50 + "\n" * 3 + "# more\n" * 40 + "src,dst,t,weight\n" + body + "\n")
    whole = read_table(p, names=("src", "dst", "t", "weight"), min_cols=4, header=True)
    part = read_table(p, names=("src", "dst", "t", "weight"), min_cols=4, header=True, chunk_bytes=16)
    assert part.header == ["src", "dst", "t", "weight"] and part.header_line == whole.header_line == 44
    assert np.array_equal(whole.values, part.values)
    assert np.array_equal(np.asarray(whole.lines), np.asarray(part.lines))


def test_every_text_loader_same_for_tiny_blocks(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    n = 500
    u, i, t = rng.integers(0, 40, n), rng.integers(0, 60, n), rng.integers(0, 10**5, n)
    files = {
        load_jodie: ("j.csv", "user_id,item_id,timestamp,state_label,f0,f1\n" + "".join(
            f"{a},{b},{c}.5,{c % 2},{a / 7:.6f},{-b * 1.5}\n" for a, b, c in zip(u, i, t))),
        load_snap_signed: ("s.csv", "".join(f"{a},{b},{int(c % 21) - 10},{c}\n" for a, b, c in zip(u, i, t))),
        load_konect: ("out.k", f"% asym\n% {n} 40 60\n" + "".join(
            f"{a} {b} {1 + c % 3} {c}\n" for a, b, c in zip(u, i, t))),
        load_named_csv: ("n.csv", "t,weight,dst,src\n" + "".join(
            f"{c},{c % 5},{b},{a}\n" for a, b, c in zip(u, i, t))),
    }
    for loader, (fname, text) in files.items():
        p = tmp_path / fname
        p.write_text(text)
        monkeypatch.setattr(_common, "_CHUNK", 16 << 20)
        whole = loader(p)
        monkeypatch.setattr(_common, "_CHUNK", 41)
        _same_graph(whole, loader(p))
        assert bool((whole.t[1:] >= whole.t[:-1]).all()) and whole.num_events == n


def test_sort_by_time_is_temporalgraph_sorted():
    rng = np.random.default_rng(1)
    E = 3000
    t = rng.integers(0, 50, E).astype(np.float64)            # unsorted, many ties
    src, dst = torch.from_numpy(rng.integers(0, 30, E)), torch.from_numpy(rng.integers(0, 30, E))
    ea, lab = torch.randn(E, 3), torch.from_numpy(rng.integers(0, 2, E))
    want = TemporalGraph.sorted(src.clone(), dst.clone(), torch.from_numpy(t.copy()), num_nodes=30,
                                edge_attr=ea.clone(), labels=lab.clone())
    got = sort_by_time(src.clone(), dst.clone(), t.copy(), num_nodes=30, edge_attr=ea.clone(),
                       labels=lab.clone())
    _same_graph(want, got)
    t[3] = np.nan                                            # still refused as before
    with pytest.raises(ValueError, match="finite"):
        sort_by_time(src, dst, t, num_nodes=30)


REAL = {  # name -> relative file: every text format in the shared datasets
    "collegemsg": "collegemsg/CollegeMsg.txt",
    "bitcoin-alpha": "bitcoin_alpha/soc-sign-bitcoinalpha.csv.gz",
    "wikipedia": "wikipedia/wikipedia.csv",
    "uci": "uci/ml_uci.csv",
    "facebook-wall": "facebook_wall/out.facebook-wosn-wall",
}


@pytest.mark.parametrize("name", list(REAL))
def test_real_files_same_in_small_blocks(datasets_root, monkeypatch, name):
    """Each real text file gives the same graph read in one block and in many blocks."""
    path = datasets_root / REAL[name]
    monkeypatch.setattr(_common, "_CHUNK", 1 << 31)
    whole = load_dataset(path)
    monkeypatch.setattr(_common, "_CHUNK", (1 << 20) + 13)     # facebook-wall: ~20 blocks
    _same_graph(whole, load_dataset(path))


@pytest.mark.parametrize("bad,match,field", [
    ("3,4,10.0,0,0.5,nan", "edge features must be finite numbers, got nan", "feature_1"),
    ("3,4,10.0,0,inf,1", "edge features must be finite numbers, got inf", "feature_0"),
    ("3,4,10.0,0.5,1,1", "state label must be an integer", "state_label"),
])
def test_jodie_bad_row_beyond_the_first_block(tmp_path, monkeypatch, bad, match, field):
    """JODIE features are converted to float32 block by block; a bad one (or a bad label,
    which is reported first, as before) still names its file line."""
    lines = ["user_id,item_id,timestamp,state_label,a,b"] + [f"{k % 5},{k % 3},{k}.0,0,0.25,{k}"
                                                             for k in range(1000)]
    at = 900
    lines[at - 1] = bad
    lines[950] = "1,2,950.0,0,1e300,2"                      # finite in float64: accepted as before
    p = tmp_path / "j.csv"
    p.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(_common, "_CHUNK", 300)
    with pytest.raises(DataFormatError, match=match) as ei:
        load_jodie(p)
    assert (ei.value.line, ei.value.field) == (at, field)


def test_progress_bar_over_bytes(tmp_path, monkeypatch):
    bars = []

    class Recording(_common.tqdm):
        def close(self):
            if not hasattr(self, "seen"):
                self.seen = (self.disable, self.n, self.total)
                bars.append(self.seen)
            super().close()

    monkeypatch.setattr(_common, "tqdm", Recording)
    p = tmp_path / "p.txt.gz"
    p.write_bytes(gzip.compress(b"".join(b"%d %d %d\n" % (k, k + 1, k) for k in range(5000))))
    tab = read_table(p, names=FIELDS, min_cols=3, header=False, chunk_bytes=4096, progress=True)
    assert tab.num_rows == 5000
    # shown, and counted the compressed bytes read, to the end
    assert bars == [(False, p.stat().st_size, p.stat().st_size)]
    read_table(p, names=FIELDS, min_cols=3, header=False)   # a small file: no bar by default
    assert bars[1][0] is True
