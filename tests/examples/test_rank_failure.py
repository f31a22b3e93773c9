"""A dead or stuck rank makes the other one stop with a clear error within --timeout (no hang).

The two ranks are started as plain processes with torchrun's environment (torchrun
itself would kill the survivor as soon as one worker dies, hiding its error). The
TGL_DIST_FAULT testing hook makes rank 1 SIGKILL itself (or raise, or hang) after train step 3
of epoch 0 and writes a marker file at that moment.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tgl_dist.testing import free_port

REPO = Path(__file__).resolve().parents[2]

# the README's second pytest run (TGL_DIST_NO_KERNEL=1) re-checks the models' torch path;
# these ranks run without the kernels in both runs (TGL_DIST_NO_KERNEL=1 below): once is enough
pytestmark = pytest.mark.skipif(os.environ.get("TGL_DIST_NO_KERNEL") == "1",
                                reason="TGL_DIST_NO_KERNEL=1: the ranks run the torch path in the "
                                       "first run already")
TGN = REPO / "examples" / "ctdg" / "train_tgn.py"
TINY = ["--data", "synthetic", "--num-nodes", "50", "--num-events", "800", "--batch-size", "100",
        "--eval-neg", "3", "--no-progress", "--threads", "1", "--epochs", "1",
        "--device", "cpu"]  # the CPU path (tests/gpu covers the GPU one)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("action,timeout", [("kill", 30), ("raise", 30), ("hang", 4)])
def test_peer_failure_stops_the_other_rank_with_the_step(tmp_path, action, timeout):
    marker = tmp_path / "fault-happened"
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TGL_DIST_NO_KERNEL="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   TGL_DIST_FAULT=f"rank=1,epoch=0,step=3,action={action},once={marker}")
        procs.append(subprocess.Popen(
            [sys.executable, str(TGN), *TINY, "--parts", str(tmp_path / "parts"),
             "--timeout", str(timeout)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True))
    try:
        _, err0 = procs[0].communicate(timeout=240)  # never hang the suite
        ended = time.time()
    finally:
        for p in procs:
            if p.poll() is None and (action == "hang" or p is procs[0]):
                p.kill()
            p.stderr_text = p.communicate(timeout=120)[1] if p is procs[1] else ""
    assert marker.is_file(), err0[-2000:]
    assert procs[0].returncode != 0
    assert "rank 0 stopped at epoch 0, split train, step 4 (3 steps of it done)" in err0, err0[-2000:]
    assert "a peer rank failed or stopped responding" in err0
    # within the collective timeout (plus process start-up of the error path and exit)
    assert ended - marker.stat().st_mtime < timeout + 10
    if action == "kill":
        assert procs[1].returncode == -9
    if action == "raise":  # the failing rank shows its own error
        assert procs[1].returncode not in (0, None)
        assert "injected failure on rank 1 at epoch 0, train step 3" in procs[1].stderr_text
