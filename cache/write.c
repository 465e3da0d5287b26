/* write.c — the write path: begin, append, positional writes, commit,
 * abort, pause.
 *
 * Owns: one writer per object being written, its temporary file in tmp/,
 * the running XXH3-128, the extents written ahead of the contiguous prefix
 * (several parts of one object arriving over several connections),
 * checkpoints that make a long write resumable, and the commit that makes
 * an object visible.  Does not own choosing victims (evict.c) or counting
 * (stats.c).
 *
 * A writer's life (checked by w->state):
 *
 *     begin --> WRITING --append / write_at--> WRITING --commit--> (blob + row) freed
 *                  |  \--checkpoint: fsync + partial row (durable = pos)
 *                  |--pause--> fsync + partial row, freed (resumable)
 *                  |--abort / any failure--> tmp file removed, freed
 *                  \--adopt: the file was filled through another descriptor
 *                     (a worker, a PUT_BEGIN client): size check, hash, fsync;
 *                     commit then skips its fsync (cache.h, "Threads" rule 4)
 *
 * Commit order (docs/cache-format.md, "A crash at each step"):
 *   1 fsync the tmp file   2 rename into blobs/   3 one transaction:
 *   insert the object row and its names, delete the partial row.
 * A failure after step 2 unlinks the blob again, so the index is unchanged.
 *
 * Positional writes (cache_write_at): pos is the contiguous prefix, the
 * only part the XXH3 has seen and the only part a checkpoint records.
 * Bytes ahead of it are pwritten into the tmp file and kept as extents, a
 * sorted list of disjoint [lo, hi) (invariant: pos < lo of every extent,
 * and extents never touch, they are merged).  When the prefix reaches an
 * extent it is read back from the tmp file (the page cache has it) into
 * the hash and the prefix moves over it.  Hashing in order this way keeps
 * the XXH3 identical to one append of the whole object; hashing parts
 * apart and combining was rejected because XXH3-128 has no combine.
 * Extents are never durable: a pause or crash keeps the prefix only, and a
 * resume cuts the file back to it (writer_resume, repair at open).
 */
#include "cache/cache_int.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include "common/xxh3.h"

#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"

enum { W_WRITING = 1, W_FAILED = 2 };

struct cache_writer {
    cache   *c;
    struct cache_writer *next;
    uint64_t id;
    char    *etag;
    uint64_t off, len;
    cache_kind kind;
    char    *endpoint, *repo, *revision, *commit, *file, *tensor;
    int32_t  layer, expert;
    int      fd;
    int      state;
    int      has_partial_row;
    int      allocated;         /* fallocate done (or not needed) */
    int      synced;            /* adopt / sync fsynced the whole file: commit skips it */
    int      defer_ckpt;        /* checkpoints are the owner's (cache_writer_defer_checkpoints) */
    int      ckpt_due;          /* deferred: one is due (cache_writer_checkpoint_due) */
    uint64_t pos;               /* the contiguous prefix written (and hashed) */
    uint64_t since_checkpoint;
    uint64_t durable;           /* what the partial row says is on disk */
    struct extent { uint64_t lo, hi; } *ext;   /* written ahead of pos, sorted */
    size_t   n_ext, cap_ext;
    XXH3_state_t *xs;
    char     tmp_path[SHOAL_PATH_MAX];
};

static char *dup_or_null(const char *s, int *fail)
{
    char *d;
    if (!s)
        return NULL;
    d = strdup(s);
    if (!d)
        *fail = 1;
    return d;
}

static void writer_unlink_list(cache *c, cache_writer *w)
{
    for (cache_writer **pp = &c->writers; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            return;
        }
}

uint64_t cache_writers_disk(const cache *c)
{
    uint64_t n = 0;
    struct stat st;
    for (const cache_writer *w = c->writers; w; w = w->next)
        if (w->fd >= 0 && fstat(w->fd, &st) == 0)
            n += (uint64_t)st.st_blocks * 512;
    return n;
}

/* Release everything the writer holds; the tmp file is removed unless
 * keep_file.  Returns its reservation to the budget. */
static void writer_free(cache_writer *w, int keep_file)
{
    cache *c = w->c;

    if (w->fd >= 0)
        close(w->fd);
    if (!keep_file && w->tmp_path[0])
        cache_unlink_later(c, w->tmp_path);
    if (!keep_file && w->has_partial_row) {
        sqlite3_stmt *s = c->st[ST_PART_DELETE];
        sqlite3_bind_int64(s, 1, (int64_t)w->id);
        if (sqlite3_step(s) != SQLITE_DONE)
            LOG_WARN(CACHE_TAG, "could not drop partial row %" PRIu64 ": %s", w->id,
                     sqlite3_errmsg(c->db));
        sqlite3_reset(s);
    }
    c->reserved -= w->len;
    c->reserved_disk -= cache_disk_len(c, w->len);
    writer_unlink_list(c, w);
    shoal_xxh3_free(w->xs);
    free(w->ext);
    free(w->etag);
    free(w->endpoint);
    free(w->repo);
    free(w->revision);
    free(w->commit);
    free(w->file);
    free(w->tensor);
    free(w);
}

static int errno_fail(cache_writer *w, const char *what, shoal_err *err)
{
    int e = errno;
    w->state = W_FAILED;
    return shoal_err_set(err, shoal_err_from_errno(e), "cache write %s [%" PRIu64 "+%" PRIu64
                         "]: %s %s: %s", w->etag, w->off, w->len, what, w->tmp_path, strerror(e));
}

/* Record the partial row with this durable length (its bytes are on disk). */
static int writer_record(cache_writer *w, uint64_t durable, shoal_err *err)
{
    cache *c = w->c;
    sqlite3_stmt *s = c->st[ST_PART_PUT];
    int rc;

    sqlite3_bind_int64(s, 1, (int64_t)w->id);
    sqlite3_bind_text(s, 2, w->etag, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, (int64_t)w->off);
    sqlite3_bind_int64(s, 4, (int64_t)w->len);
    sqlite3_bind_int(s, 5, (int)w->kind);
    sqlite3_bind_int64(s, 6, (int64_t)durable);
    sqlite3_bind_int64(s, 7, shoal_wall_ms());
    rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) {
        w->state = W_FAILED;
        return cache_db_fail(c, rc, "record partial write", err);
    }
    w->has_partial_row = 1;
    w->durable = durable;
    return 0;
}

/* Record the partial row with durable = pos (after an fsync). */
static int writer_checkpoint(cache_writer *w, shoal_err *err)
{
    /* Invariant 8: durable never passes what was written, and is only
     * recorded after the bytes are on disk. */
    assert(w->pos <= w->len);
    if (!w->c->cfg.no_fsync && cache_io_now.fdatasync(w->fd) != 0)
        return errno_fail(w, "fdatasync", err);
    w->since_checkpoint = 0;
    w->ckpt_due = 0;
    return writer_record(w, w->pos, err);
}

void cache_writer_defer_checkpoints(cache_writer *w)
{
    w->defer_ckpt = 1;
}

int cache_writer_checkpoint_due(cache_writer *w, uint64_t *durable, uint64_t *writer_id)
{
    if (!w->ckpt_due || w->state != W_WRITING)
        return 0;
    w->ckpt_due = 0;
    *durable = w->pos;
    *writer_id = w->id;
    return 1;
}

int cache_checkpoint_record(cache *c, uint64_t writer_id, uint64_t durable, shoal_err *err)
{
    for (cache_writer *w = c->writers; w; w = w->next)
        if (w->id == writer_id) {
            /* a later one may have come back first; the writer may have
             * failed, or be past this length only through a pause */
            if (w->state != W_WRITING || durable > w->pos ||
                (w->has_partial_row && durable <= w->durable))
                return 0;
            return writer_record(w, durable, err);
        }
    return 0;   /* committed, paused or aborted meanwhile: nothing to record */
}

int cache_sync_fd(const cache *c, int fd, shoal_err *err)
{
    if (!c->cfg.no_fsync && cache_io_now.fdatasync(fd) != 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "fdatasync: %s", strerror(errno));
    return 0;
}

int cache_writer_sync(cache_writer *w, shoal_err *err)
{
    if (w->state != W_WRITING || w->pos != w->len)
        return shoal_err_set(err, SHOAL_EIO, "cache write %s: not complete, cannot sync",
                             w->etag);
    if (!w->c->cfg.no_fsync && cache_io_now.fsync(w->fd) != 0) {
        int e = errno;
        return shoal_err_set(err, shoal_err_from_errno(e), "cache write %s: fsync %s: %s",
                             w->etag, w->tmp_path, strerror(e));
    }
    w->synced = 1;
    return 0;
}

/* Continue a partial write: open its file, cut it to the durable length and
 * hash what is there.  SHOAL_ENOTFOUND when there is nothing usable. */
static int writer_resume(cache_writer *w, uint64_t id, uint64_t durable, shoal_err *err)
{
    uint8_t *buf;
    uint64_t at = 0;

    w->id = id;
    w->has_partial_row = 1;
    w->durable = durable;
    if (cache_tmp_path(w->c, id, w->tmp_path, sizeof w->tmp_path))
        return shoal_err_set(err, SHOAL_ETOOBIG, "cache tmp path too long");
    w->fd = cache_io_now.open(w->tmp_path, O_RDWR | O_CLOEXEC, 0);
    if (w->fd < 0 || durable > w->len || cache_io_now.ftruncate(w->fd, (off_t)durable) != 0)
        return SHOAL_ENOTFOUND;
    buf = malloc(1 << 20);
    if (!buf)
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
    while (at < durable) {
        size_t n = durable - at < (1u << 20) ? (size_t)(durable - at) : (1u << 20);
        if (shoal_pread_all(w->fd, buf, n, (off_t)at) != 0) {
            free(buf);
            return SHOAL_ENOTFOUND;
        }
        shoal_xxh3_update(w->xs, buf, n);
        at += n;
    }
    free(buf);
    if (lseek(w->fd, (off_t)durable, SEEK_SET) != (off_t)durable)
        return SHOAL_ENOTFOUND;
    w->pos = durable;
    LOG_DEBUG(CACHE_TAG, "resuming %s [%" PRIu64 "+%" PRIu64 "] at %" PRIu64, w->etag, w->off,
              w->len, durable);
    return 0;
}

/* Reserve the blocks now: a full disk fails here, before any download,
 * and the file is laid out in one piece.  KEEP_SIZE so the file's size
 * still says how much was written.  Filesystems without fallocate are
 * fine. */
static int writer_alloc(cache_writer *w, shoal_err *err)
{
    if (w->allocated)
        return 0;
    if (cache_io_now.fallocate(w->fd, SHOAL_FALLOC_KEEP_SIZE, 0, (off_t)w->len) != 0 &&
        errno != EOPNOTSUPP && errno != ENOSYS)
        return errno_fail(w, "fallocate", err);
    w->allocated = 1;
    return 0;
}

static int writer_fresh(cache_writer *w, unsigned flags, shoal_err *err)
{
    cache *c = w->c;

    w->id = c->next_id++;
    if (cache_tmp_path(c, w->id, w->tmp_path, sizeof w->tmp_path))
        return shoal_err_set(err, SHOAL_ETOOBIG, "cache tmp path too long");
    w->fd = cache_io_now.open(w->tmp_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int rc = errno_fail(w, "open", err);
        w->tmp_path[0] = '\0';    /* not ours: do not unlink */
        return rc;
    }
    return flags & CACHE_BEGIN_NO_ALLOC ? 0 : writer_alloc(w, err);
}

static int writer_find_partial(cache *c, const cache_key *key, uint64_t *id, uint64_t *durable)
{
    sqlite3_stmt *s = c->st[ST_PART_GET];
    int found = 0;

    sqlite3_bind_text(s, 1, key->etag, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 2, (int64_t)key->offset);
    sqlite3_bind_int64(s, 3, (int64_t)key->length);
    if (sqlite3_step(s) == SQLITE_ROW) {
        *id = (uint64_t)sqlite3_column_int64(s, 0);
        *durable = (uint64_t)sqlite3_column_int64(s, 1);
        found = 1;
    }
    sqlite3_reset(s);
    return found;
}

int cache_write_begin(cache *c, const cache_key *key, cache_kind kind,
                      const cache_names *names, cache_writer **out, shoal_err *err)
{
    return cache_write_begin_flags(c, key, kind, names, 0, out, err);
}

int cache_write_begin_flags(cache *c, const cache_key *key, cache_kind kind,
                            const cache_names *names, unsigned flags, cache_writer **out,
                            shoal_err *err)
{
    cache_writer *w;
    uint64_t pid, durable;
    int rc, fail = 0;

    *out = NULL;
    if ((rc = cache_key_check(key, err)) != 0)
        return rc;
    if (c->cfg.read_only)
        return shoal_err_set(err, SHOAL_EINVAL, "cache %s is open read-only", c->dir);
    if ((unsigned)kind >= CACHE_KIND_COUNT_)
        return shoal_err_set(err, SHOAL_EINVAL, "cache: unknown object kind %d", (int)kind);
    if (cache_obj_find(c, key) != CMAP_NONE)
        return shoal_err_set(err, SHOAL_EEXIST, "cache: %s [%" PRIu64 "+%" PRIu64 "] is cached already",
                             key->etag, key->offset, key->length);
    for (cache_writer *a = c->writers; a; a = a->next)
        if (a->off == key->offset && a->len == key->length && strcmp(a->etag, key->etag) == 0)
            return shoal_err_set(err, SHOAL_EBUSY, "cache: %s [%" PRIu64 "+%" PRIu64 "] is being written",
                                 key->etag, key->offset, key->length);
    if ((rc = cache_evict_for(c, key->length, err)) != 0)
        return rc;

    w = calloc(1, sizeof *w);
    if (!w)
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
    w->c = c;
    w->fd = -1;
    w->off = key->offset;
    w->len = key->length;
    w->kind = kind;
    w->layer = names ? names->layer : -1;
    w->expert = names ? names->expert : -1;
    w->etag = dup_or_null(key->etag, &fail);
    if (names) {
        w->endpoint = dup_or_null(names->endpoint, &fail);
        w->repo = dup_or_null(names->repo, &fail);
        w->revision = dup_or_null(names->revision, &fail);
        w->commit = dup_or_null(names->commit, &fail);
        w->file = dup_or_null(names->file, &fail);
        w->tensor = dup_or_null(names->tensor, &fail);
    }
    w->xs = shoal_xxh3_new();
    /* Reserve before anything can fail, so writer_free can give it back. */
    c->reserved += w->len;
    c->reserved_disk += cache_disk_len(c, w->len);
    w->next = c->writers;
    c->writers = w;
    if (fail || !w->xs || shoal_xxh3_reset(w->xs) != 0) {
        writer_free(w, 0);
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
    }
    w->state = W_WRITING;
    if (writer_find_partial(c, key, &pid, &durable)) {
        rc = writer_resume(w, pid, durable, err);
        if (rc == SHOAL_ENOTFOUND) {
            /* Unusable leftover: forget it and start over. */
            LOG_INFO(CACHE_TAG, "partial write of %s unusable; starting over", key->etag);
            if (w->fd >= 0)
                close(w->fd);
            w->fd = -1;
            cache_io_now.unlink(w->tmp_path);
            {
                sqlite3_stmt *s = c->st[ST_PART_DELETE];
                sqlite3_bind_int64(s, 1, (int64_t)pid);
                sqlite3_step(s);
                sqlite3_reset(s);
            }
            w->has_partial_row = 0;
            shoal_xxh3_reset(w->xs);
            w->pos = 0;
            rc = writer_fresh(w, flags, err);
        }
    } else {
        rc = writer_fresh(w, flags, err);
    }
    if (rc) {
        writer_free(w, 0);
        return rc;
    }
    *out = w;
    return 0;
}

uint64_t cache_writer_offset(const cache_writer *w)
{
    return w ? w->pos : 0;
}

/* Write n bytes at the prefix: write(2) at the descriptor's offset (kept at
 * pos), then the hash. */
static int prefix_write(cache_writer *w, const void *p, size_t n, shoal_err *err)
{
    if (cache_io_write_all(w->fd, p, n) != 0)
        return errno_fail(w, "write", err);
    shoal_xxh3_update(w->xs, p, n);
    w->pos += n;
    w->since_checkpoint += n;
    return 0;
}

/* The prefix reached the first extent: hash its bytes back from the tmp
 * file and move over it, as often as extents follow. */
static int prefix_absorb(cache_writer *w, shoal_err *err)
{
    uint8_t *buf = NULL;
    size_t cap = 1u << 20;

    while (w->n_ext > 0 && w->ext[0].lo == w->pos) {
        uint64_t hi = w->ext[0].hi;
        if (!buf && !(buf = malloc(cap))) {
            w->state = W_FAILED;
            return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
        }
        while (w->pos < hi) {
            size_t n = hi - w->pos < cap ? (size_t)(hi - w->pos) : cap;
            if (shoal_pread_all(w->fd, buf, n, (off_t)w->pos) != 0) {
                free(buf);
                return errno_fail(w, "read back", err);
            }
            shoal_xxh3_update(w->xs, buf, n);
            w->pos += n;
            w->since_checkpoint += n;
        }
        memmove(w->ext, w->ext + 1, (w->n_ext - 1) * sizeof *w->ext);
        w->n_ext--;
    }
    free(buf);
    /* The next append writes at the descriptor's offset. */
    if (lseek(w->fd, (off_t)w->pos, SEEK_SET) != (off_t)w->pos)
        return errno_fail(w, "lseek", err);
    return 0;
}

/* Remember [lo, hi) as written ahead, merging with touching neighbours.
 * The caller checked it overlaps nothing. */
static int extent_add(cache_writer *w, uint64_t lo, uint64_t hi, shoal_err *err)
{
    size_t i = 0;

    while (i < w->n_ext && w->ext[i].hi < lo)
        i++;
    if (i < w->n_ext && w->ext[i].hi == lo) {          /* extends ext[i] */
        w->ext[i].hi = hi;
        if (i + 1 < w->n_ext && w->ext[i + 1].lo == hi) {
            w->ext[i].hi = w->ext[i + 1].hi;
            memmove(w->ext + i + 1, w->ext + i + 2, (w->n_ext - i - 2) * sizeof *w->ext);
            w->n_ext--;
        }
        return 0;
    }
    if (i < w->n_ext && w->ext[i].lo == hi) {         /* precedes ext[i] */
        w->ext[i].lo = lo;
        return 0;
    }
    if (w->n_ext == w->cap_ext) {
        size_t nc = w->cap_ext ? w->cap_ext * 2 : 8;
        struct extent *ne = realloc(w->ext, nc * sizeof *ne);
        if (!ne) {
            w->state = W_FAILED;
            return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
        }
        w->ext = ne;
        w->cap_ext = nc;
    }
    memmove(w->ext + i + 1, w->ext + i, (w->n_ext - i) * sizeof *w->ext);
    w->ext[i].lo = lo;
    w->ext[i].hi = hi;
    w->n_ext++;
    return 0;
}

/* 1 when [lo, hi) overlaps a byte already written (the prefix or an
 * extent). */
static int overlaps(const cache_writer *w, uint64_t lo, uint64_t hi)
{
    if (lo < w->pos)
        return 1;
    for (size_t i = 0; i < w->n_ext; i++)
        if (lo < w->ext[i].hi && w->ext[i].lo < hi)
            return 1;
    return 0;
}

int cache_write_at(cache_writer *w, uint64_t at, const void *p, size_t n, shoal_err *err)
{
    int rc;

    if (w->state != W_WRITING)
        return shoal_err_set(err, SHOAL_EIO, "cache write %s: writer failed earlier; abort it", w->etag);
    if (at > w->len || n > w->len - at)
        return shoal_err_set(err, SHOAL_ERANGE, "cache write %s: %zu bytes at %" PRIu64
                             " pass the object's length %" PRIu64, w->etag, n, at, w->len);
    if (n == 0)
        return 0;
    if (overlaps(w, at, at + n))
        return shoal_err_set(err, SHOAL_ERANGE, "cache write %s: bytes %" PRIu64 "-%" PRIu64
                             " were written already", w->etag, at, at + n - 1);
    if (at > w->pos) {
        const char *q = p;
        uint64_t o = at;
        size_t left = n;
        while (left > 0) {
            ssize_t k = cache_io_now.pwrite(w->fd, q, left, (off_t)o);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                if (k == 0)
                    errno = EIO;
                return errno_fail(w, "pwrite", err);
            }
            q += k;
            o += (uint64_t)k;
            left -= (size_t)k;
        }
        return extent_add(w, at, at + n, err);
    }
    if ((rc = prefix_write(w, p, n, err)) != 0)
        return rc;
    if (w->n_ext > 0 && w->ext[0].lo == w->pos && (rc = prefix_absorb(w, err)) != 0)
        return rc;
    if (w->since_checkpoint >= w->c->cfg.checkpoint_bytes && w->c->cfg.checkpoint_bytes &&
        w->pos < w->len) {
        if (!w->defer_ckpt)
            return writer_checkpoint(w, err);
        w->since_checkpoint = 0;   /* the owner syncs and records it */
        w->ckpt_due = 1;
    }
    return 0;
}

int cache_write_append(cache_writer *w, const void *p, size_t n, shoal_err *err)
{
    return cache_write_at(w, w->pos, p, n, err);
}

/* Step 3 of a commit: the object row, its names, the partial row gone, in
 * one transaction. */
static int commit_rows(cache_writer *w, const uint8_t xxh[16], int64_t now, shoal_err *err)
{
    cache *c = w->c;
    sqlite3_stmt *s = c->st[ST_OBJ_INSERT];
    cache_names nm = { w->endpoint, w->repo, w->revision, w->commit, w->file, w->tensor,
                       w->layer, w->expert };
    int rc, r;

    /* Invariant 7: the blob is in place before its row. */
    assert(w->tmp_path[0] == '\0' && w->fd < 0);
    if ((rc = cache_db_begin(c, err)) != 0)
        return rc;
    sqlite3_bind_int64(s, 1, (int64_t)w->id);
    sqlite3_bind_text(s, 2, w->etag, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, (int64_t)w->off);
    sqlite3_bind_int64(s, 4, (int64_t)w->len);
    sqlite3_bind_int(s, 5, (int)w->kind);
    sqlite3_bind_int(s, 6, w->layer);
    sqlite3_bind_int(s, 7, w->expert);
    sqlite3_bind_blob(s, 8, xxh, 16, SQLITE_STATIC);
    sqlite3_bind_int(s, 9, 0);
    sqlite3_bind_int64(s, 10, now);
    r = sqlite3_step(s);
    sqlite3_reset(s);
    if (r != SQLITE_DONE)
        rc = cache_db_fail(c, r, "insert object", err);
    if (rc == 0)
        rc = cache_names_insert(c, w->id, &nm, err);
    if (rc == 0 && w->has_partial_row) {
        sqlite3_stmt *p = c->st[ST_PART_DELETE];
        sqlite3_bind_int64(p, 1, (int64_t)w->id);
        r = sqlite3_step(p);
        sqlite3_reset(p);
        if (r != SQLITE_DONE)
            rc = cache_db_fail(c, r, "delete partial row", err);
    }
    if (rc == 0)
        return cache_db_commit(c, err);
    cache_db_rollback(c);
    return rc;
}

int cache_write_commit(cache_writer *w, uint64_t *id_out, shoal_err *err)
{
    cache *c = w->c;
    char blob[SHOAL_PATH_MAX];
    XXH128_canonical_t can;
    int64_t now = shoal_wall_ms();
    int rc;

    if (w->state != W_WRITING) {
        rc = shoal_err_set(err, SHOAL_EIO, "cache write %s: writer failed earlier", w->etag);
        goto fail;
    }
    if (w->pos != w->len) {
        rc = shoal_err_set(err, SHOAL_ERANGE, "cache write %s: commit after %" PRIu64 " of %"
                           PRIu64 " contiguous bytes", w->etag, w->pos, w->len);
        goto fail;
    }
    assert(w->n_ext == 0);   /* extents lie past pos, inside len */
    /* Room in the table before the transaction, so memory and index cannot
     * part ways after it. */
    if (c->nobjs == c->capobjs) {
        size_t ncap = c->capobjs ? c->capobjs * 2 : 256;
        cobj *n = realloc(c->objs, ncap * sizeof *n);
        if (!n) {
            rc = shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
            goto fail;
        }
        c->objs = n;
        c->capobjs = ncap;
    }
    /* Step 1: the bytes are on disk before the name says they are (inv. 6).
     * A writer that cache_writer_adopt synced needs no second fsync. */
    if (!c->cfg.no_fsync && !w->synced && cache_io_now.fsync(w->fd) != 0) {
        rc = errno_fail(w, "fsync", err);
        goto fail;
    }
    close(w->fd);
    w->fd = -1;
    shoal_xxh3_digest(w->xs, can.digest);
    if (cache_blob_path(c, w->id, blob, sizeof blob)) {
        rc = shoal_err_set(err, SHOAL_ETOOBIG, "cache blob path too long");
        goto fail;
    }
    /* Step 2 (invariant 6: only fsynced bytes get a blob name). */
    assert(w->fd < 0);
    if (cache_io_now.rename(w->tmp_path, blob) != 0) {
        rc = errno_fail(w, "rename", err);
        goto fail;
    }
    w->tmp_path[0] = '\0';
    /* Step 3; on failure the blob goes again so no orphan outlives us. */
    rc = commit_rows(w, can.digest, now, err);
    if (rc) {
        if (cache_io_now.unlink(blob) != 0)
            LOG_WARN(CACHE_TAG, "unlink %s: %s (repair at open removes it)", blob, strerror(errno));
        goto fail;
    }
    {
        cobj o;
        memset(&o, 0, sizeof o);
        o.id = w->id;
        o.etag = w->etag;
        o.off = w->off;
        o.len = w->len;
        o.kind = (uint8_t)w->kind;
        o.layer = w->layer;
        o.expert = w->expert;
        o.last_access_ms = now;
        memcpy(o.xxh, can.digest, 16);
        if ((rc = cache_obj_add(c, &o, err)) != 0) {
            LOG_ERROR(CACHE_TAG, "object %" PRIu64 " committed but not in memory: %s", w->id,
                      err ? err->msg : "");
            goto fail;
        }
        w->etag = NULL;   /* now owned by the table */
        if (c->commit_fn)
            c->commit_fn(c->commit_ctx, o.etag, o.kind, o.off, o.len);
    }
    if (id_out)
        *id_out = w->id;
    w->has_partial_row = 0;
    writer_free(w, 0);
    cache_assert_usage(c);
    if (cache_flush_due(c)) {
        /* A commit already waits for the index, so it carries the counter
         * flush the daemon's timer would otherwise do. */
        shoal_err e = { 0, "" };
        if (cache_flush(c, &e) != 0)
            LOG_WARN(CACHE_TAG, "counter flush failed (kept in memory): %s", e.msg);
    }
    return 0;
fail:
    /* The index is as before: the partial row (if any) goes too, because
     * the tmp file it names is removed. */
    writer_free(w, 0);
    return rc;
}

/* ---- filling from another thread or process (cache.h, rule 4) ---------------
 * Nothing here reaches the index, the budget or the writer list: only w's
 * file, its hash and its own fields. */

int cache_writer_allocate(cache_writer *w, shoal_err *err)
{
    if (w->state != W_WRITING)
        return shoal_err_set(err, SHOAL_EIO, "cache write %s: writer failed earlier", w->etag);
    return writer_alloc(w, err);
}

int cache_writer_open_fd(cache_writer *w, int flags, int *fd, shoal_err *err)
{
    *fd = -1;
    if (w->state != W_WRITING || !w->tmp_path[0])
        return shoal_err_set(err, SHOAL_EIO, "cache write %s: writer failed earlier", w->etag);
    *fd = open(w->tmp_path, (flags & ~O_CREAT) | O_CLOEXEC);
    if (*fd < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "cache write %s: open %s: %s",
                             w->etag, w->tmp_path, strerror(errno));
    return 0;
}

#define ADOPT_CHUNK (4u << 20)

int cache_writer_adopt(cache_writer *w, cache_progress_fn fn, void *ctx, shoal_err *err)
{
    struct stat st;
    uint8_t *buf = NULL;
    int rc = 0;

    if (w->state != W_WRITING)
        return shoal_err_set(err, SHOAL_EIO, "cache write %s: writer failed earlier", w->etag);
    if (w->n_ext > 0) {
        w->state = W_FAILED;
        return shoal_err_set(err, SHOAL_ERANGE, "cache write %s: positional writes pending; "
                             "cannot adopt", w->etag);
    }
    if (fstat(w->fd, &st) != 0)
        return errno_fail(w, "fstat", err);
    if ((uint64_t)st.st_size != w->len) {
        w->state = W_FAILED;
        return shoal_err_set(err, SHOAL_ERANGE, "the file holds %lld bytes, not the %" PRIu64
                             " announced", (long long)st.st_size, w->len);
    }
    if (!(buf = malloc(ADOPT_CHUNK))) {
        w->state = W_FAILED;
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
    }
    while (rc == 0 && w->pos < w->len) {
        size_t n = w->len - w->pos < ADOPT_CHUNK ? (size_t)(w->len - w->pos) : ADOPT_CHUNK;
        if (shoal_pread_all(w->fd, buf, n, (off_t)w->pos) != 0) {
            rc = errno_fail(w, "read", err);
            break;
        }
        shoal_xxh3_update(w->xs, buf, n);
        w->pos += n;
        if (fn && fn(ctx, w->pos, w->len) != 0) {
            w->state = W_FAILED;
            rc = shoal_err_set(err, SHOAL_ECANCELED, "cache write %s: stopped", w->etag);
        }
    }
    free(buf);
    if (rc == 0 && !w->c->cfg.no_fsync && cache_io_now.fsync(w->fd) != 0)
        rc = errno_fail(w, "fsync", err);
    if (rc == 0)
        w->synced = 1;
    return rc;
}

void cache_writer_xxh(const cache_writer *w, uint8_t out[16])
{
    XXH128_canonical_t can;
    shoal_xxh3_digest(w->xs, can.digest);
    memcpy(out, can.digest, 16);
}

void cache_write_abort(cache_writer *w)
{
    if (w)
        writer_free(w, 0);
}

int cache_write_pause(cache_writer *w, shoal_err *err)
{
    int rc;

    if (w->state != W_WRITING) {
        rc = shoal_err_set(err, SHOAL_EIO, "cache write %s: writer failed earlier", w->etag);
        writer_free(w, 0);
        return rc;
    }
    rc = writer_checkpoint(w, err);
    writer_free(w, rc == 0);
    return rc;
}

void cache_writers_abort_all(cache *c)
{
    while (c->writers) {
        cache_writer *w = c->writers;
        /* Keep what a checkpoint made durable; the repair at next open cuts
         * the file back to it. */
        writer_free(w, w->has_partial_row);
    }
}
