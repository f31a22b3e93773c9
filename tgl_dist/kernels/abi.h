/* The library's ABI stamp: the hash of its source and the local headers it includes,
 * passed by the build (tgl_dist/kernels/build.py: -DTGL_ABI_HASH=<hash>). The loader
 * opens a library only when its stamp is the hash of the sources it has now, so a
 * stale or foreign build is never called with today's signatures. */
#ifndef TGL_ABI_H
#define TGL_ABI_H
#include <stdint.h>
#ifndef TGL_ABI_HASH
#error "build with -DTGL_ABI_HASH=<source hash> (tgl_dist.kernels.build does)"
#endif
int64_t tgl_abi_hash(void) { return TGL_ABI_HASH; }
#endif
