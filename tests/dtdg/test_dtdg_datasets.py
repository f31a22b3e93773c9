"""Every named snapshot dataset's not-found error says what to put where and its origin URL;
nothing is downloaded."""
import urllib.request

import pytest

from tgl_dist.data import DatasetNotFoundError
from tgl_dist.dtdg import load_dtdg
from tgl_dist.dtdg.datasets import PGT_DATASETS, known_snapshot_datasets
from tgl_dist.errors import TGLDistError

URL = "https://raw.githubusercontent.com/benedekrozemberczki/pytorch_geometric_temporal/master/dataset/"


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the network was touched")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


@pytest.mark.parametrize("name", ["chickenpox", "pedalme_london", "pedalme-london", "england_covid",
                                  "twitter_tennis_rg17", "twitter-tennis-uo17", "montevideo_bus",
                                  "Chickenpox"])
def test_not_found_names_the_file_the_folder_and_the_url(tmp_path, no_network, name):
    with pytest.raises(DatasetNotFoundError) as ei:
        load_dtdg(name, tmp_path)
    canon = name.lower().replace("-", "_")
    msg = str(ei.value)
    assert f"snapshot dataset '{canon}' not found under {tmp_path}: " in msg
    assert f"put {canon}.json into {tmp_path / canon}/; get it from {URL}{canon}.json" in msg
    assert "PyTorch Geometric Temporal's" in msg
    assert isinstance(ei.value, FileNotFoundError) and isinstance(ei.value, TGLDistError)
    assert not any(tmp_path.iterdir())                       # nothing written


def test_the_default_root_is_used_without_root(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("TGL_DIST_DATASETS", str(tmp_path / "none"))
    with pytest.raises(DatasetNotFoundError, match=r"under .*none \(the datasets folder .*none "
                                                   r"does not exist\): put chickenpox.json"):
        load_dtdg("chickenpox")


def test_registry_lists_the_shared_datasets(datasets_root):
    assert set(known_snapshot_datasets()) >= {"chickenpox", "pedalme_london", "england_covid",
                                              "twitter_tennis_rg17", "montevideo_bus"}
    for spec in PGT_DATASETS.values():   # every shared PGT file is registered
        assert spec.url == URL + spec.file
    shared = {d.name for d in datasets_root.iterdir() if (d / f"{d.name}.json").is_file()}
    assert shared <= set(PGT_DATASETS), shared - set(PGT_DATASETS)
    assert load_dtdg("pedalme-london", datasets_root).num_nodes == 15


def test_an_unknown_name_lists_the_known_snapshot_datasets(tmp_path, no_network):
    with pytest.raises(DatasetNotFoundError, match=r"known snapshot datasets: chickenpox, "
                                                   r"england_covid, montevideo_bus"):
        load_dtdg("chikenpox", tmp_path)
