/* attn_neon.c — the attention family on aarch64 Advanced SIMD (base ISA,
 * no flags).  Numerics: attn_int.h; every lane computes exactly the scalar
 * reference's sequence (vfmaq is fused like fmaf; tails use the scalar
 * code).  mx(a, b) is a compare and select: vmaxq_f32 orders +0 above -0
 * and x86 max_ps does not, and the numerics are x86's.
 *
 * MLA scores: 4 heads per register, a tile of 4 positions x 16 heads (16
 * accumulators); four query columns at a time when the segment allows,
 * each row's four values loaded once and used by lane (vfmaq_laneq).
 * Heads past the last multiple of 16 go 4 at a time (the narrower last
 * q^T tile).
 * Context: 4 columns per register, 6 heads x 16 columns (24
 * accumulators), p taken by lane from two loads.
 */
#if defined(__aarch64__)

#include "engine/kernels/attn_int.h"

#include <arm_neon.h>

#define AI static inline __attribute__((always_inline))

/* kernels_attn_max, 4 lanes. */
AI float32x4_t mx4(float32x4_t a, float32x4_t b)
{
    return vbslq_f32(vcgtq_f32(a, b), a, b);
}

/* kernels_attn_exp, 4 lanes. */
AI float32x4_t exp4(float32x4_t x)
{
    const float32x4_t rnd = vdupq_n_f32(KERNELS_AEXP_RND), lo = vdupq_n_f32(KERNELS_AEXP_LO);
    const float32x4_t hi = vdupq_n_f32(KERNELS_AEXP_HI);
    float32x4_t xc = vbslq_f32(vcgtq_f32(lo, x), lo, x);
    xc = vbslq_f32(vcltq_f32(hi, xc), hi, xc);
    float32x4_t y = vaddq_f32(vmulq_f32(xc, vdupq_n_f32(KERNELS_AEXP_LOG2E)), rnd);
    float32x4_t kf = vsubq_f32(y, rnd);
    float32x4_t r = vfmsq_f32(xc, kf, vdupq_n_f32(KERNELS_AEXP_LN2HI));
    r = vfmsq_f32(r, kf, vdupq_n_f32(KERNELS_AEXP_LN2LO));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(KERNELS_AEXP_C6), vdupq_n_f32(KERNELS_AEXP_C7), r);
    p = vfmaq_f32(vdupq_n_f32(KERNELS_AEXP_C5), p, r);
    p = vfmaq_f32(vdupq_n_f32(KERNELS_AEXP_C4), p, r);
    p = vfmaq_f32(vdupq_n_f32(KERNELS_AEXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(KERNELS_AEXP_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    uint32x4_t e = vsubq_u32(vreinterpretq_u32_f32(y), vreinterpretq_u32_f32(rnd));
    e = vshlq_n_u32(vaddq_u32(e, vdupq_n_u32(127)), 23);
    float32x4_t v = vmulq_f32(p, vreinterpretq_f32_u32(e));
    return vbslq_f32(vcltq_f32(x, lo), vdupq_n_f32(0), v);
}

/* ---- MLA ----------------------------------------------------------------------------- */

static void widen(kernels_kv_type t, const void *src, float *dst, size_t n)
{
    const uint16_t *h = src;
    size_t i = 0;

    if (t == KERNELS_KV_F32) {
        memcpy(dst, src, n * sizeof *dst);
        return;
    }
    for (; i + 4 <= n; i += 4) {
        uint16x4_t v = vld1_u16(h + i);
        float32x4_t f = t == KERNELS_KV_BF16 ? vreinterpretq_f32_u32(vshll_n_u16(v, 16))
                                             : vcvt_f32_f16(vreinterpret_f16_u16(v));
        vst1q_f32(dst + i, f);
    }
    if (i < n)
        kernels_kv_load(t, h + i, dst + i, n - i);
}

#define PF_L2(p) __builtin_prefetch((p), 0, 2)

/* Query columns [l0, l1) of a tile of 4 rows x 4*nz heads (q^T rows of w
 * floats): acc[i][z] += q[l][z] * rows[i][l - base]; four columns at a
 * time by lane when they are there. */
static inline __attribute__((always_inline)) void
score_cols(const float *qT, size_t w, const float *const *rows, size_t base, size_t l0, size_t l1,
           float32x4_t acc[4][4], const int nz)
{
    size_t l = l0;
    for (; l + 4 <= l1; l += 4) {
        float32x4_t c[4];
        for (int i = 0; i < 4; i++)
            c[i] = vld1q_f32(rows[i] + (l - base));
#define LANE(u)                                                              \
    do {                                                                     \
        float32x4_t q[4];                                                    \
        for (int z = 0; z < nz; z++)                                         \
            q[z] = vld1q_f32(qT + (l + (u)) * w + 4 * (size_t)z);            \
        for (int i = 0; i < 4; i++)                                          \
            for (int z = 0; z < nz; z++)                                     \
                acc[i][z] = vfmaq_laneq_f32(acc[i][z], q[z], c[i], (u));     \
    } while (0)
        LANE(0);
        LANE(1);
        LANE(2);
        LANE(3);
#undef LANE
    }
    for (; l < l1; l++)
        for (int z = 0; z < nz; z++) {
            float32x4_t q = vld1q_f32(qT + l * w + 4 * (size_t)z);
            for (int i = 0; i < 4; i++)
                acc[i][z] = vfmaq_n_f32(acc[i][z], q, rows[i][l - base]);
        }
}

/* Scores of rows i0..i0+3 x 4*nz heads (step 1); qT: the tile's [D][w]. */
static inline __attribute__((always_inline)) void
score_tile(const float *qT, size_t w, const kernels_attn_rows *b, size_t i0, float scale,
           float *S, size_t hp, kernels_attn_rows *pf, size_t rate, const int nz)
{
    const size_t kl = b->kl, D = kl + b->rope;
    const float *rc[4], *rr[4];
    float32x4_t acc[4][4], st[KERNELS_MLA_TREE][4][4];

    for (size_t i = 0; i < 4; i++) {
        size_t idx = i0 + i < b->rows ? i0 + i : b->rows - 1;
        rc[i] = b->c + idx * b->ldc;
        rr[i] = b->r + idx * b->ldr;
    }
    for (size_t j = 0; j < KERNELS_MLA_SEGS; j++) {
        size_t lo = kernels_mla_seg(D, j), hi = kernels_mla_seg(D, j + 1);
        for (int i = 0; i < 4; i++)
            for (int z = 0; z < nz; z++)
                acc[i][z] = vdupq_n_f32(0);
        score_cols(qT, w, rc, 0, lo, hi < kl ? hi : kl, acc, nz);
        score_cols(qT, w, rr, kl, lo > kl ? lo : kl, hi, acc, nz);
        KERNELS_ATTN_PF(pf, rate, PF_L2);
        for (int lvl = 0; lvl < KERNELS_MLA_TREE; lvl++) {
            int right = (int)(j >> lvl) & 1;
            for (int i = 0; i < 4; i++)
                for (int z = 0; z < nz; z++) {
                    if (right)
                        acc[i][z] = vaddq_f32(st[lvl][i][z], acc[i][z]);
                    else
                        st[lvl][i][z] = acc[i][z];
                }
            if (!right)
                break;
        }
    }
    for (int i = 0; i < 4; i++)
        for (int z = 0; z < nz; z++)
            vst1q_f32(S + (size_t)i * hp + 4 * (size_t)z, vmulq_n_f32(acc[i][z], scale));
}

static void neon_scores(const float *qT, size_t hp, const kernels_attn_rows *b, float scale,
                        float *S)
{
    size_t h16 = hp / 16 * 16, D = b->kl + b->rope;
    kernels_attn_rows pf = *b;
    size_t steps = (b->rows + 3) / 4 * (h16 / 16 + (hp - h16) / 4) * KERNELS_MLA_SEGS;
    size_t rate = kernels_attn_pf_rate(b, steps);

    for (size_t i0 = 0; i0 < b->rows; i0 += 4) {
        for (size_t h0 = 0; h0 < h16; h0 += 16)
            score_tile(qT + h0 * D, 16, b, i0, scale, S + i0 * hp + h0, hp, &pf, rate, 4);
        for (size_t h0 = h16; h0 < hp; h0 += 4)
            score_tile(qT + h16 * D + (h0 - h16), hp - h16, b, i0, scale, S + i0 * hp + h0, hp,
                       &pf, rate, 1);
    }
}

static void neon_softmax(float *S, size_t hp, size_t rows, float *m, float *l, float *alpha)
{
    for (size_t z = 0; z < hp; z += 4) {
        float32x4_t bm = vld1q_f32(S + z), mo = vld1q_f32(m + z), lb = vdupq_n_f32(0);
        for (size_t i = 1; i < rows; i++)
            bm = mx4(vld1q_f32(S + i * hp + z), bm);
        float32x4_t mn = mx4(bm, mo), al = exp4(vsubq_f32(mo, mn));
        for (size_t i = 0; i < rows; i++) {
            float32x4_t p = exp4(vsubq_f32(vld1q_f32(S + i * hp + z), mn));
            vst1q_f32(S + i * hp + z, p);
            lb = vaddq_f32(lb, p);
        }
        vst1q_f32(l + z, vfmaq_f32(lb, vld1q_f32(l + z), al));
        vst1q_f32(m + z, mn);
        vst1q_f32(alpha + z, al);
    }
}

/* Context of nh <= 6 heads x 16 columns (step 2). */
static void ctx_tile(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                     size_t rows, float *C, size_t ldc, size_t nh)
{
    float32x4_t acc[6][4];

    for (int h = 0; h < 6; h++)
        for (int z = 0; z < 4; z++)
            acc[h][z] = vdupq_n_f32(0);
    for (size_t i = 0; i < rows; i++) {
        float32x4_t v[4], p0, p1;
        float p8[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
        for (size_t h = 0; h < nh; h++)
            p8[h] = S[i * hp + h];
        p0 = vld1q_f32(p8);
        p1 = vld1q_f32(p8 + 4);
        for (int z = 0; z < 4; z++)
            v[z] = vld1q_f32(V + i * ldv + 4 * (size_t)z);
        for (int z = 0; z < 4; z++) {
            acc[0][z] = vfmaq_laneq_f32(acc[0][z], v[z], p0, 0);
            acc[1][z] = vfmaq_laneq_f32(acc[1][z], v[z], p0, 1);
            acc[2][z] = vfmaq_laneq_f32(acc[2][z], v[z], p0, 2);
            acc[3][z] = vfmaq_laneq_f32(acc[3][z], v[z], p0, 3);
            acc[4][z] = vfmaq_laneq_f32(acc[4][z], v[z], p1, 0);
            acc[5][z] = vfmaq_laneq_f32(acc[5][z], v[z], p1, 1);
        }
    }
    for (size_t h = 0; h < nh; h++)
        for (int z = 0; z < 4; z++) {
            float *d = C + h * ldc + 4 * (size_t)z;
            vst1q_f32(d, alpha ? vfmaq_n_f32(acc[h][z], vld1q_f32(d), alpha[h]) : acc[h][z]);
        }
}

static void neon_ctx(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                     size_t rows, size_t nh, size_t dim, float *C, size_t ldc)
{
    size_t j16 = dim / 16 * 16;

    for (size_t h0 = 0; h0 < nh; h0 += 6) {
        size_t n6 = nh - h0 < 6 ? nh - h0 : 6;
        for (size_t j0 = 0; j0 < j16; j0 += 16)
            ctx_tile(S + h0, hp, alpha ? alpha + h0 : NULL, V + j0, ldv, rows, C + h0 * ldc + j0,
                     ldc, n6);
    }
    if (j16 < dim)
        kernels_attn_ctx_scalar(S, hp, alpha, V + j16, ldv, rows, nh, dim - j16, C + j16, ldc);
}

static void neon_fold(float *C, const float *Ck, float a, float b, size_t n)
{
    size_t j = 0;
    for (; j + 4 <= n; j += 4)
        vst1q_f32(C + j, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(C + j), a), vld1q_f32(Ck + j), b));
    for (; j < n; j++)
        C[j] = fmaf(Ck[j], b, C[j] * a);
}

static void neon_scale(float *x, float s, size_t n)
{
    size_t j = 0;
    for (; j + 4 <= n; j += 4)
        vst1q_f32(x + j, vmulq_n_f32(vld1q_f32(x + j), s));
    for (; j < n; j++)
        x[j] *= s;
}

/* ---- KDA ------------------------------------------------------------------------------ */

/* The step for columns [j0, j0 + 32), every token. */
static void kda_cols(float *S, size_t dk, size_t dv, size_t n, const float *q, const float *k,
                     const float *alpha, size_t qs, const float *v, size_t vs, const float *beta,
                     size_t bs, float *o, size_t j0)
{
    for (size_t t = 0; t < n; t++) {
        const float *qt = q + t * qs, *kt = k + t * qs, *at = alpha + t * qs;
        float32x4_t tmp[8], u[8], acc[8];
        for (int z = 0; z < 8; z++)
            tmp[z] = acc[z] = vdupq_n_f32(0);
        for (size_t r = 0; r < dk; r++) {
            float *row = S + r * dv + j0;
            for (int z = 0; z < 8; z++) {
                float32x4_t x = vmulq_n_f32(vld1q_f32(row + 4 * z), at[r]);
                vst1q_f32(row + 4 * z, x);
                tmp[z] = vfmaq_n_f32(tmp[z], x, kt[r]);
            }
        }
        for (int z = 0; z < 8; z++)
            u[z] = vsubq_f32(vld1q_f32(v + t * vs + j0 + 4 * z), tmp[z]);
        for (size_t r = 0; r < dk; r++) {
            float bk = beta[t * bs] * kt[r];
            float *row = S + r * dv + j0;
            for (int z = 0; z < 8; z++) {
                float32x4_t x = vfmaq_n_f32(vld1q_f32(row + 4 * z), u[z], bk);
                vst1q_f32(row + 4 * z, x);
                acc[z] = vfmaq_n_f32(acc[z], x, qt[r]);
            }
        }
        for (int z = 0; z < 8; z++)
            vst1q_f32(o + t * vs + j0 + 4 * z, acc[z]);
    }
}

static void neon_kda_head(float *S, size_t dk, size_t dv, size_t n, const float *q,
                          const float *k, const float *alpha, size_t qs, const float *v,
                          size_t vs, const float *beta, size_t bs, float *o)
{
    size_t j0 = 0;
    for (; j0 + 32 <= dv; j0 += 32)
        kda_cols(S, dk, dv, n, q, k, alpha, qs, v, vs, beta, bs, o, j0);
    if (j0 < dv)
        kernels_attn_kda_scalar(S, dk, dv, j0, dv, n, q, k, alpha, qs, v, vs, beta, bs, o);
}

static void neon_kda_conv(float *x, size_t n, size_t p, size_t c0, size_t c1, size_t kw,
                          const float *taps, float *win)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    size_t ch = c0;
    for (; ch + 4 <= c1; ch += 4)
        for (size_t t = 0; t < n; t++) {
            float32x4_t in = vld1q_f32(x + t * p + ch), y = vdupq_n_f32(0);
            for (size_t j = 0; j + 1 < kw; j++)
                y = vfmaq_f32(y, vld1q_f32(taps + j * p + ch), vld1q_f32(win + j * p + ch));
            y = vfmaq_f32(y, vld1q_f32(taps + (kw - 1) * p + ch), in);
            for (size_t j = 0; j + 2 < kw; j++)
                vst1q_f32(win + j * p + ch, vld1q_f32(win + (j + 1) * p + ch));
            if (kw > 1)
                vst1q_f32(win + (kw - 2) * p + ch, in);
            float32x4_t e = exp4(vnegq_f32(y));
            vst1q_f32(x + t * p + ch, vmulq_f32(y, vdivq_f32(one, vaddq_f32(one, e))));
        }
    if (ch < c1)
        kernels_attn_conv_scalar(x, n, p, ch, c1, kw, taps, win);
}

const kernels_attn_ops kernels_attn_ops_neon = {
    4, 16, widen, neon_scores, neon_softmax, neon_ctx, neon_fold, neon_scale, neon_kda_head,
    neon_kda_conv
};

#else
/* Not aarch64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_attn_neon_unused;
#endif
