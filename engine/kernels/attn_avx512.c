/* attn_avx512.c — the attention family on AVX-512 F (compiled with the
 * AVX-512 flags; chosen with the AVX-512 VNNI ISA).  Numerics: attn_int.h;
 * every lane computes exactly the scalar reference's sequence.
 *
 * MLA scores: 16 heads per register, a tile of 8 positions x 48 heads (24
 * accumulators); per query column l, 3 loads of q^T and 8 broadcasts of
 * the rows' values feed 24 FMAs.  Each of the 16 segments starts from 0
 * and is pushed on a 4-level stack as it ends (the binary tree of
 * attn_int.h step 1).  Context: 16 columns per register, a tile of 6 heads
 * x 64 columns, per position 4 row loads and 6 broadcasts of p feed 24
 * FMAs.  Both keep their operands in L1: a block is 16 staged rows
 * (37 KB at K3 width) and q^T is streamed.  K3 is FMA-bound here (2·96
 * heads·(576 + 512) flops per 2,304-byte row), not bandwidth-bound.
 */
#if defined(__x86_64__)

#include "engine/kernels/attn_int.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

/* kernels_attn_exp, 16 lanes. */
AI __m512 exp16(__m512 x)
{
    const __m512 rnd = _mm512_set1_ps(KERNELS_AEXP_RND), lo = _mm512_set1_ps(KERNELS_AEXP_LO);
    __m512 xc = _mm512_min_ps(_mm512_set1_ps(KERNELS_AEXP_HI), _mm512_max_ps(lo, x));
    __m512 y = _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(KERNELS_AEXP_LOG2E)), rnd);
    __m512 kf = _mm512_sub_ps(y, rnd);
    __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(KERNELS_AEXP_LN2HI), xc);
    r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(KERNELS_AEXP_LN2LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(KERNELS_AEXP_C7), r, _mm512_set1_ps(KERNELS_AEXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERNELS_AEXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERNELS_AEXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERNELS_AEXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(KERNELS_AEXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_sub_epi32(_mm512_castps_si512(y), _mm512_castps_si512(rnd));
    e = _mm512_slli_epi32(_mm512_add_epi32(e, _mm512_set1_epi32(127)), 23);
    __m512 v = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), v, _mm512_setzero_ps());
}

static inline __mmask16 tail_mask(size_t n)
{
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
}

/* ---- MLA ----------------------------------------------------------------------------- */

/* Widen n values of type t at src to dst. */
static void widen(kernels_kv_type t, const void *src, float *dst, size_t n)
{
    const uint16_t *h = src;
    size_t i = 0;

    if (t == KERNELS_KV_F32) {
        memcpy(dst, src, n * sizeof *dst);
        return;
    }
    for (; i + 16 <= n; i += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(h + i));
        __m512 f = t == KERNELS_KV_BF16
                       ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))
                       : _mm512_cvtph_ps(v);
        _mm512_storeu_ps(dst + i, f);
    }
    if (i < n)
        kernels_kv_load(t, h + i, dst + i, n - i);
}

#define PF_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)

/* One query column of a tile: acc[i][z] += q[z] * rows[i][off]. */
AI void score_col(const float *q, const float *const *rows, size_t off, __m512 acc[8][3],
                  const int nz)
{
    __m512 qv[3];
#pragma GCC unroll 3
    for (int z = 0; z < nz; z++)
        qv[z] = _mm512_loadu_ps(q + 16 * (size_t)z);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        __m512 b = _mm512_set1_ps(rows[i][off]);
#pragma GCC unroll 3
        for (int z = 0; z < nz; z++)
            acc[i][z] = _mm512_fmadd_ps(qv[z], b, acc[i][z]);
    }
}

/* Scores of rows i0..i0+7 x nz*16 heads (step 1); qT: the tile's [D][16*nz]. */
AI void score_tile(const float *qT, const kernels_attn_rows *b, size_t i0, float scale, float *S,
                   size_t hp, kernels_attn_rows *pf, size_t rate, const int nz)
{
    const size_t kl = b->kl, D = kl + b->rope, W = 16 * (size_t)nz;
    const float *rc[8], *rr[8];
    __m512 acc[8][3], st[KERNELS_MLA_TREE][8][3];

    for (size_t i = 0; i < 8; i++) {
        size_t idx = i0 + i < b->rows ? i0 + i : b->rows - 1;
        rc[i] = b->c + idx * b->ldc;
        rr[i] = b->r + idx * b->ldr;
    }
    for (size_t j = 0; j < KERNELS_MLA_SEGS; j++) {
        size_t lo = kernels_mla_seg(D, j), hi = kernels_mla_seg(D, j + 1);
        size_t mid = hi < kl ? hi : kl, l;
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
            for (int z = 0; z < nz; z++)
                acc[i][z] = _mm512_setzero_ps();
        for (l = lo; l < mid; l++)
            score_col(qT + l * W, rc, l, acc, nz);
        for (l = lo > kl ? lo : kl; l < hi; l++)
            score_col(qT + l * W, rr, l - kl, acc, nz);
        KERNELS_ATTN_PF(pf, rate, PF_L2);
        /* leaf j of the tree: combine with the left siblings waiting */
        for (int lvl = 0; lvl < KERNELS_MLA_TREE; lvl++) {
            int right = (int)(j >> lvl) & 1;
#pragma GCC unroll 8
            for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
                for (int z = 0; z < nz; z++) {
                    if (right)
                        acc[i][z] = _mm512_add_ps(st[lvl][i][z], acc[i][z]);
                    else
                        st[lvl][i][z] = acc[i][z];
                }
            if (!right)
                break;
        }
    }
    const __m512 sc = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
#pragma GCC unroll 3
        for (int z = 0; z < nz; z++)
            _mm512_storeu_ps(S + (size_t)i * hp + 16 * (size_t)z, _mm512_mul_ps(acc[i][z], sc));
}

static void avx512_scores(const float *qT, size_t hp, const kernels_attn_rows *b, float scale,
                          float *S)
{
    size_t hz = hp / 16, D = b->kl + b->rope;
    kernels_attn_rows pf = *b;
    size_t rate = kernels_attn_pf_rate(b, (b->rows + 7) / 8 * ((hz + 2) / 3) * KERNELS_MLA_SEGS);

    for (size_t i0 = 0; i0 < b->rows; i0 += 8)
        for (size_t z0 = 0; z0 < hz; z0 += 3) {
            const float *q = qT + 16 * z0 * D;
            float *s = S + i0 * hp + 16 * z0;
            switch (hz - z0 < 3 ? hz - z0 : 3) {
            case 3:  score_tile(q, b, i0, scale, s, hp, &pf, rate, 3); break;
            case 2:  score_tile(q, b, i0, scale, s, hp, &pf, rate, 2); break;
            default: score_tile(q, b, i0, scale, s, hp, &pf, rate, 1); break;
            }
        }
}

static void avx512_softmax(float *S, size_t hp, size_t rows, float *m, float *l, float *alpha)
{
    for (size_t z = 0; z < hp; z += 16) {
        __m512 bm = _mm512_loadu_ps(S + z), mo = _mm512_loadu_ps(m + z), lb = _mm512_setzero_ps();
        for (size_t i = 1; i < rows; i++)
            bm = _mm512_max_ps(_mm512_loadu_ps(S + i * hp + z), bm);
        __m512 mn = _mm512_max_ps(bm, mo), al = exp16(_mm512_sub_ps(mo, mn));
        for (size_t i = 0; i < rows; i++) {
            __m512 p = exp16(_mm512_sub_ps(_mm512_loadu_ps(S + i * hp + z), mn));
            _mm512_storeu_ps(S + i * hp + z, p);
            lb = _mm512_add_ps(lb, p);
        }
        _mm512_storeu_ps(l + z, _mm512_fmadd_ps(_mm512_loadu_ps(l + z), al, lb));
        _mm512_storeu_ps(m + z, mn);
        _mm512_storeu_ps(alpha + z, al);
    }
}

/* Context of nh heads x 64 columns (step 2). */
AI void ctx_tile(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                 size_t rows, float *C, size_t ldc, const int nh)
{
    __m512 acc[6][4];

#pragma GCC unroll 6
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++)
            acc[h][z] = _mm512_setzero_ps();
    for (size_t i = 0; i < rows; i++) {
        __m512 v[4];
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++)
            v[z] = _mm512_loadu_ps(V + i * ldv + 16 * (size_t)z);
#pragma GCC unroll 6
        for (int h = 0; h < nh; h++) {
            __m512 p = _mm512_set1_ps(S[i * hp + (size_t)h]);
#pragma GCC unroll 4
            for (int z = 0; z < 4; z++)
                acc[h][z] = _mm512_fmadd_ps(p, v[z], acc[h][z]);
        }
    }
#pragma GCC unroll 6
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
        for (int z = 0; z < 4; z++) {
            float *d = C + (size_t)h * ldc + 16 * (size_t)z;
            __m512 x = alpha ? _mm512_fmadd_ps(_mm512_loadu_ps(d), _mm512_set1_ps(alpha[h]), acc[h][z])
                             : acc[h][z];
            _mm512_storeu_ps(d, x);
        }
}

/* Heads [h0, h1) x up to 16 columns from j0 (the tails). */
static void ctx_strip(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                      size_t rows, size_t h0, size_t h1, size_t j0, size_t dim, float *C,
                      size_t ldc)
{
    __mmask16 k = tail_mask(dim - j0);
    for (size_t h = h0; h < h1; h++) {
        __m512 acc = _mm512_setzero_ps();
        for (size_t i = 0; i < rows; i++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(S[i * hp + h]),
                                  _mm512_maskz_loadu_ps(k, V + i * ldv + j0), acc);
        float *d = C + h * ldc + j0;
        if (alpha)
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, d), _mm512_set1_ps(alpha[h]), acc);
        _mm512_mask_storeu_ps(d, k, acc);
    }
}

static void avx512_ctx(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                       size_t rows, size_t nh, size_t dim, float *C, size_t ldc)
{
    size_t jf = dim / 64 * 64;

    for (size_t h0 = 0; h0 < nh; h0 += 6) {
        size_t n6 = nh - h0 < 6 ? nh - h0 : 6;
        const float *s = S + h0, *a = alpha ? alpha + h0 : NULL;
        for (size_t j0 = 0; j0 < jf; j0 += 64) {
            float *c = C + h0 * ldc + j0;
            const float *v = V + j0;
            switch (n6) {
            case 6:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 6); break;
            case 5:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 5); break;
            case 4:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 4); break;
            case 3:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 3); break;
            case 2:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 2); break;
            default: ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 1); break;
            }
        }
        for (size_t j0 = jf; j0 < dim; j0 += 16)
            ctx_strip(S, hp, alpha, V, ldv, rows, h0, h0 + n6, j0, dim, C, ldc);
    }
}

static void avx512_fold(float *C, const float *Ck, float a, float b, size_t n)
{
    const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        __m512 c = _mm512_maskz_loadu_ps(k, C + j);
        _mm512_mask_storeu_ps(C + j, k, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, Ck + j), vb,
                                                        _mm512_mul_ps(c, va)));
    }
}

static void avx512_scale(float *x, float s, size_t n)
{
    const __m512 vs = _mm512_set1_ps(s);
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        _mm512_mask_storeu_ps(x + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), vs));
    }
}

/* ---- KDA ------------------------------------------------------------------------------ */

/* The step for columns [j0, j0 + 16*nz) (masks for the last), every token:
 * that block of S (dk x 64 floats, 32 KB at K3 width) stays in L1. */
AI void kda_cols(float *S, size_t dk, size_t dv, size_t n, const float *q, const float *k,
                 const float *alpha, size_t qs, const float *v, size_t vs, const float *beta,
                 size_t bs, float *o, size_t j0, const int nz)
{
    __mmask16 mk[4];
#pragma GCC unroll 4
    for (int z = 0; z < nz; z++)
        mk[z] = j0 + 16 * (size_t)z < dv ? tail_mask(dv - j0 - 16 * (size_t)z) : 0;
    for (size_t t = 0; t < n; t++) {
        const float *qt = q + t * qs, *kt = k + t * qs, *at = alpha + t * qs;
        __m512 tmp[4], u[4], acc[4];
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            tmp[z] = acc[z] = _mm512_setzero_ps();
        for (size_t r = 0; r < dk; r++) {
            __m512 a = _mm512_set1_ps(at[r]), kr = _mm512_set1_ps(kt[r]);
            float *row = S + r * dv + j0;
#pragma GCC unroll 4
            for (int z = 0; z < nz; z++) {
                __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[z], row + 16 * z), a);
                _mm512_mask_storeu_ps(row + 16 * z, mk[z], x);
                tmp[z] = _mm512_fmadd_ps(kr, x, tmp[z]);
            }
        }
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            u[z] = _mm512_sub_ps(_mm512_maskz_loadu_ps(mk[z], v + t * vs + j0 + 16 * z), tmp[z]);
        for (size_t r = 0; r < dk; r++) {
            __m512 bk = _mm512_set1_ps(beta[t * bs] * kt[r]), qr = _mm512_set1_ps(qt[r]);
            float *row = S + r * dv + j0;
#pragma GCC unroll 4
            for (int z = 0; z < nz; z++) {
                __m512 x = _mm512_fmadd_ps(bk, u[z], _mm512_maskz_loadu_ps(mk[z], row + 16 * z));
                _mm512_mask_storeu_ps(row + 16 * z, mk[z], x);
                acc[z] = _mm512_fmadd_ps(qr, x, acc[z]);
            }
        }
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            _mm512_mask_storeu_ps(o + t * vs + j0 + 16 * z, mk[z], acc[z]);
    }
}

static void avx512_kda_head(float *S, size_t dk, size_t dv, size_t n, const float *q,
                            const float *k, const float *alpha, size_t qs, const float *v,
                            size_t vs, const float *beta, size_t bs, float *o)
{
    size_t j0 = 0;
    for (; j0 + 64 <= dv; j0 += 64)
        kda_cols(S, dk, dv, n, q, k, alpha, qs, v, vs, beta, bs, o, j0, 4);
    for (; j0 < dv; j0 += 16)
        kda_cols(S, dk, dv, n, q, k, alpha, qs, v, vs, beta, bs, o, j0, 1);
}

static void avx512_kda_conv(float *x, size_t n, size_t p, size_t c0, size_t c1, size_t kw,
                            const float *taps, float *win)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (size_t ch = c0; ch < c1; ch += 16) {
        __mmask16 k = tail_mask(c1 - ch);
        for (size_t t = 0; t < n; t++) {
            __m512 in = _mm512_maskz_loadu_ps(k, x + t * p + ch), y = _mm512_setzero_ps();
            for (size_t j = 0; j + 1 < kw; j++)
                y = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, taps + j * p + ch),
                                    _mm512_maskz_loadu_ps(k, win + j * p + ch), y);
            y = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, taps + (kw - 1) * p + ch), in, y);
            for (size_t j = 0; j + 2 < kw; j++)
                _mm512_mask_storeu_ps(win + j * p + ch, k,
                                      _mm512_maskz_loadu_ps(k, win + (j + 1) * p + ch));
            if (kw > 1)
                _mm512_mask_storeu_ps(win + (kw - 2) * p + ch, k, in);
            /* -y exactly (xor_ps needs AVX-512 DQ) */
            __m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(y), sign)));
            _mm512_mask_storeu_ps(x + t * p + ch, k,
                                  _mm512_mul_ps(y, _mm512_div_ps(one, _mm512_add_ps(one, e))));
        }
    }
}

const kernels_attn_ops kernels_attn_ops_avx512 = {
    16, 48, widen, avx512_scores, avx512_softmax, avx512_ctx, avx512_fold, avx512_scale,
    avx512_kda_head, avx512_kda_conv
};

#else
/* Not x86-64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_attn_avx512_unused;
#endif
