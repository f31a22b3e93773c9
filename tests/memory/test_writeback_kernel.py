"""The compiled write-back of a world of one (tgl_dist/kernels/writeback.c) writes the same
bits as SharedMailBox's torch operators, and refuses bad rows before writing anything."""
import pytest
import torch

from tgl_dist.memory import SharedMailBox, _writeback
from tgl_dist.sampling.block import Roots

LIB = _writeback.KERNEL.get()
needs_kernel = pytest.mark.skipif(LIB is None, reason="TGL_DIST_NO_KERNEL=1 or no C compiler: the write-back kernel "
                                  "cannot be built (the mailbox uses its torch path)")
N, D_MEM = 15, 6
STATE = ("memory", "memory_ts", "mailbox", "mail_ts", "next_mail_pos")


def _step(g, step, B, d_e, emb_dim, strided):
    src, dst = torch.randint(0, N, (B,), generator=g), torch.randint(0, N, (B,), generator=g)
    # times not sorted inside the step, with ties: the latest wins, ties to the later occurrence
    t = (step * 10 + torch.randint(0, 4, (B,), generator=g)).double()
    neg = torch.randint(0, N, (B,), generator=g)
    roots = Roots(nodes=torch.cat([src, dst, neg]), ts=torch.cat([t, t, t]),
                  eids=torch.arange(B) + step * B, src=src, dst=dst, t=t)
    R = 3 * B
    mem = torch.randn(R, 2 * D_MEM if strided else D_MEM, generator=g)
    mem = mem[:, ::2] if strided else mem                    # rows with a column stride of 2
    emb = torch.randn(R, emb_dim, generator=g) if emb_dim else None
    ef = torch.randn(B, d_e, generator=g) if d_e else None
    return roots, mem, emb, ef


@needs_kernel
@pytest.mark.parametrize("K", [1, 3])
@pytest.mark.parametrize("time_delta", ["mail", "query"])
@pytest.mark.parametrize("d_e,dyrep,strided", [(0, False, False), (4, False, False),
                                               (3, True, False), (0, False, True)])
def test_kernel_writes_the_bits_of_the_torch_path(K, time_delta, d_e, dyrep, strided):
    p = dict(dim_out=D_MEM, mailbox_size=K, deliver_to="self", mail_combine="last",
             time_delta=time_delta)
    a, b = SharedMailBox(N, p, d_e), SharedMailBox(N, p, d_e)
    g = torch.Generator().manual_seed(7)
    for step in range(6):
        B = 11
        roots, mem, emb, ef = _step(g, step, B, d_e, D_MEM if dyrep else 0, strided)
        src, dst = torch.arange(B), torch.arange(B, 2 * B)
        a.update(mem, roots, src, dst, ef, emb, dyrep)                 # the kernel
        b._update_last_torch(mem, roots.nodes, roots.t, roots.eids,
                             torch.stack([src, dst], 1).view(-1), torch.stack([dst, src], 1).view(-1),
                             None if ef is None else ef.float(), emb if dyrep else mem)
        for k in STATE:
            assert torch.equal(getattr(a, k), getattr(b, k)), (step, k)
    assert a.memory.abs().sum() > 0 and a.mail_ts.max() > 0


@needs_kernel
def test_kernel_refuses_bad_rows_before_writing():
    mb = SharedMailBox(N, dict(dim_out=D_MEM), 0)
    before = {k: getattr(mb, k).clone() for k in STATE}
    own = torch.tensor([0, 1, 2, 3])
    t = torch.tensor([1.0, 2.0], dtype=torch.float64)
    s = torch.randn(4, D_MEM)
    with pytest.raises(IndexError, match="node row outside"):
        _writeback.update_last(LIB, mb, torch.tensor([0, 1, 2, N]), own, own, t, s, s, None)
    with pytest.raises(IndexError, match="root row"):
        _writeback.update_last(LIB, mb, torch.tensor([0, 1, 2, 3]), own + 1, own, t, s, s, None)
    with pytest.raises(ValueError, match="2 occurrences per event"):
        _writeback.update_last(LIB, mb, own, own, own, t[:1], s, s, None)
    for k in STATE:
        assert torch.equal(getattr(mb, k), before[k]), k


def test_without_the_kernel_the_torch_path_writes_the_same(monkeypatch):
    p = dict(dim_out=D_MEM, mailbox_size=1, deliver_to="self", mail_combine="last",
             time_delta="mail")
    a, b = SharedMailBox(N, p, 2), SharedMailBox(N, p, 2)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        roots, mem, _, ef = _step(g, step, 9, 2, 0, False)
        src, dst = torch.arange(9), torch.arange(9, 18)
        a.update(mem, roots, src, dst, ef)
        monkeypatch.setenv("TGL_DIST_NO_KERNEL", "1")
        b.update(mem, roots, src, dst, ef)
        monkeypatch.delenv("TGL_DIST_NO_KERNEL")
        for k in STATE:
            assert torch.equal(getattr(a, k), getattr(b, k)), (step, k)
