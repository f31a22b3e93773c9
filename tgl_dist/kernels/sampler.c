/* Temporal neighbour sampling kernel of tgl_dist: plain C99 + pthreads, no torch headers.
 *
 * Built on first use by tgl_dist/kernels/build.py (`cc -O3 -std=c99 -shared -fPIC
 * -pthread`, about a second) and called through ctypes on tensors' data pointers. It returns
 * exactly what the pure-torch path of tgl_dist/sampling/neighbor.py returns:
 *
 *   - candidates of destination r (node nodes[r] queried at q[r]) are the node's T-CSR
 *     rows [indptr[n], pos) with pos the first row whose time is >= q[r] (strictly earlier);
 *   - recent: the last min(k, a) candidates (a = number of candidates);
 *   - uniform: all candidates when a <= k, else k distinct offsets by Floyd's algorithm
 *     with the SplitMix64 counter-based draws of tgl_dist/sampling/hashing.py, sorted.
 *
 * Two passes, so that the caller allocates outputs of the exact size in between:
 *   tgl_count: per destination its first row, candidate count and sample count, then the
 *              exclusive prefix sum of the sample counts (offsets [D + 1]); returns M.
 *   tgl_fill:  writes every sampled edge at its offset.
 * Both split the destinations over `threads` pthreads (no spin-waiting pool: threads are
 * started per pass and only when there is enough work to pay for them).
 *
 * Speed without changing any answer: searches start from hints (a row near the answer,
 * checked by galloping), sampled edges are read from one packed 32-byte record per
 * T-CSR row, and the rows of a chunk are chosen (and prefetched) before they are read.
 * The searches read the times inside those records (no second, contiguous copy of the
 * times: 8 bytes a row less), so a search's last probes load the lines the gathers read.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "abi.h"

#define GOLDEN 0x9E3779B97F4A7C15ULL
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((p), 0, 1)
#else
#define PREFETCH(p) ((void)0)
#endif
#define MAX_THREADS 64

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27; x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

typedef struct {
  /* graph: T-CSR row pointers, and per row {nbr, eid, time bits, twin} */
  const int64_t *indptr; const int64_t *rec; int64_t num_nodes;
  /* destinations (hint: a row of the node's list near the answer, or -1; may be NULL) */
  const int64_t *nodes; const double *q; const int64_t *hint; int64_t k; int uniform; uint64_t salt;
  int64_t *node_hint;  /* [num_nodes] (NULL only with hint): per node, a row near its last answer */
  /* scratch [D] and offsets [D + 1] */
  int64_t *first; int64_t *avail; int64_t *off;
  /* outputs, item m of this call at index m (o_dt, o_hint, o_src, o_dst: NULL = not wanted) */
  int64_t *o_nbr; double *o_ts; int64_t *o_eid; float *o_dt; int64_t *o_hint;
  int64_t *o_src; int64_t src_base;  /* o_src[m] = src_base + m (edge_index row 0) */
  int64_t *o_dst; int64_t dst_base;  /* o_dst[m] = dst_base + r (edge_index row 1 / row) */
  volatile int err;                  /* set when a scratch allocation fails */
} job_t;

/* Work sharing: threads take chunks of `grain` destinations from a shared counter until
 * none is left, so a thread the OS preempts (on a busy machine) delays the others by one
 * chunk at most, not by a fixed half of the work. Helper threads are detached and the
 * caller waits only for chunks that were taken, not for helpers that never got a CPU:
 * a late helper finds no work and frees the shared state if it is the last user. */
typedef struct {
  const job_t *job; void (*fn)(const job_t *, int64_t, int64_t);
  int64_t n, grain;
  int64_t next, done, refs;  /* atomics */
} pool_t;

static void release(pool_t *w) {
  if (__atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL) == 0) free(w);
}

static void take_chunks(pool_t *w) {
  for (;;) {
    const int64_t b = __atomic_fetch_add(&w->next, w->grain, __ATOMIC_RELAXED);
    if (b >= w->n) break;
    const int64_t e = b + w->grain < w->n ? b + w->grain : w->n;
    w->fn(w->job, b, e);
    __atomic_add_fetch(&w->done, e - b, __ATOMIC_RELEASE);
  }
}

static void *helper(void *p) {
  take_chunks((pool_t *)p);
  release((pool_t *)p);
  return NULL;
}

/* Run fn over [0, n) on up to `threads` threads (the caller's included); helpers are
 * started only when there are at least two chunks. */
static void parallel(const job_t *job, int64_t n, int threads, int64_t grain,
                     void (*fn)(const job_t *, int64_t, int64_t)) {
  int64_t T = threads < 1 ? 1 : (threads > MAX_THREADS ? MAX_THREADS : threads);
  const int64_t chunks = (n + grain - 1) / grain;
  if (T > chunks) T = chunks;
  pool_t *w = T > 1 ? (pool_t *)malloc(sizeof(pool_t)) : NULL;
  if (w == NULL) { if (n > 0) fn(job, 0, n); return; }
  w->job = job; w->fn = fn; w->n = n; w->grain = grain; w->next = 0; w->done = 0; w->refs = 1;
  pthread_attr_t attr;
  const int attr_ok = pthread_attr_init(&attr) == 0 &&
                      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0;
  for (int64_t i = 1; attr_ok && i < T; ++i) {
    pthread_t th;
    __atomic_add_fetch(&w->refs, 1, __ATOMIC_RELAXED);
    if (pthread_create(&th, &attr, helper, w) != 0) { __atomic_sub_fetch(&w->refs, 1, __ATOMIC_RELAXED); break; }
  }
  if (attr_ok) pthread_attr_destroy(&attr);
  take_chunks(w);  /* the caller works too, and does everything if no helper started */
  while (__atomic_load_n(&w->done, __ATOMIC_ACQUIRE) < n) sched_yield();  /* chunks in progress */
  release(w);
}

/* The time of T-CSR row i: the double in the third slot of its record. */
static inline double row_t(const int64_t *rec, int64_t i) {
  double t;
  memcpy(&t, rec + 4 * i + 2, 8);
  return t;
}

/* First row in [lo, hi) with time >= q (hi if none). */
static inline int64_t lower_bound(const int64_t *rec, int64_t lo, int64_t hi, double q) {
  while (lo < hi) {
    const int64_t mid = lo + ((hi - lo) >> 1);
    if (row_t(rec, mid) < q) lo = mid + 1; else hi = mid;
  }
  return lo;
}

/* The same answer as lower_bound(rec, s, e, q), searched outwards from a hint row h in
 * [s, e] (galloping): a few probes when the answer is near h. For a sampled neighbour
 * queried at the time of the event it was reached by, h is that event's row in the
 * neighbour's own list (its twin), so the answer is h or a few same-time rows before. */
static inline int64_t lower_bound_from(const int64_t *rec, int64_t s, int64_t e, double q, int64_t h) {
  int64_t lo, hi, step = 1;
  if (h < e && row_t(rec, h) < q) {  /* answer in (h, e] */
    lo = h + 1;
    for (;;) {
      const int64_t p = lo + step - 1;
      if (p >= e) { hi = e; break; }
      if (row_t(rec, p) >= q) { hi = p; break; }
      lo = p + 1; step <<= 1;
    }
  } else {  /* answer in [s, h] */
    hi = h;
    for (;;) {
      const int64_t p = hi - step;
      if (p < s) { lo = s; break; }
      if (row_t(rec, p) < q) { lo = p + 1; break; }
      hi = p; step <<= 1;
    }
  }
  return lower_bound(rec, lo, hi, q);
}

static inline void count_one(const job_t *j, int64_t r, int64_t s, int64_t pos) {
  const int64_t a = pos - s, c = a < j->k ? a : j->k;
  j->avail[r] = a;
  j->off[r + 1] = c;
  j->first[r] = j->uniform ? s : pos - c;
}

/* Searches with hints: per destination (hint) or, when hint is NULL, per node (node_hint,
 * then never NULL). */
static void count_range(const job_t *j, int64_t b, int64_t e) {
  const int64_t *restrict indptr = j->indptr, *restrict nodes = j->nodes, *restrict hint = j->hint;
  const int64_t *restrict rec = j->rec;
  const double *restrict q = j->q;
  if (hint) {
    for (int64_t r = b; r < e; ++r) {
      if (r + 8 < e) {  /* look ahead: the loads of a later destination overlap this one's */
        PREFETCH(indptr + nodes[r + 8]);
        if (hint[r + 8] > 0) PREFETCH(rec + 4 * (hint[r + 8] - 1) + 2);
      }
      const int64_t n = nodes[r], s = indptr[n], end = indptr[n + 1], h = hint[r];
      count_one(j, r, s, h >= s && h <= end ? lower_bound_from(rec, s, end, q[r], h)
                                            : lower_bound(rec, s, end, q[r]));
    }
    return;
  }
  /* per node: the answer of its last search (benign races: any row works) */
  int64_t *nh = j->node_hint;
  for (int64_t r = b; r < e; ++r) {
    if (r + 16 < e) { PREFETCH(indptr + nodes[r + 16]); PREFETCH(nh + nodes[r + 16]); }
    if (r + 8 < e) {  /* two-stage look-ahead: the hint row's time, once the hint is cached */
      const int64_t h8 = __atomic_load_n(&nh[nodes[r + 8]], __ATOMIC_RELAXED);
      if (h8 >= 0) PREFETCH(rec + 4 * h8 + 2);
    }
    const int64_t n = nodes[r], s = indptr[n], end = indptr[n + 1];
    const int64_t h = __atomic_load_n(&nh[n], __ATOMIC_RELAXED);
    const int64_t pos = h >= s && h <= end ? lower_bound_from(rec, s, end, q[r], h)
                                           : lower_bound(rec, s, end, q[r]);
    if (pos != h) __atomic_store_n(&nh[n], pos, __ATOMIC_RELAXED);
    count_one(j, r, s, pos);
  }
}

/* Floyd's algorithm: k distinct offsets in [0, a) (a > k) from the counter-based draws
 * of `base`, written sorted as rows f + offset to out[0..k). */
static inline __attribute__((always_inline)) void floyd(uint64_t base, int64_t a, int64_t k,
                                                         int64_t *restrict pick, int64_t *restrict out,
                                                         int64_t f, const int64_t *rec) {
  for (int64_t x = 0; x < k; ++x) {
    const int64_t i = a - k + x;
    int64_t v = (int64_t)((mix64(base + (uint64_t)(x + 1) * GOLDEN) >> 1) % (uint64_t)(i + 1));
    int dup = 0;
    for (int64_t y = 0; y < x; ++y) dup |= pick[y] == v;
    pick[x] = dup ? i : v;
  }
  for (int64_t x = 0; x < k; ++x) {  /* sort the distinct picks: rank = #smaller (branch-free) */
    int64_t rank = 0;
    for (int64_t y = 0; y < k; ++y) rank += pick[y] < pick[x];
    out[rank] = f + pick[x];
    PREFETCH(rec + 4 * (f + pick[x]));  /* gathered in phase 2, after other draws */
  }
}

/* Edge m of destination r is T-CSR row ev: one 32-byte record read, every output written. */
#define EMIT(m, ev, r) do {                                                   \
    const int64_t m_ = (m), *restrict x_ = rec + 4 * (ev);                   \
    const double t_ = row_t(rec, (ev));                                       \
    o_nbr[m_] = x_[0]; o_eid[m_] = x_[1]; o_ts[m_] = t_;                      \
    if (o_dt) o_dt[m_] = (float)(q[r] - t_);                                  \
    if (o_hint) o_hint[m_] = x_[3];                                           \
    if (o_src) o_src[m_] = src_base + m_;                                     \
    if (o_dst) o_dst[m_] = dst_base + (r);                                    \
  } while (0)

/* Per chunk of destinations: first the k rows of every uniform draw (parked in o_eid),
 * then the gathers from those rows, which are independent loads that overlap. */
#define CHUNK 64
static void fill_range(const job_t *j, int64_t b, int64_t e) {
  const int64_t k = j->k;
  const double *restrict q = j->q;
  const int64_t *restrict rec = j->rec, *restrict nodes = j->nodes;
  const int64_t *restrict off = j->off, *restrict avail = j->avail, *restrict first = j->first;
  int64_t *restrict o_nbr = j->o_nbr, *restrict o_eid = j->o_eid, *restrict o_hint = j->o_hint;
  int64_t *restrict o_src = j->o_src, *restrict o_dst = j->o_dst;
  double *restrict o_ts = j->o_ts;
  float *restrict o_dt = j->o_dt;
  const int64_t src_base = j->src_base, dst_base = j->dst_base;
  const int uniform = j->uniform;
  const uint64_t h0 = mix64(j->salt + GOLDEN);
  int64_t stack_pick[64];
  int64_t *pick = k <= 64 ? stack_pick : (int64_t *)malloc((size_t)k * sizeof(int64_t));
  if (pick == NULL) { ((job_t *)j)->err = 1; return; }
  for (int64_t c0 = b; c0 < e; c0 += CHUNK) {
    const int64_t c1 = e - c0 < CHUNK ? e : c0 + CHUNK;
    for (int64_t r = c0; r < c1; ++r) {  /* phase 1: draws; contiguous rows are written at once */
      const int64_t o = off[r], c = off[r + 1] - o, a = avail[r], f = first[r];
      if (uniform && a > k) {
        uint64_t tb;
        memcpy(&tb, &q[r], 8);
        const uint64_t base = mix64((mix64((h0 ^ (uint64_t)nodes[r]) + GOLDEN) ^ tb) + GOLDEN);
        if (k == 10) floyd(base, a, 10, pick, o_eid + o, f, rec);  /* constant k: unrolled loops */
        else floyd(base, a, k, pick, o_eid + o, f, rec);
      } else {  /* a contiguous range of rows */
        for (int64_t x = 0; x < c; ++x) o_eid[o + x] = f + x;
        if (c) { PREFETCH(rec + 4 * f); PREFETCH(rec + 4 * (f + c) - 1); }
      }
    }
    /* phase 2: gathers of the rows chosen above (prefetched, independent loads) */
    for (int64_t r = c0; r < c1; ++r)
        for (int64_t m = off[r]; m < off[r + 1]; ++m) EMIT(m, o_eid[m], r);
  }
  if (pick != stack_pick) free(pick);
}

/* Pass 1. rec: [R, 4] rows {nbr, eid, time bits, twin row} (the times are searched);
 * hint: [D] or NULL (search hints per destination); node_hint: [num_nodes], not NULL
 * when hint is NULL (read and updated: per node, its last answer); first, avail: [D]
 * scratch; off: [D + 1] (off[r] = first output index of r). Returns M = off[D]. */
int64_t tgl_count(const int64_t *indptr, int64_t num_nodes, const int64_t *rec, const int64_t *nodes,
                  const double *q, const int64_t *hint, int64_t *node_hint, int64_t D, int64_t k,
                  int uniform, int64_t *first, int64_t *avail, int64_t *off, int threads) {
  job_t j;
  memset(&j, 0, sizeof j);
  j.indptr = indptr; j.num_nodes = num_nodes; j.rec = rec; j.nodes = nodes; j.q = q; j.hint = hint;
  j.node_hint = node_hint;
  j.k = k; j.uniform = uniform; j.first = first; j.avail = avail; j.off = off;
  if (indptr[num_nodes] == 0) {  /* no events at all */
    for (int64_t r = 0; r < D; ++r) { avail[r] = 0; off[r + 1] = 0; first[r] = 0; }
  } else {
    parallel(&j, D, threads, 2048, count_range);
  }
  off[0] = 0;
  for (int64_t r = 0; r < D; ++r) off[r + 1] += off[r];
  return off[D];
}

/* Pass 2: writes the M sampled edges (o_dt, o_hint, o_src, o_dst may be NULL); rec: [2E, 4]
 * rows {nbr, eid, time bits, twin row}. Returns 0 on success. */
int tgl_fill(const int64_t *rec, const int64_t *nodes, const double *q, int64_t D, int64_t k,
             int uniform, int64_t salt, const int64_t *first, const int64_t *avail, const int64_t *off,
             int64_t *o_nbr, double *o_ts, int64_t *o_eid, float *o_dt, int64_t *o_hint,
             int64_t *o_src, int64_t src_base, int64_t *o_dst, int64_t dst_base, int threads) {
  job_t j;
  memset(&j, 0, sizeof j);
  j.rec = rec; j.nodes = nodes; j.q = q; j.k = k; j.uniform = uniform; j.salt = (uint64_t)salt;
  j.first = (int64_t *)first; j.avail = (int64_t *)avail; j.off = (int64_t *)off;
  j.o_nbr = o_nbr; j.o_ts = o_ts; j.o_eid = o_eid; j.o_dt = o_dt; j.o_hint = o_hint;
  j.o_src = o_src; j.src_base = src_base; j.o_dst = o_dst; j.dst_base = dst_base;
  parallel(&j, D, threads, j.uniform ? 256 : 2048, fill_range);
  return j.err ? -1 : 0;
}

/* First occurrences of distinct int64 keys: a stable LSD radix sort of key - min (11-bit
 * digits, as many passes as the keys' range needs: 2 for ids below 4M), then one walk.
 * keys [n] -> first [U] (the position of each distinct key's first occurrence, in
 * increasing key order), inv [n] (keys[i] == keys[first[inv[i]]]); returns U. order and
 * tmp: scratch [n] each. O(n) per pass where a comparison sort is O(n log n). */
#define RADIX_BITS 11
int64_t tgl_unique_first(int64_t n, const int64_t *keys, int64_t *order, int64_t *tmp,
                         int64_t *first, int64_t *inv) {
  if (n <= 0) return 0;
  int64_t lo = keys[0], hi = keys[0];
  for (int64_t i = 1; i < n; ++i) {
    if (keys[i] < lo) lo = keys[i];
    if (keys[i] > hi) hi = keys[i];
  }
  const uint64_t range = (uint64_t)hi - (uint64_t)lo;
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  int64_t cnt[1 << RADIX_BITS];
  for (int shift = 0; shift < 64 && (range >> shift) != 0; shift += RADIX_BITS) {
    memset(cnt, 0, sizeof cnt);
    for (int64_t i = 0; i < n; ++i)
      ++cnt[(((uint64_t)keys[order[i]] - (uint64_t)lo) >> shift) & ((1 << RADIX_BITS) - 1)];
    int64_t sum = 0;
    for (int b = 0; b < (1 << RADIX_BITS); ++b) { const int64_t c = cnt[b]; cnt[b] = sum; sum += c; }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t o = order[i];
      tmp[cnt[(((uint64_t)keys[o] - (uint64_t)lo) >> shift) & ((1 << RADIX_BITS) - 1)]++] = o;
    }
    int64_t *t = order; order = tmp; tmp = t;
  }
  int64_t U = 0;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = order[r];
    if (r == 0 || keys[i] != keys[order[r - 1]]) first[U++] = i;
    inv[i] = U - 1;
  }
  return U;
}

/* Counter-based draws of uniform integers below n, for keys [B] and counters 0..k-1
 * (tgl_dist/sampling/hashing.py in one pass, the same bits): out[j * B + i] =
 * (mix64((j ^ mix64((key[i] ^ h) + G)) + G) >> 1) mod n, h an already mixed seed. */
void tgl_draw_below(uint64_t h, int64_t B, const int64_t *key, int64_t k, int64_t n,
                    int64_t *out) {
  for (int64_t i = 0; i < B; ++i) {
    const uint64_t a = mix64(((uint64_t)key[i] ^ h) + GOLDEN);
    for (int64_t j = 0; j < k; ++j)
      out[j * B + i] = (int64_t)((mix64(((uint64_t)j ^ a) + GOLDEN) >> 1) % (uint64_t)n);
  }
}
