/* expert.c — SiTU and the fused routed-expert helper:
 * out += weight · w2 · SiTU(w1·z, w3·z) for one MXFP4 expert, in one
 * parallel region.
 *
 * Region layout; threads take chunks of KERNELS_CHUNK_ROWS rows from a
 * shared counter, as the plain products do (dispatch.c):
 *   1. chunks of w1/w3 rows: g, u, h = SiTU(g, u) for those rows; in fast
 *      mode also the quantization of those rows of h (a chunk is whole
 *      32-row blocks of h, so no other thread touches them);
 *   2. wait until every phase-1 chunk is done: a barrier on work, not on
 *      threads, so the region runs with kernels_pool_run_any and a worker
 *      that never got its core is not waited for;
 *   3. chunks of w2 rows: out += weight · (w2·h) for those rows.
 * Does not own routing, expert loading nor the aggregation order across
 * experts (the caller calls experts in routing order).
 */
#include "engine/kernels/kernels_int.h"

#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

void kernels_situ(const float *g, const float *u, float *h, size_t n,
                  float beta1, float beta2)
{
    kernels_ops_get()->situ(g, u, h, n, beta1, beta2);
}

void kernels_situ_scalar(const float *g, const float *u, float *h, size_t n,
                         float beta1, float beta2)
{
    for (size_t i = 0; i < n; i++)
        h[i] = kernels_situ1(g[i], u[i], beta1, beta2);
}

size_t kernels_expert_span_bytes(size_t I, size_t L)
{
    return 3 * (I * L / 2 + I * L / 32);
}

int kernels_expert_view(const uint8_t *span, size_t I, size_t L,
                        kernels_expert *out, shoal_err *err)
{
    size_t one = I * L / 2 + I * L / 32;  /* bytes of one matrix */

    if (!span || I == 0 || L == 0 || I % KERNELS_BLOCK || L % KERNELS_BLOCK)
        return shoal_err_set(err, SHOAL_EINVAL, "expert: I=%zu L=%zu must be multiples of 32", I, L);
    out->w1 = (kernels_mxfp4){ span, span + I * L / 2, I, L };
    out->w2 = (kernels_mxfp4){ span + one, span + one + L * I / 2, L, I };
    out->w3 = (kernels_mxfp4){ span + 2 * one, span + 2 * one + I * L / 2, I, L };
    return 0;
}

struct kernels_expert_ws {
    size_t I, L, nmax;
    float beta1, beta2;
    kernels_act *az, *ah;  /* quantized z [n][L] and h [n][I] */
    float *g, *u, *h;      /* [nmax][I] */
    float *y;              /* [nmax][L] */
};

kernels_expert_ws *kernels_expert_ws_new(size_t I, size_t L, size_t nmax,
                                         float beta1, float beta2)
{
    kernels_expert_ws *ws;

    if (I == 0 || L == 0 || I % KERNELS_BLOCK || L % KERNELS_BLOCK || nmax == 0 ||
        nmax > SIZE_MAX / 4 / (I > L ? I : L) / sizeof(float) || beta1 == 0 || beta2 == 0)
        return NULL;
    ws = calloc(1, sizeof *ws);
    if (!ws)
        return NULL;
    *ws = (kernels_expert_ws){ .I = I, .L = L, .nmax = nmax, .beta1 = beta1, .beta2 = beta2 };
    ws->az = kernels_act_new(L, nmax);
    ws->ah = kernels_act_new(I, nmax);
    ws->g = malloc(nmax * I * sizeof(float));
    ws->u = malloc(nmax * I * sizeof(float));
    ws->h = malloc(nmax * I * sizeof(float));
    ws->y = malloc(nmax * L * sizeof(float));
    if (!ws->az || !ws->ah || !ws->g || !ws->u || !ws->h || !ws->y) {
        kernels_expert_ws_free(ws);
        return NULL;
    }
    return ws;
}

void kernels_expert_ws_free(kernels_expert_ws *ws)
{
    if (!ws)
        return;
    kernels_act_free(ws->az);
    kernels_act_free(ws->ah);
    free(ws->g);
    free(ws->u);
    free(ws->h);
    free(ws->y);
    free(ws);
}

_Static_assert(KERNELS_CHUNK_ROWS % KERNELS_BLOCK == 0, "chunks must be whole blocks of h");

struct expert_run {
    kernels_expert_ws *ws;
    kernels_pool *pool;
    const kernels_ops *ops;
    const kernels_expert *e;
    const float *z;
    size_t n;
    const float *weight;
    float *out;
    kernels_numerics mode;
    _Atomic size_t next1, next2;  /* first row not yet taken, phases 1 and 3 */
    _Atomic size_t done1;         /* phase-1 rows finished */
};

/* Phase 1 on rows [r0, r1) of w1 and w3 (whole 32-row blocks). */
static void expert_up(const struct expert_run *x, size_t r0, size_t r1)
{
    kernels_expert_ws *ws = x->ws;
    size_t I = ws->I;

    if (x->mode == KERNELS_FAST) {
        x->ops->mxfp4_fast(&x->e->w1, r0, r1, ws->az, ws->g, I);
        x->ops->mxfp4_fast(&x->e->w3, r0, r1, ws->az, ws->u, I);
    } else {
        x->ops->mxfp4_exact(&x->e->w1, r0, r1, x->z, x->n, ws->g, I);
        x->ops->mxfp4_exact(&x->e->w3, r0, r1, x->z, x->n, ws->u, I);
    }
    for (size_t v = 0; v < x->n; v++) {
        kernels_situ(ws->g + v * I + r0, ws->u + v * I + r0, ws->h + v * I + r0, r1 - r0,
                     ws->beta1, ws->beta2);
        if (x->mode == KERNELS_FAST)
            kernels_act_quantize_blocks(ws->ah, v, ws->h + v * I, r0 / KERNELS_BLOCK,
                                        r1 / KERNELS_BLOCK);
    }
}

/* Phase 3 on rows [r0, r1) of w2. */
static void expert_down(const struct expert_run *x, size_t r0, size_t r1)
{
    kernels_expert_ws *ws = x->ws;
    size_t L = ws->L;

    if (x->mode == KERNELS_FAST)
        x->ops->mxfp4_fast(&x->e->w2, r0, r1, ws->ah, ws->y, L);
    else
        x->ops->mxfp4_exact(&x->e->w2, r0, r1, ws->h, x->n, ws->y, L);
    for (size_t v = 0; v < x->n; v++)
        for (size_t r = r0; r < r1; r++)
            x->out[v * L + r] += x->weight[v] * ws->y[v * L + r];
}

static void expert_task(void *ctx, int tid, int nthreads)
{
    struct expert_run *x = ctx;
    size_t I = x->ws->I, L = x->ws->L, r0;

    unsigned spins = 0;

    (void)tid;
    (void)nthreads;
    while ((r0 = atomic_fetch_add_explicit(&x->next1, KERNELS_CHUNK_ROWS,
                                           memory_order_relaxed)) < I) {
        size_t r1 = r0 + KERNELS_CHUNK_ROWS < I ? r0 + KERNELS_CHUNK_ROWS : I;
        expert_up(x, r0, r1);
        atomic_fetch_add_explicit(&x->done1, r1 - r0, memory_order_release);
    }
    while (atomic_load_explicit(&x->done1, memory_order_acquire) < I)
        if (++spins > 1000)
            sched_yield();
    while ((r0 = atomic_fetch_add_explicit(&x->next2, KERNELS_CHUNK_ROWS,
                                           memory_order_relaxed)) < L)
        expert_down(x, r0, r0 + KERNELS_CHUNK_ROWS < L ? r0 + KERNELS_CHUNK_ROWS : L);
}

static int shape_ok(const kernels_mxfp4 *w, size_t rows, size_t cols)
{
    return w->rows == rows && w->cols == cols && w->packed && w->scale;
}

int kernels_expert_apply(kernels_expert_ws *ws, kernels_pool *pool,
                         const kernels_expert *e, const float *z, size_t n,
                         const float *weight, float *out, kernels_numerics mode,
                         shoal_err *err)
{
    struct expert_run run = { ws, pool, kernels_ops_get(), e, z, n, weight, out, mode, 0, 0, 0 };
    int rc;

    if (!shape_ok(&e->w1, ws->I, ws->L) || !shape_ok(&e->w3, ws->I, ws->L) ||
        !shape_ok(&e->w2, ws->L, ws->I))
        return shoal_err_set(err, SHOAL_EINVAL, "expert: shapes differ from the workspace's I=%zu L=%zu",
                             ws->I, ws->L);
    if (n == 0 || n > ws->nmax)
        return shoal_err_set(err, SHOAL_EINVAL, "expert: %zu vectors, workspace holds %zu", n, ws->nmax);
    if (mode == KERNELS_FAST) {
        rc = kernels_act_quantize(ws->az, z, ws->L, n, err);
        if (rc < 0)
            return rc;
        ws->ah->cols = ws->I;
        ws->ah->n = n;
    }
    kernels_pool_run_any(pool, expert_task, &run);
    return 0;
}
