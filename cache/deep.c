/* deep.c — whole-file verification: a file whose every byte is cached is
 * hashed in order and compared with its upstream etag.
 *
 * Owns: coverage of a file by its cached ranges, the sha256 (LFS) and git
 * blob sha1 (small files) checks.  A shard is covered when its header
 * range [0, 8+N) (stored at OPEN as a small-file object, docs/fetcher.md),
 * its tensors and experts, and any bytes of tensors outside the language
 * model are cached.  Does not own per-object checksums (read.c's verify)
 * nor removing anything: a whole-file mismatch cannot say which range is
 * wrong, so it is reported (and handed to the on_bad hook), not repaired.
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
