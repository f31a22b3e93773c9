"""Snapshots/s of one EvolveGCN-O training epoch: tgl_dist.dtdg vs a plain PyTorch Geometric version.

    python benchmarks/dtdg_throughput.py [--data twitter_tennis_rg17] [--epochs 3]

Both sides train the same model on the same windows with the same work per window:
EvolveGCN-O (IBM matrix-GRU weight evolution, 2 GCN layers of ``--hidden`` units, ReLU
between layers) over ``--hist-len`` history snapshots, embeddings of every history
snapshot computed, the last one scored by the same MLP head against one
corrupted-source negative per positive edge of the label snapshot, BCE, one Adam step
per window.

* ours: ``tgl_dist.dtdg`` in a world of one: per layer, all the window's weights are
  evolved first, then ONE block-diagonal sparse product covers every snapshot of the
  window, with the normalised adjacency precomputed once per graph;
* PyG: the way PyTorch Geometric Temporal's ``EvolveGCNO`` runs, a Python loop over the
  window's snapshots with ``gcn_norm`` + ``MessagePassing.propagate`` (PyG-Temporal's
  ``GCNConv_Fixed_W``) per snapshot and layer.

Snapshots/s = history snapshots processed / epoch seconds (best of ``--epochs`` timed
epochs after one warm-up, alternating the two sides). By default the seconds are this
process's CPU time (``--clock cpu``, one thread), which stays meaningful on a machine
shared with other jobs; wall-clock figures are printed too. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torch_geometric.nn import MessagePassing  # noqa: E402
from torch_geometric.nn.conv.gcn_conv import gcn_norm  # noqa: E402

from tgl_dist.dtdg import (DistGraph, Splitter, Trainer, build_model, build_task,  # noqa: E402
                           degree_features, load_dtdg)
from tgl_dist.dtdg.tasks import EdgeHead  # noqa: E402


# ----------------------------------------------------------- plain PyG model
class GCNConvFixedW(MessagePassing):
    """PyG-Temporal's ``GCNConv_Fixed_W``: GCN propagation with an externally given weight."""

    def __init__(self) -> None:
        super().__init__(aggr="add")

    def forward(self, W, x, edge_index, edge_weight):
        x = x @ W
        edge_index, norm = gcn_norm(edge_index, edge_weight, x.size(0), add_self_loops=True)
        return self.propagate(edge_index, x=x, edge_weight=norm)

    def message(self, x_j, edge_weight):
        return edge_weight.view(-1, 1) * x_j


class MatGRU(nn.Module):
    """IBM EvolveGCN ``mat_GRU_cell`` (three gates, each ``W x + U h + b``)."""

    def __init__(self, rows: int, cols: int) -> None:
        super().__init__()
        b = 1.0 / math.sqrt(rows)
        self.W = nn.ParameterList(nn.Parameter(torch.empty(rows, rows).uniform_(-b, b)) for _ in range(3))
        self.U = nn.ParameterList(nn.Parameter(torch.empty(rows, rows).uniform_(-b, b)) for _ in range(3))
        self.B = nn.ParameterList(nn.Parameter(torch.zeros(rows, cols)) for _ in range(3))

    def forward(self, x, h):
        z = torch.sigmoid(self.W[0] @ x + self.U[0] @ h + self.B[0])
        r = torch.sigmoid(self.W[1] @ x + self.U[1] @ h + self.B[1])
        h_cap = torch.tanh(self.W[2] @ x + self.U[2] @ (r * h) + self.B[2])
        return (1 - z) * h + z * h_cap


class PygEvolveGCNO(nn.Module):
    def __init__(self, dims):
        super().__init__()
        self.w0 = nn.ParameterList(nn.Parameter(nn.init.xavier_uniform_(torch.empty(a, b)))
                                   for a, b in zip(dims[:-1], dims[1:]))
        self.cells = nn.ModuleList(MatGRU(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.conv = GCNConvFixedW()

    def forward(self, snapshots):
        """``snapshots``: list of ``(x, edge_index, edge_weight)``; returns the last snapshot's embeddings."""
        ws = list(self.w0)
        for x, ei, ew in snapshots:
            h = x
            for layer in range(len(ws)):
                ws[layer] = self.cells[layer](ws[layer], ws[layer])
                h = self.conv(ws[layer], h, ei, ew)
                if layer < len(ws) - 1:
                    h = F.relu(h)
        return h


def pyg_epoch(model, head, opt, g, windows, gen) -> None:
    x = g.node()["x"]
    snaps = [g.get_snapshot(t) for t in range(g.num_snapshots)]
    for w in windows:
        opt.zero_grad()
        h = model([(x[:, t], snaps[t].edge_index, snaps[t].edge_weight) for t in w["hist_ts"]])
        s = snaps[w["label_ts"]]
        src, dst = s.edge_index
        neg = torch.randint(0, g.num_nodes, src.shape, generator=gen)
        pos, negs = head(h[src], h[dst]), head(h[neg], h[dst])
        loss = (F.binary_cross_entropy_with_logits(pos, torch.ones_like(pos))
                + F.binary_cross_entropy_with_logits(negs, torch.zeros_like(negs)))
        loss.backward()
        opt.step()


def timed(fn):
    """``(wall seconds, CPU seconds of this process)`` of ``fn()``."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="twitter_tennis_rg17")
    p.add_argument("--root", default=os.environ.get("TGL_DIST_DATASETS", str(REPO.parent / "shared" / "datasets")))
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--hist-len", type=int, default=10)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per side (after a warm-up)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clock", default="cpu", choices=["cpu", "wall"],
                   help="time base of snapshots/s: this process's CPU time (robust on a shared "
                        "machine, with --threads 1) or wall time")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    g = load_dtdg(args.data, args.root)
    g.node()["x"] = torch.cat([g.node()["x"].abs().log1p(), degree_features(g)], -1)
    F_in = g.node()["x"].size(-1)
    dims = [F_in, args.hidden, args.hidden]

    torch.manual_seed(0)
    graph = DistGraph.from_graph_data(g)
    ours = build_model({"model": "evolvegcn-o", "hidden_dims": dims[1:]}, graph)
    task = build_task("link_pred", graph, args.hidden)
    splitter = Splitter.from_graph(graph, hist_len=args.hist_len)
    trainer = Trainer(ours, task, splitter, lr=0.01, epochs=1)

    torch.manual_seed(0)
    pyg = PygEvolveGCNO(dims)
    head = EdgeHead(args.hidden)
    opt = torch.optim.Adam(list(pyg.parameters()) + list(head.parameters()), lr=0.01)
    gen = torch.Generator().manual_seed(0)

    snaps = sum(len(w["hist_ts"]) for w in splitter.train)
    trainer.train_epoch(0)
    pyg_epoch(pyg, head, opt, g, splitter.train, gen)
    ours_t, pyg_t = [], []
    for e in range(args.epochs):
        ours_t.append(timed(lambda: trainer.train_epoch(e + 1)))
        pyg_t.append(timed(lambda: pyg_epoch(pyg, head, opt, g, splitter.train, gen)))
        print(f"epoch {e}: ours {ours_t[-1][0]:.3f}s wall {ours_t[-1][1]:.3f}s cpu  "
              f"pyg {pyg_t[-1][0]:.3f}s wall {pyg_t[-1][1]:.3f}s cpu", flush=True)
    k = 0 if args.clock == "wall" else 1
    ours_sps, pyg_sps = snaps / min(t[k] for t in ours_t), snaps / min(t[k] for t in pyg_t)
    print(json.dumps({"benchmark": "dtdg_throughput", "model": "evolvegcn-o", "data": args.data,
                      "train_windows": len(splitter.train), "hist_len": args.hist_len,
                      "snapshots_per_epoch": snaps, "threads": args.threads, "clock": args.clock,
                      "ours_wall_snapshots_per_s": snaps / min(t[0] for t in ours_t),
                      "pyg_wall_snapshots_per_s": snaps / min(t[0] for t in pyg_t),
                      "ours_snapshots_per_s": ours_sps, "pyg_snapshots_per_s": pyg_sps,
                      "ratio": ours_sps / pyg_sps}))


if __name__ == "__main__":
    main()
