/* peer.c — an existing huggingface_hub cache as a peer of the Hub for the
 * same hf:// name (docs/fetcher.md, "The Hugging Face cache").
 *
 * Owns: finding models--org--name under the HF cache, a revision's commit
 * from its refs/ (when the Hub cannot answer), a file's etag and size from
 * its snapshot symlink (offline), and the rule that a blob is used only
 * once its bytes hash to the etag (sha256 for LFS files, git blob sha1 for
 * small ones) — hashed once, then remembered by (etag, size, mtime, inode)
 * in fetch_options.peer_memo so later opens only stat.  Verified blobs are
 * read in place: the manifest build's reads pread them, and the daemon
 * hands their descriptors to engines (fetch_upstream_peer_blob); nothing is
 * copied into the cache.  Never writes into the HF cache.
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
#include "common/sys.h"

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

/* The memo line of a verified blob. */
static int memo_line(const char *etag, const struct stat *st, char *out, size_t cap)
{
    return snprintf(out, cap, "%s %" PRIu64 " %lld.%09ld %llu\n", etag, (uint64_t)st->st_size,
                    (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec,
                    (unsigned long long)st->st_ino);
}

static int memo_has(const fetch_upstream *u, const char *line)
{
    shoal_buf b;
    int found = 0;
    if (!u->o.peer_memo)
        return 0;
    shoal_buf_init(&b, 64u << 20);
    if (shoal_read_file(u->o.peer_memo, 64u << 20, &b, NULL) == 0 && b.len) {
        size_t n = strlen(line);
        for (size_t i = 0; i + n <= b.len; ) {
            if ((i == 0 || b.data[i - 1] == '\n') && memcmp(b.data + i, line, n) == 0) {
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

static void memo_add(const fetch_upstream *u, const char *line)
{
    int fd;
    if (!u->o.peer_memo)
        return;
    fd = open(u->o.peer_memo, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (shoal_write_all(fd, line, strlen(line)) != 0)
        LOG_WARN("fetch", "recording a verified blob in %s: %s", u->o.peer_memo, strerror(errno));
    close(fd);
}

int up_peer_check(fetch_upstream *u, up_file *f)
{
    char blob[PATH_MAX], line[PATH_MAX];
    struct stat st;
    int m;

    if (!u->peer || f->peer)
        return f->peer > 0;
    f->peer = -1;
    if (!f->ready || !hex_name(f->hf.etag)
        || snprintf(blob, sizeof blob, "%s/blobs/%s", u->peer, f->hf.etag) >= (int)sizeof blob
        || stat(blob, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != f->hf.size)
        return 0;
    memo_line(f->hf.etag, &st, line, sizeof line);
    if (memo_has(u, line)) {
        m = 1;
    } else {
        m = up_hash_matches(blob, f->hf.etag, strlen(f->hf.etag), f->hf.size);
        if (m == 1) {
            memo_add(u, line);
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
    return n;
}

int fetch_upstream_peer_blob(const fetch_upstream *u, const char *path, char *out, size_t cap)
{
    for (size_t i = 0; i < u->nfiles; i++) {
        const up_file *f = u->files[i];
        if (strcmp(f->path, path) == 0) {
            if (f->peer <= 0 || !f->peer_blob || strlen(f->peer_blob) >= cap)
                return -1;
            memcpy(out, f->peer_blob, strlen(f->peer_blob) + 1);
            return 0;
        }
    }
    return -1;
}
