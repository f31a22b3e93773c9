"""Train a memory-based temporal GNN (TGN by default) for link prediction, on 1 or N processes.

    torchrun --nproc_per_node=2 examples/ctdg/train_tgn.py --data wikipedia --root "$TGL_DIST_DATASETS"
    python examples/ctdg/train_tgn.py                  # built-in synthetic dataset, world of one

How this differs from the TGN paper and from TGL's ``train.py``:

* each rank owns a partition of the nodes with their memory and mailbox
  (:class:`tgl_dist.memory.SharedMailBox`); every step covers the same window of the
  global event stream on all ranks, ``--batch-size`` events in all (split over ranks),
  so 1 and N processes see the same memory staleness;
* the memory update follows TGL (algorithms.md §1): memory is computed on the fly from
  the mailbox, written back after the step for the positive events only;
* AP and AUC are computed over the WHOLE validation / test split gathered from all
  ranks (not a mean of per-batch scores); MRR ranks each positive against
  ``--eval-neg`` negatives (TGB's tie rule);
* validation continues the memory from training and test from validation; memory is
  reset at every epoch start. The reported test figures are those of the epoch with
  the best validation AP (early stopping on it, ``--patience``).

Checkpoints and recovery (docs/checkpoint.md): ``--checkpoint-dir DIR`` writes versioned,
crash-safe checkpoints every ``--checkpoint-every`` (``500``: every 500 training steps;
``1e``: every epoch; one is always written after the last epoch); ``--resume`` continues
the committed run up to ``--epochs`` in total and ends exactly as a run that never
stopped. A dead rank makes the others stop within ``--timeout`` seconds with an error
naming the epoch, split and step. With torchrun::

    torchrun --nproc_per_node=2 --max-restarts=3 examples/ctdg/train_tgn.py \
        --checkpoint-dir runs/ck --checkpoint-every 500 --resume

Prints tqdm progress on rank 0, writes a metrics CSV per epoch, and ends with ONE line
of JSON on rank 0.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import random
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from tgl_dist.checkpoint import (RunCheckpoint, capture,  # noqa: E402
                                 config_dict, partition_identity, restore)
from tgl_dist.cli import (HelpFormatter, add_run_arguments, file_path,  # noqa: E402
                          folder_path, init_context, non_negative_int, parse_run_arguments,
                          positive_float, positive_int, run_script, seed_int)
from tgl_dist.dist import all_gather_v, broadcast_object  # noqa: E402
from tgl_dist.errors import TGLDistError  # noqa: E402
from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph  # noqa: E402
from tgl_dist.loader import DistributedDataLoader  # noqa: E402
from tgl_dist.memory import SharedMailBox  # noqa: E402
from tgl_dist.metrics import EarlyStopMonitor, LinkPredMetrics  # noqa: E402
from tgl_dist.ctdg import build_model, load_config, run_epoch
from tgl_dist.optim import build_optimizer
from tgl_dist.dist import broadcast_parameters
from tgl_dist.partition import partition_graph, partition_load  # noqa: E402
from tgl_dist.partition.storage import MANIFEST, written_from  # noqa: E402
from tgl_dist.sampling import NegativeSampling, NeighborSampler  # noqa: E402

log = logging.getLogger("train_tgn")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--data", default="synthetic", help="dataset name or file path")
    p.add_argument("--format", default=None, help="file format of a path (default: inferred)")
    p.add_argument("--root", default=None, help="folder of the named datasets (default: "
                   "$TGL_DIST_DATASETS, else ~/.cache/tgl_dist/datasets)")
    p.add_argument("--config", default=str(REPO / "configs" / "TGN.yml"), help="TGL-style YAML config")
    p.add_argument("--parts", type=folder_path, default="parts", help="partition root (OUT of python -m tgl_dist.partition)")
    p.add_argument("--partition-algo", default="metis_for_tgnn", help="partitioner used on first use")
    p.add_argument("--repartition", action="store_true", help="partition again even if a partition exists")
    p.add_argument("--epochs", type=positive_int, default=None, help="override train.epoch")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="override train.batch_size (events per step over ALL ranks)")
    p.add_argument("--lr", type=positive_float, default=None, help="override train.lr")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of parameters and negatives")
    p.add_argument("--patience", type=positive_int, default=None,
                   help="early stopping on validation AP (override train.patience, default 5)")
    p.add_argument("--eval-neg", type=positive_int, default=9, help="negatives per positive for MRR (val/test)")
    p.add_argument("--sampling-mode", default="full", choices=["full", "partitioned"],
                   help="replicated T-CSR or per-owner sampling requests")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads per process")
    p.add_argument("--queue-size", type=non_negative_int, default=None,
                   help="steps the loader samples ahead in a background thread (default: 0 "
                        "when a process has <= 2 cores, where the thread only competes with "
                        "the model's threads: TGN on wikipedia, 2 cores, 16,600-16,800 "
                        "training events/s without it, 14,550 with 2; else 4)")
    p.add_argument("--metrics-csv", type=file_path, default=None, help="per-epoch CSV (default: <parts>/<data>/metrics_<model>_<P>.csv)")
    p.add_argument("--num-nodes", type=positive_int, default=None, help="synthetic: nodes")
    p.add_argument("--num-events", type=positive_int, default=None, help="synthetic: events")
    p.add_argument("--data-seed", type=seed_int, default=None, help="synthetic: generator seed")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    add_run_arguments(p)
    return p


def median(xs):
    """The upper median (NaN for no values)."""
    return sorted(xs)[len(xs) // 2] if xs else float("nan")


def check_parts_root(root: Path) -> None:
    """``ValueError`` when ``--parts`` names a level below the partition root: one
    partition (``<root>/<name>/<algo>_<P>``, which holds the manifest) or one dataset's
    partitions (``<root>/<name>``). Either would get a new partition written inside it."""
    if (root / MANIFEST).is_file():
        raise ValueError(f"--parts {root} is one partition (it holds {MANIFEST}); --parts takes "
                         f"the root that python -m tgl_dist.partition --out wrote into: "
                         f"--parts {root.parent.parent}")
    if root.is_dir() and any((d / MANIFEST).is_file() for d in root.iterdir() if d.is_dir()):
        raise ValueError(f"--parts {root} holds one dataset's partitions; --parts takes the "
                         f"folder above it (the --out of python -m tgl_dist.partition): "
                         f"--parts {root.parent}")


def check_splits(g, data: str) -> None:
    """``ValueError`` when the chronological split leaves train, validation or test empty:
    validation and test are the events after the 70 % and 85 % quantiles of time, so a
    stream with (nearly) one timestamp, e.g. a column read as time that is not one, has
    no validation or test events, and every metric would be NaN."""
    counts = {k: int(g.masks[k].sum()) for k in ("train", "val", "test")}
    empty = [k for k, n in counts.items() if n == 0]
    if empty:
        raise ValueError(
            f"{data}: the chronological split leaves {' and '.join(empty)} without events "
            f"(train/val/test {counts['train']}/{counts['val']}/{counts['test']} of "
            f"{g.num_events}; {int(g.t.unique().numel())} distinct timestamps from "
            f"{float(g.t.min()) if g.num_events else 0:g} to "
            f"{float(g.t.max()) if g.num_events else 0:g}). Validation and test are the "
            f"events after the 70 % and 85 % quantiles of time: check that the column read "
            f"as time is the time (--format)")


def ensure_partition(args, ctx) -> Path:
    """Rank 0 loads the dataset and partitions it if ``parts/<name>/<algo>_<P>`` is absent
    or was written from other data (its manifest's fingerprint differs: an edited file, or
    another ``--num-events`` or ``--data-seed``)."""
    folder = None
    err = None
    if ctx.rank == 0:
        try:
            from tgl_dist.data import load_dataset
            kw = {k: v for k, v in (("num_nodes", args.num_nodes), ("num_events", args.num_events),
                                    ("seed", args.data_seed)) if v is not None}
            check_parts_root(Path(args.parts))
            g = load_dataset(args.data, root=args.root, format=args.format, **kw)
            check_splits(g, args.data)
            folder = Path(args.parts) / g.name
            part = folder / f"{args.partition_algo}_{ctx.world_size}"
            if args.repartition or not written_from(part, g.fingerprint()):
                if part.is_dir() and not args.repartition:
                    log.warning("%s was written from other data than %s; partitioning again",
                                part, args.data)
                log.info("partitioning %s into %d parts with %s", g.name, ctx.world_size,
                         args.partition_algo)
                partition_graph(g, ctx.world_size, args.partition_algo, args.parts, force=True)
        except (TGLDistError, ValueError, OSError) as e:   # OSError: --parts not writable
            err = f"{type(e).__name__}: {e}"
    folder, err = broadcast_object((folder, err))
    if err:
        raise SystemExit(f"error: {err}")
    return Path(folder)


def main(argv=None) -> dict:
    args, every = parse_run_arguments(build_parser(), argv)
    # the library logs warnings only; this script's own progress lines are INFO
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    ctx = init_context(args)   # --device, --backend, --timeout
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // ctx.world_size))
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)
    cfg = load_config(args.config)
    flags = {"epoch": "--epochs", "batch_size": "--batch-size", "lr": "--lr",
             "patience": "--patience"}
    for key, flag in flags.items():            # a bad override names the flag, not the field
        v = getattr(args, flag[2:].replace("-", "_"))
        if v is not None:
            try:
                cfg = cfg.replace(train={key: v})
            except TGLDistError as e:
                raise SystemExit(f"error: {flag} {v}: {e}") from None
    B = cfg.train.batch_size   # events per step over all ranks, as one process runs them
    if B % ctx.world_size:
        raise SystemExit(f"error: the batch size {B} (events per step over all ranks) must be a "
                         f"multiple of the {ctx.world_size} processes (each step's window is "
                         f"the batch size per process x processes; a smaller window would "
                         f"change what the run learns)")
    per_rank = B // ctx.world_size
    chunk = None
    if cfg.train.reorder:  # TGL's random chunk scheduling: windows shift by chunks of B / reorder
        if B % cfg.train.reorder:
            raise SystemExit(f"error: train.reorder {cfg.train.reorder} must divide the batch "
                             f"size {B}")
        chunk = B // cfg.train.reorder
    folder = ensure_partition(args, ctx)
    pdata = partition_load(folder, args.partition_algo)
    graph = DistributedGraphStore(pdata)
    smp = cfg.sampling
    sampler = None
    if not smp.no_sample:
        tcsr = TemporalNeighborSampleGraph(pdata, mode=args.sampling_mode)
        sampler = NeighborSampler(graph.num_nodes, smp.layer, list(smp.neighbor), tcsr,
                                  policy=smp.strategy, seed=args.seed, graph_name=folder.name)
    mailbox = None
    if cfg.has_memory:
        mailbox = SharedMailBox(int(pdata.ids.numel()), cfg.memory, graph.edge_feat_dim,
                                partition_book=pdata.book, device=ctx.device)
    cores = max(1, (os.cpu_count() or 1) // ctx.world_size)
    queue_size = args.queue_size if args.queue_size is not None else (0 if cores <= 2 else 4)
    train_neg = NegativeSampling("triplet", "random", 1, seed=args.seed)
    eval_neg = NegativeSampling("triplet", "random", args.eval_neg, seed=args.seed)
    loaders = {
        split: DistributedDataLoader(graph, split, sampler=sampler,
                                     neg_sampler=train_neg if split == "train" else eval_neg,
                                     batch_size=per_rank, train=split == "train", mailbox=mailbox,
                                     chunk_size=chunk if split == "train" else None,
                                     seed=args.seed, queue_size=queue_size,
                                     group=ctx.new_group(),  # with --timeout
                                     device=ctx.device)      # steps handed out there
        for split in ("train", "val", "test")}
    model = build_model(cfg, graph.node_feat_dim, graph.edge_feat_dim,
                        num_nodes=graph.num_nodes, partition_book=pdata.book).to(ctx.device)
    broadcast_parameters(model)
    opt = build_optimizer(model, lr=cfg.train.lr)
    stopper = EarlyStopMonitor(patience=cfg.train.patience)
    ck = RunCheckpoint(args.checkpoint_dir, every, keep_every=args.checkpoint_keep_every,
                       resume=args.resume,
                       run_meta={"partition": partition_identity(pdata.manifest),
                                 "config": config_dict(cfg, drop=[("train", "epoch")]),
                                 "seed": args.seed, "eval_neg": args.eval_neg,
                                 "sampling_mode": args.sampling_mode})
    history, best, speeds, cpu_speeds = [], None, [], []
    start_epoch, start_step, global_step, partial, done = 0, 0, 0, None, False
    saved = ck.load() if ck.enabled else None
    if saved is not None:  # continue the committed run (RNG states restored last)
        dense, shard, meta = saved
        loop, partial = restore(dense, shard, model, opt, mailbox)
        history, best = loop["history"], loop["best"]
        speeds, cpu_speeds = loop["speeds"], loop["cpu_speeds"]
        stopper.load_state_dict(loop["stopper"])
        start_epoch, start_step = int(meta["epoch"]), int(meta["step"])
        global_step, done = int(meta["global_step"]), bool(meta["done"])

    def save_checkpoint(epoch, step, acc=None, metrics=None, finished=False):
        loop = {"history": history, "best": best, "stopper": stopper.state_dict(),
                "speeds": speeds, "cpu_speeds": cpu_speeds, "args": vars(args)}
        part = None if acc is None else {"acc": dict(acc), "metrics": metrics.state_dict()}
        d, sh = capture(model, opt, mailbox, ctx.rank, loop, part)
        ck.save(d, sh, {"epoch": epoch, "step": step, "global_step": global_step,
                        "done": finished})

    csv_path = Path(args.metrics_csv or folder / f"metrics_{cfg.name}_{ctx.world_size}.csv")
    fields = ["epoch", "train_loss", "train_ap", "train_events_per_s", "val_ap", "val_auc",
              "val_mrr", "test_ap", "test_auc", "test_mrr", "val_ap_batch_mean",
              "test_ap_batch_mean", "epoch_s"]
    writer = None

    def csv_row(row):
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}
    if ctx.rank == 0:
        try:
            csv_path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(csv_path, "w", newline="")
        except OSError as e:
            raise SystemExit(f"error: --metrics-csv {csv_path}: cannot be written "
                             f"({e.strerror or e})") from None
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in history:  # a resumed run rewrites the epochs it restored
            writer.writerow(csv_row(row))
        fh.flush()
    bar = None
    if ctx.rank == 0 and not args.no_progress:
        from tqdm import tqdm
    with ck.guard():  # a dead peer: PeerFailureError naming the epoch, split and step
        for epoch in range(start_epoch, cfg.train.epoch):
            if done:
                break
            t_ep = time.perf_counter()
            mid_epoch = epoch == start_epoch and partial is not None
            if mailbox is not None and not mid_epoch:
                mailbox.reset()
            row = {"epoch": epoch}
            for split in ("train", "val", "test"):
                m = LinkPredMetrics()
                first, acc0 = 0, None
                if split == "train" and mid_epoch:  # the partial epoch's accumulators
                    first, acc0 = start_step, partial["acc"]
                    m.load_state_dict(partial["metrics"])
                loaders[split].set_epoch(epoch, first)
                if ctx.rank == 0 and not args.no_progress:
                    bar = tqdm(total=len(loaders[split]), initial=first,
                               desc=f"epoch {epoch} {split}", leave=False, file=sys.stderr)
                ck.at(epoch, split, first)

                def on_step(acc, epoch=epoch, split=split, m=m):
                    nonlocal global_step
                    ck.at(epoch, split, acc["steps"])
                    if split == "train":
                        global_step += 1
                        if ck.step_due(global_step):
                            save_checkpoint(epoch, acc["steps"], acc, m)
                res = run_epoch(model, loaders[split], mailbox, opt if split == "train" else None,
                                m, progress=bar, on_step=on_step, resume=acc0)
                if bar is not None:
                    bar.close()
                r = m.compute()
                if split == "train":
                    # a resumed partial epoch's speed counts events from before the resume
                    eps = float("nan") if acc0 is not None else res["events_per_s"]
                    row.update(train_loss=res["loss"], train_ap=r["ap"], train_events_per_s=eps)
                    if acc0 is None:
                        speeds.append(res["events_per_s"])
                        cpu_speeds.append(res["events_per_cpu_s"])
                else:
                    row.update({f"{split}_ap": r["ap"], f"{split}_auc": r["auc"],
                                f"{split}_mrr": r.get("mrr", float("nan")),
                                f"{split}_ap_batch_mean": res["ap_batch_mean"]})
            partial = None
            row["epoch_s"] = time.perf_counter() - t_ep
            history.append(row)
            if writer is not None:
                writer.writerow(csv_row(row))
                fh.flush()
                log.info("epoch %d: loss %.4f  train AP %.4f  val AP %.4f  test AP %.4f  "
                         "(%.0f events/s)", epoch, row["train_loss"], row["train_ap"],
                         row["val_ap"], row["test_ap"], row["train_events_per_s"])
            if best is None or row["val_ap"] > best["val_ap"]:
                best = dict(row)
            done = stopper.step(row["val_ap"])
            if ck.epoch_due(epoch, last=done or epoch == cfg.train.epoch - 1):
                save_checkpoint(epoch + 1, 0, finished=done)
    epochs_run = len(history)
    if best is None:
        raise SystemExit("error: no epoch to report (--epochs 0, or a finished checkpoint "
                         "with no history)")
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0],
                       dtype=torch.float64)
    rss_all = all_gather_v(rss)
    summary = {"model": cfg.name, "data": folder.name, "world_size": ctx.world_size,
               "epochs": epochs_run, "best_epoch": best["epoch"], "val_ap": best["val_ap"],
               "val_auc": best["val_auc"], "test_ap": best["test_ap"], "test_auc": best["test_auc"],
               "test_mrr": best["test_mrr"], "test_ap_batch_mean": best["test_ap_batch_mean"],
               "train_events_per_s": median(speeds),
               "train_events_per_cpu_s": median(cpu_speeds),
               "peak_rss_mib": float(rss_all.max()),
               "peak_rss_mib_per_rank": [round(float(x), 1) for x in rss_all],
               "device": str(ctx.device), "backend": ctx.backend,
               "batch_size": cfg.train.batch_size, "partition_algo": args.partition_algo,
               "metrics_csv": str(csv_path), "checkpoint_version": ck.last_version}
    if ctx.device.type == "cuda":
        gpu = torch.tensor([torch.cuda.max_memory_allocated(ctx.device) / 2**20], dtype=torch.float64)
        summary["peak_gpu_mib_per_rank"] = [round(float(x), 1) for x in all_gather_v(gpu)]
    if writer is not None:
        fh.close()
        clean = {k: (None if isinstance(v, float) and v != v else  # NaN -> null (strict JSON)
                     round(v, 5) if isinstance(v, float) else v) for k, v in summary.items()}
        print(json.dumps(clean), flush=True)
    for ld in loaders.values():
        ld._join() if hasattr(ld, "_join") else None
    ctx.shutdown()
    return summary


if __name__ == "__main__":
    run_script(main)
