/* open.c — opening and closing a cache directory.
 *
 * Owns: the directory layout (blobs/, tmp/, index.db, lock), the writer
 * lock, the byte budget, the in-memory object table a writer keeps, and
 * the repair at open (docs/cache-format.md, "Recovery").  Does not own
 * writing objects (write.c) or the eviction order (evict.c).
 */
#include "cache/cache_int.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/sys.h"

void cache_config_default(cache_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->free_share = 0.90;
    cfg->floor_bytes = 10ull << 30;
    cfg->pin_kinds = CACHE_PIN_KIND(CACHE_KIND_SPINE) | CACHE_PIN_KIND(CACHE_KIND_SMALL);
    cfg->flush_events = 4096;
    cfg->flush_ms = 2000;
    cfg->checkpoint_bytes = 64ull << 20;
    cfg->partial_max_age_s = 7 * 86400;
    cfg->reserve_bytes = 1u << 20;
}

/* ---- names and hashes ---------------------------------------------------- */

void cache_blob_name(char *out, size_t cap, uint64_t id)
{
    snprintf(out, cap, "%016" PRIx64, id);
}

int cache_blob_path(const cache *c, uint64_t id, char *out, size_t cap)
{
    char name[32];
    cache_blob_name(name, sizeof name, id);
    return shoal_path_join(out, cap, c->blobs, name);
}

int cache_tmp_path(const cache *c, uint64_t id, char *out, size_t cap)
{
    char name[40];
    snprintf(name, sizeof name, "%016" PRIx64 ".part", id);
    return shoal_path_join(out, cap, c->tmp, name);
}

uint64_t cache_key_hash(const char *etag, uint64_t off, uint64_t len)
{
    uint64_t h = XXH3_64bits(etag, strlen(etag));
    uint64_t ol[2] = { off, len };
    return XXH3_64bits_withSeed(ol, sizeof ol, h);
}

uint64_t cache_id_hash(uint64_t id)
{
    /* splitmix64 finaliser: ids are sequential, the table wants spread. */
    id += 0x9E3779B97F4A7C15ull;
    id = (id ^ (id >> 30)) * 0xBF58476D1CE4E5B9ull;
    id = (id ^ (id >> 27)) * 0x94D049BB133111EBull;
    return id ^ (id >> 31);
}

int cache_obj_pinned(const cache *c, const cobj *o)
{
    return cache_pin_effective(o->pinned, c->cfg.pin_kinds, o->kind);
}

int cache_key_check(const cache_key *key, shoal_err *err)
{
    size_t n;
    if (!key || !key->etag)
        return shoal_err_set(err, SHOAL_EINVAL, "cache key without an etag");
    n = strlen(key->etag);
    if (n == 0 || n > CACHE_ETAG_MAX)
        return shoal_err_set(err, SHOAL_EINVAL, "cache key etag of %zu bytes (1..%d)", n,
                             CACHE_ETAG_MAX);
    if (key->length == 0 || key->offset > UINT64_MAX - key->length ||
        key->length > (uint64_t)INT64_MAX || key->offset > (uint64_t)INT64_MAX)
        return shoal_err_set(err, SHOAL_ERANGE, "cache key %s: bad range offset %" PRIu64
                             " length %" PRIu64, key->etag, key->offset, key->length);
    return 0;
}

/* ---- in-memory object table ----------------------------------------------- */

struct key_eq { const cache *c; const cache_key *k; };

static int obj_key_eq(const void *ctx, uint32_t v)
{
    const struct key_eq *e = ctx;
    const cobj *o = &e->c->objs[v];
    return o->off == e->k->offset && o->len == e->k->length && strcmp(o->etag, e->k->etag) == 0;
}

uint32_t cache_obj_find(const cache *c, const cache_key *key)
{
    struct key_eq e = { c, key };
    return cmap_find(&c->by_key, cache_key_hash(key->etag, key->offset, key->length),
                     obj_key_eq, &e);
}

struct id_eq { const cache *c; uint64_t id; };

static int obj_id_eq(const void *ctx, uint32_t v)
{
    const struct id_eq *e = ctx;
    return e->c->objs[v].id == e->id;
}

uint32_t cache_obj_by_id(const cache *c, uint64_t id)
{
    struct id_eq e = { c, id };
    return cmap_find(&c->by_id, cache_id_hash(id), obj_id_eq, &e);
}

int cache_obj_add(cache *c, const cobj *o, shoal_err *err)
{
    if (c->nobjs == c->capobjs) {
        size_t ncap = c->capobjs ? c->capobjs * 2 : 256;
        cobj *n = realloc(c->objs, ncap * sizeof *n);
        if (!n)
            return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory for the object table");
        c->objs = n;
        c->capobjs = ncap;
    }
    uint32_t idx = (uint32_t)c->nobjs;
    cobj *d = &c->objs[idx];
    /* Invariant 3: one object per key. */
    assert(cache_obj_find(c, &(cache_key){ o->etag, o->off, o->len }) == CMAP_NONE);
    *d = *o;
    d->keyhash = cache_key_hash(o->etag, o->off, o->len);
    if (cmap_put(&c->by_key, d->keyhash, idx) ||
        cmap_put(&c->by_id, cache_id_hash(o->id), idx)) {
        cmap_del(&c->by_key, d->keyhash, idx);
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory for the object index");
    }
    c->nobjs++;
    c->used += o->len;
    c->used_disk += cache_disk_len(c, o->len);
    if (o->id >= c->next_id)
        c->next_id = o->id + 1;
    return 0;
}

/* Remove objs[idx] from memory (frees its etag); the last entry moves into
 * its place and the maps follow it. */
void cache_obj_drop(cache *c, uint32_t idx)
{
    cobj *o = &c->objs[idx];
    uint32_t last = (uint32_t)c->nobjs - 1;

    cmap_del(&c->by_key, o->keyhash, idx);
    cmap_del(&c->by_id, cache_id_hash(o->id), idx);
    c->used -= o->len;
    c->used_disk -= cache_disk_len(c, o->len);
    free(o->etag);
    if (idx != last) {
        cobj *l = &c->objs[last];
        cmap_set(&c->by_key, l->keyhash, last, idx);
        cmap_set(&c->by_id, cache_id_hash(l->id), last, idx);
        *o = *l;
    }
    c->nobjs--;
}

/* Invariant 4: the running total equals the table's sum, and the budget
 * holds what is committed plus what writers reserved. */
void cache_assert_usage(const cache *c)
{
#ifndef NDEBUG
    uint64_t sum = 0;
    if (c->nobjs > 4096)   /* O(n): checked on small caches (the tests) */
        return;
    for (size_t i = 0; i < c->nobjs; i++)
        sum += c->objs[i].len;
    if (sum != c->used)
        LOG_ERROR(CACHE_TAG, "invariant 4 broken: used %" PRIu64 " != sum %" PRIu64, c->used, sum);
    assert(sum == c->used);
#else
    (void)c;
#endif
}

/* ---- lock and budget -------------------------------------------------------- */

uint64_t cache_disk_len(const cache *c, uint64_t len)
{
    uint64_t b = c->blksize ? c->blksize : 4096;
    return (len + b - 1) / b * b;
}

static int cache_lock(cache *c, shoal_err *err)
{
    char path[SHOAL_PATH_MAX], buf[32];
    struct stat st;

    if (shoal_path_join(path, sizeof path, c->dir, "lock"))
        return shoal_err_set(err, SHOAL_ETOOBIG, "cache path too long: %s", c->dir);
    /* 0600: a lock another user can open, they can flock too, and keep
     * every writer out */
    c->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (c->lock_fd < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "open %s: %s", path, strerror(errno));
    if (fstat(c->lock_fd, &st) == 0 && st.st_uid != geteuid())
        return shoal_err_set(err, SHOAL_ELOCKED, "the lock %s belongs to uid %u, not to you (uid "
                             "%u): another user made it and can hold it; remove it and keep %s "
                             "yours alone (mode 0700)", path, (unsigned)st.st_uid,
                             (unsigned)geteuid(), c->dir);
    if (fstat(c->lock_fd, &st) == 0 && (st.st_mode & 077))
        fchmod(c->lock_fd, 0600);
    if (flock(c->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        ssize_t n = pread(c->lock_fd, buf, sizeof buf - 1, 0);
        long pid;
        char *end;
        buf[n > 0 ? n : 0] = '\0';
        buf[strcspn(buf, "\n")] = '\0';
        if (e != EWOULDBLOCK)
            return shoal_err_set(err, SHOAL_EIO, "lock %s: %s", path, strerror(e));
        pid = strtol(buf, &end, 10);
        if (buf[0] && *end == '\0' && pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM))
            return shoal_err_set(err, SHOAL_ELOCKED,
                                 "cache %s is in use by process %ld (lock %s); one writer at a time",
                                 c->dir, pid, path);
        /* the pid written is not the holder: name what is known */
        return shoal_err_set(err, SHOAL_ELOCKED,
                             "cache %s is locked by a process that did not write its pid into %s "
                             "(it says \"%s\"%s): `fuser -v %s` names the holder", c->dir, path,
                             buf, buf[0] ? ", which is not running" : "", path);
    }
    int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (cache_io_now.ftruncate(c->lock_fd, 0) != 0 ||
        cache_io_now.pwrite(c->lock_fd, buf, (size_t)n, 0) != n)
        LOG_WARN(CACHE_TAG, "could not write the pid into %s: %s", path, strerror(errno));
    return 0;
}

/* What the disk can give the cache: free space + what it holds now. */
static int cache_disk_room(const cache *c, uint64_t *room, uint64_t *free_bytes, shoal_err *err)
{
    struct statvfs sv;
    if (statvfs(c->dir, &sv) != 0)
        return shoal_err_set(err, SHOAL_EIO, "statvfs %s: %s", c->dir, strerror(errno));
    *free_bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    /* the blocks the cache holds: committed objects and the files being
     * written (each also charged its whole reservation) */
    *room = *free_bytes + c->used_disk + cache_writers_disk(c);
    return 0;
}

/* The default: a share of what the disk can give, leaving floor_bytes free. */
static uint64_t budget_auto(const cache *c, uint64_t room)
{
    double avail = (double)room;
    double share = c->cfg.free_share > 0 && c->cfg.free_share <= 1 ? c->cfg.free_share : 0.9;
    double b = avail * share;
    if (b > avail - (double)c->cfg.floor_bytes)
        b = avail - (double)c->cfg.floor_bytes;
    return b > 0 ? (uint64_t)b : 0;
}

static int cache_budget_set(cache *c, shoal_err *err)
{
    uint64_t room = 0, free_bytes = 0;
    int rc;

    if (c->cfg.max_bytes && !c->cfg.budget_fits_disk) {
        c->budget = c->cfg.max_bytes;
        return 0;
    }
    if ((rc = cache_disk_room(c, &room, &free_bytes, err)) != 0)
        return rc;
    if (c->cfg.max_bytes) {
        char b[32], f[32], u[32], r[32], most[32];
        /* the advice rounds down, so following it works */
        if (room >= (1ull << 30))
            snprintf(most, sizeof most, "%lluG", (unsigned long long)(room >> 30));
        else
            snprintf(most, sizeof most, "%llu", (unsigned long long)room);
        if (c->cfg.max_bytes > room)
            return shoal_err_set(err, SHOAL_EINVAL, "the budget %s is larger than the disk can "
                                 "give the cache: %s free + %s cached = %s in %s; ask for at most "
                                 "%s, or free disk space",
                                 shoal_size_format(c->cfg.max_bytes, b, sizeof b),
                                 shoal_size_format(free_bytes, f, sizeof f),
                                 shoal_size_format(c->used_disk, u, sizeof u),
                                 shoal_size_format(room, r, sizeof r), c->dir, most);
        c->budget = c->cfg.max_bytes;
        return 0;
    }
    c->budget = budget_auto(c, room);
    if (c->budget == 0 && c->cfg.budget_fits_disk) {
        char f[32], u[32], fl[32];
        return shoal_err_set(err, SHOAL_ENOSPC, "the default budget is 0: %s free + %s cached in "
                             "%s is less than the %s the default leaves free on the disk; pass "
                             "--max-size SIZE (what the cache may use) or free disk space",
                             shoal_size_format(free_bytes, f, sizeof f),
                             shoal_size_format(c->used_disk, u, sizeof u), c->dir,
                             shoal_size_format(c->cfg.floor_bytes, fl, sizeof fl));
    }
    return 0;
}

/* A daemon's budget must hold what it may never evict: pinned objects
 * (the spine, small files, what `shoal pin` pinned) already cached. */
static int cache_budget_check(cache *c, shoal_err *err)
{
    uint64_t pinned = 0;
    char b[32], p[32];
    if (!c->cfg.budget_fits_disk)
        return 0;
    for (size_t i = 0; i < c->nobjs; i++)
        if (cache_obj_pinned(c, &c->objs[i]))
            pinned += cache_disk_len(c, c->objs[i].len);
    if (pinned <= c->budget)
        return 0;
    return shoal_err_set(err, SHOAL_ENOSPC, "the budget %s is below the %s of pinned objects (the "
                         "spine, small files, what `shoal pin` pinned) the cache holds in %s: pass "
                         "--max-size %s or more, or `shoal rm` a model",
                         shoal_size_format(c->budget, b, sizeof b),
                         shoal_size_format(pinned, p, sizeof p), c->dir,
                         shoal_size_format(pinned + (pinned >> 4), p, sizeof p));
}

int cache_budget_refresh(cache *c, shoal_err *err)
{
    uint64_t room = 0, free_bytes = 0, nb;
    int rc;
    if (c->cfg.read_only || !c->cfg.budget_fits_disk)
        return 0;
    if ((rc = cache_disk_room(c, &room, &free_bytes, err)) != 0)
        return rc;
    nb = c->cfg.max_bytes ? (c->cfg.max_bytes < room ? c->cfg.max_bytes : room)
                          : budget_auto(c, room);
    if (nb != c->budget) {
        char o[32], n[32], f[32];
        if (nb > c->budget + c->budget / 100 || nb + c->budget / 100 < c->budget)
            LOG_INFO(CACHE_TAG, "budget %s -> %s (%s free on the disk now)",
                     shoal_size_format(c->budget, o, sizeof o), shoal_size_format(nb, n, sizeof n),
                     shoal_size_format(free_bytes, f, sizeof f));
        c->budget = nb;
    }
    return 0;
}

/* ---- the reserve file ------------------------------------------------------ */

/* Deleting objects needs an index write; on a disk with no free block that
 * write fails and nothing could ever be freed.  The reserve is the way out:
 * cache_objs_delete gives it back, deletes, then takes it again. */
int cache_reserve_take(cache *c)
{
    char path[SHOAL_PATH_MAX];
    struct stat st;
    int fd;

    if (c->cfg.read_only || !c->cfg.reserve_bytes ||
        shoal_path_join(path, sizeof path, c->dir, "reserve"))
        return 0;
    if (stat(path, &st) == 0 && (uint64_t)st.st_blocks * 512 >= c->cfg.reserve_bytes)
        return 0;
    fd = cache_io_now.open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || cache_io_now.fallocate(fd, 0, 0, (off_t)c->cfg.reserve_bytes) != 0) {
        LOG_WARN(CACHE_TAG, "no reserve file %s (%s): a full disk may need manual cleanup",
                 path, strerror(errno));
        if (fd >= 0)
            close(fd);
        cache_io_now.unlink(path);
        return SHOAL_ENOSPC;
    }
    close(fd);
    return 0;
}

int cache_reserve_give(cache *c)
{
    char path[SHOAL_PATH_MAX];
    if (shoal_path_join(path, sizeof path, c->dir, "reserve"))
        return SHOAL_ETOOBIG;
    LOG_WARN(CACHE_TAG, "disk full: releasing the reserve of %s to record a deletion", c->dir);
    return cache_io_now.unlink(path) == 0 ? 0 : SHOAL_ENOTFOUND;
}

/* ---- repair at open ----------------------------------------------------------- */

typedef struct partial_row { uint64_t id, durable; int64_t started_ms; int seen, kind; } partial_row;

static int hex_id(const char *name, const char *suffix, uint64_t *id)
{
    size_t n = strlen(name), sl = strlen(suffix);
    uint64_t v = 0;
    if (n != 16 + sl || strcmp(name + 16, suffix) != 0)
        return -1;
    for (int i = 0; i < 16; i++) {
        int ch = name[i], d;
        if (ch >= '0' && ch <= '9') d = ch - '0';
        else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
        else return -1;
        v = v << 4 | (uint64_t)d;
    }
    *id = v;
    return 0;
}

static int load_objects(cache *c, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "SELECT id, etag, off, len, kind, layer, expert, xxh,"
                                " pinned, last_access_ms, hits, verified FROM objects", -1, &s, NULL);
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "load objects", err);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        cobj o;
        memset(&o, 0, sizeof o);
        o.id = (uint64_t)sqlite3_column_int64(s, 0);
        o.etag = strdup((const char *)sqlite3_column_text(s, 1));
        o.off = (uint64_t)sqlite3_column_int64(s, 2);
        o.len = (uint64_t)sqlite3_column_int64(s, 3);
        o.kind = (uint8_t)sqlite3_column_int(s, 4);
        o.layer = sqlite3_column_int(s, 5);
        o.expert = sqlite3_column_int(s, 6);
        if (sqlite3_column_bytes(s, 7) == 16)
            memcpy(o.xxh, sqlite3_column_blob(s, 7), 16);
        o.pinned = (uint8_t)sqlite3_column_int(s, 8);
        o.last_access_ms = sqlite3_column_int64(s, 9);
        o.hits = (uint64_t)sqlite3_column_int64(s, 10);
        o.verified = sqlite3_column_int(s, 11) == 1;
        if (!o.etag || cache_obj_add(c, &o, err)) {
            free(o.etag);
            sqlite3_finalize(s);
            return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory loading the index");
        }
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "load objects", err);
}

static int load_partials(cache *c, partial_row **out, size_t *n, shoal_err *err)
{
    sqlite3_stmt *s = NULL;
    size_t cap = 0;
    int rc = sqlite3_prepare_v2(c->db, "SELECT id, durable, started_ms, kind FROM partials", -1, &s, NULL);

    *out = NULL;
    *n = 0;
    if (rc != SQLITE_OK)
        return cache_db_fail(c, rc, "load partials", err);
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            partial_row *p = realloc(*out, cap * sizeof *p);
            if (!p) {
                sqlite3_finalize(s);
                return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
            }
            *out = p;
        }
        (*out)[*n].id = (uint64_t)sqlite3_column_int64(s, 0);
        (*out)[*n].durable = (uint64_t)sqlite3_column_int64(s, 1);
        (*out)[*n].started_ms = sqlite3_column_int64(s, 2);
        (*out)[*n].kind = sqlite3_column_int(s, 3);
        (*out)[*n].seen = 0;
        if ((*out)[*n].id >= c->next_id)
            c->next_id = (*out)[*n].id + 1;
        (*n)++;
    }
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : cache_db_fail(c, rc, "load partials", err);
}

static void unlink_at(const char *dir, const char *name)
{
    char p[SHOAL_PATH_MAX];
    if (shoal_path_join(p, sizeof p, dir, name) == 0 && cache_io_now.unlink(p) != 0)
        LOG_WARN(CACHE_TAG, "unlink %s: %s", p, strerror(errno));
}

/* Walk blobs/: drop blobs without a row and rows with a wrong size.
 * `seen` marks rows whose blob is present and right. */
static int scan_blobs(cache *c, uint8_t *seen, uint64_t **bad, size_t *nbad,
                      cache_open_report *rep, shoal_err *err)
{
    DIR *d = opendir(c->blobs);
    struct dirent *de;
    size_t cap = 0;

    if (!d)
        return shoal_err_set(err, SHOAL_EIO, "opendir %s: %s", c->blobs, strerror(errno));
    while ((de = readdir(d)) != NULL) {
        uint64_t id;
        struct stat st;
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        uint32_t idx = hex_id(de->d_name, "", &id) == 0 ? cache_obj_by_id(c, id) : CMAP_NONE;
        if (idx == CMAP_NONE) {
            LOG_INFO(CACHE_TAG, "repair: removing blob without a row: %s", de->d_name);
            unlink_at(c->blobs, de->d_name);
            rep->orphans_removed++;
            continue;
        }
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            (uint64_t)st.st_size != c->objs[idx].len) {
            LOG_WARN(CACHE_TAG, "repair: blob %s has the wrong size; removing it and its row",
                     de->d_name);
            unlink_at(c->blobs, de->d_name);
            rep->rows_bad_size++;
            continue;       /* not seen: its row is dropped below */
        }
        seen[idx] = 1;
    }
    closedir(d);
    for (size_t i = 0; i < c->nobjs; i++) {
        if (seen[i])
            continue;
        if (*nbad == cap) {
            cap = cap ? cap * 2 : 64;
            uint64_t *nb = realloc(*bad, cap * sizeof *nb);
            if (!nb)
                return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
            *bad = nb;
        }
        (*bad)[(*nbad)++] = c->objs[i].id;
    }
    rep->rows_missing = *nbad - rep->rows_bad_size;
    return 0;
}

/* Walk tmp/: keep partial files with a row (cut to their durable length),
 * remove everything else.  A derived object's partial (a PUT killed
 * midway) is never kept: only its client had the content, so nothing can
 * resume it. */
static int scan_tmp(cache *c, partial_row *parts, size_t nparts, cache_open_report *rep,
                    shoal_err *err)
{
    DIR *d = opendir(c->tmp);
    struct dirent *de;
    int64_t oldest = shoal_wall_ms() - (int64_t)c->cfg.partial_max_age_s * 1000;

    if (!d)
        return shoal_err_set(err, SHOAL_EIO, "opendir %s: %s", c->tmp, strerror(errno));
    while ((de = readdir(d)) != NULL) {
        uint64_t id;
        partial_row *p = NULL;
        struct stat st;
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        if (hex_id(de->d_name, ".part", &id) == 0)
            for (size_t i = 0; i < nparts; i++)
                if (parts[i].id == id && parts[i].kind != CACHE_KIND_DERIVED &&
                    (!c->cfg.partial_max_age_s || parts[i].started_ms >= oldest))
                    p = &parts[i];
        if (p && fstatat(dirfd(d), de->d_name, &st, 0) == 0 && (uint64_t)st.st_size >= p->durable) {
            char path[SHOAL_PATH_MAX];
            int fd = -1;
            /* Bytes past the durable length were never fsynced: cut them. */
            if (shoal_path_join(path, sizeof path, c->tmp, de->d_name) == 0)
                fd = cache_io_now.open(path, O_WRONLY | O_CLOEXEC, 0);
            if (fd >= 0 && cache_io_now.ftruncate(fd, (off_t)p->durable) == 0) {
                close(fd);
                p->seen = 1;
                rep->partials_kept++;
                continue;
            }
            if (fd >= 0)
                close(fd);
        }
        unlink_at(c->tmp, de->d_name);
        rep->tmp_removed++;
    }
    closedir(d);
    return 0;
}

static int repair_rows(cache *c, const uint64_t *bad, size_t nbad, const partial_row *parts,
                       size_t nparts, cache_open_report *rep, shoal_err *err)
{
    int rc;
    size_t dropped_parts = 0;

    for (size_t i = 0; i < nparts; i++)
        dropped_parts += !parts[i].seen;
    if (nbad == 0 && dropped_parts == 0)
        return 0;
    rc = cache_db_begin(c, err);
    for (size_t i = 0; rc == 0 && i < nbad; i++) {
        sqlite3_stmt *s = c->st[ST_OBJ_DELETE], *n = c->st[ST_NAME_DELETE];
        sqlite3_bind_int64(s, 1, (int64_t)bad[i]);
        sqlite3_bind_int64(n, 1, (int64_t)bad[i]);
        int r1 = sqlite3_step(s), r2 = sqlite3_step(n);
        sqlite3_reset(s);
        sqlite3_reset(n);
        if (r1 != SQLITE_DONE || r2 != SQLITE_DONE)
            rc = cache_db_fail(c, r1 != SQLITE_DONE ? r1 : r2, "repair: delete row", err);
    }
    for (size_t i = 0; rc == 0 && i < nparts; i++) {
        if (parts[i].seen)
            continue;
        sqlite3_stmt *s = c->st[ST_PART_DELETE];
        sqlite3_bind_int64(s, 1, (int64_t)parts[i].id);
        if (sqlite3_step(s) != SQLITE_DONE)
            rc = cache_db_fail(c, SQLITE_ERROR, "repair: delete partial", err);
        sqlite3_reset(s);
        rep->partials_dropped++;
    }
    if (rc == 0)
        rc = cache_db_commit(c, err);
    else
        cache_db_rollback(c);
    if (rc)
        return rc;
    for (size_t i = 0; i < nbad; i++) {
        uint32_t idx = cache_obj_by_id(c, bad[i]);
        if (idx != CMAP_NONE) {
            LOG_WARN(CACHE_TAG, "repair: dropped row %" PRIu64 " (blob missing or wrong size)", bad[i]);
            cache_obj_drop(c, idx);
        }
    }
    return 0;
}

static int cache_repair(cache *c, cache_open_report *rep, shoal_err *err)
{
    uint64_t t0 = shoal_now_ns();
    partial_row *parts = NULL;
    size_t nparts = 0, nbad = 0;
    uint64_t *bad = NULL;
    uint8_t *seen = NULL;
    int rc;

    rc = load_objects(c, err);
    if (rc == 0)
        rc = load_partials(c, &parts, &nparts, err);
    if (rc == 0 && !(seen = calloc(c->nobjs + 1, 1)))
        rc = shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
    if (rc == 0)
        rc = scan_blobs(c, seen, &bad, &nbad, rep, err);
    if (rc == 0)
        rc = scan_tmp(c, parts, nparts, rep, err);
    if (rc == 0)
        rc = repair_rows(c, bad, nbad, parts, nparts, rep, err);
    free(parts);
    free(bad);
    free(seen);
    rep->objects = c->nobjs;
    rep->bytes = c->used;
    rep->scan_ns = shoal_now_ns() - t0;
    if (rc == 0 && (rep->tmp_removed || rep->orphans_removed || rep->rows_missing ||
                    rep->rows_bad_size || rep->partials_dropped))
        LOG_INFO(CACHE_TAG, "repaired %s: %" PRIu64 " tmp files, %" PRIu64 " orphan blobs, %" PRIu64
                 " rows without blob, %" PRIu64 " wrong size, %" PRIu64 " partials dropped",
                 c->dir, rep->tmp_removed, rep->orphans_removed, rep->rows_missing,
                 rep->rows_bad_size, rep->partials_dropped);
    return rc;
}

/* Sessions that recorded nothing (a ping, a CLI call) are kept only among
 * the last CACHE_SESSIONS_KEPT: otherwise the table gains a row per
 * connection forever.  Sessions with counters stay (their counts are the
 * history STATS sums). */
#define CACHE_SESSIONS_KEPT 1024

static void prune_sessions(cache *c)
{
    char sql[320];
    int changes;
    snprintf(sql, sizeof sql, "DELETE FROM sessions WHERE id < (SELECT MAX(id) FROM sessions) - %d"
             " AND NOT EXISTS (SELECT 1 FROM counters WHERE counters.session = sessions.id)",
             CACHE_SESSIONS_KEPT);
    if (sqlite3_exec(c->db, sql, NULL, NULL, NULL) != SQLITE_OK) {
        LOG_WARN(CACHE_TAG, "pruning old sessions: %s", sqlite3_errmsg(c->db));
        return;
    }
    if ((changes = sqlite3_changes(c->db)) > 0)
        LOG_INFO(CACHE_TAG, "forgot %d old sessions that recorded nothing", changes);
}

/* ---- open / close ---------------------------------------------------------------- */

static int cache_open_dirs(cache *c, shoal_err *err)
{
    if (shoal_path_join(c->blobs, sizeof c->blobs, c->dir, "blobs") ||
        shoal_path_join(c->tmp, sizeof c->tmp, c->dir, "tmp"))
        return shoal_err_set(err, SHOAL_ETOOBIG, "cache path too long: %s", c->dir);
    if (!c->cfg.read_only) {
        int rc = shoal_mkdir_p(c->blobs, 0700, err);
        if (rc == 0)
            rc = shoal_mkdir_p(c->tmp, 0700, err);
        if (rc)
            return rc;
    }
    c->blobs_fd = open(c->blobs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (c->blobs_fd < 0)
        return shoal_err_set(err, errno == ENOENT ? SHOAL_ENOTFOUND : SHOAL_EIO,
                             "open %s: %s", c->blobs, strerror(errno));
    return 0;
}

int cache_open(const char *dir, const cache_config *cfg, cache **out,
               cache_open_report *report, shoal_err *err)
{
    cache_open_report rep_local;
    cache *c;
    char dbpath[SHOAL_PATH_MAX];
    int rc;

    *out = NULL;
    if (!report)
        report = &rep_local;
    memset(report, 0, sizeof *report);
    if (!dir || !*dir || strlen(dir) >= SHOAL_PATH_MAX - 64)
        return shoal_err_set(err, SHOAL_EINVAL, "cache directory missing or too long");
    c = calloc(1, sizeof *c);
    if (!c)
        return shoal_err_set(err, SHOAL_ENOMEM, "cache: out of memory");
    c->lock_fd = -1;
    c->blobs_fd = -1;
    c->next_id = 1;
    memcpy(c->dir, dir, strlen(dir) + 1);
    if (cfg)
        c->cfg = *cfg;
    else
        cache_config_default(&c->cfg);
    c->last_flush_ns = shoal_now_ns();

    if (!c->cfg.read_only && (rc = shoal_mkdir_p(dir, 0700, err)) != 0)
        goto fail;
    {
        struct statvfs sv;
        c->blksize = statvfs(dir, &sv) == 0 && sv.f_bsize ? (uint64_t)sv.f_bsize : 4096;
    }
    if (!c->cfg.read_only && (rc = cache_lock(c, err)) != 0)
        goto fail;
    if ((rc = cache_open_dirs(c, err)) != 0)
        goto fail;
    if (shoal_path_join(dbpath, sizeof dbpath, dir, "index.db")) {
        rc = shoal_err_set(err, SHOAL_ETOOBIG, "cache path too long: %s", dir);
        goto fail;
    }
    if ((rc = cache_db_open(c, dbpath, c->cfg.read_only, err)) != 0)
        goto fail;
    if (!c->cfg.read_only) {
        if ((rc = cache_repair(c, report, err)) != 0)
            goto fail;
        prune_sessions(c);
        if ((rc = cache_budget_set(c, err)) != 0 || (rc = cache_budget_check(c, err)) != 0)
            goto fail;
        if ((rc = cache_heat_load(c, err)) != 0)
            goto fail;
        cache_reserve_take(c);
        if (c->used_disk > c->budget) {
            /* The budget shrank since the last run: come down to it now. */
            shoal_err e = { 0, "" };
            if (cache_evict_for(c, 0, &e) != 0)
                LOG_WARN(CACHE_TAG, "cache holds more than its budget: %s", e.msg);
        }
        cache_assert_usage(c);
    }
    *out = c;
    return 0;
fail:
    shoal_err_wrap(err, rc, "open cache %s", dir);
    cache_close(c);
    return rc;
}

void cache_close(cache *c)
{
    if (!c)
        return;
    cache_writers_abort_all(c);
    if (c->db && !c->cfg.read_only && (c->pending_events || c->ndirty)) {
        shoal_err e = { 0, "" };
        if (cache_flush(c, &e) != 0)
            LOG_WARN(CACHE_TAG, "close: counters not flushed: %s", e.msg);
    }
    cache_db_close(c);
    for (size_t i = 0; i < c->nobjs; i++)
        free(c->objs[i].etag);
    free(c->objs);
    free(c->dirty);
    cmap_free(&c->by_key);
    cmap_free(&c->by_id);
    cache_stats_free(c);
    cache_heat_free(c);
    if (c->blobs_fd >= 0)
        close(c->blobs_fd);
    if (c->lock_fd >= 0)
        close(c->lock_fd);    /* releases the flock */
    free(c);
}

int cache_usage_get(cache *c, cache_usage *out, shoal_err *err)
{
    memset(out, 0, sizeof *out);
    if (c->cfg.read_only) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(c->db, "SELECT count(*), coalesce(sum(len),0) FROM objects",
                                    -1, &s, NULL);
        if (rc != SQLITE_OK)
            return cache_db_fail(c, rc, "usage", err);
        if (sqlite3_step(s) == SQLITE_ROW) {
            out->objects = (uint64_t)sqlite3_column_int64(s, 0);
            out->used = (uint64_t)sqlite3_column_int64(s, 1);
        }
        sqlite3_finalize(s);
        return 0;
    }
    out->budget = c->budget;
    out->used = c->used;
    out->reserved = c->reserved;
    out->objects = c->nobjs;
    out->evicted = c->evicted;
    out->evicted_bytes = c->evicted_bytes;
    for (size_t i = 0; i < c->nobjs; i++) {
        const cobj *o = &c->objs[i];
        if (cache_obj_pinned(c, o))
            out->pinned += o->len;
        else if (o->pinned == CACHE_PINNED_LIFTED)
            out->lifted += o->len;
        if (o->kind == CACHE_KIND_DERIVED)
            continue;
        if (o->verified)
            out->verified += o->len;
        else
            out->trusted += o->len;
    }
    return 0;
}
