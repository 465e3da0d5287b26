/* heat.c — how often each routed expert was asked for, without SQLite.
 *
 * Owns: a table in the writer's memory of requests (hits + misses + joins,
 * both tiers, since the index began) per (model, layer, expert): loaded
 * from the counters once at open, added to by every counted event
 * (stats.c), reloaded when counters are deleted (rm).  `warm --experts
 * top:N` and `warm --fit` rank a model's experts by it: K3's 82,432
 * experts took ~37 ms as an SQLite query of the counters on the daemon's
 * loop; from this table they take a few ms (docs/cache-format.md,
 * "Heat").  A read-only handle has no table and asks SQLite.
 *
 * Memory: one 24-byte row per expert ever counted (K3: 2 MB) and its hash
 * index.  Does not own the counters themselves (stats.c).
 */
#include "cache/cache_int.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/log.h"

struct heat_eq { const cache *c; int64_t model; int32_t layer, expert; };

static uint64_t heat_hash(int64_t model, int32_t layer, int32_t expert)
{
    uint64_t f[2] = { (uint64_t)model, (uint64_t)(uint32_t)layer << 32 | (uint32_t)expert };
    return XXH3_64bits(f, sizeof f);
}

static int heat_key_eq(const void *ctx, uint32_t v)
{
    const struct heat_eq *e = ctx;
    const cheat *h = &e->c->heat[v];
    return h->model == e->model && h->layer == e->layer && h->expert == e->expert;
}

void cache_heat_add(cache *c, int64_t model, int32_t layer, int32_t expert, uint64_t n)
{
    struct heat_eq e = { c, model, layer, expert };
    uint64_t h;
    uint32_t v;

    if (!c->heat_ready || layer < 0 || expert < 0 || n == 0)
        return;
    h = heat_hash(model, layer, expert);
    v = cmap_find(&c->by_heat, h, heat_key_eq, &e);
    if (v != CMAP_NONE) {
        c->heat[v].requests += n;
        return;
    }
    if (c->nheat == c->capheat) {
        size_t ncap = c->capheat ? c->capheat * 2 : 1024;
        cheat *p = realloc(c->heat, ncap * sizeof *p);
        if (!p)
            goto lost;
        c->heat = p;
        c->capheat = ncap;
    }
    if (cmap_put(&c->by_heat, h, (uint32_t)c->nheat) != 0)
        goto lost;
    c->heat[c->nheat++] = (cheat){ model, layer, expert, n };
    return;
lost:
    /* Out of memory: rank from SQLite from now on rather than wrongly. */
    LOG_WARN(CACHE_TAG, "out of memory for the expert heat table: ranking asks the index");
    cache_heat_free(c);
}

void cache_heat_free(cache *c)
{
    free(c->heat);
    c->heat = NULL;
    c->nheat = c->capheat = 0;
    cmap_free(&c->by_heat);
    c->heat_ready = 0;
}

/* Rows of `model` (0: every model) from the flushed counters into fn. */
static int heat_query(cache *c, int64_t model, void (*fn)(void *, const cheat *), void *ctx,
                      shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT model, layer, expert, sum(hits + misses + joins)"
                                " FROM counters WHERE session = 0 AND layer >= 0 AND expert >= 0"
                                " AND (?1 = 0 OR model = ?1) GROUP BY model, layer, expert",
                                -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "expert heat", err);
    sqlite3_bind_int64(s, 1, model);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cheat h = { sqlite3_column_int64(s, 0), sqlite3_column_int(s, 1), sqlite3_column_int(s, 2),
                    (uint64_t)sqlite3_column_int64(s, 3) };
        fn(ctx, &h);
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "expert heat", err);
}

static void heat_load_row(void *ctx, const cheat *h)
{
    cache_heat_add(ctx, h->model, h->layer, h->expert, h->requests);
}

int cache_heat_load(cache *c, shoal_err *err)
{
    int rc;
    cache_heat_free(c);
    if (c->cfg.read_only)
        return 0;
    c->heat_ready = 1;
    rc = heat_query(c, 0, heat_load_row, c, err);
    if (rc)
        cache_heat_free(c);
    return rc;
}

/* ---- ranking ----------------------------------------------------------------------- */

/* Sort by requests, most first, ties by (layer, expert): an LSD radix sort
 * (stable, one pass per byte that varies: the tie key first, then the
 * complement of the requests) — K3's 82,432 rows in ~2 ms where qsort()
 * with a comparator took 15 ms.  tmp holds n rows. */
static inline uint64_t heat_key(const cache_heat *h, int k)
{
    return k == 0 ? (uint64_t)(uint32_t)h->layer << 32 | (uint32_t)h->expert : ~h->requests;
}

static void heat_sort(cache_heat *v, cache_heat *tmp, size_t n)
{
    cache_heat *src = v, *dst = tmp;

    for (int k = 0; k < 2; k++) {
        size_t count[8][257];     /* 16 KiB of stack */
        memset(count, 0, sizeof count);
        for (size_t i = 0; i < n; i++) {   /* every byte's histogram in one pass */
            uint64_t key = heat_key(&src[i], k);
            for (int b = 0; b < 8; b++)
                count[b][(key >> (8 * b) & 0xff) + 1]++;
        }
        for (int b = 0; b < 8; b++) {
            size_t *c = count[b];
            if (c[(heat_key(&src[0], k) >> (8 * b) & 0xff) + 1] == n)
                continue;   /* one digit for all: this pass changes nothing */
            for (int d = 0; d < 256; d++)
                c[d + 1] += c[d];
            for (size_t i = 0; i < n; i++)
                dst[c[heat_key(&src[i], k) >> (8 * b) & 0xff]++] = src[i];
            cache_heat *t = src;
            src = dst;
            dst = t;
        }
    }
    if (src != v)
        memcpy(v, src, n * sizeof *v);
}

typedef struct heat_vec { cache_heat *v; size_t n, cap; int64_t model; int rc; } heat_vec;

static void heat_push(void *ctx, const cheat *h)
{
    heat_vec *hv = ctx;
    if (hv->rc || (hv->model && h->model != hv->model) || h->requests == 0)
        return;
    if (hv->n == hv->cap) {
        size_t ncap = hv->cap ? hv->cap * 2 : 1024;
        cache_heat *p = realloc(hv->v, ncap * sizeof *p);
        if (!p) {
            hv->rc = SHOAL_ENOMEM;
            return;
        }
        hv->v = p;
        hv->cap = ncap;
    }
    hv->v[hv->n++] = (cache_heat){ h->layer, h->expert, h->requests };
}

int cache_heat_top(cache *c, int64_t model, size_t max, cache_heat **out, size_t *n,
                   shoal_err *err)
{
    heat_vec hv = { NULL, 0, 0, model, 0 };
    int rc = 0;

    *out = NULL;
    *n = 0;
    if (c->heat_ready) {
        for (size_t i = 0; i < c->nheat; i++)
            heat_push(&hv, &c->heat[i]);
    } else {
        rc = heat_query(c, model, heat_push, &hv, err);
    }
    if (rc == 0 && hv.rc)
        rc = shoal_err_set(err, hv.rc, "cache: out of memory ranking experts");
    if (rc) {
        free(hv.v);
        return rc;
    }
    if (hv.n) {
        cache_heat *tmp = malloc(hv.n * sizeof *tmp);
        if (!tmp) {
            free(hv.v);
            return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory ranking experts");
        }
        heat_sort(hv.v, tmp, hv.n);
        free(tmp);
    }
    if (max && max < hv.n)
        hv.n = max;
    *out = hv.v;
    *n = hv.n;
    return 0;
}
