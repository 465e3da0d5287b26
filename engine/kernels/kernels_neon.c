/* kernels_neon.c — aarch64 Advanced SIMD row kernels.  Built on every
 * target; empty unless compiled for aarch64 (NEON is part of the base ISA
 * there, so no extra flags and no run-time check are needed).
 *
 * Fast MXFP4 and int8: a table lookup (tbl) turns nibbles into doubled e2m1
 * values, widening multiplies (smull) and two pairwise adds give 4-byte
 * lane sums exactly (int8: the eight lanes of kernels_int.h invariant 2;
 * MXFP4: added up to one sum per block), and vfmaq (fused, like fmaf)
 * folds them into the accumulators of invariant 3: bit-identical to the
 * scalar reference.  sdot (dotprod) would do the lane sums in one
 * instruction but is optional before Armv8.4; the base-ISA form keeps this
 * file portable to every aarch64 machine.
 */
#if defined(__aarch64__)

#include "engine/kernels/kernels_int.h"

#include <arm_neon.h>

/* Lane sums of 16 weight and 16 activation bytes: 4 int32 lanes. */
static inline int32x4_t dot16(int8x16_t w, int8x16_t a)
{
    int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
    int16x8_t hi = vmull_high_s8(w, a);
    return vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi));
}

/* Invariant 4 on A[p] stored as two float32x4 (lanes 0-3, 4-7) each. */
static inline float reduce(const float32x4_t a[8])
{
    float32x4_t tl = vaddq_f32(vaddq_f32(a[0], a[4]), vaddq_f32(a[2], a[6]));
    float32x4_t th = vaddq_f32(vaddq_f32(a[1], a[5]), vaddq_f32(a[3], a[7]));
    float32x4_t u = vaddq_f32(tl, th);
    float32x2_t v = vadd_f32(vget_low_f32(u), vget_high_f32(u));
    return vget_lane_f32(v, 0) + vget_lane_f32(v, 1);
}

/* One row times one vector (invariants 2-4, MXFP4): each block's 32
 * products summed to one integer (dot16 lanes, then an across-vector add),
 * four consecutive blocks folded with one vfmaq into A[b % 16]. */
static float row_fast(const uint8_t *p, const uint8_t *s, size_t nb,
                      const int8_t *q, const float *d)
{
    const int8x16_t tab = vld1q_s8(kernels_e2m1x2);
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float32x4_t acc[4];
    size_t b = 0;

    for (int i = 0; i < 4; i++)
        acc[i] = vdupq_n_f32(0);
    for (; b + 4 <= nb; b += 4) {
        size_t g = b / 4;  /* a full group: the partial one is the tail's */
        const int8_t *Q = q + 128 * g;
        int32_t S[4];
        float c[4];
        __builtin_prefetch(p + 64 * g + KERNELS_PREFETCH);
        for (size_t k = 0; k < 4; k++) {
            uint8x16_t v = vld1q_u8(p + (b + k) * 16);
            int8x16_t wl = vqtbl1q_s8(tab, vandq_u8(v, m4));
            int8x16_t wh = vqtbl1q_s8(tab, vshrq_n_u8(v, 4));
            S[k] = vaddvq_s32(vaddq_s32(dot16(wl, vld1q_s8(Q + 16 * k)),
                                        dot16(wh, vld1q_s8(Q + 64 + 16 * k))));
            c[k] = (kernels_ue8m0(s[b + k]) * 0.5f) * d[b + k];
        }
        float32x4_t *A = acc + (b % 16) / 4;
        *A = vfmaq_f32(*A, vcvtq_f32_s32(vld1q_s32(S)), vld1q_f32(c));
    }
    float A[16];
    for (int i = 0; i < 4; i++)
        vst1q_f32(A + 4 * i, acc[i]);
    kernels_fast_blocks(A, p, s, q, d, b, nb);
    return kernels_reduce16(A);
}

static void neon_mxfp4_fast(const kernels_mxfp4 *w, size_t r0, size_t r1,
                            const kernels_act *a, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK;
    for (size_t r = r0; r < r1; r++)
        for (size_t v = 0; v < a->n; v++)
            y[v * ldy + r] = row_fast(w->packed + r * nb * 16, w->scale + r * nb, nb,
                                      a->q + v * nb * 32, a->d + v * nb);
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

static void neon_q8(const kernels_q8 *w, size_t r0, size_t r1,
                    const kernels_act *a, float *y, size_t ldy)
{
    size_t nb = w->cols / KERNELS_BLOCK;
    for (size_t r = r0; r < r1; r++) {
        const int8_t *wr = w->q + r * w->cols;
        for (size_t v = 0; v < a->n; v++) {
            const int8_t *q = a->q + v * w->cols;
            const float *d = a->d + v * nb;
            float32x4_t acc[8];
            for (int i = 0; i < 8; i++)
                acc[i] = vdupq_n_f32(0);
            for (size_t g = 0; g * 4 < nb; g++) {
                size_t gs = nb - 4 * g < 4 ? nb - 4 * g : 4;
                const int8_t *W = wr + 128 * g, *Q = q + 128 * g;
                __builtin_prefetch(W + KERNELS_PREFETCH);
                __builtin_prefetch(W + KERNELS_PREFETCH + 64);
                for (size_t k = 0; k < gs; k++) {
                    float32x4_t c = vdupq_n_f32(d[4 * g + k]);
                    float32x4_t *A = acc + k * 2;
                    size_t e = 16 * k, o = 16 * gs + 16 * k;
                    A[0] = vfmaq_f32(A[0], vcvtq_f32_s32(dot16(vld1q_s8(W + e), vld1q_s8(Q + e))), c);
                    A[1] = vfmaq_f32(A[1], vcvtq_f32_s32(dot16(vld1q_s8(W + o), vld1q_s8(Q + o))), c);
                }
            }
            y[v * ldy + r] = reduce(acc) * w->scale[r];
        }
    }
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
