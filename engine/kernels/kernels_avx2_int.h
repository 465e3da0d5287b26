/* kernels_avx2_int.h — private to engine/kernels: AVX2 helpers shared by
 * the AVX2 and AVX-512 row kernels.  Include only from files compiled with
 * at least -mavx2 -mfma (kernels_avx2.c, kernels_avx512.c).
 */
#ifndef SHOAL_KERNELS_AVX2_INT_H
#define SHOAL_KERNELS_AVX2_INT_H

#include <immintrin.h>
#include <string.h>

#include "engine/kernels/kernels_int.h"

/* Doubled e2m1 values plus KERNELS_VNNI_BIAS, in both 128-bit lanes:
 * unsigned bytes for maddubs/dpbusd; the quantizer's per-lane bias terms
 * take the bias back out exactly. */
static inline __m128i tab_biased128(void)
{
    return _mm_setr_epi8(0 + KERNELS_VNNI_BIAS, 1 + KERNELS_VNNI_BIAS, 2 + KERNELS_VNNI_BIAS,
                         3 + KERNELS_VNNI_BIAS, 4 + KERNELS_VNNI_BIAS, 6 + KERNELS_VNNI_BIAS,
                         8 + KERNELS_VNNI_BIAS, 12 + KERNELS_VNNI_BIAS, 0 + KERNELS_VNNI_BIAS,
                         -1 + KERNELS_VNNI_BIAS, -2 + KERNELS_VNNI_BIAS, -3 + KERNELS_VNNI_BIAS,
                         -4 + KERNELS_VNNI_BIAS, -6 + KERNELS_VNNI_BIAS, -8 + KERNELS_VNNI_BIAS,
                         -12 + KERNELS_VNNI_BIAS);
}

/* Lane sums of w (signed) times a (signed), |w|, |a| <= 127. */
static inline __m256i dot_lanes(__m256i w, __m256i a)
{
    __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* Invariant 4 on four 8-lane accumulators (exact and f32 kernels). */
static inline float reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    __m256 t = _mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3));
    __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

/* The int8 kernels keep a group's accumulators as
 *   e01 = [A0[0..3] | A1[0..3]]   o01 = [A0[4..7] | A1[4..7]]
 *   e23 = [A2[0..3] | A3[0..3]]   o23 = [A2[4..7] | A3[4..7]]
 * (even halves in e, odd halves in o: invariant 1's group layout). */

/* Invariant 4 from that layout. */
static inline float reduce_groups(__m256 e01, __m256 o01, __m256 e23, __m256 o23)
{
    __m256 se = _mm256_add_ps(e01, e23);  /* [A0+A2 | A1+A3], lanes 0..3 */
    __m256 so = _mm256_add_ps(o01, o23);  /* the same, lanes 4..7 */
    __m128 tlo = _mm_add_ps(_mm256_castps256_ps128(se), _mm256_extractf128_ps(se, 1));
    __m128 thi = _mm_add_ps(_mm256_castps256_ps128(so), _mm256_extractf128_ps(so, 1));
    __m128 u = _mm_add_ps(tlo, thi);
    __m128 v = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

/* Store that layout as A[p*8 + l] (for the scalar tail of a partial group). */
static inline void spill_groups(float *A, __m256 e01, __m256 o01, __m256 e23, __m256 o23)
{
    _mm_storeu_ps(A + 0, _mm256_castps256_ps128(e01));
    _mm_storeu_ps(A + 8, _mm256_extractf128_ps(e01, 1));
    _mm_storeu_ps(A + 4, _mm256_castps256_ps128(o01));
    _mm_storeu_ps(A + 12, _mm256_extractf128_ps(o01, 1));
    _mm_storeu_ps(A + 16, _mm256_castps256_ps128(e23));
    _mm_storeu_ps(A + 24, _mm256_extractf128_ps(e23, 1));
    _mm_storeu_ps(A + 20, _mm256_castps256_ps128(o23));
    _mm_storeu_ps(A + 28, _mm256_extractf128_ps(o23, 1));
}

/* The AVX2 exact and f32 row kernels, reused by the AVX-512 table. */
void kernels_avx2_mxfp4_exact(const kernels_mxfp4 *w, size_t r0, size_t r1,
                              const float *x, size_t n, float *y, size_t ldy);
void kernels_avx2_f32(const kernels_f32 *w, size_t r0, size_t r1,
                      const float *x, size_t n, float *y, size_t ldy);

#endif
