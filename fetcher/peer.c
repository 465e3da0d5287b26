/* peer.c — an existing huggingface_hub cache as a peer of the Hub for the
 * same hf:// name (docs/fetcher.md, "The Hugging Face cache").
 *
 * Owns: finding models--org--name under the HF cache, a revision's commit
 * from its refs/ (when the Hub cannot answer), a file's etag and size from
 * its snapshot symlink (offline), and the rule that a blob is used only
 * once its bytes hash to the etag (sha256 for LFS files, git blob sha1 for
 * small ones) — hashed once, then remembered by (etag, size, mtime, inode,
 * ctime, path) in fetch_options.peer_memo so later opens only stat, the memo
 * pruned of blobs gone or changed and bounded (PEER_MEMO_MAX_LINES).
 * Verified blobs are read in place: the manifest build's reads pread them,
 * and the daemon hands their descriptors to engines
 * (fetch_upstream_peer_blob, with the stat the blob had when verified, so
 * it serves the blob only while that stat holds, and
 * fetch_upstream_peer_drop when it no longer does); nothing is copied into
 * the cache.  Never writes into the HF cache.
 *
 * The memo file, one line per verified blob, oldest first:
 *
 *   <etag> <size> <mtime s>.<mtime ns, 9 digits> <inode> c<ctime s> <blob path>\n
 *
 * (lines of the first format end after the inode: still honoured, and
 * rewritten with the ctime and path when this model's blobs/<etag>
 * matches them).  The ctime is there because a write moves it even when
 * the mtime is set back by hand; a blob only renamed or chmod'ed is
 * hashed again.
 */
#include "fetcher/fetch_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"

#include <xxhash.h>

/* Lines the memo keeps (the newest): ~200 bytes each, so at most ~1 MB; a
 * K3 snapshot is ~100 files, so 40 of them.  A line dropped for the bound
 * costs one hash of its blob at the next open that uses it. */
#define PEER_MEMO_MAX_LINES 4096
#define PEER_MEMO_READ_MAX  (64u << 20)   /* a memo larger than this reads as empty */

/* The memo file is shared by every upstream of the process (shoald opens
 * models on several workers at once): appends and the rewrite that prunes
 * it must not interleave. */
static pthread_mutex_t memo_mu = PTHREAD_MUTEX_INITIALIZER;

static int hex_name(const char *s)
{
    size_t n = strlen(s);
    if (n != 64 && n != 40)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

void up_peer_find(fetch_upstream *u)
{
    char dir[PATH_MAX];
    const char *p;
    struct stat st;
    int n;

    if (!u->o.hf_cache || !u->o.hf_cache[0] || u->local)
        return;
    char dashed[2 * HUB_REPO_MAX];
    size_t k = 0;
    for (p = u->spec.repo; *p && k + 2 < sizeof dashed; p++) {   /* org/name -> org--name */
        if (*p == '/')
            dashed[k++] = '-';
        dashed[k++] = *p == '/' ? '-' : *p;
    }
    dashed[k] = '\0';
    n = snprintf(dir, sizeof dir, "%s/models--%s", u->o.hf_cache, dashed);
    if (n < 0 || (size_t)n >= sizeof dir)
        return;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return;
    u->peer = strdup(dir);
    if (u->peer)
        LOG_INFO("fetch", "%s: the Hugging Face cache has it (%s): verified blobs are read there",
                 u->o.model, dir);
}

int up_peer_commit(fetch_upstream *u, shoal_err *err)
{
    char path[PATH_MAX];
    shoal_buf b;
    size_t s, e;
    int rc;

    if (!u->peer)
        return SHOAL_ENOTFOUND;
    if (snprintf(path, sizeof path, "%s/refs/%s", u->peer, u->spec.revision) >= (int)sizeof path)
        return SHOAL_ETOOBIG;
    shoal_buf_init(&b, 256);
    rc = shoal_read_file(path, 256, &b, NULL);
    if (rc) {
        shoal_buf_free(&b);
        return shoal_err_set(err, SHOAL_ENOTFOUND, "the Hugging Face cache %s has no ref %s",
                             u->peer, u->spec.revision);
    }
    for (s = 0; s < b.len && (b.data[s] == ' ' || b.data[s] == '\n'); s++)
        ;
    for (e = b.len; e > s && (b.data[e - 1] == ' ' || b.data[e - 1] == '\n'); e--)
        ;
    if (e - s != 40) {
        shoal_buf_free(&b);
        return shoal_err_set(err, SHOAL_EFORMAT, "%s does not hold a commit", path);
    }
    memcpy(u->commit, b.data + s, 40);
    u->commit[40] = '\0';
    shoal_buf_free(&b);
    LOG_WARN("fetch", "%s: %s resolves to %s from the Hugging Face cache's refs/ (the Hub did "
             "not answer)", u->o.model, u->spec.revision, u->commit);
    return 0;
}

static void stat_take(const struct stat *st, fetch_peer_stat *out)
{
    out->size = (uint64_t)st->st_size;
    out->ino = (uint64_t)st->st_ino;
    out->mtime_ns = shoal_stat_mtime_ns(st);
    out->ctime_s = (int64_t)st->st_ctime;
}

/* Same size, mtime and inode (what the memo's first format keyed by). */
static int stat_same(const fetch_peer_stat *a, const fetch_peer_stat *b)
{
    return a->size == b->size && a->ino == b->ino && a->mtime_ns == b->mtime_ns;
}

/* The memo key of a verified blob, no newline: "etag size mtime inode
 * cCTIME", or without the ctime (ctime 0) the first format's. */
static int memo_key(const char *etag, const fetch_peer_stat *st, int ctime, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s %" PRIu64 " %lld.%09lld %" PRIu64, etag, st->size,
                     (long long)(st->mtime_ns / 1000000000),
                     (long long)(st->mtime_ns % 1000000000), st->ino);
    if (ctime && n > 0 && (size_t)n < cap)
        n += snprintf(out + n, cap - (size_t)n, " c%lld", (long long)st->ctime_s);
    return n;
}

/* Does the memo hold key followed by a path ("key path\n"), or the first
 * format's key1 alone ("key1\n")?  Caller holds memo_mu. */
static int memo_has(const fetch_upstream *u, const char *key, const char *key1)
{
    shoal_buf b;
    int found = 0;
    if (!u->o.peer_memo)
        return 0;
    shoal_buf_init(&b, PEER_MEMO_READ_MAX);
    if (shoal_read_file(u->o.peer_memo, PEER_MEMO_READ_MAX, &b, NULL) == 0 && b.len) {
        size_t n = strlen(key), n1 = strlen(key1);
        for (size_t i = 0; i < b.len; ) {
            if ((i + n < b.len && memcmp(b.data + i, key, n) == 0 && b.data[i + n] == ' ')
                || (i + n1 < b.len && memcmp(b.data + i, key1, n1) == 0 && b.data[i + n1] == '\n')) {
                found = 1;
                break;
            }
            const void *nl = memchr(b.data + i, '\n', b.len - i);
            if (!nl)
                break;
            i = (size_t)((const uint8_t *)nl - b.data) + 1;
        }
    }
    shoal_buf_free(&b);
    return found;
}

/* Append "key blob\n".  Caller holds memo_mu. */
static void memo_add(const fetch_upstream *u, const char *key, const char *blob)
{
    char line[2 * PATH_MAX];
    int fd, n;
    if (!u->o.peer_memo || strchr(blob, '\n'))
        return;
    n = snprintf(line, sizeof line, "%s %s\n", key, blob);
    if (n < 0 || (size_t)n >= sizeof line)
        return;
    fd = open(u->o.peer_memo, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (shoal_write_all(fd, line, (size_t)n) != 0)
        LOG_WARN("fetch", "recording a verified blob in %s: %s", u->o.peer_memo, strerror(errno));
    close(fd);
}

/* One memo line, parsed: etag, stat, and the blob's path (NULL in a line
 * of the first format, which has no ctime either).  0, or -1 for a line
 * that does not parse. */
typedef struct memo_rec {
    char etag[HUB_ETAG_MAX];
    fetch_peer_stat st;
    const char *path;              /* into the line; NULL: first format */
    size_t path_len;
} memo_rec;

static int memo_parse(const char *line, size_t len, memo_rec *r)
{
    char tmp[2 * PATH_MAX];
    unsigned long long size, ino;
    long long sec, nsec, ct;
    int n = 0, k = 0;
    if (len >= sizeof tmp)
        return -1;
    memcpy(tmp, line, len);
    tmp[len] = '\0';
    memset(r, 0, sizeof *r);
    if (sscanf(tmp, "%64s %llu %lld.%lld %llu%n", r->etag, &size, &sec, &nsec, &ino, &n) != 5
        || !hex_name(r->etag) || nsec < 0 || nsec >= 1000000000)
        return -1;
    r->st.size = size;
    r->st.ino = ino;
    r->st.mtime_ns = sec * 1000000000 + nsec;
    if ((size_t)n == len)
        return 0;   /* the first format */
    if (sscanf(tmp + n, " c%lld %n", &ct, &k) != 1 || k < 4 || (size_t)(n + k) >= len)
        return -1;
    r->st.ctime_s = ct;
    r->path = line + n + k;
    r->path_len = len - (size_t)(n + k);
    return 0;
}

/* Is the line's blob still what the line says: there, a regular file named
 * by its etag, same size, mtime, inode and ctime?  A line of the first
 * format is judged by this model's blobs/<etag> (size, mtime, inode) and
 * *line1 gets it in today's format (with that path and its ctime now). */
static int memo_rec_live(const fetch_upstream *u, const memo_rec *r, char *line1, size_t cap)
{
    char path[PATH_MAX], key[HUB_ETAG_MAX + 128];
    const char *base;
    struct stat st;
    fetch_peer_stat now;

    line1[0] = '\0';
    if (r->path) {
        if (r->path_len >= sizeof path)
            return 0;
        memcpy(path, r->path, r->path_len);
        path[r->path_len] = '\0';
    } else if (!u->peer || snprintf(path, sizeof path, "%s/blobs/%s", u->peer, r->etag)
                               >= (int)sizeof path) {
        return 0;
    }
    base = strrchr(path, '/');
    if (!base || strcmp(base + 1, r->etag) != 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    stat_take(&st, &now);
    if (!stat_same(&now, &r->st) || (r->path && now.ctime_s != r->st.ctime_s))
        return 0;
    if (!r->path) {
        memo_key(r->etag, &now, 1, key, sizeof key);
        if (snprintf(line1, cap, "%s %s", key, path) >= (int)cap)
            line1[0] = '\0';
    }
    return 1;
}

/* Rewrite the memo without the lines whose blob is gone or changed, the
 * duplicates (the newest kept) and, past PEER_MEMO_MAX_LINES, the oldest;
 * lines of the first format that this model's blobs confirm get their
 * path.  Nothing is written when nothing changes.  Caller holds memo_mu. */
static void memo_prune(const fetch_upstream *u)
{
    shoal_buf in, out;
    size_t nlines = 0, kept = 0, dropped = 0, upgraded = 0, *starts = NULL;
    uint64_t *seen = NULL;
    uint8_t *keep = NULL;
    size_t cap_seen;
    shoal_err err = { 0 };

    if (!u->o.peer_memo)
        return;
    shoal_buf_init(&in, PEER_MEMO_READ_MAX);
    shoal_buf_init(&out, PEER_MEMO_READ_MAX);
    if (shoal_read_file(u->o.peer_memo, PEER_MEMO_READ_MAX, &in, NULL) != 0 || in.len == 0)
        goto out;
    for (size_t i = 0; i < in.len; i++)
        nlines += in.data[i] == '\n';
    nlines += in.data[in.len - 1] != '\n';
    cap_seen = 2 * nlines + 2;
    starts = calloc(nlines + 1, sizeof *starts);
    keep = calloc(nlines + 1, 1);
    seen = calloc(cap_seen, sizeof *seen);
    if (!starts || !keep || !seen)
        goto out;
    for (size_t i = 0, k = 0; i < in.len && k < nlines; k++) {
        const void *nl = memchr(in.data + i, '\n', in.len - i);
        starts[k] = i;
        i = nl ? (size_t)((const uint8_t *)nl - in.data) + 1 : in.len;
    }
    starts[nlines] = in.len;
    /* Newest first: the first occurrence seen of a key is the one kept. */
    for (size_t k = nlines; k-- > 0; ) {
        const char *line = (const char *)in.data + starts[k];
        size_t len = starts[k + 1] - starts[k];
        char up[2 * PATH_MAX];
        memo_rec r;
        uint64_t h;
        size_t slot;
        int dup = 0;

        if (len && line[len - 1] == '\n')
            len--;
        if (kept >= PEER_MEMO_MAX_LINES || memo_parse(line, len, &r) != 0
            || !memo_rec_live(u, &r, up, sizeof up)) {
            dropped++;
            continue;
        }
        /* the key (etag, size, mtime, inode) once: a hash set, linear probing */
        h = XXH3_64bits(r.etag, strlen(r.etag)) ^ (r.st.ino * 0x9e3779b97f4a7c15ull)
            ^ (uint64_t)r.st.mtime_ns ^ (r.st.size << 1);
        h |= 1;
        for (slot = h % cap_seen; seen[slot]; slot = (slot + 1) % cap_seen)
            if (seen[slot] == h) {
                dup = 1;
                break;
            }
        if (dup) {
            dropped++;
            continue;
        }
        seen[slot] = h;
        keep[k] = up[0] ? 2 : 1;
        upgraded += up[0] != '\0';
        kept++;
    }
    if (dropped == 0 && upgraded == 0)
        goto out;
    for (size_t k = 0; k < nlines; k++) {
        const char *line = (const char *)in.data + starts[k];
        size_t len = starts[k + 1] - starts[k];
        if (len && line[len - 1] == '\n')
            len--;
        if (!keep[k])
            continue;
        if (keep[k] == 2) {   /* the first format, with its ctime and path now */
            char up[2 * PATH_MAX];
            memo_rec r;
            memo_parse(line, len, &r);
            memo_rec_live(u, &r, up, sizeof up);
            if (shoal_buf_append(&out, up, strlen(up)) != 0)
                goto out;
        } else if (shoal_buf_append(&out, line, len) != 0) {
            goto out;
        }
        if (shoal_buf_append(&out, "\n", 1) != 0)
            goto out;
    }
    if (shoal_write_file_atomic(u->o.peer_memo, out.data, out.len, &err) != 0)
        LOG_WARN("fetch", "pruning %s: %s", u->o.peer_memo, err.msg);
    else
        LOG_INFO("fetch", "%s: %zu verified blobs remembered, %zu lines dropped (blob gone, "
                 "changed, repeated or past %d)", u->o.peer_memo, kept, dropped,
                 PEER_MEMO_MAX_LINES);
out:
    free(starts);
    free(keep);
    free(seen);
    shoal_buf_free(&in);
    shoal_buf_free(&out);
}

int up_peer_check(fetch_upstream *u, up_file *f)
{
    char blob[PATH_MAX], key[HUB_ETAG_MAX + 128], key1[HUB_ETAG_MAX + 128];
    struct stat st;
    fetch_peer_stat before, after;
    int m;

    if (!u->peer || f->peer)
        return f->peer > 0;
    f->peer = -1;
    if (!f->ready || !hex_name(f->hf.etag)
        || snprintf(blob, sizeof blob, "%s/blobs/%s", u->peer, f->hf.etag) >= (int)sizeof blob
        || stat(blob, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != f->hf.size)
        return 0;
    stat_take(&st, &before);
    memo_key(f->hf.etag, &before, 1, key, sizeof key);
    memo_key(f->hf.etag, &before, 0, key1, sizeof key1);
    pthread_mutex_lock(&memo_mu);
    m = memo_has(u, key, key1);
    pthread_mutex_unlock(&memo_mu);
    if (!m) {
        m = up_hash_matches(blob, f->hf.etag, strlen(f->hf.etag), f->hf.size);
        /* bytes written while they were hashed change the mtime: not verified */
        if (m == 1 && (stat(blob, &st) != 0 || (stat_take(&st, &after), !stat_same(&before, &after))
                       || after.ctime_s != before.ctime_s)) {
            LOG_WARN("fetch", "%s: the Hugging Face cache's blob %s changed while it was hashed; "
                     "not used", f->path, blob);
            return 0;
        }
        if (m == 1) {
            pthread_mutex_lock(&memo_mu);
            memo_add(u, key, blob);
            pthread_mutex_unlock(&memo_mu);
            pthread_mutex_lock(&u->mu);
            u->st.peer_hashed += f->hf.size;
            pthread_mutex_unlock(&u->mu);
        } else {
            LOG_WARN("fetch", "%s: the Hugging Face cache's blob %s does not hash to its name%s; "
                     "not used", f->path, blob, m < 0 ? " (unreadable)" : "");
        }
    }
    if (m == 1) {
        f->peer = 1;
        f->peer_st = before;
        f->peer_blob = strdup(blob);
        if (!f->peer_blob)
            f->peer = -1;
    }
    return f->peer > 0;
}

int up_peer_resolve(fetch_upstream *u, up_file *f)
{
    char link[PATH_MAX], target[PATH_MAX];
    struct stat st;
    const char *base;
    ssize_t n;

    if (!u->peer
        || snprintf(link, sizeof link, "%s/snapshots/%s/%s", u->peer, u->commit, f->path)
               >= (int)sizeof link
        || (n = readlink(link, target, sizeof target - 1)) <= 0 || stat(link, &st) != 0
        || !S_ISREG(st.st_mode))
        return -1;
    target[n] = '\0';
    base = strrchr(target, '/');
    base = base ? base + 1 : target;
    if (!hex_name(base))
        return -1;
    memset(&f->hf, 0, sizeof f->hf);
    snprintf(f->hf.commit, sizeof f->hf.commit, "%.40s", u->commit);
    snprintf(f->hf.etag, sizeof f->hf.etag, "%.64s", base);
    f->hf.size = (uint64_t)st.st_size;
    f->ready = 1;
    f->peer = 0;
    if (!up_peer_check(u, f)) {
        f->ready = 0;
        return -1;
    }
    return 0;
}

int up_peer_read(fetch_upstream *u, up_file *f, uint64_t off, size_t len, void *buf,
                 shoal_err *err)
{
    int fd = open(f->peer_blob, O_RDONLY | O_CLOEXEC), rc;
    (void)u;
    if (fd < 0)
        return shoal_err_set(err, SHOAL_EIO, "open %s: %s", f->peer_blob, strerror(errno));
    rc = shoal_pread_all(fd, buf, len, (off_t)off);
    close(fd);
    if (rc)
        return shoal_err_set(err, rc, "read %zu bytes at %" PRIu64 " of %s", len, off,
                             f->peer_blob);
    return 0;
}

int fetch_upstream_peer_scan(fetch_upstream *u, const manifest *m)
{
    int n = 0;
    if (!u->peer)
        return 0;
    for (size_t i = 0; i < m->nfiles; i++) {
        up_file *f = up_file_get(u, m->files[i].path);
        if (!f)
            continue;
        if (!f->ready) {
            /* The etag and size the manifest was built with, for the check
             * only: the file stays unresolved (no location) for transfers. */
            memset(&f->hf, 0, sizeof f->hf);
            snprintf(f->hf.etag, sizeof f->hf.etag, "%s", m->files[i].etag);
            f->hf.size = m->files[i].size;
            f->ready = 1;
            up_peer_check(u, f);
            f->ready = 0;
            memset(&f->hf, 0, sizeof f->hf);
        } else if (strcmp(f->hf.etag, m->files[i].etag) == 0) {
            up_peer_check(u, f);
        }
        n += f->peer > 0;
    }
    pthread_mutex_lock(&memo_mu);
    memo_prune(u);
    pthread_mutex_unlock(&memo_mu);
    return n;
}

int fetch_upstream_peer_blob(const fetch_upstream *u, const char *path, char *out, size_t cap,
                             fetch_peer_stat *st)
{
    for (size_t i = 0; i < u->nfiles; i++) {
        const up_file *f = u->files[i];
        if (strcmp(f->path, path) == 0) {
            if (f->peer <= 0 || !f->peer_blob || strlen(f->peer_blob) >= cap)
                return -1;
            memcpy(out, f->peer_blob, strlen(f->peer_blob) + 1);
            if (st)
                *st = f->peer_st;
            return 0;
        }
    }
    return -1;
}

int fetch_upstream_peer_drop(fetch_upstream *u, const char *path)
{
    int rc = -1;
    pthread_mutex_lock(&u->mu);
    for (size_t i = 0; i < u->nfiles; i++) {
        up_file *f = u->files[i];
        if (strcmp(f->path, path) == 0 && f->peer > 0) {
            f->peer = -1;
            free(f->peer_blob);
            f->peer_blob = NULL;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&u->mu);
    return rc;
}
