/* tile_neon.c — batched fast MXFP4, int4 and int8 products on aarch64
 * NEON (n > 1): 4 rows in the 4 lanes of a register.  Built on every
 * target; empty unless compiled for aarch64.
 *
 * For each block of a 4-row tile the rows' 16 packed bytes (int8: the
 * block's even and odd halves) are transposed once into 8 registers,
 * register l holding in lane r row r's four signed weight codes at the
 * block's layout positions 4l..4l+3 (MXFP4 by a table lookup, int4 as
 * nibble - 8), and the rows' scales into one register.  Then for every
 * vector, widening multiply-accumulates (smull/smlal, low and high halves)
 * of those registers against the vector's activation dwords, broadcast,
 * sum each row's products in int16 lanes, two pairwise adds give the 4
 * rows' exact block sums S (kernels_int.h invariant 2), and one
 * conversion, one multiply for c and one vfmaq (fused, like fmaf) fold
 * them into A[b % 16] of the 4 rows (invariant 3; a 16 KB stack array for
 * up to TILE_VECS vectors).  Same integers, same c, same fused order as
 * the matrix-vector kernel: bit-identical to it and to the scalar
 * reference.
 *
 * int16 ranges: an MXFP4 lane takes 8 products (<= 8 * 12 * 127 = 12192),
 * an int4 lane 8 (<= 7112); int8 products reach 16129, so two per lane,
 * then a pairwise add-accumulate (sadalp) into int32.  Does not own the
 * matrix-vector kernels (kernels_neon.c).
 */
#if defined(__aarch64__)

#include "engine/kernels/kernels_int.h"

#include <arm_neon.h>

#define TILE_ROWS 4
#define TILE_VECS 64
#define SH_BLOCKS 64
#define NEON_AI inline __attribute__((always_inline))

/* 16 bytes of 4 rows (at p + i * rs) as 4 registers: register l, lane r =
 * dword l of row r. */
static NEON_AI void transpose4(const uint8_t *p, size_t rs, int8x16_t out[4])
{
    uint32x4_t r0 = vreinterpretq_u32_u8(vld1q_u8(p)), r1 = vreinterpretq_u32_u8(vld1q_u8(p + rs));
    uint32x4_t r2 = vreinterpretq_u32_u8(vld1q_u8(p + 2 * rs));
    uint32x4_t r3 = vreinterpretq_u32_u8(vld1q_u8(p + 3 * rs));
    uint64x2_t t0 = vreinterpretq_u64_u32(vtrn1q_u32(r0, r1)), t1 = vreinterpretq_u64_u32(vtrn2q_u32(r0, r1));
    uint64x2_t t2 = vreinterpretq_u64_u32(vtrn1q_u32(r2, r3)), t3 = vreinterpretq_u64_u32(vtrn2q_u32(r2, r3));
    out[0] = vreinterpretq_s8_u64(vtrn1q_u64(t0, t2));
    out[1] = vreinterpretq_s8_u64(vtrn1q_u64(t1, t3));
    out[2] = vreinterpretq_s8_u64(vtrn2q_u64(t0, t2));
    out[3] = vreinterpretq_s8_u64(vtrn2q_u64(t1, t3));
}

/* Block b of rows r..r+3 in lanes: W[l] (l < 4) positions 4l..4l+3 (even
 * half), W[4 + l] positions 16+4l.. (odd half), signed weight codes. */
static NEON_AI void decode4(const int kind, const kernels_bmat *m, size_t r, size_t b, int8x16_t W[8])
{
    const uint8_t *w = m->w + r * m->wrow;
    if (kind == KERNELS_KIND_Q8) {
        transpose4(w + kernels_bpos(m->nb, b, 0), m->wrow, W);
        transpose4(w + kernels_bpos(m->nb, b, 16), m->wrow, W + 4);
        return;
    }
    const int8x16_t tab = vld1q_s8(kernels_e2m1x2);
    int8x16_t pk[4];
    transpose4(w + b * 16, m->wrow, pk);
    for (int l = 0; l < 4; l++) {
        uint8x16_t u = vreinterpretq_u8_s8(pk[l]);
        uint8x16_t lo = vandq_u8(u, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(u, 4);
        if (kind == KERNELS_KIND_MXFP4) {
            W[l] = vqtbl1q_s8(tab, lo);
            W[4 + l] = vqtbl1q_s8(tab, hi);
        } else {
            W[l] = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8));
            W[4 + l] = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8));
        }
    }
}

/* Four activation bytes in every 32-bit lane. */
static NEON_AI int8x16_t bcast4(const int8_t *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    return vreinterpretq_s8_u32(vdupq_n_u32(x));
}

/* The 4 rows' block sums S for one vector (q: its activations; oe, oo: the
 * block's even and odd halves in the layout). */
static NEON_AI int32x4_t sums_rows(const int kind, const int8x16_t W[8], const int8_t *q, size_t oe,
                                   size_t oo)
{
    int8x16_t x[8];
    for (int l = 0; l < 4; l++) {
        x[l] = bcast4(q + oe + 4 * (size_t)l);
        x[4 + l] = bcast4(q + oo + 4 * (size_t)l);
    }
    if (kind == KERNELS_KIND_Q8) {
        int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
        for (int l = 0; l < 8; l += 2) {
            int16x8_t pl = vmull_s8(vget_low_s8(W[l]), vget_low_s8(x[l]));
            int16x8_t ph = vmull_high_s8(W[l], x[l]);
            pl = vmlal_s8(pl, vget_low_s8(W[l + 1]), vget_low_s8(x[l + 1]));
            ph = vmlal_high_s8(ph, W[l + 1], x[l + 1]);
            lo = vpadalq_s16(lo, pl);
            hi = vpadalq_s16(hi, ph);
        }
        return vpaddq_s32(lo, hi);
    }
    int16x8_t pl = vmull_s8(vget_low_s8(W[0]), vget_low_s8(x[0]));
    int16x8_t ph = vmull_high_s8(W[0], x[0]);
    for (int l = 1; l < 8; l++) {
        pl = vmlal_s8(pl, vget_low_s8(W[l]), vget_low_s8(x[l]));
        ph = vmlal_high_s8(ph, W[l], x[l]);
    }
    /* [r0 (0+1), r0 (2+3), r1 .., r1 ..] and the same for rows 2, 3 */
    return vpaddq_s32(vpaddlq_s16(pl), vpaddlq_s16(ph));
}

/* The scale bits of rows r..r+3, blocks [b0, b1), as sh[b - b0][row]. */
static NEON_AI void tile_scales(const int kind, const kernels_bmat *m, size_t r, size_t b0, size_t b1,
                                uint32_t sh[][TILE_ROWS])
{
    for (size_t i = 0; i < TILE_ROWS; i++) {
        const uint8_t *s = m->s + (r + i) * m->srow;
        for (size_t b = b0; b < b1; b++)
            sh[b - b0][i] = kind == KERNELS_KIND_MXFP4
                                ? (uint32_t)s[b] << 23
                                : ((uint32_t)s[2 * b] | (uint32_t)s[2 * b + 1] << 8) << 16;
    }
}

/* Rows [r, r + 4) times vectors [v0, v1) of a (v1 - v0 <= TILE_VECS). */
static NEON_AI void tile4(const int kind, const kernels_bmat *m, size_t r, const kernels_act *a,
                          size_t v0, size_t v1, float *y, size_t ldy)
{
    float acc[TILE_VECS][16][4];
    uint32_t sh[SH_BLOCKS][TILE_ROWS];
    const size_t nb = m->nb, cols = m->cols;

    memset(acc, 0, (v1 - v0) * sizeof acc[0]);
    for (size_t b = 0; b < nb; b++) {
        int8x16_t W[8];
        float32x4_t c0 = vdupq_n_f32(1.0f);
        decode4(kind, m, r, b, W);
        if (kind != KERNELS_KIND_Q8) {
            if (b % SH_BLOCKS == 0)
                tile_scales(kind, m, r, b, b + SH_BLOCKS < nb ? b + SH_BLOCKS : nb, sh);
            c0 = vreinterpretq_f32_u32(vld1q_u32(sh[b % SH_BLOCKS]));
            if (kind == KERNELS_KIND_MXFP4)
                c0 = vmulq_f32(c0, vdupq_n_f32(0.5f));
        }
        const size_t oe = kernels_bpos(nb, b, 0), oo = kernels_bpos(nb, b, 16);
        float *A = &acc[0][b % 16][0];
        for (size_t v = v0; v < v1; v++, A += 16 * 4) {
            int32x4_t S = sums_rows(kind, W, a->q + v * cols, oe, oo);
            float32x4_t d = vdupq_n_f32(a->d[v * nb + b]);
            float32x4_t c = kind == KERNELS_KIND_Q8 ? d : vmulq_f32(c0, d);
            vst1q_f32(A, vfmaq_f32(vld1q_f32(A), vcvtq_f32_s32(S), c));
        }
    }
    for (size_t v = v0; v < v1; v++) {
        float (*Av)[4] = acc[v - v0];
        float32x4_t t[8];
        for (int k = 0; k < 8; k++)
            t[k] = vaddq_f32(vld1q_f32(Av[k]), vld1q_f32(Av[k + 8]));
        for (int k = 0; k < 4; k++)
            t[k] = vaddq_f32(t[k], t[k + 4]);
        t[0] = vaddq_f32(t[0], t[2]);
        t[1] = vaddq_f32(t[1], t[3]);
        float32x4_t yv = vaddq_f32(t[0], t[1]);
        if (kind == KERNELS_KIND_Q8)
            yv = vmulq_f32(yv, vld1q_f32(m->rs + r));
        vst1q_f32(y + v * ldy + r, yv);
    }
}

static NEON_AI size_t tiles_t(const int kind, const kernels_bmat *m, size_t r0, size_t r1,
                              const kernels_act *a, float *y, size_t ldy)
{
    size_t r = r0;
    for (; r + TILE_ROWS <= r1; r += TILE_ROWS) {
        /* the next tile's weights (rows are contiguous) towards the caches */
        if (r + 2 * TILE_ROWS <= r1)
            for (size_t o = 0; o < TILE_ROWS * m->wrow; o += 64)
                __builtin_prefetch(m->w + (r + TILE_ROWS) * m->wrow + o, 0, 2);
        for (size_t v = 0; v < a->n; v += TILE_VECS)
            tile4(kind, m, r, a, v, v + TILE_VECS < a->n ? v + TILE_VECS : a->n, y, ldy);
    }
    return r;
}

size_t kernels_neon_tiles(int kind, const kernels_bmat *m, size_t r0, size_t r1,
                          const kernels_act *a, float *y, size_t ldy)
{
    switch (kind) {
    case KERNELS_KIND_MXFP4: return tiles_t(KERNELS_KIND_MXFP4, m, r0, r1, a, y, ldy);
    case KERNELS_KIND_Q4:    return tiles_t(KERNELS_KIND_Q4, m, r0, r1, a, y, ldy);
    default:                 return tiles_t(KERNELS_KIND_Q8, m, r0, r1, a, y, ldy);
    }
}

#else
/* Not aarch64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_tile_neon_unused;
#endif
