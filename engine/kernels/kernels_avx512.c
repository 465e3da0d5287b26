/* kernels_avx512.c — AVX-512 VNNI row kernels (compiled with AVX-512
 * F/BW/VL/VNNI flags; called only when the CPU has them).
 *
 * Fast MXFP4, a group of four blocks (64 packed bytes) per step: the low
 * nibbles of the 64 bytes line up with 64 contiguous activations and the
 * high nibbles with the next 64 (kernels_int.h invariant 1), a byte shuffle
 * looks up the doubled e2m1 values plus KERNELS_VNNI_BIAS (dpbusd multiplies
 * unsigned by signed bytes), and dpbusd starts each lane at -BIAS times the
 * sum of its four activations (precomputed by the quantizer), so the int32
 * lanes are exactly the lane sums of invariant 2.  The accumulators hold
 * [A0|A1|A2|A3] lanes 0..3 (even halves) and 4..7 (odd halves), which is
 * the AVX2 group layout twice, so the tail and the reduction reuse the AVX2
 * helpers and the float order of the scalar reference.  Exact MXFP4 and
 * f32 reuse the AVX2 kernels (memory-bound).
 */
#if defined(__x86_64__)

#include "engine/kernels/kernels_avx2_int.h"

/* Upper 8 lanes (AVX512F only; extractf32x8 would need DQ). */
static inline __m256 hi256(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* Four per-block floats as [c0 x4 | c1 x4 | c2 x4 | c3 x4]. */
static inline __m512 spread4(__m128 c4)
{
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(c4));
}

/* After the group steps: split into the AVX2 layout, finish a partial
 * group in scalar code, reduce (invariant 4). */
static inline float finish(__m512 accE, __m512 accO, size_t b, size_t nb,
                           void (*tail)(float *, const void *), const void *tctx)
{
    __m256 e01 = _mm512_castps512_ps256(accE), e23 = hi256(accE);
    __m256 o01 = _mm512_castps512_ps256(accO), o23 = hi256(accO);
    if (b < nb) {
        float A[32];
        spill_groups(A, e01, o01, e23, o23);
        tail(A, tctx);
        return kernels_reduce32(A);
    }
    return reduce_groups(e01, o01, e23, o23);
}

struct fast_tail {
    const uint8_t *p, *s;
    const int8_t *q;
    const float *d;
    size_t b, nb;
};

static void fast_tail_fn(float *A, const void *ctx)
{
    const struct fast_tail *t = ctx;
    kernels_fast_blocks(A, t->p, t->s, t->q, t->d, t->b, t->nb);
}

static float row_fast(const uint8_t *p, const uint8_t *s, size_t nb,
                      const int8_t *q, const float *d, const int32_t *bias)
{
    const __m512i tab = _mm512_broadcast_i32x4(tab_biased128());
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 accE = _mm512_setzero_ps(), accO = _mm512_setzero_ps();
    size_t b = 0;

    for (; b + 4 <= nb; b += 4) {
        _mm_prefetch((const char *)p + b * 16 + KERNELS_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)s + b + KERNELS_PREFETCH / 16, _MM_HINT_T0);
        __m512i v = _mm512_loadu_si512(p + b * 16);
        __m512i wl = _mm512_shuffle_epi8(tab, _mm512_and_si512(v, m4));
        __m512i wh = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
        __m512i pe = _mm512_dpbusd_epi32(_mm512_loadu_si512(bias + b * 8), wl,
                                         _mm512_loadu_si512(q + b * 32));
        __m512i po = _mm512_dpbusd_epi32(_mm512_loadu_si512(bias + b * 8 + 16), wh,
                                         _mm512_loadu_si512(q + b * 32 + 64));
        __m512 c = spread4(scales4(s + b, d + b));
        accE = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pe), c, accE);
        accO = _mm512_fmadd_ps(_mm512_cvtepi32_ps(po), c, accO);
    }
    struct fast_tail t = { p, s, q, d, b, nb };
    return finish(accE, accO, b, nb, fast_tail_fn, &t);
}

/* Batches: decode the row's full groups once (biased weights in the
 * activation layout, and scale * 0.5 per block), then one dpbusd per 64
 * weights per vector.  Same integers, same float order as row_fast. */
static void decode_row(const uint8_t *p, const uint8_t *s, size_t ng, uint8_t *wbuf, float *sh)
{
    const __m512i tab = _mm512_broadcast_i32x4(tab_biased128());
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (size_t g = 0; g < ng; g++) {
        __m512i v = _mm512_loadu_si512(p + g * 64);
        _mm512_storeu_si512(wbuf + g * 128, _mm512_shuffle_epi8(tab, _mm512_and_si512(v, m4)));
        _mm512_storeu_si512(wbuf + g * 128 + 64,
                            _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4)));
        __m128i e = _mm_slli_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)
                                   ((uint32_t)s[4 * g] | (uint32_t)s[4 * g + 1] << 8 |
                                    (uint32_t)s[4 * g + 2] << 16 | (uint32_t)s[4 * g + 3] << 24))), 23);
        _mm_storeu_ps(sh + 4 * g, _mm_mul_ps(_mm_castsi128_ps(e), _mm_set1_ps(0.5f)));
    }
}

static float row_decoded(const uint8_t *wbuf, const float *sh, size_t ng, const uint8_t *p,
                         const uint8_t *s, size_t nb, const int8_t *q, const float *d,
                         const int32_t *bias)
{
    __m512 accE = _mm512_setzero_ps(), accO = _mm512_setzero_ps();
    for (size_t g = 0; g < ng; g++) {
        __m512i pe = _mm512_dpbusd_epi32(_mm512_loadu_si512(bias + g * 32),
                                         _mm512_loadu_si512(wbuf + g * 128),
                                         _mm512_loadu_si512(q + g * 128));
        __m512i po = _mm512_dpbusd_epi32(_mm512_loadu_si512(bias + g * 32 + 16),
                                         _mm512_loadu_si512(wbuf + g * 128 + 64),
                                         _mm512_loadu_si512(q + g * 128 + 64));
        __m512 c = spread4(_mm_mul_ps(_mm_loadu_ps(sh + 4 * g), _mm_loadu_ps(d + 4 * g)));
        accE = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pe), c, accE);
        accO = _mm512_fmadd_ps(_mm512_cvtepi32_ps(po), c, accO);
    }
    struct fast_tail t = { p, s, q, d, 4 * ng, nb };
    return finish(accE, accO, 4 * ng, nb, fast_tail_fn, &t);
}

static void avx512_mxfp4_fast(const kernels_mxfp4 *w, size_t r0, size_t r1,
                              const kernels_act *a, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK, ng = nb / 4;

    if (a->n == 1 || w->cols > KERNELS_ROWBUF) {
        for (size_t r = r0; r < r1; r++)
            for (size_t v = 0; v < a->n; v++)
                y[v * ldy + r] = row_fast(w->packed + r * nb * 16, w->scale + r * nb, nb,
                                          a->q + v * nb * 32, a->d + v * nb, a->bias + v * nb * 8);
        return;
    }
    uint8_t wbuf[KERNELS_ROWBUF];
    float sh[KERNELS_ROWBUF / KERNELS_BLOCK];
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *p = w->packed + r * nb * 16, *s = w->scale + r * nb;
        decode_row(p, s, ng, wbuf, sh);
        for (size_t v = 0; v < a->n; v++)
            y[v * ldy + r] = row_decoded(wbuf, sh, ng, p, s, nb, a->q + v * nb * 32,
                                         a->d + v * nb, a->bias + v * nb * 8);
    }
}

/* |w| times a with w's sign, so dpbusd (unsigned x signed) sees |w|. */
static inline __m512i dot_lanes512(__m512i w, __m512i a)
{
    __mmask64 neg = _mm512_movepi8_mask(w);
    __m512i as = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), as);
}

struct q8_tail {
    const int8_t *w, *q;
    const float *d;
    size_t b, nb;
};

static void q8_tail_fn(float *A, const void *ctx)
{
    const struct q8_tail *t = ctx;
    kernels_q8_blocks(A, t->w, t->q, t->d, t->b, t->nb);
}

static float row_q8(const int8_t *wr, size_t nb, const int8_t *q, const float *d)
{
    __m512 accE = _mm512_setzero_ps(), accO = _mm512_setzero_ps();
    size_t b = 0;

    for (; b + 4 <= nb; b += 4) {
        const int8_t *W = wr + b * 32, *Q = q + b * 32;
        _mm_prefetch((const char *)W + KERNELS_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)W + KERNELS_PREFETCH + 64, _MM_HINT_T0);
        __m512i pe = dot_lanes512(_mm512_loadu_si512(W), _mm512_loadu_si512(Q));
        __m512i po = dot_lanes512(_mm512_loadu_si512(W + 64), _mm512_loadu_si512(Q + 64));
        __m512 c = spread4(_mm_loadu_ps(d + b));
        accE = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pe), c, accE);
        accO = _mm512_fmadd_ps(_mm512_cvtepi32_ps(po), c, accO);
    }
    struct q8_tail t = { wr, q, d, b, nb };
    return finish(accE, accO, b, nb, q8_tail_fn, &t);
}

static void avx512_q8(const kernels_q8 *w, size_t r0, size_t r1,
                      const kernels_act *a, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK;
    for (size_t r = r0; r < r1; r++)
        for (size_t v = 0; v < a->n; v++)
            y[v * ldy + r] = row_q8(w->q + r * w->cols, nb, a->q + v * w->cols, a->d + v * nb) *
                             w->scale[r];
}

const kernels_ops kernels_ops_avx512 = {
    avx512_mxfp4_fast, kernels_avx2_mxfp4_exact, avx512_q8, kernels_avx2_f32
};

#else
/* Not x86-64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_avx512_unused;
#endif
