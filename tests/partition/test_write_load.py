"""On-disk partitions: invariants of what is written, atomic writes, ``partition_load`` and its refusals."""
import json

import pytest
import torch

from tgl_dist.data import TemporalGraph
from tgl_dist.errors import PartitionError
from tgl_dist.partition import partition_graph, partition_load
from tgl_dist.partition import writer as writer_mod

ALGOS = ["random", "hash", "metis", "metis_for_tgnn"]
MASKS = ["train", "val", "test", "inductive_train", "new_node_val", "new_node_test"]


@pytest.mark.parametrize("algo", ALGOS)
def test_written_partition_invariants(algo, toy_graph, tmp_path):
    g, P = toy_graph, 3
    path = partition_graph(g, P, algo, tmp_path, seed=1)
    assert path == tmp_path / "toy" / f"{algo}_{P}"
    parts = [partition_load(path.parent, algo, rank=r, world_size=P) for r in range(P)]
    book = parts[0].book
    owner = book.owner.long()
    # each node exactly one owner; book round trip
    ids = torch.cat([p.ids for p in parts])
    assert torch.equal(torch.sort(ids).values, torch.arange(g.num_nodes))
    for r, p in enumerate(parts):
        assert torch.equal(p.ids, book.owned_ids(r))
        assert torch.equal(p.ids, torch.nonzero(owner == r).view(-1))      # increasing global id
        assert bool((book.to_owner(p.ids) == r).all())
        assert torch.equal(book.to_local(p.ids), torch.arange(p.ids.numel()))
        assert torch.equal(p.node_feat, g.node_feat[p.ids])
    # each event in exactly one part: the part owning its source, in chronological order
    eids = torch.cat([p.eids for p in parts])
    assert torch.equal(torch.sort(eids).values, g.eid)
    for r, p in enumerate(parts):
        mine = torch.nonzero(owner[g.src] == r).view(-1)
        assert torch.equal(p.eids, g.eid[mine])
        assert torch.equal(p.edge_index, torch.stack([g.src[mine], g.dst[mine]]))
        assert torch.equal(p.edge_ts, g.t[mine]) and p.edge_ts.dtype == torch.float64
        assert bool((p.edge_ts[1:] >= p.edge_ts[:-1]).all())
        assert torch.equal(p.edge_attr, g.edge_attr[mine]) and torch.equal(p.labels, g.labels[mine])
        for m in MASKS:
            assert torch.equal(getattr(p, f"{m}_mask"), g.masks[m][mine]), m
        # the event directory: part r holds the entries of eids r, r + P, ..., each with
        # its owner and its row in the owner's events
        dealt = torch.arange(r, g.num_events, P)
        assert torch.equal(p.edge_book.owner.long(), owner[g.src[dealt]])
        for i, e in enumerate(dealt.tolist()):
            o = int(owner[g.src[e]])
            assert int(parts[o].eids[int(p.edge_book.row[i])]) == e
        q, idx = p.edge_book.holder(mine)
        assert torch.equal(q, mine % P) and torch.equal(idx, mine // P)
        # sample graph: exactly the events touching an owned node
        touch = torch.nonzero((owner[g.src] == r) | (owner[g.dst] == r)).view(-1)
        sg = p.sample_graph
        assert torch.equal(sg.eid, g.eid[touch]) and torch.equal(sg.src, g.src[touch])
        assert torch.equal(sg.dst, g.dst[touch]) and torch.equal(sg.t, g.t[touch])
    m = parts[0].manifest
    assert (m["algorithm"], m["num_parts"], m["num_nodes"], m["num_events"]) == (algo, P, g.num_nodes, g.num_events)
    assert (m["edge_feat_dim"], m["node_feat_dim"], m["fingerprint"]) == (3, 2, g.fingerprint())
    assert sum(m["stats"]["events_per_part"]) == g.num_events
    assert parts[1].stats == m["stats"] and parts[1].num_parts == P and parts[1].rank == 1


def test_partition_without_features(make_graph, tmp_path):
    g = make_graph()
    g.edge_attr = g.node_feat = g.labels = None
    p = partition_load(partition_graph(g, 2, "hash", tmp_path).parent, "hash", rank=0, world_size=2)
    assert p.edge_attr is None and p.node_feat is None and p.labels is None
    assert p.manifest["edge_feat_dim"] == 0


def test_existing_output_needs_force(toy_graph, tmp_path):
    path = partition_graph(toy_graph, 2, "random", tmp_path, seed=0)
    before = (path / "manifest.json").read_text()
    with pytest.raises(FileExistsError, match="--force"):
        partition_graph(toy_graph, 2, "random", tmp_path, seed=5)
    assert (path / "manifest.json").read_text() == before
    partition_graph(toy_graph, 2, "random", tmp_path, seed=5, force=True)
    assert json.loads((path / "manifest.json").read_text())["seed"] == 5
    assert sorted(x.name for x in path.parent.iterdir()) == ["random_2"]   # no temporaries left


def test_failed_write_leaves_nothing(toy_graph, tmp_path, monkeypatch):
    calls = []
    real = writer_mod.save_tensors

    def failing(path, obj):
        calls.append(path)
        if len(calls) == 4:
            raise OSError("disk full")
        real(path, obj)

    monkeypatch.setattr(writer_mod, "save_tensors", failing)
    with pytest.raises(OSError, match="disk full"):
        partition_graph(toy_graph, 2, "metis", tmp_path)
    assert list((tmp_path / "toy").iterdir()) == []


def test_failed_forced_rewrite_keeps_old_output(toy_graph, tmp_path, monkeypatch):
    path = partition_graph(toy_graph, 2, "hash", tmp_path)
    monkeypatch.setattr(writer_mod, "save_tensors", lambda p, o: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        partition_graph(toy_graph, 2, "hash", tmp_path, force=True)
    assert partition_load(path.parent, "hash", rank=1, world_size=2).num_parts == 2


@pytest.mark.parametrize("exchange", [True, False])
def test_forced_rewrite_keeps_a_loadable_version_at_every_moment(toy_graph, tmp_path,
                                                                 monkeypatch, exchange):
    """The swap of old and new: one RENAME_EXCHANGE where the system has it; else two
    renames, the old one put back if the second fails, and read from its aside name if
    the writer died in between. Leftovers of dead writers go at the next write."""
    import os
    from tgl_dist import integrity as storage  # atomic_dir lives there
    if not exchange:
        monkeypatch.setattr(storage, "_exchange", lambda a, b: False)
    path = partition_graph(toy_graph, 2, "hash", tmp_path, seed=0)
    partition_graph(toy_graph, 2, "hash", tmp_path, seed=3, force=True)
    assert partition_load(path.parent, "hash", rank=0, world_size=2).manifest["seed"] == 3
    assert sorted(x.name for x in path.parent.iterdir()) == ["hash_2"]
    if exchange:
        return
    real = os.replace
    calls = []

    def second_fails(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise OSError("EIO on the second rename")
        real(a, b)

    monkeypatch.setattr(storage.os, "replace", second_fails)
    with pytest.raises(OSError, match="EIO"):
        partition_graph(toy_graph, 2, "hash", tmp_path, seed=5, force=True)
    monkeypatch.setattr(storage.os, "replace", real)
    assert partition_load(path.parent, "hash", rank=0, world_size=2).manifest["seed"] == 3
    # the writer died between its renames: only the aside copy of a dead pid is left
    aside = path.parent / ".hash_2.old-999999999"
    real(path, aside)
    got = partition_load(path.parent, "hash", rank=1, world_size=2)
    assert got.manifest["seed"] == 3
    (path.parent / ".hash_2.tmp-999999999").mkdir()      # a killed writer's temporary
    partition_graph(toy_graph, 2, "hash", tmp_path, seed=7, force=True)
    assert sorted(x.name for x in path.parent.iterdir()) == ["hash_2"]
    assert partition_load(path.parent, "hash", rank=0, world_size=2).manifest["seed"] == 7


def test_event_ids_must_be_positions(toy_graph, tmp_path):
    sub = toy_graph.subgraph_events(torch.arange(toy_graph.num_events) >= 4)
    with pytest.raises(ValueError, match="event ids must be 0..E-1"):
        partition_graph(sub, 2, "hash", tmp_path)


def test_bad_num_parts(toy_graph, tmp_path):
    for bad in (0, -1, 2.0, toy_graph.num_nodes + 1):
        with pytest.raises(ValueError, match="num_parts"):
            partition_graph(toy_graph, bad, "hash", tmp_path)


# ------------------------------------------------------------------ refusals
@pytest.fixture
def written(toy_graph, tmp_path):
    return partition_graph(toy_graph, 2, "metis", tmp_path)


def test_written_from_checks_the_data_and_optionally_the_seed(written, toy_graph):
    """What the examples ask before reusing a partition: same data, and (DTDG, whose
    --seed covers partitioning) the same seed; else they write it again."""
    from tgl_dist.partition.storage import written_from
    fp = toy_graph.fingerprint()
    assert written_from(written, fp) and written_from(written, fp, seed=0)
    assert not written_from(written, fp, seed=1)
    assert not written_from(written, "0" * 16)
    assert not written_from(written.parent / "nope", fp)


def test_load_missing_folder_lists_existing(written):
    with pytest.raises(PartitionError, match=r"metis_3 not found .*partitions in .*: metis_2"):
        partition_load(written.parent, "metis", rank=0, world_size=3)
    with pytest.raises(PartitionError, match="random_2 not found"):
        partition_load(written.parent, "random", rank=0, world_size=2)
    with pytest.raises(PartitionError, match="does not exist"):
        partition_load(written.parent / "nope", "metis", rank=0, world_size=2)


def test_load_wrong_world_size(written):
    moved = written.parent / "metis_4"        # a folder whose manifest says P=2
    written.rename(moved)
    with pytest.raises(PartitionError, match="written for 2 parts, but the world size is 4"):
        partition_load(written.parent, "metis", rank=0, world_size=4)


def test_load_default_world_is_one(written):
    with pytest.raises(PartitionError, match="metis_1 not found"):
        partition_load(written.parent, "metis")


def test_load_refuses_the_layout_with_an_event_table_over_all_events(written):
    """A partition of format 1 (book.pt's event_owner [E], read by every rank) is refused
    with the commands that write it again."""
    m = json.loads((written / "manifest.json").read_text())
    m["format_version"] = 1
    (written / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PartitionError, match=r"format_version 1 is not supported.*"
                                             r"python -m tgl_dist.partition.*--repartition"):
        partition_load(written.parent, "metis", rank=0, world_size=2)


def test_load_unknown_format_version(written):
    mpath = written / "manifest.json"
    m = json.loads(mpath.read_text())
    m["format_version"] = 99
    mpath.write_text(json.dumps(m))
    with pytest.raises(PartitionError, match="format_version 99 is not supported"):
        partition_load(written.parent, "metis", rank=0, world_size=2)


def test_load_manifest_with_a_flipped_bit(written):
    """A byte that is not UTF-8 (a flipped top bit) is named, not a UnicodeDecodeError."""
    mpath = written / "manifest.json"
    data = bytearray(mpath.read_bytes())
    data[1] |= 0x80
    mpath.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match=r"manifest.json: corrupt manifest \(byte 1 is not UTF-8"):
        partition_load(written.parent, "metis", rank=0, world_size=2)


def test_load_truncated_file(written):
    f = written / "part_1" / "events.pt"
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(PartitionError, match=r"events.pt: size \d+ bytes, manifest says \d+ \(truncated"):
        partition_load(written.parent, "metis", rank=1, world_size=2)
    partition_load(written.parent, "metis", rank=0, world_size=2)   # rank 0's files are intact


@pytest.mark.parametrize("rel", ["part_0/nodes.pt", "book.pt", "part_0/sample_graph.pt"])
def test_load_corrupted_file(written, rel):
    f = written / rel
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with pytest.raises(PartitionError, match="checksum mismatch"):
        partition_load(written.parent, "metis", rank=0, world_size=2)


def test_load_missing_manifest(written):
    (written / "manifest.json").unlink()
    with pytest.raises(PartitionError, match="manifest.json not found"):
        partition_load(written.parent, "metis", rank=0, world_size=2)


def test_part_without_events(tmp_path):
    # hash, P=2: every source is even, so part 1 owns nodes but no events
    g = TemporalGraph(torch.tensor([0, 2, 4, 2]), torch.tensor([1, 3, 5, 5]),
                      torch.tensor([1.0, 2.0, 3.0, 4.0]), name="even")
    root = partition_graph(g, 2, "hash", tmp_path).parent
    p1 = partition_load(root, "hash", rank=1, world_size=2)
    assert p1.num_local_events == 0 and p1.edge_index.shape == (2, 0)
    assert p1.edge_book.num_parts == 2
    # its half of the directory (events 1 and 3) names part 0 as their owner
    assert p1.edge_book.owner.tolist() == [0, 0] and p1.edge_book.row.tolist() == [1, 3]
    assert p1.sample_graph.num_events == 4 and torch.equal(p1.ids, torch.tensor([1, 3, 5]))


def test_forced_write_over_a_file_leaves_no_temporary(toy_graph, tmp_path):
    out = tmp_path / "toy" / "hash_2"
    out.parent.mkdir()
    out.write_text("a stray file where the partition goes")
    path = partition_graph(toy_graph, 2, "hash", tmp_path, force=True)
    assert path == out and path.is_dir()
    assert sorted(p.name for p in out.parent.iterdir()) == ["hash_2"]
    assert partition_load(out.parent, "hash", rank=1, world_size=2).num_parts == 2


def _edit_manifest(folder, edit):
    mpath = folder / "manifest.json"
    m = json.loads(mpath.read_text())
    edit(m)
    mpath.write_text(json.dumps(m))


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.update(num_parts="two"), "key 'num_parts': expected a positive integer, got 'two'"),
    (lambda m: m.update(num_parts=True), "key 'num_parts': expected a positive integer"),
    (lambda m: m.update(num_nodes="40"), "key 'num_nodes': expected a non-negative integer"),
    (lambda m: m.update(files=[]), "key 'files': expected an object"),
    (lambda m: m["files"]["book.pt"].pop("sha256"), r"key 'files.book.pt': expected \{\"sha256\""),
    (lambda m: m["files"]["part_0/nodes.pt"].update(bytes="12"), "key 'files.part_0/nodes.pt'"),
])
def test_load_hand_edited_manifest(written, edit, message):
    _edit_manifest(written, edit)
    with pytest.raises(PartitionError, match=message) as e:
        partition_load(written.parent, "metis", rank=0, world_size=2)
    assert str(e.value).startswith(str(written / "manifest.json"))


@pytest.mark.parametrize("content", [b"\0" * 4096, "truncated"], ids=["zero-filled", "truncated"])
def test_load_unreadable_file_with_a_matching_checksum_says_corrupt(written, content):
    from tgl_dist.integrity import sha256_file
    f = written / "part_0" / "events.pt"
    f.write_bytes(content if isinstance(content, bytes) else f.read_bytes()[:300])
    _edit_manifest(written, lambda m: m["files"]["part_0/events.pt"].update(
        sha256=sha256_file(f), bytes=f.stat().st_size))
    with pytest.raises(PartitionError, match="events.pt: corrupt or truncated") as e:
        partition_load(written.parent, "metis", rank=0, world_size=2)
    assert "trusted" not in str(e.value) and "weights_only" not in str(e.value)


def test_load_refused_class_is_named_not_called_corrupt(written):
    import fractions
    from tgl_dist.integrity import sha256_file
    f = written / "part_0" / "events.pt"
    torch.save({"x": fractions.Fraction(1, 2)}, f)
    _edit_manifest(written, lambda m: m["files"]["part_0/events.pt"].update(
        sha256=sha256_file(f), bytes=f.stat().st_size))
    with pytest.raises(PartitionError, match="holds fractions.Fraction, which safe loading refuses"):
        partition_load(written.parent, "metis", rank=0, world_size=2)


def test_eval_negatives_are_dealt_to_the_owners_of_their_events(toy_graph, tmp_path):
    """``partition_graph(eval_negatives=...)``: each part keeps the rows of its own events
    of the split (int32, ``-1`` padding kept); a table that does not fit the graph is
    refused before anything is written."""
    from tgl_dist.data.negatives import EventNegatives
    g = toy_graph
    eid = g.eid[g.masks["test"]]
    dst = torch.stack([(eid * 7 + j) % g.num_nodes for j in range(3)], 1)
    dst[::4, 2] = -1                                         # short lists, padded
    tab = EventNegatives("test", eid, dst)
    folder = partition_graph(g, 2, "hash", tmp_path, eval_negatives={"test": tab})
    seen = []
    for r in range(2):
        p = partition_load(folder.parent, "hash", rank=r, world_size=2)
        got = p.eval_negatives["test"]
        assert set(p.eval_negatives) == {"test"} and got.dst.dtype == torch.int32
        assert torch.equal(got.eid, p.eids[p.test_mask])
        assert torch.equal(got.dst.long(), tab.rows(got.eid))
        seen.append(got.eid)
    assert torch.equal(torch.sort(torch.cat(seen)).values, eid)
    assert json.loads((folder / "manifest.json").read_text())["eval_negatives"] == \
        {"test": {"num_neg": 3, "events": int(eid.numel()), "source": None}}
    plain = partition_load(partition_graph(g, 1, "hash", tmp_path).parent, "hash", rank=0,
                           world_size=1)
    assert plain.eval_negatives == {}
    bad = {"rows": ({"test": EventNegatives("test", eid, dst[:-1])}, r"eid must be \[S\] and dst"),
           "order": ({"test": EventNegatives("test", eid.flip(0), dst)}, "increasing event ids"),
           "node": ({"test": EventNegatives("test", eid, dst + g.num_nodes)}, "node ids in"),
           "split": ({"later": tab}, "unknown split 'later'")}
    for name, (tables, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            partition_graph(g, 3, "hash", tmp_path / name, eval_negatives=tables)
        assert not (tmp_path / name).exists()
