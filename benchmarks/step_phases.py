"""Where a TGN training step's time goes: milliseconds per phase, one process or N.

    python benchmarks/step_phases.py [--data wikipedia] [--steps 400] [--threads 2]
    python benchmarks/step_phases.py --compare-kernel-threads
    python benchmarks/step_phases.py --batch-size 10 --steps 1000   # the fixed cost of a step
    torchrun --nproc_per_node=2 benchmarks/step_phases.py --threads 1  # 2 ranks, 100 events each

The model and data are those of ``benchmarks/train_throughput.py`` (PyG's
``examples/tgn.py`` sizes: memory / time / embedding 100, batch 200, 10 recent
neighbours, one attention layer). After ``--warmup`` steps it times ``--steps`` training
steps of the first epoch, split into the phases of :func:`tgl_dist.ctdg.run_epoch`:

- ``load``: the loader's next batch (negatives, sampling, memory and mail fetch),
- ``forward``: model and loss, ``backward``: ``loss.backward()`` and the start of the
  gradient all-reduce,
- ``write_back``: :meth:`SharedMailBox.update` (while the gradients travel),
- ``optimizer``: the wait for the all-reduce and Adam.

Under ``torchrun`` every rank runs its share of the (global) batch on a partition into
as many parts as ranks, in the order of ``run_epoch``; rank 0 reports its own phases
(the others wait for it in the collectives, so the figures are the step's).

``--compare-kernel-threads`` alternates blocks of 10 steps between the compiled kernels
(attention, time encoding, dropout) on ONE thread and on torch's threads, in the same
process, so the machine's drift (10-20 % between runs on a shared VM) hits both alike;
it reports the mean step of each.

``--compare-deferred`` (with several ranks) alternates blocks of 10 steps between the
mailbox's write-back sent at once (5 memory all-to-alls a step) and sent with the next
step's memory request (:meth:`SharedMailBox.deferred_writes`, what ``run_epoch`` does: 3).

``--compare-late`` (several ranks) alternates blocks of 10 steps between the optimizer
step at the end of its step and after the next step's load (``run_epoch``'s order: the
gradient all-reduce travels while the next step is sampled and its memory read); the
``optimizer`` phase counts the wait and Adam wherever they happen.

``--base REV --swap MODULE:ATTR [--swap ...]`` measures a code change the same way: the
named attributes (a module-level function, or ``Class.method``) alternate every 10 steps
between the working tree's version and the one at git revision ``REV`` (its ``tgl_dist``
is extracted with ``git archive`` into a temporary folder and the named modules loaded
from there), and the mean step of each is reported. Swap the name where callers look it
up at call time: for a function imported with ``from ... import f``, the importing
module's ``f``; e.g. ::

    python benchmarks/step_phases.py --base HEAD~1 \
        --swap tgl_dist.nn.time_encoding:cosine_time_encoding \
        --swap tgl_dist.memory.mailbox:SharedMailBox.update

A compiled kernel is compared the same way by swapping its module's ``KERNEL``: the
module loaded from ``REV`` builds ``REV``'s C source, and the callers look ``KERNEL`` up at
call time (``--swap tgl_dist.nn._attention_kernel:KERNEL``, ``tgl_dist.nn._pointwise:KERNEL``).
A kernel faster alone need not make a step faster (``benchmarks/RESULTS.md`` run 24).

``--profile`` adds the torch profiler's table of operators (self CPU time). Each mode's
line also gives the process's minor page faults per step (memory the allocator had
returned to the kernel and gets back zeroed; see ``keep_freed_memory`` in
``tgl_dist/context.py``).
The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import atexit
import importlib
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import yaml  # noqa: E402

from benchmarks.train_throughput import CONFIG  # noqa: E402
from tgl_dist import DistributedContext  # noqa: E402
from tgl_dist.data import load_dataset  # noqa: E402
from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph  # noqa: E402
from tgl_dist.loader import DistributedDataLoader  # noqa: E402
from tgl_dist.memory import SharedMailBox  # noqa: E402
from tgl_dist.ctdg import build_model, parse_config  # noqa: E402
from tgl_dist.optim import build_optimizer  # noqa: E402
from tgl_dist.dist.parallel import all_reduce_gradients, broadcast_parameters  # noqa: E402
from tgl_dist.ctdg.training import link_loss  # noqa: E402
from tgl_dist.nn._attention_kernel import get_attention_kernel  # noqa: E402
from tgl_dist.nn._pointwise import KERNEL as POINTWISE  # noqa: E402
from tgl_dist.partition import partition_graph, partition_load  # noqa: E402
from tgl_dist.sampling import NegativeSampling, NeighborSampler  # noqa: E402

PHASES = ("load", "forward", "backward", "write_back", "optimizer")


def _swaps(base: str, specs):
    """``[(owner, name, base value, working-tree value)]`` for each ``MODULE:ATTR``."""
    tmp = Path(tempfile.mkdtemp(prefix="tgl_dist_base_"))
    atexit.register(shutil.rmtree, tmp, True)
    arch = subprocess.run(["git", "-C", str(REPO), "archive", base, "tgl_dist"],
                          capture_output=True, check=False)
    if arch.returncode:
        raise SystemExit(f"git archive {base} failed: {arch.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=arch.stdout, check=True)
    out = []
    for spec in specs:
        mod_name, _, attr = spec.partition(":")
        if not attr:
            raise SystemExit(f"--swap {spec!r}: expected MODULE:ATTR")
        path = tmp / (mod_name.replace(".", "/") + ".py")
        if not path.is_file():
            raise SystemExit(f"--swap {spec!r}: {mod_name} does not exist at {base}")
        loaded = importlib.util.spec_from_file_location(f"_base_{len(out)}_{mod_name}", path)
        old_mod = importlib.util.module_from_spec(loaded)
        sys.modules[loaded.name] = old_mod   # dataclasses look their module up there
        loaded.loader.exec_module(old_mod)
        new_owner, old_owner = importlib.import_module(mod_name), old_mod
        *parents, name = attr.split(".")
        for part in parents:
            new_owner, old_owner = getattr(new_owner, part), getattr(old_owner, part)
        out.append((new_owner, name, getattr(old_owner, name), getattr(new_owner, name)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="wikipedia")
    ap.add_argument("--root", default=os.environ.get("TGL_DIST_DATASETS",
                                                     str(REPO.parent / "shared" / "datasets")))
    ap.add_argument("--parts", default=str(Path(tempfile.gettempdir()) / "tgl_dist_bench_parts"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--compare-kernel-threads", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--compare-late", action="store_true",
                    help="alternate blocks of 10 steps with the optimizer step at the step's end "
                         "and after the next step's load (run_epoch's order on several ranks: "
                         "the gradients travel while the next step is sampled and read)")
    ap.add_argument("--compare-deferred", action="store_true",
                    help="alternate blocks of 10 steps with and without the mailbox's deferred "
                         "write-back (SharedMailBox.deferred_writes: 3 memory all-to-alls a step "
                         "instead of 5; matters with several ranks)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="events per step over all ranks (default: the config's 200); a "
                         "small batch shows the fixed cost of a step")
    ap.add_argument("--base", default=None,
                    help="git revision whose code --swap compares with the working tree")
    ap.add_argument("--swap", action="append", default=[], metavar="MODULE:ATTR",
                    help="attribute to alternate between --base and the working tree "
                         "(repeatable), e.g. tgl_dist.memory.mailbox:SharedMailBox.update")
    args = ap.parse_args()
    if bool(args.base) != bool(args.swap):
        ap.error("--base and --swap go together")
    if sum(map(bool, (args.swap, args.compare_kernel_threads, args.compare_deferred,
                      args.compare_late))) > 1:
        ap.error("--swap, --compare-kernel-threads, --compare-deferred and --compare-late are "
                 "separate comparisons")
    swaps = _swaps(args.base, args.swap) if args.swap else []
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ctx = DistributedContext.init()
    W = ctx.world_size
    cfg = parse_config(yaml.safe_load(CONFIG), "TGN")
    g = load_dataset(args.data, root=args.root)
    if ctx.is_main and not (Path(args.parts) / g.name / f"metis_for_tgnn_{W}").is_dir():
        partition_graph(g, W, "metis_for_tgnn", args.parts)
    ctx.barrier()
    pdata = partition_load(Path(args.parts) / g.name, "metis_for_tgnn")
    graph = DistributedGraphStore(pdata)
    smp = cfg.sampling
    sampler = NeighborSampler(graph.num_nodes, smp.layer, list(smp.neighbor),
                              TemporalNeighborSampleGraph(pdata, mode="full"),
                              policy=smp.strategy, seed=0, graph_name=g.name)
    bs = max(1, (args.batch_size or cfg.train.batch_size) // W)  # events per rank
    mailbox = SharedMailBox(int(pdata.ids.numel()), cfg.memory, graph.edge_feat_dim,
                            partition_book=pdata.book)
    loader = DistributedDataLoader(graph, "train", sampler=sampler,
                                   neg_sampler=NegativeSampling("triplet", "random", 1, seed=0),
                                   batch_size=bs, train=True, mailbox=mailbox,
                                   seed=0, queue_size=0)
    steps = len(loader)
    if args.warmup + args.steps > steps:
        raise SystemExit(f"--warmup + --steps must be at most the epoch's {steps} steps")
    model = build_model(cfg, graph.node_feat_dim, graph.edge_feat_dim,
                        num_nodes=graph.num_nodes, partition_book=pdata.book)
    broadcast_parameters(model)
    opt = build_optimizer(model, lr=cfg.train.lr)
    kernels = [k for k in (get_attention_kernel(), POINTWISE.get()) if k is not None]
    own = {id(k): k.threads for k in kernels}
    mailbox.reset()
    loader.set_epoch(0, 0)
    it = iter(loader)
    modes = (("base", "working_tree") if swaps else ("immediate", "deferred") if args.compare_deferred
             else ("at_end", "late") if args.compare_late else ("torch_threads", "one_thread"))
    waiting = None      # run_epoch's order on several ranks: the last step's optimizer step
    deferred = None     # the mailbox's deferred_writes() block, open in every mode but 'immediate'
    sums = {m: dict.fromkeys(PHASES, 0.0) for m in modes}
    counts, faults = dict.fromkeys(sums, 0), dict.fromkeys(sums, 0)
    prof = None
    for i in range(args.warmup + args.steps):
        if swaps:
            mode = "working_tree" if (i // 10) % 2 else "base"
            for owner, name, base_value, new_value in swaps:
                setattr(owner, name, base_value if mode == "base" else new_value)
        elif args.compare_deferred:
            mode = "deferred" if (i // 10) % 2 else "immediate"
        elif args.compare_late:
            mode = "late" if (i // 10) % 2 else "at_end"
        else:
            mode = ("one_thread" if args.compare_kernel_threads and (i // 10) % 2
                    else "torch_threads")
        if (mode != "immediate") != (deferred is not None):   # run_epoch's loop runs deferred
            if deferred is None:
                deferred = mailbox.deferred_writes()
                deferred.__enter__()
            else:                             # leaving the block sends a waiting write
                deferred.__exit__(None, None, None)
                deferred = None
        for k in kernels:
            k.threads = (lambda: 1) if mode == "one_thread" else own[id(k)]
        if i == args.warmup and args.profile and ctx.is_main:
            prof = torch.profiler.profile()
            prof.__enter__()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = time.perf_counter()
        roots, mfgs, meta, _ = next(it)
        t1 = time.perf_counter()
        if waiting is not None:           # the last step ends before this forward
            waiting.wait()
            opt.step()
            waiting = None
        t2 = time.perf_counter()
        out = model(mfgs, meta)
        loss = link_loss(*out, meta, W)
        t3 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        pending = all_reduce_gradients(model, async_op=True)
        t4 = time.perf_counter()
        mailbox.update(out.memory, roots, meta["src_pos_index"], meta["dst_pos_index"],
                       roots.extra.get("f"), out.embedding, out.mail_uses_embedding, mfgs[-1])
        t5 = time.perf_counter()
        if W > 1 and mode != "at_end" and i + 1 < args.warmup + args.steps:
            waiting = pending             # run_epoch's order: wait after the next load
        else:
            pending.wait()
            opt.step()
        t6 = time.perf_counter()
        if i >= args.warmup:
            counts[mode] += 1
            faults[mode] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
            for p, d in zip(PHASES, (t1 - t0, t3 - t2, t4 - t3, t5 - t4, (t2 - t1) + (t6 - t5))):
                sums[mode][p] += d
    if deferred is not None:
        deferred.__exit__(None, None, None)
    for k in kernels:
        k.threads = own[id(k)]
    for owner, name, _, new_value in swaps:
        setattr(owner, name, new_value)
    if prof is not None:
        prof.__exit__(None, None, None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    if not ctx.is_main:
        return
    res = {"data": args.data, "world_size": W, "threads": args.threads, "batch_size": bs * W,
           "batch_per_rank": bs,
           "kernel_threads": kernels[0].threads() if kernels else 0}
    for mode, n in counts.items():
        if not n:
            continue
        ms = {p: 1e3 * v / n for p, v in sums[mode].items()}
        total = sum(ms.values())
        print(f"{mode:13s} ({n} steps): " + "  ".join(f"{p} {v:.2f}" for p, v in ms.items())
              + f"  | step {total:.2f} ms ({bs * W * 1e3 / total:.0f} events/s, "
              f"{faults[mode] / n:.0f} page faults)")
        key = {"torch_threads": "", "working_tree": "", "deferred": "", "late": ""}.get(mode, f"{mode}_")
        res.update({f"{key}{p}_ms": round(v, 3) for p, v in ms.items()})
        res[f"{key}step_ms"] = round(total, 3)
        res[f"{key}page_faults_per_step"] = round(faults[mode] / n, 1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
