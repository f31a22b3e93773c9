"""Reproduction table: CTDG models x datasets x DyGLib's three negative-sampling protocols, over seeds, beside DyGLib's published figures and EdgeBank.

    python benchmarks/reproduce.py --root ../shared/datasets --data uci wikipedia \\
        --models TGN JODIE DyRep APAN TGAT --seeds 0 1 2 [--nproc 2] [--out runs/reproduce]

Each (dataset, model, seed) is one run of ``examples/ctdg/train_tgn.py`` with
``--config configs/<MODEL>.yml --eval-strategies random,historical,inductive`` (and
``--batch-size``, ``--epochs``, ``--patience``, ``--lr`` when given): trained with random
negatives, the model of the epoch with the best validation AP is evaluated on the test
split with random, historical and inductive negatives (DyGLib's protocols, transductive
setting; ``docs/evaluation.md``), EdgeBank on the same negatives. ``--nproc N`` runs it under
torchrun with N processes. Each run writes its run folder under ``--out``; a run whose
``summary.json`` exists is not run again (the grid can be stopped and continued).

Output: a markdown table per protocol (rows model, columns dataset; ``mean +- std`` of
the test AP over the seeds, x100, std as numpy's ``np.std`` as DyGLib prints it), the
published figure beside each, EdgeBank's row, and each row's command; written to
``<out>/table.md`` and printed. The last line is one JSON object.

Published figures: DyGLib (Yu et al., NeurIPS 2023), transductive test AP x100 over 5
runs, as reprinted digit for digit in TPNet (Lu et al., NeurIPS 2024, arXiv 2410.04013:
Table 1 random, appendix Table 7 historical, Table 9 inductive) and DyG-Mamba (NeurIPS
2025, Table 2). DyGLib's Wikipedia runs use its 172 edge features, which our copy lacks:
compare Wikipedia only loosely. UCI's published features are all zeros, as ours. APAN
is not in DyGLib. bitcoin_alpha, facebook_wall and collegemsg have no published
figure (collegemsg is the UCI network from SNAP).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "ctdg" / "train_tgn.py"
STRATEGIES = ("random", "historical", "inductive")

# (model, dataset, strategy) -> (mean, std) of the transductive test AP x100 (see above)
PUBLISHED: Dict[Tuple[str, str, str], Tuple[float, float]] = {
    ("JODIE", "wikipedia", "random"): (96.50, 0.14), ("JODIE", "uci", "random"): (89.43, 1.09),
    ("DyRep", "wikipedia", "random"): (94.86, 0.06), ("DyRep", "uci", "random"): (65.14, 2.30),
    ("TGAT", "wikipedia", "random"): (96.94, 0.06), ("TGAT", "uci", "random"): (79.63, 0.70),
    ("TGN", "wikipedia", "random"): (98.45, 0.06), ("TGN", "uci", "random"): (92.34, 1.04),
    ("EdgeBank", "wikipedia", "random"): (90.37, 0.0), ("EdgeBank", "uci", "random"): (76.20, 0.0),
    ("JODIE", "wikipedia", "historical"): (83.01, 0.66),
    ("JODIE", "uci", "historical"): (75.24, 5.80),
    ("DyRep", "wikipedia", "historical"): (79.93, 0.56),
    ("DyRep", "uci", "historical"): (55.10, 3.14),
    ("TGAT", "wikipedia", "historical"): (87.38, 0.22),
    ("TGAT", "uci", "historical"): (68.27, 1.37),
    ("TGN", "wikipedia", "historical"): (86.86, 0.33),
    ("TGN", "uci", "historical"): (80.43, 2.12),
    ("EdgeBank", "wikipedia", "historical"): (73.35, 0.0),
    ("EdgeBank", "uci", "historical"): (65.50, 0.0),
    ("JODIE", "wikipedia", "inductive"): (75.65, 0.79),
    ("JODIE", "uci", "inductive"): (65.99, 1.40),
    ("DyRep", "wikipedia", "inductive"): (70.21, 1.58),
    ("DyRep", "uci", "inductive"): (54.79, 1.76),
    ("TGAT", "wikipedia", "inductive"): (87.00, 0.16),
    ("TGAT", "uci", "inductive"): (68.67, 0.84),
    ("TGN", "wikipedia", "inductive"): (85.62, 0.44),
    ("TGN", "uci", "inductive"): (70.94, 0.71),
    ("EdgeBank", "wikipedia", "inductive"): (80.63, 0.0),
    ("EdgeBank", "uci", "inductive"): (57.43, 0.0),
}


def published(model: str, data: str, strategy: str) -> Optional[Tuple[float, float]]:
    """DyGLib's figure for a config name (``TGN_DyGLib`` and ``TGN-embedding`` are TGN)."""
    base = model.replace("-", "_").split("_")[0]
    return PUBLISHED.get((base, data, strategy))


def key(strategy: str, what: str = "test_ap") -> str:
    """The summary key of ``what`` under ``strategy`` (random: the plain key)."""
    return what if strategy == "random" else f"{what}_{strategy}"


def command(args, data: str, model: str, seed: int, out: Path) -> List[str]:
    """The command line of one run."""
    cfg = Path(model) if model.endswith(".yml") else REPO / "configs" / f"{model}.yml"
    cmd = [str(TRAIN), "--data", data, "--config", str(cfg), "--seed", str(seed),
           "--eval-strategies", ",".join(STRATEGIES), "--out", str(out),
           "--parts", str(Path(args.out) / "parts"), "--no-progress"]
    if args.root:
        cmd += ["--root", args.root]
    for flag in ("epochs", "patience", "batch_size", "lr", "threads"):
        v = getattr(args, flag)
        if v is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(v)]
    if args.nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc}",
                f"--master_port={29500 + os.getpid() % 1000}"] + cmd
    return [sys.executable] + cmd


def run_one(args, data: str, model: str, seed: int) -> Optional[dict]:
    """Run (or read the finished) run of ``(data, model, seed)``; its summary (``None``:
    failed, or not run with ``--no-run``)."""
    name = f"{data}_{Path(model).stem}_s{seed}_p{args.nproc}"
    out = Path(args.out) / name
    done = out / "summary.json"
    if done.exists():
        return json.loads(done.read_text())
    if args.no_run:
        return None
    cmd = command(args, data, model, seed, out)
    print(f"# {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not done.exists():
        print(f"# {name} FAILED (exit {r.returncode}):\n{r.stderr[-3000:]}", file=sys.stderr)
        return None
    s = json.loads(done.read_text())
    s["wall_s"] = time.perf_counter() - t0
    done.write_text(json.dumps(s) + "\n")
    print(f"# {name}: test AP {s['test_ap']:.4f} (EdgeBank {s['edgebank_test_ap']:.4f}) "
          f"in {s['wall_s']:.0f} s", file=sys.stderr, flush=True)
    return s


def mean_std(xs: List[float]) -> Tuple[float, float]:
    """Mean and population std (numpy's default, what DyGLib prints)."""
    xs = [x for x in xs if x is not None and x == x]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def fmt(ms: Tuple[float, float]) -> str:
    m, s = ms
    return "-" if m != m else f"{100 * m:.2f} ± {100 * s:.2f}"


def table(args, results: Dict[Tuple[str, str], List[dict]]) -> Tuple[str, dict]:
    """The markdown tables and the aggregated figures."""
    lines, agg = [], {}
    for st in STRATEGIES:
        lines += [f"### Test AP, {st} negatives (x100, mean ± std over seeds "
                  f"{', '.join(map(str, args.seeds))}; DyGLib's published figure in brackets)", "",
                  "| model | " + " | ".join(args.data) + " |",
                  "|---|" + "---|" * len(args.data)]
        for model in list(args.models) + ["EdgeBank"]:
            cells = []
            for data in args.data:
                if model == "EdgeBank":   # the same in every run of the dataset: take the first model's
                    runs = results.get((data, args.models[0]), [])
                    ms = mean_std([r.get(key(st, "edgebank_test_ap")) for r in runs])
                else:
                    runs = results.get((data, model), [])
                    ms = mean_std([r.get(key(st)) for r in runs])
                pub = published(model, data, st)
                agg[f"{data}/{model}/{st}"] = {"mean": ms[0], "std": ms[1], "runs": len(runs),
                                               "published": pub}
                n = "" if len(runs) == len(args.seeds) else f" (n={len(runs)})"
                cells.append(fmt(ms) + n + (f" [{pub[0]:.2f} ± {pub[1]:.2f}]" if pub else ""))
            lines.append(f"| {Path(model).stem} | " + " | ".join(cells) + " |")
        lines.append("")
    lines.append("Commands (one per row and seed; `--seed` varies):")
    lines.append("")
    for data in args.data:
        for model in args.models:
            cmd = command(args, data, model, args.seeds[0], Path(args.out) / "RUN")
            shown = ["python" if c == sys.executable else c for c in cmd]
            shown = [os.path.relpath(c, REPO) if c.startswith(str(REPO)) else c for c in shown]
            lines.append(f"    {' '.join(shown)}")
    return "\n".join(lines) + "\n", agg


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--root", default=os.environ.get("TGL_DIST_DATASETS"),
                   help="folder of the datasets (default: $TGL_DIST_DATASETS)")
    p.add_argument("--data", nargs="+", default=["uci", "wikipedia"], help="datasets")
    p.add_argument("--models", nargs="+", default=["TGN", "JODIE", "DyRep", "APAN", "TGAT"],
                   help="config names (configs/<NAME>.yml) or .yml paths")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds")
    p.add_argument("--nproc", type=int, default=1, help="processes per run (torchrun when > 1)")
    p.add_argument("--epochs", type=int, default=None, help="--epochs of each run (default: the config's)")
    p.add_argument("--patience", type=int, default=None, help="--patience of each run")
    p.add_argument("--batch-size", type=int, default=None, help="--batch-size of each run")
    p.add_argument("--lr", type=float, default=None, help="--lr of each run")
    p.add_argument("--threads", type=int, default=None, help="--threads of each run")
    p.add_argument("--out", default="runs/reproduce", help="folder of the runs and table.md")
    p.add_argument("--no-run", action="store_true",
                   help="only tabulate the runs already in --out (a cell lists how many seeds it has)")
    args = p.parse_args(argv)
    results: Dict[Tuple[str, str], List[dict]] = {}
    for seed in args.seeds:            # seed-major: a stopped grid has every cell's first seeds
        for data in args.data:
            for model in args.models:
                s = run_one(args, data, model, seed)
                if s is not None:
                    results.setdefault((data, model), []).append(s)
    text, agg = table(args, results)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "table.md").write_text(text)
    print(text)
    print(json.dumps({"nproc": args.nproc, "seeds": args.seeds, "figures": agg}))
    return agg


if __name__ == "__main__":
    main()
