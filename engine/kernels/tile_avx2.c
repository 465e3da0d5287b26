/* tile_avx2.c — batched fast MXFP4, int4 and int8 products on AVX2 (n > 1;
 * compiled with -mavx2 -mfma -mf16c, called only when the CPU has them):
 * 8 rows in the 8 lanes of a register.
 *
 * For each block of an 8-row tile the rows' 16 packed bytes (int8: the
 * block's even and odd halves, 16 bytes each) are transposed once into
 * registers, register l holding in lane r row r's four weight codes at the
 * block's layout positions 4l..4l+3, and the rows' scales into one
 * register.  Then for every vector, maddubs of those registers against the
 * vector's activation dwords, broadcast, give the 8 rows' block sums S in
 * the lanes (no horizontal adds), and one conversion, one multiply for c
 * and one FMA fold them into A[b % 16] of the 8 rows (kernels_int.h
 * invariant 3); the accumulators of up to TILE_VECS vectors live in a
 * 32 KB stack array.  After the last block invariant 4 runs on whole
 * registers.  Same integers, same c, same FMA order as the matrix-vector
 * kernel: bit-identical to it and to the scalar reference.
 *
 * Integer ranges (maddubs adds two u8 x s8 products into an int16 and
 * saturates): MXFP4 weights are biased to 0..24, so four maddubs of a block
 * half (8 products, <= 24384) add up in int16 before madd widens them;
 * int4 weights are q + 8 in 1..15, so all eight (16 products, <= 30480)
 * do; int8 uses the sign trick (|w| times a with w's sign, two products
 * <= 32258 per maddubs) and widens each maddubs.  The bias comes back out
 * as the quantizer's bsum (-12 times the block's activation sum, MXFP4)
 * and bsum8 (-8 times it, int4), broadcast straight from memory.  Does not
 * own the matrix-vector kernels (kernels_avx2.c).
 */
#if defined(__x86_64__)

#include "engine/kernels/kernels_avx2_int.h"

#define TILE_ROWS 8
#define TILE_VECS 64

/* 16 bytes of 8 rows (at p + i * rs) as 4 registers: register l, lane r =
 * dword l of row r. */
static KERNELS_AI void transpose8(const uint8_t *p, size_t rs, __m256i out[4])
{
    __m256i t[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p + (size_t)i * rs))),
            _mm_loadu_si128((const __m128i *)(p + (size_t)(i + 4) * rs)), 1);
    /* t[i] = [row i | row i + 4] */
    __m256i u0 = _mm256_unpacklo_epi32(t[0], t[1]), u1 = _mm256_unpackhi_epi32(t[0], t[1]);
    __m256i u2 = _mm256_unpacklo_epi32(t[2], t[3]), u3 = _mm256_unpackhi_epi32(t[2], t[3]);
    out[0] = _mm256_unpacklo_epi64(u0, u2);
    out[1] = _mm256_unpackhi_epi64(u0, u2);
    out[2] = _mm256_unpacklo_epi64(u1, u3);
    out[3] = _mm256_unpackhi_epi64(u1, u3);
}

/* Block b of rows r..r+7 in lanes: W[l] (l < 4) positions 4l..4l+3 (even
 * half), W[4 + l] positions 16+4l.. (odd half), as maddubs' first operand
 * wants them (MXFP4 biased, int4 q + 8, int8 |w|; int8 also keeps the
 * signed bytes in Ws for the sign trick). */
static KERNELS_AI void decode8(const int kind, const kernels_bmat *m, size_t r, size_t b,
                               __m256i W[8], __m256i Ws[8])
{
    const uint8_t *w = m->w + r * m->wrow;
    if (kind == KERNELS_KIND_Q8) {
        transpose8(w + kernels_bpos(m->nb, b, 0), m->wrow, Ws);
        transpose8(w + kernels_bpos(m->nb, b, 16), m->wrow, Ws + 4);
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++)
            W[l] = _mm256_abs_epi8(Ws[l]);
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i tab = _mm256_broadcastsi128_si256(tab_biased128());
    __m256i pk[4];
    transpose8(w + b * 16, m->wrow, pk);
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) {
        W[l] = _mm256_and_si256(pk[l], m4);
        W[4 + l] = _mm256_and_si256(_mm256_srli_epi16(pk[l], 4), m4);
        if (kind == KERNELS_KIND_MXFP4) {
            W[l] = _mm256_shuffle_epi8(tab, W[l]);
            W[4 + l] = _mm256_shuffle_epi8(tab, W[4 + l]);
        }
    }
}

/* The 8 rows' block sums S for one vector (q: its activations; oe, oo: the
 * block's even and odd halves in the layout). */
static KERNELS_AI __m256i sums_rows(const int kind, const __m256i W[8], const __m256i Ws[8],
                                    const int8_t *q, size_t oe, size_t oo, const int32_t *start)
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (kind == KERNELS_KIND_Q8) {
        __m256i S = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            __m256i x = bcast4_256(q + (l < 4 ? oe + 4 * (size_t)l : oo + 4 * (size_t)(l - 4)));
            __m256i p = _mm256_maddubs_epi16(W[l], _mm256_sign_epi8(x, Ws[l]));
            S = _mm256_add_epi32(S, _mm256_madd_epi16(p, ones));
        }
        return S;
    }
    __m256i e = _mm256_maddubs_epi16(W[0], bcast4_256(q + oe));
    __m256i o = _mm256_maddubs_epi16(W[4], bcast4_256(q + oo));
#pragma GCC unroll 3
    for (int l = 1; l < 4; l++) {
        e = _mm256_add_epi16(e, _mm256_maddubs_epi16(W[l], bcast4_256(q + oe + 4 * (size_t)l)));
        o = _mm256_add_epi16(o, _mm256_maddubs_epi16(W[4 + l], bcast4_256(q + oo + 4 * (size_t)l)));
    }
    __m256i S;
    if (kind == KERNELS_KIND_Q4)
        S = _mm256_madd_epi16(_mm256_add_epi16(e, o), ones);
    else
        S = _mm256_add_epi32(_mm256_madd_epi16(e, ones), _mm256_madd_epi16(o, ones));
    return _mm256_add_epi32(S, _mm256_set1_epi32(*start));
}

/* The scale bits of rows r..r+7, blocks [b0, b1) (b1 - b0 <= SH_BLOCKS),
 * as sh[b - b0][row]: built with scalar stores once per SH_BLOCKS blocks,
 * so each block's scale vector is one load (a gather per block cost a
 * store-forwarding stall and shuffle-port work that every vector waited
 * on). */
#define SH_BLOCKS 64

static KERNELS_AI void tile_scales(const int kind, const kernels_bmat *m, size_t r, size_t b0,
                                   size_t b1, uint32_t sh[][TILE_ROWS])
{
    for (size_t i = 0; i < TILE_ROWS; i++) {
        const uint8_t *s = m->s + (r + i) * m->srow;
        for (size_t b = b0; b < b1; b++)
            sh[b - b0][i] = kind == KERNELS_KIND_MXFP4
                                ? (uint32_t)s[b] << 23
                                : ((uint32_t)s[2 * b] | (uint32_t)s[2 * b + 1] << 8) << 16;
    }
}

/* Rows [r, r + 8) times vectors [v0, v1) of a (v1 - v0 <= TILE_VECS). */
static KERNELS_AI void tile8(const int kind, const kernels_bmat *m, size_t r, const kernels_act *a,
                             size_t v0, size_t v1, float *y, size_t ldy)
{
    _Alignas(32) float acc[TILE_VECS][16][8];
    _Alignas(32) uint32_t sh[SH_BLOCKS][TILE_ROWS];
    const size_t nb = m->nb, cols = m->cols;
    /* the bias of the unsigned weights times the block's activations */
    const int32_t *st = kind == KERNELS_KIND_MXFP4 ? a->bsum : a->bsum8;

    memset(acc, 0, (v1 - v0) * sizeof acc[0]);
    for (size_t b = 0; b < nb; b++) {
        __m256i W[8], Ws[8];
        __m256 c0 = _mm256_set1_ps(1.0f);
        decode8(kind, m, r, b, W, Ws);
        if (kind != KERNELS_KIND_Q8) {
            if (b % SH_BLOCKS == 0)
                tile_scales(kind, m, r, b, b + SH_BLOCKS < nb ? b + SH_BLOCKS : nb, sh);
            c0 = _mm256_castsi256_ps(_mm256_load_si256((const __m256i *)sh[b % SH_BLOCKS]));
            if (kind == KERNELS_KIND_MXFP4)
                c0 = _mm256_mul_ps(c0, _mm256_set1_ps(0.5f));
        }
        const size_t oe = kernels_bpos(nb, b, 0), oo = kernels_bpos(nb, b, 16);
        float *A = &acc[0][b % 16][0];
        for (size_t v = v0; v < v1; v++, A += 16 * 8) {
            __m256i S = sums_rows(kind, W, Ws, a->q + v * cols, oe, oo, st + v * nb + b);
            __m256 d = _mm256_set1_ps(a->d[v * nb + b]);
            __m256 c = kind == KERNELS_KIND_Q8 ? d : _mm256_mul_ps(c0, d);
            _mm256_store_ps(A, _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), c, _mm256_load_ps(A)));
        }
    }
    for (size_t v = v0; v < v1; v++) {
        float (*Av)[8] = acc[v - v0];
        __m256 t[8];
        for (int k = 0; k < 8; k++)
            t[k] = _mm256_add_ps(_mm256_load_ps(Av[k]), _mm256_load_ps(Av[k + 8]));
        for (int k = 0; k < 4; k++)
            t[k] = _mm256_add_ps(t[k], t[k + 4]);
        t[0] = _mm256_add_ps(t[0], t[2]);
        t[1] = _mm256_add_ps(t[1], t[3]);
        __m256 yv = _mm256_add_ps(t[0], t[1]);
        if (kind == KERNELS_KIND_Q8)
            yv = _mm256_mul_ps(yv, _mm256_loadu_ps(m->rs + r));
        _mm256_storeu_ps(y + v * ldy + r, yv);
    }
}

static KERNELS_AI size_t tiles_t(const int kind, const kernels_bmat *m, size_t r0, size_t r1,
                                 const kernels_act *a, float *y, size_t ldy)
{
    size_t r = r0;
    for (; r + TILE_ROWS <= r1; r += TILE_ROWS) {
        /* the tile's compute hides fetching the next tile's weights (rows
         * are contiguous) into L2 */
        if (r + 2 * TILE_ROWS <= r1) {
            const char *nw = (const char *)(m->w + (r + TILE_ROWS) * m->wrow);
            for (size_t o = 0; o < TILE_ROWS * m->wrow; o += 64)
                _mm_prefetch(nw + o, _MM_HINT_T1);
            if (kind != KERNELS_KIND_Q8) {
                const char *ns = (const char *)(m->s + (r + TILE_ROWS) * m->srow);
                for (size_t o = 0; o < TILE_ROWS * m->srow; o += 64)
                    _mm_prefetch(ns + o, _MM_HINT_T1);
            }
        }
        for (size_t v = 0; v < a->n; v += TILE_VECS)
            tile8(kind, m, r, a, v, v + TILE_VECS < a->n ? v + TILE_VECS : a->n, y, ldy);
    }
    return r;
}

size_t kernels_avx2_tiles(int kind, const kernels_bmat *m, size_t r0, size_t r1,
                          const kernels_act *a, float *y, size_t ldy)
{
    switch (kind) {
    case KERNELS_KIND_MXFP4: return tiles_t(KERNELS_KIND_MXFP4, m, r0, r1, a, y, ldy);
    case KERNELS_KIND_Q4:    return tiles_t(KERNELS_KIND_Q4, m, r0, r1, a, y, ldy);
    default:                 return tiles_t(KERNELS_KIND_Q8, m, r0, r1, a, y, ldy);
    }
}

#else
/* Not x86-64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_tile_avx2_unused;
#endif
