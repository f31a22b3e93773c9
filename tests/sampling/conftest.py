import pytest


@pytest.fixture(scope="session")
def wiki(datasets_root):
    """The real Wikipedia stream (loaded once per session)."""
    from tgl_dist.data import load_dataset
    return load_dataset("wikipedia", root=datasets_root, download=False)
