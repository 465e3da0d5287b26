/* attn_avx2.c — the attention family on AVX2 + FMA (+ F16C for f16 cache
 * rows): the kernels of attn_simd.h on 8 lanes.  Numerics: attn_int.h.
 *
 * Tiles (16 registers): MLA scores 4 positions x 24 heads (12
 * accumulators; per query column 3 loads of q^T and 4 broadcasts), context
 * 6 heads x 16 columns (12 accumulators; per position 2 row loads and 6
 * broadcasts of p), KDA 32 columns.
 */
#if defined(__x86_64__)

#include <immintrin.h>

#include "engine/kernels/attn_int.h"

#define AV __m256
#define AW 8
#define av_zero() _mm256_setzero_ps()
#define av_set1(x) _mm256_set1_ps(x)
#define av_load(p) _mm256_loadu_ps(p)
#define av_store(p, v) _mm256_storeu_ps((p), (v))
#define av_add(a, b) _mm256_add_ps((a), (b))
#define av_sub(a, b) _mm256_sub_ps((a), (b))
#define av_mul(a, b) _mm256_mul_ps((a), (b))
#define av_div(a, b) _mm256_div_ps((a), (b))
#define av_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define av_max(a, b) _mm256_max_ps((a), (b))
#define av_neg(v) _mm256_xor_ps((v), _mm256_set1_ps(-0.0f))
#define AV_PF(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#define AT_ROWS 4
#define AT_Z 3
#define AC_H 6
#define AC_Z 2
#define AK_Z 4

#define av_min(a, b) _mm256_min_ps((a), (b))
#define av_fnma(a, b, c) _mm256_fnmadd_ps((a), (b), (c))
/* 2^k from the bits of y = k + 1.5*2^23 (kernels_attn_exp) */
#define av_pow2(y, rnd)                                                                  \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                               \
        _mm256_add_epi32(_mm256_sub_epi32(_mm256_castps_si256(y), _mm256_castps_si256(rnd)), \
                         _mm256_set1_epi32(127)), 23))
#define av_zero_below(x, lo, v) \
    _mm256_blendv_ps((v), _mm256_setzero_ps(), _mm256_cmp_ps((x), (lo), _CMP_LT_OQ))

/* AW bf16 (shifted) or f16 (F16C) values at p, widened exactly. */
#define av_widen(t, p)                                                                   \
    ((t) == KERNELS_KV_BF16                                                              \
         ? _mm256_castsi256_ps(_mm256_slli_epi32(                                         \
               _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))         \
         : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))

#include "engine/kernels/attn_simd.h"

const kernels_attn_ops kernels_attn_ops_avx2 = KERNELS_ATTN_TABLE;

#else
/* Not x86-64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_attn_avx2_unused;
#endif
