/* read.c — lookups, pins, removal, listings and checksum verification.
 *
 * Owns: handing out a descriptor for a cached object (from memory in the
 * writer, by a prepared statement in a read-only handle), deleting objects
 * in the order invariant 7 asks for, and verify.  Does not own the counters
 * themselves (stats.c) or choosing what to evict (evict.c).
 */
#include "cache/cache_int.h"
#include "cache/report_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>
#include "common/xxh3.h"

#include "common/log.h"
#include "common/sys.h"

static int open_blob(const cache *c, uint64_t id)
{
    char name[32];
    cache_blob_name(name, sizeof name, id);
    return openat(c->blobs_fd, name, O_RDONLY | O_CLOEXEC);
}

static int lookup_ro(cache *c, const cache_key *key, cache_obj *out, shoal_err *err)
{
    sqlite3_stmt *s = c->st[ST_OBJ_GET];
    int rc;

    sqlite3_bind_text(s, 1, key->etag, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, (int64_t)key->offset);
    sqlite3_bind_int64(s, 3, (int64_t)key->length);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        out->id = (uint64_t)sqlite3_column_int64(s, 0);
        out->length = (uint64_t)sqlite3_column_int64(s, 1);
        out->kind = (cache_kind)sqlite3_column_int(s, 2);
        out->pinned = cache_pin_effective(sqlite3_column_int(s, 3), c->cfg.pin_kinds, out->kind);
        if (sqlite3_column_bytes(s, 4) == 16)
            memcpy(out->xxh128, sqlite3_column_blob(s, 4), 16);
    }
    sqlite3_reset(s);
    if (rc == SQLITE_DONE)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "not cached: %s [%" PRIu64 "+%" PRIu64 "]",
                             key->etag, key->offset, key->length);
    if (rc != SQLITE_ROW)
        return cache_db_fail(c, rc, "lookup", err);
    return 0;
}

int cache_lookup(cache *c, const cache_key *key, const cache_req *req, cache_obj *out,
                 shoal_err *err)
{
    int rc;
    uint32_t idx = CMAP_NONE;

    out->fd = -1;
    if ((rc = cache_key_check(key, err)) != 0)
        return rc;
    if (c->cfg.read_only) {
        rc = lookup_ro(c, key, out, err);
    } else {
        idx = cache_obj_find(c, key);
        if (idx == CMAP_NONE) {
            rc = shoal_err_set(err, SHOAL_ENOTFOUND, "not cached: %s [%" PRIu64 "+%" PRIu64 "]",
                               key->etag, key->offset, key->length);
        } else {
            const cobj *o = &c->objs[idx];
            out->id = o->id;
            out->length = o->len;
            out->kind = (cache_kind)o->kind;
            out->pinned = cache_obj_pinned(c, o);
            memcpy(out->xxh128, o->xxh, 16);
        }
    }
    if (rc == 0) {
        out->fd = open_blob(c, out->id);
        if (out->fd < 0) {
            /* Gone behind our back (someone removed the file): a miss; the
             * next repair or verify drops the row. */
            LOG_WARN(CACHE_TAG, "blob of object %" PRIu64 " cannot be opened: %s", out->id,
                     strerror(errno));
            rc = shoal_err_set(err, SHOAL_ENOTFOUND, "blob of %s missing", key->etag);
            idx = CMAP_NONE;
        }
    }
    if (req)
        cache_stats_add(c, req, rc == 0 ? CACHE_HIT : CACHE_MISS, 0, rc == 0 ? out->length : 0, 0);
    if (idx != CMAP_NONE && rc == 0)
        cache_stats_note_access(c, idx);
    return rc;
}

static int delete_rows(cache *c, const uint64_t *ids, size_t n, shoal_err *err)
{
    int rc = cache_db_begin(c, err);

    for (size_t i = 0; rc == 0 && i < n; i++) {
        sqlite3_stmt *s = c->st[ST_OBJ_DELETE], *m = c->st[ST_NAME_DELETE];
        sqlite3_bind_int64(s, 1, (int64_t)ids[i]);
        sqlite3_bind_int64(m, 1, (int64_t)ids[i]);
        int r1 = sqlite3_step(s), r2 = sqlite3_step(m);
        sqlite3_reset(s);
        sqlite3_reset(m);
        if (r1 != SQLITE_DONE || r2 != SQLITE_DONE)
            rc = cache_db_fail(c, r1 != SQLITE_DONE ? r1 : r2, "delete object", err);
    }
    if (rc == 0)
        return cache_db_commit(c, err);
    cache_db_rollback(c);
    return rc;
}

int cache_objs_delete(cache *c, const uint64_t *ids, size_t n, shoal_err *err)
{
    int rc, gave = 0;

    if (n == 0)
        return 0;
    rc = delete_rows(c, ids, n, err);
    if (rc == SHOAL_ENOSPC && cache_reserve_give(c) == 0) {
        /* The disk is full to the last block: spend the reserve on the
         * index write that frees space, take it back afterwards. */
        gave = 1;
        shoal_err_clear(err);
        rc = delete_rows(c, ids, n, err);
    }
    if (rc) {
        if (gave)
            cache_reserve_take(c);
        return rc;
    }
    /* Invariant 7: rows first, then blobs.  A crash in between leaves
     * orphan blobs, which the repair at open removes.  With the reserve
     * given away the blobs go now, so it can be taken back. */
    for (size_t i = 0; i < n; i++) {
        char path[SHOAL_PATH_MAX];
        uint32_t idx = cache_obj_by_id(c, ids[i]);
        if (idx != CMAP_NONE)
            cache_obj_drop(c, idx);
        if (cache_blob_path(c, ids[i], path, sizeof path) != 0)
            continue;
        if (!gave)
            cache_unlink_later(c, path);
        else if (cache_io_now.unlink(path) != 0 && errno != ENOENT)
            LOG_WARN(CACHE_TAG, "unlink %s: %s", path, strerror(errno));
    }
    if (gave)
        cache_reserve_take(c);
    return 0;
}

void cache_set_unlinker(cache *c, cache_unlink_fn fn, void *ctx)
{
    c->unlink_fn = fn;
    c->unlink_ctx = ctx;
}

void cache_set_commit_hook(cache *c, cache_commit_fn fn, void *ctx)
{
    c->commit_fn = fn;
    c->commit_ctx = ctx;
}

void cache_unlink_later(cache *c, const char *path)
{
    if (c->unlink_fn) {
        c->unlink_fn(path, c->unlink_ctx);
        return;
    }
    if (cache_io_now.unlink(path) != 0 && errno != ENOENT)
        LOG_WARN(CACHE_TAG, "unlink %s: %s", path, strerror(errno));
}

int cache_lookup_length(cache *c, const char *etag, uint64_t offset, uint64_t *length,
                        shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT len FROM objects WHERE etag = ?1 AND off = ?2"
                                " ORDER BY len LIMIT 1", -1, &s, NULL);
    *length = 0;
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "lookup length", err);
    sqlite3_bind_text(s, 1, etag, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, (int64_t)offset);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        *length = (uint64_t)sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (rc == SQLITE_DONE)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "not cached: %s [%" PRIu64 "+?]", etag, offset);
    return rc == SQLITE_ROW ? 0 : cache_db_fail(c, rc, "lookup length", err);
}

static int need_writer(const cache *c, const char *what, shoal_err *err)
{
    return c->cfg.read_only ? shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only: "
                                            "cannot %s", c->dir, what) : 0;
}

int cache_remove(cache *c, const cache_key *key, shoal_err *err)
{
    int rc;
    uint32_t idx;

    if ((rc = cache_key_check(key, err)) != 0 || (rc = need_writer(c, "remove", err)) != 0)
        return rc;
    idx = cache_obj_find(c, key);
    if (idx == CMAP_NONE)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "not cached: %s", key->etag);
    uint64_t id = c->objs[idx].id;
    return cache_objs_delete(c, &id, 1, err);
}

int cache_pin(cache *c, const cache_key *key, int on, shoal_err *err)
{
    int rc, r;
    uint32_t idx;
    sqlite3_stmt *s = c->st[ST_OBJ_PIN];

    if ((rc = cache_key_check(key, err)) != 0 || (rc = need_writer(c, "pin", err)) != 0)
        return rc;
    idx = cache_obj_find(c, key);
    if (idx == CMAP_NONE)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "not cached: %s", key->etag);
    /* unpinning leaves a lifted kind pin lifted */
    int v = on ? CACHE_PINNED_YES : c->objs[idx].pinned == CACHE_PINNED_LIFTED
                                        ? CACHE_PINNED_LIFTED : CACHE_PINNED_KIND;
    sqlite3_bind_int64(s, 1, (int64_t)c->objs[idx].id);
    sqlite3_bind_int(s, 2, v);
    r = sqlite3_step(s);
    sqlite3_reset(s);
    if (r != SQLITE_DONE)
        return cache_db_fail(c, r, "pin", err);
    c->objs[idx].pinned = (uint8_t)v;
    return 0;
}

int cache_names_add(cache *c, const cache_key *key, const cache_names *names, shoal_err *err)
{
    int rc;
    uint32_t idx;

    if ((rc = cache_key_check(key, err)) != 0 || (rc = need_writer(c, "name objects", err)) != 0)
        return rc;
    idx = cache_obj_find(c, key);
    if (idx == CMAP_NONE)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "not cached: %s", key->etag);
    if ((rc = cache_db_begin(c, err)) != 0)
        return rc;
    rc = cache_names_insert(c, c->objs[idx].id, names, err);
    if (rc == 0)
        return cache_db_commit(c, err);
    cache_db_rollback(c);
    return rc;
}

int cache_list(cache *c, int64_t model, cache_entry_fn fn, void *ctx, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc, r = 0;

    if (!c->cfg.read_only && (rc = cache_flush(c, err)) != 0)
        return rc;
    rc = sqlite3_prepare_v2(c->db,
        "SELECT o.id, o.etag, o.off, o.len, o.kind, o.pinned, coalesce(n.model_id, 0),"
        " coalesce(n.file, ''), coalesce(n.tensor, ''), coalesce(n.layer, o.layer),"
        " coalesce(n.expert, o.expert), o.last_access_ms, o.hits"
        " FROM objects o LEFT JOIN names n ON n.object_id = o.id"
        " WHERE ?1 = 0 OR n.model_id = ?1 ORDER BY o.id", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "list", err);
    sqlite3_bind_int64(s, 1, model);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cache_entry e;
        e.id = (uint64_t)sqlite3_column_int64(s, 0);
        e.etag = (const char *)sqlite3_column_text(s, 1);
        e.offset = (uint64_t)sqlite3_column_int64(s, 2);
        e.length = (uint64_t)sqlite3_column_int64(s, 3);
        e.kind = (cache_kind)sqlite3_column_int(s, 4);
        e.pinned = cache_pin_effective(sqlite3_column_int(s, 5), c->cfg.pin_kinds, e.kind);
        e.model = sqlite3_column_int64(s, 6);
        e.file = (const char *)sqlite3_column_text(s, 7);
        e.tensor = (const char *)sqlite3_column_text(s, 8);
        e.layer = sqlite3_column_int(s, 9);
        e.expert = sqlite3_column_int(s, 10);
        e.last_access_ms = sqlite3_column_int64(s, 11);
        e.hits = (uint64_t)sqlite3_column_int64(s, 12);
        if ((r = fn(&e, ctx)) != 0)
            break;
    }
    sqlite3_finalize(s);
    if (r)
        return r;
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "list", err);
}

/* ---- verify ----------------------------------------------------------------------
 * The scan reads the object list (id, len, xxh) in one query and then the
 * blobs, holding no statement while it hashes, so it works on any handle
 * and a worker's long scan never pins an old snapshot of the index.  The
 * removal is the writer's, one transaction per call. */

typedef struct vobj {
    uint64_t id, len;
    uint8_t  xxh[16];
} vobj;

#define VERIFY_CHUNK (1u << 20)

/* Hash one blob: 0 good, 1 bad (wrong size or checksum), 2 missing. */
static int verify_one(cache *c, const vobj *o, uint8_t *buf, uint64_t *bytes)
{
    XXH3_state_t *xs = shoal_xxh3_new();
    XXH128_canonical_t can;
    uint64_t at = 0;
    int fd = open_blob(c, o->id), bad = 0;

    if (fd < 0 || !xs) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        shoal_xxh3_free(xs);
        return fd < 0 && e == ENOENT ? 2 : 1;
    }
    shoal_xxh3_reset(xs);
    for (;;) {
        ssize_t k = pread(fd, buf, VERIFY_CHUNK, (off_t)at);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            bad = k < 0;
            break;
        }
        shoal_xxh3_update(xs, buf, (size_t)k);
        at += (uint64_t)k;
    }
    close(fd);
    *bytes += at;
    shoal_xxh3_digest(xs, can.digest);
    shoal_xxh3_free(xs);
    if (bad || at != o->len || memcmp(can.digest, o->xxh, 16) != 0)
        return 1;
    return 0;
}

/* The objects of `model` (0: all), from the index, in one query. */
static int verify_list(cache *c, int64_t model, vobj **out, size_t *n, uint64_t *total,
                       shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    vobj *v = NULL;
    size_t cap = 0;
    int rc = sqlite3_prepare_v2(c->db, model
        ? "SELECT id, len, xxh FROM objects WHERE id IN"
          " (SELECT object_id FROM names WHERE model_id = ?1) ORDER BY id"
        : "SELECT id, len, xxh FROM objects ORDER BY id", -1, &s, NULL);
    *out = NULL;
    *n = 0;
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "verify", err);
    if (model)
        sqlite3_bind_int64(s, 1, model);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            vobj *p = realloc(v, nc * sizeof *p);
            if (!p) {
                free(v);
                sqlite3_finalize(s);
                return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (verify)");
            }
            v = p;
            cap = nc;
        }
        v[*n].id = (uint64_t)sqlite3_column_int64(s, 0);
        v[*n].len = (uint64_t)sqlite3_column_int64(s, 1);
        memset(v[*n].xxh, 0, 16);
        if (sqlite3_column_bytes(s, 2) == 16)
            memcpy(v[*n].xxh, sqlite3_column_blob(s, 2), 16);
        *total += v[*n].len;
        (*n)++;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE) {
        free(v);
        return cache_db_fail(c, rc, "verify", err);
    }
    *out = v;
    return 0;
}

static int list_push(cache_verify_list *l, uint64_t id, int missing)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        uint64_t *p = realloc(l->ids, nc * sizeof *p);
        uint8_t *q;
        if (!p)
            return SHOAL_ENOMEM;
        l->ids = p;
        q = realloc(l->missing, nc);
        if (!q)
            return SHOAL_ENOMEM;
        l->missing = q;
        l->cap = nc;
    }
    l->ids[l->n] = id;
    l->missing[l->n++] = (uint8_t)missing;
    return 0;
}

void cache_verify_list_free(cache_verify_list *l)
{
    if (!l)
        return;
    free(l->ids);
    free(l->missing);
    memset(l, 0, sizeof *l);
}

/* Scan the objects of one model (0: all) into rep and bad; *base: bytes
 * hashed by earlier calls (progress runs over the whole scan). */
static int scan_model(cache *c, int64_t model, cache_verify_report *rep, cache_verify_list *bad,
                      cache_progress_fn fn, void *ctx, uint64_t total, uint64_t *base,
                      shoal_err *err)
{
    vobj *v = NULL;
    size_t n = 0;
    uint64_t ignored = 0;
    uint8_t *buf = malloc(VERIFY_CHUNK);
    int rc = buf ? verify_list(c, model, &v, &n, &ignored, err)
                 : shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (verify)");

    for (size_t i = 0; rc == 0 && i < n; i++) {
        int r = verify_one(c, &v[i], buf, &rep->bytes);
        rep->checked++;
        *base += v[i].len;
        if (r) {
            LOG_ERROR(CACHE_TAG, "verify: object %" PRIu64 " (%" PRIu64 " bytes) %s", v[i].id,
                      v[i].len, r == 2 ? "has no blob" : "is corrupt");
            if (r == 2)
                rep->missing++;
            else
                rep->bad++;
            if (list_push(bad, v[i].id, r == 2) != 0)
                rc = shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (verify)");
        }
        if (rc == 0 && fn && fn(ctx, *base, total) != 0)
            rc = shoal_err_set(err, SHOAL_ECANCELED, "verify stopped");
    }
    free(v);
    free(buf);
    return rc;
}

int cache_verify_scan(cache *c, const char *spec, cache_verify_report *rep,
                      cache_verify_list *bad, cache_progress_fn fn, void *ctx, shoal_err *err)
{
    report_models ms;
    uint64_t total = 0, base = 0;
    int rc;

    if (!spec || !*spec) {
        /* The total first (one aggregate query) so progress has a scale. */
        sqlite3_stmt *s = NULL;
        if (sqlite3_prepare_v2(c->db, "SELECT coalesce(sum(len), 0) FROM objects", -1, &s,
                               NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
            total = (uint64_t)sqlite3_column_int64(s, 0);
        sqlite3_finalize(s);
        return scan_model(c, 0, rep, bad, fn, ctx, total, &base, err);
    }
    if ((rc = report_models_find(c, spec, &ms, err)) != 0)
        return rc;
    for (size_t i = 0; rc == 0 && i < ms.n; i++) {
        vobj *v = NULL;
        size_t n = 0;
        rc = verify_list(c, ms.v[i].id, &v, &n, &total, err);
        free(v);
    }
    for (size_t i = 0; rc == 0 && i < ms.n; i++)
        rc = scan_model(c, ms.v[i].id, rep, bad, fn, ctx, total, &base, err);
    report_models_free(&ms);
    return rc;
}

int cache_verify_remove(cache *c, const cache_verify_list *bad, size_t from, size_t n,
                        uint64_t *gone_bad, uint64_t *gone_missing, shoal_err *err)
{
    uint64_t *ids;
    size_t k = 0;
    int rc;

    if ((rc = need_writer(c, "verify", err)) != 0)
        return rc;
    if (from > bad->n || n > bad->n - from)
        n = from > bad->n ? 0 : bad->n - from;
    if (n == 0)
        return 0;
    if (!(ids = malloc(n * sizeof *ids)))
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (verify)");
    for (size_t i = from; i < from + n; i++) {
        if (cache_obj_by_id(c, bad->ids[i]) != CMAP_NONE) {
            LOG_ERROR(CACHE_TAG, "verify: removing object %" PRIu64 " (%s)", bad->ids[i],
                      bad->missing[i] ? "no blob" : "corrupt");
            ids[k++] = bad->ids[i];
        } else if (bad->missing[i] && gone_missing) {
            (*gone_missing)++;   /* evicted after the scan listed it */
        } else if (!bad->missing[i] && gone_bad) {
            (*gone_bad)++;
        }
    }
    rc = cache_objs_delete(c, ids, k, err);
    free(ids);
    return rc;
}

int cache_verify(cache *c, int64_t model, cache_verify_report *rep, shoal_err *err)
{
    cache_verify_list bad = { 0 };
    uint64_t total = 0, base = 0, gb = 0, gm = 0;
    int rc;

    memset(rep, 0, sizeof *rep);
    if ((rc = need_writer(c, "verify", err)) != 0)
        return rc;
    rc = scan_model(c, model, rep, &bad, NULL, NULL, total, &base, err);
    if (rc == 0)
        rc = cache_verify_remove(c, &bad, 0, bad.n, &gb, &gm, err);
    rep->bad -= gb;
    rep->missing -= gm;
    cache_verify_list_free(&bad);
    return rc;
}
