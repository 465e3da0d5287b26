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

#define KERNELS_AI inline __attribute__((always_inline))

/* Four activation bytes, as the dword in every lane. */
static KERNELS_AI __m256i bcast4_256(const int8_t *p)
{
    int32_t x;
    memcpy(&x, p, 4);
    return _mm256_set1_epi32(x);
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

/* The AVX2 exact and f32 row kernels, reused by the AVX-512 table. */
void kernels_avx2_mxfp4_exact(const kernels_mxfp4 *w, size_t r0, size_t r1,
                              const float *x, size_t n, float *y, size_t ldy);
void kernels_avx2_f32(const kernels_f32 *w, size_t r0, size_t r1,
                      const float *x, size_t n, float *y, size_t ldy);

/* ---- batched tiles (issue 16): rows in the lanes of a register ----------- */

/* Rows [r0, r0 + 8k) (AVX2) or [r0, r0 + 16k) (AVX-512) of m times every
 * vector of a, k as large as fits in [r0, r1); returns the first row not
 * done.  Bit-identical to the matrix-vector kernels (invariants 2-4). */
size_t kernels_avx2_tiles(int kind, const kernels_bmat *m, size_t r0, size_t r1,
                          const kernels_act *a, float *y, size_t ldy);
size_t kernels_avx512_tiles(int kind, const kernels_bmat *m, size_t r0, size_t r1,
                            const kernels_act *a, float *y, size_t ldy);

#endif
