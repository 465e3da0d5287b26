/* xxh3_base.c — XXH3 for the baseline the compiler targets (SSE2 on
 * x86_64, NEON on arm64), through xxh3_impl.h. */
#include "common/xxh3_variants.h"

#define ISA "baseline"
#include "common/xxh3_impl.h"

const shoal_xxh3_impl *shoal_xxh3_impl_baseline(void) { return &v_impl; }
