"""Shared fixtures: where the real datasets live.

``TGL_DIST_DATASETS`` points at the datasets folder (default ``../shared/datasets``
relative to the repository root). Tests that need it skip with a clear reason only
when that folder is absent (a user's clone); in CI it is present and they run.
"""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATASETS = Path(os.environ.get("TGL_DIST_DATASETS", REPO.parent / "shared" / "datasets")).resolve()


@pytest.fixture(scope="session")
def datasets_root() -> Path:
    if not DATASETS.is_dir():
        pytest.skip(f"real datasets folder {DATASETS} is absent; set TGL_DIST_DATASETS to it")
    return DATASETS


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line naming how many tests skipped for want of the real datasets, and the
    variable that brings them back (so a clone without them does not pass quietly)."""
    skipped = terminalreporter.stats.get("skipped", [])
    n = sum(1 for r in skipped if "TGL_DIST_DATASETS" in str(getattr(r, "longrepr", "")))
    if n:
        terminalreporter.write_line(
            f"{n} test(s) skipped: the real datasets folder {DATASETS} is absent. Set "
            f"TGL_DIST_DATASETS to a folder holding them (the project's shared/datasets; "
            f"docs/data.md lists each file and its public origin) to run them.", yellow=True)
