/* attn_simd.h — private to engine/kernels: the attention kernels written
 * once over a small vector vocabulary, included by attn_avx2.c,
 * attn_avx512.c and attn_neon.c (each compiled for its ISA).  Numerics:
 * attn_int.h; every operation below is one correctly rounded f32
 * operation per lane (av_fma fused), so any width gives the scalar bits.
 *
 * The including file defines, before #include:
 *   AV            the vector type, AW its lanes
 *   av_zero() av_set1(x) av_load(p) av_store(p, v)
 *   av_add av_sub av_mul av_div, av_fma(a, b, c) = a*b + c and
 *   av_fnma(a, b, c) = c - a*b fused, av_max(a, b) = a > b ? a : b and
 *   av_min(a, b) = a < b ? a : b per lane (x86's max_ps / min_ps),
 *   av_neg(v) exact, av_pow2(y, rnd) and av_zero_below(x, lo, v) (the
 *   integer and select steps of the exp below), av_widen(t, p) AW
 *   bf16/f16 values at p widened, AV_PF(p) a prefetch of p into L2
 *   AT_ROWS, AT_Z the score tile: AT_ROWS positions x AT_Z*AW heads (the
 *                 ISA's q^T tile is AT_Z*AW lanes)
 *   AC_H, AC_Z    the context tile: AC_H heads x AC_Z*AW columns
 *   AK_Z          the KDA step's column block: AK_Z*AW columns
 * and then builds its table with KERNELS_ATTN_TABLE.
 *
 * Tiles are shaped by the register file (accumulators + operands): the
 * score tile loads AT_Z vectors of q^T and AT_ROWS broadcasts per query
 * column for AT_ROWS*AT_Z FMAs; the context tile AC_Z row vectors and AC_H
 * broadcasts of p per position for AC_H*AC_Z FMAs.  Columns past the last
 * whole vector go to the scalar reference itself.
 */
#ifndef SHOAL_ATTN_SIMD_H
#define SHOAL_ATTN_SIMD_H

#include "engine/kernels/attn_int.h"

#define AI static inline __attribute__((always_inline))

/* kernels_attn_exp, AW lanes: the same operations in the same order. */
AI AV av_exp(AV x)
{
    const AV rnd = av_set1(KERNELS_AEXP_RND), lo = av_set1(KERNELS_AEXP_LO);
    AV xc = av_min(av_set1(KERNELS_AEXP_HI), av_max(lo, x));
    AV y = av_add(av_mul(xc, av_set1(KERNELS_AEXP_LOG2E)), rnd);
    AV kf = av_sub(y, rnd);
    AV r = av_fnma(kf, av_set1(KERNELS_AEXP_LN2HI), xc);
    r = av_fnma(kf, av_set1(KERNELS_AEXP_LN2LO), r);
    AV p = av_fma(av_set1(KERNELS_AEXP_C7), r, av_set1(KERNELS_AEXP_C6));
    p = av_fma(p, r, av_set1(KERNELS_AEXP_C5));
    p = av_fma(p, r, av_set1(KERNELS_AEXP_C4));
    p = av_fma(p, r, av_set1(KERNELS_AEXP_C3));
    p = av_fma(p, r, av_set1(KERNELS_AEXP_C2));
    p = av_fma(p, r, av_set1(1.0f));
    p = av_fma(p, r, av_set1(1.0f));
    return av_zero_below(x, lo, av_mul(p, av_pow2(y, rnd)));
}

/* ---- MLA scores (step 1) ---------------------------------------------------------- */

/* One query column of a tile: acc[i][z] += q[z] * rows[i][off]. */
AI void sc_col(const float *q, const float *const *rows, size_t off, AV acc[AT_ROWS][AT_Z],
               const int nz)
{
    AV qv[AT_Z];
#pragma GCC unroll 4
    for (int z = 0; z < nz; z++)
        qv[z] = av_load(q + AW * (size_t)z);
#pragma GCC unroll 8
    for (int i = 0; i < AT_ROWS; i++) {
        AV b = av_set1(rows[i][off]);
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            acc[i][z] = av_fma(qv[z], b, acc[i][z]);
    }
}

/* The roots of rows i0..i0+AT_ROWS-1 x nz*AW lanes (not yet scaled); qT:
 * the tile's [D][nz*AW].  Each segment starts from 0 and is pushed on a
 * stack of partial sums as it ends: the perfect binary tree of step 1,
 * left to right. */
AI void sc_tile(const float *qT, const kernels_attn_rows *b, size_t i0, float *S, size_t hp,
                kernels_attn_rows *pf, size_t rate, const int nz)
{
    const size_t kl = b->kl, D = kl + b->rope, W = AW * (size_t)nz;
    const float *rc[AT_ROWS], *rr[AT_ROWS];
    AV acc[AT_ROWS][AT_Z], st[KERNELS_MLA_TREE][AT_ROWS][AT_Z];

    for (size_t i = 0; i < AT_ROWS; i++) {
        size_t idx = i0 + i < b->rows ? i0 + i : b->rows - 1;
        rc[i] = b->c + idx * b->ldc;
        rr[i] = b->r + idx * b->ldr;
    }
    for (size_t j = 0; j < KERNELS_MLA_SEGS; j++) {
        size_t lo = kernels_mla_seg(D, j), hi = kernels_mla_seg(D, j + 1);
        size_t mid = hi < kl ? hi : kl, l;
#pragma GCC unroll 8
        for (int i = 0; i < AT_ROWS; i++)
#pragma GCC unroll 4
            for (int z = 0; z < nz; z++)
                acc[i][z] = av_zero();
        for (l = lo; l < mid; l++)
            sc_col(qT + l * W, rc, l, acc, nz);
        for (l = lo > kl ? lo : kl; l < hi; l++)
            sc_col(qT + l * W, rr, l - kl, acc, nz);
        KERNELS_ATTN_PF(pf, rate, AV_PF);
        for (int lvl = 0; lvl < KERNELS_MLA_TREE; lvl++) {
            int right = (int)(j >> lvl) & 1;
#pragma GCC unroll 8
            for (int i = 0; i < AT_ROWS; i++)
#pragma GCC unroll 4
                for (int z = 0; z < nz; z++) {
                    if (right)
                        acc[i][z] = av_add(st[lvl][i][z], acc[i][z]);
                    else
                        st[lvl][i][z] = acc[i][z];
                }
            if (!right)
                break;
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < AT_ROWS; i++)
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            av_store(S + (size_t)i * hp + AW * (size_t)z, acc[i][z]);
}

static void av_scores(const float *qT, size_t hp, const kernels_attn_rows *b, float scale,
                      float *S)
{
    const size_t qt = AT_Z * AW, D = b->kl + b->rope;
    kernels_attn_rows pf = *b;
    size_t tiles = (b->rows + AT_ROWS - 1) / AT_ROWS * ((hp + qt - 1) / qt);
    size_t rate = kernels_attn_pf_rate(b, tiles * KERNELS_MLA_SEGS);

    for (size_t i0 = 0; i0 < b->rows; i0 += AT_ROWS)
        for (size_t g0 = 0; g0 < hp; g0 += qt) {
            const float *q = qT + g0 * D;
            float *s = S + i0 * hp + g0;
            switch ((hp - g0 < qt ? hp - g0 : qt) / AW) {
#if AT_Z >= 4
            case 4:  sc_tile(q, b, i0, s, hp, &pf, rate, 4); break;
#endif
#if AT_Z >= 3
            case 3:  sc_tile(q, b, i0, s, hp, &pf, rate, 3); break;
#endif
            case 2:  sc_tile(q, b, i0, s, hp, &pf, rate, 2); break;
            default: sc_tile(q, b, i0, s, hp, &pf, rate, 1); break;
            }
        }
    /* root * scale in a pass of its own: a scale register held through
     * the tiles made the compiler spill a q^T vector */
    const AV sc = av_set1(scale);
    for (size_t i = 0; i < b->rows; i++)
        for (size_t z = 0; z < hp; z += AW)
            av_store(S + i * hp + z, av_mul(av_load(S + i * hp + z), sc));
}

/* ---- MLA block step (step 2) and fold (steps 3-4) ------------------------------------ */

static void av_softmax(float *S, size_t hp, size_t rows, float *m, float *l, float *alpha)
{
    for (size_t z = 0; z < hp; z += AW) {
        AV bm = av_load(S + z), mo = av_load(m + z), lb = av_zero();
        for (size_t i = 1; i < rows; i++)
            bm = av_max(av_load(S + i * hp + z), bm);
        AV mn = av_max(bm, mo), al = av_exp(av_sub(mo, mn));
        for (size_t i = 0; i < rows; i++) {
            AV p = av_exp(av_sub(av_load(S + i * hp + z), mn));
            av_store(S + i * hp + z, p);
            lb = av_add(lb, p);
        }
        av_store(l + z, av_fma(av_load(l + z), al, lb));
        av_store(m + z, mn);
        av_store(alpha + z, al);
    }
}

/* Context of nh heads x nz*AW columns. */
AI void cx_tile(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                size_t rows, float *C, size_t ldc, const int nh, const int nz)
{
    AV acc[AC_H][AC_Z];

#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            acc[h][z] = av_zero();
    for (size_t i = 0; i < rows; i++) {
        AV v[AC_Z];
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            v[z] = av_load(V + i * ldv + AW * (size_t)z);
#pragma GCC unroll 8
        for (int h = 0; h < nh; h++) {
            AV p = av_set1(S[i * hp + (size_t)h]);
#pragma GCC unroll 4
            for (int z = 0; z < nz; z++)
                acc[h][z] = av_fma(p, v[z], acc[h][z]);
        }
    }
#pragma GCC unroll 8
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++) {
            float *d = C + (size_t)h * ldc + AW * (size_t)z;
            av_store(d, alpha ? av_fma(av_load(d), av_set1(alpha[h]), acc[h][z]) : acc[h][z]);
        }
}

/* Heads of a tile (1..AC_H) for columns [j0, j0 + nz*AW). */
AI void cx_heads(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                 size_t rows, size_t nh, size_t h0, size_t j0, float *C, size_t ldc, const int nz)
{
    const float *s = S + h0, *a = alpha ? alpha + h0 : NULL, *v = V + j0;
    float *c = C + h0 * ldc + j0;
    switch (nh - h0 < AC_H ? nh - h0 : AC_H) {
#if AC_H >= 8
    case 8:  cx_tile(s, hp, a, v, ldv, rows, c, ldc, 8, nz); break;
    case 7:  cx_tile(s, hp, a, v, ldv, rows, c, ldc, 7, nz); break;
#endif
    case 6:  cx_tile(s, hp, a, v, ldv, rows, c, ldc, 6, nz); break;
    case 5:  cx_tile(s, hp, a, v, ldv, rows, c, ldc, 5, nz); break;
    case 4:  cx_tile(s, hp, a, v, ldv, rows, c, ldc, 4, nz); break;
    case 3:  cx_tile(s, hp, a, v, ldv, rows, c, ldc, 3, nz); break;
    case 2:  cx_tile(s, hp, a, v, ldv, rows, c, ldc, 2, nz); break;
    default: cx_tile(s, hp, a, v, ldv, rows, c, ldc, 1, nz); break;
    }
}

static void av_ctx(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                   size_t rows, size_t nh, size_t dim, float *C, size_t ldc)
{
    const size_t cw = AC_Z * AW, jf = dim / cw * cw, jv = dim / AW * AW;

    for (size_t h0 = 0; h0 < nh; h0 += AC_H) {
        for (size_t j0 = 0; j0 < jf; j0 += cw)
            cx_heads(S, hp, alpha, V, ldv, rows, nh, h0, j0, C, ldc, AC_Z);
        for (size_t j0 = jf; j0 < jv; j0 += AW)
            cx_heads(S, hp, alpha, V, ldv, rows, nh, h0, j0, C, ldc, 1);
    }
    if (jv < dim)
        kernels_attn_ctx_scalar(S, hp, alpha, V + jv, ldv, rows, nh, dim - jv, C + jv, ldc);
}

static void av_fold(float *C, const float *Ck, float a, float b, size_t n)
{
    const AV va = av_set1(a), vb = av_set1(b);
    size_t j = 0;
    for (; j + AW <= n; j += AW)
        av_store(C + j, av_fma(av_load(Ck + j), vb, av_mul(av_load(C + j), va)));
    for (; j < n; j++)
        C[j] = fmaf(Ck[j], b, C[j] * a);
}

static void av_scale(float *x, float s, size_t n)
{
    const AV vs = av_set1(s);
    size_t j = 0;
    for (; j + AW <= n; j += AW)
        av_store(x + j, av_mul(av_load(x + j), vs));
    for (; j < n; j++)
        x[j] *= s;
}

/* ---- KDA --------------------------------------------------------------------------- */

/* The step for columns [j0, j0 + nz*AW), every token: that block of S (dk
 * rows of nz*AW floats; 32 KB at K3 width with 64 columns) stays in L1
 * across a chunk's tokens. */
AI void kda_cols(float *S, size_t dk, size_t dv, size_t n, const float *q, const float *k,
                 const float *alpha, size_t qs, const float *v, size_t vs, const float *beta,
                 size_t bs, float *o, size_t j0, const int nz)
{
    for (size_t t = 0; t < n; t++) {
        const float *qt = q + t * qs, *kt = k + t * qs, *at = alpha + t * qs;
        AV tmp[AK_Z], u[AK_Z], acc[AK_Z];
#pragma GCC unroll 8
        for (int z = 0; z < nz; z++)
            tmp[z] = acc[z] = av_zero();
        for (size_t r = 0; r < dk; r++) {
            AV a = av_set1(at[r]), kr = av_set1(kt[r]);
            float *row = S + r * dv + j0;
#pragma GCC unroll 8
            for (int z = 0; z < nz; z++) {
                AV x = av_mul(av_load(row + AW * z), a);
                av_store(row + AW * z, x);
                tmp[z] = av_fma(kr, x, tmp[z]);
            }
        }
#pragma GCC unroll 8
        for (int z = 0; z < nz; z++)
            u[z] = av_sub(av_load(v + t * vs + j0 + AW * z), tmp[z]);
        for (size_t r = 0; r < dk; r++) {
            AV bk = av_set1(beta[t * bs] * kt[r]), qr = av_set1(qt[r]);
            float *row = S + r * dv + j0;
#pragma GCC unroll 8
            for (int z = 0; z < nz; z++) {
                AV x = av_fma(bk, u[z], av_load(row + AW * z));
                av_store(row + AW * z, x);
                acc[z] = av_fma(qr, x, acc[z]);
            }
        }
#pragma GCC unroll 8
        for (int z = 0; z < nz; z++)
            av_store(o + t * vs + j0 + AW * z, acc[z]);
    }
}

static void av_kda_head(float *S, size_t dk, size_t dv, size_t n, const float *q, const float *k,
                        const float *alpha, size_t qs, const float *v, size_t vs,
                        const float *beta, size_t bs, float *o)
{
    size_t j0 = 0;
    for (; j0 + AK_Z * AW <= dv; j0 += AK_Z * AW)
        kda_cols(S, dk, dv, n, q, k, alpha, qs, v, vs, beta, bs, o, j0, AK_Z);
    for (; j0 + AW <= dv; j0 += AW)
        kda_cols(S, dk, dv, n, q, k, alpha, qs, v, vs, beta, bs, o, j0, 1);
    if (j0 < dv)
        kernels_attn_kda_scalar(S, dk, dv, j0, dv, n, q, k, alpha, qs, v, vs, beta, bs, o);
}

static void av_kda_conv(float *x, size_t n, size_t p, size_t c0, size_t c1, size_t kw,
                        const float *taps, float *win)
{
    const AV one = av_set1(1.0f);
    size_t ch = c0;
    for (; ch + AW <= c1; ch += AW)
        for (size_t t = 0; t < n; t++) {
            AV in = av_load(x + t * p + ch), y = av_zero();
            for (size_t j = 0; j + 1 < kw; j++)
                y = av_fma(av_load(taps + j * p + ch), av_load(win + j * p + ch), y);
            y = av_fma(av_load(taps + (kw - 1) * p + ch), in, y);
            for (size_t j = 0; j + 2 < kw; j++)
                av_store(win + j * p + ch, av_load(win + (j + 1) * p + ch));
            if (kw > 1)
                av_store(win + (kw - 2) * p + ch, in);
            AV e = av_exp(av_neg(y));
            av_store(x + t * p + ch, av_mul(y, av_div(one, av_add(one, e))));
        }
    if (ch < c1)
        kernels_attn_conv_scalar(x, n, p, ch, c1, kw, taps, win);
}

/* ---- cache rows ----------------------------------------------------------------------- */

static void av_widen_n(kernels_kv_type t, const void *src, float *dst, size_t n)
{
    const uint16_t *h = src;
    size_t i = 0;

    if (t == KERNELS_KV_F32) {
        memcpy(dst, src, n * sizeof *dst);
        return;
    }
    for (; i + AW <= n; i += AW)
        av_store(dst + i, av_widen(t, h + i));
    if (i < n)
        kernels_kv_load(t, h + i, dst + i, n - i);
}

static void av_kda_decay(float *z, size_t n, size_t p, size_t c0, size_t c1, const float *A,
                         const float *dt_bias, float lower)
{
    const AV one = av_set1(1.0f), lw = av_set1(lower);
    size_t ch = c0;
    for (; ch + AW <= c1; ch += AW) {
        AV a = av_load(A + ch), d = av_load(dt_bias + ch);
        for (size_t t = 0; t < n; t++) {
            float *zt = z + t * p + ch;
            AV s = av_div(one, av_add(one, av_exp(av_neg(av_mul(a, av_add(av_load(zt), d))))));
            av_store(zt, av_exp(av_mul(lw, s)));
        }
    }
    if (ch < c1)
        kernels_attn_decay_scalar(z, n, p, ch, c1, A, dt_bias, lower);
}

#define KERNELS_ATTN_TABLE                                                                   \
    { AW, AT_Z * AW, av_widen_n, av_scores, av_softmax, av_ctx, av_fold, av_scale,           \
      av_kda_head, av_kda_conv, av_kda_decay }

#endif
