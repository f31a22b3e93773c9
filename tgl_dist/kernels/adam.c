/* One Adam step over many float32 tensors in ONE pass: the kernel of tgl_dist.optim.Adam.
 * Plain C99 (+ OpenMP).
 *
 * For each tensor k (numel n_k) with a gradient, as torch.optim.Adam (amsgrad and maximize
 * off, weight decay added to the gradient) and in the order of operations of torch's fused
 * CPU kernel (ATen's FusedAdamKernel.cpp):
 *     step_k += 1 (float); bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (double)
 *     g = grad + param * wd                             (when wd != 0)
 *     m = m + (1 - beta1) * (g - m)                      (exp_avg.lerp_(g, 1 - beta1))
 *     v = v * beta2 + (1 - beta2) * g * g
 *     param = param + (-lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 * The scalars are computed in double and rounded to float, as torch does. torch's x86-64
 * build contracts products and sums into fused multiply-adds (GCC's default), differently
 * in its vector body (the first n_k - n_k % vec elements, vectors of `vec` = 8 floats with
 * both its AVX2 and its AVX-512 kernels) and its scalar tail:
 *     both: g = fma(param, wd, grad), m = fma(1 - beta1, g - m, m)
 *     body: v = fma((1 - beta2) g, g, v beta2)
 *     tail: v = fma(v, beta2, (1 - beta2) g g)
 * This kernel does the same (`fused` = 0: no contraction anywhere), which gives the same
 * bits as torch.optim.Adam(fused=True) with torch's AVX2 and AVX-512 kernels (checked by
 * tests/optim/test_adam.py); elsewhere the results are within float rounding of torch's.
 *
 * Why: torch's fused Adam launches one parallel loop per tensor and its Python wrapper
 * loops over the tensors too; for TGN's 22 small tensors (222k floats) that takes
 * ~260 us of a ~10 ms step, this pass ~100 us.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "abi.h"

#define CHUNK 4096 /* floats per work item (a multiple of every vector width) */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TGL_CLONES __attribute__((target_clones("avx512f", "fma", "default")))
#else
#define TGL_CLONES
#endif


typedef struct {
  float b2, c1, c2, wd, step_size, bc2_sqrt, eps;
} consts_t;

/* elements i0 .. i1-1 of one tensor; those below `nvec` as torch's vector loop, the rest
 * as its scalar tail */
TGL_CLONES
static void adam_range(int64_t i0, int64_t i1, int64_t nvec, int fused, float *restrict p,
                       const float *restrict g, float *restrict m, float *restrict v,
                       const consts_t *k) {
  const float b2 = k->b2, c1 = k->c1, c2 = k->c2, wd = k->wd, eps = k->eps;
  const float nss = -k->step_size, ss = k->step_size, bs = k->bc2_sqrt;
  const int64_t iv = i1 < nvec ? i1 : nvec;
  int64_t i = i0;
  if (fused) {
    for (; i < iv; ++i) {   /* torch's vector body */
      const float gi = wd != 0.0f ? fmaf(p[i], wd, g[i]) : g[i];
      const float mi = fmaf(c1, gi - m[i], m[i]);
      const float vi = fmaf(c2 * gi, gi, v[i] * b2);
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] + nss * mi / (sqrtf(vi) / bs + eps);
    }
    for (; i < i1; ++i) {   /* its scalar tail */
      const float gi = wd != 0.0f ? fmaf(p[i], wd, g[i]) : g[i];
      const float mi = fmaf(c1, gi - m[i], m[i]);
      const float vi = fmaf(v[i], b2, c2 * gi * gi);
      m[i] = mi;
      v[i] = vi;
      p[i] = p[i] - ss * mi / (sqrtf(vi) / bs + eps);
    }
    return;
  }
  for (; i < i1; ++i) {
    const float gi = wd != 0.0f ? g[i] + p[i] * wd : g[i];
    const float mi = m[i] + c1 * (gi - m[i]);
    const float vi = v[i] * b2 + c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] + nss * mi / (sqrtf(vi) / bs + eps);
  }
}

/* n tensors: numel [n]; param, grad, exp_avg, exp_avg_sq [n] pointers to their floats,
 * step [n] pointers to their float step counts (incremented here); vec: torch's vector
 * width in floats; fused: whether its vectors use a fused multiply-add. Returns 0, or -1
 * when no memory could be had for the work list (nothing is changed then). */
int tgl_adam(int64_t n, const int64_t *numel, float *const *param, const float *const *grad,
             float *const *exp_avg, float *const *exp_avg_sq, float *const *step, double lr,
             double beta1, double beta2, double eps, double wd, int64_t vec, int fused,
             int threads) {
  int64_t items = 0;
  for (int64_t t = 0; t < n; ++t) items += (numel[t] + CHUNK - 1) / CHUNK;
  int64_t *work = malloc(sizeof(int64_t) * 2 * (items > 0 ? items : 1));
  consts_t *ks = malloc(sizeof(consts_t) * (n > 0 ? n : 1));
  if (!work || !ks) {
    free(work);
    free(ks);
    return -1;
  }
  int64_t w = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float s = *step[t] + 1.0f;
    *step[t] = s;
    const double bc1 = 1.0 - pow(beta1, (double)s), bc2 = 1.0 - pow(beta2, (double)s);
    const consts_t k = {(float)beta2, (float)(1.0 - beta1), (float)(1.0 - beta2), (float)wd,
                        (float)(lr / bc1), (float)sqrt(bc2), (float)eps};
    ks[t] = k;
    for (int64_t i = 0; i < numel[t]; i += CHUNK) {
      work[2 * w] = t;
      work[2 * w + 1] = i;
      ++w;
    }
  }
  int64_t j;
  const int nt = threads < 1 ? 1 : (items < 8 ? 1 : threads); /* tiny: one thread */
#pragma omp parallel for num_threads(nt) schedule(static)
  for (j = 0; j < items; ++j) {
    const int64_t t = work[2 * j], i0 = work[2 * j + 1];
    const int64_t i1 = i0 + CHUNK < numel[t] ? i0 + CHUNK : numel[t];
    adam_range(i0, i1, numel[t] - numel[t] % vec, fused, param[t], grad[t], exp_avg[t],
               exp_avg_sq[t], &ks[t]);
  }
  free(work);
  free(ks);
  return 0;
}
