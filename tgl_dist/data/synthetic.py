"""A deterministic generator of a learnable interaction stream: the built-in dataset.

The stream mimics what makes real interaction data predictable, so a memory model (and
even a simple "seen this pair before" heuristic) beats random guessing on link
prediction against random negatives:

* **heavy-tailed activity**: node activity weights are Pareto distributed, so a few
  nodes start most events;
* **communities**: every node belongs to one of ``C`` communities and mostly interacts
  inside it;
* **repeated interactions**: each node has ``K`` favourite partners (drawn mostly from
  its community, by popularity), which it revisits with probability ``p_repeat`` (default 0.7);
  slot ``k`` is chosen with probability ∝ ``1 / (k + 1)``;
* **drift**: time is cut into ``num_phases`` phases; at each phase boundary a fraction
  ``refresh`` of every node's favourites is redrawn, so recent partners matter more than
  old ones;
* **bursts**: half of the events fall into short bursts around random centres, and each
  node's activity is scaled per phase by a log-normal factor (nodes go hot and cold).

Everything is vectorised with numpy (loops run over phases and chunks of events only)
and seeded, so the same arguments always give the same stream (defaults: 1,000 nodes,
20,000 events). Streams longer than ``chunk_size`` (2^22) events are drawn chunk by
chunk in bounded memory (10^8 events: about 2.4 GB of results plus a few chunk buffers).
"""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import torch
from tqdm.auto import tqdm

from tgl_dist.data.temporal import TemporalGraph

log = logging.getLogger(__name__)

CHUNK = 1 << 22   # events drawn at a time by generate_synthetic


def generate_synthetic(num_nodes: int = 1000, num_events: int = 20000, seed: int = 0,
                       num_communities: Optional[int] = None, num_partners: int = 5,
                       p_repeat: float = 0.7, p_community: float = 0.25, num_phases: int = 10,
                       refresh: float = 0.1, activity_alpha: float = 1.5, span: float = 30 * 86400.0,
                       edge_dim: int = 0, node_dim: int = 0, name: str = "synthetic",
                       chunk_size: int = CHUNK, progress: Optional[bool] = None) -> TemporalGraph:
    """Generate a seeded, learnable temporal interaction stream.

    Args:
        num_nodes: N, number of nodes (default 1000).
        num_events: E, number of events (default 20000).
        seed: random seed; same arguments -> identical graph.
        num_communities: C (default ``max(2, round(sqrt(N) / 2))``).
        num_partners: K favourite partners per node (default 5).
        p_repeat: probability an event goes to a favourite partner (default 0.7).
        p_community: probability it goes to a popularity-weighted node of the source's
            community (default 0.25); the rest (0.05) go to a uniformly random node.
        num_phases: number of drift phases (default 10).
        refresh: fraction of favourites redrawn at each phase boundary (default 0.1).
        activity_alpha: Pareto shape of node activity (smaller = heavier tail).
        span: time span in seconds (default 30 days); times are integer seconds.
        edge_dim: F_e, if > 0 add edge features ``[E, F_e]`` (a projection of the
            destination's community plus noise).
        node_dim: F_n, if > 0 add node features ``[N, F_n]`` (community centroid + noise).
        name: dataset name.
        chunk_size: events drawn at a time (default ``CHUNK`` = 2^22). A stream of at
            most ``chunk_size`` events is drawn in one go (the stream of earlier versions,
            bit for bit); a longer one chunk by chunk, so the peak memory is the final
            tensors (24 bytes an event, plus ``4 * edge_dim``) and a few chunk-sized
            buffers (its random stream depends on ``chunk_size``).
        progress: tqdm bar on stderr over the chunks (default: when there are 10 or more).

    Returns:
        TemporalGraph with ``num_nodes == N`` (identity ``node_map``), events sorted by
        time, no self-loops.
    """
    if num_nodes < 2 or num_events < 1:
        raise ValueError(f"need num_nodes >= 2 and num_events >= 1, got {num_nodes}, {num_events}")
    if not (0 <= p_repeat and 0 <= p_community and p_repeat + p_community <= 1):
        raise ValueError(f"p_repeat={p_repeat} and p_community={p_community} must be >= 0 and sum to <= 1")
    N, E, K, S = int(num_nodes), int(num_events), int(num_partners), max(1, int(num_phases))
    C = int(num_communities or max(2, round(np.sqrt(N) / 2)))
    rng = np.random.default_rng(seed)

    comm = rng.integers(0, C, N)
    w = rng.pareto(activity_alpha, N) + 1.0                         # heavy-tailed activity
    order = np.argsort(comm, kind="stable")                          # nodes grouped by community
    cw = np.cumsum(w[order])
    c_count = np.bincount(comm, minlength=C)
    c_end = np.cumsum(c_count)
    c_lo = np.concatenate([[0.0], cw])[c_end - c_count]              # cumulative weight before each community
    c_hi = np.concatenate([[0.0], cw])[c_end]

    def in_community(c: np.ndarray) -> np.ndarray:
        """One popularity-weighted node of community ``c`` per entry (empty communities -> random)."""
        target = c_lo[c] + rng.random(c.shape) * (c_hi[c] - c_lo[c])
        idx = np.minimum(np.searchsorted(cw, target, side="right"), N - 1)
        out = order[idx]
        empty = c_count[c] == 0
        out[empty] = rng.integers(0, N, int(empty.sum()))
        return out

    p_global = w / w.sum()

    def draw_partners(size) -> np.ndarray:
        nodes = np.repeat(np.arange(N), size[1]).reshape(size)
        local = rng.random(size) < 0.8
        out = rng.choice(N, size=size, p=p_global)
        out[local] = in_community(comm[nodes[local]])
        return out

    if E <= chunk_size:   # one chunk: the stream as it always was (tests pin its figures)
        src, dst, t, edge_attr = _one_chunk(rng, N, E, K, S, C, span, p_repeat, p_community, refresh,
                                            comm, w, in_community, draw_partners, edge_dim)
    else:
        src, dst, t, edge_attr = _chunked(rng, N, E, K, S, C, span, p_repeat, p_community, refresh,
                                          comm, w, in_community, draw_partners, edge_dim,
                                          chunk_size, progress)
    node_feat = None
    if node_dim > 0:
        cent = rng.normal(0.0, 1.0, (C, node_dim))
        node_feat = torch.from_numpy((cent[comm] + 0.1 * rng.normal(0.0, 1.0, (N, node_dim)))
                                     .astype(np.float32))
    log.info("synthetic stream: %d nodes, %d events, %d communities, seed %d", N, E, C, seed)
    return TemporalGraph(torch.from_numpy(src), torch.from_numpy(dst), torch.from_numpy(t), num_nodes=N,
                         edge_attr=edge_attr, node_feat=node_feat,
                         node_map=torch.arange(N, dtype=torch.long), name=name)


def _one_chunk(rng, N, E, K, S, C, span, p_repeat, p_community, refresh, comm, w, in_community,
               draw_partners, edge_dim):
    """The whole stream at once (E <= chunk_size): every array is [E] or [S, N, K]."""
    # ---- event times: half uniform, half in bursts; integer seconds, sorted
    n_burst = max(1, E // 500)
    centres = rng.random(n_burst) * span
    in_burst = rng.random(E) < 0.5
    t = rng.random(E) * span
    t[in_burst] = centres[rng.integers(0, n_burst, int(in_burst.sum()))] + \
        np.abs(rng.normal(0.0, span / 2000.0, int(in_burst.sum())))
    t = np.sort(np.floor(np.clip(t, 0.0, span)))
    phase = np.minimum((t / span * S).astype(np.int64), S - 1)

    # ---- sources per phase, activity modulated per phase (nodes go hot and cold)
    src = np.empty(E, dtype=np.int64)
    fav = np.empty((S, N, K), dtype=np.int64)
    fav_s = draw_partners((N, K))
    for s in range(S):
        if s > 0:
            redraw = rng.random((N, K)) < refresh
            fav_s = np.where(redraw, draw_partners((N, K)), fav_s)
        fav[s] = fav_s
        idx = np.flatnonzero(phase == s)
        ws = w * rng.lognormal(0.0, 1.0, N)
        src[idx] = rng.choice(N, size=idx.size, p=ws / ws.sum())

    # ---- destinations: favourite partner / community member / uniform
    slot_p = 1.0 / np.arange(1, K + 1)
    slot = rng.choice(K, size=E, p=slot_p / slot_p.sum())
    r = rng.random(E)
    dst = rng.integers(0, N, E)
    rep = r < p_repeat
    dst[rep] = fav[phase[rep], src[rep], slot[rep]]
    com = (r >= p_repeat) & (r < p_repeat + p_community)
    dst[com] = in_community(comm[src[com]])
    loop = dst == src
    dst[loop] = (dst[loop] + rng.integers(1, N, int(loop.sum()))) % N

    edge_attr = None
    if edge_dim > 0:
        proj = rng.normal(0.0, 1.0, (C, edge_dim))
        edge_attr = torch.from_numpy((proj[comm[dst]] + 0.1 * rng.normal(0.0, 1.0, (E, edge_dim)))
                                     .astype(np.float32))
    return src, dst, t, edge_attr


def _chunked(rng, N, E, K, S, C, span, p_repeat, p_community, refresh, comm, w, in_community,
             draw_partners, edge_dim, chunk, progress):
    """The same model, drawn ``chunk`` events at a time (a different random stream than
    :func:`_one_chunk`'s): the only ``[E]`` arrays are the results (``src``, ``dst``, ``t``,
    ``edge_attr``); favourites are kept for the current phase only (``[N, K]``)."""
    n_chunks = -(-E // chunk)
    bar = tqdm(total=2 * n_chunks, desc="synthetic stream", unit="chunk",
               disable=(E < 10 * chunk) if progress is None else not progress, leave=False)
    # ---- event times: half uniform, half in bursts; integer seconds, sorted in place
    n_burst = max(1, E // 500)
    centres = rng.random(n_burst) * span
    t = np.empty(E, dtype=np.float64)
    for a in range(0, E, chunk):
        m = min(E, a + chunk) - a
        in_burst = rng.random(m) < 0.5
        tc = rng.random(m) * span
        nb = int(in_burst.sum())
        tc[in_burst] = centres[rng.integers(0, n_burst, nb)] + np.abs(rng.normal(0.0, span / 2000.0, nb))
        t[a:a + m] = np.floor(np.clip(tc, 0.0, span))
        bar.update(1)
    t.sort()

    # ---- sources (activity modulated per phase) and destinations, phase by phase
    slot_cdf = np.cumsum(1.0 / np.arange(1, K + 1))
    slot_cdf /= slot_cdf[-1]
    proj = rng.normal(0.0, 1.0, (C, edge_dim)) if edge_dim > 0 else None
    src = np.empty(E, dtype=np.int64)
    dst = np.empty(E, dtype=np.int64)
    edge_attr = np.empty((E, edge_dim), dtype=np.float32) if edge_dim > 0 else None
    state = {"phase": -1, "fav": None, "cdf": None}

    def enter(s: int) -> None:
        while state["phase"] < s:
            state["phase"] += 1
            if state["phase"] == 0:
                state["fav"] = draw_partners((N, K))
            else:
                redraw = rng.random((N, K)) < refresh
                state["fav"] = np.where(redraw, draw_partners((N, K)), state["fav"])
            cdf = np.cumsum(w * rng.lognormal(0.0, 1.0, N))
            state["cdf"] = cdf / cdf[-1]

    for a in range(0, E, chunk):
        b = min(E, a + chunk)
        phase = np.minimum((t[a:b] / span * S).astype(np.int64), S - 1)
        for s in np.unique(phase):                  # t is sorted: each phase is one run
            lo, hi = np.searchsorted(phase, s, "left"), np.searchsorted(phase, s, "right")
            m = int(hi - lo)
            enter(int(s))
            sc = np.minimum(np.searchsorted(state["cdf"], rng.random(m), side="right"), N - 1)
            slot = np.minimum(np.searchsorted(slot_cdf, rng.random(m), side="right"), K - 1)
            r = rng.random(m)
            dc = rng.integers(0, N, m)
            rep = r < p_repeat
            dc[rep] = state["fav"][sc[rep], slot[rep]]
            com = (r >= p_repeat) & (r < p_repeat + p_community)
            dc[com] = in_community(comm[sc[com]])
            loop = dc == sc
            dc[loop] = (dc[loop] + rng.integers(1, N, int(loop.sum()))) % N
            src[a + lo:a + hi], dst[a + lo:a + hi] = sc, dc
            if edge_attr is not None:
                edge_attr[a + lo:a + hi] = proj[comm[dc]] + 0.1 * rng.normal(0.0, 1.0, (m, edge_dim))
        bar.update(1)
    bar.close()
    return src, dst, t, None if edge_attr is None else torch.from_numpy(edge_attr)