/* xxh3_avx512.c — XXH3 compiled with -mavx512f (xxh3_impl.h); empty elsewhere. */
#include "common/xxh3_variants.h"

#if defined(__x86_64__) && defined(__AVX512F__)
#define ISA "avx512"
#include "common/xxh3_impl.h"

const shoal_xxh3_impl *shoal_xxh3_impl_avx512(void)
{
    return __builtin_cpu_supports("avx512f") ? &v_impl : NULL;
}
#else
const shoal_xxh3_impl *shoal_xxh3_impl_avx512(void) { return NULL; }
#endif
