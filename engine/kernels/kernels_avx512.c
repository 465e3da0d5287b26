/* kernels_avx512.c — AVX-512 VNNI row kernels (compiled with AVX-512
 * F/BW/VL/VNNI flags; called only when the CPU has them): matrix-vector
 * fast MXFP4, int8 and int4, the activation quantizer and SiTU.  Batches
 * of the block-fold formats go to tile_avx512.c; exact MXFP4 and f32 reuse
 * the AVX2 kernels (memory-bound).
 *
 * Fast MXFP4, int4 and int8 share one template, a group of four blocks per
 * step: the low nibbles of 64 packed bytes line up with 64 contiguous
 * activations and the high nibbles with the next 64 (kernels_int.h
 * invariant 1; int8 weights are stored in that layout), and dpbusd
 * multiplies unsigned weights (MXFP4: the doubled e2m1 values plus
 * KERNELS_VNNI_BIAS, by a byte shuffle; int4: q + 8 as stored; int8:
 * w ^ 0x80 = w + 128) by signed activations.  Four groups are reduced to 16
 * raw block sums by an integer shuffle tree; taking out the bias times the
 * block's activation sum (stored by the quantizer) leaves each block's
 * exact S (invariant 2), folded with one FMA into the 16 accumulators
 * A[b % 16] (invariant 3).
 */
#if defined(__x86_64__)

#include "engine/kernels/kernels_avx2_int.h"

/* The weights of group g (4 blocks, 128 positions) as dpbusd's unsigned
 * operand: even halves (lo) and odd halves (hi), 64 bytes each, in the
 * activation layout.  MXFP4: biased e2m1 by a byte shuffle; int4: q + 8 as
 * stored; int8: w + 128 (w ^ 0x80). */
static KERNELS_AI void group_weights(const int kind, const uint8_t *w, size_t g, __m512i *lo,
                                     __m512i *hi)
{
    if (kind == KERNELS_KIND_Q8) {
        const __m512i k128 = _mm512_set1_epi8((char)0x80);
        *lo = _mm512_xor_si512(_mm512_loadu_si512(w + g * 128), k128);
        *hi = _mm512_xor_si512(_mm512_loadu_si512(w + g * 128 + 64), k128);
        return;
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i v = _mm512_loadu_si512(w + g * 64);
    *lo = _mm512_and_si512(v, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    if (kind == KERNELS_KIND_MXFP4) {
        const __m512i tab = _mm512_broadcast_i32x4(tab_biased128());
        *lo = _mm512_shuffle_epi8(tab, *lo);
        *hi = _mm512_shuffle_epi8(tab, *hi);
    }
}

/* c_b of invariant 3 for blocks b..b+15 (s: the row's scales at block b). */
static KERNELS_AI __m512 scales16(const int kind, const uint8_t *s, const float *d)
{
    __m512 dv = _mm512_loadu_ps(d);
    if (kind == KERNELS_KIND_MXFP4) {
        __m512i e = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)s)), 23);
        return _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(e), _mm512_set1_ps(0.5f)), dv);
    }
    if (kind == KERNELS_KIND_Q4) {
        __m512i e = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s)), 16);
        return _mm512_mul_ps(_mm512_castsi512_ps(e), dv);
    }
    return dv;
}

/* One row times one vector (invariants 2-4): per group of four blocks, two
 * dpbusd leave each block's raw sum in the four int32 lanes of its 128-bit
 * quarter; four groups (16 blocks) are reduced to 16 block sums by an
 * integer shuffle tree, put in block order, the weight bias times the
 * activations' sum is taken out (MXFP4 + bsum, int4 + bsum8, int8 +
 * bsum128) and one FMA folds them into A[b % 16]. */
static KERNELS_AI float row_t(const int kind, const kernels_bmat *m, size_t r,
                              const kernels_act *a, size_t v)
{
    /* after the tree, lane 4k + j holds block 4j + k */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const size_t nb = m->nb, bb = kind == KERNELS_KIND_Q8 ? 32 : 16;   /* bytes a block */
    const size_t sb = kind == KERNELS_KIND_Q4 ? 2 : 1;                 /* scale bytes a block */
    const uint8_t *w = m->w + r * m->wrow;
    const uint8_t *s = kind == KERNELS_KIND_Q8 ? NULL : m->s + r * m->srow;
    const int8_t *q = a->q + v * m->cols;
    const float *d = a->d + v * nb;
    __m512 acc = _mm512_setzero_ps();
    size_t b = 0;

    for (; b + 16 <= nb; b += 16) {
        __m512i X[4];
        for (size_t k = 0; k < 16 * bb; k += 64)
            _mm_prefetch((const char *)w + b * bb + KERNELS_PREFETCH + k, _MM_HINT_T0);
        if (kind != KERNELS_KIND_Q8)
            _mm_prefetch((const char *)s + b * sb + KERNELS_PREFETCH / 16 * sb, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            size_t o = b + 4 * (size_t)j;
            __m512i wl, wh;
            group_weights(kind, w, o / 4, &wl, &wh);
            __m512i x = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wl, _mm512_loadu_si512(q + o * 32));
            X[j] = _mm512_dpbusd_epi32(x, wh, _mm512_loadu_si512(q + o * 32 + 64));
        }
        __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(X[0], X[1]), _mm512_unpackhi_epi32(X[0], X[1]));
        __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(X[2], X[3]), _mm512_unpackhi_epi32(X[2], X[3]));
        __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
        __m512i S = _mm512_permutexvar_epi32(order, u);
        const int32_t *bs = kind == KERNELS_KIND_MXFP4 ? a->bsum : kind == KERNELS_KIND_Q4 ? a->bsum8
                                                                                           : a->bsum128;
        S = _mm512_add_epi32(S, _mm512_loadu_si512(bs + v * nb + b));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S),
                              scales16(kind, kind == KERNELS_KIND_Q8 ? NULL : s + b * sb, d + b), acc);
    }
    float A[16];
    _mm512_storeu_ps(A, acc);
    kernels_fold_blocks(kind, A, w, s, q, d, b, nb);
    float y = kernels_reduce16(A);
    return kind == KERNELS_KIND_Q8 ? y * m->rs[r] : y;
}

/* Rows [r0, r1) times every vector: 16-row tiles for batches
 * (tile_avx512.c), the matrix-vector kernel for n = 1 and the rows left
 * over. */
static KERNELS_AI void rows_t(const int kind, const kernels_bmat *m, size_t r0, size_t r1,
                              const kernels_act *a, float *y, size_t ldy)
{
    size_t r = a->n > 1 ? kernels_avx512_tiles(kind, m, r0, r1, a, y, ldy) : r0;
    for (; r < r1; r++)
        for (size_t v = 0; v < a->n; v++)
            y[v * ldy + r] = row_t(kind, m, r, a, v);
}

static void avx512_mxfp4_fast(const kernels_mxfp4 *w, size_t r0, size_t r1,
                              const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_mxfp4(w);
    rows_t(KERNELS_KIND_MXFP4, &m, r0, r1, a, y, ldy);
}

static void avx512_q8(const kernels_q8 *w, size_t r0, size_t r1,
                      const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_q8(w);
    rows_t(KERNELS_KIND_Q8, &m, r0, r1, a, y, ldy);
}

void kernels_q4_rows_avx512(const kernels_q4 *w, size_t r0, size_t r1,
                            const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_q4(w);
    rows_t(KERNELS_KIND_Q4, &m, r0, r1, a, y, ldy);
}

/* ---- activation quantizer and SiTU (the bits of kernels_int.h's scalar
 * definitions, 16 lanes at a time) ---------------------------------------- */

static void avx512_act_quant(kernels_act *act, size_t v, const float *x, size_t b0, size_t b1)
{
    size_t nb = act->cols / KERNELS_BLOCK;
    int8_t *q = act->q + v * act->cols;
    int32_t *bias = act->bias + v * act->cols / 4;
    const __m512i ieven = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i iodd = _mm512_add_epi32(ieven, _mm512_set1_epi32(1));
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    const __m128i ones = _mm_set1_epi8(1), mbias = _mm_set1_epi32(-KERNELS_VNNI_BIAS);

    for (size_t b = b0; b < b1; b++) {
        const float *xb = x + b * KERNELS_BLOCK;
        __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
        /* max(|x|, acc) keeps acc where |x| is NaN, as the scalar loop does */
        __m512 m = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_setzero_ps());
        m = _mm512_max_ps(_mm512_abs_ps(x1), m);
        float amax = _mm512_reduce_max_ps(m);
        act->d[v * nb + b] = amax / 127.0f;
        __m512 id = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        /* cvtps rounds half to even (MXCSR default), as lrintf does */
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
        q0 = _mm512_max_epi32(_mm512_min_epi32(q0, lim), nlim);
        q1 = _mm512_max_epi32(_mm512_min_epi32(q1, lim), nlim);
        __m128i qe = _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q0, ieven, q1));
        __m128i qo = _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q0, iodd, q1));
        size_t g = b / 4, k = b % 4, gs = nb - 4 * g < 4 ? nb - 4 * g : 4;
        size_t oe = 128 * g + 16 * k, oo = 128 * g + 16 * gs + 16 * k;
        _mm_storeu_si128((__m128i *)(q + oe), qe);
        _mm_storeu_si128((__m128i *)(q + oo), qo);
        _mm_storeu_si128((__m128i *)(bias + oe / 4),
                         _mm_mullo_epi32(_mm_dpbusd_epi32(_mm_setzero_si128(), ones, qe), mbias));
        _mm_storeu_si128((__m128i *)(bias + oo / 4),
                         _mm_mullo_epi32(_mm_dpbusd_epi32(_mm_setzero_si128(), ones, qo), mbias));
    }
}

/* Bitwise double ops through the integer forms (the _pd ones need DQ). */
static inline __m512d and8d(__m512d a, __m512d b)
{
    return _mm512_castsi512_pd(_mm512_and_si512(_mm512_castpd_si512(a), _mm512_castpd_si512(b)));
}
static inline __m512d andnot8d(__m512d a, __m512d b)
{
    return _mm512_castsi512_pd(_mm512_andnot_si512(_mm512_castpd_si512(a), _mm512_castpd_si512(b)));
}
static inline __m512d or8d(__m512d a, __m512d b)
{
    return _mm512_castsi512_pd(_mm512_or_si512(_mm512_castpd_si512(a), _mm512_castpd_si512(b)));
}

/* kernels_exp_split, 8 lanes: returns expm1(r), *s = 2^k. */
static inline __m512d exp_split_8d(__m512d y, __m512d *s)
{
    static const double c[KERNELS_EXPM1_NC] = KERNELS_EXPM1_C;
    const __m512d rnd = _mm512_set1_pd(KERNELS_RND);
    __m512d kf = _mm512_sub_pd(_mm512_add_pd(_mm512_mul_pd(y, _mm512_set1_pd(KERNELS_LOG2E)), rnd), rnd);
    __m512d r = _mm512_fnmadd_pd(kf, _mm512_set1_pd(KERNELS_LN2_HI), y);
    r = _mm512_fnmadd_pd(kf, _mm512_set1_pd(KERNELS_LN2_LO), r);
    __m512d p = _mm512_set1_pd(c[0]);
    for (int i = 1; i < KERNELS_EXPM1_NC; i++)
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c[i]));
    /* kf is an integer in [-145, 145]: 2^kf from its bits */
    __m512i k = _mm512_cvtepi32_epi64(_mm512_cvtpd_epi32(kf));
    *s = _mm512_castsi512_pd(_mm512_slli_epi64(_mm512_add_epi64(k, _mm512_set1_epi64(1023)), 52));
    return _mm512_fmadd_pd(_mm512_mul_pd(r, r), p, r);
}

/* kernels_expf1 on 16 lanes (two halves of 8 doubles). */
static inline __m512d expf_8d(__m512d y)
{
    __m512d s;
    y = _mm512_max_pd(_mm512_set1_pd(KERNELS_EXP_LO), _mm512_min_pd(_mm512_set1_pd(KERNELS_EXP_HI), y));
    __m512d er = exp_split_8d(y, &s);
    return _mm512_fmadd_pd(s, er, s);
}

static inline __m512d tanh_8d(__m512d t)
{
    const __m512d sign = _mm512_set1_pd(-0.0);
    __m512d a = _mm512_min_pd(_mm512_set1_pd(KERNELS_TANH_MAX), andnot8d(sign, t)), s;
    __m512d er = exp_split_8d(_mm512_add_pd(a, a), &s);
    __m512d e = _mm512_fmadd_pd(s, er, _mm512_sub_pd(s, _mm512_set1_pd(1.0)));
    __m512d th = _mm512_div_pd(e, _mm512_add_pd(e, _mm512_set1_pd(2.0)));
    return or8d(th, and8d(t, sign));
}

/* f(8 floats) in double, rounded to 8 floats. */
static inline __m256 via_double(__m256 x, __m512d (*f)(__m512d))
{
    return _mm512_cvtpd_ps(f(_mm512_cvtps_pd(x)));
}

static void avx512_situ(const float *g, const float *u, float *h, size_t n, float beta1, float beta2)
{
    const __m256 b1 = _mm256_set1_ps(beta1), b2 = _mm256_set1_ps(beta2), one = _mm256_set1_ps(1.0f);
    size_t i = 0;

    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i);
        __m256 e = via_double(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0f)), expf_8d);
        __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, e));
        __m256 t1 = _mm256_mul_ps(_mm256_mul_ps(b1, via_double(_mm256_div_ps(gv, b1), tanh_8d)), sig);
        __m256 t2 = _mm256_mul_ps(b2, via_double(_mm256_div_ps(uv, b2), tanh_8d));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(t1, t2));
    }
    for (; i < n; i++)
        h[i] = kernels_situ1(g[i], u[i], beta1, beta2);
}

const kernels_ops kernels_ops_avx512 = {
    avx512_mxfp4_fast, kernels_avx2_mxfp4_exact, avx512_q8, kernels_avx2_f32,
    avx512_act_quant, avx512_situ
};

#else
/* Not x86-64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_avx512_unused;
#endif
