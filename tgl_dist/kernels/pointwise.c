/* Pointwise kernels of tgl_dist.nn: the cosine time encoding, dropout masks and the GRU
 * cell's gates. Plain C99 (+ OpenMP).
 *
 * Time encoding (TGAT / TGN / TGL), dt [M], w [d], b [d]:
 *     z[i, j] = dt[i] * w[j] + b[j]   (product and sum rounded separately, as torch's
 *                                      addmm(b, dt, w^T) computes it)
 *     out[i, j] = cos(z[i, j])
 * Backward with g [M, d]: gz = -g * sin(z); gw[j] = sum_i gz[i, j] dt[i];
 * gb[j] = sum_i gz[i, j]; gdt[i] = sum_j gz[i, j] w[j] (optional). The forward stores
 * sin(z) [M, d] beside cos(z) when a gradient is wanted (both polynomials are evaluated
 * anyway, see below), so the backward is one pass over memory. Sums in float within a
 * block of ROWS rows, in double across blocks, in a fixed order (deterministic, and
 * independent of the number of threads).
 *
 * cos and sin: z is reduced by pi/2 in double, z = r + k pi/2 with |r| <= pi/4 (Cody-Waite,
 * pi/2 split in two parts, the first with 21 significant bits so k P1 is exact for
 * |k| < 2^32: r is exact to ~3e-13 for |z| up to ~6e9); r is rounded
 * to float and cos r, sin r come from their Taylor polynomials in float (to r^12 and
 * r^9: truncation below 2e-9 on |r| <= pi/4), picked and signed by k mod 4. The result
 * is within ~1.5 units in the last place of the exact value for the float z (<= 9e-8;
 * torch's own float cos is within one unit, and its slow path for |z| > ~1e4 costs
 * several times more). Reduction in double, polynomials in float. The loops are
 * branch-free so the compiler vectorises them; on x86-64 with GCC, AVX-512F and AVX2 clones
 * are built beside the generic one and the best the CPU has is picked at load time (the
 * AVX-512F clone encodes 4624 x 100 time encodings in 0.51 ms on one thread against the AVX2
 * clone's 0.64 ms). -std=c99 keeps products and sums separate (no FMA contraction), so every
 * clone computes the same bits (checked on the time encoding's outputs and gradients).
 *
 * Dropout mask: out[i] = scale when u_i >= p else 0, u_i uniform in [0, 1) from a
 * counter-based hash (splitmix64) of (seed, i): any order, no state, ~1 ns an element
 * against ~5-8 ns for torch's CPU bernoulli_.
 */
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include "abi.h"

#include "blas.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TGL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TGL_CLONES
#endif


static const double INV_PIO2 = 0.6366197723675814;
/* pi/2 = P1 + P2 (+ ~6e-30), P1 with 21 significant bits: k P1 is exact for |k| < 2^32 */
static const double PIO2_1 = 1.570796012878418;
static const double PIO2_2 = 3.139164786504813e-07;
static const double ROUND = 6755399441055744.0;          /* 1.5 * 2^52: x + R - R = rint(x) */

/* z = dt * w + b rounded as torch's elementwise ops round it (torch's addmm too on some CPUs;
 * others fuse it into one FMA, at most one unit of z away): the float product, then the float
 * sum (the double sum of two floats rounded once to float: the same value; and no
 * compiler fuses a float product with a double sum into one FMA) */
static inline float affine(float t, float w, float b) {
  return (float)((double)(t * w) + (double)b);
}

/* z = r + k pi/2, |r| <= pi/4 (r rounded to float; the rounding of k P2, below 3e-13, does
 * not reach it); q = k mod 4 as a float in {-2, -1, 0, 1, 2} */
static inline float reduced(float z, float *q) {
  const double x = (double)z;
  const double k = (x * INV_PIO2 + ROUND) - ROUND;
  *q = (float)(k - 4.0 * ((k * 0.25 + ROUND) - ROUND));
  return (float)((x - k * PIO2_1) - k * PIO2_2);
}

static inline float sin_poly(float r, float r2) {  /* sin r, |r| <= pi/4 */
  return r + r * r2 * (-1.66666667e-1f + r2 * (8.33333333e-3f + r2 * (-1.98412698e-4f
         + r2 * 2.75573192e-6f)));
}
static inline float cos_poly(float r2) {           /* cos r, |r| <= pi/4 */
  return 1.0f + r2 * (-0.5f + r2 * (4.16666667e-2f + r2 * (-1.38888889e-3f
         + r2 * (2.48015873e-5f + r2 * -2.75573192e-7f))));
}
/* cos(r + k pi/2) = cos r, -sin r, -cos r, sin r for k = 0, 1, 2, 3 (mod 4) */
static inline float cos_q(float r, float q) {
  const float r2 = r * r, a = q < 0.0f ? -q : q;
  return a == 1.0f ? -q * sin_poly(r, r2) : (1.0f - a) * cos_poly(r2);
}
/* sin(r + k pi/2) = sin r, cos r, -sin r, -cos r */
static inline float sin_q(float r, float q) {
  const float r2 = r * r, a = q < 0.0f ? -q : q;
  return a == 1.0f ? q * cos_poly(r2) : (1.0f - a) * sin_poly(r, r2);
}

/* Rows are processed in blocks of ROWS; with OpenMP (when built with it; the workers are
 * torch's own, the same libgomp being loaded once per process) blocks are shared among
 * `threads` workers. Every sum runs in an order fixed by the block size alone, so results
 * do not depend on the number of threads. */
#define ROWS 64
#define ENC_CHUNK 128  /* time-encoding columns per inner pass */

static int64_t nblocks(int64_t M) { return (M + ROWS - 1) / ROWS; }

TGL_CLONES
static void enc_fwd_rows(int64_t i0, int64_t i1, int64_t d, const float *restrict dt,
                         const float *restrict w, const float *restrict b, float *restrict out,
                         int64_t ld, float *restrict sin_out) {
  /* the reduction, then the polynomials, in separate short loops over a chunk of a row:
   * one loop doing both is a long chain of dependent operations per element, and its
   * iterations barely overlap (every element's arithmetic is unchanged) */
  float r[ENC_CHUNK], q[ENC_CHUNK];
  for (int64_t i = i0; i < i1; ++i) {
    const float t = dt[i];
    for (int64_t j0 = 0; j0 < d; j0 += ENC_CHUNK) {
      const int64_t n = d - j0 < ENC_CHUNK ? d - j0 : ENC_CHUNK;
      const float *wj = w + j0, *bj = b + j0;
      float *o = out + i * ld + j0;
      for (int64_t j = 0; j < n; ++j) r[j] = reduced(affine(t, wj[j], bj[j]), &q[j]);
      if (sin_out) {
        float *so = sin_out + i * d + j0;
        for (int64_t j = 0; j < n; ++j) { o[j] = cos_q(r[j], q[j]); so[j] = sin_q(r[j], q[j]); }
      } else {
        for (int64_t j = 0; j < n; ++j) o[j] = cos_q(r[j], q[j]);
      }
    }
  }
}

/* out: row i at out + i * ld (ld >= d: the encoding may fill the last d columns of a wider
 * row, e.g. beside the edge features); sin_out: [M, d] sin z for the backward, or NULL */
void tgl_time_enc_fwd(int64_t M, int64_t d, const float *dt, const float *w, const float *b,
                      float *out, int64_t ld, float *sin_out, int threads) {
  const int64_t nb = nblocks(M);
  int64_t k;
#pragma omp parallel for num_threads(workers(threads, M * d, nb)) schedule(static)
  for (k = 0; k < nb; ++k)
    enc_fwd_rows(k * ROWS, k * ROWS + ROWS < M ? k * ROWS + ROWS : M, d, dt, w, b, out, ld,
                 sin_out);
}

/* block k's sums into acc [2 d] (w then b; float within the block, ROWS rows), gdt of its
 * rows; sw: [2 d] float scratch, gz: [d] float scratch */
TGL_CLONES
static void enc_bwd_rows(int64_t i0, int64_t i1, int64_t d, const float *restrict dt,
                         const float *restrict w, const float *restrict sinz,
                         const float *restrict g, int64_t ld, float *restrict gdt,
                         double *restrict acc, float *restrict sw, float *restrict gz) {
  float *restrict aw = sw, *restrict ab = sw + d;
  for (int64_t j = 0; j < 2 * d; ++j) sw[j] = 0.0f;
  for (int64_t i = i0; i < i1; ++i) {
    const float t = dt[i];
    const float *gi = g + i * ld, *si = sinz + i * d;
    for (int64_t j = 0; j < d; ++j) {
      gz[j] = -gi[j] * si[j];
      aw[j] += gz[j] * t;
      ab[j] += gz[j];
    }
    if (gdt) {
      float s = 0.0f;
      for (int64_t j = 0; j < d; ++j) s += gz[j] * w[j];
      gdt[i] = s;
    }
  }
  for (int64_t j = 0; j < 2 * d; ++j) acc[j] = (double)sw[j];
}

/* gw, gb: [d] (written); gdt: [M] or NULL; acc: double scratch of
 * tgl_time_enc_bwd_scratch(M, d) elements. */
int64_t tgl_time_enc_bwd_scratch(int64_t M, int64_t d) { return nblocks(M) * 4 * d; }

/* sinz: [M, d] from the forward; g: row i at g + i * ld */
void tgl_time_enc_bwd(int64_t M, int64_t d, const float *dt, const float *w, const float *sinz,
                      const float *g, int64_t ld, float *gw, float *gb, float *gdt, double *acc,
                      int threads) {
  const int64_t nb = nblocks(M);
  int64_t k;
#pragma omp parallel for num_threads(workers(threads, M * d, nb)) schedule(static)
  for (k = 0; k < nb; ++k)
    enc_bwd_rows(k * ROWS, k * ROWS + ROWS < M ? k * ROWS + ROWS : M, d, dt, w, sinz, g, ld,
                 gdt, acc + k * 4 * d, (float *)(acc + k * 4 * d + 2 * d),
                 (float *)(acc + k * 4 * d + 3 * d));
  for (int64_t j = 0; j < d; ++j) {   /* the blocks' sums, in block order */
    double sw = 0.0, sb = 0.0;
    for (k = 0; k < nb; ++k) {
      sw += acc[k * 4 * d + j];
      sb += acc[k * 4 * d + d + j];
    }
    gw[j] = (float)sw;
    gb[j] = (float)sb;
  }
}

/* ---- GRU gates (torch.nn.GRUCell's formula) on the two products gi = W_ih x + b_ih and
 * gh = W_hh h + b_hh, both [U, 3H] laid out (r | z | n):
 *     r = sigmoid(gi_r + gh_r), z = sigmoid(gi_z + gh_z), n = tanh(gi_n + r gh_n)
 *     h' = n + z (h - n)
 * With rz_in_gi the caller has summed the r and z parts already (gi_r + gh_r, gi_z + gh_z
 * in gi) and gh holds only gh_n: the cell whose input starts with h itself computes those
 * sums in one product (tgl_dist/nn/_pointwise.py, GRUCell).
 * exp is evaluated branch-free so the loops vectorise: e^x = 2^k e^f, k = rint(x / ln 2),
 * f = x - k ln 2 (ln 2 in two parts), e^f by its Taylor polynomial to f^7 (|f| <= 0.347:
 * relative error < 2e-8 before float rounding); x is clamped to [-87, 88] (e^x then stays
 * a normal float). sigmoid(x) = 1 / (1 + e^-x), tanh(x) = 1 - 2 / (e^2x + 1); both within
 * ~2e-7 of torch's (absolute), tested. */
static inline float exp_f(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float k = (x * 1.44269504f + 12582912.0f) - 12582912.0f;   /* rint(x / ln 2) */
  const float f = (x - k * 0.693145752f) - k * 1.42860677e-06f;      /* ln 2 = hi + lo */
  const float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.66666667e-1f + f * (4.16666667e-2f
                  + f * (8.33333333e-3f + f * (1.38888889e-3f + f * 1.98412698e-4f))))));
  union { int32_t i; float f; } scale;                                /* 2^k */
  scale.i = ((int32_t)k + 127) << 23;
  return p * scale.f;
}
static inline float sigmoid_f(float x) { return 1.0f / (1.0f + exp_f(-x)); }
static inline float tanh_f(float x) { return 1.0f - 2.0f / (exp_f(2.0f * x) + 1.0f); }

TGL_CLONES
static void gru_fwd_rows(int64_t i0, int64_t i1, int64_t H, const float *restrict gi,
                         int64_t ldi, const float *restrict gh, int64_t ldh, int rz_in_gi,
                         const float *restrict h, float *restrict out, float *restrict saved) {
  /* rz_in_gi: gi's r and z parts already hold the hidden-to-hidden terms and a row of gh
   * is only the H-wide n part (row stride ldh) */
  const int64_t bn = rz_in_gi ? 0 : 2 * H;
  for (int64_t i = i0; i < i1; ++i) {
    const float *a = gi + i * ldi, *b = gh + i * ldh, *hi = h + i * H;
    float *o = out + i * H, *sv = saved + i * 3 * H;
    /* short loops, one function each: an iteration of one long loop (sigmoid, then
     * tanh on its result) is a chain of ~40 dependent operations, and successive
     * iterations barely overlap (one thread, 800 x 100: 350 us in one loop, 273 us
     * this way; every element's arithmetic is unchanged) */
    if (rz_in_gi) {
      for (int64_t j = 0; j < 2 * H; ++j) sv[j] = sigmoid_f(a[j]);
    } else {
      for (int64_t j = 0; j < 2 * H; ++j) sv[j] = sigmoid_f(a[j] + b[j]);
    }
    for (int64_t j = 0; j < H; ++j) {
      const float n = tanh_f(a[2 * H + j] + sv[j] * b[bn + j]);
      sv[2 * H + j] = n;
      o[j] = n + sv[H + j] * (hi[j] - n);
    }
  }
}

/* one hidden unit of the cell counted as this many elements when choosing the workers
 * (three exps and ~11 floats read or written, against one cosine) */
#define GRU_COST 8

/* out: [U, H]; saved: [U, 3H] (r, z, n for the backward); gh: rows of ldh floats, [r|z|n]
 * parts (3H) or, with rz_in_gi, the n part only (H) */
void tgl_gru_fwd(int64_t U, int64_t H, const float *gi, const float *gh, int64_t ldh,
                 int rz_in_gi, const float *h, float *out, float *saved, int threads) {
  const int64_t nb = nblocks(U);
  int64_t k;
#pragma omp parallel for num_threads(workers(threads, U * H * GRU_COST, nb)) schedule(static)
  for (k = 0; k < nb; ++k)
    gru_fwd_rows(k * ROWS, k * ROWS + ROWS < U ? k * ROWS + ROWS : U, H, gi, 3 * H, gh, ldh,
                 rz_in_gi, h, out, saved);
}

TGL_CLONES
static void gru_bwd_rows(int64_t i0, int64_t i1, int64_t H, const float *restrict go,
                         const float *restrict gh, int64_t ldh, int rz_in_gi,
                         const float *restrict h, const float *restrict saved,
                         float *restrict g_gi, int64_t ldg, float *restrict g_gh,
                         float *restrict g_h) {
  /* rz_in_gi: the n part of g_gh goes to columns 3H..4H-1 of g_gi's rows (one [U, 4H]
   * buffer [g_gi || g_gh_n]); g_gh is unused */
  const int64_t bn = rz_in_gi ? 0 : 2 * H;
  for (int64_t i = i0; i < i1; ++i) {
    const float *g = go + i * H, *b = gh + i * ldh, *hi = h + i * H;
    const float *r = saved + i * 3 * H, *z = r + H, *n = r + 2 * H;
    float *ga = g_gi + i * ldg;
    float *gb = rz_in_gi ? ga + 3 * H : g_gh + i * 3 * H;
    for (int64_t j = 0; j < H; ++j) {
      const float dn = g[j] * (1.0f - z[j]) * (1.0f - n[j] * n[j]);   /* through tanh */
      const float dz = g[j] * (hi[j] - n[j]) * z[j] * (1.0f - z[j]);
      const float dr = dn * b[bn + j] * r[j] * (1.0f - r[j]);
      ga[j] = dr;
      ga[H + j] = dz;
      ga[2 * H + j] = dn;
    }
    /* g_gh (outside the loop above: a branch inside it keeps GCC from vectorising it) */
    if (rz_in_gi) {
      for (int64_t j = 0; j < H; ++j) gb[j] = ga[2 * H + j] * r[j];
    } else {
      for (int64_t j = 0; j < H; ++j) {
        gb[j] = ga[j]; gb[H + j] = ga[H + j]; gb[2 * H + j] = ga[2 * H + j] * r[j];
      }
    }
    if (g_h)
      for (int64_t j = 0; j < H; ++j) g_h[i * H + j] = g[j] * z[j];
  }
}

/* g_gi: [U, 3H] (with rz_in_gi: [U, 4H] = [g_gi || g_gh_n], g_gh unused); g_gh: [U, 3H];
 * g_h: [U, H] or NULL */
void tgl_gru_bwd(int64_t U, int64_t H, const float *go, const float *gh, int64_t ldh,
                 int rz_in_gi, const float *h, const float *saved, float *g_gi, float *g_gh,
                 float *g_h, int threads) {
  const int64_t nb = nblocks(U), ldg = rz_in_gi ? 4 * H : 3 * H;
  int64_t k;
#pragma omp parallel for num_threads(workers(threads, U * H * GRU_COST, nb)) schedule(static)
  for (k = 0; k < nb; ++k)
    gru_bwd_rows(k * ROWS, k * ROWS + ROWS < U ? k * ROWS + ROWS : U, H, go, gh, ldh, rz_in_gi,
                 h, saved, g_gi, ldg, g_gh, g_h);
}

/* 1 when every row i < U of a (row stride lda) equals that of b (row stride ldb) in its
 * first w columns (float ==: torch.equal's test), else 0; the rows in order, stopping at
 * the first difference */
int tgl_rows_equal(int64_t U, int64_t w, const float *a, int64_t lda, const float *b,
                   int64_t ldb) {
  for (int64_t i = 0; i < U; ++i) {
    const float *x = a + i * lda, *y = b + i * ldb;
    int same = 1;
    for (int64_t t = 0; t < w; ++t) same &= x[t] == y[t];
    if (!same) return 0;
  }
  return 1;
}

/* ------------------------------------------------------------------------------------
 * TGN's GRU cell (tgl_dist.nn._pointwise.GRUCell with own_state: the input is
 * [h || x0 || x1]) as one call each way: its products through the sgemm_ torch's own CPU
 * products call (set once with tgl_pw_set_sgemm; gemm from blas.h, as the attention
 * kernel's), the gate passes above, and the small operations (the input's concatenation,
 * the summed r/z weights, bias sums) as loops.
 * ------------------------------------------------------------------------------------ */
int tgl_pw_set_sgemm(void *fn) { SGEMM = (sgemm_fn)fn; return SGEMM != NULL; }
int tgl_pw_gemm_check(void) { return gemm_check(); }

/* Forward: x0 [U, F0] (row stride ld0), x1 [U, F1], h [U, H]; W_ih [3H, H + F], W_hh
 * [3H, H], b_ih, b_hh [3H] (F = F0 + F1). Writes x = [x0 || x1] [U, F], w_own [4H, H]
 * (rows [W_ih,rz^h + W_hh,rz | W_ih,n^h | W_hh,n]), hh [U, 4H] (h's products; its first
 * 3H columns end up holding gi, the last H the n part of W_hh h + b_hh), out [U, H] and
 * saved [U, 3H] (r, z, n). Returns 0, or -2 without a BLAS. */
int tgl_gru_cell_fwd(int64_t U, int64_t H, int64_t F0, int64_t F1, const float *x0,
                     int64_t ld0, const float *x1, const float *h, const float *w_ih,
                     const float *w_hh, const float *b_ih, const float *b_hh, float *x,
                     float *w_own, float *hh, float *out, float *saved, int threads) {
  if (!SGEMM) return -2;
  const int64_t F = F0 + F1, li = H + F;
  float *b_own = malloc((size_t)(4 * H) * sizeof(float));
  if (!b_own) abort();
  for (int64_t o = 0; o < 3 * H; ++o) {
    const float *wi = w_ih + o * li;
    float *wo = w_own + o * H;
    if (o < 2 * H) {
      for (int64_t t = 0; t < H; ++t) wo[t] = wi[t] + w_hh[o * H + t];
      b_own[o] = b_ih[o] + b_hh[o];
    } else {
      memcpy(wo, wi, (size_t)H * sizeof(float));
      b_own[o] = b_ih[o];
    }
  }
  memcpy(w_own + 3 * H * H, w_hh + 2 * H * H, (size_t)(H * H) * sizeof(float));
  memcpy(b_own + 3 * H, b_hh + 2 * H, (size_t)H * sizeof(float));
  const int64_t nb = nblocks(U);
  int64_t k;
  /* the input rows [x0 || x1] and the biases under the products, rows on the workers */
#pragma omp parallel for num_threads(workers(threads, U * (F + 4 * H), nb)) schedule(static)
  for (k = 0; k < nb; ++k)
    for (int64_t i = k * ROWS; i < U && i < k * ROWS + ROWS; ++i) {
      memcpy(x + i * F, x0 + i * ld0, (size_t)F0 * sizeof(float));
      if (x1) memcpy(x + i * F + F0, x1 + i * F1, (size_t)F1 * sizeof(float));
      memcpy(hh + i * 4 * H, b_own, (size_t)(4 * H) * sizeof(float));
    }
  free(b_own);
  gemm(0, 1, U, 4 * H, H, h, H, w_own, H, 1.f, hh, 4 * H);        /* [rz | i_n | h_n] of h */
  gemm(0, 1, U, 3 * H, F, x, F, w_ih + H, li, 1.f, hh, 4 * H);    /* + the input's: gi */
#pragma omp parallel for num_threads(workers(threads, U * H * GRU_COST, nb)) schedule(static)
  for (k = 0; k < nb; ++k)
    gru_fwd_rows(k * ROWS, k * ROWS + ROWS < U ? k * ROWS + ROWS : U, H, hh, 4 * H, hh + 3 * H,
                 4 * H, 1, h, out, saved);
  return 0;
}

/* tgl_gru_cell_fwd with the time input x1 = cos(dt w + b) (the cosine time encoding of
 * dt [U] with w, b [F1]) written straight into x's last F1 columns (tgl_time_enc_fwd);
 * sinz [U, F1]: its sin for the backward, or NULL. */
int tgl_gru_time_cell_fwd(int64_t U, int64_t H, int64_t F0, int64_t F1, const float *x0,
                          int64_t ld0, const float *dt, const float *te_w, const float *te_b,
                          float *sinz, const float *h, const float *w_ih, const float *w_hh,
                          const float *b_ih, const float *b_hh, float *x, float *w_own,
                          float *hh, float *out, float *saved, int threads) {
  if (!SGEMM) return -2;
  tgl_time_enc_fwd(U, F1, dt, te_w, te_b, x + F0, F0 + F1, sinz, threads);
  return tgl_gru_cell_fwd(U, H, F0, F1, x0, ld0, NULL, h, w_ih, w_hh, b_ih, b_hh, x, w_own,
                          hh, out, saved, threads);
}

/* Backward from go [U, H] and the forward's x, h, hh, saved, W_ih, w_own. Writes (each
 * when not NULL) g_h [U, H], g_x0 [U, F0], g_x1 [U, F1], g_wih [3H, H + F], g_whh
 * [3H, H], g_bih, g_bhh [3H]; g_all: scratch [U, 4H]. Returns 0, or -2 without a BLAS. */
int tgl_gru_cell_bwd(int64_t U, int64_t H, int64_t F0, int64_t F1, const float *go,
                     const float *x, const float *h, const float *hh, const float *saved,
                     const float *w_ih, const float *w_own, float *g_h, float *g_x0,
                     float *g_x1, float *g_wih, float *g_whh, float *g_bih, float *g_bhh,
                     float *g_all, int threads) {
  if (!SGEMM) return -2;
  const int64_t F = F0 + F1, li = H + F, l4 = 4 * H;
  tgl_gru_bwd(U, H, go, hh + 3 * H, l4, 1, h, saved, g_all, NULL, g_h, threads);
  if (g_h) gemm(0, 0, U, H, l4, g_all, l4, w_own, H, 1.f, g_h, H);
  if (g_wih || g_whh) {   /* dW_ih^h [3H, H] (r and z rows shared with W_hh), then x's part */
    float *gs = g_wih ? g_wih : malloc((size_t)(3 * H * H) * sizeof(float));
    const int64_t ls = g_wih ? li : H;
    if (!gs) abort();
    gemm(1, 0, 3 * H, H, U, g_all, l4, h, H, 0.f, gs, ls);
    if (g_wih) gemm(1, 0, 3 * H, F, U, g_all, l4, x, F, 0.f, g_wih + H, li);
    if (g_whh) {
      for (int64_t o = 0; o < 2 * H; ++o) memcpy(g_whh + o * H, gs + o * ls, (size_t)H * sizeof(float));
      gemm(1, 0, H, H, U, g_all + 3 * H, l4, h, H, 0.f, g_whh + 2 * H * H, H);
    }
    if (!g_wih) free(gs);
  }
  if (g_bih || g_bhh) {   /* column sums over the rows in order, by columns (blas.h) */
    float *gb = malloc((size_t)l4 * sizeof(float));
    if (!gb) abort();
    col_sums(gb, g_all, U, l4, l4, threads);
    if (g_bih) memcpy(g_bih, gb, (size_t)(3 * H) * sizeof(float));
    if (g_bhh) {
      memcpy(g_bhh, gb, (size_t)(2 * H) * sizeof(float));
      memcpy(g_bhh + 2 * H, gb + 3 * H, (size_t)H * sizeof(float));
    }
    free(gb);
  }
  if (g_x0) gemm(0, 0, U, F0, 3 * H, g_all, l4, w_ih + H, li, 0.f, g_x0, F0);
  if (g_x1) gemm(0, 0, U, F1, 3 * H, g_all, l4, w_ih + H + F0, li, 0.f, g_x1, F1);
  return 0;
}

/* Backward of tgl_gru_time_cell_fwd: tgl_gru_cell_bwd, then (g_tw not NULL) the time
 * encoding's w and b gradients g_tw, g_tb [F1] from the time input's gradient (written
 * to the scratch g_x1 [U, F1]) and sinz (tgl_time_enc_bwd; acc: its double scratch). */
int tgl_gru_time_cell_bwd(int64_t U, int64_t H, int64_t F0, int64_t F1, const float *go,
                          const float *x, const float *h, const float *hh, const float *saved,
                          const float *w_ih, const float *w_own, const float *dt,
                          const float *te_w, const float *sinz, float *g_h, float *g_x0,
                          float *g_x1, float *g_wih, float *g_whh, float *g_bih, float *g_bhh,
                          float *g_tw, float *g_tb, double *acc, float *g_all, int threads) {
  const int rc = tgl_gru_cell_bwd(U, H, F0, F1, go, x, h, hh, saved, w_ih, w_own, g_h, g_x0,
                                  g_tw ? g_x1 : NULL, g_wih, g_whh, g_bih, g_bhh, g_all, threads);
  if (rc != 0) return rc;
  if (g_tw) tgl_time_enc_bwd(U, F1, dt, te_w, sinz, g_x1, F1, g_tw, g_tb, NULL, acc, threads);
  return 0;
}

static inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* out[i] = scale if uniform(seed, i) >= p else 0 (p in [0, 1)). */
TGL_CLONES
static void mask_range(int64_t i0, int64_t i1, uint64_t thresh, float scale, uint64_t base,
                       float *out) {
  for (int64_t i = i0; i < i1; ++i) {
    const uint64_t u = splitmix64(base + (uint64_t)i) >> 40;  /* 24 uniform bits */
    out[i] = u >= thresh ? scale : 0.0f;
  }
}

void tgl_dropout_mask(int64_t n, float p, float scale, uint64_t seed, float *out, int threads) {
  const uint64_t thresh = (uint64_t)((double)p * 16777216.0);  /* p in units of 2^-24 */
  const uint64_t base = splitmix64(seed);
  const int64_t chunk = 16384, nb = (n + chunk - 1) / chunk;
  int64_t k;
#pragma omp parallel for num_threads(workers(threads, n, nb)) schedule(static)
  for (k = 0; k < nb; ++k)
    mask_range(k * chunk, k * chunk + chunk < n ? k * chunk + chunk : n, thresh, scale, base, out);
}
