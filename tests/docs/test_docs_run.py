"""Every ```python block of README.md and docs/*.md runs, as a reader following the page runs it.

Convention (also stated at the end of docs/index.md):

* Pages: ``README.md`` and every ``docs/*.md`` (a glob: a page added later is picked up
  without editing this file). One test per page.
* A fence labelled ``python`` (or ``py``) is code that runs. Anything else is labelled
  with its own language (``bash``, ``yaml``, ``json``, ``text``); a fence without a
  label whose body parses as Python fails the page's test (label it one way or the
  other), so no Python block escapes the runner by missing its label.
* A page's python blocks run in page order as ONE script (later blocks use the names of
  earlier ones), in a fresh ``python`` process. Every block runs: there is no way to
  skip one.
* A python block preceded (on the last non-blank line above its fence) by
  ``<!-- run: torchrun 2 -->`` is a script of its own: it runs under
  ``python -m torch.distributed.run --nproc_per_node=2`` (gloo, ``OMP_NUM_THREADS=1``,
  a free port), after the page's other blocks, in the same working directory (so it may
  read files they wrote), and it does not see their names. Any other ``<!-- run: ... -->``
  line is an error.
* The working directory is a new temporary folder holding symbolic links to the
  repository's top-level folders that pages read (``configs``, ``examples``, ...), so
  relative paths such as ``configs/TGN.yml`` work as they do from the repository root,
  and what a page writes (``parts/``, checkpoints) lands in the temporary folder.
  ``PYTHONPATH`` is the repository root; ``TGL_DIST_DATASETS`` is the folder the suite
  uses (tests/conftest.py). Where that folder is absent, a page that fails because a
  dataset is missing is skipped with that reason; any other failure fails.
* Pages use small data (the built-in ``synthetic`` stream, the small shared datasets)
  and each script has a time limit (``LIMIT_S``).

A failure names the page, the block (its number and line on the page, and its first
lines) and shows the tail of stderr.
"""
import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATASETS = Path(os.environ.get("TGL_DIST_DATASETS", REPO.parent / "shared" / "datasets")).resolve()
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
PYTHON = {"python", "py", "python3"}
TORCHRUN = "<!-- run: torchrun 2 -->"
LIMIT_S = {"python": 120, "torchrun": 180}      # per script; measured figures are far below
# top-level entries a page may read through a relative path (never written: outputs go to
# the temporary working directory)
LINKED = ("configs", "examples", "benchmarks", "docs", "tgl_dist", "README.md", "pyproject.toml")
MARK = "# <docs-run> block {n}"
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`]*)[^`]*$")


class Block:
    def __init__(self, page: Path, n: int, line: int, lang: str, code: str, mode: str):
        self.page, self.n, self.line, self.lang = page, n, line, lang
        self.code, self.mode = code, mode

    def where(self) -> str:
        head = "\n".join("    " + ln for ln in self.code.splitlines()[:6])
        return (f"{_name(self.page)} block {self.n} (line {self.line}, "
                f"{'torchrun 2' if self.mode == 'torchrun' else 'python'}):\n{head}")


def fenced_blocks(page: Path):
    """Every fenced block of ``page``: Block objects, python ones numbered 1, 2, ..."""
    lines = page.read_text().splitlines()
    out, i, n = [], 0, 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group("indent"), m.group("fence"), m.group("lang").lower()
        start, i = i, i + 1
        body = []
        while i < len(lines) and not (lines[i].strip().startswith(fence)
                                      and lines[i].strip().strip(fence[0]) == ""):
            ln = lines[i]
            body.append(ln[len(indent):] if ln.startswith(indent) else ln.lstrip())
            i += 1
        i += 1
        above = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
        mode = "python"
        if above.startswith("<!-- run:"):
            if above != TORCHRUN:
                raise AssertionError(f"{_name(page)} line {start + 1}: unknown directive "
                                     f"{above!r}; the only one is {TORCHRUN!r} (every block runs)")
            mode = "torchrun"
        if lang in PYTHON:
            n += 1
        out.append(Block(page, n if lang in PYTHON else 0, start + 1, lang, "\n".join(body) + "\n",
                         mode))
        if mode == "torchrun" and lang not in PYTHON:
            raise AssertionError(f"{_name(page)} line {start + 1}: {TORCHRUN} "
                                 f"above a ```{lang} fence, not a python one")
    return out


def _parses_as_python(code: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    return bool(tree.body) and not all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Name)
                                       for s in tree.body)


def _workdir(tmp_path: Path) -> Path:
    for name in LINKED:
        if (REPO / name).exists():
            (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def _env() -> dict:
    path = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TGL_DIST_DATASETS=str(DATASETS),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)                 # a page starts as a world of one (or torchrun's)
    return env


def _script(blocks) -> str:
    parts = []
    for b in blocks:
        parts.append(f"{MARK.format(n=b.n)}\n"
                     f"import sys as _docs_sys; print('<docs-run> block {b.n}', "
                     f"file=_docs_sys.stderr, flush=True)\n{b.code}")
    return "\n".join(parts)


def _failed_block(blocks, script_path: Path, script: str, stderr: str):
    """The block a failure happened in: from the traceback's last line in the script, else
    the last block that started (a timeout, a crash)."""
    starts = [i for i, ln in enumerate(script.splitlines(), 1)
              if ln.startswith("# <docs-run> block ")]
    hits = re.findall(rf'File "{re.escape(str(script_path))}", line (\d+)', stderr)
    if hits:
        line = int(hits[-1])
        k = max(j for j, s in enumerate(starts) if s <= line)
        return blocks[k], line - starts[k] - 1
    begun = re.findall(r"<docs-run> block (\d+)", stderr)
    if begun:
        return next(b for b in blocks if b.n == int(begun[-1])), None
    return blocks[0], None


def _run(blocks, mode: str, cwd: Path, tag: str):
    script = _script(blocks)
    path = cwd / f"_docs_{tag}.py"
    path.write_text(script)
    if mode == "torchrun":
        from tgl_dist.testing import free_port
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(path)]
    else:
        cmd = [sys.executable, str(path)]
    t0 = time.perf_counter()
    # a session of its own, so a timeout ends torchrun's workers too, not only torchrun
    p = subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=LIMIT_S[mode])
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc = None
    return rc, out, err, time.perf_counter() - t0, script, path


def _missing_dataset(err: str) -> bool:
    return not DATASETS.is_dir() and ("DatasetNotFoundError" in err or "TGL_DIST_DATASETS" in err
                                      or str(DATASETS) in err)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_page_runs(page, tmp_path):
    run_page(page, tmp_path)


def _name(page: Path) -> str:
    return str(page.relative_to(REPO)) if page.is_relative_to(REPO) else str(page)


def run_page(page: Path, tmp_path: Path) -> None:
    """Run ``page``'s python blocks (see the module docstring); ``pytest.fail`` naming the
    block on a failure."""
    blocks = fenced_blocks(page)
    for b in blocks:
        if b.lang == "" and _parses_as_python(b.code):
            pytest.fail(f"{_name(page)} line {b.line}: a fence without a language "
                        f"holds Python; label it ```python (it then runs) or ```text")
    code = [b for b in blocks if b.lang in PYTHON]
    plain = [b for b in code if b.mode == "python"]
    scripts = ([("python", plain)] if plain else []) + \
              [("torchrun", [b]) for b in code if b.mode == "torchrun"]
    cwd = _workdir(tmp_path)
    for k, (mode, group) in enumerate(scripts):
        rc, out, err, took, script, path = _run(group, mode, cwd, f"{k}_{mode}")
        print(f"{_name(page)} {mode} blocks {[b.n for b in group]}: {took:.1f} s")
        if rc == 0:
            continue
        if _missing_dataset(err):
            last = next((ln for ln in reversed(err.splitlines()) if ln.strip()), "")
            pytest.skip(f"{_name(page)} reads a real dataset and {DATASETS} is absent; "
                        f"set TGL_DIST_DATASETS to it ({last[:200]})")
        b, at = _failed_block(group, path, script, err)
        what = f"timed out after {LIMIT_S[mode]} s" if rc is None else f"exited with status {rc}"
        tail = "\n".join(err.splitlines()[-40:])
        pytest.fail(f"{b.where()}\n{mode} script {what}"
                    + (f", at line {at} of the block (line {b.line + at} of the page)" if at else "")
                    + f"\n--- stdout tail ---\n{out[-1500:]}\n--- stderr tail ---\n{tail}",
                    pytrace=False)


# --- the runner itself ---

def test_the_convention_is_parsed(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("""text
```python
a = 1
```
```bash
echo not python
```
<!-- run: torchrun 2 -->

```py
b = 2
```
  ```python
  c = a + 1
  ```
""")
    got = [(b.n, b.lang, b.mode, b.line, b.code) for b in fenced_blocks(page)]
    assert got == [(1, "python", "python", 2, "a = 1\n"),
                   (0, "bash", "python", 5, "echo not python\n"),
                   (2, "py", "torchrun", 10, "b = 2\n"), (3, "python", "python", 13, "c = a + 1\n")]
    page.write_text("<!-- run: skip-reason slow -->\n```python\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="unknown directive"):
        fenced_blocks(page)


def test_a_failure_names_the_block_and_unlabelled_python_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n```python\ny = x + 1\nraise ValueError('boom')\n```\n")
    with pytest.raises(pytest.fail.Exception) as e:
        run_page(page, tmp_path)
    msg = str(e.value)
    assert "block 2 (line 5, python)" in msg and "y = x + 1" in msg, msg
    assert "at line 2 of the block (line 7 of the page)" in msg and "ValueError: boom" in msg, msg
    page.write_text("```\nimport os\nprint(os.sep)\n```\n```\nparts/<name>/ -> OUT\n```\n")
    with pytest.raises(pytest.fail.Exception, match="fence without a language holds Python"):
        run_page(page, tmp_path)


def test_a_block_past_the_time_limit_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(LIMIT_S, "python", 3)
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n```python\nimport time\ntime.sleep(60)\n```\n")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)block 2 \(line 4.*timed out after 3 s"):
        run_page(page, tmp_path)


@pytest.mark.distributed
def test_a_torchrun_block_runs_on_two_processes(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 1\n```\n\n<!-- run: torchrun 2 -->\n```python\nimport os\n"
                    "assert os.environ['WORLD_SIZE'] == '2'\n"
                    "assert 'x' not in globals()           # a script of its own\n"
                    "if os.environ['RANK'] == '1':\n    raise RuntimeError('rank 1 fails')\n```\n")
    with pytest.raises(pytest.fail.Exception) as e:
        run_page(page, tmp_path)
    msg = str(e.value)
    assert "block 2 (line 6, torchrun 2)" in msg and "RuntimeError: rank 1 fails" in msg, msg
