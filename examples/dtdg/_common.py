"""Shared driver of the DTDG examples: arguments, partition on first use, training, the JSON line."""
from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from tgl_dist.checkpoint import RunCheckpoint, partition_identity  # noqa: E402
from tgl_dist.cli import (HelpFormatter, add_run_arguments, folder_path,  # noqa: E402
                          init_context, non_negative_float, non_negative_int,
                          parse_run_arguments, positive_float, positive_int, run_script,
                          seed_int)
from tgl_dist.data.registry import default_root  # noqa: E402
from tgl_dist.dist import broadcast_object  # noqa: E402
from tgl_dist.errors import TGLDistError  # noqa: E402
from tgl_dist.dtdg import (Splitter, Trainer, build_model, build_task, degree_features,  # noqa: E402
                           get_graph, load_dtdg, model_names)
from tgl_dist.dtdg.build import canonical_name  # noqa: E402
from tgl_dist.dtdg.loaders import SIGNAL_LAYOUTS, past_signal_features  # noqa: E402
from tgl_dist.dtdg.partition import partition_path  # noqa: E402
from tgl_dist.partition.replicate import replicate_partition  # noqa: E402
from tgl_dist.partition.storage import read_manifest, written_from  # noqa: E402

log = logging.getLogger("dtdg_example")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def model_name(text: str) -> str:
    """argparse ``type=`` of ``--model``: a known model name or alias, as its canonical name
    (so a checkpoint written with ``egcn_o`` resumes with ``evolvegcn-o``)."""
    try:
        return canonical_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser(doc: str, data: str, model: str, hist_len: int, lr: float, epochs: int,
                 lags: int, dtype: str = "float32") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--data", default=data, help="dataset name (folder under --root), a file "
                   "(PGT .json, snapshot,src,dst[,weight] CSV, or a CTDG event file binned by "
                   "--span), or a CTDG dataset name binned by --span")
    p.add_argument("--format", default=None, help="format of a --data file: pgt-json, "
                   "snapshot-csv, or a CTDG event format (default: inferred from the name and "
                   "first line)")
    p.add_argument("--root", default=None, help="folder of the named datasets (default: "
                   "$TGL_DIST_DATASETS, else ~/.cache/tgl_dist/datasets)")
    p.add_argument("--parts", type=folder_path, default="parts",
                   help="partitions folder; written on first use, again when the data changed")
    p.add_argument("--model", type=model_name, default=model, help=f"one of {model_names()}")
    p.add_argument("--hidden-dim", type=positive_int, default=32, help="hidden size of the snapshot model")
    p.add_argument("--num-layers", type=positive_int, default=2, help="GNN layers per snapshot")
    p.add_argument("--node-embedding", type=non_negative_int, default=0, metavar="DIM",
                   help="learnable per-node input of size DIM appended to the features "
                        "(a sharded DistEmbedding trained by SparseAdam; 0 = none)")
    p.add_argument("--hist-len", type=positive_int, default=hist_len, help="history snapshots per window")
    p.add_argument("--epochs", type=positive_int, default=epochs, help="training epochs")
    p.add_argument("--patience", type=positive_int, default=10,
                   help="early stopping: epochs without a better validation (dev) metric")
    p.add_argument("--lr", type=positive_float, default=lr, help="learning rate (Adam)")
    p.add_argument("--weight-decay", type=non_negative_float, default=0.0, help="Adam weight decay")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (parameters, partitioning, sampling)")
    p.add_argument("--algo", default="metis", help="partitioning algorithm (random | metis)")
    p.add_argument("--num-parts", type=positive_int, default=None, help="must equal the world size (default: it)")
    p.add_argument("--lags", type=positive_int, default=lags, help="PGT node-signal files: features = this many past values")
    p.add_argument("--span", default="month", help="CTDG datasets: snapshot span (seconds, day, week, month)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads per process")
    p.add_argument("--dtype", default=dtype, choices=["float32", "float64"],
                   help="parameter / compute precision")
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default="WARNING",
                   help="logging level")
    add_run_arguments(p, "training windows (optimiser steps)")
    return p


def _prepare(args, ctx, task: str):
    """Rank 0 loads the data and (re)writes the partition if missing or stale; nodes that do not
    see rank 0's --parts get a copy; all ranks load their part."""
    num_parts = args.num_parts or ctx.world_size
    if num_parts != ctx.world_size:
        raise SystemExit(f"error: --num-parts {num_parts} but the world size is {ctx.world_size}")
    info, err = None, None
    if ctx.rank == 0:
        try:
            span = float(args.span) if args.span.replace(".", "", 1).isdigit() else args.span
            g = load_dtdg(args.data, args.root or default_root(), lags=args.lags, span=span,
                          format=args.format)
            if task == "node_regression" and "y" not in g.node():
                raise ValueError(f"{args.data} has no node targets (y) for node regression "
                                 f"(layout {g.meta().get('layout')!r}); train link prediction "
                                 f"on it (train_link_pred.py)")
            if task == "link_pred":     # counts -> log scale, plus per-snapshot degrees of the full graph
                x = g.node().get("x")
                if g.meta().get("layout") in SIGNAL_LAYOUTS:   # no signal after a snapshot's period
                    x = past_signal_features(g)
                deg = degree_features(g)
                g.node()["x"] = deg if x is None else torch.cat([torch.sign(x) * x.abs().log1p(), deg], -1)
                g.meta()["name"] = f"{g.name}-lp"
            path = partition_path(args.parts, g.name, args.algo, num_parts)
            if not written_from(path, g.fingerprint(), seed=args.seed):
                g.save_partition(args.parts, num_parts, args.algo, seed=args.seed, force=True)
            info = {"path": str(path), "name": g.meta()["name"]}
        except (TGLDistError, ValueError, OSError) as e:   # OSError: --parts not writable
            err = str(e)   # every rank stops with it (the others wait for rank 0)
    info, err = broadcast_object((info, err), 0, ctx.get_default_group())
    if err:
        raise SystemExit(f"error: {err}")
    try:   # nodes that do not see rank 0's --parts get a copy of its partition
        replicate_partition(Path(info["path"]), ctx.get_default_group())
    except TGLDistError as e:
        raise SystemExit(f"error: {e}") from None
    return get_graph(info["path"], ctx.get_default_group()), info


def run(doc: str, task: str, **defaults) -> dict:
    """Parse the arguments, train, print the JSON line; a dead peer ends it with a clear error."""
    return run_script(_run, doc, task, **defaults)


def _checkpointing(args, ctx, trainer, info, every) -> RunCheckpoint:
    """Wire --checkpoint-dir / --checkpoint-every / --resume into the trainer's hooks."""
    # what must match on resume: the partition (data, algorithm, part count) and the
    # arguments that change results; not where or how this run executes (device, backend,
    # threads, timeout, paths), so a GPU run resumes on the CPU and back, as for CTDG
    run_meta = {"partition": partition_identity(read_manifest(info["path"])),
                "args": {k: v for k, v in vars(args).items()
                         if k not in ("epochs", "checkpoint_dir", "checkpoint_every", "resume",
                                      "checkpoint_keep_every", "log_level", "timeout", "root",
                                      "parts", "data", "format", "threads", "device", "backend",
                                      "num_parts", "algo")}}
    ck = RunCheckpoint(args.checkpoint_dir, every, run_meta=run_meta, resume=args.resume,
                       keep_every=args.checkpoint_keep_every, group=ctx.get_default_group())
    saved = ck.load() if ck.enabled else None
    if saved is not None:
        trainer.load_checkpoint_state(*saved)
    steps = [trainer.start_epoch * len(trainer.splitter.train)
             + (trainer.partial or {}).get("windows", 0)]  # training windows done in the run

    def on_step(tr, epoch, done):
        ck.at(epoch, "train", done)
        steps[0] += 1
        if ck.step_due(steps[0]):
            ck.save(*tr.checkpoint_state())

    def on_epoch_end(tr, epoch, rec):
        if ck.epoch_due(epoch, last=tr.stopped or epoch == tr.epochs - 1):
            ck.save(*tr.checkpoint_state())
    trainer.step_hooks.append(on_step)
    trainer.hooks.append(on_epoch_end)
    trainer.eval_hooks.append(lambda tr, epoch, split: ck.at(epoch, split, -1))
    return ck


def _run(doc: str, task: str, **defaults) -> dict:
    args, every = parse_run_arguments(build_parser(doc, **defaults))
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    np.random.seed(args.seed)
    ctx = init_context(args)   # --device, --backend, --timeout
    t0 = time.perf_counter()
    graph, info = _prepare(args, ctx, task)
    graph.to(ctx.device)
    torch.manual_seed(args.seed)
    model = build_model(args, graph, ctx.get_default_group())
    head = build_task(task, graph, args.hidden_dim, **({"seed": args.seed} if task == "link_pred" else {}))
    model, head = model.to(ctx.device), head.to(ctx.device)
    if args.dtype == "float64":
        model, head = model.double(), head.double()
    try:
        splitter = Splitter.from_graph(graph, hist_len=args.hist_len, task=task)
    except ValueError as e:   # too few snapshots for --hist-len: the same on every rank
        raise SystemExit(f"error: --hist-len {args.hist_len}: {e}") from None
    trainer = Trainer(model, head, splitter, lr=args.lr, weight_decay=args.weight_decay,
                      epochs=args.epochs, patience=args.patience, progress=True)
    ck = _checkpointing(args, ctx, trainer, info, every)
    with ck.guard():  # a dead peer: PeerFailureError naming the epoch, split and step
        res = trainer.fit()
    keys = (["test_ap", "test_auc", "test_mrr", "baseline_test_ap", "baseline_test_auc",
             "baseline_test_mrr", "dev_ap"] if task == "link_pred"
            else ["test_mse", "baseline_test_mse", "dev_mse"])
    summary = {"model": model.model_name, "data": info["name"], "task": task,
               "world_size": ctx.world_size, "device": str(ctx.device), "algo": args.algo, "dtype": args.dtype, "epochs": res["epochs_run"],
               "best_epoch": res["best_epoch"], "hist_len": args.hist_len, "seed": args.seed,
               **{k: res.get(k, math.nan) for k in keys},
               "snapshots_per_s": res["snapshots_per_s"],
               "train_windows": len(splitter.train), "test_windows": len(splitter.test),
               "seconds": time.perf_counter() - t0, "checkpoint_version": ck.last_version}
    if ctx.rank == 0:
        print(json.dumps(summary), flush=True)
    ctx.shutdown()
    return summary
