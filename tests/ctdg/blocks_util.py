"""Hand-built message-flow graphs for model tests (no sampler needed)."""
from typing import List, Optional

import torch

from tgl_dist.sampling.block import Block, Roots


def make_batch(B: int, num_nodes: int, fanouts: List[int], t0: float = 100.0,
               dim_edge: int = 0, dim_node: int = 0, seed: int = 0, k_neg: int = 1):
    """Roots ``[src | dst | neg]`` at times ``t0 + i`` and ``len(fanouts)`` chained blocks.

    Neighbours are random nodes at random earlier times (dt > 0). Returns
    ``(roots, mfgs, metadata)`` with ``mfgs`` input layer first.
    """
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (B,), generator=g)
    dst = torch.randint(0, num_nodes, (B,), generator=g)
    neg = torch.randint(0, num_nodes, (k_neg * B,), generator=g)
    t = t0 + torch.arange(B, dtype=torch.float64)
    nodes = torch.cat([src, dst, neg])
    ts = torch.cat([t, t, t.repeat(k_neg)])
    roots = Roots(nodes=nodes, ts=ts, eids=torch.arange(B), src=src, dst=dst, t=t)
    blocks = []
    ids, qts = nodes, ts
    for f in reversed(fanouts or [0]):
        D = ids.numel()
        deg = torch.randint(0, f + 1, (D,), generator=g) if f else torch.zeros(D, dtype=torch.long)
        e_dst = torch.repeat_interleave(torch.arange(D), deg)
        M = e_dst.numel()
        nb = torch.randint(0, num_nodes, (M,), generator=g)
        dt = torch.rand(M, generator=g, dtype=torch.float64) * 10 + 0.5
        nts = qts[e_dst] - dt
        srcdata = {"ID": torch.cat([ids, nb]), "ts": torch.cat([qts, nts])}
        edata = {"ID": torch.randint(0, 1000, (M,), generator=g), "dt": dt.float()}
        if dim_edge:
            edata["f"] = torch.randn(M, dim_edge, generator=g)
        ei = torch.stack([torch.arange(D, D + M), e_dst])
        blocks.append(Block(srcdata, edata, ei, D))
        ids, qts = srcdata["ID"], srcdata["ts"]
    mfgs = blocks[::-1]
    if dim_node:
        feat = torch.randn(num_nodes, dim_node, generator=torch.Generator().manual_seed(99))
        mfgs[0].srcdata["h"] = feat[mfgs[0].srcdata["ID"]]
    meta = {"src_pos_index": torch.arange(B), "dst_pos_index": torch.arange(B, 2 * B),
            "dst_neg_index": torch.arange(2 * B, (2 + k_neg) * B)}
    return roots, mfgs, meta
