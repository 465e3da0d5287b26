/* report.c — the stats and models reports `shoal stats` / `shoal ls` show,
 * built from the index so that the daemon (STATS over the socket) and the
 * CLI (reading the index when no daemon runs) print the same figures.
 *
 * Owns: listing and matching models, the "shoal.stats" and "shoal.models"
 * JSON documents (docs/stats-json.md), reading a model's cached manifest
 * for coverage.  Does not own the counters themselves (stats.c), nor any
 * wording for people (the CLI formats the JSON).
 *
 * Why JSON and not a struct: the report crosses the socket as text anyway,
 * and one builder behind one schema is what keeps the live and the
 * read-only paths from drifting apart.
 */
#include "cache/cache_int.h"
#include "cache/report_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/json.h"
#include "common/manifest.h"
#include "common/sys.h"

/* ---- models -------------------------------------------------------------------- */

int cache_models_list(cache *c, cache_model_fn fn, void *ctx, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc, r = 0;

    rc = sqlite3_prepare_v2(c->db, "SELECT id, endpoint, repo, revision, commit_id, resolved_ms"
                            " FROM models ORDER BY id", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "list models", err);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_model m;
        memset(&m, 0, sizeof m);
        m.id = sqlite3_column_int64(s, 0);
        snprintf(m.endpoint, sizeof m.endpoint, "%s", (const char *)sqlite3_column_text(s, 1));
        snprintf(m.repo, sizeof m.repo, "%s", (const char *)sqlite3_column_text(s, 2));
        snprintf(m.revision, sizeof m.revision, "%s", (const char *)sqlite3_column_text(s, 3));
        snprintf(m.commit, sizeof m.commit, "%s", (const char *)sqlite3_column_text(s, 4));
        m.resolved_ms = sqlite3_column_int64(s, 5);
        if ((r = fn(&m, ctx)) != 0)
            break;
    }
    sqlite3_finalize(s);
    if (r)
        return r;
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "list models", err);
}

int cache_model_matches(const cache_model *m, const char *spec)
{
    const char *at;
    size_t n;

    if (!spec || !*spec)
        return 1;
    if (strncmp(spec, "hf://", 5) == 0)
        spec += 5;
    else if (strncmp(spec, "file://", 7) == 0)
        spec += 7;
    if (spec[0] == '/') {
        /* A directory: its path is the repo; trailing slashes do not count. */
        n = strlen(spec);
        while (n > 1 && spec[n - 1] == '/')
            n--;
        return strlen(m->repo) == n && strncmp(m->repo, spec, n) == 0;
    }
    at = strchr(spec, '@');
    n = at ? (size_t)(at - spec) : strlen(spec);
    if (strlen(m->repo) != n || strncmp(m->repo, spec, n) != 0)
        return 0;
    /* A revision may be asked by its name or by the commit it resolved to. */
    return !at || strcmp(m->revision, at + 1) == 0 || strcmp(m->commit, at + 1) == 0;
}

static int collect_model(const cache_model *m, void *ctx)
{
    report_models *ms = ctx;
    if (!cache_model_matches(m, ms->spec))
        return 0;
    if (ms->n == ms->cap) {
        size_t cap = ms->cap ? ms->cap * 2 : 8;
        cache_model *p = realloc(ms->v, cap * sizeof *p);
        if (!p)
            return SHOAL_ENOMEM;
        ms->v = p;
        ms->cap = cap;
    }
    ms->v[ms->n++] = *m;
    return 0;
}

int report_models_find(cache *c, const char *spec, report_models *out, shoal_err *err)
{
    int rc;
    memset(out, 0, sizeof *out);
    out->spec = spec;
    rc = cache_models_list(c, collect_model, out, err);
    if (rc == SHOAL_ENOMEM)
        shoal_err_set(err, rc, "cache: out of memory listing models");
    if (rc == 0 && spec && *spec && out->n == 0)
        rc = shoal_err_set(err, SHOAL_ENOTFOUND, "no model matching '%s' in the cache %s "
                           "(`shoal ls` lists them)", spec, c->dir);
    if (rc)
        report_models_free(out);
    return rc;
}

void report_models_free(report_models *ms)
{
    free(ms->v);
    memset(ms, 0, sizeof *ms);
}

int report_models_has(const report_models *ms, int64_t id)
{
    for (size_t i = 0; i < ms->n; i++)
        if (ms->v[i].id == id)
            return 1;
    return 0;
}

/* ---- objects by etag prefix -------------------------------------------------------- */

int cache_find_prefix(cache *c, const char *prefix, cache_kind kind, cache_key *out, char *etag,
                      size_t cap, shoal_err *err)
{
    size_t n = strlen(prefix);
    int rc, found = 0;

    if (!c->cfg.read_only) {
        for (size_t i = 0; i < c->nobjs && !found; i++) {
            const cobj *o = &c->objs[i];
            if (o->kind == (uint8_t)kind && strncmp(o->etag, prefix, n) == 0) {
                snprintf(etag, cap, "%s", o->etag);
                *out = (cache_key){ etag, o->off, o->len };
                found = 1;
            }
        }
    } else {
        sqlite3_stmt *s = NULL;
        rc = sqlite3_prepare_v2(c->db, "SELECT etag, off, len FROM objects WHERE kind = ?1 AND"
                                " substr(etag, 1, ?2) = ?3 LIMIT 1", -1, &s, NULL);
        if (rc != SQLITE_OK)
            return cache_db_fail(c, rc, "find by prefix", err);
        sqlite3_bind_int(s, 1, (int)kind);
        sqlite3_bind_int64(s, 2, (int64_t)n);
        sqlite3_bind_text(s, 3, prefix, -1, SQLITE_STATIC);
        if ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            snprintf(etag, cap, "%s", (const char *)sqlite3_column_text(s, 0));
            *out = (cache_key){ etag, (uint64_t)sqlite3_column_int64(s, 1),
                                (uint64_t)sqlite3_column_int64(s, 2) };
            found = 1;
        }
        sqlite3_finalize(s);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE)
            return cache_db_fail(c, rc, "find by prefix", err);
    }
    return found ? 0 : shoal_err_set(err, SHOAL_ENOTFOUND, "no object %s* cached", prefix);
}

/* ---- a model's manifest, from the cache ------------------------------------------- */

/* Append the encoded manifest named for model `id` (or for another model
 * row of the same repo and commit) to out.  SHOAL_ENOTFOUND when none is
 * cached. */
static int manifest_bytes(cache *c, const cache_model *m, shoal_buf *out, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    cache_obj obj;
    cache_key key;
    char etag[CACHE_ETAG_MAX + 1];
    int rc, found = 0;

    rc = sqlite3_prepare_v2(c->db, "SELECT o.etag, o.off, o.len FROM objects o"
        " JOIN names n ON n.object_id = o.id JOIN models d ON d.id = n.model_id"
        " WHERE n.file = ?1 AND (d.id = ?2 OR (d.repo = ?3 AND d.commit_id = ?4))"
        " ORDER BY d.id = ?2 DESC LIMIT 1", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "find manifest", err);
    sqlite3_bind_text(s, 1, CACHE_MANIFEST_FILE, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, m->id);
    sqlite3_bind_text(s, 3, m->repo, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, m->commit, -1, SQLITE_STATIC);
    if (sqlite3_step(s) == SQLITE_ROW) {
        snprintf(etag, sizeof etag, "%s", (const char *)sqlite3_column_text(s, 0));
        key.offset = (uint64_t)sqlite3_column_int64(s, 1);
        key.length = (uint64_t)sqlite3_column_int64(s, 2);
        found = 1;
    }
    sqlite3_finalize(s);
    if (!found)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "the manifest of %s is not cached", m->repo);
    if (key.length > MANIFEST_ENCODED_MAX)
        return shoal_err_set(err, SHOAL_ETOOBIG, "manifest of %s: %" PRIu64 " bytes", m->repo,
                             key.length);
    key.etag = etag;
    if ((rc = cache_lookup(c, &key, NULL, &obj, err)) != 0)
        return rc;
    rc = shoal_buf_reserve(out, (size_t)obj.length);
    if (rc == 0) {
        rc = shoal_pread_all(obj.fd, out->data + out->len, (size_t)obj.length, 0);
        if (rc == 0) {
            out->len += (size_t)obj.length;
            out->data[out->len] = 0;
        }
    }
    close(obj.fd);
    return rc ? shoal_err_set(err, rc, "reading the manifest of %s", m->repo) : 0;
}

int report_manifest_load(cache *c, const cache_model *m, manifest **out, shoal_err *err)
{
    shoal_buf b;
    int rc;

    *out = NULL;
    shoal_buf_init(&b, MANIFEST_ENCODED_MAX + 1);
    rc = manifest_bytes(c, m, &b, err);
    if (rc == 0)
        rc = manifest_decode(b.data, b.len, out, err);
    shoal_buf_free(&b);
    return rc;
}

int cache_model_manifest(cache *c, const char *spec, shoal_buf *out, shoal_err *err)
{
    report_models ms;
    int rc = report_models_find(c, spec, &ms, err);
    if (rc)
        return rc;
    rc = SHOAL_ENOTFOUND;
    /* The newest model row first: the latest resolution of a revision. */
    for (size_t i = ms.n; i-- > 0 && rc == SHOAL_ENOTFOUND;)
        rc = manifest_bytes(c, &ms.v[i], out, err);
    report_models_free(&ms);
    return rc;
}

/* ---- JSON helpers -------------------------------------------------------------------- */

/* Builders record the first failure in *rc and go on as no-ops, so a
 * report is built straight through and checked once. */
void rj_set(int *rc, shoal_json *obj, const char *key, shoal_json *v)
{
    if (*rc) {
        shoal_json_free(v);
        return;
    }
    if (!obj) {
        shoal_json_free(v);
        *rc = SHOAL_ENOMEM;
        return;
    }
    *rc = shoal_json_set_take(obj, key, v);
}

void rj_push(int *rc, shoal_json *arr, shoal_json *v)
{
    if (*rc) {
        shoal_json_free(v);
        return;
    }
    if (!arr) {
        shoal_json_free(v);
        *rc = SHOAL_ENOMEM;
        return;
    }
    *rc = shoal_json_append_take(arr, v);
}

shoal_json *rj_u64(uint64_t v)
{
    return shoal_json_new_int(v > INT64_MAX ? INT64_MAX : (int64_t)v);
}

shoal_json *rj_str(const char *s)
{
    return shoal_json_new_str(s ? s : "");
}

static shoal_json *counts_json(int *rc, const cache_counts *k)
{
    shoal_json *o = shoal_json_object();
    rj_set(rc, o, "hits", rj_u64(k->hits));
    rj_set(rc, o, "misses", rj_u64(k->misses));
    rj_set(rc, o, "joins", rj_u64(k->joins));
    rj_set(rc, o, "requests", rj_u64(k->hits + k->misses + k->joins));
    rj_set(rc, o, "hit_rate", shoal_json_new_num(cache_counts_hit_rate(k)));
    rj_set(rc, o, "bytes_in", rj_u64(k->bytes_in));
    rj_set(rc, o, "bytes_out", rj_u64(k->bytes_out));
    rj_set(rc, o, "wait_ms", shoal_json_new_num((double)k->wait_ns / 1e6));
    return o;
}

static void counts_add(cache_counts *a, const cache_counts *b)
{
    a->hits += b->hits;
    a->misses += b->misses;
    a->joins += b->joins;
    a->bytes_in += b->bytes_in;
    a->bytes_out += b->bytes_out;
    a->wait_ns += b->wait_ns;
}

/* ---- per-model figures ------------------------------------------------------------------ */

/* Objects and bytes of model id, by kind. */
static int model_bytes(cache *c, int64_t id, uint64_t objs[CACHE_KIND_COUNT_],
                       uint64_t bytes[CACHE_KIND_COUNT_], shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT kind, count(*), coalesce(sum(len), 0) FROM objects"
                                " WHERE id IN (SELECT object_id FROM names WHERE model_id = ?1)"
                                " GROUP BY kind", -1, &s, NULL);
    memset(objs, 0, CACHE_KIND_COUNT_ * sizeof *objs);
    memset(bytes, 0, CACHE_KIND_COUNT_ * sizeof *bytes);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "model bytes", err);
    sqlite3_bind_int64(s, 1, id);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        int k = sqlite3_column_int(s, 0);
        if (k >= 0 && k < CACHE_KIND_COUNT_) {
            objs[k] = (uint64_t)sqlite3_column_int64(s, 1);
            bytes[k] = (uint64_t)sqlite3_column_int64(s, 2);
        }
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "model bytes", err);
}

/* One integer from a query with one int64 parameter. */
static int query_count(cache *c, const char *sql, int64_t p, uint64_t *out, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, sql, -1, &s, NULL);
    *out = 0;
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "count", err);
    sqlite3_bind_int64(s, 1, p);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        *out = (uint64_t)sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "count", err);
}

/* Coverage from the manifest: null when the manifest is not cached. */
static shoal_json *coverage_json(cache *c, const cache_model *m, int *jrc, shoal_err *err,
                                 int *rc)
{
    manifest *man = NULL;
    uint64_t experts_cached = 0, spine_cached = 0, spine_total = 0, spine_bytes = 0;
    shoal_json *o;

    if (report_manifest_load(c, m, &man, NULL) != 0)
        return shoal_json_new_null();
    *rc = query_count(c, "SELECT count(*) FROM (SELECT DISTINCT n.layer, n.expert FROM names n"
                      " JOIN objects o ON o.id = n.object_id WHERE n.model_id = ?1"
                      " AND o.kind = 0 AND n.layer >= 0 AND n.expert >= 0)",
                      m->id, &experts_cached, err);
    if (*rc == 0)
        *rc = query_count(c, "SELECT count(DISTINCT n.tensor) FROM names n JOIN objects o"
                          " ON o.id = n.object_id WHERE n.model_id = ?1 AND o.kind = 1"
                          " AND n.tensor != ''", m->id, &spine_cached, err);
    for (size_t i = 0; i < man->ntensors; i++)
        if (man->tensors[i].is_spine) {
            spine_total++;
            spine_bytes += man->tensors[i].length;
        }
    o = shoal_json_object();
    rj_set(jrc, o, "layers", rj_u64(man->n_layers));
    rj_set(jrc, o, "experts_per_layer", rj_u64(man->experts_per_layer));
    rj_set(jrc, o, "expert_bytes", rj_u64(man->expert_bytes));
    rj_set(jrc, o, "experts_cached", rj_u64(experts_cached));
    rj_set(jrc, o, "experts_total", rj_u64(man->nexperts));
    rj_set(jrc, o, "spine_cached", rj_u64(spine_cached));
    rj_set(jrc, o, "spine_total", rj_u64(spine_total));
    rj_set(jrc, o, "spine_bytes", rj_u64(spine_bytes));
    rj_set(jrc, o, "spine_complete", shoal_json_new_bool(spine_total > 0 &&
                                                          spine_cached >= spine_total));
    rj_set(jrc, o, "files", rj_u64(man->nfiles));
    manifest_free(man);
    return o;
}

static const char *const kind_names[CACHE_KIND_COUNT_] = { "expert", "spine", "small", "derived" };

/* The identity, bytes and coverage of one model. */
static shoal_json *model_json(cache *c, const cache_model *m, const cache_counts *tiers,
                              int *jrc, shoal_err *err, int *rc)
{
    uint64_t objs[CACHE_KIND_COUNT_], bytes[CACHE_KIND_COUNT_], tobj = 0, tbytes = 0;
    shoal_json *o = shoal_json_object(), *bk = shoal_json_object();

    rj_set(jrc, o, "id", shoal_json_new_int(m->id));
    rj_set(jrc, o, "endpoint", rj_str(m->endpoint));
    rj_set(jrc, o, "repo", rj_str(m->repo));
    rj_set(jrc, o, "revision", rj_str(m->revision));
    rj_set(jrc, o, "commit", rj_str(m->commit));
    rj_set(jrc, o, "resolved_ms", shoal_json_new_int(m->resolved_ms));
    *rc = model_bytes(c, m->id, objs, bytes, err);
    for (int k = 0; k < CACHE_KIND_COUNT_; k++) {
        tobj += objs[k];
        tbytes += bytes[k];
        rj_set(jrc, bk, kind_names[k], rj_u64(bytes[k]));
    }
    rj_set(jrc, o, "objects", rj_u64(tobj));
    rj_set(jrc, o, "bytes", rj_u64(tbytes));
    rj_set(jrc, o, "bytes_by_kind", bk);
    if (tiers) {
        rj_set(jrc, o, "disk", counts_json(jrc, &tiers[CACHE_TIER_DISK]));
        rj_set(jrc, o, "ram", counts_json(jrc, &tiers[CACHE_TIER_RAM]));
    }
    if (*rc == 0)
        rj_set(jrc, o, "coverage", coverage_json(c, m, jrc, err, rc));
    return o;
}

int report_dump(shoal_json *root, int jrc, shoal_buf *out, shoal_err *err)
{
    int rc = jrc ? jrc : shoal_json_dump(root, SHOAL_JSON_COMPACT, out);
    shoal_json_free(root);
    return rc ? shoal_err_set(err, rc, "cache: building a report: %s", shoal_strerror(rc)) : 0;
}

shoal_json *report_header(int *jrc, const char *schema, const cache *c, const char *source)
{
    shoal_json *root = shoal_json_object();
    rj_set(jrc, root, "schema", rj_str(schema));
    rj_set(jrc, root, "version", shoal_json_new_int(1));
    rj_set(jrc, root, "source", rj_str(source ? source : "index"));
    rj_set(jrc, root, "home", rj_str(c->dir));
    rj_set(jrc, root, "generated_ms", shoal_json_new_int(shoal_wall_ms()));
    return root;
}

int cache_report_models(cache *c, const char *spec, shoal_buf *out, shoal_err *err)
{
    report_models ms;
    int rc, jrc = 0;
    shoal_json *root, *arr;

    if ((rc = report_models_find(c, spec, &ms, err)) != 0)
        return rc;
    root = report_header(&jrc, "shoal.models", c, NULL);
    arr = shoal_json_array();
    for (size_t i = 0; i < ms.n && rc == 0; i++)
        rj_push(&jrc, arr, model_json(c, &ms.v[i], NULL, &jrc, err, &rc));
    rj_set(&jrc, root, "models", arr);
    report_models_free(&ms);
    if (rc) {
        shoal_json_free(root);
        return rc;
    }
    return report_dump(root, jrc, out, err);
}

/* ---- the stats report ------------------------------------------------------------------ */

typedef struct sess {
    uint64_t id;
    int64_t  pid, started_ms, ended_ms;
    char     program[64];
    cache_counts t[CACHE_TIER_COUNT_];
} sess;

typedef struct stats_ctx {
    const report_models *ms;       /* NULL: every model */
    cache_counts total[CACHE_TIER_COUNT_];
    shoal_json *arr;               /* rows of the level being walked */
    shoal_json *row;               /* the row being filled (same key, next tier) */
    int64_t  row_model;
    int32_t  row_layer;
    uint64_t row_session;
    int      jrc;
    /* per-model counters, parallel to ms->v (or to all models) */
    const report_models *all;
    cache_counts (*mc)[CACHE_TIER_COUNT_];
    /* sessions */
    sess    *sv;
    size_t   sn, scap;
    /* the expert grid: one row per (model, layer) */
    int64_t  g_model;
    int32_t  g_layer;
    shoal_json *g_req, *g_hits;
    int32_t  g_next;               /* next expert index to fill */
} stats_ctx;

static const char *const tier_names[CACHE_TIER_COUNT_] = { "disk", "ram" };

static int keep_model(const stats_ctx *x, int64_t model)
{
    return !x->ms || report_models_has(x->ms, model);
}

static int on_total(const cache_stats_row *r, void *ctx)
{
    stats_ctx *x = ctx;
    if ((unsigned)r->tier < CACHE_TIER_COUNT_)
        counts_add(&x->total[r->tier], &r->counts);
    return 0;
}

/* A fresh row {model, [layer], disk: zeros, ram: zeros} appended to x->arr. */
static shoal_json *new_row(stats_ctx *x, int64_t model, int32_t layer)
{
    static const cache_counts zero;
    shoal_json *o = shoal_json_object();
    rj_set(&x->jrc, o, "model", shoal_json_new_int(model));
    if (layer >= 0)
        rj_set(&x->jrc, o, "layer", shoal_json_new_int(layer));
    for (int t = 0; t < CACHE_TIER_COUNT_; t++)
        rj_set(&x->jrc, o, tier_names[t], counts_json(&x->jrc, &zero));
    rj_push(&x->jrc, x->arr, o);
    return o;
}

static int on_model(const cache_stats_row *r, void *ctx)
{
    stats_ctx *x = ctx;
    if (!keep_model(x, r->model) || (unsigned)r->tier >= CACHE_TIER_COUNT_)
        return 0;
    if (x->ms)
        counts_add(&x->total[r->tier], &r->counts);
    for (size_t i = 0; i < x->all->n; i++)
        if (x->all->v[i].id == r->model)
            counts_add(&x->mc[i][r->tier], &r->counts);
    return 0;
}

static int on_layer(const cache_stats_row *r, void *ctx)
{
    stats_ctx *x = ctx;
    if (!keep_model(x, r->model) || (unsigned)r->tier >= CACHE_TIER_COUNT_)
        return 0;
    if (!x->row || x->row_model != r->model || x->row_layer != r->layer) {
        x->row = new_row(x, r->model, r->layer);
        x->row_model = r->model;
        x->row_layer = r->layer;
    }
    rj_set(&x->jrc, x->row, tier_names[r->tier], counts_json(&x->jrc, &r->counts));
    return 0;
}

static int on_session(const cache_stats_row *r, void *ctx)
{
    stats_ctx *x = ctx;
    sess *s;
    if (x->sn == 0 || x->sv[x->sn - 1].id != r->session) {
        if (x->sn == x->scap) {
            size_t cap = x->scap ? x->scap * 2 : 64;
            sess *p = realloc(x->sv, cap * sizeof *p);
            if (!p)
                return SHOAL_ENOMEM;
            x->sv = p;
            x->scap = cap;
        }
        s = &x->sv[x->sn++];
        memset(s, 0, sizeof *s);
        s->id = r->session;
        s->pid = r->pid;
        s->started_ms = r->started_ms;
        s->ended_ms = r->ended_ms;
        snprintf(s->program, sizeof s->program, "%s", r->program ? r->program : "");
    }
    s = &x->sv[x->sn - 1];
    if ((unsigned)r->tier < CACHE_TIER_COUNT_)
        counts_add(&s->t[r->tier], &r->counts);
    return 0;
}

static void grid_flush(stats_ctx *x)
{
    shoal_json *o;
    if (!x->g_req)
        return;
    o = shoal_json_object();
    rj_set(&x->jrc, o, "model", shoal_json_new_int(x->g_model));
    rj_set(&x->jrc, o, "layer", shoal_json_new_int(x->g_layer));
    rj_set(&x->jrc, o, "requests", x->g_req);
    rj_set(&x->jrc, o, "hits", x->g_hits);
    rj_push(&x->jrc, x->arr, o);
    x->g_req = x->g_hits = NULL;
}

/* Expert rows become, per (model, layer), two arrays indexed by expert id
 * (disk tier: what reached shoald): compact enough that K3's 82,432
 * experts fit in one socket reply. */
static int on_expert(const cache_stats_row *r, void *ctx)
{
    stats_ctx *x = ctx;
    if (!keep_model(x, r->model) || r->tier != CACHE_TIER_DISK || r->expert < 0)
        return 0;
    if (!x->g_req || x->g_model != r->model || x->g_layer != r->layer) {
        grid_flush(x);
        x->g_req = shoal_json_array();
        x->g_hits = shoal_json_array();
        x->g_model = r->model;
        x->g_layer = r->layer;
        x->g_next = 0;
    }
    for (; x->g_next < r->expert; x->g_next++) {
        rj_push(&x->jrc, x->g_req, shoal_json_new_int(0));
        rj_push(&x->jrc, x->g_hits, shoal_json_new_int(0));
    }
    rj_push(&x->jrc, x->g_req, rj_u64(r->counts.hits + r->counts.misses + r->counts.joins));
    rj_push(&x->jrc, x->g_hits, rj_u64(r->counts.hits));
    x->g_next = r->expert + 1;
    return 0;
}

static shoal_json *sessions_json(stats_ctx *x, unsigned max)
{
    shoal_json *arr = shoal_json_array();
    size_t first = x->sn > max ? x->sn - max : 0;
    /* Newest first: that is what a person looks for. */
    for (size_t i = x->sn; i-- > first;) {
        const sess *s = &x->sv[i];
        shoal_json *o = shoal_json_object();
        rj_set(&x->jrc, o, "id", rj_u64(s->id));
        rj_set(&x->jrc, o, "pid", shoal_json_new_int(s->pid));
        rj_set(&x->jrc, o, "program", rj_str(s->program));
        rj_set(&x->jrc, o, "started_ms", shoal_json_new_int(s->started_ms));
        rj_set(&x->jrc, o, "ended_ms", shoal_json_new_int(s->ended_ms));
        for (int t = 0; t < CACHE_TIER_COUNT_; t++)
            rj_set(&x->jrc, o, tier_names[t], counts_json(&x->jrc, &s->t[t]));
        rj_push(&x->jrc, arr, o);
    }
    return arr;
}

/* Where requests were served, end to end: the engine's RAM tier first
 * (when it reports), then this cache, then upstream (misses and joins). */
static shoal_json *served_json(int *jrc, const cache_counts *t)
{
    const cache_counts *disk = &t[CACHE_TIER_DISK], *ram = &t[CACHE_TIER_RAM];
    uint64_t disk_req = disk->hits + disk->misses + disk->joins;
    uint64_t up = disk->misses + disk->joins;
    /* RAM misses go on to the disk tier, so they are not requests twice;
     * when the engine reports nothing, the disk requests are all there is. */
    uint64_t total = ram->hits + (ram->misses > disk_req ? ram->misses : disk_req);
    shoal_json *o = shoal_json_object();
    rj_set(jrc, o, "requests", rj_u64(total));
    rj_set(jrc, o, "ram", rj_u64(ram->hits));
    rj_set(jrc, o, "disk", rj_u64(disk->hits));
    rj_set(jrc, o, "upstream", rj_u64(up));
    rj_set(jrc, o, "hit_rate", shoal_json_new_num(total ? (double)(ram->hits + disk->hits) /
                                                           (double)total : 0.0));
    return o;
}

static shoal_json *upstream_json(int *jrc, const cache_counts *disk, const cache_report_live *live)
{
    shoal_json *o = shoal_json_object();
    uint64_t bytes = disk->bytes_in, ns = disk->wait_ns;
    rj_set(jrc, o, "fetches", rj_u64(disk->misses));
    rj_set(jrc, o, "joins", rj_u64(disk->joins));
    rj_set(jrc, o, "bytes_in", rj_u64(disk->bytes_in));
    rj_set(jrc, o, "wait_ms", shoal_json_new_num((double)disk->wait_ns / 1e6));
    if (live && live->upstream_ns) {
        bytes = live->upstream_bytes;
        ns = live->upstream_ns;
    }
    /* Bytes per second of waiting: what a miss costs, the figure
     * `shoal estimate` uses for the streaming case. */
    rj_set(jrc, o, "rate_bytes_per_s", ns ? shoal_json_new_num((double)bytes * 1e9 / (double)ns)
                                          : shoal_json_new_null());
    if (live) {
        rj_set(jrc, o, "transfers_started", rj_u64(live->transfers_started));
        rj_set(jrc, o, "transfers_completed", rj_u64(live->transfers_completed));
        rj_set(jrc, o, "transfers_failed", rj_u64(live->transfers_failed));
    }
    return o;
}

static shoal_json *disk_json(int *jrc, const cache_usage *u, uint64_t budget)
{
    shoal_json *o = shoal_json_object();
    rj_set(jrc, o, "used", rj_u64(u->used));
    rj_set(jrc, o, "budget", budget ? rj_u64(budget) : shoal_json_new_null());
    rj_set(jrc, o, "use", budget ? shoal_json_new_num((double)u->used / (double)budget)
                                 : shoal_json_new_null());
    rj_set(jrc, o, "reserved", rj_u64(u->reserved));
    rj_set(jrc, o, "pinned", rj_u64(u->pinned));
    rj_set(jrc, o, "lifted", rj_u64(u->lifted));
    rj_set(jrc, o, "objects", rj_u64(u->objects));
    rj_set(jrc, o, "evicted", rj_u64(u->evicted));
    rj_set(jrc, o, "evicted_bytes", rj_u64(u->evicted_bytes));
    return o;
}

static const char *const by_names[] = { "none", "layer", "expert", "session" };

/* Walk one level into a fresh array set on root under `key`. */
static int walk_level(cache *c, stats_ctx *x, shoal_json *root, const char *key,
                      cache_stats_level level, cache_stats_fn fn, shoal_err *err)
{
    int rc;
    x->arr = shoal_json_array();
    x->row = NULL;
    rc = cache_stats_query(c, level, x->ms && x->ms->n == 1 ? x->ms->v[0].id : 0, fn, x, err);
    if (level == CACHE_STATS_EXPERT)
        grid_flush(x);
    if (rc == SHOAL_ENOMEM)
        shoal_err_set(err, rc, "cache: out of memory building the stats report");
    rj_set(&x->jrc, root, key, x->arr);
    x->arr = NULL;
    return rc;
}

/* "integrity": bytes verified against an upstream hash vs trusted on
 * their transfer (docs/stats-json.md). */
static shoal_json *integrity_json(cache *c, int *jrc)
{
    cache_integrity g;
    shoal_json *o = shoal_json_object();
    cache_integrity_get(c, &g, NULL);
    rj_set(jrc, o, "verified_bytes", rj_u64(g.verified_bytes));
    rj_set(jrc, o, "verified_objects", rj_u64(g.verified_objects));
    rj_set(jrc, o, "trusted_bytes", rj_u64(g.trusted_bytes));
    rj_set(jrc, o, "trusted_objects", rj_u64(g.trusted_objects));
    rj_set(jrc, o, "derived_bytes", rj_u64(g.derived_bytes));
    rj_set(jrc, o, "bad_files", rj_u64(g.bad_files));
    rj_set(jrc, o, "mismatches", rj_u64(g.failures));
    rj_set(jrc, o, "quarantined_bytes", rj_u64(g.quarantined_bytes));
    return o;
}

int cache_report_stats(cache *c, const cache_report_opts *o, shoal_buf *out, shoal_err *err)
{
    static const cache_report_opts defaults;
    report_models ms = { 0 };
    stats_ctx x;
    cache_usage u;
    shoal_json *root, *filter, *tiers, *models, *bytes;
    int rc;

    if (!o)
        o = &defaults;
    memset(&x, 0, sizeof x);
    if ((rc = report_models_find(c, o->model, &ms, err)) != 0)
        return rc;
    if (o->model && *o->model)
        x.ms = &ms;
    root = report_header(&x.jrc, "shoal.stats", c, o->source);
    filter = shoal_json_object();
    rj_set(&x.jrc, filter, "model", o->model && *o->model ? rj_str(o->model) : shoal_json_new_null());
    rj_set(&x.jrc, filter, "by", rj_str(by_names[(unsigned)o->by < 4 ? o->by : 0]));
    rj_set(&x.jrc, root, "filter", filter);

    /* Totals: the total rows, or with a model filter the sum of its models. */
    if (!x.ms)
        rc = cache_stats_query(c, CACHE_STATS_TOTAL, 0, on_total, &x, err);
    x.all = &ms;
    x.mc = calloc(ms.n ? ms.n : 1, sizeof *x.mc);
    if (!x.mc)
        rc = shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory building the stats report");
    if (rc == 0)
        rc = cache_stats_query(c, CACHE_STATS_MODEL, x.ms && ms.n == 1 ? ms.v[0].id : 0,
                               on_model, &x, err);
    if (rc == 0)
        rc = walk_level(c, &x, root, "layers", CACHE_STATS_LAYER, on_layer, err);
    if (rc == 0 && o->by == CACHE_REPORT_BY_EXPERT)
        rc = walk_level(c, &x, root, "experts", CACHE_STATS_EXPERT, on_expert, err);
    if (rc == 0)
        rc = cache_stats_query(c, CACHE_STATS_SESSION, 0, on_session, &x, err);
    if (rc == 0)
        rc = cache_usage_get(c, &u, err);
    if (rc)
        goto fail;

    tiers = shoal_json_object();
    rj_set(&x.jrc, tiers, "ram", counts_json(&x.jrc, &x.total[CACHE_TIER_RAM]));
    rj_set(&x.jrc, tiers, "disk", counts_json(&x.jrc, &x.total[CACHE_TIER_DISK]));
    rj_set(&x.jrc, tiers, "upstream", upstream_json(&x.jrc, &x.total[CACHE_TIER_DISK], o->live));
    rj_set(&x.jrc, root, "tiers", tiers);
    rj_set(&x.jrc, root, "served", served_json(&x.jrc, x.total));
    bytes = shoal_json_object();
    rj_set(&x.jrc, bytes, "fetched", rj_u64(x.total[CACHE_TIER_DISK].bytes_in));
    rj_set(&x.jrc, bytes, "served", rj_u64(x.total[CACHE_TIER_DISK].bytes_out +
                                           x.total[CACHE_TIER_RAM].bytes_out));
    rj_set(&x.jrc, root, "bytes", bytes);
    rj_set(&x.jrc, root, "disk", disk_json(&x.jrc, &u, o->budget ? o->budget : u.budget));
    rj_set(&x.jrc, root, "integrity", integrity_json(c, &x.jrc));
    if (o->live) {
        shoal_json *d = shoal_json_object();
        rj_set(&x.jrc, d, "started_ms", shoal_json_new_int(o->live->started_ms));
        rj_set(&x.jrc, d, "clients", rj_u64(o->live->clients));
        rj_set(&x.jrc, d, "jobs_running", rj_u64(o->live->jobs_running));
        rj_set(&x.jrc, root, "daemon", d);
    } else {
        rj_set(&x.jrc, root, "daemon", shoal_json_new_null());
    }
    models = shoal_json_array();
    for (size_t i = 0; i < ms.n && rc == 0; i++)
        rj_push(&x.jrc, models, model_json(c, &ms.v[i], x.mc[i], &x.jrc, err, &rc));
    rj_set(&x.jrc, root, "models", models);
    rj_set(&x.jrc, root, "sessions_total", rj_u64(x.sn));
    rj_set(&x.jrc, root, "sessions",
           sessions_json(&x, o->by == CACHE_REPORT_BY_SESSION ? (unsigned)-1
                             : o->max_sessions ? o->max_sessions : 10));
    if (rc)
        goto fail;
    free(x.sv);
    free(x.mc);
    report_models_free(&ms);
    return report_dump(root, x.jrc, out, err);
fail:
    shoal_json_free(x.g_req);
    shoal_json_free(x.g_hits);
    shoal_json_free(root);
    free(x.sv);
    free(x.mc);
    report_models_free(&ms);
    return rc;
}
