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

/* on x86-64 Linux with GCC, the per-destination passes get an AVX2+FMA clone beside the
 * generic one, picked at load time (no -march: the library runs on any x86-64) */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TGL_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define TGL_CLONES
#endif

int64_t tgl_att_abi(void) { return 2; }
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
  float *work;                   /* [threads, Cx] scratch (one row per thread) */
  int64_t d0, d1, u0, u1;
} job_t;

/* dot product with 8 independent partial sums (vectorisable without -ffast-math; fixed order) */
static inline float dot(const float *a, const float *b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float r = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
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
static inline void raxpy(const job_t *j, float *y, float a, int64_t e) {
  if (j->dn) axpy(y, a, j->hs + j->idx[e] * j->dn, j->dn);
  if (j->cx) axpy(y + j->dn, a, j->X + e * j->cx, j->cx);
}

/* Per destination, edges outer and heads inner: an edge's input row X[e] (Cx floats) is
 * read from memory once per pass and reused by every head from L1. */
#define HMAX 16
TGL_CLONES static void fwd_range(const job_t *j) {
  const int64_t H = j->H, Cx = j->Cx;
  float mx[HMAX], sum[HMAX], as[HMAX];
  for (int64_t d = j->d0; d < j->d1; ++d) {
    const int64_t lo = j->ptr[d], hi = j->ptr[d + 1];
    const float *qd = j->qx + d * H * Cx;
    float *agg = j->aggx + d * H * Cx;
    memset(agg, 0, (size_t)(H * Cx) * sizeof(float));
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
        const float w = j->mask ? a * j->mask[e * H + h] : a;
        as[h] += w;
        raxpy(j, agg + h * Cx, w, e);
      }
    }
    for (int64_t h = 0; h < H; ++h) j->asum[d * H + h] = as[h];
  }
}

TGL_CLONES static void bwd_range(const job_t *j) {
  const int64_t H = j->H, Cx = j->Cx, dn = j->dn, cx = j->cx;
  float dotag[HMAX], gb[HMAX];
  float *gx = j->work;  /* d loss / d x_e */
  for (int64_t d = j->d0; d < j->d1; ++d) {
    const int64_t lo = j->ptr[d], hi = j->ptr[d + 1];
    const float *gad = j->g_aggx + d * H * Cx;
    const float *qd = j->qx + d * H * Cx;
    float *gq = j->g_qx + d * H * Cx;
    memset(gq, 0, (size_t)(H * Cx) * sizeof(float));
    for (int64_t h = 0; h < H; ++h) { dotag[h] = 0.f; gb[h] = 0.f; }
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
    for (int64_t e = lo; e < hi; ++e) {
      memset(gx, 0, (size_t)Cx * sizeof(float));
      for (int64_t h = 0; h < H; ++h) {
        const float a = j->alpha[e * H + h];
        const float m = j->mask ? j->mask[e * H + h] : 1.f;
        float g = a * (j->tmp[e * H + h] - dotag[h]);          /* softmax backward */
        if (j->act && j->s[e * H + h] < 0.f) g *= j->slope;     /* LeakyReLU backward */
        gb[h] += g;
        raxpy(j, gq + h * Cx, g, e);
        axpy(gx, g, qd + h * Cx, Cx);
        axpy(gx, a * m, gad + h * Cx, Cx);                      /* from aggx += w x_e */
      }
      if (dn) memcpy(j->g_xh + e * dn, gx, (size_t)dn * sizeof(float));
      if (cx) memcpy(j->g_X + e * cx, gx + dn, (size_t)cx * sizeof(float));
    }
    if (j->g_qb) for (int64_t h = 0; h < H; ++h) j->g_qb[d * H + h] = gb[h];
  }
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
    jobs[t].work = base->work ? base->work + t * base->Cx : NULL;
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

/* g_xh: scratch [M, dn]; g_hs: [U, dn] output (U rows of hs); tmp: scratch [M, H];
 * work: scratch [threads, dn + cx] (threads as passed, at most MAX_THREADS). */
void tgl_att_bwd(int64_t D, int64_t H, int64_t dn, int64_t cx, int64_t U, const int64_t *ptr,
                const float *qx, const float *hs, const int64_t *idx, const float *X,
                const float *mask, int act, float slope, const float *s, const float *alpha,
                const float *g_aggx, const float *g_asum, float *g_qx, float *g_qb, float *g_X,
                float *g_xh, float *g_hs, float *tmp, float *work, int threads) {
  job_t j;
  memset(&j, 0, sizeof j);
  j.D = D; j.H = H; j.dn = dn; j.cx = cx; j.Cx = dn + cx; j.U = U; j.ptr = ptr; j.qx = qx;
  j.hs = hs; j.idx = idx; j.X = X; j.mask = mask; j.act = act; j.slope = slope;
  j.s = (float *)s; j.alpha = (float *)alpha; j.g_aggx = g_aggx; j.g_asum = g_asum;
  j.g_qx = g_qx; j.g_qb = g_qb; j.g_X = g_X; j.g_xh = g_xh; j.g_hs = g_hs; j.tmp = tmp;
  j.work = work;
  run(&j, threads, bwd_range);
  if (dn) run(&j, threads, scatter_range);
}
