import torch
import pytest

from tgl_dist.dist import PartitionBook, fetch_rows, push_rows, push_then_fetch, AllToAllV, all_gather_v
from tgl_dist.testing import run_distributed


def test_partition_book_round_trip():
    owner = torch.tensor([1, 0, 2, 1, 0, 0, 2])
    book = PartitionBook(owner)
    assert book.num_parts == 3
    for r in range(3):
        ids = book.owned_ids(r)
        assert torch.equal(book.to_owner(ids), torch.full_like(ids, r))
        assert torch.equal(book.to_local(ids), torch.arange(ids.numel()))
    assert sorted(torch.cat([book.owned_ids(r) for r in range(3)]).tolist()) == list(range(7))
    # a last part that owns nothing still counts (a world of 2 where rank 1 holds no node)
    empty = PartitionBook(torch.tensor([0, 0, 0]), num_parts=2)
    assert empty.num_parts == 2 and empty.owned_ids(1).numel() == 0
    empty.check_world(2)


def test_partition_book_lookup_shapes_and_bad_ids():
    book = PartitionBook(torch.tensor([1, 0, 2, 1, 0, 0, 2]))
    ids = torch.tensor([[6, 0], [3, 1]])            # any shape in, the same shape out
    assert torch.equal(book.to_owner(ids), torch.tensor([[2, 1], [1, 0]]))
    assert torch.equal(book.to_local(ids), torch.tensor([[1, 0], [1, 0]]))
    assert book.to_local(torch.tensor(4)).shape == ()
    assert book.to_owner(torch.empty(0, dtype=torch.long)).numel() == 0
    for bad in (-1, 7):    # -1 must not wrap to the last node's entry
        with pytest.raises(IndexError):
            book.to_local(torch.tensor([0, bad]))
        with pytest.raises(IndexError):
            book.to_owner(torch.tensor([bad]))


def _fetch_worker():
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    owner = torch.tensor([0, 1, 0, 1, 1, 0])
    book = PartitionBook(owner)
    table = book.owned_ids(ctx.rank).float().view(-1, 1) * 10  # row value = 10 * global id
    ids = torch.tensor([5, 1, 1, 2]) if ctx.rank == 0 else torch.tensor([], dtype=torch.long)
    rows = fetch_rows(book.to_owner(ids), book.to_local(ids), lambda r: table[r])
    # push: each rank pushes (id, value) to owners
    pids = torch.tensor([3, 0]) if ctx.rank == 0 else torch.tensor([4])
    loc, val = push_rows(book.to_owner(pids), book.to_local(pids), pids.float())
    # differentiable all-to-all: rank r sends one row to each rank
    x = torch.full((2, 3), float(ctx.rank + 1), requires_grad=True)
    y = AllToAllV.apply(x, [1, 1], [1, 1], None)
    (y * torch.arange(2).view(2, 1).float()).sum().backward()
    g = all_gather_v(torch.arange(ctx.rank + 1))
    # uneven counts: rank 0 sends 1 row to itself and 2 to rank 1, rank 1 one to itself;
    # each received row is weighted by its position + 1 on the receiving rank
    send, recv = ([1, 2], [1, 0]) if ctx.rank == 0 else ([0, 1], [2, 1])
    u = torch.arange(sum(send) * 2, dtype=torch.float32).view(-1, 2).requires_grad_()
    v = AllToAllV.apply(u, send, recv, None)
    (v * torch.arange(1, v.size(0) + 1).float().view(-1, 1)).sum().backward()
    return (rows.view(-1).tolist(), sorted(zip(loc.tolist(), val.tolist())), x.grad.tolist(),
            g.tolist(), v.tolist(), u.grad[:, 0].tolist())


@pytest.mark.distributed
def test_fetch_push_two_ranks():
    r0, r1 = run_distributed(_fetch_worker, 2)
    assert r0[0] == [50.0, 10.0, 10.0, 20.0]
    assert r1[0] == []
    # rank 0 owns 0,2,5 ; rank 1 owns 1,3,4 (local rows 0,1,2)
    assert r0[1] == [(0, 0.0)]
    assert r1[1] == [(1, 3.0), (2, 4.0)]
    # y[j] on every rank came from rank j and is weighted by j: rank 0's rows get 0, rank 1's get 1
    assert r0[2] == [[0.0] * 3, [0.0] * 3]
    assert r1[2] == [[1.0] * 3, [1.0] * 3]
    assert r0[3] == r1[3] == [0, 0, 1]
    assert r0[4] == [[0.0, 1.0]] and r1[4] == [[2.0, 3.0], [4.0, 5.0], [0.0, 1.0]]
    assert r0[5] == [1.0, 1.0, 2.0] and r1[5] == [3.0]


def _push_fetch_worker(world_of_one=False):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    W = 1 if world_of_one else ctx.world_size
    owner = torch.tensor([0, 1, 0, 1, 1, 0]) % W
    book = PartitionBook(owner)
    out = []
    for fused in (False, True):
        table = book.owned_ids(ctx.rank if W > 1 else 0).float().view(-1, 1).repeat(1, 3)
        applied = []

        def apply(rows):            # rows [n, 4]: local row, then 3 values
            applied.append(rows[:, 0].tolist())
            table[rows[:, 0].long()] = rows[:, 1:]

        # rank 0 pushes 3 rows (to both ranks), rank 1 none; uneven requests, repeats
        if ctx.rank == 0:
            pids = torch.tensor([3, 0, 4])
            ids = torch.tensor([5, 1, 1, 2, 3])
        else:
            pids, ids = torch.tensor([], dtype=torch.long), torch.tensor([4])
        push = torch.cat([book.to_local(pids).float().view(-1, 1),
                          (pids.float() * 100).view(-1, 1).repeat(1, 3)], 1)
        serve = lambda r: table[r] * 1.0  # noqa: E731
        if fused:
            rows = push_then_fetch(book.to_owner(pids), push, book.to_owner(ids),
                                   book.to_local(ids), apply, serve)
        else:
            got = push_rows(book.to_owner(pids), book.to_local(pids), push)[1]
            apply(got)
            rows = fetch_rows(book.to_owner(ids), book.to_local(ids), serve)
        out.append((rows.tolist(), applied))
    return out


@pytest.mark.distributed
def test_push_then_fetch_is_push_rows_then_fetch_rows():
    # one all-to-all fewer for the counts and one for the payload; each owner applies what
    # it was pushed before it serves, so the fetched rows include the pushed values
    for plain, fused in run_distributed(_push_fetch_worker, 2):
        assert fused == plain
    r0, r1 = run_distributed(_push_fetch_worker, 2)
    assert r0[1][0] == [[5.0] * 3, [1.0] * 3, [1.0] * 3, [2.0] * 3, [300.0] * 3]
    assert r1[1][0] == [[400.0] * 3]
    single = _push_fetch_worker(world_of_one=True)
    assert single[0] == single[1]


def _async_worker():
    from tgl_dist import DistributedContext
    from tgl_dist.dist import all_reduce_async
    ctx = DistributedContext.init()
    big = torch.arange(200_000, dtype=torch.float32) * (ctx.rank + 1)
    pending = all_reduce_async(big)
    # other collectives on the same group while the all-reduce is in flight
    owner = torch.tensor([0, 1, 0, 1])
    book = PartitionBook(owner)
    table = book.owned_ids(ctx.rank).float() * 10
    ids = torch.tensor([3, 0, 1, 2])
    rows = fetch_rows(book.to_owner(ids), book.to_local(ids), lambda r: table[r])
    total = pending.wait()
    assert total is big
    again = pending.wait()  # a second wait is a no-op
    return rows.tolist(), bool(torch.equal(total, torch.arange(200_000, dtype=torch.float32) * 3)), \
        bool(torch.equal(again, total))


@pytest.mark.distributed
def test_async_all_reduce_beside_other_collectives():
    for rows, summed, same in run_distributed(_async_worker, 2):
        assert rows == [30.0, 0.0, 10.0, 20.0] and summed and same


def test_async_all_reduce_world_of_one():
    from tgl_dist.dist import all_reduce_async
    x = torch.ones(3)
    assert all_reduce_async(x).wait() is x


def _edge_worker():
    from tgl_dist import DistributedContext
    from tgl_dist.dist.exchange import Plan, all_reduce_
    ctx = DistributedContext.init(use_gpu=False)
    out = {}
    base = torch.full((3, 4), -1.0)
    base[:, ::2] = float(ctx.rank + 1)
    all_reduce_(base[:, ::2])            # a strided view: reduce it, leave the rest alone
    out["view"] = base.tolist()
    try:
        Plan(torch.tensor([0, 2]))       # rank 2 does not exist in a world of two
    except ValueError as e:
        out["plan"] = str(e)
    rows = torch.zeros(0) if ctx.rank == 0 else torch.zeros(2, 3)
    try:
        all_gather_v(rows)
    except ValueError as e:
        out["shape"] = str(e)
    return out


@pytest.mark.distributed
def test_collectives_refuse_or_handle_what_used_to_corrupt_or_abort():
    """A strided all-reduce used to reduce the storage's first elements (wrong sums, a
    neighbour's columns overwritten); a destination rank outside the group and rows of
    another shape aborted inside gloo. Each rank must raise alike, or no rank does."""
    for out in run_distributed(_edge_worker, 2):
        assert out["view"] == [[3.0, -1.0, 3.0, -1.0]] * 3
        assert out["plan"] == "destination rank 2 is outside the group's ranks 0..1"
        assert out["shape"] == "all_gather_v: the ranks' rows differ in shape (rank 0: []; rank 1: [3])"


def test_all_gather_v_world_of_one_is_a_copy_and_refuses_scalars():
    x = torch.arange(3.0)
    y = all_gather_v(x)
    y[0] = 9.0
    assert x[0] == 0.0                    # as with several ranks: not the caller's tensor
    with pytest.raises(ValueError, match="needs at least one dimension"):
        all_gather_v(torch.tensor(5.0))


def test_a_launched_process_without_a_group_is_warned_once(monkeypatch, caplog):
    """torchrun without DistributedContext.init(): each process would run alone, silently."""
    import tgl_dist.dist.exchange as ex
    from tgl_dist.dist import world
    monkeypatch.setattr(ex, "_warned_no_group", False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with caplog.at_level("WARNING", logger="tgl_dist.dist.exchange"):
        assert world() == (0, 1)
    assert caplog.text == ""                       # a plain world of one: nothing to say
    monkeypatch.setenv("WORLD_SIZE", "2")
    with caplog.at_level("WARNING", logger="tgl_dist.dist.exchange"):
        assert world() == (0, 1) and world() == (0, 1)
    assert caplog.text.count("WORLD_SIZE=2 but no process group is initialised") == 1
    assert "DistributedContext.init()" in caplog.text


def test_event_book_holders():
    """Eid e's directory entry is entry e div P of rank e mod P; a share of the wrong
    length and an eid outside [0, E) are refused."""
    from tgl_dist.dist import EventBook, directory_size
    assert [directory_size(10, 4, q) for q in range(4)] == [3, 3, 2, 2]
    assert [directory_size(2, 4, q) for q in range(4)] == [1, 1, 0, 0]   # empty shares
    owner = torch.tensor([1, 0, 1], dtype=torch.int32)
    book = EventBook(10, 4, 1, owner, torch.tensor([4, 7, 5]))        # eids 1, 5, 9
    q, i = book.holder(torch.tensor([0, 1, 2, 4, 5, 9]))
    assert q.tolist() == [0, 1, 2, 0, 1, 1] and i.tolist() == [0, 0, 0, 1, 1, 2]
    assert book.serve(torch.tensor([2, 0])).tolist() == [[1, 5], [1, 4]]
    with pytest.raises(ValueError, match=r"event ids must be in \[0, 10\)"):
        book.holder(torch.tensor([10]))
    with pytest.raises(ValueError, match="must hold its 3 entries"):
        EventBook(10, 4, 1, owner[:2], torch.tensor([4, 7]))
