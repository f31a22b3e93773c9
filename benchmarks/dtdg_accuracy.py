"""DTDG accuracy with 1 and 2 processes: link prediction (Twitter tennis) and node regression (England COVID).

    python benchmarks/dtdg_accuracy.py [--root DATASETS] [--epochs-lp 30] [--epochs-nr 50] [--procs 1 2]

Runs ``examples/dtdg/train_link_pred.py`` and ``examples/dtdg/train_node_regression.py``
as plain ``python`` (1 process) and under ``torchrun --nproc_per_node=2`` (gloo on
CPU), collects each run's JSON line, checks that the 2-process metric is within 1 AP
point / 5 % MSE of the 1-process one and that both beat the trivial baseline
(repeat the last snapshot / predict the previous value), and prints a table and,
last, one JSON line with every run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(script: str, procs: int, extra) -> dict:
    path = str(REPO / "examples" / "dtdg" / script)
    cmd = ([sys.executable, path] if procs == 1 else
           [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}", path])
    out = subprocess.run(cmd + list(extra), capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
    res = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
    res["command"] = ("python" if procs == 1 else f"torchrun --nproc_per_node={procs}") + \
        f" examples/dtdg/{script} " + " ".join(extra)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=os.environ.get("TGL_DIST_DATASETS",
                                                    str(REPO.parent / "shared" / "datasets")),
                   help="datasets folder (default: $TGL_DIST_DATASETS, else ../shared/datasets)")
    p.add_argument("--parts", default=str(Path(tempfile.gettempdir()) / "tgl_dist_bench_parts"),
                   help="where the examples write their partitions")
    p.add_argument("--epochs-lp", type=int, default=30)
    p.add_argument("--epochs-nr", type=int, default=50)
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--lp-args", default="", help="extra arguments for train_link_pred.py")
    p.add_argument("--nr-args", default="", help="extra arguments for train_node_regression.py")
    args = p.parse_args()
    runs = []
    where = ["--root", args.root, "--parts", args.parts]
    for procs in args.procs:
        runs.append(run("train_link_pred.py", procs,
                        ["--epochs", str(args.epochs_lp)] + where + args.lp_args.split()))
        runs.append(run("train_node_regression.py", procs,
                        ["--epochs", str(args.epochs_nr)] + where + args.nr_args.split()))
    print(f"{'task':16} {'P':>2} {'model':12} {'metric':>10} {'baseline':>10} {'snap/s':>8}")
    for r in runs:
        m = "ap" if r["task"] == "link_pred" else "mse"
        print(f"{r['task']:16} {r['world_size']:>2} {r['model']:12} {r['test_' + m]:>10.4f} "
              f"{r['baseline_test_' + m]:>10.4f} {r['snapshots_per_s']:>8.1f}")
    checks = {}
    by = {(r["task"], r["world_size"]): r for r in runs}
    for task, m in (("link_pred", "ap"), ("node_regression", "mse")):
        rs = [by[(task, p)] for p in args.procs if (task, p) in by]
        better = all((r[f"test_{m}"] > r[f"baseline_test_{m}"]) if m == "ap"
                     else (r[f"test_{m}"] < r[f"baseline_test_{m}"]) for r in rs)
        checks[f"{task}_beats_baseline"] = better
        if len(rs) >= 2:
            a, b = rs[0][f"test_{m}"], rs[-1][f"test_{m}"]
            checks[f"{task}_procs_agree"] = abs(a - b) <= 0.01 if m == "ap" else abs(a - b) <= 0.05 * a
    print(json.dumps({"benchmark": "dtdg_accuracy", "checks": checks, "runs": runs}))


if __name__ == "__main__":
    main()
