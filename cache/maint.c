/* maint.c — what `shoal verify`, `gc`, `rm` and `pin` do to a cache, for
 * the one writer (shoald, or the CLI itself when no daemon holds the lock).
 *
 * Owns: verification of a model's objects with the result as JSON, a
 * one-off trim to a size through the eviction policy, removing a model,
 * pinning a model's objects.  Does not own the policy (evict.c), per-object
 * checks (read.c) or whole-file checks (deep.c).
 */
#include "cache/cache_int.h"
#include "cache/report_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static int need_writer(const cache *c, const char *what, shoal_err *err)
{
    return c->cfg.read_only ? shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only: "
                                            "cannot %s", c->dir, what) : 0;
}

/* ---- verify ------------------------------------------------------------------ */

int cache_verify_json(cache *c, const char *spec, const cache_verify_report *tot,
                      const cache_deep_report *dr, const shoal_buf *bad, shoal_buf *out,
                      shoal_err *err)
{
    shoal_json *root, *d, *arr;
    int jrc = 0;

    root = report_header(&jrc, "shoal.verify", c, NULL);
    rj_set(&jrc, root, "model", spec && *spec ? rj_str(spec) : shoal_json_new_null());
    rj_set(&jrc, root, "checked", rj_u64(tot->checked));
    rj_set(&jrc, root, "bytes", rj_u64(tot->bytes));
    rj_set(&jrc, root, "bad", rj_u64(tot->bad));
    rj_set(&jrc, root, "missing", rj_u64(tot->missing));
    if (dr) {
        d = shoal_json_object();
        arr = shoal_json_array();
        rj_set(&jrc, d, "files", rj_u64(dr->files));
        rj_set(&jrc, d, "complete", rj_u64(dr->complete));
        rj_set(&jrc, d, "ok", rj_u64(dr->ok));
        rj_set(&jrc, d, "bad", rj_u64(dr->bad));
        rj_set(&jrc, d, "unhashable", rj_u64(dr->unhashable));
        rj_set(&jrc, d, "bytes", rj_u64(dr->bytes));
        rj_set(&jrc, d, "quarantined", rj_u64(dr->quarantined));
        for (const char *p = bad ? (const char *)bad->data : NULL, *nl; p && *p; p = nl + 1) {
            if (!(nl = strchr(p, '\n')))
                break;
            rj_push(&jrc, arr, shoal_json_new_strn(p, (size_t)(nl - p)));
        }
        rj_set(&jrc, d, "bad_files", arr);
        rj_set(&jrc, root, "deep", d);
    } else {
        rj_set(&jrc, root, "deep", shoal_json_new_null());
    }
    return report_dump(root, jrc, out, err);
}

int cache_report_verify(cache *c, const char *spec, int deep, shoal_buf *out, shoal_err *err)
{
    cache_verify_report tot;
    cache_verify_list badl = { 0 };
    cache_deep_report dr;
    uint64_t gb = 0, gm = 0;
    shoal_buf bad;
    int rc;

    memset(&tot, 0, sizeof tot);
    if ((rc = need_writer(c, "verify", err)) != 0)
        return rc;
    rc = cache_verify_scan(c, spec, &tot, &badl, NULL, NULL, err);
    if (rc == 0)
        rc = cache_verify_remove(c, &badl, 0, badl.n, &gb, &gm, err);
    tot.bad -= gb;
    tot.missing -= gm;
    cache_verify_list_free(&badl);
    shoal_buf_init(&bad, 0);
    if (rc == 0 && deep)
        rc = cache_verify_deep(c, spec, NULL, &dr, &bad, err);
    if (rc == 0)
        rc = cache_verify_json(c, spec, &tot, deep ? &dr : NULL, &bad, out, err);
    shoal_buf_free(&bad);
    return rc;
}

/* ---- gc ------------------------------------------------------------------------- */

int cache_gc_step(cache *c, cache_gc_state *st, uint64_t max_bytes, uint64_t step_bytes,
                  int *done, shoal_err *err)
{
    uint64_t floor, floor_disk, have, saved, pinned_disk;
    int rc;

    *done = 0;
    if ((rc = need_writer(c, "collect garbage", err)) != 0)
        return rc;
    if (!st->started) {
        st->started = 1;
        st->before = c->used;
        st->evicted0 = c->evicted;
        st->target = max_bytes ? max_bytes : c->budget;
    }
    st->pinned = 0;
    pinned_disk = 0;
    for (size_t i = 0; i < c->nobjs; i++)
        if (cache_obj_pinned(c, &c->objs[i])) {
            st->pinned += c->objs[i].len;
            pinned_disk += cache_disk_len(c, c->objs[i].len);
        }
    /* Pinned bytes stay: the best reachable is everything unpinned gone.
     * The figures are bytes; eviction is charged in disk blocks
     * (cache_evict_for), so its floor is too. */
    floor = st->target > st->pinned + c->reserved ? st->target : st->pinned + c->reserved;
    floor_disk = st->target > pinned_disk + c->reserved ? st->target : pinned_disk + c->reserved;
    have = c->used_disk + c->reserved;
    st->goal = st->before > floor - c->reserved ? st->before - (floor - c->reserved) : 0;
    st->freed = st->before > c->used ? st->before - c->used : 0;
    if (have <= floor_disk) {
        *done = 1;
        return 0;
    }
    saved = c->budget;
    c->budget = step_bytes && have - floor_disk > step_bytes ? have - step_bytes : floor_disk;
    rc = cache_evict_for(c, 0, err);
    c->budget = saved;
    st->freed = st->before > c->used ? st->before - c->used : 0;
    if (rc == 0 && c->used_disk + c->reserved <= floor_disk)
        *done = 1;
    return rc;
}

int cache_gc_json(cache *c, const cache_gc_state *st, shoal_buf *out, shoal_err *err)
{
    shoal_json *root;
    int jrc = 0;

    LOG_INFO(CACHE_TAG, "gc to %" PRIu64 " bytes: %" PRIu64 " -> %" PRIu64, st->target,
             st->before, c->used);
    root = report_header(&jrc, "shoal.gc", c, NULL);
    rj_set(&jrc, root, "max_bytes", rj_u64(st->target));
    rj_set(&jrc, root, "before", rj_u64(st->before));
    rj_set(&jrc, root, "after", rj_u64(c->used));
    rj_set(&jrc, root, "freed", rj_u64(st->before > c->used ? st->before - c->used : 0));
    rj_set(&jrc, root, "objects_evicted", rj_u64(c->evicted - st->evicted0));
    rj_set(&jrc, root, "pinned", rj_u64(st->pinned));
    rj_set(&jrc, root, "reached", shoal_json_new_bool(c->used <= st->target));
    return report_dump(root, jrc, out, err);
}

int cache_report_gc(cache *c, uint64_t max_bytes, shoal_buf *out, shoal_err *err)
{
    cache_gc_state st;
    int done = 0, rc = 0;

    memset(&st, 0, sizeof st);
    while (rc == 0 && !done)
        rc = cache_gc_step(c, &st, max_bytes, 0, &done, err);
    return rc ? rc : cache_gc_json(c, &st, out, err);
}

/* ---- rm ------------------------------------------------------------------------- */

/* Fill temp.rm_models with the ids of ms. */
static int rm_temp(cache *c, const report_models *ms, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = cache_db_exec(c, "CREATE TEMP TABLE IF NOT EXISTS rm_models(id INTEGER PRIMARY KEY);"
                           "DELETE FROM temp.rm_models", err);
    if (rc)
        return rc;
    rc = sqlite3_prepare_v2(c->db, "INSERT INTO temp.rm_models(id) VALUES(?1)", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "rm", err);
    for (size_t i = 0; i < ms->n; i++) {
        sqlite3_bind_int64(s, 1, ms->v[i].id);
        rc = sqlite3_step(s);
        sqlite3_reset(s);
        if (rc != SQLITE_DONE) {
            sqlite3_finalize(s);
            return cache_db_fail(c, rc, "rm", err);
        }
    }
    sqlite3_finalize(s);
    return 0;
}

/* Objects only these models name (others keep theirs). */
static int rm_objects(cache *c, uint64_t **ids, size_t *n, uint64_t *bytes, uint64_t *shared,
                      shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    size_t cap = 0;
    int rc = sqlite3_prepare_v2(c->db,
        "SELECT DISTINCT n.object_id, o.len, EXISTS(SELECT 1 FROM names k WHERE"
        " k.object_id = n.object_id AND k.model_id NOT IN (SELECT id FROM temp.rm_models))"
        " FROM names n JOIN objects o ON o.id = n.object_id"
        " WHERE n.model_id IN (SELECT id FROM temp.rm_models)", -1, &s, NULL);
    *ids = NULL;
    *n = 0;
    *bytes = *shared = 0;
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "rm", err);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (sqlite3_column_int(s, 2)) {
            (*shared)++;
            continue;
        }
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            uint64_t *p = realloc(*ids, nc * sizeof *p);
            if (!p) {
                sqlite3_finalize(s);
                return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (rm)");
            }
            *ids = p;
            cap = nc;
        }
        (*ids)[(*n)++] = (uint64_t)sqlite3_column_int64(s, 0);
        *bytes += (uint64_t)sqlite3_column_int64(s, 1);
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "rm", err);
}

int cache_report_rm(cache *c, const char *spec, shoal_buf *out, shoal_err *err)
{
    report_models ms;
    uint64_t *ids = NULL, bytes = 0, shared = 0;
    size_t n = 0;
    shoal_json *root, *arr;
    int rc, jrc = 0;

    if ((rc = need_writer(c, "remove models", err)) != 0)
        return rc;
    if (!spec || !*spec)
        return shoal_err_set(err, SHOAL_EINVAL, "rm: which model? (`shoal ls` lists them)");
    if ((rc = report_models_find(c, spec, &ms, err)) != 0)
        return rc;
    /* pending counts of these models would come back at the next flush */
    rc = cache_flush(c, err);
    if (rc == 0)
        rc = rm_temp(c, &ms, err);
    if (rc == 0)
        rc = rm_objects(c, &ids, &n, &bytes, &shared, err);
    /* Objects first (rows, then blobs: invariant 7), then what named them. */
    if (rc == 0)
        rc = cache_objs_delete(c, ids, n, err);
    if (rc == 0 && (rc = cache_db_begin(c, err)) == 0) {
        rc = cache_db_exec(c,
            "DELETE FROM names WHERE model_id IN (SELECT id FROM temp.rm_models);"
            "DELETE FROM counters WHERE model IN (SELECT id FROM temp.rm_models);"
            "DELETE FROM files WHERE EXISTS (SELECT 1 FROM models m WHERE"
            " m.id IN (SELECT id FROM temp.rm_models) AND m.endpoint = files.endpoint"
            " AND m.repo = files.repo AND m.commit_id = files.commit_id) AND NOT EXISTS"
            " (SELECT 1 FROM models k WHERE k.id NOT IN (SELECT id FROM temp.rm_models)"
            " AND k.endpoint = files.endpoint AND k.repo = files.repo"
            " AND k.commit_id = files.commit_id);"
            "DELETE FROM models WHERE id IN (SELECT id FROM temp.rm_models)", err);
        rc = rc ? (cache_db_rollback(c), rc) : cache_db_commit(c, err);
    }
    free(ids);
    if (rc == 0)
        rc = cache_heat_load(c, err);   /* their counters are gone */
    if (rc) {
        report_models_free(&ms);
        return rc;
    }
    LOG_INFO(CACHE_TAG, "rm %s: %zu objects, %" PRIu64 " bytes", spec, n, bytes);
    root = report_header(&jrc, "shoal.rm", c, NULL);
    arr = shoal_json_array();
    for (size_t i = 0; i < ms.n; i++) {
        shoal_json *m = shoal_json_object();
        rj_set(&jrc, m, "repo", rj_str(ms.v[i].repo));
        rj_set(&jrc, m, "revision", rj_str(ms.v[i].revision));
        rj_set(&jrc, m, "commit", rj_str(ms.v[i].commit));
        rj_push(&jrc, arr, m);
    }
    rj_set(&jrc, root, "models", arr);
    rj_set(&jrc, root, "objects_removed", rj_u64(n));
    rj_set(&jrc, root, "bytes_freed", rj_u64(bytes));
    rj_set(&jrc, root, "objects_kept_shared", rj_u64(shared));
    report_models_free(&ms);
    return report_dump(root, jrc, out, err);
}

/* ---- pin ------------------------------------------------------------------------ */

int cache_model_pin(cache *c, const char *spec, int on, int32_t layer_first, int32_t layer_last,
                    uint64_t *changed, shoal_err *err)
{
    report_models ms;
    sqlite3_stmt *s = NULL;
    int rc;

    *changed = 0;
    if ((rc = need_writer(c, "pin", err)) != 0 ||
        (rc = report_models_find(c, spec, &ms, err)) != 0)
        return rc;
    if ((rc = rm_temp(c, &ms, err)) != 0)
        goto out;
    rc = sqlite3_prepare_v2(c->db, "SELECT DISTINCT o.etag, o.off, o.len FROM objects o"
        " JOIN names n ON n.object_id = o.id WHERE n.model_id IN (SELECT id FROM temp.rm_models)"
        " AND (?1 < 0 OR (o.kind = 0 AND n.layer BETWEEN ?1 AND ?2))", -1, &s, NULL);
    if (rc != SQLITE_OK) {
        rc = cache_db_fail(c, rc, "pin", err);
        goto out;
    }
    sqlite3_bind_int(s, 1, layer_first);
    sqlite3_bind_int(s, 2, layer_last);
    /* Collect first: pinning writes while this statement reads. */
    {
        typedef struct { char etag[CACHE_ETAG_MAX + 1]; uint64_t off, len; } pk;
        pk *v = NULL;
        size_t n = 0, cap = 0;
        while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 64;
                pk *p = realloc(v, nc * sizeof *p);
                if (!p)
                    break;
                v = p;
                cap = nc;
            }
            snprintf(v[n].etag, sizeof v[n].etag, "%s", (const char *)sqlite3_column_text(s, 0));
            v[n].off = (uint64_t)sqlite3_column_int64(s, 1);
            v[n].len = (uint64_t)sqlite3_column_int64(s, 2);
            n++;
        }
        sqlite3_finalize(s);
        if (rc != SQLITE_DONE)
            rc = rc == SQLITE_ROW ? shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (pin)")
                                  : cache_db_fail(c, rc, "pin", err);
        else
            rc = 0;
        for (size_t i = 0; rc == 0 && i < n; i++) {
            cache_key k = { v[i].etag, v[i].off, v[i].len };
            rc = cache_pin(c, &k, on, err);
            *changed += rc == 0;
        }
        free(v);
    }
out:
    report_models_free(&ms);
    return rc;
}
