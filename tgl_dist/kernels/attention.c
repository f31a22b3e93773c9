/* Fused segment attention of tgl_dist's temporal attention layers: plain C99 (+ OpenMP).
 *
 * Built on first use by tgl_dist/kernels (same compiler, flags and cache as
 * the sampling kernel) and called through ctypes on tensors' data pointers.
 *
 * The layers re-associate their key/value products (docs/models.md, "Attention without
 * per-edge keys"), so what is left per edge is small: for destination d, head h and each
 * incoming edge e of d (edges of d are the rows ptr[d] .. ptr[d+1]-1, CSR order):
 *
 *   x_e        = [hs[idx[e],:] || X[e,:]]                   (the edge's input row, dn + cx wide:
 *                                                            a gathered node row and its own part)
 *   s[e,h]     = qx[d,h,:] . x_e + qb[d,h]
 *   z[e,h]     = s           (act 0)   or   LeakyReLU(s, slope)   (act 1)
 *   alpha[e,h] = softmax over the edges of d of z[., h]
 *   w[e,h]     = alpha[e,h] * mask[e,h]                     (attention dropout; mask NULL = 1)
 *   aggx[d,h,:] = sum_e w[e,h] x_e,   asum[d,h] = sum_e w[e,h]
 *
 * A destination without edges gets zeros. tgl_att_bwd is the exact gradient of that map
 * with respect to qx, qb, X and hs (the rows of hs are summed over their edges in edge
 * order after the per-destination pass, each thread owning a range of rows). Everything a destination writes belongs to it alone
 * (its own rows of the [D, ...] outputs and its own edges), so destinations are split
 * over threads without atomics, and each one's sums run in a fixed order: the results
 * do not depend on the number of threads.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "abi.h"

#include "blas.h"

#define MAX_THREADS 64

/* on x86-64 Linux with GCC, the per-destination passes get an AVX2 clone beside the
 * generic one, picked at load time (no -march: the library runs on any x86-64). An AVX-512F
 * clone was measured no faster here. -std=c99 keeps products and sums separate (no FMA
 * contraction), so both clones compute the same bits. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TGL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TGL_CLONES
#endif


#if defined(__GNUC__)  /* GCC and clang: 8-float vectors (two SSE or one AVX register) */
typedef float v8 __attribute__((vector_size(32)));
static inline v8 ld8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void st8(float *p, v8 v) { memcpy(p, &v, sizeof v); }
#endif
/* at most HMAX heads (checked by the caller) */

typedef struct {
  int64_t D, H, Cx, dn, cx, U;   /* Cx = dn + cf + cx */
  const int64_t *ptr, *idx;
  const float *qx, *qb, *hs, *X, *mask;
  const float *F; int64_t cf;    /* optional middle segment of the edges' rows (F [M, cf]) */
  const int64_t *qmap;   /* destination d reads qx, qb row qmap[d] (NULL: row d) */
  int act; float slope;
  /* forward outputs (s, alpha are kept for the backward) */
  float *s, *alpha, *aggx, *asum;
  /* backward */
  const float *g_aggx, *g_asum; float *g_qx, *g_qb, *g_X, *g_xh, *g_hs, *tmp;
  /* backward, time encoding folded in (te_part != NULL): the last td columns of X are
   * cos(dt * w + b) with sin kept in sinz [M, td]; per destination, te_part [D, 2 td] gets
   * the sums over its edges of gz * dt and gz, gz = -(d loss / d X[e, c]) sin z */
  const float *dt, *sinz; float *te_part; int64_t td;
  int64_t d0, d1, u0, u1;
} job_t;

/* dot product in a fixed order: 32 independent partial sums (four 8-float vectors with
 * GCC / clang, so the additions' latency overlaps), then 8 at a time, then one by one */
static inline float dot(const float *a, const float *b, int64_t n) {
  int64_t i = 0;
  float r = 0.f;
#if defined(__GNUC__)
  v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
  for (; i + 32 <= n; i += 32) {
    s0 += ld8(a + i) * ld8(b + i);
    s1 += ld8(a + i + 8) * ld8(b + i + 8);
    s2 += ld8(a + i + 16) * ld8(b + i + 16);
    s3 += ld8(a + i + 24) * ld8(b + i + 24);
  }
  for (; i + 8 <= n; i += 8) s0 += ld8(a + i) * ld8(b + i);
  const v8 t = (s0 + s1) + (s2 + s3);
  r = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
#endif
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

static inline void axpy(float *y, float a, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

/* the segments of edge e's input row [hs[idx[e]] || F[e] || X[e]] */
static inline float rdot(const job_t *j, const float *q, int64_t e) {
  float r = j->cx ? dot(q + j->dn + j->cf, j->X + e * j->cx, j->cx) : 0.f;
  if (j->cf) r += dot(q + j->dn, j->F + e * j->cf, j->cf);
  if (j->dn) r += dot(q, j->hs + j->idx[e] * j->dn, j->dn);
  return r;
}
/* wsum: out[c] = sum over i = 0..K-1, in order, of wv[i] * rows[i][c], c < n. Columns go
 * in blocks held in registers, so each output element is written once (no
 * read-modify-write per edge); per element the arithmetic is that of adding the edges
 * one by one (no fused multiply-add: -std=c99 keeps products and sums separate). */
#if defined(__GNUC__)

static inline void wsum(float *restrict out, int64_t n, int64_t K, const float *restrict wv,
                        const float *const *restrict rows) {
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int64_t i = 0; i < K; ++i) {
      const float w = wv[i], *r = rows[i] + c;
      a0 += w * ld8(r); a1 += w * ld8(r + 8); a2 += w * ld8(r + 16); a3 += w * ld8(r + 24);
    }
    st8(out + c, a0); st8(out + c + 8, a1); st8(out + c + 16, a2); st8(out + c + 24, a3);
  }
  for (; c + 8 <= n; c += 8) {
    v8 a0 = {0};
    for (int64_t i = 0; i < K; ++i) a0 += wv[i] * ld8(rows[i] + c);
    st8(out + c, a0);
  }
  for (; c < n; ++c) {
    float acc = 0.f;
    for (int64_t i = 0; i < K; ++i) acc += wv[i] * rows[i][c];
    out[c] = acc;
  }
}
#else
static inline void wsum(float *restrict out, int64_t n, int64_t K, const float *restrict wv,
                        const float *const *restrict rows) {
  for (int64_t c = 0; c < n; ++c) {
    float acc = 0.f;
    for (int64_t i = 0; i < K; ++i) acc += wv[i] * rows[i][c];
    out[c] = acc;
  }
}
#endif

/* per-thread scratch for one destination's edges: weights and the segments' row
 * pointers (sized for the largest in-degree of the thread's range) */
typedef struct { float *wv; const float **pn, **pf, **px; } rows_t;

static int rows_alloc(rows_t *b, const job_t *j) {
  int64_t K = 1;
  for (int64_t d = j->d0; d < j->d1; ++d)
    if (j->ptr[d + 1] - j->ptr[d] > K) K = j->ptr[d + 1] - j->ptr[d];
  b->wv = malloc((size_t)K * sizeof(float));
  b->pn = malloc((size_t)K * sizeof(float *));
  b->pf = malloc((size_t)K * sizeof(float *));
  b->px = malloc((size_t)K * sizeof(float *));
  return b->wv && b->pn && b->pf && b->px;
}
static void rows_free(rows_t *b) {
  free(b->wv); free((void *)b->pn); free((void *)b->pf); free((void *)b->px);
}

static inline void rows_set(rows_t *b, const job_t *j, int64_t lo, int64_t hi) {
  for (int64_t e = lo; e < hi; ++e) {
    if (j->dn) b->pn[e - lo] = j->hs + j->idx[e] * j->dn;
    if (j->cf) b->pf[e - lo] = j->F + e * j->cf;
    if (j->cx) b->px[e - lo] = j->X + e * j->cx;
  }
}

/* out (one head's [Cx] row) = sum_e wv[e - lo] x_e over the segments */
static inline void row_wsum(const job_t *j, const rows_t *b, float *out, int64_t K) {
  if (j->dn) wsum(out, j->dn, K, b->wv, b->pn);
  if (j->cf) wsum(out + j->dn, j->cf, K, b->wv, b->pf);
  if (j->cx) wsum(out + j->dn + j->cf, j->cx, K, b->wv, b->px);
}

/* Per destination: the scores edge by edge (heads inner: an edge's row is read once and
 * reused by every head from L1), then the weighted sums in column blocks (row_wsum). */
#define HMAX 16
TGL_CLONES static void fwd_range(const job_t *j) {
  const int64_t H = j->H, Cx = j->Cx;
  float mx[HMAX], sum[HMAX], as[HMAX];
  rows_t b;
  if (!rows_alloc(&b, j)) abort();
  for (int64_t d = j->d0; d < j->d1; ++d) {
    const int64_t lo = j->ptr[d], hi = j->ptr[d + 1], dq = j->qmap ? j->qmap[d] : d;
    const float *qd = j->qx + dq * H * Cx;
    float *agg = j->aggx + d * H * Cx;
    for (int64_t h = 0; h < H; ++h) { mx[h] = -INFINITY; sum[h] = 0.f; as[h] = 0.f; }
    for (int64_t e = lo; e < hi; ++e) {
      for (int64_t h = 0; h < H; ++h) {
        const float sc = rdot(j, qd + h * Cx, e) + (j->qb ? j->qb[dq * H + h] : 0.f);
        j->s[e * H + h] = sc;
        const float z = (j->act && sc < 0.f) ? j->slope * sc : sc;
        j->alpha[e * H + h] = z;
        if (z > mx[h]) mx[h] = z;
      }
    }
    for (int64_t e = lo; e < hi; ++e)
      for (int64_t h = 0; h < H; ++h) {
        const float a = expf(j->alpha[e * H + h] - mx[h]);
        j->alpha[e * H + h] = a;
        sum[h] += a;
      }
    for (int64_t h = 0; h < H; ++h) sum[h] = 1.f / sum[h];  /* only used when hi > lo */
    for (int64_t e = lo; e < hi; ++e) {
      for (int64_t h = 0; h < H; ++h) {
        const float a = j->alpha[e * H + h] * sum[h];
        j->alpha[e * H + h] = a;
        as[h] += j->mask ? a * j->mask[e * H + h] : a;
      }
    }
    rows_set(&b, j, lo, hi);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t e = lo; e < hi; ++e)
        b.wv[e - lo] = j->mask ? j->alpha[e * H + h] * j->mask[e * H + h] : j->alpha[e * H + h];
      row_wsum(j, &b, agg + h * Cx, hi - lo);
      j->asum[d * H + h] = as[h];
    }
  }
  rows_free(&b);
}

/* one edge's input-row gradient over one segment (columns off .. off+n-1 of the row):
 * out[c] = sum over heads h, in order, of g[h] qd[h, off+c] + am[h] gad[h, off+c] */
static inline void edge_grad(float *restrict out, int64_t n, int64_t off, int64_t H,
                             int64_t Cx, const float *g, const float *am, const float *qd,
                             const float *gad) {
  int64_t c = 0;
#if defined(__GNUC__)
  for (; c + 16 <= n; c += 16) {
    v8 a0 = {0}, a1 = {0};
    for (int64_t h = 0; h < H; ++h) {
      const float *q = qd + h * Cx + off + c, *ga = gad + h * Cx + off + c;
      a0 += g[h] * ld8(q); a1 += g[h] * ld8(q + 8);
      a0 += am[h] * ld8(ga); a1 += am[h] * ld8(ga + 8);
    }
    st8(out + c, a0); st8(out + c + 8, a1);
  }
#endif
  for (; c < n; ++c) {
    float acc = 0.f;
    for (int64_t h = 0; h < H; ++h) {
      acc += g[h] * qd[h * Cx + off + c];
      acc += am[h] * gad[h * Cx + off + c];
    }
    out[c] = acc;
  }
}

TGL_CLONES static void bwd_range(const job_t *j) {
  const int64_t H = j->H, Cx = j->Cx, dn = j->dn, cx = j->cx;
  float dotag[HMAX], gb[HMAX], am[HMAX];
  const int64_t td = j->te_part ? j->td : 0, toff = dn + j->cf + cx - td;  /* x_e's time columns */
  float *gt = td ? malloc((size_t)(3 * td) * sizeof(float)) : NULL;  /* g x_e's time part, sums */
  rows_t b;
  if (!rows_alloc(&b, j) || (td && !gt)) abort();
  for (int64_t d = j->d0; d < j->d1; ++d) {
    const int64_t lo = j->ptr[d], hi = j->ptr[d + 1], dq = j->qmap ? j->qmap[d] : d;
    const float *gad = j->g_aggx + d * H * Cx;
    const float *qd = j->qx + dq * H * Cx;
    float *gq = j->g_qx + d * H * Cx;
    for (int64_t h = 0; h < H; ++h) { dotag[h] = 0.f; gb[h] = 0.f; }
    for (int64_t c = 0; c < 2 * td; ++c) gt[td + c] = 0.f;   /* this destination's te sums */
    /* d loss / d alpha (into tmp) and the softmax's sum_e alpha * that, per head */
    for (int64_t e = lo; e < hi; ++e)
      for (int64_t h = 0; h < H; ++h) {
        const float a = j->alpha[e * H + h];
        const float m = j->mask ? j->mask[e * H + h] : 1.f;
        const float gw = rdot(j, gad + h * Cx, e) + (j->g_asum ? j->g_asum[d * H + h] : 0.f);
        const float ga = gw * m;
        j->tmp[e * H + h] = ga;
        dotag[h] += a * ga;
      }
    /* d loss / d score (into tmp, replacing d loss / d alpha) */
    for (int64_t e = lo; e < hi; ++e)
      for (int64_t h = 0; h < H; ++h) {
        float g = j->alpha[e * H + h] * (j->tmp[e * H + h] - dotag[h]);  /* softmax backward */
        if (j->act && j->s[e * H + h] < 0.f) g *= j->slope;             /* LeakyReLU backward */
        j->tmp[e * H + h] = g;
        gb[h] += g;
      }
    rows_set(&b, j, lo, hi);
    for (int64_t h = 0; h < H; ++h) {                 /* g_qx[d, h] = sum_e g[e, h] x_e */
      for (int64_t e = lo; e < hi; ++e) b.wv[e - lo] = j->tmp[e * H + h];
      row_wsum(j, &b, gq + h * Cx, hi - lo);
    }
    for (int64_t e = lo; e < hi; ++e) {               /* g x_e, from the scores and aggx */
      for (int64_t h = 0; h < H; ++h)
        am[h] = j->mask ? j->alpha[e * H + h] * j->mask[e * H + h] : j->alpha[e * H + h];
      if (dn) edge_grad(j->g_xh + e * dn, dn, 0, H, Cx, j->tmp + e * H, am, qd, gad);
      if (cx && j->g_X)
        edge_grad(j->g_X + e * cx, cx, dn + j->cf, H, Cx, j->tmp + e * H, am, qd, gad);
      if (td) {   /* the time encoding's backward on this edge's row, summed per destination */
        float *restrict gx = gt, *restrict aw = gt + td, *restrict ab = gt + 2 * td;
        const float *restrict si = j->sinz + e * td;
        const float t = j->dt[e];
        edge_grad(gx, td, toff, H, Cx, j->tmp + e * H, am, qd, gad);
        for (int64_t c = 0; c < td; ++c) {
          const float gz = -gx[c] * si[c];
          aw[c] += gz * t;
          ab[c] += gz;
        }
      }
    }
    if (td) memcpy(j->te_part + d * 2 * td, gt + td, (size_t)(2 * td) * sizeof(float));
    if (j->g_qb) for (int64_t h = 0; h < H; ++h) j->g_qb[d * H + h] = gb[h];
  }
  free(gt);
  rows_free(&b);
}

/* g_hs[u] = sum of g_xh[e] over the edges e with idx[e] = u, in edge order; this thread
 * owns rows [u0, u1). */
TGL_CLONES static void scatter_range(const job_t *j) {
  const int64_t dn = j->dn, M = j->ptr[j->D];
  if (j->u1 > j->u0)
    memset(j->g_hs + j->u0 * dn, 0, (size_t)((j->u1 - j->u0) * dn) * sizeof(float));
  for (int64_t e = 0; e < M; ++e) {
    const int64_t u = j->idx[e];
    if (u >= j->u0 && u < j->u1) axpy(j->g_hs + u * dn, 1.f, j->g_xh + e * dn, dn);
  }
}


/* Split [0, D) into `threads` ranges of about equal edge counts and run fn on each. */
static void run(job_t *base, int threads, void (*fn)(const job_t *)) {
  const int64_t D = base->D, M = base->ptr[D];
  if (threads > MAX_THREADS) threads = MAX_THREADS;
  if (threads < 1 || D < 2 * threads) threads = 1;
  job_t jobs[MAX_THREADS];
  int64_t d = 0;
  for (int t = 0; t < threads; ++t) {
    jobs[t] = *base;
    jobs[t].d0 = d;
    if (t == threads - 1) {
      d = D;
    } else {
      const int64_t target = (M * (t + 1)) / threads;
      while (d < D && base->ptr[d + 1] <= target) ++d;
      if (d < jobs[t].d0 + 1 && d < D) d = jobs[t].d0 + 1;
    }
    jobs[t].d1 = d;
    jobs[t].u0 = (base->U * t) / threads;
    jobs[t].u1 = (base->U * (t + 1)) / threads;
  }
  /* with OpenMP (tgl_dist builds with -fopenmp when the compiler has it) the ranges run on
   * the process's OpenMP workers, torch's own when the runtime is shared (see
   * openmp_threads in tgl_dist/kernels/runtime.py); without it, one after the other */
  int t;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (t = 0; t < threads; ++t) fn(&jobs[t]);
}

void tgl_att_fwd(int64_t D, int64_t H, int64_t dn, int64_t cx, const int64_t *ptr,
                 const float *qx, const float *qb, const float *hs, const int64_t *idx,
                 const float *X, const float *mask, int act, float slope, float *s, float *alpha,
                 float *aggx, float *asum, int threads) {
  job_t j;
  memset(&j, 0, sizeof j);
  j.D = D; j.H = H; j.dn = dn; j.cx = cx; j.Cx = dn + cx; j.ptr = ptr; j.qx = qx; j.qb = qb;
  j.hs = hs; j.idx = idx; j.X = X; j.mask = mask; j.act = act; j.slope = slope; j.s = s;
  j.alpha = alpha; j.aggx = aggx; j.asum = asum;
  run(&j, threads, fwd_range);
}

/* g_X: [M, cx] output, or NULL (no gradient of X). g_xh: scratch [M, dn]; g_hs: [U, dn]
 * output (U rows of hs); tmp: scratch [M, H].
 * Time encoding folded in (td > 0; the last td columns of X are cos(dt * w + b)): dt [M],
 * sinz [M, td] (sin of the same z), te_part: scratch [D, 2 td]; g_tw, g_tb [td] get
 * sum_e gz[e, c] dt[e] and sum_e gz[e, c] with gz = -(d loss / d X[e, toff + c]) sin z[e, c]:
 * in float over each destination's edges, in edge order, then in double over the
 * destinations in order (independent of the number of threads). */
void tgl_att_bwd(int64_t D, int64_t H, int64_t dn, int64_t cx, int64_t U, const int64_t *ptr,
                const float *qx, const float *hs, const int64_t *idx, const float *X,
                const float *mask, int act, float slope, const float *s, const float *alpha,
                const float *g_aggx, const float *g_asum, float *g_qx, float *g_qb, float *g_X,
                float *g_xh, float *g_hs, float *tmp, int64_t td, const float *dt,
                const float *sinz, float *te_part, float *g_tw, float *g_tb, int threads) {
  job_t j;
  memset(&j, 0, sizeof j);
  j.D = D; j.H = H; j.dn = dn; j.cx = cx; j.Cx = dn + cx; j.U = U; j.ptr = ptr; j.qx = qx;
  j.hs = hs; j.idx = idx; j.X = X; j.mask = mask; j.act = act; j.slope = slope;
  j.s = (float *)s; j.alpha = (float *)alpha; j.g_aggx = g_aggx; j.g_asum = g_asum;
  j.g_qx = g_qx; j.g_qb = g_qb; j.g_X = g_X; j.g_xh = g_xh; j.g_hs = g_hs; j.tmp = tmp;
  if (td > 0 && td <= cx) { j.td = td; j.dt = dt; j.sinz = sinz; j.te_part = te_part; }
  run(&j, threads, bwd_range);
  if (dn) run(&j, threads, scatter_range);
  if (j.te_part) {
    double *acc = calloc((size_t)(2 * td), sizeof(double));
    if (!acc) abort();
    for (int64_t d = 0; d < D; ++d) {
      const float *p = te_part + d * 2 * td;
      for (int64_t c = 0; c < 2 * td; ++c) acc[c] += (double)p[c];
    }
    for (int64_t c = 0; c < td; ++c) { g_tw[c] = (float)acc[c]; g_tb[c] = (float)acc[td + c]; }
    free(acc);
  }
}

/* CSR offsets of edges listed by destination: ptr [D + 1] with the edges of d at
 * ptr[d] .. ptr[d+1]-1, from dst [M]. Returns 0, or 1 when dst is not sorted (ptr is then
 * unspecified), or -1 when a destination is outside 0 .. D-1. One serial pass. */
int tgl_att_csr(int64_t M, int64_t D, const int64_t *dst, int64_t *ptr) {
  int64_t d = 0;   /* ptr[0 .. d] are written */
  ptr[0] = 0;
  for (int64_t e = 0; e < M; ++e) {
    const int64_t v = dst[e];
    if (v < 0 || v >= D) return -1;
    if (v < d) return 1;
    while (d < v) ptr[++d] = e;
  }
  while (d < D) ptr[++d] = M;
  return 0;
}

/* ------------------------------------------------------------------------------------
 * The whole temporal attention layer (tgl_dist.nn._attention_layer.AttentionLayer) in one
 * call each way: the products through the BLAS torch itself calls (its sgemm_, set once
 * with tgl_att_set_sgemm), the per-edge passes above, and the small row operations
 * (LayerNorm, ReLU, dropout multipliers, bias sums) as plain loops. The same arithmetic
 * as the layer's torch form (docs/models.md); the sums of the small operations run in
 * their own fixed order (results differ from torch's operators in the last bits).
 *
 * Shapes: D destinations, M edges (CSR by destination: ptr [D + 1]), U rows of h [U, dn],
 * H heads, d outputs (c = d / H per head), the edges' own input rows in two parts: their
 * features F [M, cf] (cf may be 0: F unused) and X [M, cx] with phi(dt) its last dtd
 * columns (X = phi(dt) alone in tgl_dist's calls), C = dn + cf + cx; the query's input is
 * [h_dst || phi(0)] with phi(0) = c0 [dtd]. Parameters: W_q [d, dn + dtd], b_q [d],
 * W_kv [2d, C], b_kv [2d], W_o [d, d + dn], b_o [d], LayerNorm ln_w, ln_b [d].
 * ------------------------------------------------------------------------------------ */
/* fn: the BLAS's Fortran sgemm_ (32-bit integers), or NULL to turn the layer calls off */
int tgl_att_set_sgemm(void *fn) { SGEMM = (sgemm_fn)fn; return SGEMM != NULL; }
int tgl_att_gemm_check(void) { return gemm_check(); }

/* rows [n, w] (row stride ld) = the vector v [w] on every row */
static void fill_rows(float *out, int64_t n, int64_t w, int64_t ld, const float *v) {
  for (int64_t i = 0; i < n; ++i) memcpy(out + i * ld, v, (size_t)w * sizeof(float));
}

/* workers for a row loop over n elements (workers in blas.h, no cap by blocks) */
static int row_workers(int threads, int64_t n) { return workers(threads, n, threads); }

static inline float sum_f(const float *a, int64_t n) {   /* fixed order, as dot() */
  int64_t i = 0;
  float r = 0.f;
#if defined(__GNUC__)
  v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
  for (; i + 32 <= n; i += 32) {
    s0 += ld8(a + i); s1 += ld8(a + i + 8); s2 += ld8(a + i + 16); s3 += ld8(a + i + 24);
  }
  for (; i + 8 <= n; i += 8) s0 += ld8(a + i);
  const v8 t = (s0 + s1) + (s2 + s3);
  r = ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
#endif
  for (; i < n; ++i) r += a[i];
  return r;
}

/* the distinct values of rows [n] (each in 0 .. U-1), in order of first occurrence: first
 * [k] (k of them, returned) and map [n] with rows[i] = first[map[i]]; map[i] <= i */
static int64_t distinct_rows(const int64_t *rows, int64_t n, int64_t U, int64_t *map,
                             int64_t *first) {
  int64_t *slot = malloc((size_t)(U > 0 ? U : 1) * sizeof(int64_t));
  if (!slot) abort();
  for (int64_t u = 0; u < U; ++u) slot[u] = -1;
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    if (slot[r] < 0) { slot[r] = k; first[k++] = r; }
    map[i] = slot[r];
  }
  free(slot);
  return k;
}

/* rows [n, w] -> the sum of the rows i with map[i] = k into row k (k < the returned count),
 * in place, in order of i (map from distinct_rows: map[i] <= i, and a row is read before it
 * is overwritten) */
static void sum_rows_by_map(float *rows, int64_t n, int64_t w, const int64_t *map,
                            int threads) {
  const int nw = col_workers(threads, n, w);
  int p;
#pragma omp parallel for num_threads(nw) schedule(static)
  for (p = 0; p < nw; ++p) {   /* by columns (col_share) */
    int64_t t0, t1, k = 0;     /* k: distinct rows started so far */
    col_share(w, p, nw, &t0, &t1);
    for (int64_t i = 0; i < n; ++i) {
      float *to = rows + map[i] * w;
      const float *from = rows + i * w;
      if (map[i] == k) {   /* first occurrence of row k */
        if (k != i) memcpy(to + t0, from + t0, (size_t)(t1 - t0) * sizeof(float));
        ++k;
      } else {
        for (int64_t t = t0; t < t1; ++t) to[t] += from[t];
      }
    }
  }
}

/* out[rows[k], :] += a[k, :] for k < n in order (a [n, w]; out rows w apart), by columns */
static void scatter_rows(float *out, const int64_t *rows, const float *a, int64_t n, int64_t w,
                         int threads) {
  const int nw = col_workers(threads, n, w);
  int p;
#pragma omp parallel for num_threads(nw) schedule(static)
  for (p = 0; p < nw; ++p) {
    int64_t t0, t1;
    col_share(w, p, nw, &t0, &t1);
    for (int64_t k = 0; k < n; ++k) axpy(out + rows[k] * w + t0, 1.f, a + k * w + t0, t1 - t0);
  }
}

/* one row of r = ReLU(o * mask) (in place) and z = LayerNorm(r): mean, then the mean of
 * the squared deviations (biased), rstd = 1 / sqrt(var + eps) */
TGL_CLONES static void ln_fwd_row(float *restrict r, float *restrict z, const float *mask,
                                  int64_t d, const float *ln_w, const float *ln_b, float eps,
                                  float *mean, float *rstd) {
  float dev[d > 0 ? d : 1];
  for (int64_t t = 0; t < d; ++t) {
    const float v = mask ? r[t] * mask[t] : r[t];
    r[t] = v > 0.f ? v : 0.f;
  }
  const float m = sum_f(r, d) / (float)d;
  for (int64_t t = 0; t < d; ++t) dev[t] = r[t] - m;
  const float var = dot(dev, dev, d) / (float)d, rs = 1.f / sqrtf(var + eps);
  *mean = m; *rstd = rs;
  for (int64_t t = 0; t < d; ++t) z[t] = dev[t] * rs * ln_w[t] + ln_b[t];
}

/* one row of go = d loss / d o through the LayerNorm, the ReLU and the dropout mask:
 * gx = gz w, go = rstd (gx - mean(gx) - xh mean(gx xh)) where r > 0, times the mask */
TGL_CLONES static void ln_bwd_row(const float *restrict gz, const float *restrict r,
                                  const float *mask, int64_t d, const float *ln_w, float m,
                                  float rs, float *restrict go) {
  float xh[d > 0 ? d : 1], gx[d > 0 ? d : 1];
  for (int64_t t = 0; t < d; ++t) { xh[t] = (r[t] - m) * rs; gx[t] = gz[t] * ln_w[t]; }
  const float a = sum_f(gx, d) / (float)d, b = dot(gx, xh, d) / (float)d;
  for (int64_t t = 0; t < d; ++t) {
    float g = rs * (gx[t] - a - xh[t] * b);
    if (!(r[t] > 0.f)) g = 0.f;
    go[t] = mask ? g * mask[t] : g;
  }
}

static int rows_in_range(const int64_t *ix, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    if (ix[i] < 0 || ix[i] >= rows) return 0;
  return 1;
}

/* Forward. Writes z [D, d] and what the backward reads: v [D, d] (in vh), what depends on
 * the destination's node row alone once per distinct row (*nq = Dq of them: qrows [Dq]
 * the rows of h, qmap [D] destination i's among them, hq [Dq, dn] their rows of h,
 * q [Dq, d], qk [Dq, H, C], qb [Dq, H]; each buffer sized for D; W_o's h_dst part),
 * s, alpha [M, H], agg [D, H, C],
 * asum [D, H], r [D, d] (the LayerNorm's input), mean, rstd [D]. att_mask [M, H],
 * out_mask [D, d]: dropout multipliers or NULL. Returns 0, -1 for an index outside its
 * table, -2 without a BLAS. */
int tgl_att_layer_fwd(int64_t D, int64_t M, int64_t U, int64_t H, int64_t dn, int64_t cx,
                      int64_t d, int64_t dtd, const float *h, const int64_t *dst_rows,
                      const int64_t *idx, const float *F, int64_t cf, const float *X,
                      const int64_t *ptr,
                      const float *att_mask, const float *out_mask, float slope,
                      const float *c0, const float *w_q, const float *b_q, const float *w_kv,
                      const float *b_kv, const float *w_o, const float *b_o,
                      const float *ln_w, const float *ln_b, float eps, float *vh, float *q,
                      float *qk, float *qb, float *s, float *alpha, float *agg, float *asum,
                      float *r, float *mean, float *rstd, float *z, int64_t *qmap,
                      int64_t *qrows, float *hq, int64_t *nq, int threads) {
  if (!SGEMM) return -2;
  if (!rows_in_range(dst_rows, D, U) || !rows_in_range(idx, M, U)) return -1;
  const int64_t c = d / H, C = dn + cf + cx, lv = d + dn, lq = dn + dtd;
  /* the query side and W_o's h_dst part depend on the destination's node row alone: they
   * are computed once per distinct row (Dq of them, hq [Dq, dn]; destination i reads row
   * qmap[i]) */
  const int64_t Dq = distinct_rows(dst_rows, D, U, qmap, qrows);
  *nq = Dq;
  int64_t i;
#pragma omp parallel for num_threads(row_workers(threads, Dq * dn)) schedule(static)
  for (i = 0; i < Dq; ++i) memcpy(hq + i * dn, h + qrows[i] * dn, (size_t)dn * sizeof(float));
  /* q = W_q [h_dst || phi(0)] + b_q: the constant part once, then one product */
  float *qbias = malloc((size_t)d * sizeof(float));
  if (!qbias) abort();
  for (int64_t o = 0; o < d; ++o) {
    float acc = 0.f;
    for (int64_t t = 0; t < dtd; ++t) acc += w_q[o * lq + dn + t] * c0[t];
    qbias[o] = b_q[o] + acc;
  }
  fill_rows(q, Dq, d, d, qbias);
  free(qbias);
  gemm(0, 1, Dq, d, dn, hq, dn, w_q, lq, 1.f, q, d);
  /* per head: W_k,h^T q_h [Dq, C] (into the [Dq, H, C] layout) and q_h . b_k,h */
  for (int64_t j = 0; j < H; ++j)
    gemm(0, 0, Dq, C, c, q + j * c, d, w_kv + j * c * C, C, 0.f, qk + j * C, H * C);
  for (int64_t i = 0; i < Dq; ++i)
    for (int64_t j = 0; j < H; ++j) qb[i * H + j] = dot(q + i * d + j * c, b_kv + j * c, c);
  /* the edges: scores, softmax, weighted sums of the input rows */
  job_t jb;
  memset(&jb, 0, sizeof jb);
  jb.D = D; jb.H = H; jb.dn = dn; jb.cx = cx; jb.Cx = C; jb.ptr = ptr; jb.qx = qk; jb.qb = qb;
  jb.hs = h; jb.idx = idx; jb.X = cx ? X : NULL; jb.mask = att_mask; jb.act = 1;
  jb.F = cf ? F : NULL; jb.cf = cf;
  jb.slope = slope; jb.s = s; jb.alpha = alpha; jb.aggx = agg; jb.asum = asum; jb.qmap = qmap;
  run(&jb, threads, fwd_range);
  /* v_h = W_v,h agg_h + b_v,h asum_h, per head into vh's columns */
  const float *w_v = w_kv + d * C, *b_v = b_kv + d;
  for (int64_t j = 0; j < H; ++j)
    gemm(0, 1, D, c, C, agg + j * C, H * C, w_v + j * c * C, C, 0.f, vh + j * c, d);
#pragma omp parallel for num_threads(row_workers(threads, D * d)) schedule(static)
  for (i = 0; i < D; ++i)
    for (int64_t j = 0; j < H; ++j) {
      const float a = asum[i * H + j];
      float *v = vh + i * d + j * c;
      for (int64_t t = 0; t < c; ++t) v[t] += a * b_v[j * c + t];
    }
  /* o = W_o,v v + (W_o,h h_dst + b_o) (the latter per distinct row: oh [Dq, d]);
   * r = ReLU(o * out_mask); z = LayerNorm(r) */
  float *oh = malloc((size_t)(Dq * d > 0 ? Dq * d : 1) * sizeof(float));
  if (!oh) abort();
  fill_rows(oh, Dq, d, d, b_o);
  gemm(0, 1, Dq, d, dn, hq, dn, w_o + d, lv, 1.f, oh, d);
#pragma omp parallel for num_threads(row_workers(threads, D * d)) schedule(static)
  for (i = 0; i < D; ++i) memcpy(r + i * d, oh + qmap[i] * d, (size_t)d * sizeof(float));
  free(oh);
  gemm(0, 1, D, d, d, vh, d, w_o, lv, 1.f, r, d);
#pragma omp parallel for num_threads(row_workers(threads, D * d)) schedule(static)
  for (i = 0; i < D; ++i) ln_fwd_row(r + i * d, z + i * d, out_mask ? out_mask + i * d : NULL,
                                     d, ln_w, ln_b, eps, mean + i, rstd + i);
  return 0;
}

/* Backward of tgl_att_layer_fwd from gz [D, d] and its saved tensors (Dq, qmap, qrows, hq
 * as the forward wrote them). Writes g_h [U, dn], g_wq, g_bq, g_wkv, g_bkv, g_wo, g_bo,
 * g_lnw, g_lnb (the parameters' shapes) and, when sinz is not NULL (td = dtd > 0: phi's w
 * and b want a gradient), g_tw, g_tb [dtd]. Scratch: go [D, d], g_v [D, d], g_agg,
 * g_qk [D, H, C], g_asum, g_qb [D, H], g_q [Dq, d], g_hq [Dq, dn], g_xh [M, dn],
 * tmp [M, H], te_part [D, 2 dtd]. Returns 0, or -2 without a BLAS. */
int tgl_att_layer_bwd(int64_t D, int64_t M, int64_t U, int64_t H, int64_t dn, int64_t cx,
                      int64_t d, int64_t dtd, const float *gz, const float *h,
                      const int64_t *idx, const float *F, int64_t cf, const float *X,
                      const int64_t *ptr, const float *att_mask, const float *out_mask,
                      float slope, const float *dt, const float *sinz, const float *c0,
                      const float *te_b, const float *w_q, const float *w_kv,
                      const float *b_kv, const float *w_o, const float *ln_w,
                      const float *vh, const float *q, const float *qk, const float *s,
                      const float *alpha, const float *agg, const float *asum,
                      const float *r, const float *mean, const float *rstd, float *g_h,
                      float *g_wq, float *g_bq, float *g_wkv, float *g_bkv, float *g_wo,
                      float *g_bo, float *g_lnw, float *g_lnb, float *g_tw, float *g_tb,
                      float *go, float *g_v, float *g_agg, float *g_qk, float *g_asum,
                      float *g_qb, float *g_q, float *g_xh, float *tmp, float *te_part,
                      int64_t Dq, const int64_t *qmap, const int64_t *qrows, const float *hq,
                      float *g_hq, int threads) {
  if (!SGEMM) return -2;
  const int64_t c = d / H, C = dn + cf + cx, lv = d + dn, lq = dn + dtd;
  /* LayerNorm, ReLU and the output dropout: go = d loss / d o */
  int64_t i;
#pragma omp parallel for num_threads(row_workers(threads, D * d)) schedule(static)
  for (i = 0; i < D; ++i) ln_bwd_row(gz + i * d, r + i * d, out_mask ? out_mask + i * d : NULL,
                                     d, ln_w, mean[i], rstd[i], go + i * d);
  int p, nw = col_workers(threads, D, d);
#pragma omp parallel for num_threads(nw) schedule(static)
  for (p = 0; p < nw; ++p) {   /* the LayerNorm's weight and bias: sums over the rows */
    int64_t t0, t1;
    col_share(d, p, nw, &t0, &t1);
    for (int64_t t = t0; t < t1; ++t) { g_lnw[t] = 0.f; g_lnb[t] = 0.f; }
    for (int64_t i = 0; i < D; ++i) {
      const float *gi = gz + i * d, *ri = r + i * d, m = mean[i], rs = rstd[i];
      for (int64_t t = t0; t < t1; ++t) { g_lnw[t] += gi[t] * ((ri[t] - m) * rs); g_lnb[t] += gi[t]; }
    }
  }
  /* o = W_o,v v + W_o,h h_dst + b_o: v's part per destination, h_dst's per distinct row
   * (go summed per row: goq [Dq, d]) */
  gemm(1, 0, d, d, D, go, d, vh, d, 0.f, g_wo, lv);
  col_sums(g_bo, go, D, d, d, threads);
  gemm(0, 0, D, d, d, go, d, w_o, lv, 0.f, g_v, d);
  float *goq = go;
  if (Dq < D) {
    goq = malloc((size_t)(D * d) * sizeof(float));
    if (!goq) abort();
    memcpy(goq, go, (size_t)(D * d) * sizeof(float));
    sum_rows_by_map(goq, D, d, qmap, threads);
  }
  gemm(1, 0, d, dn, Dq, goq, d, hq, dn, 0.f, g_wo + d, lv);
  gemm(0, 0, Dq, dn, d, goq, d, w_o + d, lv, 0.f, g_hq, dn);   /* g_hq = goq W_o,h */
  if (goq != go) free(goq);
  /* v_h = W_v,h agg_h + b_v,h asum_h */
  const float *w_v = w_kv + d * C, *b_v = b_kv + d;
  for (int64_t j = 0; j < H; ++j) {
    const float *gv = g_v + j * c;
    gemm(1, 0, c, C, D, gv, d, agg + j * C, H * C, 0.f, g_wkv + (d + j * c) * C, C);
    gemm(0, 0, D, C, c, gv, d, w_v + j * c * C, C, 0.f, g_agg + j * C, H * C);
    float *gb = g_bkv + d + j * c;
    for (int64_t t = 0; t < c; ++t) gb[t] = 0.f;
    for (int64_t i = 0; i < D; ++i) {
      const float a = asum[i * H + j], *g = gv + i * d;
      for (int64_t t = 0; t < c; ++t) gb[t] += a * g[t];
      g_asum[i * H + j] = dot(g, b_v + j * c, c);
    }
  }
  /* the edges (with phi's backward folded in when sinz is given) */
  const int64_t td = sinz ? dtd : 0;
  job_t jb;
  memset(&jb, 0, sizeof jb);
  jb.D = D; jb.H = H; jb.dn = dn; jb.cx = cx; jb.Cx = C; jb.U = U; jb.ptr = ptr; jb.qx = qk;
  jb.hs = h; jb.idx = idx; jb.X = cx ? X : NULL; jb.mask = att_mask; jb.act = 1;
  jb.F = cf ? F : NULL; jb.cf = cf;
  jb.slope = slope; jb.s = (float *)s; jb.alpha = (float *)alpha; jb.g_aggx = g_agg;
  jb.g_asum = g_asum; jb.g_qx = g_qk; jb.g_qb = g_qb; jb.g_X = NULL; jb.g_xh = g_xh;
  jb.g_hs = g_h; jb.tmp = tmp; jb.qmap = qmap;
  if (td > 0 && td <= cx) { jb.td = td; jb.dt = dt; jb.sinz = sinz; jb.te_part = te_part; }
  run(&jb, threads, bwd_range);
  run(&jb, threads, scatter_range);
  if (jb.te_part) {   /* over the destinations in order, in double, by columns */
    const int64_t w = 2 * td;
    double *tacc = malloc((size_t)w * sizeof(double));
    if (!tacc) abort();
    nw = col_workers(threads, D, w);
#pragma omp parallel for num_threads(nw) schedule(static)
    for (p = 0; p < nw; ++p) {
      int64_t t0, t1;
      col_share(w, p, nw, &t0, &t1);
      for (int64_t t = t0; t < t1; ++t) tacc[t] = 0.0;
      for (int64_t i = 0; i < D; ++i)
        for (int64_t t = t0; t < t1; ++t) tacc[t] += (double)te_part[i * w + t];
    }
    for (int64_t t = 0; t < td; ++t) { g_tw[t] = (float)tacc[t]; g_tb[t] = (float)tacc[td + t]; }
    free(tacc);
  }
  /* the query side, per distinct destination row: the destinations' g_qk, g_qb summed */
  if (Dq < D) {
    sum_rows_by_map(g_qk, D, H * C, qmap, threads);
    sum_rows_by_map(g_qb, D, H, qmap, 1);
  }
  /* qk_h = W_k,h^T q_h, qb_h = q_h . b_k,h */
  for (int64_t j = 0; j < H; ++j) {
    gemm(0, 1, Dq, c, C, g_qk + j * C, H * C, w_kv + j * c * C, C, 0.f, g_q + j * c, d);
    gemm(1, 0, c, C, Dq, q + j * c, d, g_qk + j * C, H * C, 0.f, g_wkv + j * c * C, C);
    float *gb = g_bkv + j * c;
    for (int64_t t = 0; t < c; ++t) gb[t] = 0.f;
    for (int64_t i = 0; i < Dq; ++i) {
      const float a = g_qb[i * H + j], *qi = q + i * d + j * c;
      float *gq = g_q + i * d + j * c;
      for (int64_t t = 0; t < c; ++t) { gb[t] += a * qi[t]; gq[t] += a * b_kv[j * c + t]; }
    }
  }
  /* q = W_q [h_dst || phi(0)] + b_q */
  gemm(1, 0, d, dn, Dq, g_q, d, hq, dn, 0.f, g_wq, lq);
  col_sums(g_bq, g_q, Dq, d, d, threads);
  for (int64_t o = 0; o < d; ++o)
    for (int64_t t = 0; t < dtd; ++t) g_wq[o * lq + dn + t] = g_bq[o] * c0[t];
  gemm(0, 0, Dq, dn, d, g_q, d, w_q, lq, 1.f, g_hq, dn);       /* g_hq += g_q W_q,h */
  scatter_rows(g_h, qrows, g_hq, Dq, dn, threads);            /* into h's rows, in order */
  /* phi(0) = cos(b) in the query: its part of g_b */
  if (td) {
    for (int64_t t = 0; t < dtd; ++t) {
      float a = 0.f;
      for (int64_t o = 0; o < d; ++o) a += w_q[o * lq + dn + t] * g_bq[o];
      g_tb[t] += -(sinf(te_b[t]) * a);
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------------------
 * The edge predictor's scores from rows of one embedding table
 * (tgl_dist.nn.predictor.ScoreRows) in one call each way, as the layer above:
 *   logit_r = w_o . ReLU(W_s emb[src_(r mod B)] + b_s + W_d emb[dst_r] + b_d) + b_o
 * for r < n = k B (B sources, each scored against its k + 1 destinations, negative-major;
 * with B = n one source per row). emb [R, d]; W_s, W_d [d, d]; w_o [d]; b_o [1].
 * ------------------------------------------------------------------------------------ */

/* Writes hs [B, d], hd [n, d] (the gathered rows), z [n, d] (the ReLU's output) and the
 * logits, rows r < npos into lp and the rest into ln; s: scratch [B, d]. Returns 0, -1 for
 * a row outside emb, -2 without a BLAS. */
int tgl_score_fwd(int64_t B, int64_t n, int64_t npos, int64_t R, int64_t d, const float *emb,
                  const int64_t *src, const int64_t *dst, const float *w_s, const float *b_s,
                  const float *w_d, const float *b_d, const float *w_o, const float *b_o,
                  float *hs, float *hd, float *z, float *s, float *lp, float *ln, int threads) {
  if (!SGEMM) return -2;
  if (B <= 0 || n % B || npos < 0 || npos > n || !rows_in_range(src, B, R)
      || !rows_in_range(dst, n, R)) return -1;
  int64_t i;   /* (n >= B rows: the gathers and the biases under the products) */
#pragma omp parallel for num_threads(row_workers(threads, 2 * n * d)) schedule(static)
  for (i = 0; i < n; ++i) {
    if (i < B) {
      memcpy(hs + i * d, emb + src[i] * d, (size_t)d * sizeof(float));
      memcpy(s + i * d, b_s, (size_t)d * sizeof(float));
    }
    memcpy(hd + i * d, emb + dst[i] * d, (size_t)d * sizeof(float));
    memcpy(z + i * d, b_d, (size_t)d * sizeof(float));
  }
  gemm(0, 1, B, d, d, hs, d, w_s, d, 1.f, s, d);
  gemm(0, 1, n, d, d, hd, d, w_d, d, 1.f, z, d);
#pragma omp parallel for num_threads(row_workers(threads, n * d)) schedule(static)
  for (i = 0; i < n; ++i) {
    float *zi = z + i * d;
    const float *si = s + (i % B) * d;
    for (int64_t t = 0; t < d; ++t) {
      const float v = zi[t] + si[t];
      zi[t] = v > 0.f ? v : 0.f;
    }
    const float logit = b_o[0] + dot(zi, w_o, d);
    if (i < npos) lp[i] = logit; else ln[i - npos] = logit;
  }
  return 0;
}

/* From g [n] (d loss / d logits) and the forward's rows: g_emb [R, d] (written whole:
 * zero but at the rows of src and dst, summed in row order) when not NULL, and the
 * parameters' gradients g_ws, g_wd [d, d], g_bs, g_bd, g_wo [d], g_bo [1]. Scratch:
 * gz [n, d], gs [B, d], tmp [n, d]. Returns 0, or -2 without a BLAS. */
int tgl_score_bwd(int64_t B, int64_t n, int64_t R, int64_t d, const float *g,
                  const int64_t *src, const int64_t *dst, const float *hs, const float *hd,
                  const float *z, const float *w_s, const float *w_d, const float *w_o,
                  float *g_emb, float *g_ws, float *g_bs, float *g_wd, float *g_bd,
                  float *g_wo, float *g_bo, float *gz, float *gs, float *tmp, int threads) {
  if (!SGEMM) return -2;
  int64_t i;
#pragma omp parallel for num_threads(row_workers(threads, n * d)) schedule(static)
  for (i = 0; i < n; ++i)
    for (int64_t t = 0; t < d; ++t) gz[i * d + t] = z[i * d + t] > 0.f ? g[i] * w_o[t] : 0.f;
  /* gs: the sum over the k + 1 blocks of B rows, each row's blocks in order */
#pragma omp parallel for num_threads(row_workers(threads, n * d)) schedule(static)
  for (i = 0; i < B; ++i) {
    memcpy(gs + i * d, gz + i * d, (size_t)d * sizeof(float));
    for (int64_t r = i + B; r < n; r += B) axpy(gs + i * d, 1.f, gz + r * d, d);
  }
  if (g_emb) {
#pragma omp parallel for num_threads(row_workers(threads, R * d)) schedule(static)
    for (i = 0; i < R; ++i) memset(g_emb + i * d, 0, (size_t)d * sizeof(float));
    gemm(0, 0, B, d, d, gs, d, w_s, d, 0.f, tmp, d);
    scatter_rows(g_emb, src, tmp, B, d, threads);
    gemm(0, 0, n, d, d, gz, d, w_d, d, 0.f, tmp, d);
    scatter_rows(g_emb, dst, tmp, n, d, threads);
  }
  gemm(1, 0, d, d, B, gs, d, hs, d, 0.f, g_ws, d);
  col_sums(g_bs, gs, B, d, d, threads);
  gemm(1, 0, d, d, n, gz, d, hd, d, 0.f, g_wd, d);
  col_sums(g_bd, gz, n, d, d, threads);
  const int nw = col_workers(threads, n, d);
  int p;
#pragma omp parallel for num_threads(nw) schedule(static)
  for (p = 0; p < nw; ++p) {   /* g_wo = sum_i g[i] z[i], rows in order, by columns */
    int64_t t0, t1;
    col_share(d, p, nw, &t0, &t1);
    for (int64_t t = t0; t < t1; ++t) g_wo[t] = 0.f;
    for (int64_t i = 0; i < n; ++i) axpy(g_wo + t0, g[i], z + i * d + t0, t1 - t0);
  }
  float go = 0.f;
  for (int64_t i = 0; i < n; ++i) go += g[i];
  g_bo[0] = go;
  return 0;
}
