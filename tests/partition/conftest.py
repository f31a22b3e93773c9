"""Fixtures for partition tests: a small hand-built stream with features, labels and isolated nodes."""
import pytest
import torch

from tgl_dist.data import TemporalGraph


def make_graph(num_nodes: int = 40, num_events: int = 300, seed: int = 0, isolated: int = 3,
               name: str = "toy") -> TemporalGraph:
    """Two communities (ids < half and >= half) with a few cross events; the last
    ``isolated`` node ids never appear in an event."""
    g = torch.Generator().manual_seed(seed)
    active = num_nodes - isolated
    half = active // 2
    comm = torch.randint(0, 2, (num_events,), generator=g)
    src = torch.randint(0, half, (num_events,), generator=g) + comm * half
    dst = torch.randint(0, half, (num_events,), generator=g) + comm * half
    cross = torch.rand(num_events, generator=g) < 0.05
    dst[cross] = (dst[cross] + half) % (2 * half)
    t = torch.sort(torch.rand(num_events, generator=g, dtype=torch.float64) * 1000).values
    return TemporalGraph(src, dst, t, num_nodes=num_nodes,
                         edge_attr=torch.randn(num_events, 3, generator=g),
                         node_feat=torch.randn(num_nodes, 2, generator=g),
                         labels=torch.randint(0, 2, (num_events,), generator=g), name=name)


@pytest.fixture
def toy_graph() -> TemporalGraph:
    return make_graph()


@pytest.fixture(name="make_graph")
def make_graph_fixture():
    """The :func:`make_graph` builder, for tests that need other sizes."""
    return make_graph
