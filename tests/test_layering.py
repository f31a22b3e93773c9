"""The package's import graph matches the layering docs/architecture.md states.

The doc holds the layers in a ``text`` block after ``<!-- layers -->`` (one line per
layer, lowest last: ``N  module module ...``) and the modules that call collectives in
a table after ``<!-- collectives -->``. This test parses both, walks every ``import`` in
``tgl_dist/`` (lazy ones inside functions too: they are how cycles hide) and fails on:
an import of a same-or-higher layer, a package missing from the table, or a module that
calls a collective without being listed (or listed without calling one).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "tgl_dist"
DOC = REPO / "docs" / "architecture.md"

#: what ``tgl_dist.dist`` exports that runs (or plans) a collective; ``world`` and
#: ``PartitionBook`` do not
COLLECTIVES = {"fetch_rows", "push_rows", "all_to_all_v", "AllToAllV", "all_gather_v", "all_gather_object",
               "all_reduce_", "all_reduce_async", "all_reduce_max_int", "broadcast_object",
               "barrier", "new_group", "Plan", "all_reduce_gradients", "broadcast_parameters",
               "reduce_gradients", "folder_writers", "copy_folder", "raise_everywhere"}


def _layers() -> Dict[str, int]:
    text = DOC.read_text()
    block = text.split("<!-- layers -->", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    layer = {}
    for line in block.strip().splitlines():
        m = re.match(r"^\s*(\d+)\s+(.+?)\s*$", line)
        assert m, f"docs/architecture.md layers: cannot read {line!r}"
        for name in m.group(2).split():
            layer[name] = int(m.group(1))
    return layer


def _documented_collective_callers() -> Set[str]:
    text = DOC.read_text().split("<!-- collectives -->", 1)[1]
    table = text.split("\n\n", 2)[1] if text.startswith("\n\n") else text.split("\n\n", 1)[0]
    return set(re.findall(r"^\| `(tgl_dist\.[\w.]+)` \|", table, re.M))


def _modules() -> Iterator[Tuple[str, Path]]:
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, f


def _imports(f: Path) -> Iterator[Tuple[str, Tuple[str, ...], int]]:
    """``(module, names, line)`` of every tgl_dist import in ``f``."""
    for n in ast.walk(ast.parse(f.read_text(), str(f))):
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0 \
                and n.module.split(".")[0] == "tgl_dist":
            yield n.module, tuple(a.name for a in n.names), n.lineno
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] == "tgl_dist":
                    yield a.name, (), n.lineno


def _part(module: str) -> str:
    """The layer table's unit: the subpackage or top-level module (``tgl_dist.dist``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_part_has_a_layer():
    layer = _layers()
    parts = {_part(m) for m, _ in _modules()} - {""}
    missing = sorted(parts - set(layer))
    assert not missing, f"add these to the layers in docs/architecture.md: {missing}"
    stale = sorted(set(layer) - parts)
    assert not stale, f"docs/architecture.md names parts that do not exist: {stale}"


def test_imports_only_go_down():
    """A part imports only from lower layers. Exempt: the package root (it re-exports the
    public names) and ``__main__`` modules (command lines, like the examples)."""
    layer = _layers()
    wrong = []
    for mod, f in _modules():
        src = _part(mod)
        if not src or mod.endswith("__main__"):
            continue
        for target, _, line in _imports(f):
            dst = _part(target)
            if dst and dst != src and layer[dst] >= layer[src]:
                wrong.append(f"{f.relative_to(REPO)}:{line}: {src} (layer {layer[src]}) "
                             f"imports {target} (layer {layer[dst]})")
    assert not wrong, "imports against docs/architecture.md's layering:\n" + "\n".join(wrong)


def test_collectives_are_called_where_the_doc_says():
    """Only ``context``, ``dist`` and ``testing`` touch ``torch.distributed``; every other
    module that runs a collective does it through ``tgl_dist.dist`` and is listed in the
    doc's table with the reason."""
    raw = []
    callers = set()
    for mod, f in _modules():
        src = f.read_text()
        if re.search(r"^\s*(import torch\.distributed|from torch import distributed|"
                     r"from torch\.distributed)", src, re.M) \
                and _part(mod) not in ("context", "dist", "testing"):
            raw.append(mod)
        if _part(mod) in ("dist", "testing"):
            continue
        for target, names, _ in _imports(f):
            if target.startswith("tgl_dist.dist") and COLLECTIVES & set(names):
                callers.add(mod)
    assert not raw, f"these import torch.distributed directly (go through tgl_dist.dist): {raw}"
    documented = _documented_collective_callers()
    assert callers == documented, (
        f"docs/architecture.md's collectives table is out of date: add "
        f"{sorted(callers - documented)}, remove {sorted(documented - callers)}")
