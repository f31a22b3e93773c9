"""Snapshot partitions: invariants, on-disk checks, refusals."""
import json

import pytest
import torch

from tgl_dist.dtdg import build_parts, get_graph
from tgl_dist.dtdg.partition import metis_owner, random_owner, snapshot_degrees
from tgl_dist.errors import PartitionError

from dtdg_graphs import small_graph


@pytest.mark.parametrize("algo", ["random", "metis"])
def test_part_invariants(algo):
    g = small_graph()
    owner = (random_owner if algo == "random" else metis_owner)(g, 3, 0)
    parts = build_parts(g, owner)
    N, E = g.num_nodes, g.num_edges
    owned = torch.cat([p["owned_ids"] for p in parts])
    assert torch.equal(owned.sort().values, torch.arange(N))          # a partition of the nodes
    eids = torch.cat([p["edge"]["eid"] for p in parts])
    assert torch.equal(eids.sort().values, torch.arange(E))             # every edge exactly once
    in_w, loop_w, active = snapshot_degrees(g.edge_index, g.edge()["time"], g.edge()["weight"], N, 6)
    for r, p in enumerate(parts):
        all_ids = torch.cat([p["owned_ids"], p["halo_ids"]])
        src_g, dst_g = all_ids[p["edge_index"][0]], p["owned_ids"][p["edge_index"][1]]
        eid = p["edge"]["eid"]
        assert torch.equal(src_g, g.edge_index[0, eid]) and torch.equal(dst_g, g.edge_index[1, eid])
        assert bool((owner[dst_g] == r).all())                          # edges live with their destination
        assert bool((owner[p["halo_ids"]] != r).all())
        assert torch.equal(p["halo_owner"], owner[p["halo_ids"]])
        # halo rows arrive grouped by owner (the route receives them rank by rank)
        assert bool((p["halo_owner"][1:] >= p["halo_owner"][:-1]).all())
        assert torch.equal(p["edge"]["time"], g.edge()["time"][eid])
        assert torch.allclose(p["in_w"], in_w[all_ids]) and torch.equal(p["active"], active[p["owned_ids"]])
        assert torch.equal(p["node"]["x"], g.node()["x"][p["owned_ids"]])
        # the route: what r sends to q is exactly q's halo from r, in q's order
        off = 0
        for q, c in enumerate(p["send_counts"].tolist()):
            rows = p["send_rows"][off:off + c]
            off += c
            want = parts[q]["halo_ids"][parts[q]["halo_owner"] == r]
            assert torch.equal(p["owned_ids"][rows], want)
            assert int(parts[q]["recv_counts"][r]) == c
    # positions inside each snapshot, in global order
    t = g.edge()["time"]
    pos = torch.cat([p["edge"]["pos"] for p in parts])[torch.argsort(eids)]
    for s in range(6):
        assert sorted(pos[t == s].tolist()) == list(range(int((t == s).sum())))


def test_metis_cuts_fewer_edges_than_random():
    g = small_graph(N=60, E=120)
    g.edge_index[1] = (g.edge_index[0] + torch.randint(0, 3, (120,))) % 60   # local structure
    cut = lambda o: int((o[g.edge_index[0]] != o[g.edge_index[1]]).sum())   # noqa: E731
    assert cut(metis_owner(g, 2, 0)) < cut(random_owner(g, 2, 0))


def test_save_load_and_refusals(tmp_path):
    g = small_graph(name="toy")
    path = g.save_partition(tmp_path, 2, "random")
    assert path == tmp_path / "toy" / "dtdg_random_2"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["kind"] == "dtdg" and manifest["num_parts"] == 2
    assert sum(manifest["owned_nodes"]) == g.num_nodes and sum(manifest["local_edges"]) == g.num_edges
    with pytest.raises(PartitionError, match="2 parts but the world size is 1"):
        get_graph(path)
    with pytest.raises(FileExistsError):
        g.save_partition(tmp_path, 2, "random")
    with pytest.raises(ValueError, match=r"unknown DTDG partitioning algorithm 'spectral'.*metis"):
        g.save_partition(tmp_path, 2, "spectral")
    one = g.save_partition(tmp_path, 1, "metis")
    graph = get_graph(tmp_path, name="toy", algorithm="metis")
    assert graph.num_owned == g.num_nodes and graph.num_halo == 0
    f = one / "part_0" / "graph.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match="checksum mismatch"):
        get_graph(one)
    f.write_bytes(bytes(data[:100]))
    with pytest.raises(PartitionError, match="truncated"):
        get_graph(one)
    with pytest.raises(PartitionError, match="not a tgl_dist partition") as err:
        get_graph(tmp_path / "toy")
    # the hint names the DTDG writer, not the CTDG command line, which cannot write one
    assert "GraphData.save_partition" in str(err.value) and "name=" in str(err.value)
    assert "python -m tgl_dist.partition" not in str(err.value)
    with pytest.raises(PartitionError, match=r"dtdg_metis_1.*GraphData\.save_partition"):
        get_graph(tmp_path, name="nothing")
    # a manifest that does not list the rank's file: refused, not loaded unchecked
    m = json.loads((one / "manifest.json").read_text())
    m["files"] = {}
    (one / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PartitionError, match="lists no file under part_0/"):
        get_graph(one)
    for bad in (2.5, True, "2", 0):
        with pytest.raises(ValueError, match="num_parts must be a positive int"):
            g.save_partition(tmp_path, bad, "random", force=True)


def test_no_partial_partition_on_failure(tmp_path, monkeypatch):
    g = small_graph(name="crash")
    import tgl_dist.dtdg.partition as P

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(P, "write_manifest", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        g.save_partition(tmp_path, 2, "random")
    assert not (tmp_path / "crash" / "dtdg_random_2").exists()
    assert list((tmp_path / "crash").iterdir()) == []


def test_fingerprint_sees_values_not_only_shapes():
    # the examples reuse a partition whose manifest records the data's fingerprint: the
    # same edges with other signals, targets or weights must not match it
    a, b = small_graph(name="fp"), small_graph(name="fp")
    assert a.fingerprint() == b.fingerprint()
    for store, key in (("node", "y"), ("node", "x"), ("edge", "weight"), ("edge", "time")):
        c = small_graph(name="fp")
        t = getattr(c, store)()[key]
        t.view(-1)[0] += 1
        assert c.fingerprint() != a.fingerprint(), (store, key)


def test_active_counts_sources_and_destinations():
    # one edge 0 -> 1 at snapshot 0 of 1: both endpoints are active ("in or out"), node 2 not
    _, _, active = snapshot_degrees(torch.tensor([[0], [1]]), torch.tensor([0]), None, 3, 1)
    assert active.view(-1).tolist() == [True, True, False]
