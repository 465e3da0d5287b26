/* upstream.c — opening an upstream, pinning it, resolving its files, and
 * the blocking, retried reads the manifest builder uses.
 *
 * Owns: the Hub/directory split, the revision -> commit pin, the per-file
 * resolution cache (memory, then the cache index until the CDN location
 * expires, then a HEAD), backoff with jitter, and the local snapshot
 * identity (etags from Hugging Face cache symlinks, else from file
 * metadata).  Does not own the multi transfers (xfer_*.c) nor the manifest
 * (model.c).
 *
 * Threads: a manifest build reads shard headers on several threads, each
 * with its own hub_client (up_client_new, the *_on functions); u->mu
 * guards what they share — the file records, the counters, the jitter
 * state and the cache handle — and is never held across a request.
 * Backoff sleeps are cut short when o.stop is set.
 */
#include "fetcher/fetch_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <xxhash.h>

#include "common/log.h"
#include "common/sys.h"
#include "fetcher/http_int.h"

/* Refresh a cached CDN location this long before it expires. */
#define UP_EXPIRY_MARGIN_MS 60000
#define UP_MAX_FORCED_RESOLVES 4

/* Copy src into dst[cap]; -1 (dst empty) if it does not fit. */
static int copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap) {
        dst[0] = '\0';
        return -1;
    }
    memcpy(dst, src, n + 1);
    return 0;
}

static char *dup_or_null(const char *s)
{
    return s && s[0] ? strdup(s) : NULL;
}

static void st_inc(fetch_upstream *u, uint64_t *counter)
{
    pthread_mutex_lock(&u->mu);
    (*counter)++;
    pthread_mutex_unlock(&u->mu);
}

static int stopped(const fetch_upstream *u)
{
    return u->o.stop && atomic_load(u->o.stop);
}

static up_file *file_get_locked(fetch_upstream *u, const char *path)
{
    up_file *f;
    for (size_t i = 0; i < u->nfiles; i++)
        if (strcmp(u->files[i]->path, path) == 0)
            return u->files[i];
    if (u->nfiles == u->cap_files) {
        size_t nc = u->cap_files ? u->cap_files * 2 : 16;
        up_file **p = realloc(u->files, nc * sizeof *p);
        if (!p)
            return NULL;
        u->files = p;
        u->cap_files = nc;
    }
    f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return NULL;
    }
    u->files[u->nfiles++] = f;
    return f;
}

up_file *up_file_get(fetch_upstream *u, const char *path)
{
    up_file *f;
    pthread_mutex_lock(&u->mu);
    f = file_get_locked(u, path);
    pthread_mutex_unlock(&u->mu);
    return f;
}

long up_backoff_ms(fetch_upstream *u, int attempt, long hint_s)
{
    long base = u->o.backoff_ms, cap = u->o.backoff_max_ms, ms;
    uint64_t x;

    /* xorshift64*: jitter so that parallel transfers do not retry in step. */
    pthread_mutex_lock(&u->mu);
    x = u->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    u->rng = x;
    pthread_mutex_unlock(&u->mu);
    x *= 0x2545F4914F6CDD1Dull;
    if (hint_s >= 0)   /* the server's word, plus up to 100 ms */
        return (hint_s < u->o.max_wait_s ? hint_s : u->o.max_wait_s) * 1000 + (long)(x % 100);
    ms = base;
    for (int i = 1; i < attempt && ms < cap; i++)
        ms *= 2;
    if (ms > cap)
        ms = cap;
    return ms + (long)(x % (uint64_t)(ms / 4 + 1));
}

/* Sleep ms, in slices of at most 50 ms so that o.stop cuts it short. */
static void sleep_ms(const fetch_upstream *u, long ms)
{
    while (ms > 0 && !stopped(u)) {
        long step = ms < 50 ? ms : 50;
        struct timespec ts = { 0, step * 1000000L };
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
        ms -= step;
    }
}

static int transient(int rc)
{
    return rc == SHOAL_EBUSY || rc == SHOAL_ENET || rc == SHOAL_ETIMEOUT || rc == SHOAL_EOFFLINE;
}

/* Give up now?  An unreachable host (EOFFLINE) after
 * HTTP_UNREACHABLE_ATTEMPTS, anything else after max_attempts. */
static int give_up(const fetch_upstream *u, int rc, int attempt)
{
    return !transient(rc) || attempt >= (rc == SHOAL_EOFFLINE ? HTTP_UNREACHABLE_ATTEMPTS
                                                               : u->o.max_attempts);
}

/* The cache's record of f's resolution. */
static void file_record(const fetch_upstream *u, const up_file *f, cache_file *cf)
{
    memset(cf, 0, sizeof *cf);
    snprintf(cf->endpoint, sizeof cf->endpoint, "%s", u->endpoint);
    snprintf(cf->repo, sizeof cf->repo, "%s", u->spec.repo);
    snprintf(cf->commit, sizeof cf->commit, "%s", u->commit);
    snprintf(cf->path, sizeof cf->path, "%s", f->path);
    snprintf(cf->etag, sizeof cf->etag, "%s", f->hf.etag);
    cf->size = f->hf.size;
    if (strlen(f->hf.location) < sizeof cf->location)
        memcpy(cf->location, f->hf.location, strlen(f->hf.location) + 1);
    cf->location_expires_ms = f->expires_ms;
}

void up_file_store(fetch_upstream *u, up_file *f, const hub_file *hf)
{
    cache_file cf;
    shoal_err e;

    pthread_mutex_lock(&u->mu);
    f->hf = *hf;
    f->ready = 1;
    f->expires_ms = hf->is_lfs ? http_url_expiry_ms(hf->location) : 0;
    if (!u->c || u->local || u->deferring) {
        f->unrecorded = u->deferring;
        pthread_mutex_unlock(&u->mu);
        return;
    }
    file_record(u, f, &cf);
    if (cache_file_put(u->c, &cf, &e) != 0)
        LOG_WARN("fetch", "recording the resolution of %s: %s", f->path, e.msg);
    pthread_mutex_unlock(&u->mu);
}

/* The cache index's record, if its location is still good. */
static int resolve_from_cache(fetch_upstream *u, up_file *f)
{
    cache_file cf;
    hub_file hf;
    int rc;

    pthread_mutex_lock(&u->mu);
    rc = !u->c || cache_file_get(u->c, u->endpoint, u->spec.repo, u->commit, f->path, &cf, NULL);
    pthread_mutex_unlock(&u->mu);
    if (rc)
        return -1;
    /* Offline the etag and size are what matter (the manifest); a transfer
     * is not made (FETCH_OFFLINE) or finds the CDN unreachable too. */
    if (!u->offline && (!cf.location[0]
                        || (cf.location_expires_ms != 0
                            && cf.location_expires_ms < shoal_wall_ms() + UP_EXPIRY_MARGIN_MS)))
        return -1;
    memset(&hf, 0, sizeof hf);
    if (copy_str(hf.commit, sizeof hf.commit, u->commit)
        || copy_str(hf.etag, sizeof hf.etag, cf.etag))
        return -1;
    snprintf(hf.location, sizeof hf.location, "%s", cf.location);
    hf.size = cf.size;
    hf.is_lfs = !hub_url_same_origin(cf.location, u->endpoint);
    f->hf = hf;
    f->ready = 1;
    f->expires_ms = cf.location_expires_ms;
    return 0;
}

/* HEAD path at `revision` with retries, over hc. */
static int resolve_head(fetch_upstream *u, hub_client *hc, const char *revision, const char *path,
                        hub_file *hf, shoal_err *err)
{
    hub_spec sp = u->spec;
    int rc = 0;

    snprintf(sp.revision, sizeof sp.revision, "%s", revision);
    for (int attempt = 1;; attempt++) {
        st_inc(u, &u->st.requests);
        st_inc(u, &u->st.resolves);
        rc = hub_file_resolve(hc, &sp, path, hf, err);
        if (rc == 0 || give_up(u, rc, attempt))
            break;
        st_inc(u, &u->st.retries);
        LOG_INFO("fetch", "resolve %s: %s; retrying", path, err ? err->msg : shoal_strerror(rc));
        sleep_ms(u, up_backoff_ms(u, attempt, hub_client_retry_after(hc)));
        if (stopped(u))
            return shoal_err_set(err, SHOAL_ECANCELED, "resolve %s: stopped", path);
    }
    if (rc == SHOAL_EOFFLINE)
        shoal_err_wrap(err, rc, "the Hub cannot be reached (tried %d times)",
                       HTTP_UNREACHABLE_ATTEMPTS);
    else if (rc && transient(rc))
        shoal_err_wrap(err, rc, "giving up after %d attempts (too many failures)",
                       u->o.max_attempts);
    return rc;
}

int up_cached(fetch_upstream *u, const char *path, up_file **out)
{
    up_file *f = up_file_get(u, path);
    *out = f;
    if (!f)
        return -1;
    if (f->ready)
        return 0;
    return !f->ready && resolve_from_cache(u, f) == 0 ? 0 : -1;
}

static int resolve_on(fetch_upstream *u, hub_client *hc, const char *path, int force,
                      up_file **out, shoal_err *err)
{
    up_file *f = up_file_get(u, path);
    hub_file hf;
    int rc;

    if (!f)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    *out = f;
    /* In memory a location is used until the CDN refuses it (403): a
     * margin would re-resolve every request when URLs live shorter than
     * it.  The index's copy gets the margin: it may be hours old. */
    if (!force && f->ready)
        return 0;
    if (!force && !f->ready && resolve_from_cache(u, f) == 0)
        return 0;
    if (u->offline && up_peer_resolve(u, f) == 0)
        return 0;
    if (u->offline == FETCH_OFFLINE)
        return shoal_err_set(err, SHOAL_EOFFLINE, "%s of %s at commit %.12s is not in the cache "
                             "and HF_HUB_OFFLINE is set: unset it to fetch it", path,
                             u->spec.repo, u->commit);
    rc = resolve_head(u, hc, u->commit, path, &hf, err);
    if (rc == SHOAL_EOFFLINE && up_peer_resolve(u, f) == 0)
        return 0;
    if (rc)
        return rc;
    if (strcmp(hf.commit, u->commit) != 0)
        return shoal_err_set(err, SHOAL_EPROTO, "%s: resolved at commit %s to commit %s",
                             path, u->commit, hf.commit);
    if (f->ready && (strcmp(f->hf.etag, hf.etag) != 0 || f->hf.size != hf.size))
        return shoal_err_set(err, SHOAL_EPROTO, "%s changed under the pinned commit %s "
                             "(etag %s -> %s)", path, u->commit, f->hf.etag, hf.etag);
    up_file_store(u, f, &hf);
    return 0;
}

int up_resolve(fetch_upstream *u, const char *path, int force, up_file **out, shoal_err *err)
{
    return resolve_on(u, u->hc, path, force, out, err);
}

int up_client_new(fetch_upstream *u, hub_client **out, shoal_err *err)
{
    hub_options ho = { u->endpoint, u->o.token, u->o.connect_timeout_ms, u->o.stall_secs,
                       u->o.stop };
    *out = NULL;
    return u->local ? 0 : hub_client_new(&ho, out, err);
}

const char *up_model_endpoint(const fetch_upstream *u)
{
    return u->local ? "" : u->endpoint;
}

int up_local_path(const fetch_upstream *u, const char *path, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s/%s", u->dir, path);
    return n < 0 || (size_t)n >= cap ? SHOAL_ETOOBIG : 0;
}

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* 1 when the file at full hashes to hex (64: sha256 of the bytes, 40: the
 * git blob sha1 over "blob <size>\0" and the bytes), 0 when it does not, a
 * negative code when it cannot be read. */
int up_hash_matches(const char *full, const char *hex, size_t hl, uint64_t size)
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char dig[EVP_MAX_MD_SIZE];
    char got[2 * EVP_MAX_MD_SIZE + 1];
    unsigned int dn = 0;
    size_t bufsz = 1u << 20;
    uint8_t *buf = malloc(bufsz);
    uint64_t off = 0;
    int fd = open(full, O_RDONLY | O_CLOEXEC), rc = 0;

    if (!md || !buf || fd < 0) {
        rc = fd < 0 ? SHOAL_EIO : SHOAL_ENOMEM;
        goto out;
    }
    EVP_DigestInit_ex(md, hl == 64 ? EVP_sha256() : EVP_sha1(), NULL);
    if (hl == 40) {
        char head[48];
        int hn = snprintf(head, sizeof head, "blob %" PRIu64, size);
        EVP_DigestUpdate(md, head, (size_t)hn + 1);
    }
    while (off < size) {
        size_t want = size - off < bufsz ? (size_t)(size - off) : bufsz;
        if (shoal_pread_all(fd, buf, want, (off_t)off) != 0) {
            rc = SHOAL_EIO;
            goto out;
        }
        EVP_DigestUpdate(md, buf, want);
        off += want;
    }
    EVP_DigestFinal_ex(md, dig, &dn);
    for (unsigned i = 0; i < dn; i++)
        snprintf(got + 2 * i, 3, "%02x", dig[i]);
    rc = strlen(got) == hl && memcmp(got, hex, hl) == 0;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    EVP_MD_CTX_free(md);
    return rc;
}

/* A local file's etag.  When it is a Hugging Face cache symlink whose blob
 * is named by a sha256 or git sha1 (the Hub's own etag), that name, but
 * only once the bytes were hashed and match it: the etag is a cache key
 * shared with the Hub model of the same name, and a blob holding other
 * bytes under a real name must not become those objects (docs/fetcher.md,
 * "Local snapshots").  Else a hash of where the file is and its size,
 * mtime and inode (a rewritten file gets a new etag), which no Hub model
 * shares.  The hash runs once per manifest build: a built manifest is
 * kept under the directory's identity (u->ident), which changes with any
 * file's size, mtime or inode. */
static int local_stat(fetch_upstream *u, const char *path, char *etag, size_t cap, uint64_t *size,
                      shoal_err *err)
{
    char full[PATH_MAX], link[PATH_MAX], rp[PATH_MAX];
    struct stat st, lst;
    ssize_t ln;

    if (up_local_path(u, path, full, sizeof full))
        return shoal_err_set(err, SHOAL_ETOOBIG, "path too long: %s", path);
    if (stat(full, &st) != 0)
        return shoal_err_set(err, errno == ENOENT ? SHOAL_ENOTFOUND : SHOAL_EIO,
                             "file '%s' not found in the snapshot directory %s: %s", path, u->dir,
                             strerror(errno));
    if (!S_ISREG(st.st_mode))
        return shoal_err_set(err, SHOAL_EFORMAT, "%s is not a regular file", full);
    *size = (uint64_t)st.st_size;
    if (lstat(full, &lst) == 0 && S_ISLNK(lst.st_mode)
        && (ln = readlink(full, link, sizeof link - 1)) > 0) {
        const char *base;
        size_t bl;
        link[ln] = '\0';
        base = strrchr(link, '/');
        base = base ? base + 1 : link;
        bl = strlen(base);
        if ((bl == 64 || bl == 40) && is_hex(base, bl) && bl < cap) {
            int m = up_hash_matches(full, base, bl, *size);
            if (m == 1) {
                memcpy(etag, base, bl + 1);
                return 0;
            }
            LOG_WARN("fetch", "%s: its blob %s does not hash to its name%s; keyed as a local "
                     "file, shared with no Hub model", full, base, m < 0 ? " (unreadable)" : "");
        }
    }
    if (!realpath(full, rp))
        snprintf(rp, sizeof rp, "%s", full);
    {
        char buf[PATH_MAX + 96];
        int n = snprintf(buf, sizeof buf, "%s|%" PRIu64 "|%lld.%09ld|%llu", rp, *size,
                         (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                         (unsigned long long)st.st_ino);
        XXH128_hash_t h = XXH3_128bits(buf, (size_t)(n > 0 ? n : 0));
        snprintf(etag, cap, "local-%016llx%016llx", (unsigned long long)h.high64,
                 (unsigned long long)h.low64);
    }
    return 0;
}

int up_stat(fetch_upstream *u, const char *path, char *etag, size_t cap, uint64_t *size,
            shoal_err *err)
{
    return up_stat_on(u, NULL, path, etag, cap, size, err);
}

int up_stat_on(fetch_upstream *u, hub_client *hc, const char *path, char *etag, size_t cap,
               uint64_t *size, shoal_err *err)
{
    up_file *f;
    int rc;
    if (u->local)
        return local_stat(u, path, etag, cap, size, err);
    rc = resolve_on(u, hc ? hc : u->hc, path, 0, &f, err);
    if (rc)
        return rc;
    if (strlen(f->hf.etag) >= cap)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%s: etag too long", path);
    memcpy(etag, f->hf.etag, strlen(f->hf.etag) + 1);
    *size = f->hf.size;
    return 0;
}

static int local_read(fetch_upstream *u, const char *path, uint64_t off, size_t len, void *buf,
                      shoal_err *err)
{
    char full[PATH_MAX];
    int fd, rc;
    if (up_local_path(u, path, full, sizeof full))
        return shoal_err_set(err, SHOAL_ETOOBIG, "path too long: %s", path);
    fd = open(full, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "open %s: %s", full, strerror(errno));
    rc = shoal_pread_all(fd, buf, len, (off_t)off);
    close(fd);
    if (rc)
        return shoal_err_set(err, rc, "read %zu bytes at %" PRIu64 " of %s: %s", len, off, full,
                             rc == SHOAL_ERANGE ? "file too short" : strerror(errno));
    return 0;
}

int up_read(fetch_upstream *u, const char *path, uint64_t off, size_t len, void *buf,
            shoal_err *err)
{
    return up_read_on(u, NULL, path, off, len, buf, err);
}

int up_read_on(fetch_upstream *u, hub_client *hc, const char *path, uint64_t off, size_t len,
               void *buf, shoal_err *err)
{
    up_file *f;
    int rc, forced = 0;

    if (len == 0)
        return 0;
    if (u->local)
        return local_read(u, path, off, len, buf, err);
    if (!hc)
        hc = u->hc;
    rc = resolve_on(u, hc, path, 0, &f, err);
    if (rc)
        return rc;
    if (up_peer_check(u, f))   /* the HF cache's verified blob, in place */
        return up_peer_read(u, f, off, len, buf, err);
    for (int attempt = 1;; attempt++) {
        st_inc(u, &u->st.requests);
        rc = hub_range_read(hc, &f->hf, off, off + len - 1, buf, err);
        if (rc == 0)
            return 0;
        if (rc == SHOAL_EAUTH && f->hf.is_lfs && hub_client_last_status(hc) == 403
            && forced++ < UP_MAX_FORCED_RESOLVES) {
            LOG_INFO("fetch", "%s: the CDN refused the location; resolving again", path);
            rc = resolve_on(u, hc, path, 1, &f, err);
            if (rc)
                return rc;
            continue;
        }
        if (!(transient(rc) || rc == SHOAL_EPROTO))
            break;
        if (rc == SHOAL_EOFFLINE && attempt >= HTTP_UNREACHABLE_ATTEMPTS) {
            shoal_err_wrap(err, rc, "the upstream cannot be reached");
            break;
        }
        if (attempt >= u->o.max_attempts) {
            shoal_err_wrap(err, rc, "giving up after %d attempts (too many failures)", attempt);
            break;
        }
        if (rc == SHOAL_EPROTO)
            st_inc(u, &u->st.refused);
        st_inc(u, &u->st.retries);
        LOG_INFO("fetch", "read %s: %s; retrying", path, err ? err->msg : shoal_strerror(rc));
        sleep_ms(u, up_backoff_ms(u, attempt, hub_client_retry_after(hc)));
        if (stopped(u))
            return shoal_err_set(err, SHOAL_ECANCELED, "read %s: stopped", path);
    }
    return rc;
}

/* ---- open -------------------------------------------------------------------- */

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A directory's identity: a hash over its regular files' names, sizes and
 * mtimes (of the blobs the links point to); its commit is "local-<that>",
 * or <commit> for a snapshot under .../snapshots/<commit>. */
static int local_commit(fetch_upstream *u, shoal_err *err)
{
    DIR *d = opendir(u->dir);
    struct dirent *de;
    char **names = NULL;
    size_t n = 0, cap = 0;
    XXH3_state_t *h;
    const char *base = strrchr(u->dir, '/');
    char parent[PATH_MAX];
    int rc = 0;

    base = base ? base + 1 : u->dir;
    snprintf(parent, sizeof parent, "%.*s", (int)(base - u->dir), u->dir);
    if (!d)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "open %s: %s", u->dir, strerror(errno));
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (n == cap) {
            char **p = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *p);
            if (!p) {
                rc = SHOAL_ENOMEM;
                break;
            }
            names = p;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = SHOAL_ENOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    h = XXH3_createState();
    if (rc == 0 && h) {
        qsort(names, n, sizeof *names, name_cmp);
        XXH3_128bits_reset(h);
        for (size_t i = 0; i < n; i++) {
            char full[PATH_MAX], line[PATH_MAX + 64];
            struct stat st;
            int len;
            if (up_local_path(u, names[i], full, sizeof full) || stat(full, &st) != 0
                || !S_ISREG(st.st_mode))
                continue;
            len = snprintf(line, sizeof line, "%s%c%lld%c%lld.%09ld\n", names[i], 0,
                           (long long)st.st_size, 0, (long long)st.st_mtim.tv_sec,
                           st.st_mtim.tv_nsec);
            XXH3_128bits_update(h, line, (size_t)len);
        }
        {
            XXH128_hash_t v = XXH3_128bits_digest(h);
            snprintf(u->ident, sizeof u->ident, "%016llx%016llx",
                     (unsigned long long)v.high64, (unsigned long long)v.low64);
            /* A snapshot under .../snapshots/<commit> is named by it; its
             * identity still keys the manifest (a changed blob rebuilds). */
            if (strlen(base) == 40 && is_hex(base, 40) && strstr(parent, "/snapshots/"))
                snprintf(u->commit, sizeof u->commit, "%s", base);
            else
                snprintf(u->commit, sizeof u->commit, "local-%s", u->ident);
        }
    } else if (rc == 0) {
        rc = SHOAL_ENOMEM;
    }
    XXH3_freeState(h);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return rc ? shoal_err_set(err, rc, "listing %s: out of memory", u->dir) : 0;
}

static int open_local(fetch_upstream *u, const char *spec, shoal_err *err)
{
    char rp[PATH_MAX];
    struct stat st;
    if (strncmp(spec, "file://", 7) == 0)
        spec += 7;
    if (!realpath(spec, rp) || stat(rp, &st) != 0 || !S_ISDIR(st.st_mode))
        return shoal_err_set(err, SHOAL_ENOTFOUND,
                             "'%s' is neither hf://org/name[@revision] nor a directory", spec);
    u->local = 1;
    u->dir = strdup(rp);
    u->endpoint = strdup(UP_LOCAL_ENDPOINT);
    if (!u->dir || !u->endpoint)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if (copy_str(u->spec.repo, sizeof u->spec.repo, rp))
        return shoal_err_set(err, SHOAL_ETOOBIG, "directory path too long: %s", rp);
    snprintf(u->spec.revision, sizeof u->spec.revision, "local");
    return local_commit(u, err);
}

/* Offline: the revision's last known commit from the cache index. */
static int pin_from_cache(fetch_upstream *u, const char *why, shoal_err *err)
{
    cache_model cm;
    int rc;

    if (!u->c)
        return shoal_err_set(err, SHOAL_EOFFLINE, "%s (offline: %s) and no cache to resolve "
                             "%s from", u->o.model, why, u->spec.revision);
    pthread_mutex_lock(&u->mu);
    rc = cache_model_get(u->c, u->endpoint, u->spec.repo, u->spec.revision, &cm, NULL);
    pthread_mutex_unlock(&u->mu);
    if (rc)
        return shoal_err_set(err, SHOAL_EOFFLINE, "%s: offline (%s) and %s@%s was never opened "
                             "from %s here: nothing cached to resolve it from", u->o.model, why,
                             u->spec.repo, u->spec.revision, u->endpoint);
    snprintf(u->commit, sizeof u->commit, "%.*s", (int)sizeof u->commit - 1, cm.commit);
    LOG_WARN("fetch", "%s: offline (%s); %s resolves to its last known commit %s", u->o.model,
             why, u->spec.revision, u->commit);
    return 0;
}

static int open_hub(fetch_upstream *u, shoal_err *err)
{
    hub_options ho = { u->endpoint, u->o.token, u->o.connect_timeout_ms, u->o.stall_secs,
                       u->o.stop };
    hub_file hf;
    up_file *f;
    int rc = hub_spec_parse(u->o.model, &u->spec, err);

    rc = rc ? rc : hub_client_new(&ho, &u->hc, err);
    if (rc)
        return rc;
    up_peer_find(u);
    if (http_is_commit(u->spec.revision)) {
        snprintf(u->commit, sizeof u->commit, "%s", u->spec.revision);
        return 0;
    }
    if (u->offline == FETCH_OFFLINE)
        return pin_from_cache(u, "HF_HUB_OFFLINE is set", err) == 0 || up_peer_commit(u, NULL) == 0
                   ? 0 : SHOAL_EOFFLINE;
    /* The pin: config.json at the revision names the commit every later
     * request uses.  A Hub that cannot be reached (or keeps failing) pins
     * the revision to its last known commit instead. */
    rc = resolve_head(u, u->hc, u->spec.revision, "config.json", &hf, err);
    if (rc == SHOAL_EOFFLINE || rc == SHOAL_ENET || rc == SHOAL_ETIMEOUT || rc == SHOAL_EBUSY) {
        shoal_err why = *err;
        if (pin_from_cache(u, why.msg, err) == 0 || up_peer_commit(u, NULL) == 0) {
            u->offline = FETCH_UNREACHABLE;
            return 0;
        }
        *err = why;
        err->code = rc == SHOAL_EBUSY ? rc : SHOAL_EOFFLINE;
        return shoal_err_wrap(err, err->code, "%s@%s was never opened here (nothing cached "
                              "resolves it) and", u->spec.repo, u->spec.revision);
    }
    if (rc)
        return rc;
    snprintf(u->commit, sizeof u->commit, "%s", hf.commit);
    f = up_file_get(u, "config.json");
    if (!f)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    up_file_store(u, f, &hf);
    return 0;
}

int fetch_upstream_open(const fetch_options *o, cache *c, fetch_upstream **out, shoal_err *err)
{
    fetch_upstream *u = calloc(1, sizeof *u);
    int rc;

    *out = NULL;
    if (!u)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    u->o = *o;
    u->c = c;
    u->deferring = o->defer_records;
    u->offline = o->offline ? FETCH_OFFLINE : FETCH_ONLINE;
    pthread_mutex_init(&u->mu, NULL);
    if (u->o.parallel <= 0)
        u->o.parallel = FETCH_DEFAULT_PARALLEL;
    if (u->o.coalesce_bytes == 0)
        u->o.coalesce_bytes = FETCH_DEFAULT_COALESCE;
    if (u->o.max_attempts <= 0)
        u->o.max_attempts = FETCH_DEFAULT_ATTEMPTS;
    if (u->o.stall_secs <= 0)
        u->o.stall_secs = 30;
    if (u->o.connect_timeout_ms <= 0)
        u->o.connect_timeout_ms = 10000;
    if (u->o.backoff_ms <= 0)
        u->o.backoff_ms = 1000;
    if (u->o.backoff_max_ms <= 0)
        u->o.backoff_max_ms = 8000;
    if (u->o.max_wait_s <= 0)
        u->o.max_wait_s = 60;
    u->rng = o->seed ? o->seed : (shoal_now_ns() | 1);
    u->o.model = NULL;
    u->o.endpoint = NULL;
    u->o.token = dup_or_null(o->token);
    if (o->token && o->token[0]) {
        size_t n = strlen(o->token) + 32;
        u->token_line = malloc(n);
        if (u->token_line)
            snprintf(u->token_line, n, "Authorization: Bearer %s", o->token);
    }
    u->o.model = o->model ? strdup(o->model) : NULL;
    u->o.hf_cache = dup_or_null(o->hf_cache);
    u->o.peer_memo = dup_or_null(o->peer_memo);
    if (!u->o.model || (o->token && o->token[0] && (!u->o.token || !u->token_line))) {
        fetch_upstream_free(u);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    if (strncmp(o->model, "hf://", 5) == 0) {
        u->endpoint = strdup(o->endpoint && o->endpoint[0] ? o->endpoint : HUB_DEFAULT_ENDPOINT);
        while (u->endpoint && strlen(u->endpoint) > 1 && u->endpoint[strlen(u->endpoint) - 1] == '/')
            u->endpoint[strlen(u->endpoint) - 1] = '\0';
        rc = u->endpoint ? open_hub(u, err) : shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    } else {
        rc = open_local(u, o->model, err);
    }
    if (rc == 0 && c && !u->deferring) {
        int64_t id;
        shoal_err e;
        if (cache_model_put(c, up_model_endpoint(u), u->spec.repo, u->spec.revision, u->commit, &id, &e))
            LOG_WARN("fetch", "recording the model: %s", e.msg);
    }
    if (rc) {
        fetch_upstream_free(u);
        return rc;
    }
    LOG_INFO("fetch", "%s pinned to commit %s", o->model, u->commit);
    *out = u;
    return 0;
}

void fetch_upstream_free(fetch_upstream *u)
{
    if (!u)
        return;
    hub_client_free(u->hc);
    for (size_t i = 0; i < u->nfiles; i++) {
        free(u->files[i]->path);
        free(u->files[i]->peer_blob);
        free(u->files[i]);
    }
    free(u->peer);
    free((char *)u->o.hf_cache);
    free((char *)u->o.peer_memo);
    free(u->files);
    if (u->token_line) {
        memset(u->token_line, 0, strlen(u->token_line));
        free(u->token_line);
    }
    if (u->o.token) {
        memset((char *)u->o.token, 0, strlen(u->o.token));
        free((char *)u->o.token);
    }
    free((char *)u->o.model);
    free(u->endpoint);
    free(u->dir);
    pthread_mutex_destroy(&u->mu);
    free(u);
}

int fetch_upstream_set_cache(fetch_upstream *u, cache *c, shoal_err *err)
{
    cache_file *v = NULL;
    size_t n = 0;
    int rc = 0;

    pthread_mutex_lock(&u->mu);
    u->c = c;
    if (c && u->deferring) {
        u->deferring = 0;
        if (!u->local) {
            v = calloc(u->nfiles ? u->nfiles : 1, sizeof *v);
            for (size_t i = 0; v && i < u->nfiles; i++)
                if (u->files[i]->ready && u->files[i]->unrecorded)
                    file_record(u, u->files[i], &v[n++]);
        }
        for (size_t i = 0; i < u->nfiles; i++)
            u->files[i]->unrecorded = 0;
        if (!u->local && !v)
            rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        if (rc == 0)
            rc = cache_files_put(c, v, n, err);
        if (rc == 0 && u->commit[0])
            rc = cache_model_put(c, up_model_endpoint(u), u->spec.repo, u->spec.revision,
                                 u->commit, NULL, err);
    }
    pthread_mutex_unlock(&u->mu);
    free(v);
    return rc;
}

const char *fetch_upstream_commit(const fetch_upstream *u)
{
    return u->commit;
}

int fetch_upstream_is_local(const fetch_upstream *u)
{
    return u->local;
}

int fetch_upstream_offline(const fetch_upstream *u)
{
    return u->local ? FETCH_ONLINE : u->offline;
}

void fetch_upstream_stats(const fetch_upstream *u, fetch_stats *out)
{
    *out = u->st;
}
