/* evict.c — which objects leave when the budget is full.
 *
 * Owns: the eviction policy (docs/cache-format.md, "Eviction"):
 *
 *   value(o) = last_access_s + W * ln(1 + hits)            W = 600 s
 *            - Wf * (bytes_of_layer(o) / fair_share - 1)     experts only
 *
 * Lowest value goes first.  The first term is recency, the second is
 * frequency (each e-fold of hits is worth ten minutes of recency), the
 * third is per-layer fairness: an expert of a layer that holds twice its
 * fair share of the cached expert bytes (the mean over layers) looks ten
 * minutes older, one that holds less looks younger, so no layer is emptied
 * to feed another.  Pinned objects are never candidates (invariant 5).
 * An eviction round frees a little more than asked (1 % of the budget, at
 * most 256 MiB) so that a full cache does not sort its candidates on every
 * commit.  Rejected: pure LRU (one scan of a model evicts everything hot)
 * and LFU (old favourites never leave).
 *
 * Also owns lifting the pin an object has by its kind (cache_pin_lift):
 * a BF16 spine matrix whose derived pack exists is no longer needed at
 * every engine start, so it joins the candidates, and leaves when space
 * is needed like any other.
 *
 * Does not own deleting (read.c: cache_objs_delete).
 */
#include "cache/cache_int.h"

#include <assert.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define EVICT_W_FREQ   600.0
#define EVICT_W_FAIR   600.0
#define EVICT_LAYERS   4096     /* layers past this share one fairness bucket */
#define EVICT_SLACK_MAX (256ull << 20)

typedef struct cand {
    double   value;
    uint64_t id;
    uint64_t len;
} cand;

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->value != y->value)
        return x->value < y->value ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int layer_bucket(int32_t layer)
{
    return layer >= 0 && layer < EVICT_LAYERS ? layer : EVICT_LAYERS;
}

/* Every unpinned object (but those marked in skip, indexed like c->objs;
 * may be NULL) with its value, into cs (c->nobjs rows).  *n: how many. */
static int evict_candidates(const cache *c, const uint8_t *skip, cand *cs, size_t *n,
                            shoal_err *err)
{
    uint64_t *layer_bytes = calloc(EVICT_LAYERS + 1, sizeof *layer_bytes), expert_bytes = 0;
    size_t nlayers = 0, ncand = 0;

    if (!layer_bytes)
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory choosing what to evict");
    for (size_t i = 0; i < c->nobjs; i++) {
        const cobj *o = &c->objs[i];
        if (o->kind != CACHE_KIND_EXPERT)
            continue;
        int b = layer_bucket(o->layer);
        nlayers += layer_bytes[b] == 0;
        layer_bytes[b] += o->len;
        expert_bytes += o->len;
    }
    double fair = nlayers ? (double)expert_bytes / (double)nlayers : 1.0;
    for (size_t i = 0; i < c->nobjs; i++) {
        const cobj *o = &c->objs[i];
        if (cache_obj_pinned(c, o) || (skip && skip[i]))
            continue;
        double v = (double)o->last_access_ms / 1000.0 + EVICT_W_FREQ * log1p((double)o->hits);
        if (o->kind == CACHE_KIND_EXPERT)
            v -= EVICT_W_FAIR * ((double)layer_bytes[layer_bucket(o->layer)] / fair - 1.0);
        cs[ncand++] = (cand){ v, o->id, o->len };
    }
    free(layer_bytes);
    qsort(cs, ncand, sizeof *cs, cand_cmp);
    *n = ncand;
    return 0;
}

int cache_evict_for(cache *c, uint64_t need, shoal_err *err)
{
    /* charged in disk blocks (used_disk), not bytes: a budget near the
     * disk's size must not run into ENOSPC through block rounding */
    uint64_t have = c->used_disk + c->reserved_disk, over, unpinned = 0, target, freed = 0;
    uint64_t freed_len = 0;
    size_t ncand = 0, nvict = 0;
    cand *cs = NULL;
    uint64_t *ids = NULL;
    int rc;

    need = cache_disk_len(c, need);
    if (need > c->budget)
        return shoal_err_set(err, SHOAL_ENOSPC, "cache budget is %" PRIu64 " bytes; an object of %"
                             PRIu64 " bytes cannot fit (raise the budget)", c->budget, need);
    if (have + need <= c->budget)
        return 0;
    over = have + need - c->budget;
    for (size_t i = 0; i < c->nobjs; i++)
        if (!cache_obj_pinned(c, &c->objs[i]))
            unpinned += cache_disk_len(c, c->objs[i].len);
    if (unpinned < over)
        return shoal_err_set(err, SHOAL_ENOSPC, "cache budget %" PRIu64 " bytes is full: %" PRIu64
                             " used, %" PRIu64 " being written; %" PRIu64 " bytes must be freed "
                             "for these %" PRIu64 ", only %" PRIu64 " are evictable (unpin objects "
                             "or raise the budget)",
                             c->budget, c->used, c->reserved, over, need, unpinned);
    target = over + (c->budget / 100 < EVICT_SLACK_MAX ? c->budget / 100 : EVICT_SLACK_MAX);
    if (target > unpinned)
        target = unpinned;

    cs = malloc((c->nobjs ? c->nobjs : 1) * sizeof *cs);
    ids = malloc((c->nobjs ? c->nobjs : 1) * sizeof *ids);
    if (!cs || !ids) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory choosing what to evict");
        goto out;
    }
    if ((rc = evict_candidates(c, NULL, cs, &ncand, err)) != 0)
        goto out;
    for (size_t i = 0; i < ncand && freed < target; i++) {
        /* Invariant 5: never a pinned object. */
        assert(!cache_obj_pinned(c, &c->objs[cache_obj_by_id(c, cs[i].id)]));
        ids[nvict++] = cs[i].id;
        freed += cache_disk_len(c, cs[i].len);
        freed_len += cs[i].len;
    }
    rc = cache_objs_delete(c, ids, nvict, err);
    if (rc == 0) {
        c->evicted += nvict;
        c->evicted_bytes += freed_len;
        LOG_DEBUG(CACHE_TAG, "evicted %zu objects, %" PRIu64 " bytes (needed %" PRIu64 ")",
                  nvict, freed_len, over);
        /* Invariant 4 (budget half): what is held plus what is asked fits. */
        if (c->used_disk + c->reserved_disk + need > c->budget) {
            LOG_ERROR(CACHE_TAG, "invariant 4 broken after eviction");
            rc = shoal_err_set(err, SHOAL_EINTERNAL, "cache: eviction freed too little");
        }
    }
out:
    free(cs);
    free(ids);
    return rc;
}

/* ---- plans ------------------------------------------------------------------------- */

/* What making room for `need` bytes would evict, never an object marked in
 * skip: the candidates in the policy's order until need is covered. */
static int plan_evictions(cache *c, const uint8_t *skip, uint64_t need, cache_plan *p,
                          shoal_err *err)
{
    cand *cs;
    size_t ncand = 0;
    uint64_t freed = 0;   /* in disk blocks, as need */
    int rc;

    if (need == 0)
        return 0;
    if (!(cs = malloc((c->nobjs ? c->nobjs : 1) * sizeof *cs)))
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory planning");
    rc = evict_candidates(c, skip, cs, &ncand, err);
    for (size_t i = 0; rc == 0 && i < ncand && freed < need; i++) {
        const cobj *o = &c->objs[cache_obj_by_id(c, cs[i].id)];
        freed += cache_disk_len(c, o->len);
        p->evict_objects++;
        p->evict_bytes += o->len;
        p->evict_kind[o->kind < CACHE_KIND_COUNT_ ? o->kind : CACHE_KIND_EXPERT] += o->len;
    }
    free(cs);
    return rc;
}

int cache_plan_make(cache *c, const cache_key *keys, const cache_kind *kinds, size_t n,
                    uint64_t held_back, int touch, cache_plan *p, uint8_t *fate, shoal_err *err)
{
    uint8_t *sel = NULL;
    uint64_t kept = 0;
    /* decisions are charged in disk blocks (cache_evict_for does); the
     * figures stay bytes */
    uint64_t pinned_d = 0, kept_d = 0, taken_d = 0, room_d;
    int rc = 0, full = 0;

    memset(p, 0, sizeof *p);
    if (c->cfg.read_only)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only: cannot plan", c->dir);
    if (!(sel = calloc(c->nobjs ? c->nobjs : 1, 1)))
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory planning");
    p->budget = c->budget;
    p->used = c->used;
    p->reserved = c->reserved;
    p->held_back = held_back;
    for (size_t i = 0; i < c->nobjs; i++)
        if (cache_obj_pinned(c, &c->objs[i])) {
            p->pinned += c->objs[i].len;
            pinned_d += cache_disk_len(c, c->objs[i].len);
        }
    /* The selection's cached objects stay (unpinned ones take room). */
    for (size_t i = 0; i < n; i++) {
        uint32_t k = cache_key_check(&keys[i], NULL) == 0 ? cache_obj_find(c, &keys[i]) : CMAP_NONE;
        p->objects++;
        p->bytes += keys[i].length;
        if (k == CMAP_NONE || sel[k]) {
            if (k != CMAP_NONE && fate)
                fate[i] = CACHE_PLAN_CACHED;   /* listed twice */
            continue;
        }
        sel[k] = 1;
        p->cached_objects++;
        p->cached_bytes += c->objs[k].len;
        if (!cache_obj_pinned(c, &c->objs[k])) {
            kept += c->objs[k].len;
            kept_d += cache_disk_len(c, c->objs[k].len);
        }
        if (touch)
            cache_stats_note_touch(c, k);
        if (fate)
            fate[i] = CACHE_PLAN_CACHED;
    }
    p->kept = kept;
    {
        uint64_t taken0 = pinned_d + p->reserved + held_back + kept_d;
        room_d = taken0 < p->budget ? p->budget - taken0 : 0;
        p->room = room_d;
    }
    /* New objects in the order given: the first that does not fit ends it. */
    for (size_t i = 0; i < n; i++) {
        uint32_t k = cache_key_check(&keys[i], NULL) == 0 ? cache_obj_find(c, &keys[i]) : CMAP_NONE;
        if (k != CMAP_NONE)
            continue;
        if (!full && taken_d + cache_disk_len(c, keys[i].length) <= room_d) {
            taken_d += cache_disk_len(c, keys[i].length);
            p->fetch_objects++;
            p->fetch_bytes += keys[i].length;
            if (fate)
                fate[i] = CACHE_PLAN_FETCH;
            continue;
        }
        full = 1;
        p->over_objects++;
        p->over_bytes += keys[i].length;
        if (cache_pin_effective(CACHE_PINNED_KIND, c->cfg.pin_kinds, kinds ? kinds[i]
                                                                           : CACHE_KIND_EXPERT))
            p->over_pinned++;
        if (fate)
            fate[i] = CACHE_PLAN_OVER;
    }
    {
        uint64_t have = c->used_disk + p->reserved + held_back + taken_d;
        rc = plan_evictions(c, sel, have > p->budget ? have - p->budget : 0, p, err);
    }
    free(sel);
    return rc;
}

/* ---- lifted kind pins ------------------------------------------------------------- */

#define PIN_COLLECTING 0xff

static int pin_store(cache *c, uint32_t idx, int v, shoal_err *err)
{
    sqlite3_stmt *s = c->st[ST_OBJ_PIN];
    int r;
    sqlite3_bind_int64(s, 1, (int64_t)c->objs[idx].id);
    sqlite3_bind_int(s, 2, v);
    r = sqlite3_step(s);
    sqlite3_reset(s);
    return r == SQLITE_DONE ? 0 : cache_db_fail(c, r, "lift pins", err);
}

/* Store v for the objects at these indexes in one transaction; memory
 * follows only after the commit. */
static int pins_set(cache *c, const uint32_t *idx, size_t n, int v, shoal_err *err)
{
    int rc;
    if (n == 0)
        return 0;
    if ((rc = cache_db_begin(c, err)) != 0)
        return rc;
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = pin_store(c, idx[i], v, err);
    if (rc == 0)
        rc = cache_db_commit(c, err);
    else
        cache_db_rollback(c);
    for (size_t i = 0; rc == 0 && i < n; i++)
        c->objs[idx[i]].pinned = (uint8_t)v;
    return rc;
}

int cache_pin_lift(cache *c, const cache_key *keys, size_t n, int lift, size_t *changed,
                   shoal_err *err)
{
    int from = lift ? CACHE_PINNED_KIND : CACHE_PINNED_LIFTED;
    uint32_t *idx;
    size_t m = 0;
    int rc;

    if (changed)
        *changed = 0;
    if (c->cfg.read_only)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only: cannot lift pins",
                             c->dir);
    if (!(idx = malloc((n ? n : 1) * sizeof *idx)))
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory lifting pins");
    for (size_t i = 0; i < n; i++) {
        uint32_t k = cache_key_check(&keys[i], NULL) == 0 ? cache_obj_find(c, &keys[i]) : CMAP_NONE;
        /* an explicit pin stays; a key listed twice is collected once (marked
         * until the loop ends) */
        if (k != CMAP_NONE && c->objs[k].pinned == from) {
            c->objs[k].pinned = PIN_COLLECTING;
            idx[m++] = k;
        }
    }
    for (size_t i = 0; i < m; i++)
        c->objs[idx[i]].pinned = (uint8_t)from;
    rc = pins_set(c, idx, m, lift ? CACHE_PINNED_LIFTED : CACHE_PINNED_KIND, err);
    if (rc == 0 && changed)
        *changed = m;
    free(idx);
    return rc;
}

int cache_pin_lift_clear(cache *c, size_t *changed, shoal_err *err)
{
    uint32_t *idx;
    size_t m = 0;
    int rc;

    if (changed)
        *changed = 0;
    if (c->cfg.read_only)
        return 0;
    if (!(idx = malloc((c->nobjs ? c->nobjs : 1) * sizeof *idx)))
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory restoring pins");
    for (size_t i = 0; i < c->nobjs; i++)
        if (c->objs[i].pinned == CACHE_PINNED_LIFTED)
            idx[m++] = (uint32_t)i;
    rc = pins_set(c, idx, m, CACHE_PINNED_KIND, err);
    if (rc == 0 && changed)
        *changed = m;
    free(idx);
    return rc;
}
