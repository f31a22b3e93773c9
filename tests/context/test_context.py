import os
import subprocess
import sys
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


@pytest.mark.parametrize("env, match", [
    ({"WORLD_SIZE": "2"}, "RANK is not set"),                       # both would be rank 0
    ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK=2 is outside \[0, WORLD_SIZE=2\)"),
    ({"WORLD_SIZE": "2", "RANK": "-1"}, "RANK=-1 is outside"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE='two' is not an integer"),
    ({"RANK": "0", "LOCAL_RANK": "-3"}, "LOCAL_RANK=-3 must be >= 0"),
])
def test_inconsistent_launch_environment_is_refused_at_once(monkeypatch, env, match):
    # before: a socket error after the whole rendezvous timeout (600 s by default)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        DistributedContext.init(use_gpu=False, timeout=30)
    assert time.perf_counter() - t0 < 5


def _two_rank_worker():
    ctx = DistributedContext.init(use_gpu=False)
    ctx.sync_print("ordered")
    return ctx.rank, ctx.world_size, ctx.backend, str(ctx.device)


@pytest.mark.distributed
def test_two_ranks_under_torchrun_env():
    out = run_distributed(_two_rank_worker, 2)
    assert out == [(0, 2, "gloo", "cpu"), (1, 2, "gloo", "cpu")]


def _sync_print_worker():
    ctx = DistributedContext.init(use_gpu=False)
    if ctx.rank == 0:
        time.sleep(0.5)  # without the rank-order barriers rank 1 would print first
    ctx.sync_print("first", ctx.rank)
    ctx.sync_print("second", end="!\n")
    return ctx.rank


@pytest.mark.distributed
def test_sync_print_is_in_rank_order(capfd):
    # spawned ranks inherit this process's stdout file descriptor, which capfd captures
    assert run_distributed(_sync_print_worker, 2) == [0, 1]
    lines = [ln for ln in capfd.readouterr().out.splitlines() if ln.startswith("[rank ")]
    assert lines == ["[rank 0] first 0", "[rank 1] first 1", "[rank 0] second!", "[rank 1] second!"]


def _shutdown_worker():
    import torch.distributed as dist
    from tgl_dist.dist import all_reduce_
    ctx = DistributedContext.init(use_gpu=False)
    x = torch.ones(1)
    all_reduce_(x)
    ctx.shutdown()
    left = not dist.is_initialized()
    ctx.shutdown()                    # a second call is harmless
    ctx.barrier()                     # and the context degrades to a world without a group
    return float(x), left, ctx.get_default_group() is None, ctx.new_group() is None


@pytest.mark.distributed
def test_two_ranks_shut_down_cleanly():
    assert run_distributed(_shutdown_worker, 2, timeout=60) == [(2.0, True, True, True)] * 2


@pytest.fixture
def world_of_one_group(tmp_path, monkeypatch):
    """A gloo process group of one made outside DistributedContext (destroyed afterwards)."""
    import torch.distributed as dist
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_existing_group_backend_conflict_is_an_error(world_of_one_group):
    with pytest.raises(ValueError, match=r"backend='nccl' conflicts .*backend 'gloo'"):
        DistributedContext.init(backend="nccl", use_gpu=False)
    ctx = DistributedContext.init(backend="gloo", use_gpu=False)   # the same backend joins
    assert (ctx.rank, ctx.world_size, ctx.backend) == (0, 1, "gloo")
    ctx = DistributedContext.init(use_gpu=False)                   # None adopts the group's
    assert ctx.backend == "gloo" and ctx.get_default_group() is not None


def _dead_peer_worker(out_file, call):
    from tgl_dist.dist import all_reduce_
    ctx = DistributedContext.init(use_gpu=False, timeout=5.0)
    all_reduce_(torch.ones(1))  # both ranks alive here
    if ctx.rank == 1:
        import os
        os._exit(0)  # dies without taking part in the next collective
    t0 = time.monotonic()
    try:
        if call == "barrier":
            ctx.barrier()
        else:
            all_reduce_(torch.ones(1))
        result = "no error"
    except PeerFailureError as e:
        result = f"PeerFailureError: {e}"
    with open(out_file, "w") as f:
        f.write(f"{time.monotonic() - t0:.1f}\n{result}")
    return result


@pytest.mark.distributed
@pytest.mark.parametrize("call", ["all_reduce", "barrier"])
def test_dead_peer_gives_error_not_hang(tmp_path, call):
    out_file = tmp_path / "rank0.txt"
    with pytest.raises(RuntimeError, match="without returning a result"):
        run_distributed(_dead_peer_worker, 2, str(out_file), call, timeout=60)
    for _ in range(100):  # rank 0 may still be finishing when rank 1's exit is noticed
        if out_file.exists() and out_file.read_text().count("\n"):
            break
        time.sleep(0.2)
    seconds, result = out_file.read_text().split("\n", 1)
    assert result.startswith("PeerFailureError"), result
    assert "peer" in result
    assert float(seconds) < 30


_FAULTS = """
import resource, torch
from tgl_dist.context import keep_freed_memory
print(keep_freed_memory())
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # a training step's pattern: several MiB of temporaries, all freed at its end
    ts = [torch.empty(1 << 20).fill_(1.0) for _ in range(5)]
for _ in range(3):
    step()
f0 = faults()
for _ in range(40):
    step()
print(faults() - f0)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_tensor_memory_is_reused_without_page_faults():
    """After keep_freed_memory() forty 'steps' of five 4 MiB temporaries cost (almost) no
    page faults; with malloc's defaults the freed 20 MiB go back to the kernel at the end
    of each step and are faulted in again (5 x 1024 pages a step). With MALLOC_*_ in the
    environment the user's setting is left alone."""
    def run(env):
        return subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True,
                              check=True, env=env).stdout.split()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    ours = run(env)
    if ours[0] != "True":
        pytest.skip("not glibc: keep_freed_memory does nothing here")
    theirs = run({**env, "MALLOC_TOP_PAD_": "131072"})  # glibc's default, set explicitly
    assert theirs[0] == "False"  # the user's MALLOC_* setting wins
    assert int(ours[1]) < 1000
    assert int(theirs[1]) > 40 * 2000



def test_init_leaves_malloc_alone_unless_asked():
    """``DistributedContext.init()`` changes no process-wide allocator setting by default;
    ``keep_freed_memory=True`` opts in."""
    code = ("import tgl_dist.context as c; c.DistributedContext.init(use_gpu=False); "
            "print(c._malloc_set); c.DistributedContext.init(use_gpu=False, "
            "keep_freed_memory=True); print(c._malloc_set is not None)")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    assert out == ["None", "True"]

_LAST_COLLECTIVE = """
import torch, torch.distributed as dist
from tgl_dist import DistributedContext
ctx = DistributedContext.init(use_gpu=False)
group = ctx.get_default_group()  # held to the end, as a trainer holds its group
for _ in range(3):
    dist.all_reduce(torch.ones(1000), group=group)
"""  # and exit at once: no output, no shutdown()


@pytest.mark.slow
@pytest.mark.distributed
def test_ranks_that_exit_right_after_a_collective_exit_cleanly():
    """A rank that exits within microseconds of its last gloo collective, holding its
    group, used to abort in interpreter shutdown in ~3 runs of 10 ("terminate called
    without an active exception", exit -6): gloo's worker thread needs the GIL to drop the
    collective's tensors. ``DistributedContext.init`` registers an exit grace period for
    it; six rounds of two ranks must all exit 0."""
    from tgl_dist.testing import free_port
    for _ in range(6):
        env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, "-c", _LAST_COLLECTIVE],
                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]


def test_more_processes_than_gpus(monkeypatch):
    """NCCL needs a GPU per process: the 2nd process on a 1-GPU machine gets a clear error
    (not NCCL's own from deep inside its setup); with gloo processes share the GPUs."""
    from tgl_dist.context import _gpu_of
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert _gpu_of(0, "nccl") == 0 and _gpu_of(1, "gloo") == 0 and _gpu_of(2, "gloo") == 0
    with pytest.raises(ValueError, match="NCCL needs one GPU per process.*--nproc_per_node=1"):
        _gpu_of(1, "nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)   # gloo: round-robin
    assert [_gpu_of(r, "gloo") for r in range(5)] == [0, 1, 0, 1, 0]


def test_several_gpu_processes_need_local_rank(monkeypatch):
    """Without LOCAL_RANK every process took local rank 0, so all picked cuda:0 and NCCL
    failed later with its own 'Duplicate GPU' error: refused at init, saying why."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for k, v in {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match="WORLD_SIZE=2 on a machine showing 2 GPUs but "
                                         "LOCAL_RANK is not set"):
        DistributedContext.init(backend="gloo", use_gpu=True)
    # one visible GPU per process (CUDA_VISIBLE_DEVICES, as SLURM or mpirun give it): it
    # is this process's, so init goes on to the device (stopped here before rendezvous)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def stop(device):
        raise RuntimeError(f"set_device({device})")
    monkeypatch.setattr(torch.cuda, "set_device", stop)
    with pytest.raises(RuntimeError, match=r"set_device\(cuda:0\)"):
        DistributedContext.init(backend="gloo", use_gpu=True)


def test_sync_print_takes_print_keywords(capsys):
    ctx = DistributedContext.init(use_gpu=False)
    ctx.sync_print("a", "b", sep="-", flush=True)   # flush= used to be passed twice
    assert capsys.readouterr().out == "[rank 0]-a-b\n"


def _comm_device_worker():
    from tgl_dist.dist import all_gather_v, comm_device
    DistributedContext.init(use_gpu=False)
    return str(comm_device()), all_gather_v(torch.tensor([1.0])).tolist()


@pytest.mark.distributed
def test_gloo_collectives_run_on_the_cpu():
    from tgl_dist.dist import comm_device
    assert comm_device() is None                                 # no process group
    assert run_distributed(_comm_device_worker, 2) == [("cpu", [1.0, 1.0])] * 2


def test_device_flag_reaches_the_context(monkeypatch):
    # --device cpu must keep a GPU machine's run on the CPU (use_gpu=False), not "auto"
    import argparse

    from tgl_dist.cli import init_context
    from tgl_dist.context import DistributedContext
    seen = []
    monkeypatch.setattr(DistributedContext, "init", staticmethod(lambda **kw: seen.append(kw)))
    for device in ("cpu", "cuda", "auto"):
        init_context(argparse.Namespace(device=device, backend="gloo", timeout=5.0))
    assert [kw["use_gpu"] for kw in seen] == [False, True, None]
    assert all(kw["backend"] == "gloo" and kw["timeout"] == 5.0 for kw in seen)
