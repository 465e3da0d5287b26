/* xxh3_variants.h — the XXH3 variants xxh3.c picks from, each compiled
 * for its ISA in a file of its own (xxh3_base.c, xxh3_avx2.c,
 * xxh3_avx512.c).  Each file has its own private copy of XXH3
 * (XXH_INLINE_ALL renames its types), so the state is passed as a
 * pointer to libxxhash's XXH3_state_t, which has the same layout (the
 * same header). */
#ifndef SHOAL_COMMON_XXH3_VARIANTS_H
#define SHOAL_COMMON_XXH3_VARIANTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct shoal_xxh3_impl {
    const char *isa;
    void (*reset)(void *st);
    void (*update)(void *st, const void *p, size_t n);
    void (*digest)(const void *st, uint64_t *high, uint64_t *low);
    void (*once)(const void *p, size_t n, uint64_t *high, uint64_t *low);
} shoal_xxh3_impl;

/* NULL when the build or the CPU has no such variant. */
const shoal_xxh3_impl *shoal_xxh3_impl_avx512(void);
const shoal_xxh3_impl *shoal_xxh3_impl_avx2(void);
const shoal_xxh3_impl *shoal_xxh3_impl_baseline(void);

#endif
