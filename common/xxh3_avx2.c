/* xxh3_avx2.c — XXH3 compiled with -mavx2 (xxh3_impl.h); empty elsewhere. */
#include "common/xxh3_variants.h"

#if defined(__x86_64__) && defined(__AVX2__)
#define ISA "avx2"
#include "common/xxh3_impl.h"

const shoal_xxh3_impl *shoal_xxh3_impl_avx2(void)
{
    return __builtin_cpu_supports("avx2") ? &v_impl : NULL;
}
#else
const shoal_xxh3_impl *shoal_xxh3_impl_avx2(void) { return NULL; }
#endif
