/* kernels_avx2.c — AVX2 + FMA row kernels (compiled with -mavx2 -mfma
 * -mf16c; called only when the CPU has them): matrix-vector fast MXFP4,
 * int8 and int4, exact MXFP4, f32, the activation quantizer and SiTU.
 * Batches of the block-fold formats go to tile_avx2.c.
 *
 * Fast MXFP4, int4 and int8 share one template (kernels_int.h invariants
 * 1-4), a group of 4 blocks at a time: the low nibbles of 32 packed bytes
 * line up with 32 contiguous activations (invariant 1); MXFP4 looks up the
 * doubled e2m1 values plus KERNELS_VNNI_BIAS with a byte shuffle, int4
 * uses its stored q + 8 as is (both unsigned, as maddubs wants), int8 the
 * sign trick; maddubs and madd give int32 lanes, two rounds of hadd the raw
 * sums of 8 blocks, and taking out the bias times the activations' sum
 * (stored by the quantizer) leaves each block's exact S (invariant 2); one
 * FMA per 8 blocks folds them into the 16 accumulators A[b % 16] of
 * invariant 3.  Software prefetch runs KERNELS_PREFETCH bytes ahead on the
 * weights and the scales; the rows of a thread are contiguous, so it runs
 * on into the next row.
 */
#if defined(__x86_64__)

#include "engine/kernels/kernels_avx2_int.h"

/* The weights of group g (4 blocks) in the activation layout, 4 registers
 * [even 0,1 | even 2,3 | odd 0,1 | odd 2,3] (32 bytes each): MXFP4 the
 * biased e2m1 values (a byte shuffle), int4 q + 8 as stored (a mask), int8
 * the signed bytes as stored. */
static KERNELS_AI void group_weights(const int kind, const uint8_t *w, size_t g, __m256i W[4])
{
    if (kind == KERNELS_KIND_Q8) {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            W[i] = _mm256_loadu_si256((const __m256i *)(w + g * 128 + 32 * (size_t)i));
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i v01 = _mm256_loadu_si256((const __m256i *)(w + g * 64));
    __m256i v23 = _mm256_loadu_si256((const __m256i *)(w + g * 64 + 32));
    W[0] = _mm256_and_si256(v01, m4);
    W[1] = _mm256_and_si256(v23, m4);
    W[2] = _mm256_and_si256(_mm256_srli_epi16(v01, 4), m4);
    W[3] = _mm256_and_si256(_mm256_srli_epi16(v23, 4), m4);
    if (kind == KERNELS_KIND_MXFP4) {
        const __m256i tab = _mm256_broadcastsi128_si256(tab_biased128());
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
            W[i] = _mm256_shuffle_epi8(tab, W[i]);
    }
}

/* int32 lanes of 32 weights times 32 activations, exact: unsigned 4-bit
 * codes by maddubs/madd, int8 by the sign trick. */
static KERNELS_AI __m256i lanes(const int kind, __m256i w, const int8_t *q)
{
    __m256i x = _mm256_loadu_si256((const __m256i *)q);
    if (kind == KERNELS_KIND_Q8)
        return dot_lanes(w, x);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

/* Raw block sums of groups g, g+1 (8 blocks, in block order), exact; the
 * caller takes the weight bias back out. */
static KERNELS_AI __m256i sums8(const int kind, const uint8_t *w, size_t g, const int8_t *q)
{
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i h[2];
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) {
        __m256i W[4];
        const int8_t *Q = q + (g + (size_t)j) * 128;
        group_weights(kind, w, g + (size_t)j, W);
        /* 128-bit quarter k: block k's four partial sums (even + odd) */
        __m256i x01 = _mm256_add_epi32(lanes(kind, W[0], Q), lanes(kind, W[2], Q + 64));
        __m256i x23 = _mm256_add_epi32(lanes(kind, W[1], Q + 32), lanes(kind, W[3], Q + 96));
        h[j] = _mm256_hadd_epi32(x01, x23);
    }
    /* lane 0..3: blocks 0, 2, 4, 6; lanes 4..7: blocks 1, 3, 5, 7 */
    return _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(h[0], h[1]), order);
}

/* Block sums S of blocks b..b+7 (invariant 2): the raw sums minus the
 * weight bias times the activations (MXFP4: + bsum = -12 * sum; int4:
 * + bsum8 = -8 * sum; int8: no bias). */
static KERNELS_AI __m256i unbias8(const int kind, __m256i t, const kernels_act *a, size_t v,
                                  size_t nb, size_t b)
{
    if (kind == KERNELS_KIND_MXFP4)
        return _mm256_add_epi32(t, _mm256_loadu_si256((const __m256i *)(a->bsum + v * nb + b)));
    if (kind == KERNELS_KIND_Q4)
        return _mm256_add_epi32(t, _mm256_loadu_si256((const __m256i *)(a->bsum8 + v * nb + b)));
    return t;
}

/* c_b of invariant 3 for blocks b..b+7 (s: the row's scales). */
static KERNELS_AI __m256 scales8(const int kind, const uint8_t *s, const float *d)
{
    __m256 dv = _mm256_loadu_ps(d);
    if (kind == KERNELS_KIND_MXFP4) {
        __m256i e = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)s)), 23);
        return _mm256_mul_ps(_mm256_mul_ps(_mm256_castsi256_ps(e), _mm256_set1_ps(0.5f)), dv);
    }
    if (kind == KERNELS_KIND_Q4) {
        __m256i e = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)s)), 16);
        return _mm256_mul_ps(_mm256_castsi256_ps(e), dv);
    }
    return dv;
}

/* One row times one vector (invariants 2-4): 16 blocks per step, their sums
 * by maddubs/madd and two rounds of hadd, folded into A[0..7] (lo) and
 * A[8..15] (hi).  Software prefetch KERNELS_PREFETCH bytes ahead. */
static KERNELS_AI float row_t(const int kind, const kernels_bmat *m, size_t r,
                              const kernels_act *a, size_t v)
{
    const size_t nb = m->nb, bb = kind == KERNELS_KIND_Q8 ? 32 : 16;   /* bytes a block */
    const size_t sb = kind == KERNELS_KIND_Q4 ? 2 : 1;                 /* scale bytes a block */
    const uint8_t *w = m->w + r * m->wrow;
    const uint8_t *s = kind == KERNELS_KIND_Q8 ? NULL : m->s + r * m->srow;
    const int8_t *q = a->q + v * m->cols;
    const float *d = a->d + v * nb;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    size_t b = 0;

    for (; b + 16 <= nb; b += 16) {
        for (size_t k = 0; k < 16 * bb; k += 64)
            _mm_prefetch((const char *)w + b * bb + KERNELS_PREFETCH + k, _MM_HINT_T0);
        if (kind != KERNELS_KIND_Q8)
            _mm_prefetch((const char *)s + b * sb + KERNELS_PREFETCH / 16 * sb, _MM_HINT_T0);
        __m256i s0 = unbias8(kind, sums8(kind, w, b / 4, q), a, v, nb, b);
        __m256i s1 = unbias8(kind, sums8(kind, w, b / 4 + 2, q), a, v, nb, b + 8);
        const uint8_t *sc = kind == KERNELS_KIND_Q8 ? NULL : s + b * sb;
        lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), scales8(kind, sc, d + b), lo);
        hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), scales8(kind, sc ? sc + 8 * sb : NULL, d + b + 8), hi);
    }
    float A[16];
    _mm256_storeu_ps(A, lo);
    _mm256_storeu_ps(A + 8, hi);
    kernels_fold_blocks(kind, A, w, s, q, d, b, nb);
    float y = kernels_reduce16(A);
    return kind == KERNELS_KIND_Q8 ? y * m->rs[r] : y;
}

/* Rows [r0, r1) times every vector: 8-row tiles for batches (tile_avx2.c),
 * the matrix-vector kernel for n = 1 and the rows left over. */
static KERNELS_AI void rows_t(const int kind, const kernels_bmat *m, size_t r0, size_t r1,
                              const kernels_act *a, float *y, size_t ldy)
{
    size_t r = a->n > 1 ? kernels_avx2_tiles(kind, m, r0, r1, a, y, ldy) : r0;
    for (; r < r1; r++)
        for (size_t v = 0; v < a->n; v++)
            y[v * ldy + r] = row_t(kind, m, r, a, v);
}

static void avx2_mxfp4_fast(const kernels_mxfp4 *w, size_t r0, size_t r1,
                            const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_mxfp4(w);
    rows_t(KERNELS_KIND_MXFP4, &m, r0, r1, a, y, ldy);
}

static void avx2_q8(const kernels_q8 *w, size_t r0, size_t r1,
                    const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_q8(w);
    rows_t(KERNELS_KIND_Q8, &m, r0, r1, a, y, ldy);
}

void kernels_q4_rows_avx2(const kernels_q4 *w, size_t r0, size_t r1,
                          const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_q4(w);
    rows_t(KERNELS_KIND_Q4, &m, r0, r1, a, y, ldy);
}

/* Exact: decode each block to f32 in column order, FMA against x, scale
 * the block sum by the power of two (exact), two accumulators. */
static float row_exact(const uint8_t *p, const uint8_t *s, size_t nb, const float *x)
{
    const __m128i tab = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();

    for (size_t b = 0; b < nb; b++) {
        _mm_prefetch((const char *)p + b * 16 + KERNELS_PREFETCH, _MM_HINT_T0);
        __m128i by = _mm_loadu_si128((const __m128i *)(p + b * 16));
        __m128i lo = _mm_and_si128(by, m4), hi = _mm_and_si128(_mm_srli_epi16(by, 4), m4);
        __m128i v0 = _mm_shuffle_epi8(tab, _mm_unpacklo_epi8(lo, hi));
        __m128i v1 = _mm_shuffle_epi8(tab, _mm_unpackhi_epi8(lo, hi));
        const float *xb = x + b * 32;
        __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), _mm256_loadu_ps(xb));
        __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))),
                                  _mm256_loadu_ps(xb + 8));
        s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), _mm256_loadu_ps(xb + 16), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))),
                             _mm256_loadu_ps(xb + 24), s1);
        __m256 c = _mm256_set1_ps(kernels_ue8m0(s[b]) * 0.5f);
        if (b & 1)
            acc1 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), c, acc1);
        else
            acc0 = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), c, acc0);
    }
    return reduce4(acc0, _mm256_setzero_ps(), acc1, _mm256_setzero_ps());
}

void kernels_avx2_mxfp4_exact(const kernels_mxfp4 *w, size_t r0, size_t r1,
                              const float *x, size_t n, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK;
    for (size_t r = r0; r < r1; r++)
        for (size_t v = 0; v < n; v++)
            y[v * ldy + r] = row_exact(w->packed + r * nb * 16, w->scale + r * nb, nb,
                                       x + v * w->cols);
}

void kernels_avx2_f32(const kernels_f32 *w, size_t r0, size_t r1,
                      const float *x, size_t n, float *y, size_t ldy)
{
    size_t cols = w->cols;
    for (size_t r = r0; r < r1; r++) {
        const float *wr = w->w + r * cols;
        for (size_t v = 0; v < n; v++) {
            const float *xv = x + v * cols;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
            size_t j = 0;
            for (; j + 32 <= cols; j += 32) {
                _mm_prefetch((const char *)(wr + j) + KERNELS_PREFETCH, _MM_HINT_T0);
                _mm_prefetch((const char *)(wr + j) + KERNELS_PREFETCH + 64, _MM_HINT_T0);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + j), _mm256_loadu_ps(xv + j), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + j + 8), _mm256_loadu_ps(xv + j + 8), a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + j + 16), _mm256_loadu_ps(xv + j + 16), a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + j + 24), _mm256_loadu_ps(xv + j + 24), a3);
            }
            float acc = reduce4(a0, a1, a2, a3);
            for (; j < cols; j++)
                acc += wr[j] * xv[j];
            y[v * ldy + r] = acc;
        }
    }
}

/* ---- activation quantizer and SiTU (the bits of kernels_int.h's scalar
 * definitions, 8 lanes at a time) ------------------------------------------ */

static inline __m256 abs8(__m256 x) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x); }

static void avx2_act_quant(kernels_act *act, size_t v, const float *x, size_t b0, size_t b1)
{
    size_t nb = act->cols / KERNELS_BLOCK;
    int8_t *q = act->q + v * act->cols;
    int32_t *bias = act->bias + v * act->cols / 4;
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    /* in each 128-bit lane: its even bytes, then its odd bytes */
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i ones8 = _mm_set1_epi8(1), ones16 = _mm_set1_epi16(1);
    const __m128i mbias = _mm_set1_epi32(-KERNELS_VNNI_BIAS);

    for (size_t b = b0; b < b1; b++) {
        const float *xb = x + b * KERNELS_BLOCK;
        __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
        __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
        /* max(|x|, acc) keeps acc where |x| is NaN, as the scalar loop does */
        __m256 m = _mm256_max_ps(abs8(x0), _mm256_setzero_ps());
        m = _mm256_max_ps(abs8(x1), m);
        m = _mm256_max_ps(abs8(x2), m);
        m = _mm256_max_ps(abs8(x3), m);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        float amax = _mm_cvtss_f32(m4);
        act->d[v * nb + b] = amax / 127.0f;
        __m256 id = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(x0, id));
        __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(x1, id));
        __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(x2, id));
        __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(x3, id));
        q0 = _mm256_max_epi32(_mm256_min_epi32(q0, lim), nlim);
        q1 = _mm256_max_epi32(_mm256_min_epi32(q1, lim), nlim);
        q2 = _mm256_max_epi32(_mm256_min_epi32(q2, lim), nlim);
        q3 = _mm256_max_epi32(_mm256_min_epi32(q3, lim), nlim);
        /* packs interleave the lanes: dwords hold cols 0-3, 8-11, 16-19,
         * 24-27, 4-7, 12-15, 20-23, 28-31; `order` restores 0..31 */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
        p = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(p, order), split);
        p = _mm256_permute4x64_epi64(p, 0xD8);  /* even 16 bytes, then odd 16 */
        __m128i qe = _mm256_castsi256_si128(p), qo = _mm256_extracti128_si256(p, 1);
        size_t g = b / 4, k = b % 4, gs = nb - 4 * g < 4 ? nb - 4 * g : 4;
        size_t oe = 128 * g + 16 * k, oo = 128 * g + 16 * gs + 16 * k;
        _mm_storeu_si128((__m128i *)(q + oe), qe);
        _mm_storeu_si128((__m128i *)(q + oo), qo);
        __m128i se = _mm_madd_epi16(_mm_maddubs_epi16(ones8, qe), ones16);
        __m128i so = _mm_madd_epi16(_mm_maddubs_epi16(ones8, qo), ones16);
        _mm_storeu_si128((__m128i *)(bias + oe / 4), _mm_mullo_epi32(se, mbias));
        _mm_storeu_si128((__m128i *)(bias + oo / 4), _mm_mullo_epi32(so, mbias));
    }
}

/* kernels_exp_split, 4 lanes: returns expm1(r), *s = 2^k. */
static inline __m256d exp_split_4d(__m256d y, __m256d *s)
{
    static const double c[KERNELS_EXPM1_NC] = KERNELS_EXPM1_C;
    const __m256d rnd = _mm256_set1_pd(KERNELS_RND);
    __m256d kf = _mm256_sub_pd(_mm256_add_pd(_mm256_mul_pd(y, _mm256_set1_pd(KERNELS_LOG2E)), rnd), rnd);
    __m256d r = _mm256_fnmadd_pd(kf, _mm256_set1_pd(KERNELS_LN2_HI), y);
    r = _mm256_fnmadd_pd(kf, _mm256_set1_pd(KERNELS_LN2_LO), r);
    __m256d p = _mm256_set1_pd(c[0]);
    for (int i = 1; i < KERNELS_EXPM1_NC; i++)
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c[i]));
    /* kf is an integer in [-145, 145]: 2^kf from its bits */
    __m256i k = _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(kf));
    *s = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_add_epi64(k, _mm256_set1_epi64x(1023)), 52));
    return _mm256_fmadd_pd(_mm256_mul_pd(r, r), p, r);
}

static inline __m256d expf_4d(__m256d y)
{
    __m256d s;
    y = _mm256_max_pd(_mm256_set1_pd(KERNELS_EXP_LO), _mm256_min_pd(_mm256_set1_pd(KERNELS_EXP_HI), y));
    __m256d er = exp_split_4d(y, &s);
    return _mm256_fmadd_pd(s, er, s);
}

static inline __m256d tanh_4d(__m256d t)
{
    const __m256d sign = _mm256_set1_pd(-0.0);
    __m256d a = _mm256_min_pd(_mm256_set1_pd(KERNELS_TANH_MAX), _mm256_andnot_pd(sign, t)), s;
    __m256d er = exp_split_4d(_mm256_add_pd(a, a), &s);
    __m256d e = _mm256_fmadd_pd(s, er, _mm256_sub_pd(s, _mm256_set1_pd(1.0)));
    __m256d th = _mm256_div_pd(e, _mm256_add_pd(e, _mm256_set1_pd(2.0)));
    return _mm256_or_pd(th, _mm256_and_pd(t, sign));
}

static inline __m128 via_double(__m128 x, __m256d (*f)(__m256d))
{
    return _mm256_cvtpd_ps(f(_mm256_cvtps_pd(x)));
}

static void avx2_situ(const float *g, const float *u, float *h, size_t n, float beta1, float beta2)
{
    const __m128 b1 = _mm_set1_ps(beta1), b2 = _mm_set1_ps(beta2), one = _mm_set1_ps(1.0f);
    size_t i = 0;

    for (; i + 4 <= n; i += 4) {
        __m128 gv = _mm_loadu_ps(g + i), uv = _mm_loadu_ps(u + i);
        __m128 e = via_double(_mm_xor_ps(gv, _mm_set1_ps(-0.0f)), expf_4d);
        __m128 sig = _mm_div_ps(one, _mm_add_ps(one, e));
        __m128 t1 = _mm_mul_ps(_mm_mul_ps(b1, via_double(_mm_div_ps(gv, b1), tanh_4d)), sig);
        __m128 t2 = _mm_mul_ps(b2, via_double(_mm_div_ps(uv, b2), tanh_4d));
        _mm_storeu_ps(h + i, _mm_mul_ps(t1, t2));
    }
    for (; i < n; i++)
        h[i] = kernels_situ1(g[i], u[i], beta1, beta2);
}

const kernels_ops kernels_ops_avx2 = {
    avx2_mxfp4_fast, kernels_avx2_mxfp4_exact, avx2_q8, kernels_avx2_f32,
    avx2_act_quant, avx2_situ
};

#else
/* Not x86-64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_avx2_unused;
#endif
