"""Command-line helpers shared by the package's CLIs and the example scripts."""
from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, List, NoReturn, Optional, Tuple

from tgl_dist.checkpoint.manager import CheckpointError
from tgl_dist.checkpoint.recovery import Every
from tgl_dist.context import DEFAULT_TIMEOUT
from tgl_dist.errors import PeerFailureError, TGLDistError

log = logging.getLogger(__name__)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` text with each option's default, written once.

    Like :class:`argparse.ArgumentDefaultsHelpFormatter`, but adds ``(default: X)`` only
    when the help text does not already say what the default is, and not for defaults
    that mean "not given" (``None``, ``False``).
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unset = action.default is None or action.default is False  # not 0, not 0.0
        if "default" in text.lower() or unset or action.default == argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def _number(text: str, kind, what: str, ok: Callable[[Any], bool]):
    try:
        v = kind(text)
    except ValueError:
        v = None
    if v is None or (kind is float and not math.isfinite(v)) or not ok(v):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1 (else ``error: argument --x: expected ...``)."""
    return _number(text, int, "a positive integer", lambda v: v >= 1)


def non_negative_int(text: str) -> int:
    """argparse ``type=``: an integer >= 0."""
    return _number(text, int, "a non-negative integer", lambda v: v >= 0)


def seed_int(text: str) -> int:
    """argparse ``type=``: a seed, an integer in ``[0, 2^32)`` (what numpy's seeding takes)."""
    return _number(text, int, "a seed in [0, 2^32)", lambda v: 0 <= v < 2 ** 32)


def positive_float(text: str) -> float:
    """argparse ``type=``: a finite number > 0 (``nan``, ``inf`` are refused)."""
    return _number(text, float, "a positive finite number", lambda v: v > 0)


def non_negative_float(text: str) -> float:
    """argparse ``type=``: a finite number >= 0."""
    return _number(text, float, "a non-negative finite number", lambda v: v >= 0)


def strategy_list(text: str) -> Tuple[str, ...]:
    """argparse ``type=``: a comma list of negative-sampling strategies
    (``random,historical,inductive``)."""
    from tgl_dist.sampling.negative import STRATEGIES
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in STRATEGIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(STRATEGIES)}, "
                                         f"got {text!r}")
    return names


def add_eval_strategies(p: argparse.ArgumentParser) -> None:
    """``--eval-strategies``: DyGLib's negative-sampling protocols the run reports."""
    p.add_argument("--eval-strategies", type=strategy_list, default=("random",),
                   metavar="LIST",
                   help="negative-sampling protocols of the reported evaluation, a comma list "
                        "(DyGLib, docs/evaluation.md): random (destination uniform over the "
                        "stream's destinations: the per-epoch val/test, model selection and "
                        "early stopping always use it), historical (pairs seen before the "
                        "batch, not in it), inductive (pairs first seen after the training "
                        "(val) / validation (test) period). Each non-random one evaluates the "
                        "best epoch's state again on val and test after the last epoch: "
                        "summary keys val_ap_<s>, test_{ap,auc,mrr}_<s>, "
                        "edgebank_test_{ap,auc,mrr}_<s>; default: random")


def folder_path(text: str) -> str:
    """argparse ``type=``: a folder to read or create; refused when it, or the nearest of
    its parents that exists, is a file (creating it would fail)."""
    path = Path(text)
    for q in (path, *path.parents):
        if q.exists():
            if not q.is_dir():
                raise argparse.ArgumentTypeError(
                    f"{q} is not a folder" + ("" if q == path else f" (in {text})"))
            break
    return text


def file_path(text: str) -> str:
    """argparse ``type=``: a file to write; refused when it is a folder, or a parent of it
    is a file."""
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, expected a file name")
    folder_path(str(Path(text).parent))
    return text


def add_run_arguments(p: argparse.ArgumentParser, step: str = "training steps",
                      run_folder: bool = False) -> None:
    """The options every training script shares: ``--device``, ``--backend``,
    ``--timeout`` and the checkpoint ones (``--checkpoint-dir``, ``--checkpoint-every``,
    ``--checkpoint-keep-every``, ``--resume``); ``step`` names what
    ``--checkpoint-every N`` counts. :func:`init_context` reads the first three.
    ``run_folder``: also ``--out`` (the run folder of :class:`tgl_dist.ctdg.Trainer`)."""
    if run_folder:
        p.add_argument("--out", type=folder_path, default=None,
                       help="run folder: metrics.csv, summary.json, config.yml, curves.png "
                            "(default: runs/<data>_<model>_<timestamp>)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the model and the node state live: cuda:<local rank> "
                        "(auto: when CUDA is available) or cpu")
    p.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                   help="collective backend between processes (default: nccl on GPUs, "
                        "gloo on CPUs)")
    p.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT,
                   help="seconds a collective waits for a peer; a dead or stuck rank makes the "
                        "others fail with PeerFailureError after at most this long")
    p.add_argument("--malloc-defaults", action="store_true",
                   help="leave glibc's malloc settings alone (by default this script makes "
                        "malloc keep freed memory for the next step's temporaries: "
                        "tgl_dist.context.keep_freed_memory)")
    p.add_argument("--checkpoint-dir", type=folder_path, default=None, help="write versioned checkpoints here")
    p.add_argument("--checkpoint-every", default="1e",
                   help=f"N (or Ns): every N {step}, counted over the run; Ne: every N epochs. "
                        "One is always written after the last epoch")
    p.add_argument("--checkpoint-keep-every", type=non_negative_int, default=0,
                   help="also keep a snapshot every N epochs: the last checkpoint version at or "
                        "before epochs N, 2N, ... (default 0: only the latest)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run committed in --checkpoint-dir up to --epochs in total "
                        "(starts from scratch when nothing is committed yet)")


def parse_run_arguments(p: argparse.ArgumentParser, argv: Optional[List[str]] = None
                        ) -> Tuple[argparse.Namespace, Every]:
    """``p.parse_args(argv)`` and the checkpoint schedule of :func:`add_run_arguments`'
    options: ``(args, Every)``. A bad ``--checkpoint-every``, or ``--resume`` without
    ``--checkpoint-dir``, exits with the parser's usage error."""
    quiet_usage_errors(p)
    args = p.parse_args(argv)
    try:
        every = Every.parse(args.checkpoint_every)
    except ValueError as e:
        p.error(str(e))
    if args.resume and not args.checkpoint_dir:
        p.error("--resume needs --checkpoint-dir")
    return args, every


def init_context(args: argparse.Namespace):
    """``DistributedContext.init`` from :func:`add_run_arguments`' ``--device``,
    ``--backend`` and ``--timeout``, with glibc's allocator tuned for training unless
    ``--malloc-defaults`` (:func:`tgl_dist.context.keep_freed_memory`); a combination that cannot work (NCCL on CPUs, CUDA
    asked for on a machine without it, more processes than GPUs with NCCL) exits with
    ``error: ...``."""
    from tgl_dist.context import DistributedContext
    use_gpu = {"auto": None, "cpu": False, "cuda": True}[args.device]
    try:
        return DistributedContext.init(backend=args.backend, use_gpu=use_gpu,
                                       timeout=args.timeout,
                                       keep_freed_memory=not getattr(args, "malloc_defaults", False))
    except ValueError as e:
        raise SystemExit(f"error: --device {args.device} --backend {args.backend or 'default'}: "
                         f"{e}") from None


def default_threads(world_size: int) -> int:
    """Torch threads per process when ``--threads`` is not given: this machine's cores over
    the ranks on this machine (``LOCAL_WORLD_SIZE``, which torchrun sets per node), so a
    job over several machines gives each of its processes its machine's share, not the
    cores over the whole world. Without torchrun, ``world_size`` processes are assumed on
    this machine."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    try:
        ranks_here = int(local) if local else world_size
    except ValueError:
        raise ValueError(f"environment variable LOCAL_WORLD_SIZE={local!r} is not an integer "
                         f"(launch with torchrun, which sets it)") from None
    return max(1, (os.cpu_count() or 1) // max(ranks_here, 1))


def start_run(args: argparse.Namespace, logger: str = "tgl_dist.ctdg.trainer"):
    """What every training script does first: warnings from the library and INFO from
    ``logger`` (the trainer's per-epoch lines) on stderr, :func:`init_context`, and
    ``args.threads`` torch threads (default :func:`default_threads`). Returns the context."""
    import torch
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger(logger).setLevel(logging.INFO)
    ctx = init_context(args)
    torch.set_num_threads(getattr(args, "threads", None) or default_threads(ctx.world_size))
    return ctx


def run_script(main: Callable[..., Any], *args, **kwargs) -> Any:
    """``main(*args, **kwargs)`` for a training script, with its expected failures ended
    cleanly: a :class:`PeerFailureError` (a peer rank died; its own error is in its log,
    this rank says where it was) is written to stderr and the process exits at once with
    code 1 (tearing the broken process group down at interpreter exit may abort); a
    :class:`CheckpointError` (``--resume`` from another run's shape, a corrupt file) or
    any other of the package's errors about the user's input (a bad config field, a
    malformed data file, a missing partition: :class:`TGLDistError`), and a script's own
    ``SystemExit("error: ...")``, end with ``error: ...`` naming the file and field, and
    no stack trace.

    Under torchrun (:func:`fail`) the message is printed once for the job: by rank 0, and
    by another rank only when its message differs from rank 0's; every rank also writes
    it to torchrun's error file, so torchrun's failure summary shows it as each failed
    rank's cause instead of "To enable traceback see ..."."""
    try:
        return main(*args, **kwargs)
    except PeerFailureError as e:
        log.error("%s", e)
        _error_file(f"error: {e}")
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    except (CheckpointError, TGLDistError) as e:
        fail(f"error: {e}")
    except SystemExit as e:
        if isinstance(e.code, str):
            fail(e.code)
        raise


def _env_rank() -> Optional[int]:
    """This process's global rank as torchrun sets it (``RANK``), or ``None``."""
    try:
        return int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None


def _error_file(message: str) -> None:
    """Write ``message`` to torchrun's per-rank error file (``TORCHELASTIC_ERROR_FILE``),
    which its failure summary prints as the rank's ``traceback`` line."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    import json
    import time
    try:
        with open(path, "w") as fh:
            json.dump({"message": message, "timestamp": int(time.time())}, fh)
    except OSError:   # the summary then says "To enable traceback see ..."; not worth failing
        pass


def fail(message: str) -> NoReturn:
    """End this process with ``message`` (``SystemExit``: printed to stderr, exit code 1),
    once per job under torchrun: rank 0 says it; another rank says it (prefixed
    ``[rank R]``) only when rank 0 did not fail with the same message (compared through
    the process group's store; before the group exists only rank 0 speaks, as every rank
    parsed the same command line), else exits 1 quietly. Under torchrun every rank also
    writes it to its error file (torchrun's failure summary prints it)."""
    rank = _env_rank()
    if rank is None:   # not under torchrun
        raise SystemExit(message)
    from tgl_dist.dist import world
    from tgl_dist.dist.exchange import same_as_rank0
    _error_file(message)
    same = same_as_rank0(message)
    if rank == 0:
        raise SystemExit(message)
    if not same and world()[1] > 1:
        raise SystemExit(f"[rank {rank}] {message}")
    raise SystemExit(1)


def quiet_usage_errors(p: argparse.ArgumentParser) -> None:
    """Under torchrun, ranks other than 0 exit on a command-line error without printing
    the usage message again (every rank parses the same command line); each writes it to
    torchrun's error file."""
    rank = _env_rank()

    def error(message: str):
        _error_file(f"{p.prog}: error: {message}")
        if rank in (None, 0):
            p.print_usage(sys.stderr)
            p.exit(2, f"{p.prog}: error: {message}\n")
        p.exit(2)
    p.error = error   # type: ignore[method-assign]
