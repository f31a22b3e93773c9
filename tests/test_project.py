"""Project-level promises: the README's two commands and CI running the README's test command."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _start_here_commands():
    text = (REPO / "README.md").read_text()
    section = text.split("## Start here", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_first_screen_has_exactly_two_commands():
    cmds = _start_here_commands()
    assert len(cmds) == 2, cmds
    assert all("\n" not in c for c in cmds), "each set-up command is one line"
    assert cmds[0].startswith("pip install -e . && python examples/ctdg/train_tgn.py")
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert _start_here_commands()[1] in ci, "the README's test command must be a line of .ci/run"



def test_every_kernel_source_is_package_data():
    """``pip install .`` (not ``-e``) ships only the package data pyproject names: a C
    kernel left out is never built in a user's install, and its layer silently runs the
    slow torch path."""
    import fnmatch
    import tomllib
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]
    for src in sorted((REPO / "tgl_dist").rglob("*.c")):
        package = ".".join(src.parent.relative_to(REPO).parts)
        assert any(fnmatch.fnmatch(src.name, g) for g in globs.get(package, [])), (
            f"{src.relative_to(REPO)} is not in [tool.setuptools.package-data] {package!r}")
