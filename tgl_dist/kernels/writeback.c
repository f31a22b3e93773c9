/* The mailbox write-back of a world of one: plain C99, one serial pass (a step writes a
 * few hundred rows; a parallel region would cost more than the copies).
 *
 * Built on first use by tgl_dist/kernels (same compiler, flags and cache as
 * the sampling kernel) and called through ctypes on tensors' data pointers.
 *
 * SharedMailBox.update with mails to the endpoints, the latest kept (deliver_to 'self',
 * mail_combine 'last'). A step's 2B occurrences j = u_1, v_1, u_2, v_2, ... (j = 2i: the
 * source of event i, 2i + 1: its destination) each update the node in local row node[j];
 * per node the occurrence with the latest event time wins, among equal times the later
 * occurrence (algorithms.md §1, Duplicates). With pos = next_pos[k], the winner j of node
 * k writes, in this order:
 *
 *   memory_ts[k]    = mail_ts[k, (pos - 1) mod K]  (mail_mode: the time of the mail that
 *                     s^ folded in) or t[j / 2]
 *   memory[k]       = s[own[j]]                                          (d floats)
 *   mailbox[k, pos] = [s[own[j]] || o[other[j]] || f[j / 2]]             (2 d + de floats)
 *   mail_ts[k, pos] = t[j / 2];   next_pos[k] = (pos + 1) mod K          (when K > 1)
 *
 * s: the step's updated memory s^ of the root rows (row stride lds), o: the rows the mails'
 * second part comes from (s^ again, or DyRep's embeddings), f: the events' features. The
 * same values, bit for bit, as SharedMailBox's torch operators
 * (tests/memory/test_writeback_kernel.py).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "abi.h"
static inline uint64_t slot_of(int64_t key, int bits) {
  return ((uint64_t)key * 0x9E3779B97F4A7C15ull) >> (64 - bits);
}

/* Returns the number of nodes written; -1 when an index is out of range, -2 when scratch
 * memory cannot be had (nothing is written in either case). */
int64_t tgl_wb_update_last(int64_t n2, const int64_t *node, const int64_t *own,
                           const int64_t *other, const double *t, const float *s,
                           int64_t lds, int64_t Rs, const float *o, int64_t ldo, int64_t Ro,
                           const float *f, int64_t de, int64_t ldf, int64_t rows, int64_t d,
                           int64_t K, int mail_mode, float *memory, double *memory_ts,
                           float *mailbox, double *mail_ts, int64_t *next_pos) {
  for (int64_t j = 0; j < n2; ++j)
    if (node[j] < 0 || node[j] >= rows || own[j] < 0 || own[j] >= Rs || other[j] < 0 ||
        other[j] >= Ro)
      return -1;
  /* each node's winning occurrence, in an open-addressing table of at least 2 n2 slots */
  int bits = 4;
  while (((int64_t)1 << bits) < 2 * n2) ++bits;
  const uint64_t mask = ((uint64_t)1 << bits) - 1;
  int64_t *key = malloc(sizeof(int64_t) << bits), *win = malloc(sizeof(int64_t) << bits);
  if (!key || !win) { free(key); free(win); return -2; }
  for (uint64_t h = 0; h <= mask; ++h) key[h] = -1;
  for (int64_t j = 0; j < n2; ++j) {
    uint64_t h = slot_of(node[j], bits);
    while (key[h] >= 0 && key[h] != node[j]) h = (h + 1) & mask;
    if (key[h] < 0) { key[h] = node[j]; win[h] = j; }
    else if (t[j / 2] >= t[win[h] / 2]) win[h] = j;       /* later time, or a tie: later j */
  }
  const int64_t dm = 2 * d + de;
  int64_t written = 0;
  for (int64_t j = 0; j < n2; ++j) {
    const int64_t k = node[j];
    uint64_t h = slot_of(k, bits);
    while (key[h] != k) h = (h + 1) & mask;
    if (win[h] != j) continue;
    ++written;
    const int64_t pos = next_pos[k];
    const double tj = t[j / 2];
    memory_ts[k] = mail_mode ? mail_ts[k * K + (pos + K - 1) % K] : tj;
    const float *sj = s + own[j] * lds;
    memcpy(memory + k * d, sj, (size_t)d * sizeof(float));
    float *m = mailbox + (k * K + pos) * dm;
    memcpy(m, sj, (size_t)d * sizeof(float));
    memcpy(m + d, o + other[j] * ldo, (size_t)d * sizeof(float));
    if (de) memcpy(m + 2 * d, f + (j / 2) * ldf, (size_t)de * sizeof(float));
    mail_ts[k * K + pos] = tj;
    if (K > 1) next_pos[k] = (pos + 1) % K;
  }
  free(key);
  free(win);
  return written;
}
