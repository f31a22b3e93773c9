"""Train a memory model of your own with tgl_dist.ctdg.Trainer, on 1 or N processes.

    torchrun --nproc_per_node=2 examples/ctdg/custom_model.py --data synthetic --epochs 5
    python examples/ctdg/custom_model.py                 # built-in synthetic data, world of one

``DecayMemory`` is none of the five built-in models (docs/training.md, "A model of your
own"): a node's memory keeps a share of itself that decays with the time since its last
update and takes the rest from its last mail,

    s^ = k * s + (1 - k) * tanh(W mail),   k = sigmoid(w log(1 + dt) + b)

(a convex mix, so the memory stays in [-1, 1]), node features (when the data has them)
are added through a linear map, and a link (u, v) is scored by an MLP over
``[h_u * h_v, |h_u - h_v|, h_u + h_v]``. No neighbour sampling: the roots' own memory
only. The model is written against blocks and the Mailbox API: its ``write_back`` calls
``get_update_memory``, ``get_update_mail`` and ``set_mailbox_all_to_all(...,
reduce_Op='max')`` after every step, which the Trainer calls on every rank (the
built-in models use ``SharedMailBox.update`` instead). Everything else (partition on
first use, the per-rank batch split, whole-split evaluation, early stopping,
checkpoints, the CSV and the JSON summary) is the Trainer's.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List

import torch
from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from tgl_dist.cli import (HelpFormatter, add_run_arguments, folder_path,  # noqa: E402
                          start_run, parse_run_arguments, positive_float, positive_int,
                          run_script, seed_int)
from tgl_dist.cli import add_eval_strategies  # noqa: E402
from tgl_dist.ctdg import LinkPredOutput, Trainer, parse_config, summary_json  # noqa: E402


class DecayMemory(nn.Module):
    """A decaying node memory and an MLP link scorer (see the module docstring).

    Args:
        dim_memory: d_m. dim_mail: the mailbox's mail size (``mailbox.dim_mail``).
        dim_node: F node features (0: none).

    Shapes: S input rows of the batch (here the R roots ``[src | dst | neg]``), B events.
    """

    def __init__(self, dim_memory: int, dim_mail: int, dim_node: int = 0) -> None:
        super().__init__()
        self.gate = nn.Linear(1, dim_memory)
        self.absorb = nn.Linear(dim_mail, dim_memory)
        self.node = nn.Linear(dim_node, dim_memory) if dim_node else None
        self.score = nn.Sequential(nn.Linear(3 * dim_memory, dim_memory), nn.ReLU(),
                                   nn.Linear(dim_memory, 1))

    def update(self, sd) -> Tensor:
        """``s^ [S, d_m]`` from the state the loader attached to ``mfgs[0].srcdata``."""
        dt = (sd["ts"] - sd["mem_ts"]).float().clamp(min=0).view(-1, 1)
        keep = torch.sigmoid(self.gate(torch.log1p(dt)))
        return keep * sd["mem"] + (1 - keep) * torch.tanh(self.absorb(sd["mail"][:, 0]))

    def link(self, hu: Tensor, hv: Tensor) -> Tensor:
        return self.score(torch.cat([hu * hv, (hu - hv).abs(), hu + hv], 1)).view(-1)

    def forward(self, mfgs: List, metadata: Dict[str, Tensor]) -> LinkPredOutput:
        sd = mfgs[0].srcdata
        s_hat = self.update(sd)
        h = s_hat if self.node is None else s_hat + self.node(sd["h"].float())
        src, dst, neg = (metadata[k] for k in ("src_pos_index", "dst_pos_index", "dst_neg_index"))
        k = neg.numel() // max(src.numel(), 1)
        neg_src = metadata.get("src_neg_index", src.repeat(k))
        R = mfgs[-1].num_dst
        return LinkPredOutput(self.link(h[src], h[dst]), self.link(h[neg_src], h[neg]),
                              s_hat[:R].detach(), h[:R].detach())

    @torch.no_grad()
    def write_back(self, mailbox, roots, mfgs, metadata, out: LinkPredOutput) -> None:
        """Memory and mails of the positive events' endpoints, through the Mailbox API."""
        sd, R = mfgs[0].srcdata, out.memory.size(0)
        src, dst = metadata["src_pos_index"], metadata["dst_pos_index"]
        rows = torch.cat([src, dst])
        index, memory, memory_ts = mailbox.get_update_memory(sd["ID"][rows], out.memory[rows],
                                                             sd["ts"][rows])
        index, mail, mail_ts, order = mailbox.get_update_mail(
            sd["ID"][:R], src, dst, roots.t, roots.extra.get("f"), out.memory, eids=roots.eids)
        mailbox.set_mailbox_all_to_all(index, memory, memory_ts, mail, mail_ts,
                                       reduce_Op="max", order=order)


def config(epochs: int, batch_size: int, lr: float, dim: int):
    """The run's TGL-style config: roots only, a node memory of ``dim``, training settings."""
    return parse_config({
        "sampling": {"no_sample": True},
        "memory": {"type": "node", "dim_out": dim, "mailbox_size": 1, "mail_combine": "last",
                   "deliver_to": "self"},
        "gnn": {"arch": "identity"},
        "train": {"epoch": epochs, "batch_size": batch_size, "lr": lr, "patience": 3}},
        name="DecayMemory")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--data", default="synthetic", help="dataset name or file path")
    p.add_argument("--root", default=None, help="folder of the named datasets (default: "
                   "$TGL_DIST_DATASETS, else ~/.cache/tgl_dist/datasets)")
    p.add_argument("--parts", type=folder_path, default="parts", help="partition root")
    p.add_argument("--epochs", type=positive_int, default=5, help="epochs")
    p.add_argument("--batch-size", type=positive_int, default=200,
                   help="events per step over ALL ranks")
    p.add_argument("--lr", type=positive_float, default=1e-2, help="Adam learning rate")
    p.add_argument("--dim", type=positive_int, default=32, help="memory size d_m")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of parameters and negatives")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads per process")
    p.add_argument("--num-nodes", type=positive_int, default=None, help="synthetic: nodes")
    p.add_argument("--num-events", type=positive_int, default=None, help="synthetic: events")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    add_eval_strategies(p)
    add_run_arguments(p, run_folder=True)   # --out: the run folder
    return p


def main(argv=None) -> dict:
    args, every = parse_run_arguments(build_parser(), argv)
    ctx = start_run(args)   # logging, --device/--backend/--timeout, --threads (per node)
    data_kw = {k: v for k, v in (("num_nodes", args.num_nodes), ("num_events", args.num_events))
               if v is not None}
    trainer = Trainer(
        config(args.epochs, args.batch_size, args.lr, args.dim), args.data, parts=args.parts,
        model=lambda t: DecayMemory(args.dim, t.mailbox.dim_mail, t.graph.node_feat_dim),
        context=ctx, root=args.root, dataset_kwargs=data_kw, partition_algo="hash",
        seed=args.seed, progress=not args.no_progress, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=every, checkpoint_keep_every=args.checkpoint_keep_every,
        resume=args.resume, out=args.out, eval_strategies=args.eval_strategies)
    summary = trainer.fit()
    if ctx.rank == 0:
        print(summary_json(summary), flush=True)
    ctx.shutdown()
    return summary


if __name__ == "__main__":
    run_script(main)
