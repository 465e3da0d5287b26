/* xxh3.h — XXH3-128, the cache's and the engine's object hash, at the
 * speed of the best vector unit the CPU has.
 *
 * Owns: picking, once, an XXH3 compiled for AVX-512, AVX2 or the
 * baseline (SSE2; NEON on arm64) and running every hash through it.
 * libxxhash's shared library is built for the baseline: 5.5 GB/s on one
 * core of a 2-core AVX-512 VM here, against 9.4 (AVX2) and 14.8
 * (AVX-512) for the same code compiled for them (XXH_INLINE_ALL).  The
 * hashes are the same bytes whichever is used (tests/unit/common/
 * test_xxh3.c checks every variant the CPU runs against libxxhash).
 * The state is libxxhash's own XXH3_state_t, so its other functions
 * (canonical forms) keep working on the results.
 */
#ifndef SHOAL_COMMON_XXH3_H
#define SHOAL_COMMON_XXH3_H

#include <stddef.h>
#include <stdint.h>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* A state for the streaming hash (64-byte aligned); NULL when out of
 * memory.  Free with shoal_xxh3_free. */
XXH3_state_t *shoal_xxh3_new(void);
void shoal_xxh3_free(XXH3_state_t *st);
int  shoal_xxh3_reset(XXH3_state_t *st);        /* 0 */
void shoal_xxh3_update(XXH3_state_t *st, const void *p, size_t n);
/* The digest, canonical (big-endian), as the cache stores it. */
void shoal_xxh3_digest(const XXH3_state_t *st, uint8_t out[16]);
/* One buffer's XXH3-128, canonical. */
void shoal_xxh3_once(const void *p, size_t n, uint8_t out[16]);
/* "avx512", "avx2" or "baseline": what runs (for benches and logs). */
const char *shoal_xxh3_isa(void);

#include "common/xxh3_variants.h"

#endif
