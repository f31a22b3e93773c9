"""Two torchrun launchers on loopback (``--nnodes=2``), each in its own mount namespace, so
each "node" has a private folder at the SAME path (``<tmp>/private``, a bind mount of
``<tmp>/node0`` or ``<tmp>/node1``): no file system is shared between them.

One run of examples/ctdg/train_tgn.py on the synthetic stream must give the same test AP
as one launcher with two processes on one shared folder; node 1's private ``--parts``
must hold rank 0's partition (received over the process group) and its private
``--checkpoint-dir`` what rank 1 needs to resume; and a resume (through the c10d
rendezvous) where node 1's checkpoint is missing stops both nodes at once with an error
naming the node that lacks it and the path. Resuming from private folders itself is
tests/checkpoint/test_private_folders.py (2 gloo ranks, quicker).

Needs ``unshare -m`` and ``mount`` (root, as in CI); skips with the reason otherwise.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tgl_dist.testing import free_port

# the README's second pytest run (the torch reference path of the models) needs no second
# multi-node launch: what this file tests is the file systems, not the kernels
pytestmark = pytest.mark.skipif(os.environ.get("TGL_DIST_NO_KERNEL") == "1",
                                reason="TGL_DIST_NO_KERNEL=1: the launch is tested in the first run")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "ctdg" / "train_tgn.py"
# --threads 1: the same threads per process in both layouts (a launcher with one process
# per node would otherwise default to all the cores, and the thread count changes results)
SMALL = ["--num-nodes", "200", "--num-events", "3000", "--epochs", "1", "--no-progress",
         "--device", "cpu", "--threads", "1"]
TIMEOUT = 240


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))


def _can_unshare(tmp: Path) -> str:
    """'' when a private bind mount in a new mount namespace works here, else why not."""
    if not shutil.which("unshare"):
        return "unshare (util-linux) is not installed"
    (tmp / "probe_src").mkdir()
    (tmp / "probe_dst").mkdir()
    p = subprocess.run(["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$1"',
                        str(tmp / "probe_src"), str(tmp / "probe_dst")],
                       capture_output=True, text=True)
    if p.returncode:
        return f"unshare -m / mount --bind not permitted here: {p.stderr.strip()[:200]}"
    return ""


def _node(tmp: Path, node: int, rendezvous, args):
    """A launcher for node ``node`` in its own mount namespace, its private folder bound at
    ``<tmp>/private``."""
    own = tmp / f"node{node}"
    own.mkdir(exist_ok=True)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                "--nproc_per_node=1", *rendezvous(node), str(SCRIPT), *args]
    shell = (f"mount --bind {shlex.quote(str(own))} {shlex.quote(str(tmp / 'private'))} "
             f"|| exit 97; exec {shlex.join(torchrun)}")
    return subprocess.Popen(["unshare", "-m", "sh", "-c", shell], cwd=tmp, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _two_nodes(tmp: Path, rendezvous, args):
    procs = [_node(tmp, n, rendezvous, args) for n in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT)
            outs.append((p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


def _summary(stdout: str) -> dict:
    return json.loads([ln for ln in stdout.splitlines() if ln.strip()][-1])


@pytest.mark.slow
@pytest.mark.distributed
def test_two_nodes_without_a_shared_folder(tmp_path):
    why = _can_unshare(tmp_path)
    if why:
        pytest.skip(why)
    (tmp_path / "private").mkdir()
    # the reference: one launcher, two processes, one shared folder
    ref = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node=2", str(SCRIPT), *SMALL,
                          "--parts", str(tmp_path / "shared_parts"),
                          "--out", str(tmp_path / "ref_run")],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=TIMEOUT)
    assert ref.returncode == 0, ref.stderr[-3000:]
    ref = _summary(ref.stdout)

    private = tmp_path / "private"
    args = [*SMALL, "--parts", str(private / "parts"), "--checkpoint-dir", str(private / "ck")]
    port = free_port()
    static = lambda node: [f"--node_rank={node}", "--master_addr=127.0.0.1",  # noqa: E731
                           f"--master_port={port}"]
    (rc0, out0, err0), (rc1, out1, err1) = _two_nodes(
        tmp_path, static, [*args, "--out", str(tmp_path / "run")])
    assert rc0 == 0 and rc1 == 0, (err0[-2000:], err1[-2000:])
    got = _summary(out0)
    assert got["world_size"] == 2
    assert got["test_ap"] == pytest.approx(ref["test_ap"], abs=1e-5), (got, ref)
    assert got["val_ap"] == pytest.approx(ref["val_ap"], abs=1e-5)
    assert not any(private.iterdir()), "the private folders leaked into the shared path"

    # each node's private --parts holds rank 0's partition, byte for byte
    part = Path("parts") / "synthetic" / "metis_for_tgnn_2"
    m0, m1 = (tmp_path / f"node{n}" / part / "manifest.json" for n in (0, 1))
    assert m0.is_file() and m1.is_file()
    assert m0.read_bytes() == m1.read_bytes()
    for rel in json.loads(m0.read_text())["files"]:
        assert (tmp_path / "node1" / part / rel).read_bytes() == \
            (tmp_path / "node0" / part / rel).read_bytes(), rel
    # each node's private checkpoint folder: the replicated files and its own rank's shard
    for n in (0, 1):
        ck = tmp_path / f"node{n}" / "ck"
        assert (ck / "VERSION").read_text().strip() == "1"
        names = sorted(p.name for p in (ck / "v000001").iterdir())
        assert names == sorted(["dense.pt", "manifest_0.json", f"shard_{n}.pt"]
                               + ([f"manifest_{n}.json"] if n else [])), (n, names)
    assert (tmp_path / "node0" / "ck" / "v000001" / "dense.pt").read_bytes() == \
        (tmp_path / "node1" / "ck" / "v000001" / "dense.pt").read_bytes()

    # node 1 lost its checkpoint: both nodes stop at once, naming the node that lacks it
    # and the path; this time through the c10d rendezvous (it numbers the nodes itself)
    shutil.rmtree(tmp_path / "node1" / "ck")
    rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            "--rdzv-id=multinode-test"]
    (rc0, out0, err0), (rc1, out1, err1) = _two_nodes(
        tmp_path, lambda node: rdzv, [*args, "--resume", "--out", str(tmp_path / "run3")])
    assert rc0 != 0 and rc1 != 0
    for err in (err0, err1):
        assert "the ranks do not see the same committed checkpoint" in err, err[-2000:]
        assert f"): nothing committed in {private / 'ck' / 'VERSION'}" in err, err[-2000:]
        assert f"): version 1 in {private / 'ck' / 'VERSION'}" in err, err[-2000:]
