"""Optional compiled sampling kernel (C++, ``at::parallel_for``), same results as the torch path.

One hop of temporal sampling for all roots in one pass: per root a binary search
for "events strictly before the query time" inside the node's time-sorted T-CSR
segment, then ``recent`` (the last k) or ``uniform`` (Floyd's algorithm with the
same SplitMix64 counter-based draws as :mod:`tgl_dist.sampling.hashing`), written
straight into flat ``(row, nbr, eid, ts, dt)`` outputs. It is built on first use with
``torch.utils.cpp_extension.load_inline`` (needs a C++ compiler; cached under
``~/.cache/torch_extensions``). :func:`get_kernel` returns ``None`` when it cannot be
built, and the sampler then uses its pure-torch path, which returns identical samples
(tests compare the two).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Optional

log = logging.getLogger(__name__)

_SRC = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstring>

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27; x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
static const uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL;

// Output pointers; item m of the hop goes to index m (row, eid, dt, e0) or base + m (nbr, ts).
struct Out { int64_t* row; int64_t* nbr; int64_t* eid; double* ts; float* dt; int64_t* e0; int64_t base; };

// Pass 1: per root, events strictly before its query time; returns the exclusive prefix sum.
static torch::Tensor count(const int64_t* ip, const double* t, const int64_t* nd, const double* q,
                           int64_t R, int64_t k, bool uniform, int64_t* fp, int64_t* ap) {
  auto cnt = torch::empty({R + 1}, torch::kLong);
  int64_t* cp = cnt.data_ptr<int64_t>();
  at::parallel_for(0, R, 2048, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = nd[r], s = ip[n], end = ip[n + 1];
      const int64_t pos = std::lower_bound(t + s, t + end, q[r]) - t;
      const int64_t a = pos - s, c = a < k ? a : k;
      ap[r] = a; cp[r + 1] = c; fp[r] = uniform ? s : pos - c;
    }
  });
  cp[0] = 0;
  for (int64_t r = 0; r < R; ++r) cp[r + 1] += cp[r];
  return cnt;
}

// Pass 2: write the sampled events (recent: a contiguous range; uniform: Floyd's algorithm).
static void fill(const double* t, const int64_t* nb, const int64_t* ei, const int64_t* nd,
                 const double* q, int64_t R, int64_t k, bool uniform, int64_t salt,
                 const int64_t* fp, const int64_t* ap, const int64_t* cp, Out out) {
  at::parallel_for(0, R, 1024, [&](int64_t b, int64_t e) {
    std::vector<int64_t> pick(k);
    for (int64_t r = b; r < e; ++r) {
      const int64_t o = cp[r], c = cp[r + 1] - o, a = ap[r], f = fp[r];
      const bool draw = uniform && a > k;
      if (draw) {
        uint64_t tb; std::memcpy(&tb, &q[r], 8);
        uint64_t h = mix64((uint64_t)salt + GOLDEN);
        h = mix64((h ^ (uint64_t)nd[r]) + GOLDEN);
        const uint64_t base = mix64((h ^ tb) + GOLDEN);
        for (int64_t j = 0; j < k; ++j) {
          const int64_t i = a - k + j;
          int64_t v = (int64_t)((mix64(base + (uint64_t)(j + 1) * GOLDEN) >> 1) % (uint64_t)(i + 1));
          for (int64_t x = 0; x < j; ++x) if (pick[x] == v) { v = i; break; }
          pick[j] = v;
        }
        std::sort(pick.begin(), pick.end());
      }
      for (int64_t j = 0; j < c; ++j) {
        const int64_t src = f + (draw ? pick[j] : j), m = o + j;
        out.row[m] = r; out.nbr[out.base + m] = nb[src]; out.eid[m] = ei[src];
        out.ts[out.base + m] = t[src]; out.dt[m] = (float)(q[r] - t[src]);
        if (out.e0) out.e0[m] = out.base + m;
      }
    }
  });
}

// One hop, flat: (row, nbr, eid, ts, dt) [M] each.
std::vector<torch::Tensor> sample_hop(torch::Tensor indptr, torch::Tensor ts, torch::Tensor nbr,
                                      torch::Tensor eid, torch::Tensor nodes, torch::Tensor qts,
                                      int64_t k, bool uniform, int64_t salt) {
  const int64_t R = nodes.numel();
  const int64_t* nd = nodes.data_ptr<int64_t>();
  const double* q = qts.data_ptr<double>();
  auto first = torch::empty({R}, torch::kLong), avail = torch::empty({R}, torch::kLong);
  auto cnt = count(indptr.data_ptr<int64_t>(), ts.data_ptr<double>(), nd, q, R, k, uniform,
                   first.data_ptr<int64_t>(), avail.data_ptr<int64_t>());
  const int64_t M = cnt.data_ptr<int64_t>()[R];
  auto row = torch::empty({M}, torch::kLong), onb = torch::empty({M}, torch::kLong);
  auto oei = torch::empty({M}, torch::kLong), ots = torch::empty({M}, torch::kDouble);
  auto odt = torch::empty({M}, torch::kFloat);
  Out out{row.data_ptr<int64_t>(), onb.data_ptr<int64_t>(), oei.data_ptr<int64_t>(),
          ots.data_ptr<double>(), odt.data_ptr<float>(), nullptr, 0};
  fill(ts.data_ptr<double>(), nbr.data_ptr<int64_t>(), eid.data_ptr<int64_t>(), nd, q, R, k, uniform,
       salt, first.data_ptr<int64_t>(), avail.data_ptr<int64_t>(), cnt.data_ptr<int64_t>(), out);
  return {row, onb, oei, ots, odt};
}

// One whole block written in place: src_id [D+M] and src_ts [D+M] (destinations first),
// edge_index [2, M], eid [M], dt [M].
std::vector<torch::Tensor> sample_block(torch::Tensor indptr, torch::Tensor ts, torch::Tensor nbr,
                                        torch::Tensor eid, torch::Tensor nodes, torch::Tensor qts,
                                        int64_t k, bool uniform, int64_t salt) {
  const int64_t D = nodes.numel();
  const int64_t* nd = nodes.data_ptr<int64_t>();
  const double* q = qts.data_ptr<double>();
  auto first = torch::empty({D}, torch::kLong), avail = torch::empty({D}, torch::kLong);
  auto cnt = count(indptr.data_ptr<int64_t>(), ts.data_ptr<double>(), nd, q, D, k, uniform,
                   first.data_ptr<int64_t>(), avail.data_ptr<int64_t>());
  const int64_t M = cnt.data_ptr<int64_t>()[D];
  auto src_id = torch::empty({D + M}, torch::kLong), src_ts = torch::empty({D + M}, torch::kDouble);
  auto ei = torch::empty({2, M}, torch::kLong), oei = torch::empty({M}, torch::kLong);
  auto odt = torch::empty({M}, torch::kFloat);
  std::memcpy(src_id.data_ptr<int64_t>(), nd, D * 8);
  std::memcpy(src_ts.data_ptr<double>(), q, D * 8);
  int64_t* e0 = ei.data_ptr<int64_t>();
  Out out{e0 + M, src_id.data_ptr<int64_t>(), oei.data_ptr<int64_t>(), src_ts.data_ptr<double>(),
          odt.data_ptr<float>(), e0, D};
  fill(ts.data_ptr<double>(), nbr.data_ptr<int64_t>(), eid.data_ptr<int64_t>(), nd, q, D, k, uniform,
       salt, first.data_ptr<int64_t>(), avail.data_ptr<int64_t>(), cnt.data_ptr<int64_t>(), out);
  return {src_id, src_ts, ei, oei, odt};
}
"""

_lock = threading.Lock()
_kernel = None
_tried = False


def get_kernel() -> Optional[object]:
    """The compiled module (``sample_hop``, ``sample_block``), or ``None`` if it cannot be built.

    Set ``TGL_DIST_NO_KERNEL=1`` to force the pure-torch path.
    """
    global _kernel, _tried
    if os.environ.get("TGL_DIST_NO_KERNEL", "0") not in ("", "0"):
        return None
    with _lock:
        if not _tried:
            _tried = True
            try:
                from torch.utils.cpp_extension import load_inline
                _kernel = load_inline("tgl_dist_sampling_kernel", cpp_sources=[_SRC],
                                      functions=["sample_hop", "sample_block"], extra_cflags=["-O3"], verbose=False)
            except Exception as e:  # no compiler, no headers: fall back to torch
                log.warning("compiled sampling kernel unavailable (%s: %s); using the torch path",
                            type(e).__name__, str(e).splitlines()[0] if str(e) else "")
                _kernel = None
    return _kernel
