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
