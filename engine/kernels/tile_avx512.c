/* tile_avx512.c — batched fast MXFP4, int4 and int8 products on AVX-512
 * VNNI (n > 1; compiled with AVX-512 F/BW/VL/VNNI flags, called only when
 * the CPU has them): 16 rows in the 16 lanes of a register.
 *
 * For each block of a 16-row tile the rows' 16 packed bytes (int8: the
 * block's even and odd halves) are transposed once into 8 registers
 * (register l, lane r: row r's four weight codes at the block's layout
 * positions 4l..4l+3, unsigned as dpbusd wants them: MXFP4 biased e2m1,
 * int4 q + 8, int8 w + 128) and the rows' scales into one.  Then for every
 * vector 8 dpbusd against the vector's activation dwords, broadcast,
 * starting at minus the bias times the block's activation sum (the
 * quantizer's bsum, bsum8, bsum128), give the 16 rows' exact
 * block sums S, and one conversion, one multiply for c and one FMA fold
 * them into A[b % 16] of each row (kernels_int.h invariant 3; kept in a
 * 64 KB stack array for up to TILE_VECS vectors).  Same integers, same c,
 * same FMA order and reduction as the matrix-vector kernel: bit-identical
 * to it and to the scalar reference.  Per 16 rows and block that is 8
 * dpbusd and 1 FMA (docs/kernels.md).  Does not own the matrix-vector
 * kernels (kernels_avx512.c).
 */
#if defined(__x86_64__)

#include "engine/kernels/kernels_avx2_int.h"

#define TILE_ROWS 16
#define TILE_VECS 64

/* Four activation bytes, as the dword in every lane. */
static KERNELS_AI __m512i bcast4(const int8_t *p)
{
    int32_t x;
    memcpy(&x, p, 4);
    return _mm512_set1_epi32(x);
}

/* 16 bytes of 16 rows (at p + i * rs) as 4 registers: register l, lane r =
 * dword l of row r. */
static KERNELS_AI void transpose16(const uint8_t *p, size_t rs, __m512i out[4])
{
    const __m512i ia = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
    const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(2));
    /* in[j]: rows 4j..4j+3, 16 bytes (4 dwords) each */
    __m512i in[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const uint8_t *pj = p + 4 * (size_t)j * rs;
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
    out[0] = _mm512_shuffle_i32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0));
    out[1] = _mm512_shuffle_i32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2));
    out[2] = _mm512_shuffle_i32x4(b0, b1, _MM_SHUFFLE(1, 0, 1, 0));
    out[3] = _mm512_shuffle_i32x4(b0, b1, _MM_SHUFFLE(3, 2, 3, 2));
}

/* Block b of rows r..r+15 in lanes as dpbusd's unsigned operand: W[l]
 * (l < 4) positions 4l..4l+3 (even half), W[4 + l] positions 16+4l..
 * (odd half). */
static KERNELS_AI void decode16(const int kind, const kernels_bmat *m, size_t r, size_t b,
                                __m512i W[8])
{
    const uint8_t *w = m->w + r * m->wrow;
    if (kind == KERNELS_KIND_Q8) {
        const __m512i k128 = _mm512_set1_epi8((char)0x80);
        transpose16(w + kernels_bpos(m->nb, b, 0), m->wrow, W);
        transpose16(w + kernels_bpos(m->nb, b, 16), m->wrow, W + 4);
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++)
            W[l] = _mm512_xor_si512(W[l], k128);
        return;
    }
    const __m512i tab = _mm512_broadcast_i32x4(tab_biased128());
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512i pk[4];
    transpose16(w + b * 16, m->wrow, pk);
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) {
        W[l] = _mm512_and_si512(pk[l], m4);
        W[4 + l] = _mm512_and_si512(_mm512_srli_epi16(pk[l], 4), m4);
        if (kind == KERNELS_KIND_MXFP4) {
            W[l] = _mm512_shuffle_epi8(tab, W[l]);
            W[4 + l] = _mm512_shuffle_epi8(tab, W[4 + l]);
        }
    }
}

/* The scale bits of rows r..r+15, blocks [b0, b1) (b1 - b0 <= SH_BLOCKS),
 * as sh[b - b0][row], built with scalar stores once per SH_BLOCKS blocks
 * so that each block's scale vector is one load (gathering it per block
 * stalled on store forwarding). */
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

/* Rows [r, r + 16) times vectors [v0, v1) of a (v1 - v0 <= TILE_VECS). */
static KERNELS_AI void tile16(const int kind, const kernels_bmat *m, size_t r, const kernels_act *a,
                              size_t v0, size_t v1, float *y, size_t ldy)
{
    _Alignas(64) float acc[TILE_VECS][16][16];
    _Alignas(64) uint32_t sh[SH_BLOCKS][TILE_ROWS];
    const size_t nb = m->nb, cols = m->cols;
    /* the lanes start at -bias * (sum of the block's activations) */
    const int32_t *st = kind == KERNELS_KIND_MXFP4 ? a->bsum : kind == KERNELS_KIND_Q4 ? a->bsum8
                                                                                     : a->bsum128;

    memset(acc, 0, (v1 - v0) * sizeof acc[0]);
    for (size_t b = 0; b < nb; b++) {
        __m512i W[8];
        __m512 c0 = _mm512_set1_ps(1.0f);
        decode16(kind, m, r, b, W);
        if (kind != KERNELS_KIND_Q8) {
            if (b % SH_BLOCKS == 0)
                tile_scales(kind, m, r, b, b + SH_BLOCKS < nb ? b + SH_BLOCKS : nb, sh);
            c0 = _mm512_castsi512_ps(_mm512_load_si512(sh[b % SH_BLOCKS]));
            if (kind == KERNELS_KIND_MXFP4)
                c0 = _mm512_mul_ps(c0, _mm512_set1_ps(0.5f));
        }
        /* the block's even and odd halves in the activation layout */
        const size_t oe = kernels_bpos(nb, b, 0), oo = kernels_bpos(nb, b, 16);
        float *A = &acc[0][b % 16][0];
        for (size_t v = v0; v < v1; v++, A += 16 * 16) {
            const int8_t *q = a->q + v * cols;
            __m512i s0 = _mm512_set1_epi32(st[v * nb + b]), s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int l = 0; l < 4; l++) {
                s0 = _mm512_dpbusd_epi32(s0, W[l], bcast4(q + oe + 4 * l));
                s1 = _mm512_dpbusd_epi32(s1, W[4 + l], bcast4(q + oo + 4 * l));
            }
            __m512 d = _mm512_set1_ps(a->d[v * nb + b]);
            __m512 c = kind == KERNELS_KIND_Q8 ? d : _mm512_mul_ps(c0, d);
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
        __m512 yv = _mm512_add_ps(t[0], t[1]);
        if (kind == KERNELS_KIND_Q8)
            yv = _mm512_mul_ps(yv, _mm512_loadu_ps(m->rs + r));
        _mm512_storeu_ps(y + v * ldy + r, yv);
    }
}

static KERNELS_AI size_t tiles_t(const int kind, const kernels_bmat *m, size_t r0, size_t r1,
                                 const kernels_act *a, float *y, size_t ldy)
{
    size_t r = r0;
    for (; r + TILE_ROWS <= r1; r += TILE_ROWS) {
        /* the tile's compute hides fetching the next tile's weights (rows
         * are contiguous; from DRAM when the expert was just streamed in)
         * into L2 */
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
            tile16(kind, m, r, a, v, v + TILE_VECS < a->n ? v + TILE_VECS : a->n, y, ldy);
    }
    return r;
}

size_t kernels_avx512_tiles(int kind, const kernels_bmat *m, size_t r0, size_t r1,
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
typedef int kernels_tile_avx512_unused;
#endif
