/* kernels_int.h — private to engine/kernels: the quantized-activation
 * record, the per-ISA row kernels and the table that selects them.
 *
 * Invariants of the fast path (every ISA variant keeps them, which is what
 * makes them bit-identical to the scalar reference):
 *  1. A block is 32 columns; position i < 16 of a block is its even column
 *     2i (low nibble of packed byte i), position 16 + i its odd column
 *     2i + 1 (high nibble).  int8 activations and int8 spine weights are
 *     stored in groups of up to 4 blocks (the last group of a row may be
 *     shorter, gs blocks): first the even halves of the group's blocks, 16
 *     bytes each, then their odd halves (kernels_bpos).  So one 64-byte
 *     load of packed MXFP4 bytes, masked to low nibbles, lines up with 64
 *     contiguous activation bytes, and its high nibbles with the next 64:
 *     no shuffle is needed to pair weights with activations.
 *  2. Position i of a block holds the weight code w_i (MXFP4: the doubled
 *     e2m1 value, an integer in [-12, 12]; int8: q in [-127, 127]) and the
 *     activation a_i.
 *     MXFP4: the block gives one integer S = sum_{i<32} w_i * a_i (exact in
 *     any order: |S| <= 32 * 12 * 127).
 *     int8: the block gives 8 integer lane sums P[l] = sum_{k<4}
 *     w_{4l+k} * a_{4l+k}: 4 consecutive bytes in memory, exactly the int32
 *     lanes of maddubs+madd (AVX2), dpbusd (AVX-512) and smull+pairwise
 *     adds (NEON).
 *  3. MXFP4: block b of a row is folded into float accumulator A[b % 16] by
 *     A = fmaf((float)S, c_b, A), c_b = (weight scale * 0.5) * d_b (0.5
 *     undoes the doubling); blocks in order.  Sixteen accumulators let a
 *     batched kernel keep 16 rows in the lanes of one register (one FMA per
 *     16 rows and block) and a matrix-vector kernel fold 16 blocks at once.
 *     int8: block b is folded into A[b % 4][l] by A = fmaf((float)P[l], d_b,
 *     A); blocks in order.
 *  4. MXFP4: the row's result is (kernels_reduce16)
 *        t[k] = A[k] + A[k+8],  u[k] = t[k] + t[k+4],  v[k] = u[k] + u[k+2],
 *        y = v[0] + v[1].
 *     int8 (kernels_reduce32):
 *        t[l] = (A[0][l] + A[2][l]) + (A[1][l] + A[3][l])
 *        u[l] = t[l] + t[l+4],  v[l] = u[l] + u[l+2],  y = v[0] + v[1]
 *     times the row scale.
 */
#ifndef SHOAL_KERNELS_INT_H
#define SHOAL_KERNELS_INT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/kernels/kernels.h"

#define KERNELS_BLOCK 32
/* Added to every doubled e2m1 value so dpbusd sees unsigned weights. */
#define KERNELS_VNNI_BIAS 12
/* Batched AVX2 fast MXFP4 (n > 1) decodes a row once into a buffer of this
 * many bytes (on the stack) and reuses it for every vector; longer rows
 * fall back to decoding per vector.  The AVX-512 int8 spine stores tiles
 * of 4 rows (64 KB on the stack); AVX-512 fast MXFP4 needs no row buffer
 * (16-row tiles decoded per block, 64 KB of accumulators on the stack). */
#define KERNELS_ROWBUF 16384
/* Rows a thread takes at a time (a multiple of 32: the expert helper
 * quantizes the h rows it computed in whole blocks). */
#define KERNELS_CHUNK_ROWS 64
/* Software prefetch distance on packed bytes (scales: this / 16). */
#ifndef KERNELS_PREFETCH
#define KERNELS_PREFETCH 4096
#endif

struct kernels_act {
    size_t cols, n;          /* current contents */
    size_t cap_blocks;       /* room, in blocks of 32 */
    int8_t *q;               /* [n][cols], invariant 1 order */
    float *d;                /* [n][cols/32] block scales */
    int32_t *bias;           /* [n][cols/4]: -BIAS * sum of q[4j..4j+3] */
    int32_t *bsum;           /* [n][cols/32]: -BIAS * sum of a block's q */
};

/* Quantize blocks [b0, b1) of vector v (x points at that vector). */
void kernels_act_quantize_blocks(kernels_act *act, size_t v, const float *x,
                                 size_t b0, size_t b1);

/* Row kernels: Y[v][r] for r in [r0, r1), v < n; y has row stride ldy. */
typedef struct kernels_ops {
    void (*mxfp4_fast)(const kernels_mxfp4 *w, size_t r0, size_t r1,
                       const kernels_act *a, float *y, size_t ldy);
    void (*mxfp4_exact)(const kernels_mxfp4 *w, size_t r0, size_t r1,
                        const float *x, size_t n, float *y, size_t ldy);
    void (*q8)(const kernels_q8 *w, size_t r0, size_t r1,
               const kernels_act *a, float *y, size_t ldy);
    void (*f32)(const kernels_f32 *w, size_t r0, size_t r1,
                const float *x, size_t n, float *y, size_t ldy);
    /* kernels_act_quantize_blocks (same bits on every ISA) */
    void (*act_quant)(kernels_act *act, size_t v, const float *x, size_t b0, size_t b1);
    /* kernels_situ (same bits on every ISA: kernels_situ1 per element) */
    void (*situ)(const float *g, const float *u, float *h, size_t n, float beta1, float beta2);
} kernels_ops;

/* The portable versions, used by the scalar and NEON tables and for the
 * tails of the SIMD ones. */
void kernels_act_quant_scalar(kernels_act *act, size_t v, const float *x, size_t b0, size_t b1);
void kernels_situ_scalar(const float *g, const float *u, float *h, size_t n,
                         float beta1, float beta2);

/* The table for the ISA chosen now (kernels_init() first if needed). */
const kernels_ops *kernels_ops_get(void);

extern const kernels_ops kernels_ops_scalar;
#if defined(__x86_64__)
extern const kernels_ops kernels_ops_avx2;
extern const kernels_ops kernels_ops_avx512;
#endif
#if defined(__aarch64__)
extern const kernels_ops kernels_ops_neon;
#endif

/* Shared helpers. */
static inline float kernels_ue8m0(uint8_t s)
{
    uint32_t bits = (uint32_t)s << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Invariant 4, from the 32 accumulators A[p][l] stored as a[p*8 + l]. */
static inline float kernels_reduce32(const float *a)
{
    float t[8], u[4], v[2];
    for (int l = 0; l < 8; l++)
        t[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    for (int l = 0; l < 4; l++)
        u[l] = t[l] + t[l + 4];
    v[0] = u[0] + u[2];
    v[1] = u[1] + u[3];
    return v[0] + v[1];
}

/* MXFP4 invariant 4, from the 16 accumulators A[k]. */
static inline float kernels_reduce16(const float *a)
{
    float t[8], u[4], v[2];
    for (int k = 0; k < 8; k++)
        t[k] = a[k] + a[k + 8];
    for (int k = 0; k < 4; k++)
        u[k] = t[k] + t[k + 4];
    v[0] = u[0] + u[2];
    v[1] = u[1] + u[3];
    return v[0] + v[1];
}

/* ---- SiTU, one element --------------------------------------------------------
 * h = (b1 * tanh(g / b1) * sigma(g)) * (b2 * tanh(u / b2)), sigma(g) =
 * 1 / (1 + exp(-g)), evaluated in f32 in exactly the order the engine used
 * with libm (g / b1, tanhf, expf, 1 + e, the products), but with exp and
 * tanh computed in double and rounded once to f32: the correctly rounded
 * values (glibc's expf returns them for 99.9 % of arguments, its tanhf for
 * ~78 %, the rest one ulp off), so h stays within an ulp of the libm-based
 * h.  Rejected: the whole formula in double, rounded once (closer to the
 * float64 reference, but it moved h by more and flipped an int8 rounding in
 * tests/integration/test_engine_ref.sh that cost 2.2 % of one position's
 * layer output, over that test's 2 % bound for such flips).  Unlike libm it
 * vectorizes: the SIMD variants run exactly these operations lane by
 * lane (+, -, *, /, fma and float<->double conversions are correctly
 * rounded everywhere; the clamps let NaN through as _mm*_min_pd(c, y)
 * does), so every ISA gives the same bits.  libm's expf/tanhf were ~15 % of
 * a chunked prefill.
 *
 * exp(y) and expm1(y) in double, y clamped to [-100, 100] (2^k stays a
 * normal double; exp(100) still overflows the f32 conversion to inf, as
 * expf does): k = rint(y/ln2) by the 1.5*2^52 trick, r = y - k*ln2 in two
 * fma steps (Cody-Waite), |r| <= 0.347, expm1(r) = r + r^2 * P(r) with P
 * the Taylor series to r^10/12! (truncation < 1e-14 relative); then
 * exp(y) = 2^k * expm1(r) + 2^k and expm1(y) = 2^k * expm1(r) + (2^k - 1),
 * one fma each (no cancellation for small |y|). */
#define KERNELS_EXP_HI   100.0
#define KERNELS_EXP_LO  (-100.0)
#define KERNELS_TANH_MAX 20.0   /* tanh(20) is 1 within 1e-17 */
#define KERNELS_RND      6755399441055744.0  /* 1.5 * 2^52 */
#define KERNELS_LOG2E    1.4426950408889634
#define KERNELS_LN2_HI   6.93147180369123816490e-01
#define KERNELS_LN2_LO   1.90821492927058770002e-10

/* Taylor coefficients of (expm1(r) - r) / r^2, highest first. */
#define KERNELS_EXPM1_C \
    { 1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800, 1.0 / 362880, 1.0 / 40320, \
      1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5 }
#define KERNELS_EXPM1_NC 11

/* 2^k and expm1(r) for y = k ln2 + r; y in [-100, 100]. */
static inline double kernels_exp_split(double y, double *s)
{
    static const double c[KERNELS_EXPM1_NC] = KERNELS_EXPM1_C;
    double kf = (y * KERNELS_LOG2E + KERNELS_RND) - KERNELS_RND;
    double r = fma(-kf, KERNELS_LN2_HI, y);
    r = fma(-kf, KERNELS_LN2_LO, r);
    double p = c[0];
    for (int i = 1; i < KERNELS_EXPM1_NC; i++)
        p = fma(p, r, c[i]);
    /* NaN (only from a NaN input) gives k = 0: the result stays NaN */
    uint64_t bits = (uint64_t)((kf == kf ? (int64_t)kf : 0) + 1023) << 52;
    memcpy(s, &bits, sizeof *s);
    return fma(r * r, p, r);
}

static inline double kernels_clamp_exp(double y)
{
    y = KERNELS_EXP_HI < y ? KERNELS_EXP_HI : y;
    return KERNELS_EXP_LO > y ? KERNELS_EXP_LO : y;
}

/* expf(y), rounded once from double. */
static inline float kernels_expf1(float y)
{
    double s, er = kernels_exp_split(kernels_clamp_exp(y), &s);
    return (float)fma(s, er, s);
}

/* tanhf(t) = e / (e + 2), e = expm1(2|t|), sign of t; rounded once. */
static inline float kernels_tanhf1(float t)
{
    double a = fabs((double)t), s;
    a = KERNELS_TANH_MAX < a ? KERNELS_TANH_MAX : a;
    double er = kernels_exp_split(a + a, &s);
    double e = fma(s, er, s - 1.0);
    return (float)copysign(e / (e + 2.0), (double)t);
}

static inline float kernels_situ1(float g, float u, float beta1, float beta2)
{
    float sig = 1.0f / (1.0f + kernels_expf1(-g));
    return (beta1 * kernels_tanhf1(g / beta1) * sig) * (beta2 * kernels_tanhf1(u / beta2));
}

/* Doubled e2m1 values by code (bit 3 = sign). */
extern const int8_t kernels_e2m1x2[16];

/* Offset inside a row of nb blocks of position i (0..31) of block b
 * (invariant 1). */
static inline size_t kernels_bpos(size_t nb, size_t b, size_t i)
{
    size_t g = b / 4, k = b % 4, gs = nb - 4 * g < 4 ? nb - 4 * g : 4;
    return 128 * g + (i < 16 ? 16 * k + i : 16 * gs + 16 * k + (i - 16));
}

/* Offset of column j in a row of nb blocks. */
static inline size_t kernels_colpos(size_t nb, size_t j)
{
    size_t i = j % 32;
    return kernels_bpos(nb, j / 32, (i & 1) ? 16 + i / 2 : i / 2);
}

/* Block b's integer sum S of invariant 2 (MXFP4), scalar. */
static inline int32_t kernels_fast_block_sum(const uint8_t *p, const int8_t *q, size_t nb, size_t b)
{
    int32_t S = 0;
    for (int i = 0; i < 32; i++) {
        uint8_t byte = p[b * 16 + (i & 15)];
        S += kernels_e2m1x2[i < 16 ? byte & 15 : byte >> 4] * q[kernels_bpos(nb, b, (size_t)i)];
    }
    return S;
}

/* Fast MXFP4 blocks [b0, nb) of a row into A[16] (invariant 3), scalar.
 * The reference uses it for every block, SIMD variants for the blocks
 * after the row's last full 16 (none for K3's shapes). */
static inline void kernels_fast_blocks(float *A, const uint8_t *p, const uint8_t *s,
                                       const int8_t *q, const float *d, size_t b0, size_t nb)
{
    for (size_t b = b0; b < nb; b++) {
        float c = (kernels_ue8m0(s[b]) * 0.5f) * d[b];
        A[b % 16] = fmaf((float)kernels_fast_block_sum(p, q, nb, b), c, A[b % 16]);
    }
}

/* int8 blocks [b0, nb) of a row into A[32], scalar (w and q same layout). */
static inline void kernels_q8_blocks(float *A, const int8_t *w, const int8_t *q,
                                     const float *d, size_t b0, size_t nb)
{
    for (size_t b = b0; b < nb; b++) {
        float *Ab = A + (b % 4) * 8;
        for (int l = 0; l < 8; l++) {
            size_t o = kernels_bpos(nb, b, 4 * (size_t)l);
            int32_t P = w[o] * q[o] + w[o + 1] * q[o + 1] + w[o + 2] * q[o + 2] +
                        w[o + 3] * q[o + 3];
            Ab[l] = fmaf((float)P, d[b], Ab[l]);
        }
    }
}

#endif
