"""Checkpoint write time, load time and size of a TGN run on facebook_wall (1 and 2 processes).

    python benchmarks/checkpoint.py --root ../shared/datasets [--procs 1 2] [--repeats 3]

Each process count runs in its own job (``torchrun --nproc_per_node=P`` for P > 1). A
job builds what ``examples/ctdg/train_tgn.py`` builds (configs/TGN.yml, the
metis_for_tgnn partition, the model, the node memory / mailbox of the owned nodes, the
optimizer), trains ``--steps`` steps so that the Adam state and the memory are
populated, then times, ``--repeats`` times each:

* write: :func:`tgl_dist.checkpoint.capture` + :meth:`RunCheckpoint.save` (every rank
  writes its shard, fsync, barrier, commit of ``VERSION``), wall time of the slowest rank;
* load: :meth:`RunCheckpoint.load` (manifests, sizes and sha256 of the rank's files
  verified, then ``torch.load``) + :func:`tgl_dist.checkpoint.restore` into the live
  objects, slowest rank.

Size: bytes of the committed version (``dense.pt`` + all shards + manifests) and per
file kind. Reported: the median of the repeats. The last line is one JSON object.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def worker(args) -> dict:
    """One job (every rank runs it); returns the figures on rank 0."""
    import torch

    from tgl_dist import DistributedContext
    from tgl_dist.checkpoint import RunCheckpoint, capture, partition_identity, restore
    from tgl_dist.dist import all_gather_v, broadcast_object
    from tgl_dist.graph import DistributedGraphStore, TemporalNeighborSampleGraph
    from tgl_dist.loader import DistributedDataLoader
    from tgl_dist.memory import SharedMailBox
    from tgl_dist.ctdg import build_model, load_config, run_epoch
    from tgl_dist.optim import build_optimizer
    from tgl_dist.dist import broadcast_parameters
    from tgl_dist.partition import partition_graph, partition_load
    from tgl_dist.sampling import NegativeSampling, NeighborSampler

    ctx = DistributedContext.init()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world_size))
    torch.manual_seed(0)
    parts = Path(args.parts)
    algo = "metis_for_tgnn"
    name = "facebook-wall"  # the dataset's name (folder facebook_wall)
    if ctx.rank == 0 and not (parts / name / f"{algo}_{ctx.world_size}").is_dir():
        from tgl_dist.data import load_dataset
        g = load_dataset("facebook_wall", root=args.root)
        name = g.name
        partition_graph(g, ctx.world_size, algo, parts)
    name = broadcast_object(name)
    pdata = partition_load(parts / name, algo)
    graph = DistributedGraphStore(pdata)
    cfg = load_config(REPO / "configs" / "TGN.yml")
    smp = cfg.sampling
    sampler = NeighborSampler(graph.num_nodes, smp.layer, list(smp.neighbor),
                              TemporalNeighborSampleGraph(pdata, "full"), policy=smp.strategy)
    mailbox = SharedMailBox(int(pdata.ids.numel()), cfg.memory, graph.edge_feat_dim,
                            partition_book=pdata.book)
    model = build_model(cfg, graph.node_feat_dim, graph.edge_feat_dim, num_nodes=graph.num_nodes,
                        partition_book=pdata.book)
    broadcast_parameters(model)
    opt = build_optimizer(model, lr=cfg.train.lr)
    loader = DistributedDataLoader(graph, "train", sampler, neg_sampler=NegativeSampling(),
                                   batch_size=max(1, cfg.train.batch_size // ctx.world_size),
                                   mailbox=mailbox, queue_size=0)
    run_epoch(model, itertools.islice(loader, args.steps), mailbox, opt)  # populate Adam + memory
    loader._join()
    ckdir = Path(broadcast_object(tempfile.mkdtemp(prefix="ckbench_", dir=args.tmp)
                                  if ctx.rank == 0 else None))
    ck = RunCheckpoint(ckdir / "ck", "1e", run_meta={"partition": partition_identity(pdata.manifest)},
                       resume=True)

    def slowest(sec: float) -> float:
        return float(all_gather_v(torch.tensor([sec], dtype=torch.float64)).max())

    writes, loads = [], []
    for _ in range(args.repeats):
        ctx.barrier()
        t0 = time.perf_counter()
        dense, shard = capture(model, opt, mailbox, ctx.rank, {"history": []}, None)
        ck.save(dense, shard, {"epoch": 0, "step": args.steps, "global_step": args.steps, "done": False})
        writes.append(slowest(time.perf_counter() - t0))
        ctx.barrier()
        t0 = time.perf_counter()
        d, s, _ = ck.load()
        restore(d, s, model, opt, mailbox)
        loads.append(slowest(time.perf_counter() - t0))
    out = None
    if ctx.rank == 0:
        vdir = ckdir / "ck" / f"v{ck.mgr.committed_version():06d}"
        sizes = {p.name: p.stat().st_size for p in vdir.iterdir()}
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        out = {"world_size": ctx.world_size, "nodes": graph.num_nodes,
               "owned_nodes_per_rank": None, "write_s": round(med(writes), 4),
               "load_s": round(med(loads), 4), "write_s_all": [round(x, 4) for x in writes],
               "load_s_all": [round(x, 4) for x in loads],
               "size_mib": round(sum(sizes.values()) / 2**20, 2),
               "dense_mib": round(sizes["dense.pt"] / 2**20, 3),
               "shard_mib": [round(sizes[f"shard_{r}.pt"] / 2**20, 2) for r in range(ctx.world_size)],
               "mailbox_mib_per_rank_0": round(sum(v.numel() * v.element_size()
                                                   for v in mailbox.state_dict().values()) / 2**20, 2)}
    owned = all_gather_v(torch.tensor([int(pdata.ids.numel())]))
    if out is not None:
        out["owned_nodes_per_rank"] = owned.tolist()
        shutil.rmtree(ckdir, ignore_errors=True)
    ctx.shutdown()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", default=os.environ.get("TGL_DIST_DATASETS", str(REPO.parent / "shared" / "datasets")))
    p.add_argument("--parts", default=str(REPO / "parts"), help="partition root (written on first use)")
    p.add_argument("--tmp", default=None, help="folder for the checkpoints (default: system temp)")
    p.add_argument("--procs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=5, help="training steps before the first checkpoint")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        res = worker(args)
        if res is not None:
            Path(args.out).write_text(json.dumps(res))
        return
    results = {}
    for P in args.procs:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        cmd = [__file__, "--worker", "--out", out, "--root", args.root, "--parts", args.parts,
               "--repeats", str(args.repeats), "--steps", str(args.steps)]
        if args.tmp:
            cmd += ["--tmp", args.tmp]
        if P == 1:
            cmd = [sys.executable, *cmd]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={P}",
                   "--standalone", *cmd]
        env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // P)))
        subprocess.run(cmd, check=True, env=env)
        results[f"p{P}"] = json.loads(Path(out).read_text())
        os.unlink(out)
        print(f"{P} process(es): {results[f'p{P}']}", file=sys.stderr)
    print(json.dumps({"benchmark": "checkpoint", "model": "TGN", "data": "facebook_wall", **results}))


if __name__ == "__main__":
    main()
