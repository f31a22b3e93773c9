"""SharedMailBox: duplicates, ring buffer, mean, and 2 ranks == 1 process exactly."""
import pytest
import torch

from tgl_dist.dist import PartitionBook
from tgl_dist.memory import SharedMailBox, latest_per_key
from tgl_dist.sampling.block import Block, Roots
from tgl_dist.testing import run_distributed

N, D_MEM, D_E = 12, 4, 2
OWNER = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0])


def test_latest_per_key_ties_and_order():
    keys = torch.tensor([4, 2, 4, 2, 7])
    ts = torch.tensor([1.0, 5.0, 1.0, 3.0, 0.0])
    assert latest_per_key(keys, ts).tolist() == [1, 2, 4]
    assert latest_per_key(torch.zeros(0, dtype=torch.long), torch.zeros(0)).numel() == 0


def _mb(book=None, n=N, K=1, deliver="self", combine="last"):
    p = dict(dim_out=D_MEM, mailbox_size=K, deliver_to=deliver, mail_combine=combine)
    return SharedMailBox(n, p, D_E, partition_book=book)


def test_update_picks_latest_event_and_interleaves_ties():
    mb = _mb()
    # events at the same time t=1: (0 -> 1) then (1 -> 2): node 1 is v_1 then u_2; u_2 is later
    roots = Roots(nodes=torch.tensor([0, 1, 1, 2]), ts=torch.ones(4, dtype=torch.float64),
                  eids=torch.arange(2), src=torch.tensor([0, 1]), dst=torch.tensor([1, 2]),
                  t=torch.ones(2, dtype=torch.float64))
    mem = torch.arange(16.0).view(4, 4)
    ef = torch.tensor([[10.0, 11.0], [20.0, 21.0]])
    mb.update(mem, roots, torch.tensor([0, 1]), torch.tensor([2, 3]), ef)
    assert mb.mailbox[1, 0].tolist() == mem[1].tolist() + mem[3].tolist() + [20.0, 21.0]
    assert mb.mailbox[2, 0].tolist() == mem[3].tolist() + mem[1].tolist() + [20.0, 21.0]
    assert mb.mail_ts[:3, 0].tolist() == [1.0, 1.0, 1.0]
    assert mb.memory_ts[:3].tolist() == [1.0, 1.0, 1.0]
    # memory of node 1: the later occurrence u_2 (row 1) wins the tie
    assert mb.memory[1].tolist() == mem[1].tolist()


@pytest.mark.parametrize("K,time_delta,use_emb", [(1, "query", False), (3, "query", False),
                                                  (1, "mail", False), (1, "mail", True)])
def test_update_equals_the_explicit_api_sequence(K, time_delta, use_emb):
    """update()'s route for deliver_to='self', mail_combine='last' (one latest-occurrence
    pass) writes exactly what get_update_memory + get_update_mail +
    set_mailbox_all_to_all write, with repeated nodes and tied times."""
    p = dict(dim_out=D_MEM, mailbox_size=K, deliver_to="self", mail_combine="last",
             time_delta=time_delta)
    a, b = SharedMailBox(N, p, D_E), SharedMailBox(N, p, D_E)
    g = torch.Generator().manual_seed(3)
    for step in range(5):
        B = 9
        src, dst = torch.randint(0, N, (B,), generator=g), torch.randint(0, N, (B,), generator=g)
        t = (step * 10 + torch.randint(0, 3, (B,), generator=g).sort().values).double()
        neg = torch.randint(0, N, (B,), generator=g)
        nodes = torch.cat([src, dst, neg])
        roots = Roots(nodes=nodes, ts=torch.cat([t, t, t]), eids=torch.arange(B), src=src,
                      dst=dst, t=t)
        mem, emb = torch.randn(3 * B, D_MEM, generator=g), torch.randn(3 * B, D_MEM, generator=g)
        ef = torch.randn(B, D_E, generator=g)
        sp, dp = torch.arange(B), torch.arange(B, 2 * B)
        a.update(mem, roots, sp, dp, ef, emb if use_emb else None, use_emb)
        pos = torch.stack([sp, dp], 1).view(-1)
        i_m, m, mts = b.get_update_memory(nodes[pos], mem[pos], t.repeat_interleave(2))
        i_l, ml, mlts = b.get_update_mail(nodes, sp, dp, t, ef, mem, emb if use_emb else None,
                                          False, use_emb)
        b.set_mailbox_all_to_all(i_m, m, mts, None, None)
        b.set_mailbox_all_to_all(i_l, None, None, ml, mlts)
        for k in ("memory", "memory_ts", "mailbox", "mail_ts", "next_mail_pos"):
            assert torch.equal(getattr(a, k), getattr(b, k)), (step, k)
    assert float(a.mailbox.abs().sum()) > 0


def test_ring_buffer_and_mean():
    mb = _mb(K=2)
    idx = torch.tensor([3, 3, 5])
    mail = torch.arange(30.0).view(3, 10)
    for step in range(3):
        i, m, ts = mb.get_update_mail(idx, torch.tensor([0]), torch.tensor([2]),
                                      torch.tensor([float(step)]), torch.zeros(1, 2),
                                      torch.full((3, 4), float(step)))
        mb.set_mailbox_all_to_all(i, None, None, m, ts)
    assert mb.next_mail_pos[3].item() == 1
    assert mb.mail_ts[3].tolist() == [2.0, 1.0]
    mbm = _mb(combine="mean")
    mbm.set_mailbox_all_to_all(torch.tensor([4, 4, 6]), None, None, torch.tensor(
        [[1.0] * 10, [3.0] * 10, [5.0] * 10]), torch.tensor([1.0, 3.0, 2.0]), reduce_Op="mean")
    assert mbm.mailbox[4, 0].tolist() == [2.0] * 10 and mbm.mail_ts[4, 0].item() == 2.0
    assert mbm.mailbox[6, 0].tolist() == [5.0] * 10


def test_update_with_mean_mails_and_reset():
    # update() with mail_combine='mean' (the route run_epoch takes): node 0 is the source
    # of events at t=1 and t=2, so its mail is the mean of both events' mails
    mb = _mb(K=2, combine="mean")
    roots = Roots(nodes=torch.tensor([0, 0, 1, 2]), ts=torch.tensor([1.0, 2.0, 1.0, 2.0]).double(),
                  eids=torch.arange(2), src=torch.tensor([0, 0]), dst=torch.tensor([1, 2]),
                  t=torch.tensor([1.0, 2.0]).double())
    mem = torch.arange(16.0).view(4, 4)
    ef = torch.tensor([[10.0, 11.0], [20.0, 21.0]])
    mb.update(mem, roots, torch.tensor([0, 1]), torch.tensor([2, 3]), ef)
    want0 = (torch.cat([mem[0], mem[2], ef[0]]) + torch.cat([mem[1], mem[3], ef[1]])) / 2
    assert torch.equal(mb.mailbox[0, 0], want0) and mb.mail_ts[0, 0].item() == 1.5
    assert torch.equal(mb.mailbox[2, 0], torch.cat([mem[3], mem[1], ef[1]]))
    assert mb.next_mail_pos[:3].tolist() == [1, 1, 1]
    assert mb.memory[0].tolist() == mem[1].tolist() and mb.memory_ts[0].item() == 2.0
    # reset(): every part of the state is zero again (an epoch starts from nothing)
    mb.reset()
    for k, v in mb.state_dict().items():
        assert not v.any(), k


def test_bad_arguments():
    with pytest.raises(ValueError, match="mail_combine"):
        _mb(combine="first")
    with pytest.raises(ValueError, match="owned"):
        _mb(book=PartitionBook(torch.zeros(N, dtype=torch.long)), n=5)
    with pytest.raises(ValueError, match="parts"):
        _mb(book=PartitionBook(OWNER), n=6)
    with pytest.raises(ValueError, match="reduce_Op"):
        _mb().set_mailbox_all_to_all(torch.tensor([0]), None, None, None, None, reduce_Op="sum")
    # the reference's ts = roots.ts (one per root: 3B with negatives) used to fail with an
    # IndexError deep inside the dedup; the times of the events are roots.t
    B = 2
    with pytest.raises(ValueError, match=r"one entry per positive event; got 2, 2, 6 .*roots.t"):
        _mb().get_update_mail(torch.arange(3 * B), torch.tensor([0, 1]), torch.tensor([2, 3]),
                              torch.zeros(3 * B, dtype=torch.float64), torch.zeros(B, D_E),
                              torch.zeros(3 * B, D_MEM))


# ---------------------------------------------------------------- 2 ranks vs 1 process
def _stream(steps=6, per_rank=5, ties=True, seed=0):
    """Per step: the window's events in stream order (global ids ``eids``), and the
    random half of them each rank holds (in stream order, as the loader gives them).

    An event is ``(src, dst, t, edge_feat, neighbours of src, neighbours of dst, eid)``.
    """
    g = torch.Generator().manual_seed(seed)
    out, E = [], 2 * per_rank
    for s in range(steps):
        src = torch.randint(0, N, (E,), generator=g)
        dst = torch.randint(0, N, (E,), generator=g)
        if ties:   # many events share a time, across ranks too
            t = s * 10 + torch.randint(0, 3, (E,), generator=g).sort().values.double()
        else:
            t = s * 10 + torch.arange(E).double() * 0.1
        ef = torch.randn(E, D_E, generator=g)
        nb_src = torch.randint(0, N, (E, 2), generator=g)
        nb_dst = torch.randint(0, N, (E, 2), generator=g)
        window = (src, dst, t, ef, nb_src, nb_dst, s * E + torch.arange(E))
        perm = torch.randperm(E, generator=g)
        held = [perm[:per_rank].sort().values, perm[per_rank:].sort().values]
        out.append((window, [tuple(x[h] for x in window) for h in held]))
    return out


def _fake_updater(mem, mem_ts, mail, ts):
    """A deterministic 'memory updater': a fixed function of the fetched state."""
    m = mail.reshape(mail.size(0), -1)
    return torch.tanh(mem + 0.5 * m[:, :D_MEM] - 0.25 * m[:, D_MEM:2 * D_MEM]
                      + 0.01 * (ts - mem_ts).float().view(-1, 1) + m[:, -1:])


def _run_steps(mb, events_per_step, deliver):
    for src, dst, t, ef, nb_src, nb_dst, eids in events_per_step:
        B = src.numel()
        nodes = torch.cat([src, dst])
        ts = torch.cat([t, t])
        nb = torch.cat([nb_src, nb_dst])                   # 2 neighbours per positive root
        M = nb.numel()
        e_dst = torch.arange(2 * B).repeat_interleave(2)
        block = Block({"ID": torch.cat([nodes, nb.reshape(-1)]),
                       "ts": torch.cat([ts, ts[e_dst]])},
                      {"dt": torch.ones(M)}, torch.stack([torch.arange(2 * B, 2 * B + M), e_dst]),
                      2 * B)
        mb.prepare_input([block])
        sd = block.srcdata
        s_hat = _fake_updater(sd["mem"], sd["mem_ts"], sd["mail"], sd["ts"])
        roots = Roots(nodes=nodes, ts=ts, eids=eids, src=src, dst=dst, t=t)
        mb.update(s_hat, roots, torch.arange(B), torch.arange(B, 2 * B), ef,
                  block=block if deliver == "neighbors" else None)


def _dist_worker(K, deliver, ties, combine="last"):
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    book = PartitionBook(OWNER)
    mb = _mb(book, n=int(book.counts[ctx.rank]), K=K, deliver=deliver, combine=combine)
    _run_steps(mb, [held[ctx.rank] for _, held in _stream(ties=ties)], deliver)
    # numpy arrays pickle by value (tensors would travel as shared-memory handles)
    return tuple(x.numpy().copy() for x in (book.owned_ids(ctx.rank), mb.memory, mb.memory_ts,
                                            mb.mailbox, mb.mail_ts, mb.next_mail_pos))


def _reference(K, deliver, ties, combine="last"):
    """One process, each step the whole window."""
    mb = _mb(K=K, deliver=deliver, combine=combine)
    _run_steps(mb, [window for window, _ in _stream(ties=ties)], deliver)
    return mb


@pytest.mark.distributed
@pytest.mark.parametrize("K,deliver,ties,combine", [
    (1, "self", True, "last"), (3, "self", True, "last"), (2, "neighbors", False, "last"),
    (1, "neighbors", True, "last"), (1, "self", True, "mean"), (2, "neighbors", True, "mean")])
def test_two_ranks_equal_one_process(K, deliver, ties, combine):
    """Exactly one process's state, also when events held by different ranks share a
    timestamp (the owners break ties by stream position, not by sender rank) and for
    'mean' mails (the owners sum them in stream order, as one process does)."""
    ref = _reference(K, deliver, ties, combine)
    assert float(ref.memory.abs().sum()) > 0
    res = run_distributed(_dist_worker, 2, K, deliver, ties, combine)
    seen = torch.zeros(N, dtype=torch.bool)
    for arrays in res:
        ids, mem, mts, mail, mailts, pos = map(torch.from_numpy, arrays)
        assert mem.size(0) == ids.numel() == int((OWNER == (0 if not seen.any() else 1)).sum())
        assert torch.equal(mem, ref.memory[ids])
        assert torch.equal(mts, ref.memory_ts[ids])
        assert torch.equal(mail, ref.mailbox[ids])
        assert torch.equal(mailts, ref.mail_ts[ids])
        assert torch.equal(pos, ref.next_mail_pos[ids])
        seen[ids] = True
    assert bool(seen.all())


def _visibility_worker():
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    book = PartitionBook(OWNER)
    mb = _mb(book, n=int(book.counts[ctx.rank]))
    before = mb.read(torch.arange(N))[1].clone()
    if ctx.rank == 0:  # rank 0 alone writes node 2 (owned by rank 1) and node 0 (its own)
        idx, mem, ts = torch.tensor([0, 2]), torch.ones(2, D_MEM), torch.tensor([7.0, 8.0])
    else:
        idx, mem, ts = torch.zeros(0, dtype=torch.long), torch.zeros(0, D_MEM), torch.zeros(0)
    mb.set_mailbox_all_to_all(idx, mem, ts, None, None)
    after = mb.read(torch.arange(N))[1]
    return before.tolist(), after.tolist()


@pytest.mark.distributed
def test_writes_of_step_k_visible_to_every_rank_next_step():
    for before, after in run_distributed(_visibility_worker, 2):
        assert before == [0.0] * N
        assert after[0] == 7.0 and after[2] == 8.0 and sum(after) == 15.0


def _edge_cases_worker():
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    own = torch.tensor([0, 1, 0, 1])
    book = PartitionBook(own)
    # (a) nobody asks rank 1 for anything: it serves an empty request
    mb = SharedMailBox(2, dict(dim_out=4), 2, partition_book=book)
    read = mb.read(torch.tensor([0, 2]))[1].numpy().copy()
    # (b) an odd payload width (d_e = 1) and exactly one row for each owner
    mb = SharedMailBox(2, dict(dim_out=4), 1, partition_book=book)
    if ctx.rank == 0:   # one event 0 -> 1 at t=5
        src, dst, t = torch.tensor([0]), torch.tensor([1]), torch.tensor([5.0], dtype=torch.float64)
    else:
        src = dst = torch.zeros(0, dtype=torch.long)
        t = torch.zeros(0, dtype=torch.float64)
    B = src.numel()
    roots = Roots(torch.cat([src, dst]), torch.cat([t, t]), torch.arange(B), src, dst, t)
    mb.update(torch.ones(2 * B, 4), roots, torch.arange(B), torch.arange(B, 2 * B),
              torch.full((B, 1), 7.0))
    return read, mb.memory_ts.numpy().copy(), mb.mailbox[:, 0, -1].numpy().copy()


@pytest.mark.distributed
def test_exchange_edge_cases_empty_request_and_one_odd_width_row():
    for rank, (read, mts, feat) in enumerate(run_distributed(_edge_cases_worker, 2)):
        assert read.tolist() == [0.0, 0.0]
        assert mts.tolist() == [5.0, 0.0]          # node 0 (rank 0) and node 1 (rank 1)
        assert feat.tolist() == [7.0, 0.0]
