"""Small hand-built snapshot graphs shared by the DTDG tests."""
import torch

from tgl_dist.dtdg import GraphData


def small_graph(N: int = 40, T: int = 6, F: int = 3, E: int = 260, seed: int = 0,
                name: str = "small") -> GraphData:
    """Random directed snapshots with weights, self loops, repeated edges and targets."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, N, (2, E), generator=gen)
    ei[:, :6] = torch.arange(6).repeat(2, 1)                  # some self loops
    ei[:, 6:9] = ei[:, 9:12]                                  # some repeated edges
    g = GraphData(ei, N)
    g.edge()["time"] = torch.randint(0, T, (E,), generator=gen)
    g.edge()["weight"] = torch.rand(E, generator=gen) + 0.5
    g.node()["x"] = torch.randn(N, T, F, generator=gen)
    g.node()["y"] = torch.randn(N, T, generator=gen)
    g.meta().update(num_snapshots=T, name=name)
    return g


def to_numpy(obj):
    """Tensors -> numpy, recursively (results crossing process boundaries must not share memory)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: to_numpy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_numpy(v) for v in obj)
    return obj


def to_torch(obj):
    """Inverse of :func:`to_numpy`."""
    import numpy as np
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj)
    if isinstance(obj, dict):
        return {k: to_torch(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_torch(v) for v in obj)
    return obj
