"""Real graphs loaded once per test session (the loaders are tested on them in several files)."""
import pytest

from tgl_dist.data import load_dataset


@pytest.fixture(scope="session")
def real_graph(datasets_root):
    """``real_graph(name)`` -> the TemporalGraph of a known dataset, cached for the session."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_dataset(name, root=datasets_root, download=False)
        return cache[name]
    return get
