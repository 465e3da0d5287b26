/* xxh3_impl.h — one XXH3 variant (xxh3_variants.h): included by
 * xxh3_base.c, xxh3_avx2.c and xxh3_avx512.c, each compiled for its ISA
 * (Makefile's per-file flags), with ISA its name.  XXH_INLINE_ALL gives
 * each file its own private copy of XXH3, built with that file's flags. */
#define XXH_INLINE_ALL
#include <xxhash.h>

static void v_reset(void *st) { (void)XXH3_128bits_reset((XXH3_state_t *)st); }
static void v_update(void *st, const void *p, size_t n)
{
    (void)XXH3_128bits_update((XXH3_state_t *)st, p, n);
}
static void v_digest(const void *st, uint64_t *high, uint64_t *low)
{
    XXH128_hash_t h = XXH3_128bits_digest((const XXH3_state_t *)st);
    *high = h.high64;
    *low = h.low64;
}
static void v_once(const void *p, size_t n, uint64_t *high, uint64_t *low)
{
    XXH128_hash_t h = XXH3_128bits(p, n);
    *high = h.high64;
    *low = h.low64;
}

static const shoal_xxh3_impl v_impl = { ISA, v_reset, v_update, v_digest, v_once };
