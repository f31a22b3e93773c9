"""TGN training throughput: tgl_dist vs PyTorch Geometric's ``examples/tgn.py``, same data, same run.

    python benchmarks/train_throughput.py --root ../shared/datasets [--epochs 1] [--threads 2]

Settings of PyG's example: memory / time / embedding 100, batch 200, 10 most recent
neighbours, one attention layer (2 heads), Adam lr 1e-4, one random negative per event.

* ``pyg``: a faithful re-implementation of ``examples/tgn.py`` with ``TGNMemory``,
  ``IdentityMessage``, ``LastAggregator``, ``LastNeighborLoader``,
  ``TemporalDataLoader`` and ``TransformerConv`` (the example's GraphAttentionEmbedding
  and LinkPredictor), run in its own process with ``--threads`` torch threads.
* ``ours``: ``examples/ctdg/train_tgn.py`` with a TGN config of the same sizes:
  ``memory.time_delta: mail`` (each node's memory computed once per batch from its
  pending mail, time input = gap since the last update, as PyG's ``TGNMemory``), TGL's
  attention over the 10 most recent neighbours at each root's query time (computed
  without per-edge keys, docs/models.md); 1 process with ``--threads`` threads, and 2
  processes (torchrun) with ``--threads // 2`` threads each, for peak memory per rank.

``--edge-dim F`` gives both sides the same F random edge features per event (fixed seed,
standard normal), the shape of the issue's reference stream (Wikipedia has 172 LIWC
features; our copy has none): the stream is written once as a DyGLib ``ml_*.csv`` +
``.npy`` pair in a temporary folder and both sides read that file.

``--repeats N`` runs each side N times (seeds ``seed .. seed + N - 1``), alternating the
sides (PyG, ours, PyG, ours, ...) so the machine's drift hits both alike, and reports the
median run of each side, their ratio, and the median of the N paired ratios.

Events/s: training events of one epoch over its wall time (median over epochs); also
per CPU second of the process(es), which is robust on a shared machine. AP:
test AP over the whole test split after the last epoch (PyG's per-batch mean AP, what
its example prints, is reported too). Each side runs in its own process so peak RSS is
its own. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "ctdg" / "train_tgn.py"

CONFIG = """
sampling: [{layer: 1, neighbor: [10], strategy: recent, prop_time: False, history: 1, duration: 0}]
memory: [{type: node, dim_time: 100, deliver_to: self, mail_combine: last, memory_update: gru,
          mailbox_size: 1, combine_node_feature: True, dim_out: 100, time_delta: mail}]
gnn: [{arch: transformer_attention, layer: 1, att_head: 2, dim_time: 100, dim_out: 100}]
train: [{epoch: 1, batch_size: 200, lr: 0.0001, dropout: 0.1, att_dropout: 0.1}]
"""


def run_pyg(args) -> dict:
    """PyG's examples/tgn.py, unchanged in substance (our dataset loader; ``--device``
    as the example's ``device``)."""
    import torch
    from sklearn.metrics import average_precision_score, roc_auc_score
    from torch.nn import Linear
    from torch_geometric.data import TemporalData
    from torch_geometric.loader import TemporalDataLoader
    from torch_geometric.nn import TGNMemory, TransformerConv
    from torch_geometric.nn.models.tgn import IdentityMessage, LastAggregator, LastNeighborLoader

    sys.path.insert(0, str(REPO))
    from tgl_dist.data import load_dataset

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = load_dataset(args.data, root=args.root)
    # PyG's TGNMemory cannot store empty (0-wide) raw messages: a feature-free stream
    # gets one all-zero column (PyG side only; negligible work)
    msg = g.edge_attr if g.edge_attr is not None else torch.zeros(g.num_events, 1)
    device = torch.device(args.device)
    data = TemporalData(src=g.src, dst=g.dst, t=g.t.long(), msg=msg).to(device)
    train_data, val_data, test_data = data.train_val_test_split(val_ratio=0.15, test_ratio=0.15)
    train_loader = TemporalDataLoader(train_data, batch_size=200, neg_sampling_ratio=1.0)
    val_loader = TemporalDataLoader(val_data, batch_size=200, neg_sampling_ratio=1.0)
    test_loader = TemporalDataLoader(test_data, batch_size=200, neg_sampling_ratio=1.0)
    neighbor_loader = LastNeighborLoader(data.num_nodes, size=10, device=device)

    class GraphAttentionEmbedding(torch.nn.Module):
        def __init__(self, in_channels, out_channels, msg_dim, time_enc):
            super().__init__()
            self.time_enc = time_enc
            edge_dim = msg_dim + time_enc.out_channels
            self.conv = TransformerConv(in_channels, out_channels // 2, heads=2, dropout=0.1,
                                        edge_dim=edge_dim)

        def forward(self, x, last_update, edge_index, t, msg):
            rel_t = last_update[edge_index[0]] - t
            rel_t_enc = self.time_enc(rel_t.to(x.dtype))
            edge_attr = torch.cat([rel_t_enc, msg], dim=-1)
            return self.conv(x, edge_index, edge_attr)

    class LinkPredictor(torch.nn.Module):
        def __init__(self, in_channels):
            super().__init__()
            self.lin_src = Linear(in_channels, in_channels)
            self.lin_dst = Linear(in_channels, in_channels)
            self.lin_final = Linear(in_channels, 1)

        def forward(self, z_src, z_dst):
            return self.lin_final((self.lin_src(z_src) + self.lin_dst(z_dst)).relu())

    dim = 100
    memory = TGNMemory(data.num_nodes, data.msg.size(-1), dim, dim,
                       message_module=IdentityMessage(data.msg.size(-1), dim, dim),
                       aggregator_module=LastAggregator()).to(device)
    gnn = GraphAttentionEmbedding(dim, dim, data.msg.size(-1), memory.time_enc).to(device)
    link_pred = LinkPredictor(dim).to(device)
    optimizer = torch.optim.Adam(set(memory.parameters()) | set(gnn.parameters())
                                 | set(link_pred.parameters()), lr=0.0001)
    criterion = torch.nn.BCEWithLogitsLoss()
    assoc = torch.empty(data.num_nodes, dtype=torch.long, device=device)

    def train():
        memory.train(); gnn.train(); link_pred.train()  # noqa: E702
        memory.reset_state()
        neighbor_loader.reset_state()
        for batch in train_loader:
            optimizer.zero_grad()
            n_id, edge_index, e_id = neighbor_loader(batch.n_id)
            assoc[n_id] = torch.arange(n_id.size(0), device=device)
            z, last_update = memory(n_id)
            z = gnn(z, last_update, edge_index, data.t[e_id], data.msg[e_id])
            pos_out = link_pred(z[assoc[batch.src]], z[assoc[batch.dst]])
            neg_out = link_pred(z[assoc[batch.src]], z[assoc[batch.neg_dst]])
            loss = criterion(pos_out, torch.ones_like(pos_out))
            loss = loss + criterion(neg_out, torch.zeros_like(neg_out))
            memory.update_state(batch.src, batch.dst, batch.t, batch.msg)
            neighbor_loader.insert(batch.src, batch.dst)
            loss.backward()
            optimizer.step()
            memory.detach()

    @torch.no_grad()
    def test(loader):
        memory.eval(); gnn.eval(); link_pred.eval()  # noqa: E702
        torch.manual_seed(12345)
        aps, pos_all, neg_all = [], [], []
        for batch in loader:
            n_id, edge_index, e_id = neighbor_loader(batch.n_id)
            assoc[n_id] = torch.arange(n_id.size(0), device=device)
            z, last_update = memory(n_id)
            z = gnn(z, last_update, edge_index, data.t[e_id], data.msg[e_id])
            pos_out = link_pred(z[assoc[batch.src]], z[assoc[batch.dst]]).view(-1)
            neg_out = link_pred(z[assoc[batch.src]], z[assoc[batch.neg_dst]]).view(-1)
            y_pred = torch.cat([pos_out, neg_out]).sigmoid().cpu()
            y_true = torch.cat([torch.ones(pos_out.size(0)), torch.zeros(neg_out.size(0))])
            aps.append(average_precision_score(y_true, y_pred))
            pos_all.append(pos_out.cpu())
            neg_all.append(neg_out.cpu())
            memory.update_state(batch.src, batch.dst, batch.t, batch.msg)
            neighbor_loader.insert(batch.src, batch.dst)
        p, n = torch.cat(pos_all), torch.cat(neg_all)
        y = torch.cat([torch.ones_like(p), torch.zeros_like(n)])
        s = torch.cat([p, n])
        return (float(average_precision_score(y, s)), float(roc_auc_score(y, s)),
                float(torch.tensor(aps).mean()))

    speeds, cpu_speeds = [], []
    for _ in range(args.epochs):
        t0, c0 = time.perf_counter(), time.process_time()
        train()
        if device.type == "cuda":
            torch.cuda.synchronize()
        speeds.append(train_data.num_events / (time.perf_counter() - t0))
        cpu_speeds.append(train_data.num_events / (time.process_time() - c0))
        val = test(val_loader)
        tst = test(test_loader)
    return {"impl": "pyg", "events_per_s": sorted(speeds)[len(speeds) // 2],
            "events_per_cpu_s": sorted(cpu_speeds)[len(cpu_speeds) // 2], "val_ap": val[0],
            "test_ap": tst[0], "test_auc": tst[1], "test_ap_batch_mean": tst[2],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "peak_gpu_mib": (torch.cuda.max_memory_allocated() / 2**20
                             if device.type == "cuda" else None)}


def _median_run(runs: list) -> dict:
    """The run with the median events/s (its AP and memory go with it); the median
    events per CPU second over all runs."""
    runs = sorted(runs, key=lambda r: r["events_per_s"])
    out = dict(runs[len(runs) // 2])
    cpu = sorted(r["events_per_cpu_s"] for r in runs)
    out["events_per_cpu_s"] = cpu[len(cpu) // 2]
    out["repeats"] = len(runs)
    return out


def with_edge_features(data: str, root: str, dim: int) -> str:
    """Write ``data`` with ``dim`` random edge features as DyGLib files; return the csv path."""
    import numpy as np
    sys.path.insert(0, str(REPO))
    from tgl_dist.data import load_dataset
    g = load_dataset(data, root=root)
    name = f"{Path(data).stem.replace('ml_', '')}{dim}"
    out = Path(tempfile.mkdtemp(prefix="tgl_dist_bench_")) / f"ml_{name}.csv"
    E = g.num_events
    rows = np.stack([np.arange(E), g.src.numpy() + 1, g.dst.numpy() + 1, g.t.numpy(),
                     np.zeros(E), np.arange(1, E + 1)], 1)
    np.savetxt(out, rows, fmt=["%d", "%d", "%d", "%.17g", "%d", "%d"], delimiter=",",
               header=",u,i,ts,label,idx", comments="")
    feats = np.random.default_rng(0).standard_normal((E + 1, dim), dtype=np.float32)
    feats[0] = 0  # DyGLib's padding row
    np.save(out.with_suffix(".npy"), feats)
    return str(out)


def run_ours(args, nproc: int, threads: int, seed: int) -> dict:
    cfg = Path(tempfile.mkdtemp()) / "TGN_pyg_settings.yml"
    cfg.write_text(CONFIG)
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                "--standalone"]
    cmd += [str(TRAIN), "--data", args.data, "--root", args.root, "--config", str(cfg),
            "--epochs", str(args.epochs), "--patience", str(args.epochs + 1), "--eval-neg", "1",
            "--parts", args.parts, "--partition-algo", args.partition_algo, "--threads",
            str(threads), "--seed", str(seed), "--no-progress",
            "--metrics-csv", str(cfg.parent / f"metrics_{nproc}.csv"), "--device", args.device]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"our run failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return {"impl": f"ours_{nproc}proc", "events_per_s": out["train_events_per_s"],
            "events_per_cpu_s": out["train_events_per_cpu_s"],
            "val_ap": out["val_ap"], "test_ap": out["test_ap"], "test_auc": out["test_auc"],
            "peak_rss_mib_per_rank": out["peak_rss_mib_per_rank"],
            "peak_gpu_mib_per_rank": out.get("peak_gpu_mib_per_rank")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="wikipedia")
    ap.add_argument("--root", default=os.environ.get("TGL_DIST_DATASETS", str(REPO.parent / "shared" / "datasets")))
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", default=str(Path(tempfile.gettempdir()) / "tgl_dist_bench_parts"))
    ap.add_argument("--partition-algo", default="metis_for_tgnn")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per side (different seeds); events/s = median run")
    ap.add_argument("--skip-2proc", action="store_true")
    ap.add_argument("--edge-dim", type=int, default=0,
                    help="give every event this many random edge features (both sides)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="both sides on this device (the issue's target is on the CPU; with "
                         "cuda the 2-process run is skipped: one GPU per process)")
    ap.add_argument("--impl", choices=["pyg"], help=argparse.SUPPRESS)  # internal: one side only
    args = ap.parse_args()
    if args.impl == "pyg":
        print(json.dumps(run_pyg(args)))
        return
    if args.edge_dim:
        args.data = with_edge_features(args.data, args.root, args.edge_dim)
    # the two sides alternate (PyG, ours, PyG, ours, ...) so that the machine's drift, 10-20 %
    # over minutes on a shared VM, hits both alike; the median of the paired ratios is
    # reported beside the ratio of the medians
    pygs, ourss = [], []
    for r in range(args.repeats):
        p = subprocess.run([sys.executable, __file__, "--impl", "pyg", "--data", args.data,
                            "--root", args.root, "--epochs", str(args.epochs), "--threads",
                            str(args.threads), "--seed", str(args.seed + r),
                            "--device", args.device], capture_output=True,
                           text=True, env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        if p.returncode != 0:
            raise SystemExit(f"PyG run failed:\n{p.stderr[-3000:]}")
        pygs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        ourss.append(run_ours(args, 1, args.threads, args.seed + r))
        print(f"pair {r}   : pyg {pygs[-1]['events_per_s']:8.0f}  ours {ourss[-1]['events_per_s']:8.0f} "
              f"events/s", flush=True)
    paired = sorted(o["events_per_s"] / q["events_per_s"] for o, q in zip(ourss, pygs))
    pyg = _median_run(pygs)
    print(f"pyg      : {pyg['events_per_s']:8.0f} events/s ({pyg['events_per_cpu_s']:.0f} per CPU s)  test AP {pyg['test_ap']:.4f} "
          f"(per-batch mean {pyg['test_ap_batch_mean']:.4f})  peak RSS {pyg['peak_rss_mib']:.0f} MiB",
          flush=True)
    ours = _median_run(ourss)
    print(f"ours 1p  : {ours['events_per_s']:8.0f} events/s ({ours['events_per_cpu_s']:.0f} per CPU s)  test AP {ours['test_ap']:.4f}  "
          f"peak RSS per rank {ours['peak_rss_mib_per_rank']} MiB", flush=True)
    ours2 = None
    if not args.skip_2proc and args.device == "cpu":
        ours2 = run_ours(args, 2, max(1, args.threads // 2), args.seed)
        print(f"ours 2p  : {ours2['events_per_s']:8.0f} events/s  test AP {ours2['test_ap']:.4f}  "
              f"peak RSS per rank {ours2['peak_rss_mib_per_rank']} MiB", flush=True)
    res = {"data": Path(args.data).name if args.edge_dim else args.data,
           "edge_dim": args.edge_dim, "epochs": args.epochs, "threads": args.threads,
           "device": args.device,
           "repeats": args.repeats, "config": "time_delta: mail, att_variant: tgl",
           "ours_events_per_s": round(ours["events_per_s"], 1),
           "pyg_events_per_s": round(pyg["events_per_s"], 1),
           "ratio": round(ours["events_per_s"] / pyg["events_per_s"], 3),
           "ratio_paired_median": round(paired[len(paired) // 2], 3),
           "ours_events_per_cpu_s": round(ours["events_per_cpu_s"], 1),
           "pyg_events_per_cpu_s": round(pyg["events_per_cpu_s"], 1),
           "cpu_ratio": round(ours["events_per_cpu_s"] / pyg["events_per_cpu_s"], 3),
           "ours_test_ap": round(ours["test_ap"], 4), "pyg_test_ap": round(pyg["test_ap"], 4),
           "pyg_test_ap_batch_mean": round(pyg["test_ap_batch_mean"], 4),
           "ours_peak_rss_mib_1proc": ours["peak_rss_mib_per_rank"],
           "pyg_peak_rss_mib": round(pyg["peak_rss_mib"], 1)}
    if args.device == "cuda":
        res.update(ours_peak_gpu_mib=ours["peak_gpu_mib_per_rank"],
                   pyg_peak_gpu_mib=round(pyg["peak_gpu_mib"], 1))
    if ours2 is not None:
        res.update(ours_2proc_events_per_s=round(ours2["events_per_s"], 1),
                   ours_2proc_test_ap=round(ours2["test_ap"], 4),
                   ours_peak_rss_mib_2proc=ours2["peak_rss_mib_per_rank"])
    print(json.dumps(res))


if __name__ == "__main__":
    main()
