import time

import pytest
import torch

from tgl_dist import DistributedContext
from tgl_dist.errors import PeerFailureError
from tgl_dist.testing import run_distributed


def test_world_of_one_without_torchrun(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    ctx = DistributedContext.init(use_gpu=False)
    assert (ctx.rank, ctx.world_size, ctx.local_rank) == (0, 1, 0)
    assert ctx.device == torch.device("cpu")
    assert ctx.get_default_group() is None
    ctx.sync_print("hello")  # no process group needed
    ctx.shutdown()


def test_bad_backend_is_an_error():
    with pytest.raises(ValueError, match="backend"):
        DistributedContext.init(backend="mpi", use_gpu=False)
    with pytest.raises(ValueError, match="NCCL"):
        DistributedContext.init(backend="nccl", use_gpu=False)


def _two_rank_worker():
    ctx = DistributedContext.init(use_gpu=False)
    ctx.sync_print("ordered")
    return ctx.rank, ctx.world_size, ctx.backend, str(ctx.device)


@pytest.mark.distributed
def test_two_ranks_under_torchrun_env():
    out = run_distributed(_two_rank_worker, 2)
    assert out == [(0, 2, "gloo", "cpu"), (1, 2, "gloo", "cpu")]


def _dead_peer_worker(out_file):
    from tgl_dist.dist import all_reduce_
    ctx = DistributedContext.init(use_gpu=False, timeout=5.0)
    all_reduce_(torch.ones(1))  # both ranks alive here
    if ctx.rank == 1:
        import os
        os._exit(0)  # dies without taking part in the next collective
    t0 = time.monotonic()
    try:
        all_reduce_(torch.ones(1))
        result = "no error"
    except PeerFailureError as e:
        result = f"PeerFailureError: {e}"
    with open(out_file, "w") as f:
        f.write(f"{time.monotonic() - t0:.1f}\n{result}")
    return result


@pytest.mark.distributed
def test_dead_peer_gives_error_not_hang(tmp_path):
    out_file = tmp_path / "rank0.txt"
    with pytest.raises(RuntimeError, match="without returning a result"):
        run_distributed(_dead_peer_worker, 2, str(out_file), timeout=60)
    for _ in range(100):  # rank 0 may still be finishing when rank 1's exit is noticed
        if out_file.exists() and out_file.read_text().count("\n"):
            break
        time.sleep(0.2)
    seconds, result = out_file.read_text().split("\n", 1)
    assert result.startswith("PeerFailureError"), result
    assert "peer" in result
    assert float(seconds) < 30
