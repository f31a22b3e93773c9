/* torch's own BLAS for the model kernels' whole-node calls (attention.c, pointwise.c),
 * and how their loops are shared among threads.
 *
 * The kernel library is handed the address of the Fortran sgemm_ libtorch_cpu exports
 * (tgl_dist/kernels/runtime.py: set_blas), the one torch's own CPU products call, and
 * checks it on a small product (gemm_check) before any node uses it. Included by each
 * kernel source (the build cache hashes included local headers with the source).
 */
#ifndef TGL_BLAS_H
#define TGL_BLAS_H
#include <stdint.h>

typedef void (*sgemm_fn)(const char *, const char *, const int *, const int *, const int *,
                         const float *, const float *, const int *, const float *, const int *,
                         const float *, float *, const int *);
static sgemm_fn SGEMM = 0;

/* row-major C [m, n] = op(A) op(B) + beta C, op(A) [m, k], op(B) [k, n]; ta = 0: A is
 * stored [m, k] (row stride lda), ta = 1: A is stored [k, m] (op = transpose); same for B.
 * A row-major matrix is the column-major transpose, so this is the column-major
 * C^T = op(B)^T op(A)^T: the call torch's own row-major products make. */
static void gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  const char ca = ta ? 'T' : 'N', cb = tb ? 'T' : 'N';
  const int M = (int)n, N = (int)m, K = (int)k, la = (int)ldb, lb = (int)lda, lc = (int)ldc;
  const float one = 1.f;
  SGEMM(&cb, &ca, &M, &N, &K, &one, B, &la, A, &lb, &beta, C, &lc);
}

/* workers for a loop over n elements in `blocks` independent blocks: one below ~32k
 * elements (a parallel region costs a few microseconds), at most one per block */
static int workers(int threads, int64_t n, int64_t blocks) {
  int t = threads < 1 ? 1 : threads;
  if (n < 32768) t = 1;
  return t > blocks ? (int)(blocks > 0 ? blocks : 1) : t;
}

/* Column loops of both kernels (sums over rows, scatters of rows that may hit a row twice)
 * are split by columns, in blocks of 8: each column still runs over the rows in order, so
 * the result does not depend on the number of workers. col_workers: workers for n rows of
 * w columns; col_share: worker k's columns [t0, t1) among nw. */
static int col_workers(int threads, int64_t n, int64_t w) {
  return workers(threads, n * w, (w + 7) / 8);
}
static void col_share(int64_t w, int k, int nw, int64_t *t0, int64_t *t1) {
  const int64_t nb = (w + 7) / 8;
  *t0 = 8 * (nb * k / nw);
  *t1 = 8 * (nb * (k + 1) / nw);
  if (*t0 > w) *t0 = w;
  if (*t1 > w) *t1 = w;
}

/* out[t] = sum over rows i (in order) of a[i * lda + t] (w columns), float, by columns */
static void col_sums(float *restrict out, const float *restrict a, int64_t n, int64_t w,
                     int64_t lda, int threads) {
  const int nw = col_workers(threads, n, w);
  int k;
#pragma omp parallel for num_threads(nw) schedule(static)
  for (k = 0; k < nw; ++k) {
    int64_t t0, t1;
    col_share(w, k, nw, &t0, &t1);
    for (int64_t t = t0; t < t1; ++t) out[t] = 0.f;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t t = t0; t < t1; ++t) out[t] += a[i * lda + t];
  }
}

/* 1 when gemm computes a 2 x 3 by 3 x 2 product right in all four transpose cases */
static int gemm_check(void) {
  if (!SGEMM) return 0;
  const float a[6] = {1, 2, 3, 4, 5, 6}, at[6] = {1, 4, 2, 5, 3, 6};      /* A [2, 3], A^T */
  const float b[6] = {7, 8, 9, 10, 11, 12}, bt[6] = {7, 9, 11, 8, 10, 12}; /* B [3, 2], B^T */
  const float want[4] = {58, 64, 139, 154};
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      float out[4] = {1, 1, 1, 1};
      gemm(ta, tb, 2, 2, 3, ta ? at : a, ta ? 2 : 3, tb ? bt : b, tb ? 3 : 2, 0.f, out, 2);
      for (int i = 0; i < 4; ++i)
        if (out[i] != want[i]) return 0;
    }
  return 1;
}
#endif
