"""TGB link datasets: our loader and negatives against py-tgb's own ``LinkPropPredDataset``,
``NegativeEdgeGenerator`` and ``NegativeEdgeSampler``, on TGB-layout folders built here
from small data (nothing downloads)."""
import pickle
import urllib.error

import numpy as np
import pytest
import torch

from tgl_dist.data import DatasetNotFoundError, generate_synthetic, load_dataset
from tgl_dist.data.loaders import tgb as ours
from tgl_dist.errors import DataFormatError

NO_TGB = "py-tgb is not installed (pip install py-tgb, in the 'test' extra)"


def _py_tgb():
    """py-tgb's dataset module (the parity tests skip without it; the others run)."""
    return pytest.importorskip("tgb.linkproppred.dataset", reason=NO_TGB)

N_EVENTS = 1500


def _stream(seed=0, n=N_EVENTS, nodes=120):
    g = generate_synthetic(num_nodes=nodes, num_events=n, seed=seed)
    return g.src.numpy(), g.dst.numpy(), g.t.numpy().astype(np.int64)


def _write_wiki(folder, name):
    src, dst, t = _stream(1)
    rng = np.random.default_rng(1)
    users = src % 80                           # JODIE: users and items in their own id spaces
    items = dst % 40
    feat = rng.normal(size=(t.size, 3)).round(6)
    lines = ["user_id,item_id,timestamp,state_label,comma_separated_list_of_features"]
    for u, i, ts, f in zip(users, items, t, feat):
        lines.append(f"{u},{i},{float(ts)},0," + ",".join(repr(float(x)) for x in f))
    (folder / f"{name}_edgelist_v2.csv").write_text("\n".join(lines) + "\n")


def _write_sc(folder, name):
    src, dst, t = _stream(2)
    rng = np.random.default_rng(2)
    w = rng.choice([0.0, 1.0, 2.5, 1e-3, 123456.789, 7.0], size=t.size)
    lines = ["ts,src,dst,weight"]
    for s, d, ts, x in zip(src, dst, t, w):
        lines.append(f"{ts},0x{(s * 7919) % 100003:040x},0x{(d * 104729) % 100003:040x},{x}")
    (folder / f"{name}_edgelist_v2.csv").write_text("\n".join(lines) + "\n")


def _write_rc(folder, name):
    src, dst, t = _stream(3)
    rng = np.random.default_rng(3)
    words = rng.integers(0, 9000, size=t.size)
    score = rng.integers(-20, 300, size=t.size)
    lines = ["ts,src,dst,num_words,score"]
    for s, d, ts, a, b in zip(src, dst, t, words, score):
        lines.append(f"{ts},user{s},sub_{d},{a},{b}")
    (folder / f"{name}_edgelist.csv").write_text("\n".join(lines) + "\n")


def _write_flight(folder, name):
    src, dst, t = _stream(4, nodes=30)
    rng = np.random.default_rng(4)
    day0 = np.datetime64("2019-01-01")
    days = [str(day0 + np.timedelta64(int(x) // 86400, "D")) for x in t]
    calls = ["", "AB12", "DLH9X", "UAL1234", "SWR12345"]
    codes = ["", "A320", "B738", "TOOLONGCODE", "E19"]
    lines = ["timestamp,src,dst,callsign,typecode"]
    for s, d, day in zip(src, dst, days):
        lines.append(f"{day},AP{s:02d},AP{d:02d},{calls[rng.integers(5)]},{codes[rng.integers(5)]}")
    (folder / f"{name}_edgelist_v2.csv").write_text("\n".join(lines) + "\n")
    air = ["airport_code,type,continent,iso_region,longitude,latitude"]
    for a in range(30):                        # 5 types + 6 continents + 7 + 2 = 20 values
        air.append(f"AP{a:02d},type{a % 5},C{a % 6},US-{'ABCDE'[a % 5]}{a % 3},"
                   f"{-120 + a * 1.5},{30.25 + a}")
    air.append("ZZZ,unused,none,XX,0,0")       # not in the edge list: ignored
    (folder / "airport_node_feat_v2.csv").write_text("\n".join(air) + "\n")


WRITERS = {"tgbl-wiki": _write_wiki, "tgbl-review": _write_sc, "tgbl-coin": _write_sc,
           "tgbl-comment": _write_rc, "tgbl-flight": _write_flight}


def _tgb_dataset(name, root, monkeypatch):
    tgb_ds = _py_tgb()
    monkeypatch.setattr(tgb_ds, "PROJ_DIR", "")    # py-tgb prefixes root with its own folder
    monkeypatch.setattr(tgb_ds.LinkPropPredDataset, "download",
                        lambda self: pytest.fail("py-tgb tried to download"))
    return tgb_ds.LinkPropPredDataset(name=name, root=str(root), download=False)


def _generate_negatives(ds, folder, name, q):
    """TGB's own generator (hist_rnd, seed 42) for the val and test splits, as the
    ``tgbl-*_neg_generator.py`` scripts run it; renamed to the dataset's file version."""
    _py_tgb()
    from tgb.linkproppred.negative_generator import NegativeEdgeGenerator
    from torch_geometric.data import TemporalData
    fd = ds.full_data
    data = TemporalData(src=torch.from_numpy(fd["sources"]).long(),
                        dst=torch.from_numpy(fd["destinations"]).long(),
                        t=torch.from_numpy(fd["timestamps"]).long(),
                        msg=torch.zeros(len(fd["sources"]), 1))
    gen = NegativeEdgeGenerator(dataset_name=name, first_dst_id=int(data.dst.min()),
                                last_dst_id=int(data.dst.max()), num_neg_e=q,
                                strategy="hist_rnd", rnd_seed=42,
                                historical_data=data[torch.from_numpy(ds.train_mask)])
    spec = ours.tgb_spec(name)
    for split, mask in (("val", ds.val_mask), ("test", ds.test_mask)):
        gen.generate_negative_samples(data=data[torch.from_numpy(mask)], split_mode=split,
                                      partial_path=str(folder))
        (folder / f"{name}_{split}_ns.pkl").rename(folder / spec.negatives(split))


@pytest.fixture(scope="module")
def tgb_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tgb")


@pytest.mark.parametrize("name,q", [("tgbl-wiki", 1000), ("tgbl-review", 20), ("tgbl-coin", 20),
                                    ("tgbl-comment", 20), ("tgbl-flight", 10)])
def test_matches_py_tgb(name, q, tmp_path, monkeypatch):
    spec = ours.tgb_spec(name)
    folder = tmp_path / spec.folder
    folder.mkdir()
    WRITERS[name](folder, name)
    ds = _tgb_dataset(name, tmp_path, monkeypatch)
    _generate_negatives(ds, folder, name, q)
    g = load_dataset(name, root=tmp_path, download=False)
    fd = ds.full_data
    assert g.name == name and g.num_events == len(fd["sources"])
    assert np.array_equal(g.src.numpy(), fd["sources"])
    assert np.array_equal(g.dst.numpy(), fd["destinations"])
    assert np.array_equal(g.t.numpy(), fd["timestamps"].astype(np.float64))
    assert g.num_nodes == int(max(fd["sources"].max(), fd["destinations"].max())) + 1
    assert np.array_equal(g.edge_attr.numpy(), np.asarray(ds.edge_feat, dtype=np.float32))
    for split, m in (("train", ds.train_mask), ("val", ds.val_mask), ("test", ds.test_mask)):
        assert np.array_equal(g.masks[split].numpy(), m), split
    assert 0 < int(g.val_mask.sum()) and 0 < int(g.test_mask.sum())
    if name == "tgbl-flight":
        assert g.node_feat.shape == (g.num_nodes, 20)
        assert np.array_equal(g.node_feat.numpy(), ds.node_feat.astype(np.float32))
    else:
        assert g.node_feat is None and ds.node_feat is None
    sampler = ds.negative_sampler
    for split, m in (("val", ds.val_mask), ("test", ds.test_mask)):
        getattr(ds, f"load_{split}_ns")()
        theirs = sampler.query_batch(fd["sources"][m], fd["destinations"][m], fd["timestamps"][m],
                                     split_mode=split)
        neg = ours.load_tgb_negatives(name, split, g, root=tmp_path)
        assert torch.equal(neg.eid, g.eid[g.masks[split]])
        assert neg.dst.shape[0] == len(theirs)
        rows = [r[r >= 0].tolist() for r in neg.dst]
        assert rows == theirs, split
        assert torch.equal(neg.mask, neg.dst >= 0)
        half = neg.eid[::2]
        assert torch.equal(neg.rows(half), neg.dst[::2])


def test_ragged_negatives_are_padded(tmp_path, monkeypatch):
    # wiki's q exceeds the destinations: TGB returns each short pool whole, lengths differ
    folder = tmp_path / "tgbl_wiki"
    folder.mkdir()
    _write_wiki(folder, "tgbl-wiki")
    ds = _tgb_dataset("tgbl-wiki", tmp_path, monkeypatch)
    _generate_negatives(ds, folder, "tgbl-wiki", 1000)
    g = load_dataset("tgbl-wiki", root=tmp_path, download=False)
    neg = ours.load_tgb_negatives("tgbl-wiki", "test", g, root=tmp_path)
    counts = neg.mask.sum(1)
    assert counts.min() < counts.max() <= neg.num_neg
    assert bool((neg.dst[~neg.mask] == -1).all())
    with pytest.raises(KeyError):
        neg.rows(torch.tensor([0]))           # a training event


def test_missing_files_say_what_and_where(tmp_path, monkeypatch):
    with pytest.raises(DatasetNotFoundError) as e:
        load_dataset("tgbl-coin", root=tmp_path, download=False)
    msg = str(e.value)
    assert "tgbl-coin_edgelist_v2.csv" in msg and str(tmp_path / "tgbl_coin") in msg
    assert ours.TGB_DATASETS["tgbl-coin"].url in msg
    # with downloads allowed but no network: fails at once, names the URL, leaves nothing
    def refuse(url, timeout=None):
        raise urllib.error.URLError("no network here")
    monkeypatch.setattr(ours.urllib.request, "urlopen", refuse)
    with pytest.raises(DatasetNotFoundError, match="downloading .*tgbl-coin-v2.zip failed"):
        load_dataset("tgbl-coin", root=tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()
    # the edge list present, the negatives absent
    folder = tmp_path / "tgbl_comment"
    folder.mkdir()
    _write_rc(folder, "tgbl-comment")
    g = load_dataset("tgbl_comment", root=tmp_path)
    with pytest.raises(DatasetNotFoundError, match="tgbl-comment_val_ns.pkl"):
        ours.load_tgb_negatives("tgbl-comment", "val", g, root=tmp_path)


def test_download_extracts_tgb_zip(tmp_path, monkeypatch):
    import io
    import zipfile
    src = tmp_path / "src"
    src.mkdir()
    _write_sc(src, "tgbl-review")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.write(src / "tgbl-review_edgelist_v2.csv", "tgbl-review_edgelist_v2.csv")
        zf.writestr("README.txt", "not wanted")

    class Resp(io.BytesIO):
        headers = {"content-length": str(len(buf.getvalue()))}

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False
    seen = []
    monkeypatch.setattr(ours.urllib.request, "urlopen",
                        lambda url, timeout=None: seen.append((url, timeout)) or Resp(buf.getvalue()))
    g = load_dataset("tgbl-review", root=tmp_path / "root")
    assert seen == [(ours.TGB_DATASETS["tgbl-review"].url, ours.DOWNLOAD_TIMEOUT_S)]
    assert sorted(p.name for p in (tmp_path / "root" / "tgbl_review").iterdir()) == [
        "tgbl-review_edgelist_v2.csv"]
    assert g.num_events == N_EVENTS


def test_bad_files_name_file_line_and_field(tmp_path):
    folder = tmp_path / "tgbl_review"
    folder.mkdir()
    f = folder / "tgbl-review_edgelist_v2.csv"
    f.write_text("ts,src,dst,weight\n1,a,b,1.0\n2,a,c,-3\n")
    with pytest.raises(DataFormatError) as e:
        load_dataset("tgbl-review", root=tmp_path, download=False)
    assert e.value.line == 3 and e.value.field == "weight" and e.value.path == str(f)
    f.write_text("ts,src,dst,weight\n1,a,b,1.0\nsoon,a,c,2\n")
    with pytest.raises(DataFormatError) as e:
        load_dataset("tgbl-review", root=tmp_path, download=False)
    assert e.value.line == 3 and e.value.field == "ts"
    f.write_text("ts,src,dst,weight\n" + "".join(f"{i},a,n{i},2\n" for i in range(20)))
    g = load_dataset("tgbl-review", root=tmp_path, download=False)
    bad = folder / "tgbl-review_val_ns_v2.pkl"
    bad.write_bytes(pickle.dumps({(0, 1, 1): np.array([2])}))
    with pytest.raises(DataFormatError, match="no negatives in the file"):
        ours.load_tgb_negatives("tgbl-review", "val", g, root=tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))
    bad.write_bytes(pickle.dumps({(0, 16, 15): Evil()}))
    with pytest.raises(DataFormatError, match="refusing to load builtins.print"):
        ours.load_tgb_negatives("tgbl-review", "val", g, root=tmp_path)


def test_real_wikipedia_rows_as_tgbl_wiki(datasets_root, tmp_path, monkeypatch):
    # TGB's tgbl-wiki edge list is JODIE's wikipedia.csv: its first 3000 lines in TGB's
    # layout read the same through both loaders (features too, when the copy has them)
    src = datasets_root / "wikipedia" / "wikipedia.csv"
    if not src.is_file():
        pytest.skip(f"{src} is absent")
    with open(src) as f:
        head = [next(f) for _ in range(3001)]
    folder = tmp_path / "tgbl_wiki"
    folder.mkdir()
    (folder / "tgbl-wiki_edgelist_v2.csv").write_text("".join(head))
    ds = _tgb_dataset("tgbl-wiki", tmp_path, monkeypatch)
    g = load_dataset("tgbl-wiki", root=tmp_path, download=False)
    fd = ds.full_data
    assert g.num_events == 3000
    assert np.array_equal(g.src.numpy(), fd["sources"])
    assert np.array_equal(g.dst.numpy(), fd["destinations"])
    assert np.array_equal(g.t.numpy(), fd["timestamps"].astype(np.float64))
    if ds.edge_feat.shape[1]:
        assert np.array_equal(g.edge_attr.numpy(), ds.edge_feat.astype(np.float32))
    else:
        assert g.edge_attr is None
    for split, m in (("train", ds.train_mask), ("val", ds.val_mask), ("test", ds.test_mask)):
        assert np.array_equal(g.masks[split].numpy(), m), split


def test_negatives_pickled_by_older_numpy_and_protocols(tmp_path):
    # TGB's released files were written by numpy 1.x (numpy.core names); protocol 2
    # carries array bytes through _codecs.encode: both load, nothing else does
    folder = tmp_path / "tgbl_review"
    folder.mkdir()
    (folder / "tgbl-review_edgelist_v2.csv").write_text(
        "ts,src,dst,weight\n" + "".join(f"{i},a,n{i},2\n" for i in range(20)))
    g = load_dataset("tgbl-review", root=tmp_path, download=False)
    m = g.val_mask
    table = {(np.int64(s), np.int64(d), np.int64(t)): np.concatenate([np.array([]), [1.0, 2.0]])
             for s, d, t in zip(g.src[m].tolist(), g.dst[m].tolist(), g.t[m].long().tolist())}
    for proto in (2, 4, 5):
        raw = pickle.dumps(table, protocol=proto)
        if proto == 2:
            raw = raw.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        (folder / "tgbl-review_val_ns_v2.pkl").write_bytes(raw)
        neg = ours.load_tgb_negatives("tgbl-review", "val", g, root=tmp_path)
        assert neg.dst.dtype == torch.long and neg.dst.tolist() == [[1, 2]] * int(m.sum())


def test_bad_flight_rows(tmp_path):
    folder = tmp_path / "tgbl_flight"
    folder.mkdir()
    f = folder / "tgbl-flight_edgelist_v2.csv"
    (folder / "airport_node_feat_v2.csv").write_text(
        "airport_code,type,continent,iso_region,longitude,latitude\n")
    f.write_text("timestamp,src,dst,callsign,typecode\n2019-01-01,A,B,X1,A320\n"
                 "2019-13-01,A,B,X1,A320\n")
    with pytest.raises(DataFormatError) as e:
        load_dataset("tgbl-flight", root=tmp_path, download=False)
    assert (e.value.line, e.value.field) == (3, "day")
    f.write_text("timestamp,src,dst,callsign,typecode\n2019-01-01,A,B,X1,A320\n"
                 "2019-01-02,A,B,ABCDEFGHIJ,A320\n")
    with pytest.raises(DataFormatError) as e:
        load_dataset("tgbl-flight", root=tmp_path, download=False)
    assert (e.value.line, e.value.field) == (3, "callsign")
    (folder / "airport_node_feat_v2.csv").unlink()
    with pytest.raises(DatasetNotFoundError, match="airport_node_feat_v2.csv"):
        load_dataset("tgbl-flight", root=tmp_path, download=False)
