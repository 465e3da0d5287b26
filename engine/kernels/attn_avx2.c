/* attn_avx2.c — the attention family on AVX2 + FMA (+ F16C for f16 cache
 * rows).  Numerics: attn_int.h; every lane computes exactly the scalar
 * reference's sequence (tails use the scalar code itself).
 *
 * 16 registers shape the tiles: MLA scores 4 positions x 24 heads (12
 * accumulators, 3 q^T loads and 4 broadcasts per query column), context
 * 6 heads x 16 columns (12 accumulators, 2 row loads and 6 broadcasts per
 * position).
 */
#if defined(__x86_64__)

#include "engine/kernels/attn_int.h"

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

/* kernels_attn_exp, 8 lanes. */
AI __m256 exp8(__m256 x)
{
    const __m256 rnd = _mm256_set1_ps(KERNELS_AEXP_RND), lo = _mm256_set1_ps(KERNELS_AEXP_LO);
    __m256 xc = _mm256_min_ps(_mm256_set1_ps(KERNELS_AEXP_HI), _mm256_max_ps(lo, x));
    __m256 y = _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(KERNELS_AEXP_LOG2E)), rnd);
    __m256 kf = _mm256_sub_ps(y, rnd);
    __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(KERNELS_AEXP_LN2HI), xc);
    r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(KERNELS_AEXP_LN2LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(KERNELS_AEXP_C7), r, _mm256_set1_ps(KERNELS_AEXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERNELS_AEXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERNELS_AEXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERNELS_AEXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(KERNELS_AEXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_castps_si256(rnd));
    e = _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23);
    __m256 v = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_blendv_ps(v, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
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
    for (; i + 8 <= n; i += 8) {
        __m128i v = _mm_loadu_si128((const __m128i *)(h + i));
        __m256 f = t == KERNELS_KV_BF16
                       ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16))
                       : _mm256_cvtph_ps(v);
        _mm256_storeu_ps(dst + i, f);
    }
    if (i < n)
        kernels_kv_load(t, h + i, dst + i, n - i);
}

#define PF_L2(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)

/* One query column of a tile: acc[i][z] += q[z] * rows[i][off]. */
AI void score_col(const float *q, const float *const *rows, size_t off, __m256 acc[4][3],
                  const int nz)
{
    __m256 qv[3];
#pragma GCC unroll 3
    for (int z = 0; z < nz; z++)
        qv[z] = _mm256_loadu_ps(q + 8 * (size_t)z);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m256 b = _mm256_broadcast_ss(rows[i] + off);
#pragma GCC unroll 3
        for (int z = 0; z < nz; z++)
            acc[i][z] = _mm256_fmadd_ps(qv[z], b, acc[i][z]);
    }
}

/* Scores of rows i0..i0+3 x nz*8 heads (step 1); qT: the tile's [D][8*nz]. */
AI void score_tile(const float *qT, const kernels_attn_rows *b, size_t i0, float scale, float *S,
                   size_t hp, kernels_attn_rows *pf, size_t rate, const int nz)
{
    const size_t kl = b->kl, D = kl + b->rope, W = 8 * (size_t)nz;
    const float *rc[4], *rr[4];
    __m256 acc[4][3], st[KERNELS_MLA_TREE][4][3];

    for (size_t i = 0; i < 4; i++) {
        size_t idx = i0 + i < b->rows ? i0 + i : b->rows - 1;
        rc[i] = b->c + idx * b->ldc;
        rr[i] = b->r + idx * b->ldr;
    }
    for (size_t j = 0; j < KERNELS_MLA_SEGS; j++) {
        size_t lo = kernels_mla_seg(D, j), hi = kernels_mla_seg(D, j + 1);
        size_t mid = hi < kl ? hi : kl, l;
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 3
            for (int z = 0; z < nz; z++)
                acc[i][z] = _mm256_setzero_ps();
        for (l = lo; l < mid; l++)
            score_col(qT + l * W, rc, l, acc, nz);
        for (l = lo > kl ? lo : kl; l < hi; l++)
            score_col(qT + l * W, rr, l - kl, acc, nz);
        KERNELS_ATTN_PF(pf, rate, PF_L2);
        for (int lvl = 0; lvl < KERNELS_MLA_TREE; lvl++) {
            int right = (int)(j >> lvl) & 1;
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++)
#pragma GCC unroll 3
                for (int z = 0; z < nz; z++) {
                    if (right)
                        acc[i][z] = _mm256_add_ps(st[lvl][i][z], acc[i][z]);
                    else
                        st[lvl][i][z] = acc[i][z];
                }
            if (!right)
                break;
        }
    }
    const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 3
        for (int z = 0; z < nz; z++)
            _mm256_storeu_ps(S + (size_t)i * hp + 8 * (size_t)z, _mm256_mul_ps(acc[i][z], sc));
}

static void avx2_scores(const float *qT, size_t hp, const kernels_attn_rows *b, float scale,
                        float *S)
{
    size_t hz = hp / 8, D = b->kl + b->rope;
    kernels_attn_rows pf = *b;
    size_t rate = kernels_attn_pf_rate(b, (b->rows + 3) / 4 * ((hz + 2) / 3) * KERNELS_MLA_SEGS);

    for (size_t i0 = 0; i0 < b->rows; i0 += 4)
        for (size_t z0 = 0; z0 < hz; z0 += 3) {
            const float *q = qT + 8 * z0 * D;
            float *s = S + i0 * hp + 8 * z0;
            switch (hz - z0 < 3 ? hz - z0 : 3) {
            case 3:  score_tile(q, b, i0, scale, s, hp, &pf, rate, 3); break;
            case 2:  score_tile(q, b, i0, scale, s, hp, &pf, rate, 2); break;
            default: score_tile(q, b, i0, scale, s, hp, &pf, rate, 1); break;
            }
        }
}

static void avx2_softmax(float *S, size_t hp, size_t rows, float *m, float *l, float *alpha)
{
    for (size_t z = 0; z < hp; z += 8) {
        __m256 bm = _mm256_loadu_ps(S + z), mo = _mm256_loadu_ps(m + z), lb = _mm256_setzero_ps();
        for (size_t i = 1; i < rows; i++)
            bm = _mm256_max_ps(_mm256_loadu_ps(S + i * hp + z), bm);
        __m256 mn = _mm256_max_ps(bm, mo), al = exp8(_mm256_sub_ps(mo, mn));
        for (size_t i = 0; i < rows; i++) {
            __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(S + i * hp + z), mn));
            _mm256_storeu_ps(S + i * hp + z, p);
            lb = _mm256_add_ps(lb, p);
        }
        _mm256_storeu_ps(l + z, _mm256_fmadd_ps(_mm256_loadu_ps(l + z), al, lb));
        _mm256_storeu_ps(m + z, mn);
        _mm256_storeu_ps(alpha + z, al);
    }
}

/* Context of nh heads x 8*nz columns (step 2). */
AI void ctx_tile(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                 size_t rows, float *C, size_t ldc, const int nh, const int nz)
{
    __m256 acc[6][2];

#pragma GCC unroll 6
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 2
        for (int z = 0; z < nz; z++)
            acc[h][z] = _mm256_setzero_ps();
    for (size_t i = 0; i < rows; i++) {
        __m256 v[2];
#pragma GCC unroll 2
        for (int z = 0; z < nz; z++)
            v[z] = _mm256_loadu_ps(V + i * ldv + 8 * (size_t)z);
#pragma GCC unroll 6
        for (int h = 0; h < nh; h++) {
            __m256 p = _mm256_broadcast_ss(S + i * hp + (size_t)h);
#pragma GCC unroll 2
            for (int z = 0; z < nz; z++)
                acc[h][z] = _mm256_fmadd_ps(p, v[z], acc[h][z]);
        }
    }
#pragma GCC unroll 6
    for (int h = 0; h < nh; h++)
#pragma GCC unroll 2
        for (int z = 0; z < nz; z++) {
            float *d = C + (size_t)h * ldc + 8 * (size_t)z;
            __m256 x = alpha ? _mm256_fmadd_ps(_mm256_loadu_ps(d), _mm256_broadcast_ss(alpha + h),
                                               acc[h][z])
                             : acc[h][z];
            _mm256_storeu_ps(d, x);
        }
}

#define CTX_CASES(nz)                                                              \
    switch (n6) {                                                                  \
    case 6:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 6, nz); break;               \
    case 5:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 5, nz); break;               \
    case 4:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 4, nz); break;               \
    case 3:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 3, nz); break;               \
    case 2:  ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 2, nz); break;               \
    default: ctx_tile(s, hp, a, v, ldv, rows, c, ldc, 1, nz); break;               \
    }

static void avx2_ctx(const float *S, size_t hp, const float *alpha, const float *V, size_t ldv,
                     size_t rows, size_t nh, size_t dim, float *C, size_t ldc)
{
    size_t j16 = dim / 16 * 16, j8 = dim / 8 * 8;

    for (size_t h0 = 0; h0 < nh; h0 += 6) {
        size_t n6 = nh - h0 < 6 ? nh - h0 : 6;
        const float *s = S + h0, *a = alpha ? alpha + h0 : NULL;
        for (size_t j0 = 0; j0 < j16; j0 += 16) {
            float *c = C + h0 * ldc + j0;
            const float *v = V + j0;
            CTX_CASES(2)
        }
        if (j8 > j16) {
            float *c = C + h0 * ldc + j16;
            const float *v = V + j16;
            CTX_CASES(1)
        }
    }
    if (j8 < dim)
        kernels_attn_ctx_scalar(S, hp, alpha, V + j8, ldv, rows, nh, dim - j8, C + j8, ldc);
}

static void avx2_fold(float *C, const float *Ck, float a, float b, size_t n)
{
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(C + j, _mm256_fmadd_ps(_mm256_loadu_ps(Ck + j), vb,
                                                _mm256_mul_ps(_mm256_loadu_ps(C + j), va)));
    for (; j < n; j++)
        C[j] = fmaf(Ck[j], b, C[j] * a);
}

static void avx2_scale(float *x, float s, size_t n)
{
    const __m256 vs = _mm256_set1_ps(s);
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), vs));
    for (; j < n; j++)
        x[j] *= s;
}

/* ---- KDA ------------------------------------------------------------------------------ */

/* The step for columns [j0, j0 + 8*nz), every token. */
AI void kda_cols(float *S, size_t dk, size_t dv, size_t n, const float *q, const float *k,
                 const float *alpha, size_t qs, const float *v, size_t vs, const float *beta,
                 size_t bs, float *o, size_t j0, const int nz)
{
    for (size_t t = 0; t < n; t++) {
        const float *qt = q + t * qs, *kt = k + t * qs, *at = alpha + t * qs;
        __m256 tmp[4], u[4], acc[4];
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            tmp[z] = acc[z] = _mm256_setzero_ps();
        for (size_t r = 0; r < dk; r++) {
            __m256 a = _mm256_broadcast_ss(at + r), kr = _mm256_broadcast_ss(kt + r);
            float *row = S + r * dv + j0;
#pragma GCC unroll 4
            for (int z = 0; z < nz; z++) {
                __m256 x = _mm256_mul_ps(_mm256_loadu_ps(row + 8 * z), a);
                _mm256_storeu_ps(row + 8 * z, x);
                tmp[z] = _mm256_fmadd_ps(kr, x, tmp[z]);
            }
        }
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            u[z] = _mm256_sub_ps(_mm256_loadu_ps(v + t * vs + j0 + 8 * z), tmp[z]);
        for (size_t r = 0; r < dk; r++) {
            __m256 bk = _mm256_set1_ps(beta[t * bs] * kt[r]), qr = _mm256_broadcast_ss(qt + r);
            float *row = S + r * dv + j0;
#pragma GCC unroll 4
            for (int z = 0; z < nz; z++) {
                __m256 x = _mm256_fmadd_ps(bk, u[z], _mm256_loadu_ps(row + 8 * z));
                _mm256_storeu_ps(row + 8 * z, x);
                acc[z] = _mm256_fmadd_ps(qr, x, acc[z]);
            }
        }
#pragma GCC unroll 4
        for (int z = 0; z < nz; z++)
            _mm256_storeu_ps(o + t * vs + j0 + 8 * z, acc[z]);
    }
}

static void avx2_kda_head(float *S, size_t dk, size_t dv, size_t n, const float *q,
                          const float *k, const float *alpha, size_t qs, const float *v,
                          size_t vs, const float *beta, size_t bs, float *o)
{
    size_t j0 = 0;
    for (; j0 + 32 <= dv; j0 += 32)
        kda_cols(S, dk, dv, n, q, k, alpha, qs, v, vs, beta, bs, o, j0, 4);
    for (; j0 + 8 <= dv; j0 += 8)
        kda_cols(S, dk, dv, n, q, k, alpha, qs, v, vs, beta, bs, o, j0, 1);
    if (j0 < dv)
        kernels_attn_kda_scalar(S, dk, dv, j0, dv, n, q, k, alpha, qs, v, vs, beta, bs, o);
}

static void avx2_kda_conv(float *x, size_t n, size_t p, size_t c0, size_t c1, size_t kw,
                          const float *taps, float *win)
{
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    size_t ch = c0;
    for (; ch + 8 <= c1; ch += 8)
        for (size_t t = 0; t < n; t++) {
            __m256 in = _mm256_loadu_ps(x + t * p + ch), y = _mm256_setzero_ps();
            for (size_t j = 0; j + 1 < kw; j++)
                y = _mm256_fmadd_ps(_mm256_loadu_ps(taps + j * p + ch),
                                    _mm256_loadu_ps(win + j * p + ch), y);
            y = _mm256_fmadd_ps(_mm256_loadu_ps(taps + (kw - 1) * p + ch), in, y);
            for (size_t j = 0; j + 2 < kw; j++)
                _mm256_storeu_ps(win + j * p + ch, _mm256_loadu_ps(win + (j + 1) * p + ch));
            if (kw > 1)
                _mm256_storeu_ps(win + (kw - 2) * p + ch, in);
            __m256 e = exp8(_mm256_xor_ps(y, neg));
            _mm256_storeu_ps(x + t * p + ch,
                             _mm256_mul_ps(y, _mm256_div_ps(one, _mm256_add_ps(one, e))));
        }
    if (ch < c1)
        kernels_attn_conv_scalar(x, n, p, ch, c1, kw, taps, win);
}

const kernels_attn_ops kernels_attn_ops_avx2 = {
    8, 24, widen, avx2_scores, avx2_softmax, avx2_ctx, avx2_fold, avx2_scale, avx2_kda_head,
    avx2_kda_conv
};

#else
/* Not x86-64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_attn_avx2_unused;
#endif
