"""Every loader on its real file in the shared datasets folder (counts from its README)."""
import gzip

import numpy as np
import pytest
import torch

from tgl_dist.data import (infer_format, load_dataset, load_dyglib, load_jodie, load_konect, load_snap,
                           load_snap_signed)

# name -> (format, relative file, nodes, events)
TABLE = {
    "wikipedia": ("jodie", "wikipedia/wikipedia.csv", 9227, 157474),
    "uci": ("dyglib", "uci/ml_uci.csv", 1899, 59835),
    "collegemsg": ("snap", "collegemsg/CollegeMsg.txt", 1899, 59835),
    "bitcoin-alpha": ("snap-signed", "bitcoin_alpha/soc-sign-bitcoinalpha.csv.gz", 3783, 24186),
    "facebook-wall": ("konect", "facebook_wall/out.facebook-wosn-wall", 46952, 876993),
}


@pytest.mark.parametrize("name", list(TABLE))
def test_counts_match_readme(real_graph, name):
    fmt, _, nodes, events = TABLE[name]
    g = real_graph(name)
    assert (g.num_nodes, g.num_events) == (nodes, events)
    assert g.name == name
    assert g.node_map.numel() == g.num_nodes
    assert bool((g.node_map[1:] > g.node_map[:-1]).all())        # order-preserving remap
    assert int(torch.cat([g.src, g.dst]).max()) < g.num_nodes
    assert bool((g.t[1:] >= g.t[:-1]).all())
    assert torch.equal(g.eid, torch.arange(events))


@pytest.mark.parametrize("name", list(TABLE))
def test_format_inferred_and_direct_loader_agree(real_graph, datasets_root, name):
    fmt, rel, _, _ = TABLE[name]
    path = datasets_root / rel
    assert infer_format(path) == fmt
    if name == "facebook-wall":   # the big one: compare through the name-based load only
        return
    loader = {"jodie": load_jodie, "dyglib": load_dyglib, "snap": load_snap,
              "snap-signed": load_snap_signed}[fmt]
    g, h = real_graph(name), loader(path)
    assert torch.equal(g.src, h.src) and torch.equal(g.dst, h.dst) and torch.equal(g.t, h.t)


@pytest.mark.parametrize("name", list(TABLE))
def test_split_masks_chronological_70_15_15(real_graph, name):
    g = real_graph(name)
    tr, va, te = g.train_mask, g.val_mask, g.test_mask
    assert bool((tr.int() + va.int() + te.int() == 1).all())     # a partition of the events
    E = g.num_events
    for m, share in ((tr, 0.70), (va, 0.15), (te, 0.15)):
        assert abs(m.sum().item() / E - share) < 0.03, (name, m.sum().item() / E)
    assert g.t[tr].max() <= g.t[va].min() and g.t[va].max() <= g.t[te].min()
    assert bool((g.masks["inductive_train"] <= tr).all())
    assert bool((g.masks["new_node_test"] <= te).all())
    assert g.masks["new_node_test"].any()


def test_wikipedia_jodie_details(real_graph, datasets_root):
    g = real_graph("wikipedia")
    assert g.labels is not None and int(g.labels.sum()) == 217
    assert g.edge_attr is None                                  # this copy has no feature columns
    raw = np.loadtxt(datasets_root / "wikipedia/wikipedia.csv", delimiter=",", skiprows=1)
    users, items = raw[:, 0].astype(np.int64), raw[:, 1].astype(np.int64)
    shift = users.max() + 1
    assert shift == 8227
    # file is sorted: event k is line k; item ids shifted by max(user) + 1, then remapped
    assert torch.equal(g.node_map[g.src], torch.from_numpy(users))
    assert torch.equal(g.node_map[g.dst], torch.from_numpy(items + shift))
    assert torch.equal(g.t, torch.from_numpy(raw[:, 2]))


def test_uci_dyglib_features(real_graph, datasets_root):
    g = real_graph("uci")
    assert g.edge_attr.shape == (59835, 100) and g.node_feat.shape == (1899, 100)
    assert torch.equal(g.node_map, torch.arange(1, 1900))
    lines = (datasets_root / "uci/ml_uci.csv").read_text().split("\n")[1:3]
    u, i = (int(x) for x in lines[0].split(",")[1:3])
    assert (int(g.src[0]) + 1, int(g.dst[0]) + 1) == (u, i)


def test_collegemsg_same_network_as_uci(real_graph):
    a, b = real_graph("collegemsg"), real_graph("uci")
    assert a.num_events == b.num_events and a.num_nodes == b.num_nodes
    # same first events, up to the time origin
    assert torch.equal(a.t - a.t[0], b.t - b.t[0])


def test_bitcoin_alpha_sorted_stably_with_rating(real_graph, datasets_root):
    g = real_graph("bitcoin-alpha")
    raw = np.array([[float(x) for x in ln.split(",")] for ln in
                    gzip.open(datasets_root / "bitcoin_alpha/soc-sign-bitcoinalpha.csv.gz", "rt")
                    if ln.strip()])
    assert bool((np.diff(raw[:, 3]) < 0).any())                  # the file really is unsorted
    order = np.argsort(raw[:, 3], kind="stable")
    assert torch.equal(g.t, torch.from_numpy(raw[order, 3]))
    assert torch.equal(g.node_map[g.src], torch.from_numpy(raw[order, 0].astype(np.int64)))
    assert torch.equal(g.node_map[g.dst], torch.from_numpy(raw[order, 1].astype(np.int64)))
    assert g.edge_attr.shape == (24186, 1)
    assert torch.equal(g.edge_attr[:, 0], torch.from_numpy(raw[order, 2].astype(np.float32)))


def test_facebook_wall_konect(real_graph):
    g = real_graph("facebook-wall")
    assert g.edge_attr is None                                   # weights all ones -> no edge feature
    assert int(g.node_map[0]) == 1


def test_load_dataset_accepts_paths_dirs_and_spellings(datasets_root, real_graph):
    by_path = load_dataset(datasets_root / "collegemsg" / "CollegeMsg.txt")
    by_dir = load_dataset(datasets_root / "collegemsg")
    by_fmt = load_dataset(str(datasets_root / "collegemsg" / "CollegeMsg.txt"), format="snap")
    ref = real_graph("collegemsg")
    for g in (by_path, by_dir, by_fmt):
        assert torch.equal(g.src, ref.src) and torch.equal(g.t, ref.t)
    assert load_dataset("bitcoin_alpha", root=datasets_root, download=False).num_events == 24186
    assert load_dataset("Bitcoin-Alpha", root=datasets_root, download=False).num_events == 24186


@pytest.mark.parametrize("name", ["wikipedia", "uci", "bitcoin-alpha"])
def test_pyg_round_trip_on_real_graphs(real_graph, name):
    from tgl_dist.data import from_pyg, to_pyg
    g = real_graph(name)
    d = to_pyg(g)
    assert d.num_events == g.num_events and d.t.dtype == torch.long     # all three have integral times
    h = from_pyg(d, num_nodes=g.num_nodes)
    assert torch.equal(h.src, g.src) and torch.equal(h.dst, g.dst) and torch.equal(h.t, g.t)
    assert (h.edge_attr is None) == (g.edge_attr is None)
    if g.edge_attr is not None:
        assert torch.equal(h.edge_attr, g.edge_attr)
    assert torch.equal(h.masks["test"], g.masks["test"])
