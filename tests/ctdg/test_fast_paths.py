"""The attention layers' dispatched forward and the per-node memory ('time_delta: mail')
give the results of their direct formulations."""
import pytest
import torch

from blocks_util import make_batch
from tgl_dist.memory import SharedMailBox
from tgl_dist.ctdg import ConfigError, build_model, parse_config
from tgl_dist.nn import TemporalAttention, TGNAttention

CFG = {
    "sampling": {"layer": 1, "neighbor": [4], "strategy": "recent"},
    "memory": {"type": "node", "dim_out": 8, "dim_time": 4, "memory_update": "gru",
               "time_delta": "mail"},
    "gnn": {"arch": "transformer_attention", "layer": 1, "att_head": 2, "dim_time": 4},
    "train": {"dropout": 0.0, "att_dropout": 0.0},
}


@pytest.mark.parametrize("cls", [TemporalAttention, TGNAttention])
@pytest.mark.parametrize("dim_edge", [0, 3])
def test_attention_forward_equals_its_per_edge_reference(cls, dim_edge):
    torch.manual_seed(0)
    layer = cls(8, dim_edge, 4, 8, num_head=2).eval()
    _, mfgs, _ = make_batch(6, 30, [4], dim_edge=dim_edge, seed=1)
    b = mfgs[0]
    assert int(torch.bincount(b.edge_index[1], minlength=b.num_dst).min()) == 0
    h = torch.randn(b.num_src, 8, requires_grad=True)
    rows = None
    for use_rows in (False, True):
        if use_rows:  # distinct-row input: source i reads h[rows[i]]
            rows = torch.randint(0, 5, (b.num_src,))
            h = torch.randn(5, 8, requires_grad=True)
        res = []
        for fn in (layer, layer.reference):   # compiled on CPU float32 (when built), torch
            out = fn(b, h, rows)
            grads = torch.autograd.grad((out ** 2).sum(), [h] + list(layer.parameters()))
            res.append((out, grads))
        (o1, g1), (o2, g2) = res
        assert torch.allclose(o1, o2, atol=1e-5)
        for a, c in zip(g1, g2):
            assert torch.allclose(a, c, atol=1e-4, rtol=1e-4)


def test_mail_time_delta_is_per_node_and_stamps_memory_with_the_folded_mail():
    torch.manual_seed(0)
    cfg = parse_config(CFG)
    model = build_model(cfg).eval()
    roots, mfgs, meta = make_batch(8, 6, [4], seed=2)
    mb = SharedMailBox(6, cfg.memory, 0)
    mb.mailbox.normal_()
    mb.memory.normal_()
    mb.mail_ts[:, 0] = torch.arange(6, dtype=torch.float64) + 50
    mb.memory_ts[:] = torch.arange(6, dtype=torch.float64) + 10
    mb.prepare_input(mfgs)
    with torch.no_grad():
        out = model(mfgs, meta)
        # reference: the GRU cell on [mail || phi(mail_ts - memory_ts)] of each node
        upd = model.memory_updater
        cell = torch.nn.GRUCell(upd.dim_mail + upd.dim_time, upd.dim_memory)
        cell.weight_ih.copy_(upd.weight_ih), cell.weight_hh.copy_(upd.weight_hh)
        cell.bias_ih.copy_(upd.bias_ih), cell.bias_hh.copy_(upd.bias_hh)
        ids = roots.nodes
        phi = upd.time_enc(mb.mail_ts[ids, 0] - mb.memory_ts[ids])
        ref = cell(torch.cat([mb.mailbox[ids, 0], phi], 1), mb.memory[ids])
    assert torch.allclose(out.memory, ref, atol=1e-5)
    old_mail_ts = mb.mail_ts[:, 0].clone()
    mb.update(out.memory, roots, meta["src_pos_index"], meta["dst_pos_index"])
    written = torch.unique(torch.cat([roots.src, roots.dst]))
    # memory_ts = time of the mail folded into it; the new mail carries the event time
    assert torch.equal(mb.memory_ts[written], old_mail_ts[written])
    ends, times = torch.cat([roots.src, roots.dst]), roots.t.repeat(2)
    for n in written.tolist():
        assert float(mb.mail_ts[n, 0]) == float(times[ends == n].max())


@pytest.mark.parametrize("cell,time_delta", [("gru", "mail"), ("gru", "query"),
                                             ("rnn", "mail"), ("rnn", "query")])
def test_mails_that_start_with_the_memory_use_the_own_state_cell(monkeypatch, cell, time_delta):
    """TGN's mails begin with the receiver's memory (both written by the same update); the
    cell then reads that part from the memory with merged products. Same memory, loss and
    gradients as the cell on the whole mail."""
    from tgl_dist.memory import updaters
    from tgl_dist.ctdg import link_loss
    torch.manual_seed(0)
    cfg = parse_config({**CFG, "memory": {**CFG["memory"], "memory_update": cell,
                                          "time_delta": time_delta}})
    model = build_model(cfg)
    roots, mfgs, meta = make_batch(8, 6, [4], seed=2)
    mb = SharedMailBox(6, cfg.memory, 0)
    mb.memory.normal_()
    mb.mailbox.normal_()
    dm = mb.memory.size(1)
    mb.mailbox[:, 0, :dm] = mb.memory   # as the mailbox's own updates leave them
    mb.mail_ts[:, 0] = torch.arange(6, dtype=torch.float64) + 50
    mb.memory_ts[:] = torch.arange(6, dtype=torch.float64) + 10
    mb.prepare_input(mfgs)
    with torch.no_grad():   # an update writes both and keeps it so
        mb.update(model(mfgs, meta).memory, roots, meta["src_pos_index"], meta["dst_pos_index"])
    assert torch.equal(mb.mailbox[:, 0, :dm], mb.memory)
    calls, results = [], []
    real = updaters._starts_with
    for own in (True, False):
        monkeypatch.setattr(updaters, "_starts_with",
                            lambda a, b, own=own: calls.append(real(a, b)) or own)
        _, mfgs, _ = make_batch(8, 6, [4], seed=2)
        mb.prepare_input(mfgs)
        model.zero_grad()
        out = model(mfgs, meta)
        link_loss(*out).backward()
        results.append((out.memory, [p.grad.clone() for p in model.parameters()]))
    assert calls and all(calls)
    (m1, g1), (m2, g2) = results
    assert torch.allclose(m1, m2, atol=1e-6)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)


def test_mail_time_delta_needs_a_cell_updater():
    raw = {**CFG, "memory": {**CFG["memory"], "memory_update": "transformer", "mailbox_size": 2}}
    with pytest.raises(ConfigError, match="memory.time_delta"):
        parse_config(raw)


@pytest.mark.parametrize("case", ["ids", "wide", "few", "one_key", "extremes", "short"])
def test_unique_first_kernel_equals_torch_sort(case):
    """The sampling kernel's radix-sort ``unique_first`` (CPU int64) returns exactly what the
    stable torch sort returns: first positions in key order and the inverse map."""
    from tgl_dist.nn.unique import _unique_first_torch, unique_first
    from tgl_dist.kernels import SAMPLER
    if SAMPLER.get() is None:
        pytest.skip("TGL_DIST_NO_KERNEL=1 or no C compiler: unique_first uses the torch sort only")
    g = torch.Generator().manual_seed(0)
    keys = {"ids": torch.cat([torch.randint(0, 9227, (600,), generator=g),
                              torch.randint(8227, 9227, (6000,), generator=g)]),
            "wide": torch.randint(-2 ** 62, 2 ** 62, (5000,), generator=g),  # 6 radix passes
            "few": torch.randint(0, 3, (1000,), generator=g),
            "one_key": torch.full((500,), 7),                                  # no pass at all
            "extremes": torch.tensor([2 ** 63 - 1, -2 ** 63, 0, -1] * 50),
            "short": torch.randint(0, 10, (10,), generator=g)}[case]           # torch path
    first, inv = unique_first(keys)
    ref_first, ref_inv = _unique_first_torch(keys)
    assert torch.equal(first, ref_first) and torch.equal(inv, ref_inv)
    assert torch.equal(keys[first][inv], keys)
    assert bool((keys[first][1:] > keys[first][:-1]).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("k,own_src", [(1, False), (3, False), (0, False), (1, True), (3, True)])
def test_predictor_score_is_one_node_with_forward_values_and_gradients(k, own_src, dtype):
    """``EdgePredictor.score`` (one autograd node) gives ``forward``'s logits and the same
    gradients for the embedding table and every parameter, in float64 and float32 (on the
    CPU one compiled call each way, ``tgl_score_fwd`` / ``_bwd``); rows repeat; negatives
    with their own sources (historical / inductive pairs) too."""
    from tgl_dist.nn import EdgePredictor
    from tgl_dist.nn.predictor import ScoreRows
    torch.manual_seed(0)
    pred = EdgePredictor(6).to(dtype)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    R, B = 9, 5
    emb = torch.randn(R, 6, dtype=dtype, requires_grad=True)
    src, pos = torch.randint(0, R, (B,)), torch.randint(0, R, (B,))
    neg = torch.randint(0, R, (k * B,))
    neg_src = torch.randint(0, R, (k * B,)) if own_src else None
    g_pos, g_neg = torch.randn(B, dtype=dtype), torch.randn(k * B, dtype=dtype)
    res = []
    for fused in (True, False):
        pred.zero_grad()
        emb.grad = None
        out = (pred.score(emb, src, pos, neg, neg_src) if fused else
               pred(emb[src], emb[pos], emb[neg], None if neg_src is None else emb[neg_src]))
        if fused:
            # both logits come straight out of the one node (no slicing nodes after it)
            assert {type(o.grad_fn).__name__ for o in out} == {ScoreRows.__name__ + "Backward"}
        ((out[0] * g_pos).sum() + (out[1] * g_neg).sum()).backward()
        res.append([out[0].detach(), out[1].detach(), emb.grad.clone()]
                   + [p.grad.clone() for p in pred.parameters()])
    for a, b in zip(*res):
        assert a.shape == b.shape and torch.allclose(a, b, atol=tol), (a, b)
    if own_src:  # and the negatives are scored against their own sources
        h = emb.detach()
        exp = pred.out_fc(torch.relu(pred.src_fc(h[neg_src]) + pred.dst_fc(h[neg]))).view(-1)
        assert torch.allclose(res[0][1], exp, atol=tol)


def test_predictor_score_at_step_size_on_two_threads():
    """At a training step's size (600 root rows of 100, 200 events, one negative each) the
    compiled score calls split their row and column loops over two threads: the same
    logits and gradients as the module's forward."""
    from tgl_dist.nn import EdgePredictor
    torch.manual_seed(0)
    pred = EdgePredictor(100)
    R, B = 600, 200
    emb = torch.randn(R, 100, requires_grad=True)
    src, pos, neg = torch.arange(B), torch.arange(B, 2 * B), torch.arange(2 * B, 3 * B)
    g_pos, g_neg = torch.randn(B), torch.randn(B)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    res = []
    try:
        for fused in (True, False):
            pred.zero_grad()
            emb.grad = None
            out = (pred.score(emb, src, pos, neg, None) if fused else
                   pred(emb[src], emb[pos], emb[neg], None))
            ((out[0] * g_pos).sum() + (out[1] * g_neg).sum()).backward()
            res.append([out[0].detach(), out[1].detach(), emb.grad.clone()]
                       + [p.grad.clone() for p in pred.parameters()])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*res):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-5), float((a - b).abs().max())


def _cfg(path, **memory):
    import yaml
    raw = yaml.safe_load(open(path))
    raw["memory"][0].update(dim_out=8, dim_time=4, **memory)
    if raw["gnn"][0].get("arch") != "identity":
        raw["gnn"][0].update(dim_out=8, dim_time=4)
    raw["train"][0].update(dropout=0.0, att_dropout=0.0)
    return parse_config(raw, path)


@pytest.mark.parametrize("time_delta", ["query", "mail"])
def test_jodie_projects_from_the_time_the_updated_memory_stands_at(time_delta):
    """JODIE's dt = (t - t_s) / (t + 1), t_s the time of the last event folded into s^:
    the memory's time ('query') or the pending mail's ('mail': s^ folds that mail)."""
    from pathlib import Path
    torch.manual_seed(0)
    cfg = _cfg(Path(__file__).parents[2] / "configs" / "JODIE.yml", time_delta=time_delta)
    model = build_model(cfg).eval()
    roots, mfgs, meta = make_batch(5, 7, [], seed=3)
    mb = SharedMailBox(7, cfg.memory, 0)
    mb.memory.normal_()
    mb.mailbox.normal_()
    mb.memory_ts[:] = torch.arange(7, dtype=torch.float64) + 10
    mb.mail_ts[:, 0] = torch.arange(7, dtype=torch.float64) * 3 + 40
    mb.prepare_input(mfgs)
    with torch.no_grad():
        out = model(mfgs, meta)
        ids = roots.nodes
        t_s = mb.mail_ts[ids, 0] if time_delta == "mail" else mb.memory_ts[ids]
        ref = model.projection(out.memory, roots.ts, t_s)
        stale = model.projection(out.memory, roots.ts, mb.memory_ts[ids])
    assert torch.allclose(out.embedding, ref, atol=1e-6)
    if time_delta == "mail":
        assert not torch.allclose(out.embedding, stale, atol=1e-3)


def test_dyrep_scores_the_updated_memory_not_memory_plus_features():
    """DyRep's output embedding is s^ (TGN code: memory[nodes]); node features reach the
    score only through the attention embeddings carried in the mails."""
    from pathlib import Path
    torch.manual_seed(0)
    cfg = _cfg(Path(__file__).parents[2] / "configs" / "DyRep.yml")
    model = build_model(cfg, dim_node_feat=5).eval()
    roots, mfgs, meta = make_batch(4, 9, [3], dim_node=5, seed=4)
    mb = SharedMailBox(9, cfg.memory, 0)
    mb.memory.normal_()
    mb.mailbox.normal_()
    mb.prepare_input(mfgs)
    with torch.no_grad():
        pos, neg = out = model(mfgs, meta)
        s_hat = out.memory
        P = model.predictor
        B = meta["src_pos_index"].numel()

        def score(u, v):
            return P.out_fc(torch.relu(P.src_fc(u) + P.dst_fc(v))).squeeze(-1)
        ref_pos = score(s_hat[:B], s_hat[B:2 * B])
        ref_neg = score(s_hat[:B], s_hat[2 * B:])
    assert torch.allclose(pos.view(-1), ref_pos, atol=1e-6)
    assert torch.allclose(neg.view(-1), ref_neg, atol=1e-6)
