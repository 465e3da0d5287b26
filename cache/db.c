/* db.c — the SQLite index: schema, pragmas, prepared statements.
 *
 * Owns: index.db's tables (annotated in docs/cache-format.md), the
 * statements the hot paths reuse, and mapping SQLite failures to shoal
 * codes.  Does not own what the rows mean (open.c, write.c, stats.c).
 *
 * WAL with synchronous=NORMAL: a commit does not wait for an fsync; a power
 * loss may drop the last transactions, which repair at open tolerates
 * (a blob without a row is removed).  A process crash loses nothing.  Only
 * checkpoints sync; with manual_wal_checkpoint the writer's thread never
 * runs one (cache_wal_checkpoint, from another thread, does).
 */
#include "cache/cache_int.h"

#include <string.h>

#define CACHE_SCHEMA_VERSION "1"

static const char schema_sql[] =
    "CREATE TABLE IF NOT EXISTS meta("
    " key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS objects("
    " id INTEGER PRIMARY KEY, etag TEXT NOT NULL, off INTEGER NOT NULL,"
    " len INTEGER NOT NULL, kind INTEGER NOT NULL, layer INTEGER NOT NULL,"
    " expert INTEGER NOT NULL, xxh BLOB NOT NULL, pinned INTEGER NOT NULL,"
    " created_ms INTEGER NOT NULL, last_access_ms INTEGER NOT NULL,"
    " hits INTEGER NOT NULL, UNIQUE(etag, off, len));"
    "CREATE TABLE IF NOT EXISTS names("
    " object_id INTEGER NOT NULL, model_id INTEGER NOT NULL,"
    " file TEXT NOT NULL, tensor TEXT NOT NULL, layer INTEGER NOT NULL,"
    " expert INTEGER NOT NULL,"
    " PRIMARY KEY(object_id, model_id, file, tensor)) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS names_model ON names(model_id, layer, expert);"
    "CREATE TABLE IF NOT EXISTS partials("
    " id INTEGER PRIMARY KEY, etag TEXT NOT NULL, off INTEGER NOT NULL,"
    " len INTEGER NOT NULL, kind INTEGER NOT NULL, durable INTEGER NOT NULL,"
    " started_ms INTEGER NOT NULL, UNIQUE(etag, off, len));"
    "CREATE TABLE IF NOT EXISTS models("
    " id INTEGER PRIMARY KEY, endpoint TEXT NOT NULL, repo TEXT NOT NULL,"
    " revision TEXT NOT NULL, commit_id TEXT NOT NULL,"
    " resolved_ms INTEGER NOT NULL,"
    " UNIQUE(endpoint, repo, revision, commit_id));"
    "CREATE TABLE IF NOT EXISTS files("
    " endpoint TEXT NOT NULL, repo TEXT NOT NULL, commit_id TEXT NOT NULL,"
    " path TEXT NOT NULL, etag TEXT NOT NULL, size INTEGER NOT NULL,"
    " location TEXT NOT NULL, location_expires_ms INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL,"
    " PRIMARY KEY(endpoint, repo, commit_id, path)) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS sessions("
    " id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, program TEXT NOT NULL,"
    " started_ms INTEGER NOT NULL, ended_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS counters("
    " session INTEGER NOT NULL, model INTEGER NOT NULL, layer INTEGER NOT NULL,"
    " expert INTEGER NOT NULL, tier INTEGER NOT NULL,"
    " hits INTEGER NOT NULL, misses INTEGER NOT NULL, joins INTEGER NOT NULL,"
    " bytes_in INTEGER NOT NULL, bytes_out INTEGER NOT NULL,"
    " wait_ns INTEGER NOT NULL,"
    " PRIMARY KEY(session, model, layer, expert, tier)) WITHOUT ROWID;"
    /* Whole-file checks that failed (deep.c): a file whose bytes did not
     * hash to its etag, its objects quarantined (removed) and re-fetched.
     * state 1: checked ok since, 2: still bad. */
    "CREATE TABLE IF NOT EXISTS file_checks("
    " etag TEXT PRIMARY KEY, path TEXT NOT NULL, size INTEGER NOT NULL,"
    " state INTEGER NOT NULL, failures INTEGER NOT NULL,"
    " quarantined_bytes INTEGER NOT NULL, checked_ms INTEGER NOT NULL) WITHOUT ROWID;"
    "INSERT OR IGNORE INTO meta(key, value) VALUES('schema', '" CACHE_SCHEMA_VERSION "');";

static const char *const stmt_sql[ST_COUNT_] = {
    [ST_OBJ_GET] = "SELECT id, len, kind, pinned, xxh FROM objects"
                   " WHERE etag=?1 AND off=?2 AND len=?3",
    [ST_OBJ_INSERT] = "INSERT INTO objects(id, etag, off, len, kind, layer, expert, xxh,"
                      " pinned, created_ms, last_access_ms, hits)"
                      " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?10,0)",
    [ST_OBJ_DELETE] = "DELETE FROM objects WHERE id=?1",
    [ST_OBJ_ACCESS] = "UPDATE objects SET last_access_ms=max(last_access_ms, ?2),"
                      " hits=hits+?3 WHERE id=?1",
    [ST_OBJ_PIN] = "UPDATE objects SET pinned=?2 WHERE id=?1",
    [ST_NAME_INSERT] = "INSERT OR IGNORE INTO names(object_id, model_id, file, tensor,"
                       " layer, expert) VALUES(?1,?2,?3,?4,?5,?6)",
    [ST_NAME_DELETE] = "DELETE FROM names WHERE object_id=?1",
    [ST_PART_GET] = "SELECT id, durable FROM partials WHERE etag=?1 AND off=?2 AND len=?3",
    [ST_PART_PUT] = "INSERT INTO partials(id, etag, off, len, kind, durable, started_ms)"
                    " VALUES(?1,?2,?3,?4,?5,?6,?7)"
                    " ON CONFLICT(id) DO UPDATE SET durable=excluded.durable",
    [ST_PART_DELETE] = "DELETE FROM partials WHERE id=?1",
    [ST_MODEL_PUT] = "INSERT INTO models(endpoint, repo, revision, commit_id, resolved_ms)"
                     " VALUES(?1,?2,?3,?4,?5) ON CONFLICT(endpoint, repo, revision, commit_id)"
                     " DO UPDATE SET resolved_ms=max(resolved_ms, excluded.resolved_ms)",
    [ST_MODEL_ID] = "SELECT id FROM models WHERE endpoint=?1 AND repo=?2 AND revision=?3"
                    " AND commit_id=?4",
    [ST_COUNT_UPSERT] = "INSERT INTO counters(session, model, layer, expert, tier, hits,"
                        " misses, joins, bytes_in, bytes_out, wait_ns)"
                        " VALUES(?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)"
                        " ON CONFLICT(session, model, layer, expert, tier) DO UPDATE SET hits=hits+excluded.hits,"
                        " misses=misses+excluded.misses, joins=joins+excluded.joins,"
                        " bytes_in=bytes_in+excluded.bytes_in,"
                        " bytes_out=bytes_out+excluded.bytes_out,"
                        " wait_ns=wait_ns+excluded.wait_ns",
};

int cache_db_fail(cache *c, int rc, const char *what, shoal_err *err)
{
    int code;
    int prim = rc & 0xff;

    switch (prim) {
    case SQLITE_FULL:     code = SHOAL_ENOSPC; break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:   code = SHOAL_EBUSY; break;
    case SQLITE_NOMEM:    code = SHOAL_ENOMEM; break;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:   code = SHOAL_ECORRUPT; break;
    case SQLITE_CANTOPEN: code = SHOAL_ENOTFOUND; break;
    case SQLITE_CONSTRAINT: code = SHOAL_EEXIST; break;
    default:              code = SHOAL_EIO; break;
    }
    return shoal_err_set(err, code, "cache index (%s): %s: %s", c->dir, what,
                         c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc));
}

int cache_db_exec(cache *c, const char *sql, shoal_err *err)
{
    int rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);
    return rc == SQLITE_OK ? 0 : cache_db_fail(c, rc, "exec", err);
}

int cache_db_begin(cache *c, shoal_err *err)
{
    return cache_db_exec(c, "BEGIN IMMEDIATE", err);
}

int cache_db_commit(cache *c, shoal_err *err)
{
    int rc = cache_db_exec(c, "COMMIT", err);
    if (rc)
        cache_db_rollback(c);
    return rc;
}

void cache_db_rollback(cache *c)
{
    if (!sqlite3_get_autocommit(c->db))
        sqlite3_exec(c->db, "ROLLBACK", NULL, NULL, NULL);
}

/* objects.verified (1: the object's bytes were part of a whole-file
 * check that matched its upstream hash; deep.c), added to an index made
 * before it existed.  The schema version stays 1: older readers ignore
 * the column. */
static int add_verified_column(cache *c, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int have = 0, rc = sqlite3_prepare_v2(c->db, "PRAGMA table_info(objects)", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "read the objects table's columns", err);
    while (sqlite3_step(s) == SQLITE_ROW)
        have |= strcmp((const char *)sqlite3_column_text(s, 1), "verified") == 0;
    sqlite3_finalize(s);
    return have ? 0 : cache_db_exec(c, "ALTER TABLE objects ADD COLUMN verified INTEGER"
                                       " NOT NULL DEFAULT 0", err);
}

int cache_db_open(cache *c, const char *path, int read_only, shoal_err *err)
{
    /* A side handle checkpoints the WAL: a read-write connection that
     * never creates or migrates anything (the writer did). */
    int flags = read_only == CACHE_OPEN_READER ? SQLITE_OPEN_READONLY
                : read_only ? SQLITE_OPEN_READWRITE
                            : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    int rc = sqlite3_open_v2(path, &c->db, flags | SQLITE_OPEN_NOMUTEX, NULL);

    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "open", err);
    sqlite3_busy_timeout(c->db, 5000);
    if (!read_only) {
        rc = cache_db_exec(c, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", err);
        if (rc == 0 && c->cfg.manual_wal_checkpoint)
            rc = cache_db_exec(c, "PRAGMA wal_autocheckpoint=0", err);
        if (rc == 0)
            rc = cache_db_exec(c, schema_sql, err);
        if (rc == 0)
            rc = add_verified_column(c, err);
        if (rc)
            return rc;
    }
    {
        /* A readonly open of an index with no tables yet is an error the
         * caller should see now, not at the first query. */
        sqlite3_stmt *s = NULL;
        rc = sqlite3_prepare_v2(c->db, "SELECT value FROM meta WHERE key='schema'", -1, &s, NULL);
        if (rc != SQLITE_OK)
            return cache_db_fail(c, rc, "read schema version", err);
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW && strcmp((const char *)sqlite3_column_text(s, 0),
                                       CACHE_SCHEMA_VERSION) != 0) {
            sqlite3_finalize(s);
            return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                                 "cache index %s has an unknown schema version", path);
        }
        sqlite3_finalize(s);
    }
    for (int i = 0; i < ST_COUNT_; i++) {
        /* Read-only handles skip statements that write. */
        if (read_only && i != ST_OBJ_GET && i != ST_PART_GET && i != ST_MODEL_ID)
            continue;
        rc = sqlite3_prepare_v3(c->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &c->st[i], NULL);
        if (rc != SQLITE_OK)
            return cache_db_fail(c, rc, "prepare", err);
    }
    return 0;
}

int cache_wal_checkpoint(cache *c, shoal_err *err)
{
    int rc;
    if (c->cfg.read_only == CACHE_OPEN_READER)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only: cannot checkpoint",
                             c->dir);
    rc = sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
    return rc == SQLITE_OK ? 0 : cache_db_fail(c, rc, "checkpoint", err);
}

void cache_db_close(cache *c)
{
    for (int i = 0; i < ST_COUNT_; i++) {
        sqlite3_finalize(c->st[i]);
        c->st[i] = NULL;
    }
    if (c->db)
        sqlite3_close(c->db);
    c->db = NULL;
}
