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

/* Batches (n > 1): a tile of MM_ROWS rows is decoded once (biased weights
 * in the activation layout, and (scale * 0.5) spread to the accumulator
 * layout, 16 floats per group) and kept in L1; then for every vector the
 * group loop loads the vector's activations, bias terms and block scales
 * once and runs them against all rows of the tile.  Per (row, vector) the
 * integers, the products c = (s * 0.5) * d and the FMA order are exactly
 * those of row_fast, so the result is bit-identical to n single calls.
 *
 * The loop is bound by the two FMA-class pipes (2 dpbusd, 2 FMA and the
 * multiply for c per row, vector and group).  s * 0.5 = 2^(s-128) is a
 * power of two, so when every product d * 2^(s-128) of the call is a
 * normal float the multiply is exact and equals adding the exponents: an
 * integer add on another pipe, same bits.  mm_pow2_ok checks that range
 * (from the extreme exponents of the tile's scales and of the vectors'
 * block scales); otherwise the tile multiplies. */
#define MM_ROWS 4

/* Decode one row; returns the smallest and largest scale byte. */
static void decode_row(const uint8_t *p, const uint8_t *s, size_t ng, uint8_t *wbuf, float *sh16,
                       unsigned *smin, unsigned *smax)
{
    const __m512i tab = _mm512_broadcast_i32x4(tab_biased128());
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m128i mn = _mm_set1_epi8((char)0xFF), mx = _mm_setzero_si128();
    for (size_t g = 0; g < ng; g++) {
        __m512i v = _mm512_loadu_si512(p + g * 64);
        _mm512_storeu_si512(wbuf + g * 128, _mm512_shuffle_epi8(tab, _mm512_and_si512(v, m4)));
        _mm512_storeu_si512(wbuf + g * 128 + 64,
                            _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4)));
        uint32_t s4;
        memcpy(&s4, s + 4 * g, 4);
        __m128i sb = _mm_cvtsi32_si128((int)s4);
        /* the scale bytes' extremes: only the low 4 bytes count (the
         * others are 0, so they are kept out of the minimum) */
        mn = _mm_min_epu8(mn, _mm_shuffle_epi32(sb, 0));
        mx = _mm_max_epu8(mx, sb);
        __m128i e = _mm_slli_epi32(_mm_cvtepu8_epi32(sb), 23);
        _mm512_storeu_ps(sh16 + 16 * g, spread4(_mm_mul_ps(_mm_castsi128_ps(e), _mm_set1_ps(0.5f))));
    }
    uint8_t lo[16], hi[16];
    _mm_storeu_si128((__m128i *)lo, mn);
    _mm_storeu_si128((__m128i *)hi, mx);
    for (int k = 0; k < 4; k++) {
        *smin = lo[k] < *smin ? lo[k] : *smin;
        *smax = hi[k] > *smax ? hi[k] : *smax;
    }
}

/* Biased exponents (bits 23..30) of the block scales of all vectors' full
 * groups: smallest and largest.  d >= 0, so a zero or subnormal d shows as
 * exponent 0. */
static void act_exp_range(const kernels_act *a, size_t nb, size_t ng, unsigned *emin, unsigned *emax)
{
    __m512i lo = _mm512_set1_epi32(255), hi = _mm512_setzero_si512();
    const __mmask16 all = 0xFFFF;
    for (size_t v = 0; v < a->n; v++) {
        const float *d = a->d + v * nb;
        for (size_t b = 0; b < 4 * ng; b += 16) {
            __mmask16 m = 4 * ng - b >= 16 ? all : (__mmask16)((1u << (4 * ng - b)) - 1);
            __m512i e = _mm512_srli_epi32(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, d + b)), 23);
            lo = _mm512_mask_min_epu32(lo, m, lo, e);
            hi = _mm512_mask_max_epu32(hi, m, hi, e);
        }
    }
    *emin = _mm512_reduce_min_epu32(lo);
    *emax = _mm512_reduce_max_epu32(hi);
}

/* 1 if d * 2^(s-128) is a normal float for every d, s of these ranges
 * (s >= 2: s * 0.5 is then normal, its bits minus 1.0f's are the exponent
 * offset). */
static int mm_pow2_ok(unsigned emin, unsigned emax, unsigned smin, unsigned smax)
{
    return emin >= 1 && smin >= 2 && smax <= 254 && emin + smin >= 129 && emax + smax <= 382;
}

/* Rows [r, r + R) of the tile (decoded at wbuf/sh16, row strides ng*128 and
 * ng*16) times every vector of a.  R and POW2 are constants after inlining,
 * so the accumulator arrays live in registers. */
static inline __attribute__((always_inline)) void
mm_tile(const kernels_mxfp4 *w, size_t r, const int R, const int POW2, const uint8_t *wbuf,
        const float *sh16, const kernels_act *a, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK, ng = nb / 4;
    const size_t ws = ng * 128, ss = ng * 16;
    const __m512i one = _mm512_set1_epi32(0x3F800000);

    for (size_t v = 0; v < a->n; v++) {
        const int8_t *q = a->q + v * nb * 32;
        const int32_t *bias = a->bias + v * nb * 8;
        const float *d = a->d + v * nb;
        __m512 accE[MM_ROWS], accO[MM_ROWS];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
            accE[i] = accO[i] = _mm512_setzero_ps();
        for (size_t g = 0; g < ng; g++) {
            __m512i qe = _mm512_loadu_si512(q + g * 128), qo = _mm512_loadu_si512(q + g * 128 + 64);
            __m512i be = _mm512_loadu_si512(bias + g * 32);
            __m512i bo = _mm512_loadu_si512(bias + g * 32 + 16);
            __m512 dv = spread4(_mm_loadu_ps(d + 4 * g));
            __m512i dx = _mm512_sub_epi32(_mm512_castps_si512(dv), one);
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                const uint8_t *W = wbuf + i * ws + g * 128;
                __m512i pe = _mm512_dpbusd_epi32(be, _mm512_loadu_si512(W), qe);
                __m512i po = _mm512_dpbusd_epi32(bo, _mm512_loadu_si512(W + 64), qo);
                __m512 sh = _mm512_loadu_ps(sh16 + i * ss + g * 16);
                __m512 c = POW2 ? _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(sh), dx))
                                : _mm512_mul_ps(sh, dv);
                accE[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pe), c, accE[i]);
                accO[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(po), c, accO[i]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            const uint8_t *p = w->packed + (r + i) * nb * 16, *s = w->scale + (r + i) * nb;
            struct fast_tail t = { p, s, q, d, 4 * ng, nb };
            y[v * ldy + r + i] = finish(accE[i], accO[i], 4 * ng, nb, fast_tail_fn, &t);
        }
    }
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
    _Alignas(64) uint8_t wbuf[MM_ROWS * KERNELS_ROWBUF];
    _Alignas(64) float sh16[MM_ROWS * KERNELS_ROWBUF / 8];
    unsigned emin, emax;
    act_exp_range(a, nb, ng, &emin, &emax);
    for (size_t r = r0; r < r1;) {
        int R = r + MM_ROWS <= r1 ? MM_ROWS : 1;
        unsigned smin = 255, smax = 0;
        for (int i = 0; i < R; i++)
            decode_row(w->packed + (r + i) * nb * 16, w->scale + (r + i) * nb, ng,
                       wbuf + i * ng * 128, sh16 + i * ng * 16, &smin, &smax);
        int pow2 = mm_pow2_ok(emin, emax, smin, smax);
        /* the tile's compute hides fetching the next tile's weights (from
         * DRAM when the expert was just streamed in) into L2 */
        if (r + (size_t)R < r1) {
            const char *np = (const char *)(w->packed + (r + (size_t)R) * nb * 16);
            const char *ns = (const char *)(w->scale + (r + (size_t)R) * nb);
            for (size_t o = 0; o < MM_ROWS * nb * 16; o += 64)
                _mm_prefetch(np + o, _MM_HINT_T1);
            for (size_t o = 0; o < MM_ROWS * nb; o += 64)
                _mm_prefetch(ns + o, _MM_HINT_T1);
        }
        if (R == MM_ROWS && pow2)
            mm_tile(w, r, MM_ROWS, 1, wbuf, sh16, a, y, ldy);
        else if (R == MM_ROWS)
            mm_tile(w, r, MM_ROWS, 0, wbuf, sh16, a, y, ldy);
        else
            mm_tile(w, r, 1, 0, wbuf, sh16, a, y, ldy);
        r += (size_t)R;
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

/* Batches (n > 1): the rows of a tile are stored once with 128 added (w ^
 * 0x80, unsigned for dpbusd) and kept in L1; per vector and group, the
 * lanes start at -128 times the sum of their four activations (computed
 * once per group with a dpbusd against 0x80 and shared by the tile's rows),
 * so the int32 lanes are exactly those of dot_lanes512 and the float order
 * is row_q8's: bit-identical to n single calls. */
static inline __attribute__((always_inline)) void
q8_tile(const kernels_q8 *w, size_t r, const int R, const uint8_t *wbuf,
        const kernels_act *a, float *y, size_t ldy)
{
    size_t cols = w->cols, nb = cols / KERNELS_BLOCK, ng = nb / 4;
    const __m512i k128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();

    for (size_t v = 0; v < a->n; v++) {
        const int8_t *q = a->q + v * cols;
        const float *d = a->d + v * nb;
        __m512 accE[MM_ROWS], accO[MM_ROWS];
#pragma GCC unroll 4
        for (int i = 0; i < R; i++)
            accE[i] = accO[i] = _mm512_setzero_ps();
        for (size_t g = 0; g < ng; g++) {
            __m512i qe = _mm512_loadu_si512(q + g * 128), qo = _mm512_loadu_si512(q + g * 128 + 64);
            __m512i ne = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, k128, qe));
            __m512i no = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, k128, qo));
            __m512 c = spread4(_mm_loadu_ps(d + 4 * g));
#pragma GCC unroll 4
            for (int i = 0; i < R; i++) {
                const uint8_t *W = wbuf + i * cols + g * 128;
                __m512i pe = _mm512_dpbusd_epi32(ne, _mm512_loadu_si512(W), qe);
                __m512i po = _mm512_dpbusd_epi32(no, _mm512_loadu_si512(W + 64), qo);
                accE[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pe), c, accE[i]);
                accO[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(po), c, accO[i]);
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < R; i++) {
            struct q8_tail t = { w->q + (r + i) * cols, q, d, 4 * ng, nb };
            y[v * ldy + r + i] = finish(accE[i], accO[i], 4 * ng, nb, q8_tail_fn, &t) *
                                 w->scale[r + i];
        }
    }
}

static void q8_bias_rows(const int8_t *src, size_t bytes, uint8_t *dst)
{
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    size_t j = 0;
    for (; j + 64 <= bytes; j += 64)
        _mm512_storeu_si512(dst + j, _mm512_xor_si512(_mm512_loadu_si512(src + j), k128));
    for (; j < bytes; j++)
        dst[j] = (uint8_t)src[j] ^ 0x80;
}

static void avx512_q8(const kernels_q8 *w, size_t r0, size_t r1,
                      const kernels_act *a, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK;
    if (a->n == 1 || w->cols > KERNELS_ROWBUF) {
        for (size_t r = r0; r < r1; r++)
            for (size_t v = 0; v < a->n; v++)
                y[v * ldy + r] = row_q8(w->q + r * w->cols, nb, a->q + v * w->cols, a->d + v * nb) *
                                 w->scale[r];
        return;
    }
    _Alignas(64) uint8_t wbuf[MM_ROWS * KERNELS_ROWBUF];
    size_t r = r0;
    for (; r + MM_ROWS <= r1; r += MM_ROWS) {
        q8_bias_rows(w->q + r * w->cols, MM_ROWS * w->cols, wbuf);
        q8_tile(w, r, MM_ROWS, wbuf, a, y, ldy);
    }
    for (; r < r1; r++) {
        q8_bias_rows(w->q + r * w->cols, w->cols, wbuf);
        q8_tile(w, r, 1, wbuf, a, y, ldy);
    }
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
