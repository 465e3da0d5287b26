/* deep.c — whole-file verification: a file whose every byte is cached is
 * hashed in order and compared with its upstream etag.
 *
 * Owns: coverage of a file by its cached ranges, the sha256 (LFS) and git
 * blob sha1 (small files) checks; the automatic per-file check shoald runs
 * when a file completes (cache_file_check_run), its records (objects'
 * verified flag, file_checks) and the integrity figures.  A shard is covered when its header
 * range [0, 8+N) (stored at OPEN as a small-file object, docs/fetcher.md),
 * its tensors and experts, and any bytes of tensors outside the language
 * model are cached.  Does not own per-object checksums (read.c's verify)
 * nor removing anything in `verify --deep`: a whole-file mismatch cannot say
 * which range is wrong, so it is reported (and handed to the on_bad hook);
 * cache_file_quarantine removes a mismatched file's objects when shoald
 * asks (it then fetches them again).
 *
 * Two passes, so a long check never holds an index snapshot: first every
 * file of the matching models and its ranges are read (short queries, the
 * statements finalized), then the complete files are hashed with progress
 * over their total size.
 */
#include "cache/cache_int.h"
#include "cache/report_int.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sys.h"

#define DEEP_CHUNK (1u << 20)

typedef struct range {
    uint64_t id, off, len;
} range;

typedef struct deep_ctx {
    cache *c;
    cache_deep_report *rep;
    shoal_buf *bad_files;
    const cache_deep_opts *o;
    uint8_t *buf;
    uint64_t total, done;               /* bytes of the complete files */
    char (*seen)[CACHE_ETAG_MAX + 1];   /* etags already listed */
    size_t nseen, capseen;
} deep_ctx;

/* A file to check: what the first pass found. */
typedef struct dfile {
    char    *path;
    char     etag[CACHE_ETAG_MAX + 1];
    uint64_t size;
    range   *v;                         /* its ranges in offset order */
    size_t   n;
} dfile;

typedef struct dlist {
    dfile *v;
    size_t n, cap;
} dlist;

/* The etag as a hash: 64 hex = sha256, 40 hex = git blob sha1, else 0.
 * Quotes and a weak marker ("W/") are not part of it. */
static int etag_hash(const char *etag, char *hex, size_t cap)
{
    size_t n;
    if (strncmp(etag, "W/", 2) == 0)
        etag += 2;
    if (*etag == '"')
        etag++;
    n = strcspn(etag, "\"");
    if ((n != 64 && n != 40) || n >= cap)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (!isxdigit((unsigned char)etag[i]))
            return 0;
        hex[i] = (char)tolower((unsigned char)etag[i]);
    }
    hex[n] = 0;
    return (int)n;
}

/* The file's ranges in offset order; *complete when they cover [0, size). */
static int file_ranges(cache *c, const char *etag, uint64_t size, range **out, size_t *n,
                       int *complete, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    range *v = NULL;
    size_t cap = 0;
    uint64_t pos = 0;
    int rc = sqlite3_prepare_v2(c->db, "SELECT id, off, len FROM objects WHERE etag = ?1"
                                " ORDER BY off, len DESC", -1, &s, NULL);
    *out = NULL;
    *n = 0;
    *complete = 0;
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "file ranges", err);
    sqlite3_bind_text(s, 1, etag, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        range r = { (uint64_t)sqlite3_column_int64(s, 0), (uint64_t)sqlite3_column_int64(s, 1),
                    (uint64_t)sqlite3_column_int64(s, 2) };
        if (r.off > pos)
            break;                       /* a gap: not complete */
        if (r.off + r.len <= pos)
            continue;                    /* inside what is covered */
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            range *p = realloc(v, nc * sizeof *p);
            if (!p) {
                free(v);
                sqlite3_finalize(s);
                return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (deep verify)");
            }
            v = p;
            cap = nc;
        }
        v[(*n)++] = r;
        pos = r.off + r.len;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        free(v);
        return cache_db_fail(c, rc, "file ranges", err);
    }
    *complete = size > 0 && pos >= size;
    *out = v;
    return 0;
}

/* Hash [from, to) of each range, in order, into md. */
static int hash_ranges(deep_ctx *x, const range *v, size_t n, uint64_t size, EVP_MD_CTX *md,
                       shoal_err *err)
{
    uint64_t pos = 0;
    for (size_t i = 0; i < n && pos < size; i++) {
        char path[SHOAL_PATH_MAX];
        int fd, rc;
        if (cache_blob_path(x->c, v[i].id, path, sizeof path) != 0 ||
            (fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            return shoal_err_set(err, SHOAL_EIO, "open blob %016" PRIx64 ": %s", v[i].id,
                                 strerror(errno));
        uint64_t end = v[i].off + v[i].len < size ? v[i].off + v[i].len : size;
        while (pos < end) {
            size_t want = end - pos < DEEP_CHUNK ? (size_t)(end - pos) : DEEP_CHUNK;
            rc = shoal_pread_all(fd, x->buf, want, (off_t)(pos - v[i].off));
            if (rc) {
                close(fd);
                return shoal_err_set(err, rc, "read blob %016" PRIx64, v[i].id);
            }
            EVP_DigestUpdate(md, x->buf, want);
            x->rep->bytes += want;
            x->done += want;
            pos += want;
            if (x->o && x->o->progress && x->o->progress(x->o->ctx, x->done, x->total) != 0) {
                close(fd);
                return shoal_err_set(err, SHOAL_ECANCELED, "deep verify stopped");
            }
        }
        close(fd);
    }
    return 0;
}

/* 1 match, 0 mismatch, <0 error. */
static int check_file(deep_ctx *x, const range *v, size_t n, uint64_t size, const char *hex,
                      int kind, shoal_err *err)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char dig[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    char got[2 * EVP_MAX_MD_SIZE + 1];
    int rc;

    if (!md)
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (digest)");
    EVP_DigestInit_ex(md, kind == 64 ? EVP_sha256() : EVP_sha1(), NULL);
    if (kind == 40) {
        /* A git blob id hashes "blob <size>\0" before the content. */
        char head[40];
        int hn = snprintf(head, sizeof head, "blob %" PRIu64, size);
        EVP_DigestUpdate(md, head, (size_t)hn + 1);
    }
    rc = hash_ranges(x, v, n, size, md, err);
    if (rc == 0)
        EVP_DigestFinal_ex(md, dig, &dn);
    EVP_MD_CTX_free(md);
    if (rc)
        return rc;
    for (unsigned i = 0; i < dn; i++)
        snprintf(got + 2 * i, 3, "%02x", dig[i]);
    return strcmp(got, hex) == 0;
}

static int seen_add(deep_ctx *x, const char *etag)
{
    for (size_t i = 0; i < x->nseen; i++)
        if (strcmp(x->seen[i], etag) == 0)
            return 1;
    if (x->nseen == x->capseen) {
        size_t nc = x->capseen ? x->capseen * 2 : 32;
        void *p = realloc(x->seen, nc * sizeof *x->seen);
        if (!p)
            return SHOAL_ENOMEM;
        x->seen = p;
        x->capseen = nc;
    }
    snprintf(x->seen[x->nseen++], CACHE_ETAG_MAX + 1, "%s", etag);
    return 0;
}

/* Did shoald's automatic check find this file bad last time (its objects
 * quarantined)?  An index without the table: no. */
static int file_quarantined(cache *c, const char *etag)
{
    sqlite3_stmt *s = NULL;
    int bad = 0;
    if (sqlite3_prepare_v2(c->db, "SELECT 1 FROM file_checks WHERE etag = ?1 AND state = 2",
                           -1, &s, NULL) != SQLITE_OK)
        return 0;
    sqlite3_bind_text(s, 1, etag, -1, SQLITE_STATIC);
    bad = sqlite3_step(s) == SQLITE_ROW;
    sqlite3_finalize(s);
    return bad;
}

/* Pass 1 for one file: count it, and keep it when complete. */
static int list_file(deep_ctx *x, dlist *l, const char *path, const char *etag, uint64_t size,
                     shoal_err *err)
{
    range *v = NULL;
    size_t n = 0;
    int complete, rc;

    if ((rc = seen_add(x, etag)) != 0)
        return rc > 0 ? 0 : shoal_err_set(err, rc, "cache: out of memory (deep verify)");
    x->rep->files++;
    if (file_quarantined(x->c, etag)) {
        x->rep->quarantined++;
        if (x->bad_files)
            shoal_buf_appendf(x->bad_files, "%s (quarantined)\n", path);
    }
    if ((rc = file_ranges(x->c, etag, size, &v, &n, &complete, err)) != 0)
        return rc;
    if (!complete) {
        free(v);
        return 0;
    }
    x->rep->complete++;
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 32;
        dfile *p = realloc(l->v, nc * sizeof *p);
        if (!p) {
            free(v);
            return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (deep verify)");
        }
        l->v = p;
        l->cap = nc;
    }
    memset(&l->v[l->n], 0, sizeof l->v[l->n]);
    l->v[l->n].path = strdup(path);
    snprintf(l->v[l->n].etag, sizeof l->v[l->n].etag, "%s", etag);
    l->v[l->n].size = size;
    l->v[l->n].v = v;
    l->v[l->n].n = n;
    if (!l->v[l->n].path) {
        free(v);
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (deep verify)");
    }
    l->n++;
    {
        char hex[80];
        if (etag_hash(etag, hex, sizeof hex))
            x->total += size;   /* what pass 2 will hash */
    }
    return 0;
}

/* Pass 1 for one model: its files (all rows first, then their ranges). */
static int list_model(deep_ctx *x, dlist *l, const cache_model *m, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    typedef struct { char path[CACHE_STR_MAX]; char etag[CACHE_ETAG_MAX + 1]; uint64_t size; } row;
    row *rows = NULL;
    size_t n = 0, cap = 0;
    int rc = sqlite3_prepare_v2(x->c->db, "SELECT path, etag, size FROM files WHERE endpoint = ?1"
                                " AND repo = ?2 AND commit_id = ?3 AND path != ?4 ORDER BY path",
                                -1, &s, NULL);
    int r = 0;
    if (rc != SQLITE_OK)
        return cache_db_fail(x->c, rc, "deep verify", err);
    sqlite3_bind_text(s, 1, m->endpoint, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, m->repo, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, m->commit, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, CACHE_MANIFEST_FILE, -1, SQLITE_STATIC);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            row *p = realloc(rows, nc * sizeof *p);
            if (!p) {
                r = shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (deep verify)");
                break;
            }
            rows = p;
            cap = nc;
        }
        snprintf(rows[n].path, sizeof rows[n].path, "%s", (const char *)sqlite3_column_text(s, 0));
        snprintf(rows[n].etag, sizeof rows[n].etag, "%s", (const char *)sqlite3_column_text(s, 1));
        rows[n].size = (uint64_t)sqlite3_column_int64(s, 2);
        n++;
    }
    sqlite3_finalize(s);
    if (r == 0 && rc != SQLITE_DONE)
        r = cache_db_fail(x->c, rc, "deep verify", err);
    for (size_t i = 0; r == 0 && i < n; i++)
        r = list_file(x, l, rows[i].path, rows[i].etag, rows[i].size, err);
    free(rows);
    return r;
}

/* Pass 2 for one complete file. */
static int check_one(deep_ctx *x, const dfile *f, shoal_err *err)
{
    char hex[80];
    int kind = etag_hash(f->etag, hex, sizeof hex), rc;

    if (!kind) {
        x->rep->unhashable++;
        return 0;
    }
    rc = check_file(x, f->v, f->n, f->size, hex, kind, err);
    if (rc == 1) {
        x->rep->ok++;
        return 0;
    }
    if (rc == 0) {
        x->rep->bad++;
        LOG_WARN(CACHE_TAG, "deep verify: %s (etag %s) does not hash to its etag", f->path, f->etag);
        if (x->bad_files)
            shoal_buf_appendf(x->bad_files, "%s\n", f->path);
        if (x->o && x->o->on_bad)
            x->o->on_bad(x->o->ctx, f->path, f->etag);
    }
    return rc;
}

int cache_verify_deep(cache *c, const char *spec, const cache_deep_opts *opts,
                      cache_deep_report *rep, shoal_buf *bad_files, shoal_err *err)
{
    report_models ms;
    deep_ctx x;
    dlist l = { 0 };
    int rc;

    memset(rep, 0, sizeof *rep);
    memset(&x, 0, sizeof x);
    x.c = c;
    x.rep = rep;
    x.bad_files = bad_files;
    x.o = opts;
    if ((rc = report_models_find(c, spec, &ms, err)) != 0)
        return rc;
    x.buf = malloc(DEEP_CHUNK);
    if (!x.buf)
        rc = shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (deep verify)");
    for (size_t i = 0; rc == 0 && i < ms.n; i++)
        rc = list_model(&x, &l, &ms.v[i], err);
    for (size_t i = 0; rc == 0 && i < l.n; i++)
        rc = check_one(&x, &l.v[i], err);
    for (size_t i = 0; i < l.n; i++) {
        free(l.v[i].path);
        free(l.v[i].v);
    }
    free(l.v);
    free(x.buf);
    free(x.seen);
    report_models_free(&ms);
    return rc;
}

/* ---- automatic whole-file checks -------------------------------------------------- */

static int objs_push(cache_verify_list *l, uint64_t id)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 64;
        uint64_t *p = realloc(l->ids, nc * sizeof *p);
        uint8_t *q;
        if (!p)
            return SHOAL_ENOMEM;
        l->ids = p;
        if (!(q = realloc(l->missing, nc)))
            return SHOAL_ENOMEM;
        l->missing = q;
        l->cap = nc;
    }
    l->ids[l->n] = id;
    l->missing[l->n++] = 0;
    return 0;
}

/* The file record naming etag (any model): path and size.  0 / 1 found. */
static int file_by_etag(cache *c, const char *etag, cache_file_check *out, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT path, size, repo, commit_id FROM files"
                                " WHERE etag = ?1 LIMIT 1", -1, &s, NULL), found = 0;
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "file check", err);
    sqlite3_bind_text(s, 1, etag, -1, SQLITE_STATIC);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        snprintf(out->path, sizeof out->path, "%s", (const char *)sqlite3_column_text(s, 0));
        out->size = (uint64_t)sqlite3_column_int64(s, 1);
        snprintf(out->repo, sizeof out->repo, "%s", (const char *)sqlite3_column_text(s, 2));
        snprintf(out->commit, sizeof out->commit, "%s", (const char *)sqlite3_column_text(s, 3));
        found = 1;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return cache_db_fail(c, rc, "file check", err);
    return found;
}

/* Are all of v[0..n) marked verified?  An index without the column: no. */
static int ranges_verified(cache *c, const range *v, size_t n)
{
    sqlite3_stmt *s = NULL;
    int all = n > 0;
    if (sqlite3_prepare_v2(c->db, "SELECT verified FROM objects WHERE id = ?1", -1, &s,
                           NULL) != SQLITE_OK)
        return 0;
    for (size_t i = 0; all && i < n; i++) {
        sqlite3_bind_int64(s, 1, (int64_t)v[i].id);
        all = sqlite3_step(s) == SQLITE_ROW && sqlite3_column_int(s, 0) == 1;
        sqlite3_reset(s);
    }
    sqlite3_finalize(s);
    return all;
}

/* The objects a mismatch quarantines: every object of the etag but a
 * shard's header range (a small-file object shorter than the file): the
 * manifest was built from it and only an OPEN stores it, so it stays and
 * is hashed again with the re-fetched bytes. */
static int etag_objects(cache *c, const char *etag, uint64_t size, cache_verify_list *l,
                        shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT id FROM objects WHERE etag = ?1"
                                " AND NOT (kind = ?2 AND len < ?3)", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "file check", err);
    sqlite3_bind_text(s, 1, etag, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 2, CACHE_KIND_SMALL);
    sqlite3_bind_int64(s, 3, (int64_t)size);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        if (objs_push(l, (uint64_t)sqlite3_column_int64(s, 0)) != 0) {
            sqlite3_finalize(s);
            return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (file check)");
        }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "file check", err);
}

int cache_file_check_run(cache *c, const char *etag, cache_progress_fn fn, void *ctx,
                         cache_file_check *out, shoal_err *err)
{
    char hex[80];
    range *v = NULL;
    size_t n = 0;
    int complete = 0, kind, rc;
    cache_deep_report rep;
    cache_deep_opts o = { fn, NULL, ctx };
    deep_ctx x;

    memset(out, 0, sizeof *out);
    out->result = -1;
    rc = file_by_etag(c, etag, out, err);
    if (rc <= 0)
        return rc;
    out->known = 1;
    kind = etag_hash(etag, hex, sizeof hex);
    out->hashable = kind != 0;
    if ((rc = file_ranges(c, etag, out->size, &v, &n, &complete, err)) != 0)
        return rc;
    out->complete = complete;
    if (!complete || !kind) {
        free(v);
        return 0;
    }
    if (ranges_verified(c, v, n)) {
        out->already = 1;
        free(v);
        return 0;
    }
    memset(&x, 0, sizeof x);
    memset(&rep, 0, sizeof rep);
    x.c = c;
    x.rep = &rep;
    x.o = &o;
    x.total = out->size;
    if (!(x.buf = malloc(DEEP_CHUNK))) {
        free(v);
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (file check)");
    }
    rc = check_file(&x, v, n, out->size, hex, kind, err);
    free(x.buf);
    out->bytes = rep.bytes;
    if (rc == SHOAL_EIO) {
        /* a blob went (evicted, removed) while it was read: not complete
         * any more; its next commit brings the file back */
        LOG_DEBUG(CACHE_TAG, "file check %s: %s (incomplete now)", out->path, err ? err->msg : "");
        shoal_err_clear(err);
        out->complete = 0;
        free(v);
        return 0;
    }
    if (rc < 0) {
        free(v);
        return rc;
    }
    out->result = rc;
    if (rc == 1) {
        for (size_t i = 0; rc >= 0 && i < n; i++)
            if (objs_push(&out->objs, v[i].id) != 0)
                rc = -1;
        rc = rc < 0 ? shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (file check)") : 0;
    } else {
        rc = etag_objects(c, etag, out->size, &out->objs, err);
    }
    free(v);
    return rc;
}

int cache_file_verified(cache *c, const char *etag, const cache_verify_list *objs,
                        shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc;

    if (c->cfg.read_only)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only", c->dir);
    if ((rc = cache_db_begin(c, err)) != 0)
        return rc;
    rc = sqlite3_prepare_v2(c->db, "UPDATE objects SET verified = 1 WHERE id = ?1", -1, &s, NULL);
    for (size_t i = 0; rc == SQLITE_OK && i < objs->n; i++) {
        sqlite3_bind_int64(s, 1, (int64_t)objs->ids[i]);
        rc = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
        sqlite3_reset(s);
    }
    sqlite3_finalize(s);
    s = NULL;
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(c->db, "UPDATE file_checks SET state = 1, checked_ms = ?2"
                                " WHERE etag = ?1", -1, &s, NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(s, 1, etag, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, shoal_wall_ms());
        rc = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
    }
    sqlite3_finalize(s);
    if (rc != SQLITE_OK) {
        rc = cache_db_fail(c, sqlite3_errcode(c->db), "record a file check", err);
        cache_db_rollback(c);
        return rc;
    }
    if ((rc = cache_db_commit(c, err)) != 0)
        return rc;
    for (size_t i = 0; i < objs->n; i++) {   /* the memory copy (cache_usage_get) */
        uint32_t at = cache_obj_by_id(c, objs->ids[i]);
        if (at != CMAP_NONE)
            c->objs[at].verified = 1;
    }
    return 0;
}

int cache_file_quarantine(cache *c, const char *etag, const char *path, uint64_t size,
                          const cache_verify_list *objs, uint64_t *failures, uint64_t *bytes,
                          shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    uint64_t *ids, removed = 0;
    size_t k = 0;
    int rc;

    if (c->cfg.read_only)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only", c->dir);
    if (!(ids = malloc((objs->n ? objs->n : 1) * sizeof *ids)))
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory (quarantine)");
    for (size_t i = 0; i < objs->n; i++) {
        uint32_t at = cache_obj_by_id(c, objs->ids[i]);
        if (at == CMAP_NONE)
            continue;   /* evicted since the check */
        removed += c->objs[at].len;
        ids[k++] = objs->ids[i];
    }
    LOG_ERROR(CACHE_TAG, "%s (etag %s) does not hash to its etag: quarantining its %zu cached "
              "objects (%" PRIu64 " bytes)", path, etag, k, removed);
    rc = cache_objs_delete(c, ids, k, err);
    free(ids);
    if (rc)
        return rc;
    rc = sqlite3_prepare_v2(c->db, "INSERT INTO file_checks(etag, path, size, state, failures,"
                            " quarantined_bytes, checked_ms) VALUES(?1, ?2, ?3, 2, 1, ?4, ?5)"
                            " ON CONFLICT(etag) DO UPDATE SET state = 2, failures = failures + 1,"
                            " quarantined_bytes = quarantined_bytes + ?4, checked_ms = ?5"
                            " RETURNING failures", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "record a quarantine", err);
    sqlite3_bind_text(s, 1, etag, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, (int64_t)size);
    sqlite3_bind_int64(s, 4, (int64_t)removed);
    sqlite3_bind_int64(s, 5, shoal_wall_ms());
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW && failures)
        *failures = (uint64_t)sqlite3_column_int64(s, 0);
    while (rc == SQLITE_ROW)
        rc = sqlite3_step(s);
    sqlite3_finalize(s);
    if (rc != SQLITE_DONE)
        return cache_db_fail(c, rc, "record a quarantine", err);
    if (bytes)
        *bytes = removed;
    return 0;
}

/* One figure of the index, 0 when the query cannot run (an older index). */
static uint64_t q_u64(cache *c, const char *sql, int col, uint64_t *second)
{
    sqlite3_stmt *s = NULL;
    uint64_t v = 0;
    if (sqlite3_prepare_v2(c->db, sql, -1, &s, NULL) != SQLITE_OK)
        return 0;
    if (sqlite3_step(s) == SQLITE_ROW) {
        v = (uint64_t)sqlite3_column_int64(s, col);
        if (second)
            *second = (uint64_t)sqlite3_column_int64(s, col + 1);
    }
    sqlite3_finalize(s);
    return v;
}

int cache_integrity_get(cache *c, cache_integrity *out, shoal_err *err)
{
    (void)err;
    memset(out, 0, sizeof *out);
    out->verified_objects = q_u64(c, "SELECT COUNT(*), COALESCE(SUM(len), 0) FROM objects"
                                     " WHERE verified = 1 AND kind != 3", 0, &out->verified_bytes);
    out->trusted_objects = q_u64(c, "SELECT COUNT(*), COALESCE(SUM(len), 0) FROM objects"
                                    " WHERE verified = 0 AND kind != 3", 0, &out->trusted_bytes);
    if (out->trusted_objects == 0 && out->verified_objects == 0)   /* no column yet */
        out->trusted_objects = q_u64(c, "SELECT COUNT(*), COALESCE(SUM(len), 0) FROM objects"
                                        " WHERE kind != 3", 0, &out->trusted_bytes);
    out->derived_objects = q_u64(c, "SELECT COUNT(*), COALESCE(SUM(len), 0) FROM objects"
                                    " WHERE kind = 3", 0, &out->derived_bytes);
    out->bad_files = q_u64(c, "SELECT COUNT(*) FROM file_checks WHERE state = 2", 0, NULL);
    out->failures = q_u64(c, "SELECT COALESCE(SUM(failures), 0), COALESCE(SUM(quarantined_bytes),"
                             " 0) FROM file_checks", 0, &out->quarantined_bytes);
    return 0;
}
