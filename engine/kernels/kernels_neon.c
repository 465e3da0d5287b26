/* kernels_neon.c — aarch64 Advanced SIMD row kernels: matrix-vector fast
 * MXFP4, int8 and int4, exact MXFP4 and f32 (batches of the block-fold
 * formats go to tile_neon.c).  Built on every target; empty unless
 * compiled for aarch64 (NEON is part of the base ISA there, so no extra
 * flags and no run-time check are needed).
 *
 * Fast MXFP4, int4 and int8 share one template: a table lookup (tbl) turns
 * MXFP4 nibbles into doubled e2m1 values, int4 nibbles lose their + 8,
 * widening multiplies (smull) and pairwise adds give each block's exact
 * integer sum S (kernels_int.h invariant 2), and vfmaq (fused, like fmaf)
 * folds four blocks at a time into the accumulators of invariant 3:
 * bit-identical to the scalar reference.  sdot (dotprod) would do the lane
 * sums in one instruction but is optional before Armv8.4; the base-ISA
 * form keeps this file portable to every aarch64 machine.
 */
#if defined(__aarch64__)

#include "engine/kernels/kernels_int.h"

#include <arm_neon.h>

/* Lane sums of 16 weight and 16 activation bytes: 4 int32 lanes, lane l
 * the sum of products 4l..4l+3. */
static inline int32x4_t dot16(int8x16_t w, int8x16_t a)
{
    int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
    int16x8_t hi = vmull_high_s8(w, a);
    return vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
}

/* The weight codes of block k of group g (w: the row): even half (lo) and
 * odd half (hi) in the activation layout, signed (MXFP4 doubled e2m1 by a
 * table lookup, int4 q = nibble - 8, int8 as stored). */
static inline __attribute__((always_inline)) void
block_weights(const int kind, const uint8_t *w, size_t g, size_t k, int8x16_t *lo, int8x16_t *hi)
{
    if (kind == KERNELS_KIND_Q8) {
        *lo = vld1q_s8((const int8_t *)w + 128 * g + 16 * k);
        *hi = vld1q_s8((const int8_t *)w + 128 * g + 64 + 16 * k);
        return;
    }
    uint8x16_t v = vld1q_u8(w + (4 * g + k) * 16);
    uint8x16_t l = vandq_u8(v, vdupq_n_u8(0x0F)), h = vshrq_n_u8(v, 4);
    if (kind == KERNELS_KIND_MXFP4) {
        const int8x16_t tab = vld1q_s8(kernels_e2m1x2);
        *lo = vqtbl1q_s8(tab, l);
        *hi = vqtbl1q_s8(tab, h);
    } else {
        *lo = vsubq_s8(vreinterpretq_s8_u8(l), vdupq_n_s8(8));
        *hi = vsubq_s8(vreinterpretq_s8_u8(h), vdupq_n_s8(8));
    }
}

/* c_b of invariant 3 for blocks b..b+3 (s: the row's scales at block b). */
static inline __attribute__((always_inline)) float32x4_t
scales4(const int kind, const uint8_t *s, const float *d)
{
    float32x4_t dv = vld1q_f32(d);
    if (kind == KERNELS_KIND_MXFP4) {
        uint32_t e[4] = { s[0], s[1], s[2], s[3] };
        float32x4_t f = vreinterpretq_f32_u32(vshlq_n_u32(vld1q_u32(e), 23));
        return vmulq_f32(vmulq_f32(f, vdupq_n_f32(0.5f)), dv);
    }
    if (kind == KERNELS_KIND_Q4) {
        uint16x4_t h = vreinterpret_u16_u8(vld1_u8(s));
        return vmulq_f32(vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(h), 16)), dv);
    }
    return dv;
}

/* One row times one vector (invariants 2-4): per group of four blocks,
 * each block's 32 products summed to four lanes (dot16), the four blocks'
 * lanes reduced to their sums S by two pairwise adds and folded with one
 * vfmaq (fused, like fmaf) into A[b % 16]; the partial group of a row
 * goes to the scalar tail. */
static inline __attribute__((always_inline)) float
row_t(const int kind, const kernels_bmat *m, size_t r, const kernels_act *a, size_t v)
{
    const size_t nb = m->nb, gb = kind == KERNELS_KIND_Q8 ? 128 : 64;  /* bytes a group */
    const size_t sb = kind == KERNELS_KIND_Q4 ? 2 : 1;                  /* scale bytes a block */
    const uint8_t *w = m->w + r * m->wrow;
    const uint8_t *s = kind == KERNELS_KIND_Q8 ? NULL : m->s + r * m->srow;
    const int8_t *q = a->q + v * m->cols;
    const float *d = a->d + v * nb;
    float32x4_t acc[4];
    size_t b = 0;

    for (int i = 0; i < 4; i++)
        acc[i] = vdupq_n_f32(0);
    for (; b + 4 <= nb; b += 4) {
        size_t g = b / 4;  /* a full group: the partial one is the tail's */
        const int8_t *Q = q + 128 * g;
        int32x4_t x[4];
        __builtin_prefetch(w + g * gb + KERNELS_PREFETCH);
        if (kind == KERNELS_KIND_Q8)
            __builtin_prefetch(w + g * gb + KERNELS_PREFETCH + 64);
        for (size_t k = 0; k < 4; k++) {
            int8x16_t wl, wh;
            block_weights(kind, w, g, k, &wl, &wh);
            x[k] = vaddq_s32(dot16(wl, vld1q_s8(Q + 16 * k)), dot16(wh, vld1q_s8(Q + 64 + 16 * k)));
        }
        int32x4_t S = vpaddq_s32(vpaddq_s32(x[0], x[1]), vpaddq_s32(x[2], x[3]));
        float32x4_t *A = acc + (b % 16) / 4;
        *A = vfmaq_f32(*A, vcvtq_f32_s32(S), scales4(kind, s ? s + b * sb : NULL, d + b));
    }
    float A[16];
    for (int i = 0; i < 4; i++)
        vst1q_f32(A + 4 * i, acc[i]);
    kernels_fold_blocks(kind, A, w, s, q, d, b, nb);
    float y = kernels_reduce16(A);
    return kind == KERNELS_KIND_Q8 ? y * m->rs[r] : y;
}

/* Rows [r0, r1) times every vector: 4-row tiles for batches (tile_neon.c),
 * the matrix-vector kernel for n = 1 and the rows left over. */
static inline __attribute__((always_inline)) void
rows_t(const int kind, const kernels_bmat *m, size_t r0, size_t r1, const kernels_act *a,
       float *y, size_t ldy)
{
    size_t r = a->n > 1 ? kernels_neon_tiles(kind, m, r0, r1, a, y, ldy) : r0;
    for (; r < r1; r++)
        for (size_t v = 0; v < a->n; v++)
            y[v * ldy + r] = row_t(kind, m, r, a, v);
}

static void neon_mxfp4_fast(const kernels_mxfp4 *w, size_t r0, size_t r1,
                            const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_mxfp4(w);
    rows_t(KERNELS_KIND_MXFP4, &m, r0, r1, a, y, ldy);
}

static void neon_q8(const kernels_q8 *w, size_t r0, size_t r1,
                    const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_q8(w);
    rows_t(KERNELS_KIND_Q8, &m, r0, r1, a, y, ldy);
}

void kernels_q4_rows_neon(const kernels_q4 *w, size_t r0, size_t r1,
                          const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_q4(w);
    rows_t(KERNELS_KIND_Q4, &m, r0, r1, a, y, ldy);
}

/* Exact: decode a block to f32 in column order, FMA against x, scale the
 * block sum by its power of two (exact); differs from the reference only
 * in summation order. */
static float row_exact(const uint8_t *p, const uint8_t *s, size_t nb, const float *x)
{
    const int8x16_t tab = vld1q_s8(kernels_e2m1x2);
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);

    for (size_t b = 0; b < nb; b++) {
        uint8x16_t v = vld1q_u8(p + b * 16);
        uint8x16_t lo = vandq_u8(v, m4), hi = vshrq_n_u8(v, 4);
        int8x16_t c0 = vqtbl1q_s8(tab, vzip1q_u8(lo, hi));  /* columns 0..15 */
        int8x16_t c1 = vqtbl1q_s8(tab, vzip2q_u8(lo, hi));  /* columns 16..31 */
        int16x8_t h[4] = { vmovl_s8(vget_low_s8(c0)), vmovl_high_s8(c0),
                           vmovl_s8(vget_low_s8(c1)), vmovl_high_s8(c1) };
        float32x4_t bs = vdupq_n_f32(0);
        for (int k = 0; k < 4; k++) {
            bs = vfmaq_f32(bs, vcvtq_f32_s32(vmovl_s16(vget_low_s16(h[k]))),
                           vld1q_f32(x + b * 32 + 8 * k));
            bs = vfmaq_f32(bs, vcvtq_f32_s32(vmovl_high_s16(h[k])),
                           vld1q_f32(x + b * 32 + 8 * k + 4));
        }
        float32x4_t c = vdupq_n_f32(kernels_ue8m0(s[b]) * 0.5f);
        if (b & 1)
            acc1 = vfmaq_f32(acc1, bs, c);
        else
            acc0 = vfmaq_f32(acc0, bs, c);
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

static void neon_mxfp4_exact(const kernels_mxfp4 *w, size_t r0, size_t r1,
                             const float *x, size_t n, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK;
    for (size_t r = r0; r < r1; r++)
        for (size_t v = 0; v < n; v++)
            y[v * ldy + r] = row_exact(w->packed + r * nb * 16, w->scale + r * nb, nb,
                                       x + v * w->cols);
}

static void neon_f32(const kernels_f32 *w, size_t r0, size_t r1,
                     const float *x, size_t n, float *y, size_t ldy)
{
    size_t cols = w->cols;
    for (size_t r = r0; r < r1; r++) {
        const float *wr = w->w + r * cols;
        for (size_t v = 0; v < n; v++) {
            const float *xv = x + v * cols;
            float32x4_t a0 = vdupq_n_f32(0), a1 = vdupq_n_f32(0);
            float32x4_t a2 = vdupq_n_f32(0), a3 = vdupq_n_f32(0);
            size_t j = 0;
            for (; j + 16 <= cols; j += 16) {
                a0 = vfmaq_f32(a0, vld1q_f32(wr + j), vld1q_f32(xv + j));
                a1 = vfmaq_f32(a1, vld1q_f32(wr + j + 4), vld1q_f32(xv + j + 4));
                a2 = vfmaq_f32(a2, vld1q_f32(wr + j + 8), vld1q_f32(xv + j + 8));
                a3 = vfmaq_f32(a3, vld1q_f32(wr + j + 12), vld1q_f32(xv + j + 12));
            }
            float acc = vaddvq_f32(vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3)));
            for (; j < cols; j++)
                acc += wr[j] * xv[j];
            y[v * ldy + r] = acc;
        }
    }
}

const kernels_ops kernels_ops_neon = {
    neon_mxfp4_fast, neon_mxfp4_exact, neon_q8, neon_f32,
    kernels_act_quant_scalar, kernels_situ_scalar
};

#else
/* Not aarch64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_neon_unused;
#endif
