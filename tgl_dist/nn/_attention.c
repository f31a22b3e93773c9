/* Fused segment attention of tgl_dist's temporal attention layers: plain C99 (+ OpenMP).
 *
 * Built on first use by tgl_dist/nn/_attention_kernel.py (same compiler, flags and cache as
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

int64_t tgl_att_abi(void) { return 5; }

#if defined(__GNUC__)  /* GCC and clang: 8-float vectors (two SSE or one AVX register) */
typedef float v8 __attribute__((vector_size(32)));
static inline v8 ld8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void st8(float *p, v8 v) { memcpy(p, &v, sizeof v); }
#endif
/* at most HMAX heads (checked by the caller) */

typedef struct {
  int64_t D, H, Cx, dn, cx, U;   /* Cx = dn + cx */
  const int64_t *ptr, *idx;
  const float *qx, *qb, *hs, *X, *mask;
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

/* the two segments of edge e's input row */
static inline float rdot(const job_t *j, const float *q, int64_t e) {
  float r = j->cx ? dot(q + j->dn, j->X + e * j->cx, j->cx) : 0.f;
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

/* per-thread scratch for one destination's edges: weights and both segments' row
 * pointers (sized for the largest in-degree of the thread's range) */
typedef struct { float *wv; const float **pn, **px; } rows_t;

static int rows_alloc(rows_t *b, const job_t *j) {
  int64_t K = 1;
  for (int64_t d = j->d0; d < j->d1; ++d)
    if (j->ptr[d + 1] - j->ptr[d] > K) K = j->ptr[d + 1] - j->ptr[d];
  b->wv = malloc((size_t)K * sizeof(float));
  b->pn = malloc((size_t)K * sizeof(float *));
  b->px = malloc((size_t)K * sizeof(float *));
  return b->wv && b->pn && b->px;
}
static void rows_free(rows_t *b) { free(b->wv); free((void *)b->pn); free((void *)b->px); }

static inline void rows_set(rows_t *b, const job_t *j, int64_t lo, int64_t hi) {
  for (int64_t e = lo; e < hi; ++e) {
    if (j->dn) b->pn[e - lo] = j->hs + j->idx[e] * j->dn;
    if (j->cx) b->px[e - lo] = j->X + e * j->cx;
  }
}

/* out (one head's [Cx] row) = sum_e wv[e - lo] x_e over both segments */
static inline void row_wsum(const job_t *j, const rows_t *b, float *out, int64_t K) {
  if (j->dn) wsum(out, j->dn, K, b->wv, b->pn);
  if (j->cx) wsum(out + j->dn, j->cx, K, b->wv, b->px);
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
    const int64_t lo = j->ptr[d], hi = j->ptr[d + 1];
    const float *qd = j->qx + d * H * Cx;
    float *agg = j->aggx + d * H * Cx;
    for (int64_t h = 0; h < H; ++h) { mx[h] = -INFINITY; sum[h] = 0.f; as[h] = 0.f; }
    for (int64_t e = lo; e < hi; ++e) {
      for (int64_t h = 0; h < H; ++h) {
        const float sc = rdot(j, qd + h * Cx, e) + (j->qb ? j->qb[d * H + h] : 0.f);
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
  const int64_t td = j->te_part ? j->td : 0, toff = dn + cx - td;  /* time columns of x_e */
  float *gt = td ? malloc((size_t)(3 * td) * sizeof(float)) : NULL;  /* g x_e's time part, sums */
  rows_t b;
  if (!rows_alloc(&b, j) || (td && !gt)) abort();
  for (int64_t d = j->d0; d < j->d1; ++d) {
    const int64_t lo = j->ptr[d], hi = j->ptr[d + 1];
    const float *gad = j->g_aggx + d * H * Cx;
    const float *qd = j->qx + d * H * Cx;
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
      if (cx && j->g_X) edge_grad(j->g_X + e * cx, cx, dn, H, Cx, j->tmp + e * H, am, qd, gad);
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
   * openmp_threads in tgl_dist/sampling/_ckernel.py); without it, one after the other */
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

/* out[idx[i], :] += src[i, :] for i = 0 .. n-1 in order (src rows ld floats apart, out
 * rows d floats apart, `rows` of them): torch's index_add_ on CPU, serially. Returns 0, or
 * -1 when an index is outside 0 .. rows-1 (checked before anything is written). */
int tgl_att_index_add(int64_t n, int64_t d, const int64_t *idx, const float *src, int64_t ld,
                      float *out, int64_t rows) {
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= rows) return -1;
  for (int64_t i = 0; i < n; ++i) axpy(out + idx[i] * d, 1.f, src + i * ld, d);
  return 0;
}
