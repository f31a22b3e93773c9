"""Configs, layers and every model's forward/backward on hand-built blocks."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from blocks_util import make_batch
from tgl_dist.memory import GRUMemoryUpdater, RNNMemoryUpdater, SharedMailBox
from tgl_dist.memory.updaters import TransformerMemoryUpdater
from tgl_dist.ctdg import ConfigError, build_model, load_config, parse_config
from tgl_dist.dist import all_reduce_gradients, broadcast_parameters
from tgl_dist.nn import TemporalAttention, TimeEncode
from tgl_dist.testing import run_distributed

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MODELS = ["TGN", "JODIE", "APAN", "DyRep", "TGAT"]


def test_shipped_configs_match_tgl_values():
    tgn = load_config(CONFIGS / "TGN.yml")
    assert (tgn.memory.memory_update, tgn.memory.dim_out, tgn.gnn.layer, tgn.sampling.neighbor,
            tgn.train.batch_size, tgn.train.dropout) == ("gru", 100, 1, (10,), 600, 0.2)
    assert load_config(CONFIGS / "JODIE.yml").memory.memory_update == "rnn"
    apan = load_config(CONFIGS / "APAN.yml")
    assert (apan.memory.mailbox_size, apan.memory.deliver_to, apan.sampling.no_neg) == (10, "neighbors", True)
    tgat = load_config(CONFIGS / "TGAT.yml")
    assert (tgat.has_memory, tgat.sampling.strategy, tgat.gnn.layer) == (False, "uniform", 2)
    assert load_config(CONFIGS / "DyRep.yml").memory.mail_dst_embedding
    dyglib = load_config(CONFIGS / "TGN_DyGLib.yml")
    assert (dyglib.train.patience, dyglib.memory.time_delta, dyglib.gnn.att_variant) == (20, "mail", "tgn")
    assert tgn.train.patience == 5 and tgn.train.reorder == 0


@pytest.mark.parametrize("raw,path", [
    ({"memory": {"type": "node", "dim_out": "abc"}}, "memory.dim_out"),
    ({"memory": [{"type": "node", "dim_out": 10, "memory_update": "lstm"}]}, "memory.memory_update"),
    ({"memory": {"type": "node", "dim_out": 10, "mailbox_size": 3}}, "memory.mailbox_size"),
    ({"gnn": {"layer": 2}, "sampling": {"layer": 1}, "memory": {"type": "node", "dim_out": 10}},
     "gnn.layer"),
    ({"train": {"lr": -1}}, "train.lr"),
    ({"train": {"dropout": 1.5}}, "train.dropout"),
    ({"gnn": {"dim_out": 0}}, "gnn.dim_out"),
    ({"sampling": {"neighbor": [10, 0]}}, "sampling.neighbor"),
    ({"sampling": {"fanout": 3}}, "sampling.fanout"),
    ({"optimizer": {}}, "optimizer"),
    ({"gnn": {"arch": "identity"}}, "gnn.arch"),
    ({"memory": {"type": "node", "dim_out": 10}, "train": {"batch_size": 600, "reorder": 7}},
     "train.reorder"),
    ({"train": {"patience": 0}}, "train.patience"),
    ({"sampling": {"prop_time": True}}, "sampling.prop_time"),
    ({"sampling": {"history": 2}}, "sampling.history"),
])
def test_config_errors_name_the_field(raw, path):
    raw = {**{k: {} for k in ("sampling", "memory", "gnn", "train")}, **raw}  # all required
    with pytest.raises(ConfigError) as e:
        parse_config(raw, source="x.yml")
    assert e.value.field_path == path and str(e.value).startswith(f"x.yml: {path}:")


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yml")
    bad = tmp_path / "bad.yml"
    bad.write_text("memory: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yml: <yaml>"):
        load_config(bad)
    cfg = load_config(CONFIGS / "TGN.yml").replace(train={"lr": 0.01})
    assert cfg.train.lr == 0.01 and cfg.name == "TGN"


def test_time_encoding_tgl_init():
    te = TimeEncode(10)
    assert torch.allclose(te.w.weight.view(-1), 1 / 10 ** torch.linspace(0, 9, 10))
    assert torch.equal(te(torch.zeros(3)), torch.ones(3, 10))


@pytest.mark.parametrize("cls,cell", [(GRUMemoryUpdater, torch.nn.GRUCell),
                                      (RNNMemoryUpdater, torch.nn.RNNCell)])
@pytest.mark.parametrize("time_delta", ["query", "mail"])
def test_cell_updaters_equal_torch_cells_on_concatenated_input(cls, cell, time_delta):
    torch.manual_seed(0)
    up = cls(dim_memory=6, dim_mail=14, mailbox_size=1, dim_time=5, time_delta=time_delta)
    ref = cell(19, 6)
    ref.load_state_dict({k: getattr(up, k) for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
    ids = torch.tensor([3, 1, 3, 0, 1])  # repeated nodes share memory and mail
    mem_u, mail_u = torch.randn(4, 6), torch.randn(4, 1, 14)
    sd = {"ID": ids, "mem": mem_u[ids], "mail": mail_u[ids], "mem_ts": torch.rand(5).double(),
          "ts": 10 + torch.rand(5).double(), "mail_ts": 3 + torch.rand(5, 1).double()}
    with torch.no_grad():   # a trained phase: cos is even, so a zero bias hides the sign of dt
        up.time_enc.w.bias.uniform_(0.5, 1.5)
    # 'query': the gap from the memory to the query; 'mail': from the memory to the mail
    later = sd["ts"] if time_delta == "query" else sd["mail_ts"][:, 0]
    phi = _phi(up.time_enc, later - sd["mem_ts"])
    x = torch.cat([sd["mail"].view(5, -1), phi], 1)
    assert torch.allclose(up(sd), ref(x, sd["mem"]), atol=1e-6)


def _phi(te, dt):
    """``cos(w dt + b)`` written out (``dt`` = query time minus the earlier time)."""
    return torch.cos(dt.float().view(-1, 1) * te.w.weight.view(1, -1) + te.w.bias)


def test_transformer_updater_matches_its_formula():
    # APAN: q = W_q s, k/v = W_k/W_v [mail_k || phi(t - mail_ts_k)], per-head softmax of
    # LeakyReLU(q . k) over the K slots, s^ = ReLU(W(LayerNorm(sum a v + s))) (eval: no dropout)
    torch.manual_seed(0)
    S, K, dm, dmail, dt_dim, H = 5, 3, 6, 14, 4, 2
    up = TransformerMemoryUpdater(dm, dmail, K, dt_dim, num_head=H, dropout=0.3,
                                  att_dropout=0.3).eval()
    with torch.no_grad():
        up.time_enc.w.bias.uniform_(0.5, 1.5)
    sd = {"ID": torch.arange(S), "mem": torch.randn(S, dm), "mail": torch.randn(S, K, dmail),
          "mem_ts": torch.rand(S).double(), "ts": 10 + torch.rand(S).double(),
          "mail_ts": 5 * torch.rand(S, K).double()}
    x = torch.cat([sd["mail"], _phi(up.time_enc, (sd["ts"].view(-1, 1) - sd["mail_ts"]).view(-1))
                   .view(S, K, dt_dim)], 2)
    q, k, v = up.w_q(sd["mem"]), up.w_k(x), up.w_v(x)
    c = dm // H
    out = torch.zeros(S, dm)
    for h in range(H):
        cols = slice(h * c, (h + 1) * c)
        a = torch.softmax(F.leaky_relu((k[:, :, cols] * q[:, None, cols]).sum(-1), 0.2), dim=1)
        out[:, cols] = (a.unsqueeze(-1) * v[:, :, cols]).sum(1)
    want = F.relu(up.mlp(up.layer_norm(out + sd["mem"])))
    assert torch.allclose(up(sd), want, atol=1e-5)


def test_attention_zero_neighbours_and_permutation_invariance():
    torch.manual_seed(0)
    layer = TemporalAttention(8, 3, 4, 8, num_head=2).eval()
    roots, mfgs, meta = make_batch(6, 30, [4], dim_edge=3, seed=1)
    b = mfgs[0]
    h = torch.randn(b.num_src, 8)
    out = layer(b, h)
    assert out.shape == (b.num_dst, 8)
    # edges listed in another order give the same result
    perm = torch.randperm(b.num_edges)
    b2 = type(b)(b.srcdata, {k: v[perm] for k, v in b.edata.items()}, b.edge_index[:, perm], b.num_dst)
    assert torch.allclose(layer(b2, h), out, atol=1e-5)
    # a destination without neighbours aggregates zero: out = LN(ReLU(W_o [0 || h_i]))
    lonely = torch.ones(b.num_dst, dtype=torch.bool)
    lonely[b.edge_index[1]] = False
    if lonely.any():
        i = int(lonely.nonzero()[0])
        exp = layer.layer_norm(F.relu(layer.w_out(torch.cat([torch.zeros(8), h[i]]))))
        assert torch.allclose(out[i], exp, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_model_forward_backward_and_mailbox_update(name):
    torch.manual_seed(0)
    cfg = load_config(CONFIGS / f"{name}.yml")
    fan = [] if cfg.sampling.no_sample else list(cfg.sampling.neighbor)
    model = build_model(cfg, dim_node_feat=8, dim_edge_feat=4)
    mb = SharedMailBox(40, cfg.memory, 4) if cfg.has_memory else None
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(3):
        roots, mfgs, meta = make_batch(10, 40, fan, t0=100.0 + 20 * step, dim_edge=4, dim_node=8,
                                       seed=step)
        if mb is not None:
            mb.prepare_input(mfgs)
        out = model(mfgs, meta)
        pos, neg = out
        assert pos.shape == (10,) and neg.shape == (10,)
        loss = F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos)) + \
            F.binary_cross_entropy_with_logits(neg, torch.zeros_like(neg))
        opt.zero_grad()
        loss.backward()
        assert torch.isfinite(loss)
        trained = [n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
        assert any(n.startswith("predictor") for n in trained)
        if cfg.has_memory:
            assert any(n.startswith("memory_updater") for n in trained) or step == 0
            mb.update(out.memory, roots, meta["src_pos_index"], meta["dst_pos_index"],
                      torch.randn(10, 4), out.embedding, out.mail_uses_embedding, mfgs[-1])
        opt.step()
    if mb is not None:
        assert mb.memory.abs().sum() > 0 and mb.memory_ts.max() >= 140


def test_k_negatives_layout():
    cfg = load_config(CONFIGS / "TGN.yml")
    model = build_model(cfg).eval()
    roots, mfgs, meta = make_batch(5, 30, [10], k_neg=3, seed=2)
    mb = SharedMailBox(30, cfg.memory, 0)
    mb.prepare_input(mfgs)
    pos, neg = model(mfgs, meta)
    assert neg.shape == (15,)
    emb, _, _ = model.embed(mfgs)
    p = model.predictor
    j, i = 2, 4  # the j-th negative of positive i sits at row j*B + i
    exp = p.out_fc(torch.relu(p.src_fc(emb[i]) + p.dst_fc(emb[meta["dst_neg_index"][j * 5 + i]])))
    assert torch.allclose(neg[j * 5 + i], exp.squeeze(), atol=1e-5)


def test_drawn_negative_pairs_are_scored_against_their_own_sources():
    """Historical / inductive negatives are (src, dst) pairs: ``src_neg_index`` points at
    the drawn sources' rows, and each negative is scored against its own source (as
    DyGLib), not against its positive's source; random negatives (``src_neg_index`` =
    the positives' sources repeated) keep the positive's source."""
    cfg = load_config(CONFIGS / "TGN.yml")
    model = build_model(cfg).eval()
    roots, mfgs, meta = make_batch(5, 30, [10], k_neg=3, seed=2)
    mb = SharedMailBox(30, cfg.memory, 0)
    mb.prepare_input(mfgs)
    B = 5
    emb, _, _ = model.embed(mfgs)
    p = model.predictor
    meta = dict(meta, src_neg_index=meta["src_pos_index"].repeat(3))
    _, neg_random = model(mfgs, meta)
    # pretend the first positive's source and the destinations were drawn as sources
    drawn = torch.randint(0, 3 * B, (3 * B,), generator=torch.Generator().manual_seed(0))
    meta = dict(meta, src_neg_index=drawn)
    _, neg = model(mfgs, meta)
    exp = p.out_fc(torch.relu(p.src_fc(emb[drawn]) + p.dst_fc(emb[meta["dst_neg_index"]])))
    assert torch.allclose(neg, exp.view(-1), atol=1e-5)
    exp_r = p.out_fc(torch.relu(p.src_fc(emb[meta["src_pos_index"].repeat(3)])
                                + p.dst_fc(emb[meta["dst_neg_index"]])))
    assert torch.allclose(neg_random, exp_r.view(-1), atol=1e-5)
    assert not torch.allclose(neg, neg_random, atol=1e-3)


def _grad_worker():
    from tgl_dist import DistributedContext
    ctx = DistributedContext.init()
    torch.manual_seed(ctx.rank)  # different init on each rank: broadcast makes them equal
    model = build_model(load_config(CONFIGS / "TGAT.yml"), 0, 0)
    broadcast_parameters(model)
    roots, mfgs, meta = make_batch(4, 20, [3, 3], seed=10 + ctx.rank)
    pos, neg = model(mfgs, meta)
    (pos.sum() - neg.sum()).backward()
    local = model.predictor.out_fc.weight.grad.clone()
    all_reduce_gradients(model)
    return (model.predictor.out_fc.bias.detach().numpy().copy(), local.numpy().copy(),
            model.predictor.out_fc.weight.grad.numpy().copy())


@pytest.mark.distributed
def test_gradients_are_averaged_over_ranks():
    (b0, l0, g0), (b1, l1, g1) = run_distributed(_grad_worker, 2)
    assert (b0 == b1).all()
    torch.manual_seed(0)   # broadcast_parameters sends rank 0's initial values to all ranks
    ref = build_model(load_config(CONFIGS / "TGAT.yml"), 0, 0).predictor.out_fc.bias
    assert torch.equal(torch.from_numpy(b0), ref.detach())
    assert torch.allclose(torch.from_numpy(g0), torch.from_numpy((l0 + l1) / 2))
    assert (g0 == g1).all()


def _none_grad_worker():
    from tgl_dist import DistributedContext
    from tgl_dist.dist.parallel import reduce_gradients
    ctx = DistributedContext.init()
    a, b, c = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
    a.grad = torch.full((3,), float(ctx.rank + 1))
    if ctx.rank == 0:
        b.grad = torch.full((3,), 4.0)
    reduce_gradients([a, b, c])
    return [None if p.grad is None else p.grad.tolist() for p in (a, b, c)]


@pytest.mark.distributed
def test_a_parameter_without_gradient_on_every_rank_keeps_none():
    """As in one process, where autograd leaves it None and Adam skips it: a zero gradient
    would move it by Adam's momentum, and 2 ranks would leave the 1-process trajectory (an
    EvolveGCN-H window with no edge did). One rank's gradient still counts."""
    for out in run_distributed(_none_grad_worker, 2):
        assert out == [[1.5] * 3, [2.0] * 3, None]


@pytest.mark.parametrize("name", ["TGN", "DyRep", "TGAT"])
def test_dedup_of_node_time_pairs_and_event_ids_is_exact(name, monkeypatch):
    """Computing once per distinct (node, time) / event id gives the per-row result."""
    torch.manual_seed(0)
    cfg = load_config(CONFIGS / f"{name}.yml")
    model = build_model(cfg, dim_node_feat=8, dim_edge_feat=4).eval()
    roots, mfgs, meta = make_batch(12, 6, list(cfg.sampling.neighbor), dim_edge=4, dim_node=8, seed=3)
    # repeat nodes at equal times and events: few distinct nodes, shared event ids
    for b in mfgs:
        b.edata["ID"] = b.edata["ID"] % 7
        b.edata["f"] = torch.randn(7, 4)[b.edata["ID"]]
    mfgs[0].srcdata["ts"] = mfgs[0].srcdata["ts"].round()
    mb = SharedMailBox(6, cfg.memory, 4) if cfg.has_memory else None
    if mb is not None:
        mb.memory.normal_()
        mb.mailbox.normal_()
        mb.prepare_input(mfgs)
    with torch.no_grad():
        fast = model.embed(mfgs)
        import tgl_dist.ctdg.tgnn as tgnn
        import tgl_dist.nn.attention as att
        monkeypatch.setattr(tgnn, "unique_node_time", lambda ids, ts: None)
        monkeypatch.setattr(att, "unique_first", lambda k: (torch.arange(k.numel()), torch.arange(k.numel())))
        slow = model.embed(mfgs)
    for a, b in zip(fast, slow):
        if a is not None:
            assert torch.allclose(a, b, atol=1e-5)
