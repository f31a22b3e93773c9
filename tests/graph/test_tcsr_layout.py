"""The T-CSR's packed rows: (node, time, eid) order against a brute-force reference, the
twin column, and the kernel's records sharing the T-CSR's storage (no second copy)."""
import pytest
import torch

from tgl_dist.graph import TemporalNeighborSampleGraph


def _reference(ev, N):
    """Rows of every node, sorted by (node, time, eid), as python tuples (node, t, eid, nbr)."""
    rows = []
    for s, d, t, e in zip(ev["src"].tolist(), ev["dst"].tolist(), ev["t"].tolist(), ev["eid"].tolist()):
        rows += [(s, t, e, d), (d, t, e, s)]
    return sorted(rows)


@pytest.mark.parametrize("times", ["int", "fraction", "sorted"])
@pytest.mark.parametrize("ids", ["arange", "shuffled"])
def test_rows_order_and_twins(times, ids):
    g = torch.Generator().manual_seed(len(times) * 10 + len(ids))
    N, E = 37, 500
    src, dst = torch.randint(0, N, (E,), generator=g), torch.randint(0, N, (E,), generator=g)
    src[:5] = dst[:5]   # self-loops: two rows of the same (node, time, eid)
    t = torch.randint(0, 30, (E,), generator=g).double()
    if times == "fraction":
        t = t / 4 + 0.125
    elif times == "sorted":
        t = t.sort().values
    eid = torch.randperm(E, generator=g) + 100 if ids == "shuffled" else torch.arange(E)
    ev = dict(src=src, dst=dst, t=t, eid=eid)
    tc = TemporalNeighborSampleGraph(ev, "full", num_nodes=N)
    node = torch.repeat_interleave(torch.arange(N), tc.indptr.diff())
    got = list(zip(node.tolist(), tc.ts.tolist(), tc.eid.tolist(), tc.nbr.tolist()))
    assert got == _reference(ev, N)
    assert tc.num_rows == 2 * E and tc.rec.shape == (2 * E, 4)
    # the times are the records' third column read as float64: no second copy
    assert tc.ts.dtype == torch.float64 and tc.ts.data_ptr() == tc.rec.data_ptr() + 16
    assert tc.ts.stride() == (4,) and tc.nbytes() == 32 * 2 * E + 8 * (N + 1)
    # twin: the other row of the same event, whose node is this row's neighbour
    tw = tc.twin
    assert bool((tw >= 0).all()) and torch.equal(tw[tw], torch.arange(2 * E))
    assert bool((tw != torch.arange(2 * E)).all())
    assert torch.equal(tc.eid[tw], tc.eid) and torch.equal(node[tw], tc.nbr)
    # before(): rows strictly before the query time
    q = torch.rand(400, generator=g, dtype=torch.float64) * 32 - 1
    nd = torch.randint(0, N, (400,), generator=g)
    s, e = tc.before(nd, q)
    for i in range(0, 400, 7):
        n = int(nd[i])
        rows = [r for r in range(int(tc.indptr[n]), int(tc.indptr[n + 1])) if float(tc.ts[r]) < float(q[i])]
        assert int(s[i]) == int(tc.indptr[n]) and int(e[i]) - int(s[i]) == len(rows)


def test_kernel_records_share_the_tcsr_storage():
    from tgl_dist.sampling._ckernel import records
    g = torch.Generator().manual_seed(3)
    N, E = 50, 2000
    ev = dict(src=torch.randint(0, N, (E,), generator=g), dst=torch.randint(0, N, (E,), generator=g),
              t=torch.randint(0, 100, (E,), generator=g).double(), eid=torch.arange(E))
    tc = TemporalNeighborSampleGraph(ev, "full", num_nodes=N)
    before = tc.nbytes()
    r = records(tc)
    assert r.rec.data_ptr() == tc.rec.data_ptr() and tc.ts.data_ptr() == tc.rec.data_ptr() + 16
    assert r.indptr.data_ptr() == tc.indptr.data_ptr()
    assert tc.nbr.data_ptr() == tc.rec.data_ptr() and tc.eid.data_ptr() == tc.rec[:, 1].data_ptr()
    assert r.nbytes() == 8 * N and tc.nbytes() == before
    # the structure: 32-byte records per row (the times inside them), plus indptr
    assert before == 2 * E * 32 + 8 * (N + 1)
