"""``run_distributed``: run ``fn(*args)`` on ``world_size`` spawned processes with gloo.

The processes see no GPU unless ``env`` names some in ``CUDA_VISIBLE_DEVICES``.

Each process gets torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``), so the code under test calls
``DistributedContext.init()`` exactly as it would under torchrun. Return values
come back in rank order; an exception in any rank is re-raised with its traceback;
a run longer than ``timeout`` is killed and reported.
"""
from __future__ import annotations

import io
import os
import socket
import traceback
from typing import Any, Callable, List

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port that is free right now on localhost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, fn: Callable, args, queue, env) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    os.environ.update(env)
    import torch
    torch.set_num_threads(1)
    try:
        out = fn(*args)
        # bytes, not tensors: a tensor put on the queue travels as shared memory that
        # vanishes when this process exits before the parent has read it
        buf = io.BytesIO()
        torch.save(out, buf)
        queue.put((rank, True, buf.getvalue()))
    except BaseException:  # report every failure to the parent
        queue.put((rank, False, traceback.format_exc()))
    finally:
        import torch.distributed as dist
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass


def run_distributed(fn: Callable, world_size: int = 2, *args: Any, timeout: float = 180.0,
                    env: dict | None = None) -> List[Any]:
    """Run ``fn(*args)`` on ``world_size`` processes; return the results in rank order.

    ``fn`` must be importable (a module-level function) because processes are spawned.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    env = dict(env or {})
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, fn, args, queue, env),
                         daemon=False) for r in range(world_size)]
    # gloo on CPUs, also on a GPU machine (where DistributedContext.init() would pick NCCL
    # and a GPU per rank): the children start with no GPU visible unless ``env`` names
    # some. Set in their environment from the start, not in _worker: unpickling ``fn``
    # imports its module, and an import (torch_geometric's) may ask CUDA before _worker runs.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "")
    try:
        for p in procs:
            p.start()
    finally:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    results: dict = {}
    errors = []
    import queue as _q
    import time
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < world_size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"distributed run of {fn.__name__} exceeded {timeout}s")
            try:
                rank, ok, out = queue.get(timeout=min(left, 1.0))
            except _q.Empty:
                gone = [r for r, p in enumerate(procs)
                        if p.exitcode is not None and r not in results]
                if gone and queue.empty():
                    time.sleep(0.5)
                    if queue.empty():
                        raise RuntimeError(
                            f"rank(s) {gone} exited with codes "
                            f"{[procs[r].exitcode for r in gone]} without returning a result")
                continue
            if ok:
                results[rank] = torch.load(io.BytesIO(out), weights_only=False)
            else:
                errors.append((rank, out))
                break
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        rank, tb = errors[0]
        raise RuntimeError(f"rank {rank} failed:\n{tb}")
    return [results[r] for r in range(world_size)]
