"""Train a memory-based temporal GNN (TGN by default) for link prediction, on 1 or N processes.

    torchrun --nproc_per_node=2 examples/ctdg/train_tgn.py --data wikipedia --root "$TGL_DIST_DATASETS"
    python examples/ctdg/train_tgn.py                  # built-in synthetic dataset, world of one

How this differs from the TGN paper and from TGL's ``train.py`` (docs/training.md):

* each rank owns a partition of the nodes with their memory and mailbox; every step
  covers the same window of the global event stream on all ranks, ``--batch-size``
  events in all (split over ranks), so 1 and N processes see the same memory staleness;
* the memory update follows TGL: computed on the fly from the mailbox, written back
  after the step for the positive events only;
* AP and AUC are over the WHOLE validation / test split gathered from all ranks (not a
  mean of per-batch scores); MRR ranks each positive against ``--eval-neg`` negatives;
* memory is reset at every epoch start; validation continues it from training, test
  from validation. Test figures are those of the epoch with the best validation AP
  (early stopping on it, ``--patience``);
* ``--eval-protocol tgb`` (a TGB dataset): TGB's leaderboard protocol instead, each
  positive against TGB's own negatives, MRR and hits@10, selection on validation MRR::

    python examples/ctdg/train_tgn.py --data tgbl-wiki --root "$TGL_DIST_DATASETS" --eval-protocol tgb

Checkpoints (docs/checkpoint.md): ``--checkpoint-dir DIR`` writes versioned, crash-safe
checkpoints every ``--checkpoint-every`` (``500``: training steps; ``1e``: epochs; one
after the last epoch); ``--resume`` continues the committed run up to ``--epochs`` and
ends exactly as a run that never stopped. A dead rank makes the others stop within
``--timeout`` seconds naming the epoch, split and step. With torchrun::

    torchrun --nproc_per_node=2 --max-restarts=3 examples/ctdg/train_tgn.py \
        --checkpoint-dir runs/ck --checkpoint-every 500 --resume

The loop is :class:`tgl_dist.ctdg.Trainer`: tqdm progress on rank 0, a metrics CSV per
epoch, and ONE line of JSON on rank 0 at the end.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "configs" / "TGN_DyGLib-embedding.yml"   # docs/models.md, "Which config"
if str(REPO) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(REPO))

from tgl_dist.cli import (HelpFormatter, add_run_arguments, file_path,  # noqa: E402
                          folder_path, start_run, non_negative_int, parse_run_arguments,
                          positive_float, positive_int, run_script, seed_int)
from tgl_dist.cli import add_eval_strategies  # noqa: E402
from tgl_dist.ctdg import ConfigError, Trainer, load_config, summary_json  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    models = sorted(f.stem for f in (REPO / "configs").glob("*.yml"))   # the shipped configs
    tr = load_config(DEFAULT_CONFIG).train
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=HelpFormatter)
    p.add_argument("--data", default="synthetic", help="dataset name or file path")
    p.add_argument("--format", default=None, help="file format of a path (default: inferred)")
    p.add_argument("--root", default=None, help="folder of the named datasets (default: "
                   "$TGL_DIST_DATASETS, else ~/.cache/tgl_dist/datasets)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="TGL-style YAML config (default: "
                   f"configs/{DEFAULT_CONFIG.name}, TGN with DyGLib's settings and a node embedding; docs/models.md "
                   f"says which config suits which data); the shipped models: configs/<NAME>.yml, NAME one of "
                   f"{', '.join(models)}")
    p.add_argument("--parts", type=folder_path, default="parts", help="partition root (OUT of python -m tgl_dist.partition)")
    p.add_argument("--partition-algo", default="metis_for_tgnn", help="partitioner used on first use")
    p.add_argument("--repartition", action="store_true", help="partition again even if a partition exists")
    p.add_argument("--epochs", type=positive_int, default=None, help=f"epochs (default: the config's train.epoch, "
                   f"{tr.epoch} in configs/{DEFAULT_CONFIG.name}; early stopping after train.patience, {tr.patience}, epochs without a better val AP)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="override train.batch_size (events per step over ALL ranks)")
    p.add_argument("--lr", type=positive_float, default=None, help="override train.lr")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of parameters and negatives")
    p.add_argument("--patience", type=positive_int, default=None, help=f"early stopping on val AP (override train.patience: {tr.patience} in configs/{DEFAULT_CONFIG.name})")
    p.add_argument("--eval-neg", type=positive_int, default=9, help="negatives per positive for MRR (val/test; "
                   "--eval-protocol random)")
    p.add_argument("--eval-protocol", default="random", choices=["random", "tgb"],
                   help="random: --eval-neg sampled negatives per val/test positive, model selected on val AP; "
                        "tgb: TGB's leaderboard protocol for a TGB dataset (--data tgbl-wiki, ...): each positive "
                        "ranked against TGB's own pre-generated negatives (the dataset's *_val_ns/*_test_ns files), "
                        "test MRR and hits@10 as TGB's Evaluator computes them, model selected on val MRR, EdgeBank "
                        "on the same negatives. Its evaluation scores q negatives per positive (about 1000 on "
                        "tgbl-wiki), so val/test cost about q/--eval-neg times the random protocol's "
                        "(docs/evaluation.md#tgb-protocol)")
    add_eval_strategies(p)
    p.add_argument("--sampling-mode", default="auto", choices=["auto", "full", "partitioned"],
                   help="full: every rank holds the whole T-CSR (no sampler requests); partitioned: a rank holds "
                        "its nodes' neighbourhoods and asks their owners (memory falls as 1/P); auto: full where its "
                        "peak fits a quarter of the machine's available memory over its ranks, else partitioned")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads per process (default: the cores over the ranks on this machine)")
    p.add_argument("--queue-size", type=non_negative_int, default=None,
                   help="steps the loader samples ahead in a background thread (default: 0 when a process has <= 2 "
                        "cores, where the thread only competes with the model's threads, see benchmarks/RESULTS.md; else 4)")
    p.add_argument("--metrics-csv", type=file_path, default=None, help="per-epoch CSV (default: <out>/metrics.csv)")
    p.add_argument("--num-nodes", type=positive_int, default=None, help="synthetic: nodes")
    p.add_argument("--num-events", type=positive_int, default=None, help="synthetic: events")
    p.add_argument("--data-seed", type=seed_int, default=None, help="synthetic: generator seed")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    add_run_arguments(p, run_folder=True)   # --out: the run folder
    return p


def main(argv=None) -> dict:
    args, every = parse_run_arguments(build_parser(), argv)
    ctx = start_run(args)   # logging, --device/--backend/--timeout, --threads (per node)
    cfg = load_config(args.config)
    for key, flag in (("epoch", "--epochs"), ("batch_size", "--batch-size"), ("lr", "--lr"),
                      ("patience", "--patience")):   # a bad override names the flag
        v = getattr(args, flag[2:].replace("-", "_"))
        try:   # --batch-size is the global batch, also over a TGL dist config's local one
            cfg = cfg if v is None else cfg.replace(
                train={key: v, **({"local_batch_size": None} if key == "batch_size" else {})})
        except ConfigError as e:
            raise SystemExit(f"error: {flag} {v}: {e}") from None
    data_kw = {k: v for k, v in (("num_nodes", args.num_nodes), ("num_events", args.num_events),
                                 ("seed", args.data_seed)) if v is not None}
    summary = Trainer(cfg, args.data, parts=args.parts, context=ctx, root=args.root,
                      format=args.format, dataset_kwargs=data_kw,
                      partition_algo=args.partition_algo, repartition=args.repartition,
                      sampling_mode=args.sampling_mode, eval_neg=args.eval_neg, seed=args.seed,
                      eval_protocol=args.eval_protocol,
                      queue_size=args.queue_size, metrics_csv=args.metrics_csv,
                      progress=not args.no_progress, checkpoint_dir=args.checkpoint_dir,
                      checkpoint_every=every, checkpoint_keep_every=args.checkpoint_keep_every,
                      resume=args.resume, out=args.out,
                      eval_strategies=args.eval_strategies).fit()
    if ctx.rank == 0:
        print(summary_json(summary), flush=True)
    ctx.shutdown()
    return summary


if __name__ == "__main__":
    run_script(main)
