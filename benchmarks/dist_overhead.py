"""Distributed overhead at equal cores: 2 processes x 1 thread against 1 process x 2 threads.

    python benchmarks/dist_overhead.py [--data wikipedia] [--repeats 3] [--epochs 1]

For each config (PyG's example settings, the config of ``benchmarks/train_throughput.py``;
and ``configs/TGN.yml``) it runs ``examples/ctdg/train_tgn.py`` alternately as one
process with 2 threads and as ``torchrun --nproc_per_node=2`` with 1 thread each (1p,
2p, 1p, 2p, ...: the machine's drift hits both sides alike), and reports each side's
median training events/s (``train_events_per_s``: the training epochs' events over their
wall time), their ratio 2p / 1p, and the median of the paired ratios. Test AP of both
sides is printed beside (same data and seeds: equal up to rounding). The last line is
one JSON object. Where the difference goes, per phase of a step:
``benchmarks/step_phases.py`` (one process) and ``torchrun --nproc_per_node=2
benchmarks/step_phases.py --threads 1 --compare-deferred``.
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
sys.path.insert(0, str(REPO))
from benchmarks.train_throughput import CONFIG as PYG_SETTINGS  # noqa: E402

TRAIN = REPO / "examples" / "ctdg" / "train_tgn.py"


def run(args, config: Path, nproc: int, seed: int) -> dict:
    """One training run; its summary line (train_tgn.py's last stdout line)."""
    threads = 2 // nproc
    cmd = [sys.executable]
    if nproc > 1:
        cmd += ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"]
    cmd += [str(TRAIN), "--data", args.data, "--root", args.root, "--config", str(config),
            "--epochs", str(args.epochs), "--patience", str(args.epochs + 1),
            "--parts", args.parts, "--threads", str(threads), "--seed", str(seed),
            "--no-progress", "--out", str(Path(args.tmp) / f"run_{config.stem}_{nproc}_{seed}")]
    p = subprocess.run(cmd, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if p.returncode != 0:
        raise SystemExit(f"run failed ({' '.join(cmd)}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="wikipedia")
    ap.add_argument("--root", default=os.environ.get("TGL_DIST_DATASETS",
                                                     str(REPO.parent / "shared" / "datasets")))
    ap.add_argument("--repeats", type=int, default=3, help="runs of each side per config")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", nargs="+", default=["pyg", "configs/TGN.yml"],
                    help="'pyg' (PyG's example settings) and/or config files")
    ap.add_argument("--parts", default=str(Path(tempfile.gettempdir()) / "tgl_dist_bench_parts"))
    args = ap.parse_args()
    args.tmp = tempfile.mkdtemp(prefix="tgl_dist_overhead_")
    results = {}
    for name in args.configs:
        if name == "pyg":
            config = Path(args.tmp) / "TGN_pyg_settings.yml"
            config.write_text(PYG_SETTINGS)
        else:
            config = (REPO / name) if not Path(name).is_absolute() else Path(name)
        runs = {1: [], 2: []}
        for i in range(args.repeats):
            for nproc in (1, 2):
                out = run(args, config, nproc, args.seed)
                runs[nproc].append(out)
                print(f"{name}: {nproc} process(es), run {i + 1}: "
                      f"{out['train_events_per_s']:,.0f} events/s, test AP {out['test_ap']:.4f}",
                      flush=True)
        med = {n: sorted(r["train_events_per_s"] for r in v)[len(v) // 2] for n, v in runs.items()}
        paired = sorted(b["train_events_per_s"] / a["train_events_per_s"]
                        for a, b in zip(runs[1], runs[2]))
        results[name] = {"one_proc_two_threads": med[1], "two_procs_one_thread": med[2],
                         "ratio": med[2] / med[1], "paired_median": paired[len(paired) // 2],
                         "paired": paired,
                         "test_ap": {n: [r["test_ap"] for r in v] for n, v in runs.items()}}
        print(f"{name}: 2 x 1 thread / 1 x 2 threads = {med[2] / med[1]:.3f} "
              f"(paired median {paired[len(paired) // 2]:.3f})", flush=True)
    print(json.dumps({"benchmark": "dist_overhead", "data": args.data, "epochs": args.epochs,
                      "cpus": os.cpu_count(), "results": results}))


if __name__ == "__main__":
    main()
