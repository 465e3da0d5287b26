/* kernels_int.h — private to engine/kernels: the quantized-activation
 * record, the per-ISA row kernels and the table that selects them.
 *
 * Invariants of the fast path, shared by fast MXFP4, int8 and int4 (every
 * ISA variant keeps them, which is what makes them bit-identical to the
 * scalar reference, batched or not):
 *  1. A block is 32 columns; position i < 16 of a block is its even column
 *     2i (low nibble of packed byte i), position 16 + i its odd column
 *     2i + 1 (high nibble).  int8 activations and int8 spine weights are
 *     stored in groups of up to 4 blocks (the last group of a row may be
 *     shorter, gs blocks): first the even halves of the group's blocks, 16
 *     bytes each, then their odd halves (kernels_bpos).  So one 64-byte
 *     load of packed 4-bit bytes (MXFP4, int4), masked to low nibbles,
 *     lines up with 64 contiguous activation bytes, and its high nibbles
 *     with the next 64: no shuffle is needed to pair weights with
 *     activations.
 *  2. Position i of a block holds the weight code w_i (MXFP4: the doubled
 *     e2m1 value, an integer in [-12, 12]; int4: q in [-7, 7]; int8: q in
 *     [-127, 127]) and the activation a_i.  The block gives one integer
 *     S = sum_{i<32} w_i * a_i, exact in any order (|S| <= 32 * 127 * 127
 *     < 2^24, so (float)S is exact too), however the ISA adds it up.
 *  3. Block b of a row is folded into float accumulator A[b % 16] by
 *     A = fmaf((float)S, c_b, A), blocks in order, with
 *        MXFP4: c_b = (2^(s_b - 127) * 0.5) * d_b  (0.5 undoes the doubling)
 *        int4:  c_b = scale_b * d_b                (scale_b: the BF16 scale)
 *        int8:  c_b = d_b
 *     (d_b the activation block's scale; one f32 multiply, correctly rounded
 *     everywhere).  Sixteen accumulators let a batched kernel keep 8 or 16
 *     rows in the lanes of a register (one conversion and one FMA per
 *     lane-full of rows and block) and a matrix-vector kernel fold 8 or 16
 *     blocks at once.
 *  4. The row's result is (kernels_reduce16)
 *        t[k] = A[k] + A[k+8],  u[k] = t[k] + t[k+4],  v[k] = u[k] + u[k+2],
 *        y = v[0] + v[1],
 *     int8: times the row scale.
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
    int32_t *bsum8;          /* [n][cols/32]: -8 * sum of a block's q (int4 start) */
    int32_t *bsum128;        /* [n][cols/32]: -128 * sum of a block's q (int8 + 128) */
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

/* Invariant 4, from the 16 accumulators A[k]. */
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

/* ---- block-fold formats: MXFP4, int4, int8 (issues 9, 15, 16) ------------------ */

/* The three formats of invariants 2-4; the SIMD files instantiate one
 * template per kind (a compile-time constant after inlining). */
enum kernels_kind { KERNELS_KIND_MXFP4, KERNELS_KIND_Q4, KERNELS_KIND_Q8 };

/* A block-fold matrix as the row kernels see it. */
typedef struct kernels_bmat {
    const uint8_t *w;   /* packed nibbles (MXFP4, int4: 16 bytes a block) or int8 */
    const uint8_t *s;   /* per-block scales: ue8m0 bytes, BF16 pairs; int8 NULL */
    const float *rs;    /* int8 row scales, else NULL */
    size_t rows, cols, nb;
    size_t wrow, srow;  /* bytes of a row of w and of s */
} kernels_bmat;

static inline kernels_bmat kernels_bmat_mxfp4(const kernels_mxfp4 *m)
{
    size_t nb = m->cols / KERNELS_BLOCK;
    return (kernels_bmat){ m->packed, m->scale, NULL, m->rows, m->cols, nb, nb * 16, nb };
}

static inline kernels_bmat kernels_bmat_q4(const kernels_q4 *m)
{
    size_t nb = m->cols / KERNELS_BLOCK;
    return (kernels_bmat){ m->packed, m->scale, NULL, m->rows, m->cols, nb, nb * 16, nb * 2 };
}

static inline kernels_bmat kernels_bmat_q8(const kernels_q8 *m)
{
    return (kernels_bmat){ (const uint8_t *)m->q, NULL, m->scale, m->rows, m->cols,
                           m->cols / KERNELS_BLOCK, m->cols, 0 };
}

/* A BF16 value from two little-endian bytes at any address. */
static inline float kernels_bf16(const uint8_t *p)
{
    uint32_t bits = ((uint32_t)p[0] | (uint32_t)p[1] << 8) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Weight code w_i of invariant 2 at position i of block b of a row (w: the
 * row's bytes). */
static inline int32_t kernels_wcode(int kind, const uint8_t *w, size_t nb, size_t b, size_t i)
{
    if (kind == KERNELS_KIND_Q8)
        return ((const int8_t *)w)[kernels_bpos(nb, b, i)];
    uint8_t byte = w[b * 16 + (i & 15)];
    int nib = i < 16 ? byte & 15 : byte >> 4;
    return kind == KERNELS_KIND_MXFP4 ? kernels_e2m1x2[nib] : nib - 8;
}

/* Block b's integer sum S (invariant 2), scalar. */
static inline int32_t kernels_block_sum(int kind, const uint8_t *w, const int8_t *q, size_t nb,
                                        size_t b)
{
    int32_t S = 0;
    for (size_t i = 0; i < 32; i++)
        S += kernels_wcode(kind, w, nb, b, i) * q[kernels_bpos(nb, b, i)];
    return S;
}

/* c_b of invariant 3 (s: the row's scales). */
static inline float kernels_block_c(int kind, const uint8_t *s, const float *d, size_t b)
{
    if (kind == KERNELS_KIND_MXFP4)
        return (kernels_ue8m0(s[b]) * 0.5f) * d[b];
    if (kind == KERNELS_KIND_Q4)
        return kernels_bf16(s + 2 * b) * d[b];
    return d[b];
}

/* Blocks [b0, nb) of a row into A[16] (invariant 3), scalar.  The
 * reference uses it for every block, the SIMD matrix-vector kernels for the
 * blocks after the row's last full 16 (none for K3's shapes). */
static inline void kernels_fold_blocks(int kind, float *A, const uint8_t *w, const uint8_t *s,
                                       const int8_t *q, const float *d, size_t b0, size_t nb)
{
    for (size_t b = b0; b < nb; b++)
        A[b % 16] = fmaf((float)kernels_block_sum(kind, w, q, nb, b), kernels_block_c(kind, s, d, b),
                         A[b % 16]);
}

/* One row times one vector, scalar (invariants 2-4). */
static inline float kernels_row_scalar(int kind, const kernels_bmat *m, size_t r,
                                       const kernels_act *a, size_t v)
{
    float A[16] = { 0 };
    kernels_fold_blocks(kind, A, m->w + r * m->wrow, m->s ? m->s + r * m->srow : NULL,
                        a->q + v * m->cols, a->d + v * m->nb, 0, m->nb);
    float y = kernels_reduce16(A);
    return kind == KERNELS_KIND_Q8 ? y * m->rs[r] : y;
}

/* int4 row kernels, one per ISA (kept apart from kernels_ops so that other
 * kernel families can add to that table without touching these lines). */
typedef void (*kernels_q4_fn)(const kernels_q4 *w, size_t r0, size_t r1,
                              const kernels_act *a, float *y, size_t ldy);
void kernels_q4_rows_scalar(const kernels_q4 *w, size_t r0, size_t r1,
                            const kernels_act *a, float *y, size_t ldy);
#if defined(__x86_64__)
void kernels_q4_rows_avx2(const kernels_q4 *w, size_t r0, size_t r1,
                          const kernels_act *a, float *y, size_t ldy);
void kernels_q4_rows_avx512(const kernels_q4 *w, size_t r0, size_t r1,
                            const kernels_act *a, float *y, size_t ldy);
#endif
#if defined(__aarch64__)
void kernels_q4_rows_neon(const kernels_q4 *w, size_t r0, size_t r1,
                          const kernels_act *a, float *y, size_t ldy);
/* Batched rows in lanes (tile_neon.c): rows [r0, r0 + 4k) of m times every
 * vector of a; returns the first row not done (fewer than 4 left). */
size_t kernels_neon_tiles(int kind, const kernels_bmat *m, size_t r0, size_t r1,
                          const kernels_act *a, float *y, size_t ldy);
#endif
/* The int4 row kernel of the ISA chosen now. */
kernels_q4_fn kernels_q4_rows_get(void);

#endif
