/* attn_int.h — private to engine/kernels: the attention family (MLA and
 * KDA; attn.c, attn_avx2.c, attn_avx512.c, attn_neon.c).  The numerics
 * every ISA reproduces, the shared exp, the half-precision conversions and
 * the per-ISA table.
 *
 * MLA (absorbed) numerics, per token t (it sees positions 0..len-1) and
 * head h.  Positions are cut at fixed absolute boundaries: superblocks of
 * KERNELS_MLA_SB positions (the unit a thread takes, one partial state
 * each), each cut into blocks of KERNELS_MLA_BLOCK positions (the last
 * ones shortened by len).  D = kl + rope; q = [qa_h | qx_h], row_s =
 * [c_s | r_s], both D long.
 *  1. Score: 16 segments, segment j = [j*D/16, (j+1)*D/16); P_j = the fmaf
 *     chain over the segment from 0 (P_j = fmaf(q_l, row_l, P_j) in l
 *     order); the 16 are added as a perfect binary tree in order
 *     (P_j = P_j + P_{j+w}, w = 1, 2, 4, 8); score = root * scale.
 *  2. Block step (online softmax inside a superblock; m = -inf, l = 0,
 *     C = 0 at its start): bm = max of the block's scores (bm = s_0, then
 *     bm = mx(s_i, bm), mx(a, b) = a > b ? a : b); mn = mx(bm, m);
 *     alpha = exp(m - mn); p_i = exp(s_i - mn); lb = 0 + p_0 + p_1 + ... in
 *     order; l = fmaf(l, alpha, lb); for every j < kl: cb = fmaf chain of
 *     p_i * c_i[j] over the block from 0; C[j] = fmaf(C[j], alpha, cb);
 *     m = mn.
 *  3. Fold of the superblocks' (m_k, l_k, C_k) in k order: the first is
 *     copied; then Mn = mx(m_k, M), a = exp(M - Mn), b = exp(m_k - Mn),
 *     L = fmaf(l_k, b, L * a), ctx[j] = fmaf(C_k[j], b, ctx[j] * a).
 *  4. ctx[j] *= 1 / L.
 * Expanded form (kernels_mla_expanded), per head h: K_h(s)[i] and
 * V_h(s)[i] are step 1 with q = row i of W_UK,h / W_UV,h, row = c_s
 * (D = kl, no rope) and scale 1; the score of token t is step 1 with
 * q = [q_nope | qx], row = [K_h(s) | r_s] (D = nope + rope), set to -inf
 * for s > pos0 + t; step 2 runs over blocks of 16 from position 0 in one
 * pass (no superblocks: heads are what threads split), with V_h(s) for
 * c_s; step 4 at the end.  A block a token cannot see leaves its state
 * unchanged (alpha = 1, p = 0), so a chunk again gives each token its
 * bits alone.
 * exp is kernels_attn_exp below.  Every step is a sequence of correctly
 * rounded f32 operations on one element (or one head), so SIMD code that
 * puts heads (scores, softmax) or columns (context) in its lanes gives the
 * scalar bits; nothing depends on the thread count (superblocks are merged
 * in k order whoever computed them) nor on how many tokens a call carries
 * (a token's superblocks and blocks depend only on its own len).
 *
 * Why this shape: 16 segments keep the score within ~1e-7 relative of
 * float64 at K3 width, where one 576-long chain was 5x worse (8.8e-6
 * rel-L2 of ctx on the worst head at 32k positions); blocks of 16 give
 * the context sums two levels (a 32k-long f32 chain loses ~u*sqrt(n));
 * the online softmax reads each cache row once.
 *
 * KDA step, per head (S[r][j], r < dk, j < dv), per token in order:
 *   tmp[j] = 0; for r: S[r][j] = S[r][j] * alpha[r];
 *                      tmp[j] = fmaf(k[r], S[r][j], tmp[j])
 *   u[j] = v[j] - tmp[j]
 *   o[j] = 0;   for r: bk = beta * k[r]; S[r][j] = fmaf(bk, u[j], S[r][j]);
 *                      o[j] = fmaf(q[r], S[r][j], o[j])
 * Column j only ever touches column j of S, so SIMD code puts columns in
 * its lanes and keeps a block of columns of S in L1 across the tokens.
 *
 * KDA decay, per element: a = A * (z + dt_bias) (two roundings),
 * s = 1 / (1 + exp(-a)), z = exp(lower * s).
 *
 * KDA conv, per channel and token: y = fmaf chain over the taps from 0
 * (window oldest first, then the current input), out = y * (1 / (1 +
 * exp(-y))) (SiLU), the window shifted by one.
 */
#ifndef SHOAL_ATTN_INT_H
#define SHOAL_ATTN_INT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/kernels/kernels.h"

#define KERNELS_MLA_SB    256   /* positions per superblock (thread task) */
#define KERNELS_MLA_BLOCK 16    /* positions per block */
#define KERNELS_MLA_SEGS  16    /* partial sums per score */
#define KERNELS_MLA_TREE  4     /* log2(KERNELS_MLA_SEGS) */

/* ---- the shared exp ------------------------------------------------------------
 * exp(x) in f32: x clamped to [-87.3, 88] (so 2^k stays a normal float),
 * k = rint(x*log2e) by the 1.5*2^23 trick, r = x - k*ln2 in two fmaf steps
 * (Cody-Waite, ln2_hi has 9 significant bits so k*ln2_hi is exact),
 * e^r by its Taylor series to r^7/7! in fmaf Horner steps (truncation
 * < 6e-9 relative on |r| <= ln2/2), times 2^k built from the bits of the
 * rounding sum; 0 for x < -87.3 (below that e^x is under FLT_MIN).  Every
 * operation is correctly rounded on every ISA, so the SIMD variants give
 * these bits lane for lane.  Error < 2 ulp (test_attn.c checks it against
 * exp() in double).  Not libm's expf: its bits differ between libcs and
 * it does not vectorize. */
#define KERNELS_AEXP_LO    (-87.3f)
#define KERNELS_AEXP_HI    88.0f
#define KERNELS_AEXP_RND   12582912.0f  /* 1.5 * 2^23 */
#define KERNELS_AEXP_LOG2E 1.44269504f
#define KERNELS_AEXP_LN2HI 0.693359375f
#define KERNELS_AEXP_LN2LO (-2.12194440e-4f)
#define KERNELS_AEXP_C7    (1.0f / 5040)
#define KERNELS_AEXP_C6    (1.0f / 720)
#define KERNELS_AEXP_C5    (1.0f / 120)
#define KERNELS_AEXP_C4    (1.0f / 24)
#define KERNELS_AEXP_C3    (1.0f / 6)
#define KERNELS_AEXP_C2    0.5f

static inline uint32_t kernels_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kernels_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float kernels_attn_exp(float x)
{
    float xc = KERNELS_AEXP_LO > x ? KERNELS_AEXP_LO : x;  /* NaN stays NaN */
    xc = KERNELS_AEXP_HI < xc ? KERNELS_AEXP_HI : xc;
    float y = xc * KERNELS_AEXP_LOG2E + KERNELS_AEXP_RND;
    float kf = y - KERNELS_AEXP_RND;
    float r = fmaf(-kf, KERNELS_AEXP_LN2HI, xc);
    r = fmaf(-kf, KERNELS_AEXP_LN2LO, r);
    float p = fmaf(KERNELS_AEXP_C7, r, KERNELS_AEXP_C6);
    p = fmaf(p, r, KERNELS_AEXP_C5);
    p = fmaf(p, r, KERNELS_AEXP_C4);
    p = fmaf(p, r, KERNELS_AEXP_C3);
    p = fmaf(p, r, KERNELS_AEXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    /* y's low mantissa bits hold k (plus 2^22): the exponent field of 2^k */
    uint32_t e = (kernels_f32_bits(y) - kernels_f32_bits(KERNELS_AEXP_RND) + 127u) << 23;
    float v = p * kernels_bits_f32(e);
    return x < KERNELS_AEXP_LO ? 0.0f : v;
}

/* mx(a, b) of the numerics above: what x86 max_ps(a, b) computes. */
static inline float kernels_attn_max(float a, float b)
{
    return a > b ? a : b;
}

/* The KDA decay, one element. */
static inline float kernels_attn_decay(float z, float A, float dt_bias, float lower)
{
    float s = 1.0f / (1.0f + kernels_attn_exp(-(A * (z + dt_bias))));
    return kernels_attn_exp(lower * s);
}

/* SiLU of the conv, one element. */
static inline float kernels_attn_silu(float y)
{
    return y * (1.0f / (1.0f + kernels_attn_exp(-y)));
}

/* ---- half-precision cache values ------------------------------------------------
 * Widening is exact; narrowing rounds to nearest even (f16: overflow to
 * inf, subnormals kept; NaN stays NaN). */
static inline float kernels_bf16_f32(uint16_t h)
{
    return kernels_bits_f32((uint32_t)h << 16);
}

static inline uint16_t kernels_f32_bf16(float f)
{
    uint32_t u = kernels_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

static inline float kernels_f16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    if (e == 0x1F)
        return kernels_bits_f32(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        /* zero or subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return kernels_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

static inline uint16_t kernels_f32_f16(float f)
{
    uint32_t u = kernels_f32_bits(f), sign = (u >> 16) & 0x8000, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u)
        return (uint16_t)(sign | 0x7E00 | ((a >> 13) & 0x3FF));  /* quiet NaN */
    if (a >= 0x477FF000u)  /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7C00);
    if (a < 0x38800000u) {
        /* below 2^-14: a subnormal half, m = round(|f| * 2^24) to even
         * (the product is exact; adding 2^23 rounds it to an integer) */
        float v = kernels_bits_f32(a) * 16777216.0f + 8388608.0f;
        return (uint16_t)(sign | (kernels_f32_bits(v) - 0x4B000000u));
    }
    uint32_t r = a + 0xFFFu + ((a >> 13) & 1);  /* round to nearest even at bit 13 */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* ---- the per-ISA table ------------------------------------------------------------ */

/* A block of rows for the score kernel: row i (i < rows) is
 * [c + i*ldc, kl floats | r + i*ldr, rope floats].  Kernels that take
 * rows in tiles read rows past `rows` as the last row (results dropped).
 * pf: byte ranges (the next block's rows) the kernel prefetches into L2
 * meanwhile, spread over its work, so no block starts on cold lines. */
typedef struct kernels_attn_rows {
    const float *c, *r;
    size_t ldc, kl, ldr, rope, rows;
    const char *pf[2];
    size_t pfn[2];
} kernels_attn_rows;

/* Issue up to `lines` prefetches from the ranges of pf, advancing them;
 * FETCH(p) is the ISA's prefetch of the line at p. */
#define KERNELS_ATTN_PF(pf, lines, FETCH)                                          \
    do {                                                                           \
        for (size_t k_ = 0; k_ < (lines); k_++) {                                  \
            int r_ = (pf)->pfn[0] ? 0 : 1;                                         \
            if (!(pf)->pfn[r_])                                                    \
                break;                                                             \
            FETCH((pf)->pf[r_]);                                                   \
            size_t s_ = (pf)->pfn[r_] < 64 ? (pf)->pfn[r_] : 64;                   \
            (pf)->pf[r_] += s_;                                                    \
            (pf)->pfn[r_] -= s_;                                                   \
        }                                                                          \
    } while (0)

/* Prefetches per segment step so that pf is done after `steps` steps. */
static inline size_t kernels_attn_pf_rate(const kernels_attn_rows *b, size_t steps)
{
    size_t lines = (b->pfn[0] + 63) / 64 + (b->pfn[1] + 63) / 64 + 2;
    return (lines + steps - 1) / steps;
}

typedef struct kernels_attn_ops {
    /* score rows are padded to a multiple of this many lanes (heads, or
     * tokens in the expanded form); q^T is stored in tiles of qtile
     * lanes (a multiple of lanes; see kernels_mla_qt) */
    size_t lanes, qtile;
    /* dst [n] = src [n] of type t widened to f32 (exact) */
    void (*widen)(kernels_kv_type t, const void *src, float *dst, size_t n);
    /* S[i][h] = step 1 for i < b->rows (<= BLOCK), h < hp (hp a multiple
     * of lanes): q^T in qT as kernels_mla_qt lays it out (D = kl + rope).
     * S has BLOCK rows of hp. */
    void (*scores)(const float *qT, size_t hp, const kernels_attn_rows *b, float scale, float *S);
    /* step 2's softmax part for h < hp: S becomes p, m and l advance,
     * alpha[h] the factor for the context */
    void (*softmax)(float *S, size_t hp, size_t rows, float *m, float *l, float *alpha);
    /* step 2's context part: for h < nh, j < dim,
     * C[h*ldc + j] = fmaf(C[h*ldc + j], alpha[h], sum_i S[i][h] * V[i*ldv + j]);
     * alpha NULL (a superblock's first block, C = 0): C = the sum, which is
     * what the fmaf gives there, without reading C. */
    void (*ctx)(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                size_t rows, size_t nh, size_t dim, float *C, size_t ldc);
    /* step 3 on n elements: C = fmaf(Ck, b, C * a) */
    void (*fold)(float *C, const float *Ck, float a, float b, size_t n);
    /* x *= s on n elements */
    void (*scale)(float *x, float s, size_t n);
    /* the KDA step of one head over n tokens; element strides between
     * tokens: qs (q, k, alpha), vs (v, o), bs (beta) */
    void (*kda_head)(float *S, size_t dk, size_t dv, size_t n, const float *q, const float *k,
                     const float *alpha, size_t qs, const float *v, size_t vs, const float *beta,
                     size_t bs, float *o);
    /* the conv of channels [c0, c1) over n tokens: x [n][p], taps [kw][p],
     * win [kw-1][p] */
    void (*kda_conv)(float *x, size_t n, size_t p, size_t c0, size_t c1, size_t kw,
                     const float *taps, float *win);
    /* the decay of channels [c0, c1) over n tokens: z [n][p] */
    void (*kda_decay)(float *z, size_t n, size_t p, size_t c0, size_t c1, const float *A,
                      const float *dt_bias, float lower);
} kernels_attn_ops;

extern const kernels_attn_ops kernels_attn_ops_scalar;
#if defined(__x86_64__)
extern const kernels_attn_ops kernels_attn_ops_avx2;
extern const kernels_attn_ops kernels_attn_ops_avx512;
#endif
#if defined(__aarch64__)
extern const kernels_attn_ops kernels_attn_ops_neon;
#endif

/* The table for the ISA chosen now. */
const kernels_attn_ops *kernels_attn_ops_get(void);

/* Where q^T keeps lane h of query column l: tiles of qtile lanes (the
 * last one narrower), each tile [D][its width], so a kernel's tile of
 * heads streams one contiguous slice.  qtile 1 is the plain [hp][D]. */
static inline size_t kernels_mla_qt(size_t hp, size_t qtile, size_t D, size_t l, size_t h)
{
    size_t g = h / qtile, w = hp - g * qtile < qtile ? hp - g * qtile : qtile;
    return g * qtile * D + l * w + (h - g * qtile);
}

/* Segment j of a D-long score (step 1). */
static inline size_t kernels_mla_seg(size_t D, size_t j)
{
    return j * D / KERNELS_MLA_SEGS;
}

/* Scalar pieces the SIMD tables reuse for their tails: ops->ctx, the KDA
 * step of columns [j0, j1), the conv of channels [c0, c1). */
void kernels_attn_ctx_scalar(const float *S, size_t hp, const float *alpha, const float *V,
                             size_t ldv, size_t rows, size_t nh, size_t dim, float *C,
                             size_t ldc);
void kernels_attn_kda_scalar(float *S, size_t dk, size_t dv, size_t j0, size_t j1, size_t n,
                             const float *q, const float *k, const float *alpha, size_t qs,
                             const float *v, size_t vs, const float *beta, size_t bs, float *o);
void kernels_attn_conv_scalar(float *x, size_t n, size_t p, size_t c0, size_t c1, size_t kw,
                              const float *taps, float *win);
void kernels_attn_decay_scalar(float *z, size_t n, size_t p, size_t c0, size_t c1,
                               const float *A, const float *dt_bias, float lower);

#endif
