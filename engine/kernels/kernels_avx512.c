/* kernels_avx512.c — AVX-512 VNNI row kernels (compiled with AVX-512
 * F/BW/VL/VNNI flags; called only when the CPU has them).
 *
 * Fast MXFP4, matrix-vector, a group of four blocks (64 packed bytes) per
 * step: the low nibbles of the 64 bytes line up with 64 contiguous
 * activations and the high nibbles with the next 64 (kernels_int.h
 * invariant 1), a byte shuffle looks up the doubled e2m1 values plus
 * KERNELS_VNNI_BIAS (dpbusd multiplies unsigned by signed bytes), and the
 * dpbusd lanes start at -BIAS times the sum of their four activations
 * (precomputed by the quantizer), so each block's four int32 lanes add up
 * to exactly its sum S (invariant 2).  Four groups are reduced to 16 block
 * sums by an integer shuffle tree and folded with one FMA into the 16
 * accumulators A[b % 16] (invariant 3).  Batches put 16 rows in the lanes
 * instead (mm_tile16).  int8 keeps the per-lane fold: [A0|A1|A2|A3] lanes
 * 0..3 (even halves) and 4..7 (odd halves), the AVX2 group layout twice,
 * so its tail and reduction reuse the AVX2 helpers.  Exact MXFP4 and f32
 * reuse the AVX2 kernels (memory-bound).
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

/* One row times one vector (invariants 2-4, MXFP4): per group of four
 * blocks, two dpbusd leave each block's sum S in the four int32 lanes of
 * its 128-bit quarter; four groups (16 blocks) are reduced to 16 block sums
 * by an integer shuffle tree, put in block order and folded with one FMA
 * into A[b % 16]. */
static float row_fast(const uint8_t *p, const uint8_t *s, size_t nb,
                      const int8_t *q, const float *d, const int32_t *bias)
{
    const __m512i tab = _mm512_broadcast_i32x4(tab_biased128());
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    /* after the tree, lane 4k + j holds block 4j + k */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m512 half = _mm512_set1_ps(0.5f);
    __m512 acc = _mm512_setzero_ps();
    size_t b = 0;

    for (; b + 16 <= nb; b += 16) {
        __m512i X[4];
        _mm_prefetch((const char *)p + b * 16 + KERNELS_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)p + b * 16 + KERNELS_PREFETCH + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)p + b * 16 + KERNELS_PREFETCH + 128, _MM_HINT_T0);
        _mm_prefetch((const char *)p + b * 16 + KERNELS_PREFETCH + 192, _MM_HINT_T0);
        _mm_prefetch((const char *)s + b + KERNELS_PREFETCH / 16, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            size_t o = b + 4 * (size_t)j;
            __m512i v = _mm512_loadu_si512(p + o * 16);
            __m512i wl = _mm512_shuffle_epi8(tab, _mm512_and_si512(v, m4));
            __m512i wh = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
            __m512i x = _mm512_dpbusd_epi32(_mm512_loadu_si512(bias + o * 8), wl,
                                            _mm512_loadu_si512(q + o * 32));
            x = _mm512_add_epi32(x, _mm512_loadu_si512(bias + o * 8 + 16));
            X[j] = _mm512_dpbusd_epi32(x, wh, _mm512_loadu_si512(q + o * 32 + 64));
        }
        __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(X[0], X[1]), _mm512_unpackhi_epi32(X[0], X[1]));
        __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(X[2], X[3]), _mm512_unpackhi_epi32(X[2], X[3]));
        __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
        __m512i S = _mm512_permutexvar_epi32(order, u);
        __m512i e = _mm512_slli_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(s + b))), 23);
        __m512 c = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(e), half), _mm512_loadu_ps(d + b));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), c, acc);
    }
    float A[16];
    _mm512_storeu_ps(A, acc);
    kernels_fast_blocks(A, p, s, q, d, b, nb);
    return kernels_reduce16(A);
}

/* Batches (n > 1): 16 rows in the 16 lanes of a register.  For each block
 * the tile's 16 rows x 16 packed bytes are transposed once into 8 registers
 * (register l, lane r: row r's 4 biased weights at the block's layout
 * positions 4l..4l+3) and the row scales into one; then for every vector
 * 8 dpbusd against the vector's activation dwords, broadcast, give the 16
 * rows' block sums S, and one FMA folds them into the accumulator
 * A[b % 16] of each row (kept in memory per vector: 16 registers x
 * MM_VECS vectors).  Same integers, same c = (s * 0.5) * d, same FMA
 * order and reduction as row_fast: bit-identical to n single calls.  Per
 * 16 rows and block that is 8 dpbusd and 1 FMA, where a per-row fold
 * needed 8 and 8 (docs/kernels.md). */
#define MM_ROWS 16
#define MM_VECS 64

/* Four activation bytes, as the dword in every lane. */
static inline __m512i bcast4(const int8_t *p)
{
    int32_t x;
    memcpy(&x, p, 4);
    return _mm512_set1_epi32(x);
}

/* Rows [r, r + 16) times vectors [v0, v1) of a (v1 - v0 <= MM_VECS). */
static void mm_tile16(const kernels_mxfp4 *w, size_t r, const kernels_act *a, size_t v0, size_t v1,
                      float *y, size_t ldy)
{
    _Alignas(64) float acc[MM_VECS][16][16];
    const size_t nb = w->cols / KERNELS_BLOCK, rs = nb * 16;
    const __m512i tab = _mm512_broadcast_i32x4(tab_biased128());
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i ia = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(2));
    const __m512 half = _mm512_set1_ps(0.5f);
    const uint8_t *P = w->packed + r * rs, *Sc = w->scale + r * nb;

    memset(acc, 0, (v1 - v0) * sizeof acc[0]);
    for (size_t b = 0; b < nb; b++) {
        /* in[j]: rows 4j..4j+3, 16 packed bytes (4 dwords) each */
        __m512i in[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            const uint8_t *pj = P + 4 * (size_t)j * rs + b * 16;
            __m512i t = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)pj));
            t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(pj + rs)), 1);
            t = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(pj + 2 * rs)), 2);
            in[j] = _mm512_inserti32x4(t, _mm_loadu_si128((const __m128i *)(pj + 3 * rs)), 3);
        }
        /* dword l of rows 0-7 and l+1 of rows 0-7 (resp. rows 8-15) */
        __m512i a0 = _mm512_permutex2var_epi32(in[0], ia, in[1]);
        __m512i a1 = _mm512_permutex2var_epi32(in[2], ia, in[3]);
        __m512i b0 = _mm512_permutex2var_epi32(in[0], ib, in[1]);
        __m512i b1 = _mm512_permutex2var_epi32(in[2], ib, in[3]);
        __m512i pk[4] = {
            _mm512_shuffle_i32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)),
            _mm512_shuffle_i32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)),
            _mm512_shuffle_i32x4(b0, b1, _MM_SHUFFLE(1, 0, 1, 0)),
            _mm512_shuffle_i32x4(b0, b1, _MM_SHUFFLE(3, 2, 3, 2)),
        };
        __m512i W[8];
#pragma GCC unroll 4
        for (int l = 0; l < 4; l++) {
            W[l] = _mm512_shuffle_epi8(tab, _mm512_and_si512(pk[l], m4));
            W[4 + l] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(pk[l], 4), m4));
        }
        /* the block's even and odd halves in the activation layout */
        const size_t oe = kernels_bpos(nb, b, 0), oo = kernels_bpos(nb, b, 16);
        uint32_t sb[16];
        for (int i = 0; i < 16; i++)
            sb[i] = Sc[(size_t)i * nb + b];
        __m512 sh = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(sb), 23)), half);
        float *A = &acc[0][b % 16][0];
        const int8_t *q = a->q + v0 * w->cols;
        const int32_t *bs = a->bsum + v0 * nb + b;
        const float *d = a->d + v0 * nb + b;
        for (size_t v = v0; v < v1; v++, A += 16 * 16, q += w->cols, bs += nb, d += nb) {
            /* the lanes start at -BIAS * (sum of the block's activations) */
            __m512i s0 = _mm512_set1_epi32(*bs), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int l = 0; l < 4; l++) {
                s0 = _mm512_dpbusd_epi32(s0, W[l], bcast4(q + oe + 4 * l));
                s1 = _mm512_dpbusd_epi32(s1, W[4 + l], bcast4(q + oo + 4 * l));
            }
            __m512 c = _mm512_mul_ps(sh, _mm512_set1_ps(*d));
            __m512 S = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            _mm512_store_ps(A, _mm512_fmadd_ps(S, c, _mm512_load_ps(A)));
        }
    }
    for (size_t v = v0; v < v1; v++) {
        float (*Av)[16] = acc[v - v0];
        __m512 t[8];
        for (int k = 0; k < 8; k++)
            t[k] = _mm512_add_ps(_mm512_load_ps(Av[k]), _mm512_load_ps(Av[k + 8]));
        for (int k = 0; k < 4; k++)
            t[k] = _mm512_add_ps(t[k], t[k + 4]);
        t[0] = _mm512_add_ps(t[0], t[2]);
        t[1] = _mm512_add_ps(t[1], t[3]);
        _mm512_storeu_ps(y + v * ldy + r, _mm512_add_ps(t[0], t[1]));
    }
}

static void avx512_mxfp4_fast(const kernels_mxfp4 *w, size_t r0, size_t r1,
                              const kernels_act *a, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK, r = r0;

    if (a->n > 1) {
        for (; r + MM_ROWS <= r1; r += MM_ROWS) {
            /* the tile's compute hides fetching the next tile's weights
             * (from DRAM when the expert was just streamed in) into L2 */
            if (r + 2 * MM_ROWS <= r1) {
                const char *np = (const char *)(w->packed + (r + MM_ROWS) * nb * 16);
                const char *ns = (const char *)(w->scale + (r + MM_ROWS) * nb);
                for (size_t o = 0; o < MM_ROWS * nb * 16; o += 64)
                    _mm_prefetch(np + o, _MM_HINT_T1);
                for (size_t o = 0; o < MM_ROWS * nb; o += 64)
                    _mm_prefetch(ns + o, _MM_HINT_T1);
            }
            for (size_t v = 0; v < a->n; v += MM_VECS)
                mm_tile16(w, r, a, v, v + MM_VECS < a->n ? v + MM_VECS : a->n, y, ldy);
        }
    }
    for (; r < r1; r++)
        for (size_t v = 0; v < a->n; v++)
            y[v * ldy + r] = row_fast(w->packed + r * nb * 16, w->scale + r * nb, nb,
                                      a->q + v * nb * 32, a->d + v * nb, a->bias + v * nb * 8);
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
#define Q8_ROWS 4

static inline __attribute__((always_inline)) void
q8_tile(const kernels_q8 *w, size_t r, const int R, const uint8_t *wbuf,
        const kernels_act *a, float *y, size_t ldy)
{
    size_t cols = w->cols, nb = cols / KERNELS_BLOCK, ng = nb / 4;
    const __m512i k128 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();

    for (size_t v = 0; v < a->n; v++) {
        const int8_t *q = a->q + v * cols;
        const float *d = a->d + v * nb;
        __m512 accE[Q8_ROWS], accO[Q8_ROWS];
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
    _Alignas(64) uint8_t wbuf[Q8_ROWS * KERNELS_ROWBUF];
    size_t r = r0;
    for (; r + Q8_ROWS <= r1; r += Q8_ROWS) {
        q8_bias_rows(w->q + r * w->cols, Q8_ROWS * w->cols, wbuf);
        q8_tile(w, r, Q8_ROWS, wbuf, a, y, ldy);
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
