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
 * contraction), so both clones compute the same bits (an x86-64-v3 clone with fused
 * multiply-adds made the passes 2-5 % faster, not worth clones that differ in the last bit). */
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

static inline void axpy(float *y, float a, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

/* The per-destination passes. A destination's edges are few (the sampler's fanout) and all
 * of them read the destination's per-head rows (qx, and g_aggx backward), so the passes take
 * an edge input segment's columns in blocks of 8 (GCC / clang vectors) and keep those rows'
 * blocks, and the partial sums, in registers: heads two at a time, edges four at a time for
 * the scores. Every sum runs in a fixed order (edges in CSR order, columns blocked as
 * written), so the results do not depend on the number of threads. Where a destination's
 * head count is odd the last pass takes one head (its partner's terms are zeros). */
#if defined(__GNUC__)
#define TGL_INLINE static inline __attribute__((always_inline))
static inline float hsum8(v8 t) {
  return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}
static const v8 ZERO8 = {0};
#else
#define TGL_INLINE static inline
#endif

/* out[i * H + h0 + k] += sum over c < n of q[(h0 + k) * Cx + c] * rows[i][c], for i < NE
 * edges and the hb (1 or 2) heads from h0: one segment's part of the scores (forward, q the
 * query rows) or of d loss / d w (backward, q the rows of g_aggx) */
TGL_INLINE void seg_dots(float *restrict out, const int NE, int64_t H, int64_t h0, int hb,
                         const float *restrict q, int64_t Cx, const float *const *rows,
                         int64_t n) {
  const float *q0 = q + h0 * Cx, *q1 = q0 + (hb == 2 ? Cx : 0);
  const float s1 = hb == 2 ? 1.f : 0.f;
  int64_t c = 0;
  float r[4][2];
#if defined(__GNUC__)
  v8 a[4][2];
  for (int i = 0; i < NE; ++i) a[i][0] = a[i][1] = ZERO8;
  for (; c + 8 <= n; c += 8) {
    const v8 x0 = ld8(q0 + c), x1 = s1 * ld8(q1 + c);
    for (int i = 0; i < NE; ++i) {
      const v8 x = ld8(rows[i] + c);
      a[i][0] += x0 * x;
      a[i][1] += x1 * x;
    }
  }
  for (int i = 0; i < NE; ++i) { r[i][0] = hsum8(a[i][0]); r[i][1] = hsum8(a[i][1]); }
#else
  for (int i = 0; i < NE; ++i) r[i][0] = r[i][1] = 0.f;
#endif
  for (; c < n; ++c)
    for (int i = 0; i < NE; ++i) {
      r[i][0] += q0[c] * rows[i][c];
      r[i][1] += s1 * q1[c] * rows[i][c];
    }
  for (int i = 0; i < NE; ++i) {
    out[i * H + h0] += r[i][0];
    if (hb == 2) out[i * H + h0 + 1] += r[i][1];
  }
}

/* out[i * H + h] = sum over both segments of q[h] . x_e (e = lo + i) for the K edges of one
 * destination: (dn, hs rows pn) and (cx, X rows px) */
TGL_INLINE void edge_dots(float *restrict out, int64_t K, int64_t H, const float *q, int64_t Cx,
                      int64_t dn, int64_t cx, const float *const *pn, const float *const *px) {
  for (int64_t i = 0; i < K * H; ++i) out[i] = 0.f;
  for (int64_t h0 = 0; h0 < H; h0 += 2) {
    const int hb = H - h0 >= 2 ? 2 : 1;
    int64_t i = 0;
    for (; i + 4 <= K; i += 4) {
      if (dn) seg_dots(out + i * H, 4, H, h0, hb, q, Cx, pn + i, dn);
      if (cx) seg_dots(out + i * H, 4, H, h0, hb, q + dn, Cx, px + i, cx);
    }
    for (; i < K; ++i) {
      if (dn) seg_dots(out + i * H, 1, H, h0, hb, q, Cx, pn + i, dn);
      if (cx) seg_dots(out + i * H, 1, H, h0, hb, q + dn, Cx, px + i, cx);
    }
  }
}

/* out[h * Cx + c] = sum over edges i < K, in order, of w[i * H + h] rows[i][c] (c < n), for
 * every head h: one segment's part of aggx (forward) or of g_qx (backward) */
TGL_INLINE void seg_wsum(float *restrict out, int64_t H, int64_t Cx, int64_t K,
                     const float *restrict w, const float *const *rows, int64_t n) {
  for (int64_t h0 = 0; h0 < H; h0 += 2) {
    const int two = H - h0 >= 2;
    float *o0 = out + h0 * Cx, *o1 = o0 + Cx;
    int64_t c = 0;
#if defined(__GNUC__)
    for (; c + 16 <= n; c += 16) {
      v8 a0 = ZERO8, a1 = ZERO8, b0 = ZERO8, b1 = ZERO8;
      for (int64_t i = 0; i < K; ++i) {
        const float w0 = w[i * H + h0], w1 = two ? w[i * H + h0 + 1] : 0.f;
        const v8 x0 = ld8(rows[i] + c), x1 = ld8(rows[i] + c + 8);
        a0 += w0 * x0; a1 += w0 * x1;
        b0 += w1 * x0; b1 += w1 * x1;
      }
      st8(o0 + c, a0); st8(o0 + c + 8, a1);
      if (two) { st8(o1 + c, b0); st8(o1 + c + 8, b1); }
    }
    for (; c + 8 <= n; c += 8) {
      v8 a0 = ZERO8, b0 = ZERO8;
      for (int64_t i = 0; i < K; ++i) {
        const v8 x0 = ld8(rows[i] + c);
        a0 += w[i * H + h0] * x0;
        b0 += (two ? w[i * H + h0 + 1] : 0.f) * x0;
      }
      st8(o0 + c, a0);
      if (two) st8(o1 + c, b0);
    }
#endif
    for (; c < n; ++c) {
      float a0 = 0.f, b0 = 0.f;
      for (int64_t i = 0; i < K; ++i) {
        a0 += w[i * H + h0] * rows[i][c];
        b0 += (two ? w[i * H + h0 + 1] : 0.f) * rows[i][c];
      }
      o0[c] = a0;
      if (two) o1[c] = b0;
    }
  }
}

/* One segment's input-row gradients, for every edge i < K of a destination:
 *   gx[i][c] = sum over heads h, in order, of g[i, h] q[h, c] + am[i, h] ga[h, c]
 * (q, ga: the destination's qx and g_aggx rows at the segment's columns, head stride Cx),
 * written to gx[i] + c (gx NULL: not wanted). c < n. */
TGL_INLINE void seg_edge_grad(float *const *gx, int64_t H, int64_t Cx, int64_t K,
                          const float *restrict g, const float *restrict am,
                          const float *restrict q, const float *restrict ga, int64_t n) {
  if (!gx) return;
  for (int64_t h0 = 0; h0 < H; h0 += 2) {
    const int two = H - h0 >= 2, first = h0 == 0;
    const float *q0 = q + h0 * Cx, *q1 = two ? q0 + Cx : q0;
    const float *a0 = ga + h0 * Cx, *a1 = two ? a0 + Cx : a0;
    int64_t c = 0;
#if defined(__GNUC__)
    for (; c + 8 <= n; c += 8) {
      const v8 vq0 = ld8(q0 + c), va0 = ld8(a0 + c);
      const v8 vq1 = two ? ld8(q1 + c) : ZERO8, va1 = two ? ld8(a1 + c) : ZERO8;
      for (int64_t i = 0; i < K; ++i) {
        const float *gi = g + i * H + h0, *mi = am + i * H + h0;
        v8 v = gi[0] * vq0 + mi[0] * va0;
        if (two) v += gi[1] * vq1 + mi[1] * va1;
        if (!first) v += ld8(gx[i] + c);
        st8(gx[i] + c, v);
      }
    }
#endif
    for (; c < n; ++c)
      for (int64_t i = 0; i < K; ++i) {
        const float *gi = g + i * H + h0, *mi = am + i * H + h0;
        float v = gi[0] * q0[c] + mi[0] * a0[c];
        if (two) v += gi[1] * q1[c] + mi[1] * a1[c];
        gx[i][c] = first ? v : gx[i][c] + v;
      }
  }
}

/* per-thread scratch for one destination's edges (sized for the largest in-degree of the
 * thread's range): per edge and head weights w and am, the segments' row pointers, and
 * backward the gradient rows' pointers and the time part's gradient rows */
typedef struct { float *w, *am, *gt; const float **pn, **px; float **gn, **gxp, **gtp; } rows_t;

static int rows_alloc(rows_t *b, const job_t *j, int64_t td) {
  int64_t K = 1;
  for (int64_t d = j->d0; d < j->d1; ++d)
    if (j->ptr[d + 1] - j->ptr[d] > K) K = j->ptr[d + 1] - j->ptr[d];
  memset(b, 0, sizeof *b);
  b->w = malloc((size_t)(K * j->H) * sizeof(float));
  b->am = malloc((size_t)(K * j->H) * sizeof(float));
  b->gt = malloc((size_t)(K * (td > 0 ? td : 1)) * sizeof(float));
  b->pn = malloc((size_t)K * sizeof(float *));
  b->px = malloc((size_t)K * sizeof(float *));
  b->gn = malloc((size_t)K * sizeof(float *));
  b->gxp = malloc((size_t)K * sizeof(float *));
  b->gtp = malloc((size_t)K * sizeof(float *));
  return b->w && b->am && b->gt && b->pn && b->px && b->gn && b->gxp && b->gtp;
}
static void rows_free(rows_t *b) {
  free(b->w); free(b->am); free(b->gt); free((void *)b->pn); free((void *)b->px);
  free(b->gn); free(b->gxp); free(b->gtp);
}

static inline void rows_set(rows_t *b, const job_t *j, int64_t lo, int64_t hi) {
  for (int64_t e = lo; e < hi; ++e) {
    if (j->dn) b->pn[e - lo] = j->hs + j->idx[e] * j->dn;
    if (j->cx) b->px[e - lo] = j->X + e * j->cx;
  }
}

#define HMAX 16
/* Per destination: the scores (edge_dots), the softmax, then the weighted sums over both
 * segments (seg_wsum). */
TGL_CLONES static void fwd_range(const job_t *j) {
  const int64_t H = j->H, Cx = j->Cx, dn = j->dn, cx = j->cx;
  float mx[HMAX], sum[HMAX], as[HMAX];
  rows_t b;
  if (!rows_alloc(&b, j, 0)) abort();
  for (int64_t d = j->d0; d < j->d1; ++d) {
    const int64_t lo = j->ptr[d], hi = j->ptr[d + 1], K = hi - lo;
    const float *qd = j->qx + d * H * Cx;
    float *agg = j->aggx + d * H * Cx, *sc = j->s + lo * H, *al = j->alpha + lo * H;
    rows_set(&b, j, lo, hi);
    edge_dots(sc, K, H, qd, Cx, dn, cx, b.pn, b.px);
    for (int64_t h = 0; h < H; ++h) { mx[h] = -INFINITY; sum[h] = 0.f; as[h] = 0.f; }
    for (int64_t i = 0; i < K; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float s = sc[i * H + h] + (j->qb ? j->qb[d * H + h] : 0.f);
        sc[i * H + h] = s;
        const float z = (j->act && s < 0.f) ? j->slope * s : s;
        al[i * H + h] = z;
        if (z > mx[h]) mx[h] = z;
      }
    for (int64_t i = 0; i < K; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float a = expf(al[i * H + h] - mx[h]);
        al[i * H + h] = a;
        sum[h] += a;
      }
    for (int64_t h = 0; h < H; ++h) sum[h] = 1.f / sum[h];  /* only used when K > 0 */
    for (int64_t i = 0; i < K; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float a = al[i * H + h] * sum[h];
        const float w = j->mask ? a * j->mask[(lo + i) * H + h] : a;
        al[i * H + h] = a;
        b.w[i * H + h] = w;
        as[h] += w;
      }
    if (dn) seg_wsum(agg, H, Cx, K, b.w, b.pn, dn);
    if (cx) seg_wsum(agg + dn, H, Cx, K, b.w, b.px, cx);
    for (int64_t h = 0; h < H; ++h) j->asum[d * H + h] = as[h];
  }
  rows_free(&b);
}

/* Per destination: d loss / d w (edge_dots on g_aggx), the softmax's and LeakyReLU's
 * backward, then per segment g_qx (seg_wsum with the score gradients) and the edges'
 * input-row gradients (seg_edge_grad): the node part into g_xh, the own part into g_X,
 * or with the time encoding folded in, its columns into scratch rows whose te sums follow. */
TGL_CLONES static void bwd_range(const job_t *j) {
  const int64_t H = j->H, Cx = j->Cx, dn = j->dn, cx = j->cx;
  float dotag[HMAX], gb[HMAX];
  const int64_t td = j->te_part ? j->td : 0, tx = cx - td;  /* X's time columns: tx .. cx-1 */
  float *sums = td ? malloc((size_t)(2 * td) * sizeof(float)) : NULL;
  rows_t b;
  if (!rows_alloc(&b, j, td) || (td && !sums)) abort();
  for (int64_t d = j->d0; d < j->d1; ++d) {
    const int64_t lo = j->ptr[d], hi = j->ptr[d + 1], K = hi - lo;
    const float *gad = j->g_aggx + d * H * Cx;
    const float *qd = j->qx + d * H * Cx;
    float *gq = j->g_qx + d * H * Cx, *g = j->tmp + lo * H;
    const float *al = j->alpha + lo * H;
    rows_set(&b, j, lo, hi);
    /* d loss / d alpha (into tmp) and the softmax's sum_e alpha * that, per head */
    edge_dots(g, K, H, gad, Cx, dn, cx, b.pn, b.px);
    for (int64_t h = 0; h < H; ++h) { dotag[h] = 0.f; gb[h] = 0.f; }
    for (int64_t i = 0; i < K; ++i)
      for (int64_t h = 0; h < H; ++h) {
        const float m = j->mask ? j->mask[(lo + i) * H + h] : 1.f;
        const float ga = (g[i * H + h] + (j->g_asum ? j->g_asum[d * H + h] : 0.f)) * m;
        g[i * H + h] = ga;
        dotag[h] += al[i * H + h] * ga;
        b.am[i * H + h] = al[i * H + h] * m;
      }
    /* d loss / d score (into tmp, replacing d loss / d alpha) */
    for (int64_t i = 0; i < K; ++i)
      for (int64_t h = 0; h < H; ++h) {
        float gs = al[i * H + h] * (g[i * H + h] - dotag[h]);          /* softmax backward */
        if (j->act && j->s[(lo + i) * H + h] < 0.f) gs *= j->slope;  /* LeakyReLU backward */
        g[i * H + h] = gs;
        gb[h] += gs;
      }
    if (dn) {   /* g_qx over the node part; its rows' gradients into g_xh */
      for (int64_t i = 0; i < K; ++i) b.gn[i] = j->g_xh + (lo + i) * dn;
      seg_wsum(gq, H, Cx, K, g, b.pn, dn);
      seg_edge_grad(b.gn, H, Cx, K, g, b.am, qd, gad, dn);
    }
    if (cx) {
      seg_wsum(gq + dn, H, Cx, K, g, b.px, cx);
      if (td) {   /* only the time columns want a gradient: into scratch rows */
        for (int64_t i = 0; i < K; ++i) b.gtp[i] = b.gt + i * td;
        seg_edge_grad(b.gtp, H, Cx, K, g, b.am, qd + dn + tx, gad + dn + tx, td);
      } else if (j->g_X) {
        for (int64_t i = 0; i < K; ++i) b.gxp[i] = j->g_X + (lo + i) * cx;
        seg_edge_grad(b.gxp, H, Cx, K, g, b.am, qd + dn, gad + dn, cx);
      }
    }
    if (td) {   /* the time encoding's backward on the edges' rows, summed over them in order */
      float *restrict aw = sums, *restrict ab = sums + td;
      for (int64_t c = 0; c < 2 * td; ++c) sums[c] = 0.f;
      for (int64_t i = 0; i < K; ++i) {
        const float *restrict gx = b.gt + i * td, *restrict si = j->sinz + (lo + i) * td;
        const float t = j->dt[lo + i];
        for (int64_t c = 0; c < td; ++c) {
          const float gz = -gx[c] * si[c];
          aw[c] += gz * t;
          ab[c] += gz;
        }
      }
      memcpy(j->te_part + d * 2 * td, sums, (size_t)(2 * td) * sizeof(float));
    }
    if (j->g_qb) for (int64_t h = 0; h < H; ++h) j->g_qb[d * H + h] = gb[h];
  }
  free(sums);
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
