/* attn.c — the attention family: dispatch, the MLA driver (superblocks
 * split between threads, partial states folded in order), the KDA
 * drivers, and the scalar reference of every per-ISA piece (the
 * definition the SIMD variants are checked against; numerics in
 * attn_int.h).
 *
 * MLA threads: a call's work is cut into tasks (token t, superblock k).  A
 * wave of up to npart tasks runs as one region (threads take tasks from a
 * counter), each task leaving its partial (m, l, C) in a slot; a second
 * region folds each token's partials in k order into its running state
 * (heads split between threads).  Waves go superblock-major over a group
 * of tokens, so a chunk's tokens share each superblock's rows while they
 * are in the caches; how tokens are grouped and waves cut changes nothing
 * in the numbers (a token's fold is always k = 0, 1, 2, ... in order).
 *
 * Does not own the cache (the session appends rows), the projections
 * around the attention, nor the KDA gates and norms.
 */
#include "engine/kernels/attn_int.h"

#include <stdatomic.h>
#include <stdlib.h>

const kernels_attn_ops *kernels_attn_ops_get(void)
{
    switch (kernels_get_isa()) {
#if defined(__x86_64__)
    case KERNELS_ISA_AVX2:       return &kernels_attn_ops_avx2;
    case KERNELS_ISA_AVX512VNNI: return &kernels_attn_ops_avx512;
#endif
#if defined(__aarch64__)
    case KERNELS_ISA_NEON:       return &kernels_attn_ops_neon;
#endif
    default:                     return &kernels_attn_ops_scalar;
    }
}

/* ---- cache values ----------------------------------------------------------------- */

size_t kernels_kv_size(kernels_kv_type t)
{
    switch (t) {
    case KERNELS_KV_F32:  return 4;
    case KERNELS_KV_BF16:
    case KERNELS_KV_F16:  return 2;
    default:              return 0;
    }
}

void kernels_kv_store(kernels_kv_type t, const float *src, void *dst, size_t n)
{
    uint16_t *h = dst;
    switch (t) {
    case KERNELS_KV_F32:
        memcpy(dst, src, n * sizeof *src);
        break;
    case KERNELS_KV_BF16:
        for (size_t i = 0; i < n; i++)
            h[i] = kernels_f32_bf16(src[i]);
        break;
    case KERNELS_KV_F16:
        for (size_t i = 0; i < n; i++)
            h[i] = kernels_f32_f16(src[i]);
        break;
    }
}

void kernels_kv_load(kernels_kv_type t, const void *src, float *dst, size_t n)
{
    const uint16_t *h = src;
    switch (t) {
    case KERNELS_KV_F32:
        memcpy(dst, src, n * sizeof *dst);
        break;
    case KERNELS_KV_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = kernels_bf16_f32(h[i]);
        break;
    case KERNELS_KV_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = kernels_f16_f32(h[i]);
        break;
    }
}

/* ---- MLA workspace ------------------------------------------------------------------ */

/* Tokens whose queries and fold state a call holds at once. */
#define MLA_GROUP 16
/* Heads a fold unit takes. */
#define MLA_FOLD_HEADS 8

struct kernels_mla_ws {
    size_t heads, kl, rope, D, hpmax, nmax, gmax, npart;
    int nthreads;
    float *qT;           /* [gmax][D * hpmax] transposed queries (kernels_mla_qt) */
    float *part;         /* [npart][pstride]: C [heads][kl], m [hpmax], l [hpmax] */
    size_t pstride;
    float *M, *L;        /* [gmax][hpmax] running fold state */
    float *thr;          /* [nthreads][tstride]: buf, S, alpha */
    size_t tstride;
    size_t *task_t, *task_k;   /* [npart] the current wave */
    size_t bytes;
};

static size_t round_up(size_t x, size_t m)
{
    return (x + m - 1) / m * m;
}

kernels_mla_ws *kernels_mla_ws_new(size_t heads, size_t kl, size_t rope, size_t nmax,
                                   int nthreads)
{
    kernels_mla_ws *ws;

    if (heads == 0 || kl == 0 || nmax == 0 || nthreads < 1 || nthreads > 256 ||
        heads > 4096 || kl + rope > (1u << 20))
        return NULL;
    ws = calloc(1, sizeof *ws);
    if (!ws)
        return NULL;
    ws->heads = heads;
    ws->kl = kl;
    ws->rope = rope;
    ws->D = kl + rope;
    ws->hpmax = round_up(heads, 16);   /* the widest ISA's lanes */
    ws->nmax = nmax;
    ws->gmax = nmax < MLA_GROUP ? nmax : MLA_GROUP;
    ws->nthreads = nthreads;
    ws->npart = (size_t)nthreads * 8 < 2 * MLA_GROUP ? 2 * MLA_GROUP : (size_t)nthreads * 8;
    ws->pstride = round_up(heads * kl, 16) + 2 * ws->hpmax;
    ws->tstride = round_up(KERNELS_MLA_BLOCK * ws->D, 16) + (KERNELS_MLA_BLOCK + 1) * ws->hpmax;
    /* buf: a half-precision block widened, [BLOCK][kl] then [BLOCK][rope] */
    size_t nq = ws->gmax * ws->D * ws->hpmax, np = ws->npart * ws->pstride;
    size_t nms = 2 * ws->gmax * ws->hpmax, nt = (size_t)nthreads * ws->tstride;
    ws->bytes = (nq + np + nms + nt) * sizeof(float) + 2 * ws->npart * sizeof(size_t);
    ws->qT = aligned_alloc(64, round_up(nq * sizeof(float), 64));
    ws->part = aligned_alloc(64, round_up(np * sizeof(float), 64));
    ws->M = calloc(nms, sizeof(float));
    ws->thr = aligned_alloc(64, round_up(nt * sizeof(float), 64));
    ws->task_t = calloc(2 * ws->npart, sizeof(size_t));
    if (!ws->qT || !ws->part || !ws->M || !ws->thr || !ws->task_t) {
        kernels_mla_ws_free(ws);
        return NULL;
    }
    ws->L = ws->M + ws->gmax * ws->hpmax;
    ws->task_k = ws->task_t + ws->npart;
    memset(ws->thr, 0, nt * sizeof(float));
    return ws;
}

void kernels_mla_ws_free(kernels_mla_ws *ws)
{
    if (!ws)
        return;
    free(ws->qT);
    free(ws->part);
    free(ws->M);
    free(ws->thr);
    free(ws->task_t);
    free(ws);
}

size_t kernels_mla_ws_bytes(const kernels_mla_ws *ws)
{
    return ws ? ws->bytes + sizeof *ws : 0;
}

/* ---- MLA driver -------------------------------------------------------------------- */

/* Lane h of q^T in the kernels_mla_qt layout = [a (na floats) | b (the
 * rest of D)], or 0 for a NULL (a padding lane).  One division per lane,
 * not per element. */
static void qt_lane(float *dst, size_t hp, size_t qt, size_t D, size_t h, const float *a,
                    size_t na, const float *b)
{
    size_t g0 = h / qt * qt, w = hp - g0 < qt ? hp - g0 : qt;
    float *q = dst + kernels_mla_qt(hp, qt, D, 0, h);

    for (size_t l = 0; l < D; l++)
        q[l * w] = !a ? 0 : l < na ? a[l] : b[l - na];
}

struct mla_call {
    const kernels_mla *a;
    kernels_mla_ws *ws;
    const kernels_attn_ops *ops;
    size_t hp, t0, t1;        /* lanes used, the token group */
    size_t ntask;             /* in the current wave */
    _Atomic size_t next;
};

static size_t mla_len(const kernels_mla *a, size_t t)
{
    return a->pos0 + t + 1;
}

static size_t mla_nsuper(const kernels_mla *a, size_t t)
{
    return (mla_len(a, t) + KERNELS_MLA_SB - 1) / KERNELS_MLA_SB;
}

/* q^T of the group's tokens: lane h of column l = [qa_h | qx_h][l] for
 * h < heads, 0 for the padding lanes. */
static void mla_transpose(const struct mla_call *mc)
{
    const kernels_mla *a = mc->a;
    const kernels_mla_ws *ws = mc->ws;
    size_t H = a->heads, kl = a->kl, D = ws->D, hp = mc->hp, qt = mc->ops->qtile;

    for (size_t t = mc->t0; t < mc->t1; t++) {
        float *q = ws->qT + (t - mc->t0) * D * hp;
        for (size_t h = 0; h < hp; h++)
            qt_lane(q, hp, qt, D, h, h < H ? a->qa + (t * H + h) * kl : NULL, kl,
                    h < H ? a->qx + t * a->qx_tok + h * a->qx_head : NULL);
    }
}

/* The rows of block [b0, b0 + rows): read in place (f32) or widened into
 * buf; the next `next` rows are what the kernels prefetch meanwhile. */
static kernels_attn_rows mla_block(const kernels_mla *a, const kernels_attn_ops *ops, size_t b0,
                                   size_t rows, size_t next, float *buf)
{
    size_t kl = a->kl, rope = a->rope, es = kernels_kv_size(a->type);
    const char *c = (const char *)a->c + b0 * kl * es, *r = (const char *)a->r + b0 * rope * es;
    kernels_attn_rows b = { (const float *)c, (const float *)r, kl, kl, rope, rope, rows,
                            { c + rows * kl * es, r + rows * rope * es },
                            { next * kl * es, next * rope * es } };

    if (a->type != KERNELS_KV_F32) {
        ops->widen(a->type, c, buf, rows * kl);
        ops->widen(a->type, r, buf + KERNELS_MLA_BLOCK * kl, rows * rope);
        b.c = buf;
        b.r = buf + KERNELS_MLA_BLOCK * kl;
    }
    if (!rope)
        b.r = b.c;  /* never read; keeps every pointer valid */
    return b;
}

/* One task: token task_t[i], superblock task_k[i], into slot i. */
static void mla_super(const struct mla_call *mc, size_t i, int tid)
{
    const kernels_mla *a = mc->a;
    const kernels_mla_ws *ws = mc->ws;
    const kernels_attn_ops *ops = mc->ops;
    size_t t = ws->task_t[i], k = ws->task_k[i], hp = mc->hp, H = a->heads, kl = a->kl;
    size_t s0 = k * KERNELS_MLA_SB, s1 = s0 + KERNELS_MLA_SB, len = mla_len(a, t);
    float *C = ws->part + i * ws->pstride, *m = C + round_up(H * kl, 16), *l = m + ws->hpmax;
    float *buf = ws->thr + (size_t)tid * ws->tstride;
    float *S = buf + round_up(KERNELS_MLA_BLOCK * ws->D, 16), *alpha = S + KERNELS_MLA_BLOCK * hp;
    const float *qT = ws->qT + (t - mc->t0) * ws->D * hp;

    if (s1 > len)
        s1 = len;
    for (size_t h = 0; h < hp; h++) {
        m[h] = -INFINITY;
        l[h] = 0;
    }
    for (size_t b0 = s0; b0 < s1; b0 += KERNELS_MLA_BLOCK) {
        size_t rows = s1 - b0 < KERNELS_MLA_BLOCK ? s1 - b0 : KERNELS_MLA_BLOCK;
        size_t nb = b0 + rows, next = len - nb < KERNELS_MLA_BLOCK ? len - nb : KERNELS_MLA_BLOCK;
        kernels_attn_rows b = mla_block(a, ops, b0, rows, next, buf);
        ops->scores(qT, hp, &b, a->scale, S);
        ops->softmax(S, hp, rows, m, l, alpha);
        /* the first block stores its sums: C = fmaf(0, 0, cb) = cb */
        ops->ctx(S, hp, b0 == s0 ? NULL : alpha, b.c, b.ldc, rows, H, kl, C, kl);
    }
}

static void mla_wave_task(void *ctx, int tid, int nthreads)
{
    struct mla_call *mc = ctx;
    size_t i;

    (void)nthreads;
    while ((i = atomic_fetch_add_explicit(&mc->next, 1, memory_order_relaxed)) < mc->ntask)
        mla_super(mc, i, tid);
}

/* Fold the wave's partials of token t, heads [h0, h1), in k order. */
static void mla_fold_unit(const struct mla_call *mc, size_t t, size_t h0, size_t h1)
{
    const kernels_mla *a = mc->a;
    const kernels_mla_ws *ws = mc->ws;
    size_t kl = a->kl, g = t - mc->t0, last = mla_nsuper(a, t) - 1;
    float *M = ws->M + g * ws->hpmax, *L = ws->L + g * ws->hpmax;

    for (size_t i = 0; i < mc->ntask; i++) {
        if (ws->task_t[i] != t)
            continue;
        const float *Ck = ws->part + i * ws->pstride, *mk = Ck + round_up(a->heads * kl, 16);
        const float *lk = mk + ws->hpmax;
        for (size_t h = h0; h < h1; h++) {
            float *ctx = a->ctx + (t * a->heads + h) * kl;
            if (ws->task_k[i] == 0) {
                M[h] = mk[h];
                L[h] = lk[h];
                memcpy(ctx, Ck + h * kl, kl * sizeof *ctx);
            } else {
                float mn = kernels_attn_max(mk[h], M[h]);
                float fa = kernels_attn_exp(M[h] - mn), fb = kernels_attn_exp(mk[h] - mn);
                L[h] = fmaf(lk[h], fb, L[h] * fa);
                mc->ops->fold(ctx, Ck + h * kl, fa, fb, kl);
                M[h] = mn;
            }
            if (ws->task_k[i] == last)
                mc->ops->scale(ctx, 1.0f / L[h], kl);
        }
    }
}

static void mla_fold_task(void *ctx, int tid, int nthreads)
{
    struct mla_call *mc = ctx;
    size_t per = (mc->a->heads + MLA_FOLD_HEADS - 1) / MLA_FOLD_HEADS;
    size_t units = (mc->t1 - mc->t0) * per, u;

    (void)tid;
    (void)nthreads;
    while ((u = atomic_fetch_add_explicit(&mc->next, 1, memory_order_relaxed)) < units) {
        size_t h0 = (u % per) * MLA_FOLD_HEADS, h1 = h0 + MLA_FOLD_HEADS;
        mla_fold_unit(mc, mc->t0 + u / per, h0, h1 < mc->a->heads ? h1 : mc->a->heads);
    }
}

static void mla_region(kernels_pool *pool, kernels_pool_fn fn, struct mla_call *mc, size_t units)
{
    atomic_store_explicit(&mc->next, 0, memory_order_relaxed);
    if (units <= 1)
        fn(mc, 0, 1);
    else
        kernels_pool_run_any(pool, fn, mc);
}

/* The waves of token group [t0, t1): superblock-major, at most npart tasks. */
static void mla_group(kernels_pool *pool, struct mla_call *mc)
{
    const kernels_mla *a = mc->a;
    kernels_mla_ws *ws = mc->ws;
    size_t kmax = mla_nsuper(a, mc->t1 - 1), k = 0;
    size_t per = (a->heads + MLA_FOLD_HEADS - 1) / MLA_FOLD_HEADS;

    mla_transpose(mc);
    while (k < kmax) {
        mc->ntask = 0;
        for (; k < kmax; k++) {
            size_t first = mc->t0, cnt;
            while (mla_nsuper(a, first) <= k)
                first++;  /* tokens are in position order: later ones see more */
            cnt = mc->t1 - first;
            if (mc->ntask > 0 && mc->ntask + cnt > ws->npart)
                break;
            for (size_t t = first; t < mc->t1; t++) {
                ws->task_t[mc->ntask] = t;
                ws->task_k[mc->ntask++] = k;
            }
        }
        mla_region(pool, mla_wave_task, mc, mc->ntask);
        mla_region(pool, mla_fold_task, mc, (mc->t1 - mc->t0) * per);
    }
}

int kernels_mla_attend(kernels_mla_ws *ws, kernels_pool *pool, const kernels_mla *a,
                       shoal_err *err)
{
    struct mla_call mc = { .a = a, .ws = ws };

    if (!ws || !a)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: MLA call without workspace or arguments");
    if (a->heads != ws->heads || a->kl != ws->kl || a->rope != ws->rope)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "kernels: MLA call of %zu heads x (%zu + %zu), workspace made for "
                             "%zu x (%zu + %zu)", a->heads, a->kl, a->rope, ws->heads, ws->kl,
                             ws->rope);
    if (a->n > ws->nmax || kernels_pool_nthreads(pool) > ws->nthreads)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "kernels: MLA call of %zu tokens on %d threads, workspace holds "
                             "%zu on %d", a->n, kernels_pool_nthreads(pool), ws->nmax,
                             ws->nthreads);
    if (kernels_kv_size(a->type) == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: unknown cache type %d", (int)a->type);
    if (a->n == 0)
        return 0;
    if (!a->c || (a->rope && (!a->r || !a->qx)) || !a->qa || !a->ctx)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: MLA call with a NULL array");
    mc.ops = kernels_attn_ops_get();
    mc.hp = round_up(a->heads, mc.ops->lanes);
    for (size_t t0 = 0; t0 < a->n; t0 += ws->gmax) {
        mc.t0 = t0;
        mc.t1 = t0 + ws->gmax < a->n ? t0 + ws->gmax : a->n;
        mla_group(pool, &mc);
    }
    return 0;
}

/* ---- MLA, expanded form ------------------------------------------------------------------ */

struct kernels_mla_xws {
    size_t heads, kl, rope, nope, vd, KV, Dq, npmax, nmax;
    int nthreads;
    float *thr;      /* [nthreads][tstride]: W^T, X, q^T, S, buf, m, l, alpha */
    size_t tstride;
    size_t bytes;
};

/* One thread's scratch. */
struct xthr {
    float *wt;       /* [kl * KV] W_h^T (kernels_mla_qt layout, KV lanes) */
    float *X;        /* [BLOCK][KV] the block's K_h | V_h */
    float *qT;       /* [Dq * np] the tokens' [q_nope | qx] (np lanes) */
    float *S;        /* [BLOCK][np] */
    float *buf;      /* [BLOCK][max(kl, rope)] widened rows */
    float *m, *l, *alpha;   /* [np] */
};

static struct xthr xthr_get(const kernels_mla_xws *ws, int tid)
{
    float *p = ws->thr + (size_t)tid * ws->tstride;
    size_t wide = ws->kl > ws->rope ? ws->kl : ws->rope;
    struct xthr x;
    x.wt = p;
    x.X = x.wt + round_up(ws->kl * ws->KV, 16);
    x.qT = x.X + KERNELS_MLA_BLOCK * ws->KV;
    x.S = x.qT + round_up(ws->Dq * ws->npmax, 16);
    x.buf = x.S + KERNELS_MLA_BLOCK * ws->npmax;
    x.m = x.buf + round_up(KERNELS_MLA_BLOCK * wide, 16);
    x.l = x.m + ws->npmax;
    x.alpha = x.l + ws->npmax;
    return x;
}

kernels_mla_xws *kernels_mla_xws_new(size_t heads, size_t kl, size_t rope, size_t nope,
                                     size_t vd, size_t nmax, int nthreads)
{
    kernels_mla_xws *ws;

    if (heads == 0 || kl == 0 || nope + rope == 0 || vd == 0 || nmax == 0 || nthreads < 1 ||
        nthreads > 256 || kl > (1u << 16) || nope + vd > (1u << 16) || nmax > (1u << 16))
        return NULL;
    ws = calloc(1, sizeof *ws);
    if (!ws)
        return NULL;
    *ws = (kernels_mla_xws){ heads, kl, rope, nope, vd, round_up(nope + vd, 16), nope + rope,
                             round_up(nmax, 16), nmax, nthreads, NULL, 0, 0 };
    size_t wide = kl > rope ? kl : rope;
    ws->tstride = round_up(kl * ws->KV, 16) + KERNELS_MLA_BLOCK * ws->KV +
                  round_up(ws->Dq * ws->npmax, 16) + KERNELS_MLA_BLOCK * ws->npmax +
                  round_up(KERNELS_MLA_BLOCK * wide, 16) + 3 * ws->npmax;
    ws->tstride = round_up(ws->tstride, 16);
    ws->bytes = (size_t)nthreads * ws->tstride * sizeof(float) + sizeof *ws;
    ws->thr = aligned_alloc(64, (size_t)nthreads * ws->tstride * sizeof(float));
    if (!ws->thr) {
        free(ws);
        return NULL;
    }
    memset(ws->thr, 0, (size_t)nthreads * ws->tstride * sizeof(float));
    return ws;
}

void kernels_mla_xws_free(kernels_mla_xws *ws)
{
    if (!ws)
        return;
    free(ws->thr);
    free(ws);
}

size_t kernels_mla_xws_bytes(const kernels_mla_xws *ws)
{
    return ws ? ws->bytes : 0;
}

struct xcall {
    const kernels_mla_x *a;
    const kernels_mla_xws *ws;
    const kernels_attn_ops *ops;
    size_t np;               /* token lanes */
    _Atomic size_t next;
};

/* Per head: W_h^T and the tokens' queries in the kernels' q^T layout. */
static void x_prepare(const struct xcall *xc, size_t h, const struct xthr *x)
{
    const kernels_mla_x *a = xc->a;
    size_t KV = xc->ws->KV, kl = a->kl, nope = a->nope, qt = xc->ops->qtile, Dq = xc->ws->Dq;
    const float *w = a->wkv + h * (nope + a->vd) * kl;

    for (size_t i = 0; i < KV; i++)
        qt_lane(x->wt, KV, qt, kl, i, i < nope + a->vd ? w + i * kl : NULL, kl, NULL);
    for (size_t t = 0; t < xc->np; t++)
        qt_lane(x->qT, xc->np, qt, Dq, t, t < a->n ? a->qn + t * a->qn_tok + h * a->qn_head : NULL,
                nope, t < a->n ? a->qx + t * a->qx_tok + h * a->qx_head : NULL);
}

/* Block [b0, b0 + rows) of head h: expand, score, mask, step 2. */
static void x_block(const struct xcall *xc, size_t h, const struct xthr *x, size_t b0,
                    size_t rows, size_t next)
{
    const kernels_mla_x *a = xc->a;
    const kernels_attn_ops *ops = xc->ops;
    size_t kl = a->kl, rope = a->rope, es = kernels_kv_size(a->type), KV = xc->ws->KV, np = xc->np;
    const char *c = (const char *)a->c + b0 * kl * es, *r = (const char *)a->r + b0 * rope * es;
    kernels_attn_rows bc = { (const float *)c, (const float *)c, kl, kl, 0, 0, rows,
                             { c + rows * kl * es, r + rows * rope * es },
                             { next * kl * es, next * rope * es } };
    kernels_attn_rows bk = { x->X, (const float *)r, KV, a->nope, rope, rope, rows,
                             { NULL, NULL }, { 0, 0 } };

    if (a->type != KERNELS_KV_F32) {
        ops->widen(a->type, c, x->buf, rows * kl);
        bc.c = bc.r = x->buf;
    }
    ops->scores(x->wt, KV, &bc, 1.0f, x->X);
    if (a->type != KERNELS_KV_F32 && rope) {
        ops->widen(a->type, r, x->buf, rows * rope);
        bk.r = x->buf;
    }
    if (!rope)
        bk.r = bk.c;
    ops->scores(x->qT, np, &bk, a->scale, x->S);
    for (size_t i = 0; i < rows; i++)
        if (b0 + i > a->pos0)
            for (size_t t = 0; t < a->n && b0 + i > a->pos0 + t; t++)
                x->S[i * np + t] = -INFINITY;
    ops->softmax(x->S, np, rows, x->m, x->l, x->alpha);
    ops->ctx(x->S, np, b0 == 0 ? NULL : x->alpha, x->X + a->nope, KV, rows, a->n, a->vd,
             a->o + h * a->vd, a->heads * a->vd);
}

static void x_task(void *ctx, int tid, int nthreads)
{
    struct xcall *xc = ctx;
    const kernels_mla_x *a = xc->a;
    struct xthr x = xthr_get(xc->ws, tid);
    size_t h, end = a->pos0 + a->n;

    (void)nthreads;
    while ((h = atomic_fetch_add_explicit(&xc->next, 1, memory_order_relaxed)) < a->heads) {
        x_prepare(xc, h, &x);
        for (size_t t = 0; t < xc->np; t++) {
            x.m[t] = -INFINITY;
            x.l[t] = 0;
        }
        for (size_t b0 = 0; b0 < end; b0 += KERNELS_MLA_BLOCK) {
            size_t rows = end - b0 < KERNELS_MLA_BLOCK ? end - b0 : KERNELS_MLA_BLOCK;
            size_t nb = b0 + rows, next = end - nb < KERNELS_MLA_BLOCK ? end - nb : KERNELS_MLA_BLOCK;
            x_block(xc, h, &x, b0, rows, next);
        }
        for (size_t t = 0; t < a->n; t++)
            xc->ops->scale(a->o + (t * a->heads + h) * a->vd, 1.0f / x.l[t], a->vd);
    }
}

int kernels_mla_expanded(kernels_mla_xws *ws, kernels_pool *pool, const kernels_mla_x *a,
                         shoal_err *err)
{
    struct xcall xc = { .a = a, .ws = ws };

    if (!ws || !a)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: expanded MLA call without workspace or arguments");
    if (a->heads != ws->heads || a->kl != ws->kl || a->rope != ws->rope || a->nope != ws->nope ||
        a->vd != ws->vd)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: expanded MLA call of other shapes than its workspace's");
    if (a->n > ws->nmax || kernels_pool_nthreads(pool) > ws->nthreads)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "kernels: expanded MLA call of %zu tokens on %d threads, workspace "
                             "holds %zu on %d", a->n, kernels_pool_nthreads(pool), ws->nmax,
                             ws->nthreads);
    if (kernels_kv_size(a->type) == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: unknown cache type %d", (int)a->type);
    if (a->n == 0)
        return 0;
    if (!a->c || (a->rope && (!a->r || !a->qx)) || (a->nope && !a->qn) || !a->wkv || !a->o)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: expanded MLA call with a NULL array");
    xc.ops = kernels_attn_ops_get();
    xc.np = round_up(a->n, xc.ops->lanes);
    atomic_init(&xc.next, 0);
    if (a->heads == 1)
        x_task(&xc, 0, 1);
    else
        kernels_pool_run_any(pool, x_task, &xc);
    return 0;
}

/* ---- KDA drivers ---------------------------------------------------------------------- */

struct kda_call {
    const kernels_kda *a;
    const kernels_attn_ops *ops;
    _Atomic size_t next;
};

static void kda_task(void *ctx, int tid, int nthreads)
{
    struct kda_call *kc = ctx;
    const kernels_kda *a = kc->a;
    size_t h, dk = a->dk, dv = a->dv;

    (void)tid;
    (void)nthreads;
    while ((h = atomic_fetch_add_explicit(&kc->next, 1, memory_order_relaxed)) < a->heads)
        kc->ops->kda_head(a->S + h * dk * dv, dk, dv, a->n, a->q + h * dk, a->k + h * dk,
                          a->alpha + h * dk, a->heads * dk, a->v + h * dv, a->heads * dv,
                          a->beta + h, a->heads, a->o + h * dv);
}

int kernels_kda_step(kernels_pool *pool, const kernels_kda *a, shoal_err *err)
{
    struct kda_call kc = { .a = a };

    if (!a || a->heads == 0 || a->dk == 0 || a->dv == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: KDA step with a zero size");
    if (a->n == 0)
        return 0;
    if (!a->S || !a->q || !a->k || !a->alpha || !a->v || !a->beta || !a->o)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: KDA step with a NULL array");
    kc.ops = kernels_attn_ops_get();
    atomic_init(&kc.next, 0);
    if (a->heads == 1)
        kda_task(&kc, 0, 1);
    else
        kernels_pool_run_any(pool, kda_task, &kc);
    return 0;
}

/* Channels a conv task takes (a multiple of every ISA's lanes). */
#define CONV_CHUNK 1024

struct conv_call {
    const kernels_attn_ops *ops;
    float *x;
    const float *taps;
    float *win;
    size_t n, p, kw;
    _Atomic size_t next;
};

static void conv_task(void *ctx, int tid, int nthreads)
{
    struct conv_call *cc = ctx;
    size_t c0;

    (void)tid;
    (void)nthreads;
    while ((c0 = atomic_fetch_add_explicit(&cc->next, CONV_CHUNK, memory_order_relaxed)) < cc->p)
        cc->ops->kda_conv(cc->x, cc->n, cc->p, c0, c0 + CONV_CHUNK < cc->p ? c0 + CONV_CHUNK : cc->p,
                          cc->kw, cc->taps, cc->win);
}

void kernels_kda_conv(kernels_pool *pool, float *x, size_t n, size_t p, size_t kw,
                      const float *taps, float *win)
{
    struct conv_call cc = { kernels_attn_ops_get(), x, taps, win, n, p, kw, 0 };

    if (n == 0 || p == 0 || kw == 0)
        return;
    if (p <= CONV_CHUNK)
        conv_task(&cc, 0, 1);
    else
        kernels_pool_run_any(pool, conv_task, &cc);
}

struct decay_call {
    const kernels_attn_ops *ops;
    float *z;
    const float *A, *dt_bias;
    float lower;
    size_t n, p;
    _Atomic size_t next;
};

static void decay_task(void *ctx, int tid, int nthreads)
{
    struct decay_call *dc = ctx;
    size_t c0;

    (void)tid;
    (void)nthreads;
    while ((c0 = atomic_fetch_add_explicit(&dc->next, CONV_CHUNK, memory_order_relaxed)) < dc->p)
        dc->ops->kda_decay(dc->z, dc->n, dc->p, c0, c0 + CONV_CHUNK < dc->p ? c0 + CONV_CHUNK : dc->p,
                           dc->A, dc->dt_bias, dc->lower);
}

void kernels_kda_decay(kernels_pool *pool, float *z, size_t n, size_t p, const float *A,
                       const float *dt_bias, float lower)
{
    struct decay_call dc = { kernels_attn_ops_get(), z, A, dt_bias, lower, n, p, 0 };

    if (n == 0 || p == 0)
        return;
    if (p <= CONV_CHUNK)
        decay_task(&dc, 0, 1);
    else
        kernels_pool_run_any(pool, decay_task, &dc);
}

void kernels_kda_conv_taps(const float *src, size_t p, size_t kw, float *dst)
{
    for (size_t ch = 0; ch < p; ch++)
        for (size_t j = 0; j < kw; j++)
            dst[j * p + ch] = src[ch * kw + j];
}

/* ---- the scalar reference --------------------------------------------------------------- */

static void scalar_scores(const float *qT, size_t hp, const kernels_attn_rows *b, float scale,
                          float *S)
{
    size_t kl = b->kl, D = kl + b->rope;

    for (size_t i = 0; i < b->rows; i++)
        for (size_t h = 0; h < hp; h++) {
            const float *c = b->c + i * b->ldc, *r = b->r + i * b->ldr;
            float P[KERNELS_MLA_SEGS];
            for (size_t j = 0; j < KERNELS_MLA_SEGS; j++) {
                float acc = 0;
                for (size_t l = kernels_mla_seg(D, j); l < kernels_mla_seg(D, j + 1); l++)
                    acc = fmaf(qT[h * D + l], l < kl ? c[l] : r[l - kl], acc);
                P[j] = acc;
            }
            for (size_t w = 1; w < KERNELS_MLA_SEGS; w *= 2)
                for (size_t j = 0; j < KERNELS_MLA_SEGS; j += 2 * w)
                    P[j] = P[j] + P[j + w];
            S[i * hp + h] = P[0] * scale;
        }
}

static void scalar_softmax(float *S, size_t hp, size_t rows, float *m, float *l, float *alpha)
{
    for (size_t h = 0; h < hp; h++) {
        float bm = S[h], lb = 0;
        for (size_t i = 1; i < rows; i++)
            bm = kernels_attn_max(S[i * hp + h], bm);
        float mn = kernels_attn_max(bm, m[h]);
        alpha[h] = kernels_attn_exp(m[h] - mn);
        for (size_t i = 0; i < rows; i++) {
            float p = kernels_attn_exp(S[i * hp + h] - mn);
            S[i * hp + h] = p;
            lb = lb + p;
        }
        l[h] = fmaf(l[h], alpha[h], lb);
        m[h] = mn;
    }
}

void kernels_attn_ctx_scalar(const float *S, size_t hp, const float *alpha, const float *V,
                             size_t ldv, size_t rows, size_t nh, size_t dim, float *C,
                             size_t ldc)
{
    for (size_t h = 0; h < nh; h++)
        for (size_t j = 0; j < dim; j++) {
            float acc = 0;
            for (size_t i = 0; i < rows; i++)
                acc = fmaf(S[i * hp + h], V[i * ldv + j], acc);
            C[h * ldc + j] = alpha ? fmaf(C[h * ldc + j], alpha[h], acc) : acc;
        }
}

static void scalar_fold(float *C, const float *Ck, float a, float b, size_t n)
{
    for (size_t j = 0; j < n; j++)
        C[j] = fmaf(Ck[j], b, C[j] * a);
}

static void scalar_scale(float *x, float s, size_t n)
{
    for (size_t j = 0; j < n; j++)
        x[j] *= s;
}

/* Column by column: column j of S only meets column j of u and o. */
void kernels_attn_kda_scalar(float *S, size_t dk, size_t dv, size_t j0, size_t j1, size_t n,
                             const float *q, const float *k, const float *alpha, size_t qs,
                             const float *v, size_t vs, const float *beta, size_t bs, float *o)
{
    for (size_t j = j0; j < j1; j++)
        for (size_t t = 0; t < n; t++) {
            const float *qt = q + t * qs, *kt = k + t * qs, *at = alpha + t * qs;
            float tmp = 0, acc = 0, u;
            for (size_t r = 0; r < dk; r++) {
                S[r * dv + j] = S[r * dv + j] * at[r];
                tmp = fmaf(kt[r], S[r * dv + j], tmp);
            }
            u = v[t * vs + j] - tmp;
            for (size_t r = 0; r < dk; r++) {
                float bk = beta[t * bs] * kt[r];
                S[r * dv + j] = fmaf(bk, u, S[r * dv + j]);
                acc = fmaf(qt[r], S[r * dv + j], acc);
            }
            o[t * vs + j] = acc;
        }
}

static void scalar_kda_head(float *S, size_t dk, size_t dv, size_t n, const float *q,
                            const float *k, const float *alpha, size_t qs, const float *v,
                            size_t vs, const float *beta, size_t bs, float *o)
{
    kernels_attn_kda_scalar(S, dk, dv, 0, dv, n, q, k, alpha, qs, v, vs, beta, bs, o);
}

void kernels_attn_conv_scalar(float *x, size_t n, size_t p, size_t c0, size_t c1, size_t kw,
                              const float *taps, float *win)
{
    for (size_t t = 0; t < n; t++)
        for (size_t ch = c0; ch < c1; ch++) {
            float in = x[t * p + ch], y = 0;
            for (size_t j = 0; j + 1 < kw; j++)
                y = fmaf(taps[j * p + ch], win[j * p + ch], y);
            y = fmaf(taps[(kw - 1) * p + ch], in, y);
            for (size_t j = 0; j + 2 < kw; j++)
                win[j * p + ch] = win[(j + 1) * p + ch];
            if (kw > 1)
                win[(kw - 2) * p + ch] = in;
            x[t * p + ch] = kernels_attn_silu(y);
        }
}

void kernels_attn_decay_scalar(float *z, size_t n, size_t p, size_t c0, size_t c1,
                               const float *A, const float *dt_bias, float lower)
{
    for (size_t t = 0; t < n; t++)
        for (size_t ch = c0; ch < c1; ch++)
            z[t * p + ch] = kernels_attn_decay(z[t * p + ch], A[ch], dt_bias[ch], lower);
}

const kernels_attn_ops kernels_attn_ops_scalar = {
    1, 1, kernels_kv_load, scalar_scores, scalar_softmax, kernels_attn_ctx_scalar, scalar_fold,
    scalar_scale, scalar_kda_head, kernels_attn_conv_scalar, kernels_attn_decay_scalar
};
