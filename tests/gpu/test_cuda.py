"""The GPU path: collectives take CUDA tensors, the CTDG pipeline computes on a GPU what it
computes on the CPU, and the examples train there end to end.

Skipped without CUDA (CI has no GPU). On a GPU machine: ``python -m pytest -q tests/gpu``.

What is compared, and why not whole training runs: a training run on the GPU does not end
where the CPU run ends, and cannot. Float rounding differs (cuBLAS' summation order, the
CPU's compiled kernels), and training amplifies it chaotically: Adam's first steps move
every parameter by about ``lr`` in the direction of its gradient's sign, so a gradient
entry near zero that rounds to opposite signs moves its parameter ``2 lr`` apart, and a
time-encoding frequency off by ``1e-4`` turns ``cos(w dt)`` by a radian at ``dt = 1e4``.
(The CPU with and without its compiled kernels diverges the same way.) So the tests
compare what is deterministic up to rounding: a whole evaluation pass from the same
parameters (the memory and mailbox of every node it touches, and the whole-split metrics)
and the first training step's gradients, on 1 process and on 2 processes against 1.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tgl_dist.testing import run_distributed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

REPO = Path(__file__).resolve().parents[2]
TGN = REPO / "examples" / "ctdg" / "train_tgn.py"
TINY = ["--num-nodes", "60", "--num-events", "1500", "--batch-size", "100", "--eval-neg", "3",
        "--epochs", "2", "--no-progress", "--threads", "1"]
MODELS = ["TGN", "JODIE", "APAN", "DyRep", "TGAT"]


# --------------------------------------------------------------------- collectives
def _exchange_worker():
    from tgl_dist import DistributedContext
    from tgl_dist.dist import all_gather_v, all_reduce_, all_reduce_async, fetch_rows

    ctx = DistributedContext.init(backend="gloo", use_gpu=True)
    dev = ctx.device
    table = torch.arange(10.0, device=dev).view(5, 2) + 100 * ctx.rank
    owner = torch.tensor([1, 0, 1, 0], device=dev)
    local = torch.tensor([0, 4, 3, 1], device=dev)
    got = fetch_rows(owner, local, lambda rows: table[rows])
    s = torch.full((3,), float(ctx.rank + 1), device=dev)
    all_reduce_(s)
    a = all_reduce_async(torch.full((2,), 2.0, device=dev)).wait()
    g = all_gather_v(torch.full((ctx.rank + 1,), float(ctx.rank), device=dev))
    return [str(x.device) for x in (got, s, a, g)], got.cpu(), s.cpu(), a.cpu(), g.cpu()


@pytest.mark.distributed
def test_collectives_take_cuda_tensors():
    """Two processes share the GPU over gloo: CUDA tensors go through the host and come
    back on the GPU (with NCCL they would stay there)."""
    out = run_distributed(_exchange_worker, 2, env={"CUDA_VISIBLE_DEVICES": "0"})
    for devices, got, s, a, g in out:
        assert devices == ["cuda:0"] * 4
        want = torch.stack([torch.arange(10.0).view(5, 2)[r] + 100 * o
                            for o, r in zip([1, 0, 1, 0], [0, 4, 3, 1])])
        assert torch.equal(got, want)
        assert torch.equal(s, torch.full((3,), 3.0)) and torch.equal(a, torch.full((2,), 4.0))
        assert torch.equal(g, torch.tensor([0.0, 1.0, 1.0]))


# ------------------------------------------------------------- pipeline, in process
def _pipeline(name: str, device: str, parts: str):
    """Evaluation pass over the validation split from the seeded initial parameters, after
    the gradients of the first training step: ``(grads, metrics, ids, memory, mem_ts,
    mail, mail_ts)`` with this rank's owned nodes' state (global ids ``ids``)."""
    from tgl_dist import DistributedContext
    from tgl_dist.data import load_dataset
    from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
    from tgl_dist.loader import DistributedDataLoader
    from tgl_dist.memory import SharedMailBox
    from tgl_dist.metrics import LinkPredMetrics
    from tgl_dist.ctdg import build_model, load_config, run_epoch
    from tgl_dist.dist.parallel import all_reduce_gradients
    from tgl_dist.ctdg.training import link_loss
    from tgl_dist.partition import partition_graph, partition_load
    from tgl_dist.sampling import NegativeSampling, NeighborSampler

    ctx = DistributedContext.init(backend="gloo", use_gpu=device == "cuda")
    W = ctx.world_size
    cfg = load_config(REPO / "configs" / f"{name}.yml")
    if ctx.rank == 0:
        g = load_dataset("synthetic", num_nodes=60, num_events=1500)
        partition_graph(g, W, "hash", parts, force=True)
    ctx.barrier()
    pdata = partition_load(Path(parts) / "synthetic", "hash")
    graph = DistributedGraphStore(pdata)
    smp = cfg.sampling
    sampler = None if smp.no_sample else NeighborSampler(
        graph.num_nodes, smp.layer, list(smp.neighbor), TemporalNeighborSampleGraph(pdata),
        policy=smp.strategy, seed=0, graph_name="synthetic")
    mailbox = None
    if cfg.has_memory:
        mailbox = SharedMailBox(int(pdata.ids.numel()), cfg.memory, graph.edge_feat_dim,
                                partition_book=pdata.book, device=ctx.device)
    loaders = {s: DistributedDataLoader(graph, s, sampler=sampler, batch_size=200 // W,
                                        neg_sampler=NegativeSampling("triplet", "random", 2, seed=0),
                                        train=s == "train", mailbox=mailbox, seed=0, queue_size=0,
                                        device=ctx.device) for s in ("train", "val")}
    torch.manual_seed(0)
    model = build_model(cfg, graph.node_feat_dim, graph.edge_feat_dim, num_nodes=graph.num_nodes,
                        partition_book=pdata.book).to(ctx.device)
    model.eval()   # no dropout: each device draws its own masks
    if mailbox is not None:
        mailbox.reset()
    roots, mfgs, meta, _ = next(iter(loaders["train"]))
    link_loss(*model(mfgs, meta), meta, W).backward()
    all_reduce_gradients(model)
    grads = [p.grad.detach().cpu() for p in model.parameters() if p.grad is not None]
    if mailbox is not None:
        mailbox.reset()
    m = LinkPredMetrics()
    run_epoch(model, loaders["val"], mailbox, None, m)
    res = [grads, m.compute()]
    if mailbox is None:
        return res + [None] * 5
    return res + [pdata.book.owned_ids(ctx.rank)] + [
        t.cpu() for t in (mailbox.memory, mailbox.memory_ts, mailbox.mailbox, mailbox.mail_ts)]


def _merge(outs):
    """Concatenate the ranks' owned state, sorted by global id."""
    ids = torch.cat([o[2] for o in outs])
    order = torch.argsort(ids)
    return [torch.cat([o[k] for o in outs])[order] for k in range(3, 7)]


def _metrics(a, b):
    """Whole-split metrics: rounding (~1e-6) can swap two near-equal scores, which moves AP
    and AUC by ~1/n and one event's reciprocal rank by up to 1/2 (of 224 events here)."""
    assert a["num"] == b["num"] > 0
    for k, tol in (("ap", 1e-3), ("auc", 1e-3), ("mrr", 5e-3)):
        assert abs(a[k] - b[k]) < tol, (k, a[k], b[k])


def _same(cpu, gpu, tol=1e-4):
    """``cpu`` and ``gpu``: the :func:`_pipeline` outputs of each rank of two runs (the
    gradients and metrics are every rank's; the owned state is merged over the ranks)."""
    (gc, mc), (gg, mg) = cpu[0][:2], gpu[0][:2]
    assert len(gc) == len(gg) > 0
    for a, b in zip(gc, gg):   # relative to the gradient's scale (time-encoding ones are large)
        assert (a - b).abs().max() <= tol * max(1.0, float(a.abs().max())), (a, b)
    _metrics(mc, mg)
    if cpu[0][2] is not None:
        (mem_c, ts_c, mail_c, mts_c), (mem_g, ts_g, mail_g, mts_g) = _merge(cpu), _merge(gpu)
        assert float(mem_c.abs().max()) > 0                       # the pass wrote memory
        assert torch.equal(ts_c, ts_g) and torch.equal(mts_c, mts_g)
        assert (mem_c - mem_g).abs().max() < tol and (mail_c - mail_g).abs().max() < tol


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_pipeline_on_gpu_computes_what_cpu_does(tmp_path, name):
    cpu = _pipeline(name, "cpu", str(tmp_path / "p"))
    gpu = _pipeline(name, "cuda", str(tmp_path / "p"))
    _same([cpu], [gpu])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", ["TGN", "APAN"])
def test_two_ranks_on_gpu_compute_what_one_cpu_process_does(tmp_path, name):
    """2 ranks, each on the GPU (gloo: they share it), against one process on the CPU:
    the memory and mailbox rows travel between the ranks' GPUs by all-to-all."""
    one = _pipeline(name, "cpu", str(tmp_path / "p1"))
    two = run_distributed(_pipeline, 2, name, "cuda", str(tmp_path / "p2"),
                          env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=300)
    assert two[0][1] == two[1][1]                                 # every rank: the whole split
    _same([one], two)


# ------------------------------------------------------------------------ examples
def _run(cmd, cwd, **env):
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, **env)
    p = subprocess.run(cmd, cwd=cwd, env=e, capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads([ln for ln in p.stdout.splitlines() if ln.strip()][-1])


@pytest.mark.slow
def test_example_trains_on_the_gpu_by_default(tmp_path):
    out = _run([sys.executable, str(TGN), "--parts", str(tmp_path / "parts"), *TINY], tmp_path)
    assert out["device"] == "cuda:0" and out["peak_gpu_mib_per_rank"][0] > 0
    assert 0.0 <= out["test_ap"] <= 1.0 and out["epochs"] == 2


@pytest.mark.slow
@pytest.mark.distributed
def test_example_two_processes_on_gpus(tmp_path):
    """torchrun with 2 processes: NCCL where each has a GPU, else gloo sharing one."""
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                str(TGN), "--parts", str(tmp_path / "parts"), "--backend", backend, *TINY], tmp_path)
    assert out["world_size"] == 2 and out["backend"] == backend and out["device"] == "cuda:0"
    assert len(out["peak_gpu_mib_per_rank"]) == 2 and 0.0 <= out["test_ap"] <= 1.0


@pytest.mark.slow
def test_dtdg_training_on_gpu_ends_where_cpu_does(tmp_path, datasets_root):
    """float64 and no Adam-sign effect at this size: the DTDG trainer ends on the GPU where
    it ends on the CPU, to 1e-6 relative."""
    script = REPO / "examples" / "dtdg" / "train_node_regression.py"
    args = [sys.executable, str(script), "--data", "pedalme_london", "--root", str(datasets_root),
            "--lags", "4", "--hidden-dim", "8", "--dtype", "float64", "--epochs", "3",
            "--parts", str(tmp_path / "parts")]
    cpu = _run(args + ["--device", "cpu"], tmp_path)
    gpu = _run(args + ["--device", "cuda"], tmp_path)
    assert gpu["device"] == "cuda:0" and gpu["best_epoch"] == cpu["best_epoch"]
    for k in ("test_mse", "dev_mse", "baseline_test_mse"):
        assert abs(cpu[k] - gpu[k]) <= 1e-6 * abs(cpu[k]), (k, cpu[k], gpu[k])
