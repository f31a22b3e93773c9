"""``DistributedContext``: who am I (rank, world size, device) and the process groups.

Reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``/``MASTER_PORT``). Started without torchrun it is a world of one
and initialises no process group, so every example also runs as plain ``python``.
Tuning glibc's allocator for training (:func:`keep_freed_memory`) is opt-in:
``DistributedContext.init(..., keep_freed_memory=True)``; the examples ask for it.
"""
from __future__ import annotations

import atexit
import ctypes
import datetime
import logging
import os
import sys
import time
from typing import Optional, Tuple

import torch
import torch.distributed as dist

from tgl_dist.dist.exchange import DEFAULT_TIMEOUT, barrier, new_group

log = logging.getLogger(__name__)


def _restart_store(world_size: int, timeout: datetime.timedelta):
    """After a ``torchrun --max-restarts`` restart: the agent's store, under a prefix per attempt.

    torchrun's agent keeps one key-value store across restarts, and the process groups
    of a restarted attempt would find the dead attempt's addresses in it (gloo then
    fails with "connection refused"); a prefix per attempt keeps the attempts apart.
    ``None`` (the usual ``env://`` store) on a first attempt or without torchrun.
    """
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                         is_master=False, timeout=timeout)
    return dist.PrefixStore(f"tgl_dist/attempt_{restart}", base)


# glibc's mallopt parameters (malloc.h) and the environment variables that set them
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MALLOC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_",
               "GLIBC_TUNABLES")
_malloc_set: Optional[bool] = None


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse instead of returning it to the kernel.

    A training step allocates the same few-MB temporaries (edge rows, gradients) every
    step. With glibc's defaults each one larger than the mmap threshold, or freed at the
    top of the heap, goes back to the kernel when freed, and the next step takes ~500
    page faults (Wikipedia TGN, batch 200) to get zeroed pages back: 1-2 ms of a 15 ms
    step on a 2-core VM. This sets ``M_MMAP_THRESHOLD`` to 32 MiB (glibc's largest),
    ``M_TRIM_THRESHOLD`` to 128 MiB and ``M_TOP_PAD`` to 16 MiB: tensors under 32 MiB
    come from the heap, and up to 128 MiB of freed heap stays mapped. Peak RSS is that
    of the largest step either way; memory freed after it is returned later.

    Opt-in: :meth:`DistributedContext.init` calls it only with ``keep_freed_memory=True``
    (the example scripts pass it; ``--malloc-defaults`` turns it off). Does nothing (returns ``False``) off
    glibc, or when the environment sets malloc's parameters itself (``MALLOC_*_`` or
    ``GLIBC_TUNABLES``: the user's choice wins), e.g. with jemalloc or tcmalloc preloaded.
    """
    global _malloc_set
    if _malloc_set is None:
        _malloc_set = False
        if sys.platform.startswith("linux") and not any(k in os.environ for k in _MALLOC_ENV):
            try:
                libc = ctypes.CDLL(None)  # the process's own symbols: glibc's when it is glibc
            except OSError:
                libc = None
            if libc is not None and hasattr(libc, "gnu_get_libc_version"):
                _malloc_set = all(libc.mallopt(p, v) == 1 for p, v in (
                    (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 128 << 20),
                    (_M_TOP_PAD, 16 << 20)))
                log.debug("malloc keeps freed memory: %s", _malloc_set)
    return _malloc_set


_keep_freed_memory = keep_freed_memory   # (init's argument of the same name hides it)

_exit_grace_registered = False


def _exit_grace() -> None:
    """At exit, release the GIL for 50 ms so gloo's worker threads can drop what they hold.

    A gloo worker thread destroys each finished collective's record after the caller has
    its result, and dropping the record's Python-created tensors takes the GIL. A process
    that ends right after its last collective (under 5 ms of pure Python, e.g. a rank
    that prints nothing) can enter interpreter shutdown first; the worker then gets the
    GIL from a finalizing interpreter, its thread is unwound through a ``noexcept``
    destructor and the process aborts ("terminate called without an active exception",
    exit code -6: 1 run in 4 of the DTDG example under torchrun here; the same crash as
    pytorch/pytorch PR 179291). ``atexit`` runs while the interpreter is whole.
    """
    time.sleep(0.05)


def _gpu_of(local_rank: int, backend: str) -> int:
    """The GPU of the process with ``local_rank``: its own one. With gloo, processes
    beyond the visible GPUs share them round-robin (gloo moves data through host memory);
    NCCL needs one GPU per process and refuses a shared one deep inside its setup, so
    that is an error here, with what to do instead."""
    n = torch.cuda.device_count()
    if local_rank < n:
        return local_rank
    if backend == "nccl":
        raise ValueError(
            f"LOCAL_RANK {local_rank} but this machine shows {n} GPU(s): NCCL needs one GPU per "
            f"process. Start at most {n} process(es) per machine (torchrun --nproc_per_node={n}), "
            f"or use backend='gloo' (processes then share GPUs), or use_gpu=False")
    return local_rank % n


def _launch_env() -> Tuple[int, int, int]:
    """``(WORLD_SIZE, RANK, LOCAL_RANK)`` from the launcher's environment (torchrun sets all
    three; none means a world of one). Inconsistent values are refused here: otherwise two
    processes both become rank 0, or one waits for a rank that never comes, and the run
    fails after the rendezvous timeout with a socket error."""
    env = {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    vals = {}
    for k, v in env.items():
        try:
            vals[k] = int(v) if v is not None else None
        except ValueError:
            raise ValueError(f"environment variable {k}={v!r} is not an integer "
                             f"(launch with torchrun, which sets it)") from None
    world_size = 1 if vals["WORLD_SIZE"] is None else vals["WORLD_SIZE"]
    if world_size < 1:
        raise ValueError(f"environment variable WORLD_SIZE={world_size} must be at least 1")
    if world_size > 1 and vals["RANK"] is None:
        raise ValueError(f"WORLD_SIZE={world_size} but RANK is not set: each process needs its "
                         f"own RANK in [0, {world_size}) (torchrun sets both)")
    rank = 0 if vals["RANK"] is None else vals["RANK"]
    if not 0 <= rank < world_size:
        raise ValueError(f"environment variable RANK={rank} is outside [0, WORLD_SIZE="
                         f"{world_size})")
    local_rank = 0 if vals["LOCAL_RANK"] is None else vals["LOCAL_RANK"]
    if local_rank < 0:
        raise ValueError(f"environment variable LOCAL_RANK={local_rank} must be >= 0")
    return world_size, rank, local_rank


class DistributedContext:
    """The calling process's place in the distributed job.

    Attributes:
        rank: global rank in ``[0, world_size)``.
        world_size: number of processes.
        local_rank: rank on this machine (selects the GPU).
        device: ``cuda:<local_rank>`` when GPUs are used, else ``cpu`` (with gloo, more
            processes than GPUs on a machine share them: ``cuda:<local_rank % GPUs>``).
        backend: ``'gloo'`` or ``'nccl'`` (``None`` in a world of one).
        timeout: collective timeout; a rank that dies makes the others fail
            after at most this long instead of waiting forever.
    """

    def __init__(self, rank: int, world_size: int, local_rank: int,
                 device: torch.device, backend: Optional[str],
                 timeout: datetime.timedelta) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.device = device
        self.backend = backend
        self.timeout = timeout

    # ------------------------------------------------------------------ setup
    @classmethod
    def init(cls, backend: Optional[str] = None, use_gpu: Optional[bool] = None,
             timeout: float = DEFAULT_TIMEOUT,
             keep_freed_memory: bool = False) -> "DistributedContext":
        """Initialise (or join) the process group described by torchrun's environment.

        When a default process group already exists (made by the caller, or by an
        earlier ``init``), it is joined as it is: rank and world size come from it, and
        so does the backend when ``backend`` is ``None``. An explicit ``backend`` that
        differs from the existing group's is an error rather than silently ignored.
        The existing group keeps the timeout it was made with; ``timeout`` then applies
        to the groups made by :meth:`new_group` (and is reported as ``ctx.timeout``).

        Args:
            backend: ``'gloo'`` or ``'nccl'``; default NCCL when GPUs are used, else gloo
                (or, when a process group exists, that group's backend).
            use_gpu: use ``cuda:<local_rank>``; default: when CUDA is available. Collectives
                take their tensors on the group's device whatever the caller's
                (:func:`tgl_dist.dist.comm_device`): NCCL on the GPU, gloo on the CPU.
            timeout: seconds a collective may wait for a peer before it fails.
            keep_freed_memory: also make glibc's malloc keep freed memory for reuse
                (:func:`keep_freed_memory`: about 6 % faster TGN steps on 2 cores). It
                changes ``mallopt`` settings for the whole process, so it is off unless
                asked for (default ``False``); the example scripts turn it on.

        Raises:
            ValueError: an unknown backend; NCCL without GPUs, or with more processes on
                a machine than GPUs; or a ``backend`` that
                conflicts with the existing process group's (both are named).
        """
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if use_gpu is None:
            use_gpu = gpus > 0
        if keep_freed_memory:
            _keep_freed_memory()
        if use_gpu and not gpus:
            raise ValueError("use_gpu=True but CUDA is not available on this machine (no GPU "
                             "visible: check CUDA_VISIBLE_DEVICES)")
        if dist.is_initialized():   # the group's rank and size are read below
            world_size, rank, local_rank = 1, 0, int(os.environ.get("LOCAL_RANK", "0"))
        else:
            world_size, rank, local_rank = _launch_env()
        explicit = backend is not None
        if backend is None:
            backend = "nccl" if use_gpu else "gloo"
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
        if dist.is_initialized():
            existing = str(dist.get_backend())
            # a multi-device group names one backend per device type ("cpu:gloo,cuda:nccl")
            if explicit and backend not in {b.split(":")[-1] for b in existing.split(",")}:
                raise ValueError(f"backend={backend!r} conflicts with the process group that already "
                                 f"exists (backend {existing!r}); pass backend={existing!r} or None, "
                                 f"or destroy that group first")
            if not explicit:
                backend = existing
        if backend == "nccl" and not use_gpu:
            raise ValueError("backend='nccl' needs use_gpu=True (NCCL runs on GPUs only)")
        device = torch.device("cpu")
        if use_gpu:
            if (world_size > 1 and os.environ.get("LOCAL_RANK") is None
                    and torch.cuda.device_count() > 1):   # one visible GPU: it is this one's
                raise ValueError(f"WORLD_SIZE={world_size} on a machine showing "
                                 f"{torch.cuda.device_count()} GPUs but LOCAL_RANK is not set: "
                                 f"each process needs its own GPU, chosen by LOCAL_RANK "
                                 f"(torchrun sets it; or give each process one GPU with "
                                 f"CUDA_VISIBLE_DEVICES)")
            device = torch.device("cuda", _gpu_of(local_rank, backend))
            torch.cuda.set_device(device)
        td = datetime.timedelta(seconds=timeout)
        if world_size > 1 and not dist.is_initialized():
            store = _restart_store(world_size, td)
            dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=td,
                                    store=store)
        elif dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        global _exit_grace_registered
        if dist.is_initialized() and not _exit_grace_registered:
            atexit.register(_exit_grace)
            _exit_grace_registered = True
        ctx = cls(rank, world_size, local_rank, device,
                  backend if world_size > 1 or dist.is_initialized() else None, td)
        log.info("rank %d/%d on %s (backend %s)", rank, world_size, device, ctx.backend)
        return ctx

    # ---------------------------------------------------------------- groups
    def get_default_group(self) -> Optional[dist.ProcessGroup]:
        """The world process group (``None`` in a world of one)."""
        return dist.group.WORLD if dist.is_initialized() else None

    def new_group(self) -> Optional[dist.ProcessGroup]:
        """A new process group over all ranks (collective: every rank must call it).

        The data loader's background sampling uses one, so its collectives never
        interleave with the training loop's. ``None`` in a world of one.
        """
        return new_group(self.timeout)

    def barrier(self) -> None:
        """Wait for every rank; a dead or stuck peer raises :class:`PeerFailureError`
        (after at most the timeout), as every other collective does."""
        barrier()

    @property
    def is_main(self) -> bool:
        """True on rank 0."""
        return self.rank == 0

    # ---------------------------------------------------------------- output
    def sync_print(self, *args, **kwargs) -> None:
        """Print from every rank in rank order (collective: every rank must call it)."""
        for r in range(self.world_size):
            if r == self.rank:
                print(f"[rank {self.rank}]", *args, **{**kwargs, "flush": True})
                sys.stdout.flush()
            self.barrier()

    def shutdown(self) -> None:
        """Leave the process group cleanly."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def __repr__(self) -> str:
        return (f"DistributedContext(rank={self.rank}, world_size={self.world_size}, "
                f"device={self.device}, backend={self.backend})")
