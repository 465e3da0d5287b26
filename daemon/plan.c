/* plan.c — a warm selection turned into objects and planned against the
 * budget before anything is fetched (docs/daemon.md, "Warm jobs").
 *
 * Owns: a selection's objects (fetcher's fetch_select; "top N" from the
 * cache's heat table), leaving out the BF16 matrices a cached spine pack
 * replaces, their priority (small files and spine first, then experts
 * hottest first), the objects the Hugging Face cache holds (read in
 * place: counted apart, never fetched, so never planned against the
 * budget), the cache's plan (cache_plan_make), the decision —
 * start, trim to what fits (--fit) or refuse, saying what to do — and the
 * plan as JSON ("shoal.warm.plan", docs/stats-json.md).  Never "fetch
 * everything and keep what fits": a job whose selection does not fit
 * does not start, or starts trimmed.  Does not own jobs (warm.c).
 *
 * Cost at K3 size (82,432 experts) on the loop: ranking 3.6 ms (radix
 * sort, cache/heat.c), one in-memory lookup per object, fetch_select's
 * sort, one HF cache look-up per file (~100), and an eviction ranking
 * only when something must be evicted.
 */
#include "daemon/daemon_int.h"
#include "common/json.h"
#include "common/log.h"
#include "fetcher/fetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sel_names[] = { "all", "spine", "layers", "top", "list" };

void plan_free(warm_sel *s)
{
    free(s->items);
    free(s->pairs);
    memset(s, 0, sizeof *s);
}

/* Selection 3: the n hottest experts the manifest has, hottest first. */
static int top_pairs(shoald *d, const model *m, uint32_t n, warm_sel *s, shoal_err *err)
{
    cache_heat *h = NULL;
    size_t nh = 0, k = 0;
    int rc = cache_heat_top(d->cache, m->model_id, 0, &h, &nh, err);

    if (rc)
        return rc;
    s->pairs = calloc(2 * (n < nh ? n : nh) + 2, sizeof *s->pairs);
    if (!s->pairs) {
        free(h);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < nh && k < n; i++) {
        if (!manifest_expert_find(m->man, (uint32_t)h[i].layer, (uint32_t)h[i].expert))
            continue;
        s->pairs[2 * k] = h[i].layer;
        s->pairs[2 * k + 1] = h[i].expert;
        k++;
    }
    s->npairs = k;
    free(h);
    return 0;
}

/* The selection's objects in file order (fetch_select), minus the spine
 * matrices a cached spine pack replaces (unless keep-spine). */
static int select_items(shoald *d, const model *m, int selection, uint32_t a, uint32_t b,
                        const int32_t *pairs, size_t npairs, warm_sel *s, shoal_err *err)
{
    fetch_selection sel = { 0, 0, 0, -1, -1, NULL, 0 };
    fetch_item *it = NULL;
    size_t n = 0;
    int rc, drop_replaced;

    switch (selection) {
    case 0: sel.spine = sel.small = sel.all_experts = 1; break;
    case 1: sel.spine = sel.small = 1; break;
    case 2:
        if (a > b)
            return shoal_err_set(err, SHOAL_EINVAL, "layers %u..%u: the first is after the last",
                                 a, b);
        sel.layer_first = (int32_t)a;
        sel.layer_last = (int32_t)b;
        break;
    case 3:
        if ((rc = top_pairs(d, m, a, s, err)) != 0)
            return rc;
        sel.pairs = s->pairs;
        sel.npairs = s->npairs;
        break;
    default:
        sel.pairs = pairs;
        sel.npairs = npairs;
    }
    if ((rc = fetch_select(m->man, &sel, &it, &n, err)) != 0)
        return rc;
    s->items = calloc(n ? n : 1, sizeof *s->items);
    if (!s->items) {
        free(it);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    drop_replaced = sel.spine && !d->cfg.keep_spine && derived_spine_pack_cached(d, m);
    for (size_t i = 0; i < n; i++) {
        const manifest_tensor *t = it[i].tensor ? manifest_tensor_find(m->man, it[i].tensor) : NULL;
        if (drop_replaced && t && derived_replaces(t)) {
            s->left_objects++;
            s->left_bytes += it[i].length;
            continue;
        }
        objref *o = &s->items[s->n++];
        o->key.etag = m->man->files[it[i].file].etag;
        o->key.offset = it[i].offset;
        o->key.length = it[i].length;
        o->kind = it[i].kind;
        o->file = it[i].file;
        o->layer = it[i].layer;
        o->expert = it[i].expert;
        o->tensor = it[i].tensor;
    }
    free(it);
    return 0;
}

/* Priority order, as indexes into s->items: small files and spine first
 * (file order), then experts hottest first (the heat table), then the
 * experts never asked for (file order).  O(n + experts counted). */
static int rank_items(shoald *d, const model *m, const warm_sel *s, size_t *order,
                      shoal_err *err)
{
    const manifest *man = m->man;
    int64_t *item_of = malloc((man->nexperts ? man->nexperts : 1) * sizeof *item_of);
    uint8_t *placed = calloc(s->n ? s->n : 1, 1);
    cache_heat *h = NULL;
    size_t nh = 0, k = 0;
    int rc = 0;

    if (!item_of || !placed) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < man->nexperts; i++)
        item_of[i] = -1;
    for (size_t i = 0; i < s->n; i++) {
        const objref *o = &s->items[i];
        if (o->kind != CACHE_KIND_EXPERT) {
            order[k++] = i;
            placed[i] = 1;
            continue;
        }
        const manifest_expert *e = manifest_expert_find(man, (uint32_t)o->layer, (uint32_t)o->expert);
        if (e)
            item_of[e - man->experts] = (int64_t)i;
    }
    if ((rc = cache_heat_top(d->cache, m->model_id, 0, &h, &nh, err)) != 0)
        goto out;
    for (size_t i = 0; i < nh; i++) {
        const manifest_expert *e = manifest_expert_find(man, (uint32_t)h[i].layer,
                                                        (uint32_t)h[i].expert);
        int64_t it = e ? item_of[e - man->experts] : -1;
        if (it >= 0 && !placed[it]) {
            order[k++] = (size_t)it;
            placed[it] = 1;
        }
    }
    for (size_t i = 0; i < s->n; i++)
        if (!placed[i])
            order[k++] = i;
out:
    free(h);
    free(item_of);
    free(placed);
    return rc;
}

/* Drop the items the plan could not fit (fate[i]: of item order[i], for
 * the n planned; the others, read in place, stay). */
static void trim(warm_sel *s, const size_t *order, const uint8_t *fate, size_t n)
{
    uint8_t *keep = malloc(s->n ? s->n : 1);
    size_t w = 0;
    if (!keep)
        return;   /* then the job fetches what fits and the cache evicts: logged */
    memset(keep, 1, s->n);
    for (size_t i = 0; i < n; i++)
        keep[order[i]] = fate[i] != CACHE_PLAN_OVER;
    for (size_t i = 0; i < s->n; i++)
        if (keep[i])
            s->items[w++] = s->items[i];
    s->n = w;
    s->trimmed = 1;
    free(keep);
}

static void decide(const model *m, int fit, warm_sel *s)
{
    const cache_plan *p = &s->plan;
    char a[32], b[32], c[32], e[32], f[32], g[32], held[64] = "";

    if (p->over_objects == 0)
        return;
    if (p->over_pinned) {
        /* The spine (and small files) are never trimmed: an engine needs
         * all of it. */
        uint64_t least = p->pinned + p->reserved + p->held_back + s->pinned_need;
        s->refused = 1;
        snprintf(s->why, sizeof s->why, "the budget %s is smaller than what %.160s needs pinned: "
                 "%s of spine and small files to fetch, beside %s pinned already%s; raise "
                 "--max-size to at least %s (shoald keeps it in shoald.conf)",
                 shoal_size_format(p->budget, a, sizeof a), m->spec,
                 shoal_size_format(s->pinned_need, b, sizeof b),
                 shoal_size_format(p->pinned, c, sizeof c),
                 p->held_back ? " and what other warm jobs still fetch" : "",
                 shoal_size_format(least, e, sizeof e));
        return;
    }
    if (fit)
        return;
    if (p->held_back)
        snprintf(held, sizeof held, " - %s other jobs still fetch",
                 shoal_size_format(p->held_back, g, sizeof g));
    s->refused = 1;
    snprintf(s->why, sizeof s->why, "the selection does not fit the budget: %llu objects (%s) "
             "to fetch, room for %llu (%s = budget %s - %s pinned - %s of it cached%s); nothing "
             "started.  Pass --fit to warm the ones that fit (hottest first), choose fewer "
             "experts (--experts top:N), or raise --max-size",
             (unsigned long long)(p->fetch_objects + p->over_objects),
             shoal_size_format(p->fetch_bytes + p->over_bytes, a, sizeof a),
             (unsigned long long)p->fetch_objects, shoal_size_format(p->room, b, sizeof b),
             shoal_size_format(p->budget, c, sizeof c), shoal_size_format(p->pinned, e, sizeof e),
             shoal_size_format(p->kept, f, sizeof f), held);
}

/* Move the items whose file the HF cache holds (verified, read in place)
 * to the front, each group in file order; count them.  0 or ENOMEM. */
static int peer_first(const model *m, warm_sel *s, shoal_err *err)
{
    uint8_t *fpeer = calloc(m->man->nfiles ? m->man->nfiles : 1, 1);
    objref *tmp = malloc((s->n ? s->n : 1) * sizeof *tmp);
    size_t k = 0;

    if (!fpeer || !tmp) {
        free(fpeer);
        free(tmp);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    for (size_t f = 0; f < m->man->nfiles; f++) {
        objref o = { .file = (uint32_t)f };
        fpeer[f] = (uint8_t)peer_has(m, &o);
    }
    for (int pass = 1; pass >= 0; pass--)
        for (size_t i = 0; i < s->n; i++)
            if (fpeer[s->items[i].file] == pass)
                tmp[k++] = s->items[i];
    for (size_t i = 0; i < s->n; i++)
        if (fpeer[s->items[i].file]) {
            s->peer_objects++;
            s->peer_bytes += s->items[i].key.length;
        }
    memcpy(s->items, tmp, s->n * sizeof *tmp);
    free(tmp);
    free(fpeer);
    return 0;
}

int plan_select(shoald *d, model *m, int selection, uint32_t a, uint32_t b, const int32_t *pairs,
                size_t npairs, int fit, int touch, uint64_t held_back, warm_sel *s,
                shoal_err *err)
{
    cache_key *keys = NULL;
    cache_kind *kinds = NULL;
    size_t *order = NULL;
    uint8_t *fate = NULL;
    size_t np = 0;
    int rc;

    memset(s, 0, sizeof *s);
    if ((rc = select_items(d, m, selection, a, b, pairs, npairs, s, err)) != 0
        || (rc = peer_first(m, s, err)) != 0)
        goto fail;
    keys = malloc((s->n ? s->n : 1) * sizeof *keys);
    kinds = malloc((s->n ? s->n : 1) * sizeof *kinds);
    order = malloc((s->n ? s->n : 1) * sizeof *order);
    fate = malloc(s->n ? s->n : 1);
    if (!keys || !kinds || !order || !fate) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = rank_items(d, m, s, order, err)) != 0)
        goto fail;
    /* the plan: in priority order, without what is read in place (the
     * first peer_objects items) */
    for (size_t i = 0; i < s->n; i++) {
        if (order[i] < s->peer_objects)
            continue;
        order[np] = order[i];
        keys[np] = s->items[order[i]].key;
        kinds[np] = s->items[order[i]].kind;
        np++;
    }
    if ((rc = cache_plan_make(d->cache, keys, kinds, np, held_back, touch, &s->plan, fate,
                              err)) != 0)
        goto fail;
    for (size_t i = 0; i < np; i++)
        if (fate[i] != CACHE_PLAN_CACHED && kinds[i] != CACHE_KIND_EXPERT)
            s->pinned_need += keys[i].length;
    decide(m, fit, s);
    if (!s->refused && s->plan.over_objects)
        trim(s, order, fate, np);
    free(keys);
    free(kinds);
    free(order);
    free(fate);
    return 0;
fail:
    free(keys);
    free(kinds);
    free(order);
    free(fate);
    plan_free(s);
    return rc;
}

/* ---- the plan as JSON ------------------------------------------------------------- */

static shoal_json *pair_json(uint64_t objects, uint64_t bytes)
{
    shoal_json *o = shoal_json_object();
    shoal_json_set_int(o, "objects", (int64_t)objects);
    shoal_json_set_int(o, "bytes", (int64_t)bytes);
    return o;
}

void *plan_json(const warm_sel *s, const model *m, int selection, uint32_t a, uint32_t b, int fit)
{
    const cache_plan *p = &s->plan;
    static const char *const kinds[CACHE_KIND_COUNT_] = { "expert", "spine", "small", "derived" };
    shoal_json *o = shoal_json_object(), *sel = shoal_json_object(), *ev, *bk, *bud;

    if (!o || !sel) {
        shoal_json_free(o);
        shoal_json_free(sel);
        return NULL;
    }
    shoal_json_set_str(o, "schema", "shoal.warm.plan");
    shoal_json_set_int(o, "version", 1);
    shoal_json_set_str(o, "model", m->spec);
    shoal_json_set_str(o, "commit", m->man->commit);
    shoal_json_set_str(o, "upstream", upstream_state_name(m));
    shoal_json_set_str(sel, "kind", sel_names[selection >= 0 && selection <= 4 ? selection : 0]);
    if (selection == 2) {
        shoal_json_set_int(sel, "first", a);
        shoal_json_set_int(sel, "last", b);
    } else if (selection == 3) {
        shoal_json_set_int(sel, "n", a);
    }
    shoal_json_set_take(sel, "fit", shoal_json_new_bool(fit));
    shoal_json_set_take(o, "selection", sel);
    shoal_json_set_take(o, "selected", pair_json(p->objects + s->peer_objects,
                                                 p->bytes + s->peer_bytes));
    shoal_json_set_take(o, "hfcache", pair_json(s->peer_objects, s->peer_bytes));
    shoal_json_set_take(o, "cached", pair_json(p->cached_objects, p->cached_bytes));
    shoal_json_set_take(o, "fetch", pair_json(p->fetch_objects, p->fetch_bytes));
    shoal_json_set_take(o, "not_fitting", pair_json(p->over_objects, p->over_bytes));
    shoal_json_set_take(o, "left_out", pair_json(s->left_objects, s->left_bytes));
    ev = pair_json(p->evict_objects, p->evict_bytes);
    bk = shoal_json_object();
    for (int k = 0; k < CACHE_KIND_COUNT_; k++)
        shoal_json_set_int(bk, kinds[k], (int64_t)p->evict_kind[k]);
    shoal_json_set_take(ev, "bytes_by_kind", bk);
    shoal_json_set_take(o, "evict", ev);
    bud = shoal_json_object();
    shoal_json_set_int(bud, "budget", (int64_t)p->budget);
    shoal_json_set_int(bud, "used", (int64_t)p->used);
    shoal_json_set_int(bud, "pinned", (int64_t)p->pinned);
    shoal_json_set_int(bud, "reserved", (int64_t)p->reserved);
    shoal_json_set_int(bud, "held_back", (int64_t)p->held_back);
    shoal_json_set_int(bud, "room", (int64_t)p->room);
    shoal_json_set_take(o, "budget", bud);
    shoal_json_set_str(o, "action", s->refused ? "refuse" : p->over_objects ? "trim" : "start");
    shoal_json_set_str(o, "message", s->why);
    return o;
}
