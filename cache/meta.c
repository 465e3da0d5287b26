/* meta.c — upstream metadata kept in the index: models and files.
 *
 * Owns: the `models` table (which commit a revision resolved to, and the
 * model ids counters and names refer to), the `files` table (etag, size,
 * CDN location and its expiry per file and commit, for the fetcher), and
 * the `names` rows that make objects findable.  Does not own resolving
 * anything (fetcher/).  Models and files are plain rows nobody holds in
 * memory, so a side handle (a worker thread's, cache.h "Threads") may
 * record them too.
 */
#include "cache/cache_int.h"

#include <string.h>

#include "common/sys.h"

static const char *or_empty(const char *s)
{
    return s ? s : "";
}

static int copy_col(char *dst, size_t cap, sqlite3_stmt *s, int col, shoal_err *err)
{
    const char *v = (const char *)sqlite3_column_text(s, col);
    size_t n = v ? strlen(v) : 0;
    if (n >= cap)
        return shoal_err_set(err, SHOAL_ETOOBIG, "cache index value of %zu bytes too long", n);
    memcpy(dst, v ? v : "", n + 1);
    return 0;
}

static int upsert_model(cache *c, const char *endpoint, const char *repo, const char *revision,
                        const char *commit, int64_t *id, shoal_err *err)
{
    sqlite3_stmt *p = c->st[ST_MODEL_PUT], *q = c->st[ST_MODEL_ID];
    const char *v[4] = { or_empty(endpoint), or_empty(repo), or_empty(revision), or_empty(commit) };
    int r;

    for (int i = 0; i < 4; i++) {
        if (strlen(v[i]) >= CACHE_STR_MAX)
            return shoal_err_set(err, SHOAL_ETOOBIG, "cache: model name field too long");
        sqlite3_bind_text(p, i + 1, v[i], -1, SQLITE_STATIC);
        sqlite3_bind_text(q, i + 1, v[i], -1, SQLITE_STATIC);
    }
    sqlite3_bind_int64(p, 5, shoal_wall_ms());
    r = sqlite3_step(p);
    sqlite3_reset(p);
    if (r != SQLITE_DONE)
        return cache_db_fail(c, r, "record model", err);
    r = sqlite3_step(q);
    if (r == SQLITE_ROW)
        *id = sqlite3_column_int64(q, 0);
    sqlite3_reset(q);
    return r == SQLITE_ROW ? 0 : cache_db_fail(c, r, "model id", err);
}

int cache_model_id(cache *c, const cache_names *names, int64_t *id, shoal_err *err)
{
    *id = 0;
    if (!names || !names->repo)
        return 0;
    return upsert_model(c, names->endpoint, names->repo, names->revision, names->commit, id, err);
}

int cache_names_insert(cache *c, uint64_t id, const cache_names *names, shoal_err *err)
{
    sqlite3_stmt *s = c->st[ST_NAME_INSERT];
    int64_t model;
    int rc, r;

    if (!names)
        return 0;
    if ((rc = cache_model_id(c, names, &model, err)) != 0)
        return rc;
    if (!model && !names->file && !names->tensor && names->layer < 0)
        return 0;
    sqlite3_bind_int64(s, 1, (int64_t)id);
    sqlite3_bind_int64(s, 2, model);
    sqlite3_bind_text(s, 3, or_empty(names->file), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, or_empty(names->tensor), -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 5, names->layer);
    sqlite3_bind_int(s, 6, names->expert);
    r = sqlite3_step(s);
    sqlite3_reset(s);
    return r == SQLITE_DONE ? 0 : cache_db_fail(c, r, "insert names", err);
}

int cache_model_put(cache *c, const char *endpoint, const char *repo, const char *revision,
                    const char *commit, int64_t *id, shoal_err *err)
{
    int64_t local;
    if (c->cfg.read_only == CACHE_OPEN_READER)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only", c->dir);
    if (!repo || !*repo || !revision || !commit)
        return shoal_err_set(err, SHOAL_EINVAL, "cache_model_put: repo, revision and commit are needed");
    return upsert_model(c, endpoint, repo, revision, commit, id ? id : &local, err);
}

int cache_model_get(cache *c, const char *endpoint, const char *repo, const char *revision,
                    cache_model *out, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT id, endpoint, repo, revision, commit_id, resolved_ms"
                                " FROM models WHERE endpoint=?1 AND repo=?2 AND revision=?3"
                                " ORDER BY resolved_ms DESC, id DESC LIMIT 1", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "model get", err);
    sqlite3_bind_text(s, 1, or_empty(endpoint), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, or_empty(repo), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, or_empty(revision), -1, SQLITE_STATIC);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        out->id = sqlite3_column_int64(s, 0);
        out->resolved_ms = sqlite3_column_int64(s, 5);
        rc = copy_col(out->endpoint, sizeof out->endpoint, s, 1, err);
        if (rc == 0) rc = copy_col(out->repo, sizeof out->repo, s, 2, err);
        if (rc == 0) rc = copy_col(out->revision, sizeof out->revision, s, 3, err);
        if (rc == 0) rc = copy_col(out->commit, sizeof out->commit, s, 4, err);
    } else if (rc == SQLITE_DONE) {
        rc = shoal_err_set(err, SHOAL_ENOTFOUND, "no commit recorded for %s@%s", or_empty(repo),
                           or_empty(revision));
    } else {
        rc = cache_db_fail(c, rc, "model get", err);
    }
    sqlite3_finalize(s);
    return rc;
}

int cache_file_put(cache *c, const cache_file *f, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc;

    if (c->cfg.read_only == CACHE_OPEN_READER)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only", c->dir);
    if (!f->repo[0] || !f->commit[0] || !f->path[0])
        return shoal_err_set(err, SHOAL_EINVAL, "cache_file_put: repo, commit and path are needed");
    rc = sqlite3_prepare_v2(c->db, "INSERT OR REPLACE INTO files(endpoint, repo, commit_id, path,"
                            " etag, size, location, location_expires_ms, updated_ms)"
                            " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9)", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "file put", err);
    sqlite3_bind_text(s, 1, f->endpoint, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, f->repo, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, f->commit, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, f->path, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 5, f->etag, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 6, (int64_t)f->size);
    sqlite3_bind_text(s, 7, f->location, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 8, f->location_expires_ms);
    sqlite3_bind_int64(s, 9, shoal_wall_ms());
    rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "file put", err);
}

int cache_file_get(cache *c, const char *endpoint, const char *repo, const char *commit,
                   const char *path, cache_file *out, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT endpoint, repo, commit_id, path, etag, size,"
                                " location, location_expires_ms, updated_ms FROM files"
                                " WHERE endpoint=?1 AND repo=?2 AND commit_id=?3 AND path=?4",
                                -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "file get", err);
    sqlite3_bind_text(s, 1, or_empty(endpoint), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, or_empty(repo), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, or_empty(commit), -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, or_empty(path), -1, SQLITE_STATIC);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        memset(out, 0, sizeof *out);
        rc = copy_col(out->endpoint, sizeof out->endpoint, s, 0, err);
        if (rc == 0) rc = copy_col(out->repo, sizeof out->repo, s, 1, err);
        if (rc == 0) rc = copy_col(out->commit, sizeof out->commit, s, 2, err);
        if (rc == 0) rc = copy_col(out->path, sizeof out->path, s, 3, err);
        if (rc == 0) rc = copy_col(out->etag, sizeof out->etag, s, 4, err);
        if (rc == 0) rc = copy_col(out->location, sizeof out->location, s, 6, err);
        out->size = (uint64_t)sqlite3_column_int64(s, 5);
        out->location_expires_ms = sqlite3_column_int64(s, 7);
        out->updated_ms = sqlite3_column_int64(s, 8);
    } else if (rc == SQLITE_DONE) {
        rc = shoal_err_set(err, SHOAL_ENOTFOUND, "no record of %s in %s@%s", or_empty(path),
                           or_empty(repo), or_empty(commit));
    } else {
        rc = cache_db_fail(c, rc, "file get", err);
    }
    sqlite3_finalize(s);
    return rc;
}
