"""load_dataset's fetch-and-cache path, exercised with local file:// URLs (no network)."""
import dataclasses
import gzip
import io
import tarfile
import zipfile

import numpy as np
import pytest

from tgl_dist.data import DatasetNotFoundError, known_datasets, load_dataset
from tgl_dist.data import registry


@pytest.fixture
def spec_at(monkeypatch):
    """Point a known dataset at a local URL for the duration of one test."""
    def patch(name, url):
        monkeypatch.setitem(registry.KNOWN, name, dataclasses.replace(registry.KNOWN[name], url=url))
    return patch


def test_plain_file_is_fetched_atomically_and_cached(tmp_path, spec_at):
    src = tmp_path / "origin" / "CollegeMsg.txt.gz"
    src.parent.mkdir()
    src.write_bytes(gzip.compress(b"1 2 10\n2 3 5\n"))
    spec_at("collegemsg", src.as_uri())
    root = tmp_path / "root"
    g = load_dataset("collegemsg", root=root)
    assert g.num_events == 2 and g.name == "collegemsg" and g.t.tolist() == [5.0, 10.0]
    assert sorted(p.name for p in (root / "collegemsg").iterdir()) == ["CollegeMsg.txt.gz"]  # no .part left
    src.unlink()                                                 # second call reads the cache
    assert load_dataset("collegemsg", root=root).num_events == 2


def test_tar_archive_member_is_extracted(tmp_path, spec_at):
    buf = io.BytesIO()
    data = b"% asym positive\n% 2 3 3\n1,2,1,7\n2,3,1,3\n"
    with tarfile.open(fileobj=buf, mode="w:bz2") as tf:
        info = tarfile.TarInfo("facebook-wosn-wall/out.facebook-wosn-wall")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    arc = tmp_path / "fb.tar.bz2"
    arc.write_bytes(buf.getvalue())
    spec_at("facebook-wall", arc.as_uri())
    g = load_dataset("facebook_wall", root=tmp_path / "root")
    assert g.num_events == 2 and g.name == "facebook-wall"
    assert [p.name for p in (tmp_path / "root" / "facebook_wall").iterdir()] == ["out.facebook-wosn-wall"]


def test_zip_archive_with_dyglib_files(tmp_path, spec_at):
    arc = tmp_path / "uci.zip"
    with zipfile.ZipFile(arc, "w") as zf:
        zf.writestr("uci/ml_uci.csv", ",u,i,ts,label,idx\n0,1,2,3,0,1\n1,2,1,4,0,2\n")
        for fname, rows in (("ml_uci.npy", 3), ("ml_uci_node.npy", 3)):
            b = io.BytesIO()
            np.save(b, np.ones((rows, 2)))
            zf.writestr(f"uci/{fname}", b.getvalue())
        zf.writestr("uci/README.txt", "ignored")
    spec_at("uci", arc.as_uri())
    g = load_dataset("uci", root=tmp_path / "root")
    assert (g.num_nodes, g.num_events) == (2, 2) and g.edge_attr.shape == (2, 2)
    assert sorted(p.name for p in (tmp_path / "root" / "uci").iterdir()) == \
        ["ml_uci.csv", "ml_uci.npy", "ml_uci_node.npy"]


def test_failed_fetch_leaves_nothing_and_explains(tmp_path, spec_at):
    arc = tmp_path / "empty.zip"
    with zipfile.ZipFile(arc, "w") as zf:
        zf.writestr("other.csv", "x")
    spec_at("enron", arc.as_uri())
    with pytest.raises(DatasetNotFoundError, match="holds no ml_enron.csv") as ei:
        load_dataset("enron", root=tmp_path / "root")
    assert "put ml_enron.csv" in str(ei.value)
    assert not (tmp_path / "root").exists()                   # no empty folders left behind
    spec_at("mooc", (tmp_path / "missing.csv").as_uri())
    with pytest.raises(DatasetNotFoundError, match="downloading file:"):
        load_dataset("mooc", root=tmp_path / "root")


def test_known_names_cover_the_issue_list():
    names = set(known_datasets())
    assert {"wikipedia", "reddit", "mooc", "lastfm", "uci", "enron", "bitcoin-alpha", "bitcoin-otc",
            "collegemsg", "facebook-wall", "synthetic"} <= names
