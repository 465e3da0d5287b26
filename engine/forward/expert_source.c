/* expert_source.c — the expert-source wrapper (stats, timing) and the
 * local-directory implementation (see forward.h part 4).  Does not own any
 * network or daemon code. */
#include "engine/forward/forward.h"

#include <stdlib.h>

#include "common/sys.h"

struct expert_source {
    expert_source_ops ops;
    expert_source_more_ops more;
    void *impl;
    expert_source_stats stats;
};

const char *expert_tier_name(expert_tier t)
{
    static const char *names[EXPERT_TIER_COUNT] = { "ram", "local", "disk", "network" };
    return (unsigned)t < EXPERT_TIER_COUNT ? names[t] : "?";
}

expert_source *expert_source_new(const expert_source_ops *ops, void *impl)
{
    return expert_source_new_more(ops, NULL, impl);
}

expert_source *expert_source_new_more(const expert_source_ops *ops,
                                      const expert_source_more_ops *more, void *impl)
{
    expert_source *s = calloc(1, sizeof *s);
    if (!s) {
        if (ops->free)
            ops->free(impl);
        return NULL;
    }
    s->ops = *ops;
    if (more)
        s->more = *more;
    s->impl = impl;
    return s;
}

void expert_source_free(expert_source *src)
{
    if (!src)
        return;
    if (src->ops.free)
        src->ops.free(src->impl);
    free(src);
}

/* Wraps the caller's callback to count deliveries and time spent in it. */
typedef struct fetch_ctx {
    expert_source *src;
    expert_ready_fn fn;
    void *ctx;
    uint64_t in_cb_ns;
} fetch_ctx;

static int counting_cb(void *ctx, int layer, int32_t expert, const uint8_t *span, size_t bytes,
                       expert_tier tier, int status, const shoal_err *detail)
{
    fetch_ctx *f = ctx;
    uint64_t t0 = shoal_now_ns();
    int rc;

    if (status == 0) {
        f->src->stats.experts++;
        f->src->stats.bytes += bytes;
        if ((unsigned)tier < EXPERT_TIER_COUNT)
            f->src->stats.hits[tier]++;
    }
    rc = f->fn(f->ctx, layer, expert, span, bytes, tier, status, detail);
    f->in_cb_ns += shoal_now_ns() - t0;
    return rc;
}

int expert_source_fetch(expert_source *src, int layer, const int32_t *ids, size_t n,
                        expert_ready_fn fn, void *ctx, shoal_err *err)
{
    fetch_ctx f = { src, fn, ctx, 0 };
    uint64_t t0 = shoal_now_ns(), total;
    int rc;

    if (n == 0)
        return 0;
    rc = src->ops.fetch(src->impl, layer, ids, n, counting_cb, &f, err);
    total = shoal_now_ns() - t0;
    src->stats.wait_ns += total > f.in_cb_ns ? total - f.in_cb_ns : 0;
    return rc;
}

void expert_source_stats_get(const expert_source *src, expert_source_stats *out)
{
    *out = src->stats;
    if (src->more.stats)
        src->more.stats(src->impl, out);
}

int expert_source_request(expert_source *src, int layer, const int32_t *ids, size_t n,
                          int prefetch, shoal_err *err)
{
    if (!src->more.request || n == 0)
        return 0;
    return src->more.request(src->impl, layer, ids, n, prefetch, err);
}

void expert_source_order(expert_source *src, int layer, int32_t *ids, size_t n)
{
    if (src->more.order && n > 1)
        src->more.order(src->impl, layer, ids, n);
}

/* ---- local directory ------------------------------------------------------- */

static int local_fetch(void *impl, int layer, const int32_t *ids, size_t n,
                       expert_ready_fn fn, void *ctx, shoal_err *err)
{
    const engine_model *m = impl;
    const engine_layer_w *lw;

    if (layer < 0 || layer >= m->cfg.n_layers || !m->layers[layer].info.moe)
        return shoal_err_set(err, SHOAL_EINVAL, "layer %d is not a MoE layer", layer);
    lw = &m->layers[layer];
    for (size_t i = 0; i < n; i++) {
        int rc;
        if (ids[i] < 0 || ids[i] >= m->cfg.n_experts)
            return shoal_err_set(err, SHOAL_ERANGE, "layer %d: no expert %d", layer, (int)ids[i]);
        rc = fn(ctx, layer, ids[i], lw->moe.span[ids[i]], (size_t)m->cfg.expert_bytes,
                EXPERT_TIER_LOCAL, 0, NULL);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* File order of a mapped model: a span's address.  Each shard is one
 * mapping, so within a shard addresses ascend with the offset; shards
 * follow each other in the order the kernel placed their mappings, and a
 * layer's experts sit in one shard (or a few). */
static int span_cmp(const void *a, const void *b, void *arg)
{
    const uint8_t *const *span = arg;
    uintptr_t x = (uintptr_t)span[*(const int32_t *)a], y = (uintptr_t)span[*(const int32_t *)b];
    return x < y ? -1 : x > y;
}

static void local_order(void *impl, int layer, int32_t *ids, size_t n)
{
    const engine_model *m = impl;

    if (layer < 0 || layer >= m->cfg.n_layers || !m->layers[layer].info.moe ||
        !m->layers[layer].moe.span)
        return;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.n_experts)
            return;                    /* local_fetch names the bad id */
    qsort_r(ids, n, sizeof *ids, span_cmp, (void *)m->layers[layer].moe.span);
}

expert_source *expert_source_local_new(const engine_model *m)
{
    static const expert_source_ops ops = { local_fetch, NULL };
    static const expert_source_more_ops more = { NULL, NULL, local_order };
    return expert_source_new_more(&ops, &more, (void *)m);
}
