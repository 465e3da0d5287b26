/* attn_avx512.c — the attention family on AVX-512 F (compiled with the
 * AVX-512 flags; chosen with the AVX-512 VNNI ISA): the kernels of
 * attn_simd.h on 16 lanes.  Numerics: attn_int.h.
 *
 * Tiles (32 registers): MLA scores 8 positions x 48 heads (24
 * accumulators; per query column 3 loads of q^T and 8 broadcasts feed 24
 * FMAs), context 6 heads x 64 columns (24 accumulators; per position 4
 * row loads and 6 broadcasts of p), KDA 64 columns (the state block of a
 * head, 128 x 64 floats, stays in L1 across tokens).  At K3 width MLA is
 * FMA-bound (2·96·(576 + 512) flops per 2,304-byte row), not memory-bound.
 */
#if defined(__x86_64__)

#include <immintrin.h>

#include "engine/kernels/attn_int.h"

#define AV __m512
#define AW 16
#define av_zero() _mm512_setzero_ps()
#define av_set1(x) _mm512_set1_ps(x)
#define av_load(p) _mm512_loadu_ps(p)
#define av_store(p, v) _mm512_storeu_ps((p), (v))
#define av_add(a, b) _mm512_add_ps((a), (b))
#define av_sub(a, b) _mm512_sub_ps((a), (b))
#define av_mul(a, b) _mm512_mul_ps((a), (b))
#define av_div(a, b) _mm512_div_ps((a), (b))
#define av_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define av_max(a, b) _mm512_max_ps((a), (b))
/* exact negation (xor_ps would need AVX-512 DQ) */
#define av_neg(v) _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), \
                                                        _mm512_set1_epi32((int)0x80000000u)))
#define AV_PF(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#define AT_ROWS 8
#define AT_Z 3
#define AC_H 6
#define AC_Z 4
#define AK_Z 4

#define av_min(a, b) _mm512_min_ps((a), (b))
#define av_fnma(a, b, c) _mm512_fnmadd_ps((a), (b), (c))
/* 2^k from the bits of y = k + 1.5*2^23 (kernels_attn_exp) */
#define av_pow2(y, rnd)                                                                  \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                               \
        _mm512_add_epi32(_mm512_sub_epi32(_mm512_castps_si512(y), _mm512_castps_si512(rnd)), \
                         _mm512_set1_epi32(127)), 23))
#define av_zero_below(x, lo, v) \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask((x), (lo), _CMP_LT_OQ), (v), _mm512_setzero_ps())

/* AW bf16 (shifted) or f16 (converted) values at p, widened exactly. */
#define av_widen(t, p)                                                                   \
    ((t) == KERNELS_KV_BF16                                                              \
         ? _mm512_castsi512_ps(_mm512_slli_epi32(                                         \
               _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))      \
         : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p))))

#include "engine/kernels/attn_simd.h"

const kernels_attn_ops kernels_attn_ops_avx512 = KERNELS_ATTN_TABLE;

#else
/* Not x86-64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_attn_avx512_unused;
#endif
