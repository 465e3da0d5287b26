/* stats.c — request counters and sessions.
 *
 * Owns: counting hits, misses, joins, bytes and wait time per session,
 * model, layer and (layer, expert) and tier, in memory; flushing them and
 * the objects' access times to the index in one transaction when due (by
 * count or by time); the queries `shoal stats` needs.  Does not own when
 * to flush (the daemon's timer, commits and close call cache_flush).
 *
 * Each event adds to up to five rows of `counters`, told apart by which
 * key fields are set (0 / -1 = not set):
 *
 *   level     session  model  layer  expert
 *   total        0       0     -1     -1
 *   session      s       0     -1     -1
 *   model        0       m     -1     -1
 *   layer        0       m      l     -1
 *   expert       0       m      l      e
 *
 * so a total never double-counts.  Every level is kept per tier.
 */
#include "cache/cache_int.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/sys.h"

double cache_counts_hit_rate(const cache_counts *c)
{
    uint64_t n = c->hits + c->misses + c->joins;
    return n ? (double)c->hits / (double)n : 0.0;
}

struct count_eq { const cache *c; const ccount *k; };

static int count_key_eq(const void *ctx, uint32_t v)
{
    const struct count_eq *e = ctx;
    const ccount *a = &e->c->counts[v], *b = e->k;
    return a->session == b->session && a->model == b->model && a->layer == b->layer &&
           a->expert == b->expert && a->tier == b->tier;
}

static uint64_t count_hash(const ccount *k)
{
    uint64_t f[5] = { k->session, (uint64_t)k->model, (uint64_t)(uint32_t)k->layer,
                      (uint64_t)(uint32_t)k->expert, (uint64_t)(uint32_t)k->tier };
    return XXH3_64bits(f, sizeof f);
}

/* The row for this key, made if new; NULL when out of memory (the event is
 * then dropped from this row, with a warning: counting never fails a
 * request). */
static ccount *count_row(cache *c, uint64_t session, int64_t model, int32_t layer,
                         int32_t expert, int32_t tier)
{
    ccount k = { session, model, layer, expert, tier, { 0, 0, 0, 0, 0, 0 } };
    struct count_eq e = { c, &k };
    uint64_t h = count_hash(&k);
    uint32_t v = cmap_find(&c->by_count, h, count_key_eq, &e);

    if (v != CMAP_NONE)
        return &c->counts[v];
    if (c->ncounts == c->capcounts) {
        size_t ncap = c->capcounts ? c->capcounts * 2 : 64;
        ccount *n = realloc(c->counts, ncap * sizeof *n);
        if (!n)
            return NULL;
        c->counts = n;
        c->capcounts = ncap;
    }
    if (cmap_put(&c->by_count, h, (uint32_t)c->ncounts) != 0)
        return NULL;
    c->counts[c->ncounts] = k;
    return &c->counts[c->ncounts++];
}

static void counts_add(cache_counts *v, const cache_counts *n)
{
    v->hits += n->hits;
    v->misses += n->misses;
    v->joins += n->joins;
    v->bytes_in += n->bytes_in;
    v->bytes_out += n->bytes_out;
    v->wait_ns += n->wait_ns;
}

static void count_into(ccount *r, const cache_counts *n)
{
    if (!r) {
        LOG_WARN(CACHE_TAG, "out of memory: a counter event was dropped");
        return;
    }
    counts_add(&r->v, n);
}

void cache_stats_add_counts(cache *c, const cache_req *req, const cache_counts *n)
{
    int32_t tier;

    /* A read-only handle cannot flush, so it does not count. */
    if (!c || !req || !n || c->cfg.read_only)
        return;
    tier = (unsigned)req->tier < CACHE_TIER_COUNT_ ? (int32_t)req->tier : CACHE_TIER_DISK;
    counts_add(&c->since_open[tier], n);
    count_into(count_row(c, 0, 0, -1, -1, tier), n);
    if (req->session)
        count_into(count_row(c, req->session, 0, -1, -1, tier), n);
    if (req->model > 0)
        count_into(count_row(c, 0, req->model, -1, -1, tier), n);
    if (req->layer >= 0) {
        int64_t m = req->model > 0 ? req->model : 0;
        count_into(count_row(c, 0, m, req->layer, -1, tier), n);
        if (req->expert >= 0) {
            count_into(count_row(c, 0, m, req->layer, req->expert, tier), n);
            cache_heat_add(c, m, req->layer, req->expert, n->hits + n->misses + n->joins);
        }
    }
    c->pending_events++;
}

void cache_stats_add(cache *c, const cache_req *req, cache_outcome outcome,
                     uint64_t bytes_in, uint64_t bytes_out, uint64_t wait_ns)
{
    cache_counts n = { outcome == CACHE_HIT, outcome == CACHE_MISS, outcome == CACHE_JOIN,
                       bytes_in, bytes_out, wait_ns };
    cache_stats_add_counts(c, req, &n);
}

void cache_stats_since_open(const cache *c, int tier, cache_counts *out)
{
    memset(out, 0, sizeof *out);
    if (c && tier >= 0 && tier < CACHE_TIER_COUNT_)
        *out = c->since_open[tier];
}

/* Recency for the eviction policy; the index learns it at the next flush. */
void cache_stats_note_touch(cache *c, uint32_t idx)
{
    cobj *o = &c->objs[idx];

    o->last_access_ms = shoal_wall_ms();
    if (o->dirty)
        return;
    if (c->ndirty == c->capdirty) {
        size_t ncap = c->capdirty ? c->capdirty * 2 : 256;
        uint64_t *n = realloc(c->dirty, ncap * sizeof *n);
        if (!n)
            return;   /* the access time is still right in memory */
        c->dirty = n;
        c->capdirty = ncap;
    }
    o->dirty = 1;
    c->dirty[c->ndirty++] = o->id;
}

void cache_stats_note_access(cache *c, uint32_t idx)
{
    c->objs[idx].hits++;
    c->objs[idx].hits_pending++;
    cache_stats_note_touch(c, idx);
}

int cache_flush_due(const cache *c)
{
    if (c->cfg.read_only || (!c->pending_events && !c->ndirty))
        return 0;
    if (c->pending_events + c->ndirty >= (c->cfg.flush_events ? c->cfg.flush_events : 4096))
        return 1;
    return shoal_now_ns() - c->last_flush_ns >= (uint64_t)c->cfg.flush_ms * 1000000ull;
}

static int flush_rows(cache *c, shoal_err *err)
{
    sqlite3_stmt *s = c->st[ST_COUNT_UPSERT], *a = c->st[ST_OBJ_ACCESS];
    int r;

    for (size_t i = 0; i < c->ncounts; i++) {
        const ccount *k = &c->counts[i];
        sqlite3_bind_int64(s, 1, (int64_t)k->session);
        sqlite3_bind_int64(s, 2, k->model);
        sqlite3_bind_int(s, 3, k->layer);
        sqlite3_bind_int(s, 4, k->expert);
        sqlite3_bind_int(s, 5, k->tier);
        sqlite3_bind_int64(s, 6, (int64_t)k->v.hits);
        sqlite3_bind_int64(s, 7, (int64_t)k->v.misses);
        sqlite3_bind_int64(s, 8, (int64_t)k->v.joins);
        sqlite3_bind_int64(s, 9, (int64_t)k->v.bytes_in);
        sqlite3_bind_int64(s, 10, (int64_t)k->v.bytes_out);
        sqlite3_bind_int64(s, 11, (int64_t)k->v.wait_ns);
        r = sqlite3_step(s);
        sqlite3_reset(s);
        if (r != SQLITE_DONE)
            return cache_db_fail(c, r, "flush counters", err);
    }
    for (size_t i = 0; i < c->ndirty; i++) {
        uint32_t idx = cache_obj_by_id(c, c->dirty[i]);
        if (idx == CMAP_NONE)
            continue;   /* evicted since */
        sqlite3_bind_int64(a, 1, (int64_t)c->objs[idx].id);
        sqlite3_bind_int64(a, 2, c->objs[idx].last_access_ms);
        sqlite3_bind_int64(a, 3, (int64_t)c->objs[idx].hits_pending);
        r = sqlite3_step(a);
        sqlite3_reset(a);
        if (r != SQLITE_DONE)
            return cache_db_fail(c, r, "flush access times", err);
    }
    return 0;
}

int cache_flush(cache *c, shoal_err *err)
{
    int rc;

    if (c->cfg.read_only)
        return 0;
    if (!c->pending_events && !c->ndirty && !c->ncounts) {
        c->last_flush_ns = shoal_now_ns();
        return 0;
    }
    if ((rc = cache_db_begin(c, err)) != 0)
        return rc;
    rc = flush_rows(c, err);
    if (rc == 0)
        rc = cache_db_commit(c, err);
    else
        cache_db_rollback(c);
    if (rc)
        return rc;   /* everything stays in memory for the next try */
    for (size_t i = 0; i < c->ndirty; i++) {
        uint32_t idx = cache_obj_by_id(c, c->dirty[i]);
        if (idx != CMAP_NONE) {
            c->objs[idx].hits_pending = 0;
            c->objs[idx].dirty = 0;
        }
    }
    c->ndirty = 0;
    c->ncounts = 0;
    cmap_clear(&c->by_count);
    c->pending_events = 0;
    c->last_flush_ns = shoal_now_ns();
    return 0;
}

void cache_stats_free(cache *c)
{
    free(c->counts);
    c->counts = NULL;
    cmap_free(&c->by_count);
}

/* ---- sessions -------------------------------------------------------------- */

int cache_session_open(cache *c, int64_t pid, const char *program, uint64_t *session,
                       shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc;

    *session = 0;
    if (c->cfg.read_only)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only", c->dir);
    rc = sqlite3_prepare_v2(c->db, "INSERT INTO sessions(pid, program, started_ms, ended_ms)"
                            " VALUES(?1, ?2, ?3, 0)", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "open session", err);
    sqlite3_bind_int64(s, 1, pid);
    sqlite3_bind_text(s, 2, program ? program : "", -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, shoal_wall_ms());
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return cache_db_fail(c, rc, "open session", err);
    *session = (uint64_t)sqlite3_last_insert_rowid(c->db);
    return 0;
}

int cache_session_close(cache *c, uint64_t session, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc;

    if (c->cfg.read_only)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only", c->dir);
    rc = sqlite3_prepare_v2(c->db, "UPDATE sessions SET ended_ms=?2 WHERE id=?1", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "close session", err);
    sqlite3_bind_int64(s, 1, (int64_t)session);
    sqlite3_bind_int64(s, 2, shoal_wall_ms());
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return cache_db_fail(c, rc, "close session", err);
    if (sqlite3_changes(c->db) == 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "no session %llu", (unsigned long long)session);
    return 0;
}

/* ---- queries ------------------------------------------------------------------ */

#define COUNT_COLS "c.session, c.model, c.layer, c.expert, c.tier, c.hits, c.misses, c.joins," \
                   " c.bytes_in, c.bytes_out, c.wait_ns"

static const char *const level_sql[] = {
    [CACHE_STATS_TOTAL] = "SELECT " COUNT_COLS " FROM counters c WHERE c.session=0 AND c.model=0"
                          " AND c.layer=-1 AND c.expert=-1 AND ?1=?1 ORDER BY c.tier",
    [CACHE_STATS_SESSION] = "SELECT s.id, 0, -1, -1, coalesce(c.tier, 0), coalesce(c.hits, 0),"
                            " coalesce(c.misses, 0), coalesce(c.joins, 0), coalesce(c.bytes_in, 0),"
                            " coalesce(c.bytes_out, 0), coalesce(c.wait_ns, 0),"
                            " s.pid, s.program, s.started_ms, s.ended_ms"
                            " FROM sessions s LEFT JOIN counters c ON c.session=s.id AND ?1=?1"
                            " ORDER BY s.id, c.tier",
    [CACHE_STATS_MODEL] = "SELECT " COUNT_COLS " FROM counters c WHERE c.session=0 AND c.model>0"
                          " AND c.layer=-1 AND c.expert=-1 AND (?1=0 OR c.model=?1)"
                          " ORDER BY c.model, c.tier",
    [CACHE_STATS_LAYER] = "SELECT " COUNT_COLS " FROM counters c WHERE c.session=0 AND c.layer>=0"
                          " AND c.expert=-1 AND (?1=0 OR c.model=?1)"
                          " ORDER BY c.model, c.layer, c.tier",
    [CACHE_STATS_EXPERT] = "SELECT " COUNT_COLS " FROM counters c WHERE c.session=0 AND c.layer>=0"
                           " AND c.expert>=0 AND (?1=0 OR c.model=?1)"
                           " ORDER BY c.model, c.layer, c.expert, c.tier",
};

int cache_stats_query(cache *c, cache_stats_level level, int64_t model, cache_stats_fn fn,
                      void *ctx, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc, r = 0;

    if ((unsigned)level > CACHE_STATS_EXPERT)
        return shoal_err_set(err, SHOAL_EINVAL, "cache: unknown stats level %d", (int)level);
    if ((rc = cache_flush(c, err)) != 0)
        return rc;
    rc = sqlite3_prepare_v2(c->db, level_sql[level], -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "stats query", err);
    sqlite3_bind_int64(s, 1, model);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_stats_row row;
        memset(&row, 0, sizeof row);
        row.session = (uint64_t)sqlite3_column_int64(s, 0);
        row.model = sqlite3_column_int64(s, 1);
        row.layer = sqlite3_column_int(s, 2);
        row.expert = sqlite3_column_int(s, 3);
        row.tier = (cache_tier)sqlite3_column_int(s, 4);
        row.counts.hits = (uint64_t)sqlite3_column_int64(s, 5);
        row.counts.misses = (uint64_t)sqlite3_column_int64(s, 6);
        row.counts.joins = (uint64_t)sqlite3_column_int64(s, 7);
        row.counts.bytes_in = (uint64_t)sqlite3_column_int64(s, 8);
        row.counts.bytes_out = (uint64_t)sqlite3_column_int64(s, 9);
        row.counts.wait_ns = (uint64_t)sqlite3_column_int64(s, 10);
        if (level == CACHE_STATS_SESSION) {
            row.pid = sqlite3_column_int64(s, 11);
            row.program = (const char *)sqlite3_column_text(s, 12);
            row.started_ms = sqlite3_column_int64(s, 13);
            row.ended_ms = sqlite3_column_int64(s, 14);
        }
        if ((r = fn(&row, ctx)) != 0)
            break;
    }
    sqlite3_finalize(s);
    if (r)
        return r;
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "stats query", err);
}

struct total_ctx { int tier; cache_counts *out; };

static int add_total(const cache_stats_row *row, void *ctx)
{
    struct total_ctx *t = ctx;
    if (t->tier >= 0 && (int)row->tier != t->tier)
        return 0;
    t->out->hits += row->counts.hits;
    t->out->misses += row->counts.misses;
    t->out->joins += row->counts.joins;
    t->out->bytes_in += row->counts.bytes_in;
    t->out->bytes_out += row->counts.bytes_out;
    t->out->wait_ns += row->counts.wait_ns;
    return 0;
}

int cache_stats_total(cache *c, int tier, cache_counts *out, shoal_err *err)
{
    struct total_ctx t = { tier, out };
    memset(out, 0, sizeof *out);
    return cache_stats_query(c, CACHE_STATS_TOTAL, 0, add_total, &t, err);
}
