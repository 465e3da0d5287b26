/* etag_cache.c — the persistent etag cache of synthesized repos.
 *
 * Owns: one text file (--synth-cache, default
 * $XDG_CACHE_HOME/shoal/hubmock-synth-etags.txt) remembering the digests of
 * synthesized files between runs, so a model is hashed once per machine:
 *
 *   # comment lines
 *   KEY <TAB> FILE <TAB> SIZE <TAB> SHA256 <TAB> SHA1 or -
 *
 * KEY is synth_model_key() ("gen=1 preset=k3 layers=93 experts=896 seed=0"):
 * every input of the bytes, including the generator version, so a changed
 * generator never meets a stale entry; SIZE tells a deliberately cut file
 * (bad=header) from the whole one.  Saving re-reads the file and merges, so
 * two hubmocks filling it at once lose nothing but time; lines that do not
 * parse are dropped.  Does not own hashing (synth/digest.c).
 */
#include "tools/hubmock/hubmock_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/path.h"
#include "common/sys.h"

#define CACHE_FILE_MAX ((size_t)64 << 20)

typedef struct cache_ent {
    char        *key, *file;
    uint64_t     size;
    synth_digest d;
} cache_ent;

struct hm_etag_cache {
    char      *path;
    cache_ent *v;
    size_t     n, cap;
};

static cache_ent *cache_find(const hm_etag_cache *c, const char *key, const char *file,
                             uint64_t size)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->v[i].size == size && strcmp(c->v[i].file, file) == 0 &&
            strcmp(c->v[i].key, key) == 0)
            return &c->v[i];
    return NULL;
}

/* Parse one line (modified in place) and add it unless known. */
static int cache_line(hm_etag_cache *c, char *line)
{
    char *f[5], *end;
    int n = 0;
    synth_digest d;

    if (line[0] == '#' || line[0] == '\0')
        return 0;
    for (char *p = line; n < 5; n++) {
        f[n] = p;
        p = strchr(p, '\t');
        if (!p) {
            n++;
            break;
        }
        *p++ = '\0';
    }
    if (n != 5 || !shoal_is_hex(f[3], 64) || (strcmp(f[4], "-") != 0 && !shoal_is_hex(f[4], 40)))
        return 0;
    errno = 0;
    uint64_t size = strtoull(f[2], &end, 10);
    if (errno || *end || end == f[2])
        return 0;
    memset(&d, 0, sizeof d);
    memcpy(d.sha256, f[3], 65);
    if (strcmp(f[4], "-") != 0)
        memcpy(d.sha1, f[4], 41);
    return hm_etag_cache_put(c, f[0], f[1], size, &d);
}

static int cache_read(hm_etag_cache *c, shoal_err *err)
{
    shoal_buf b;
    int rc;

    shoal_buf_init(&b, 0);
    rc = shoal_read_file(c->path, CACHE_FILE_MAX, &b, err);
    if (rc == SHOAL_ENOTFOUND) {
        shoal_buf_free(&b);
        shoal_err_clear(err);
        return 0;
    }
    for (char *p = (char *)b.data; !rc && p && *p;) {
        char *nl = strchr(p, '\n');
        if (nl)
            *nl = '\0';
        rc = cache_line(c, p);
        p = nl ? nl + 1 : NULL;
    }
    shoal_buf_free(&b);
    return rc ? shoal_err_set(err, rc, "out of memory reading %s", c->path) : 0;
}

int hm_etag_cache_load(const char *path, hm_etag_cache **out, shoal_err *err)
{
    hm_etag_cache *c = calloc(1, sizeof *c);
    int rc;

    *out = NULL;
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    if ((rc = cache_read(c, err))) {
        hm_etag_cache_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int hm_etag_cache_get(const hm_etag_cache *c, const char *key, const char *file, uint64_t size,
                      int want_sha1, synth_digest *out)
{
    const cache_ent *e = c ? cache_find(c, key, file, size) : NULL;
    if (!e || (want_sha1 && !e->d.sha1[0]))
        return 0;
    *out = e->d;
    return 1;
}

int hm_etag_cache_put(hm_etag_cache *c, const char *key, const char *file, uint64_t size,
                      const synth_digest *d)
{
    cache_ent *e = cache_find(c, key, file, size);

    if (e) {                     /* keep a sha1 we have, take one we lacked */
        if (!e->d.sha1[0])
            memcpy(e->d.sha1, d->sha1, sizeof d->sha1);
        return 0;
    }
    if (c->n == c->cap) {
        size_t nc = c->cap ? 2 * c->cap : 64;
        cache_ent *nv = realloc(c->v, nc * sizeof *nv);
        if (!nv)
            return SHOAL_ENOMEM;
        c->v = nv;
        c->cap = nc;
    }
    e = &c->v[c->n];
    e->key = strdup(key);
    e->file = strdup(file);
    if (!e->key || !e->file) {
        free(e->key);
        free(e->file);
        return SHOAL_ENOMEM;
    }
    e->size = size;
    e->d = *d;
    c->n++;
    return 0;
}

int hm_etag_cache_save(hm_etag_cache *c, shoal_err *err)
{
    char dir[SHOAL_PATH_MAX];
    const char *slash = strrchr(c->path, '/');
    shoal_buf b;
    int rc;

    if ((rc = cache_read(c, err)))          /* merge what others added */
        return rc;
    if (slash && (size_t)(slash - c->path) < sizeof dir && slash != c->path) {
        memcpy(dir, c->path, (size_t)(slash - c->path));
        dir[slash - c->path] = '\0';
        if ((rc = shoal_mkdir_p(dir, 0755, err)))
            return rc;
    }
    shoal_buf_init(&b, 0);
    rc = shoal_buf_append_str(&b, "# hubmock: sha256 and git sha1 of synthesized files "
                              "(docs/hubmock.md); safe to delete\n");
    for (size_t i = 0; i < c->n && !rc; i++)
        rc = shoal_buf_appendf(&b, "%s\t%s\t%llu\t%s\t%s\n", c->v[i].key, c->v[i].file,
                               (unsigned long long)c->v[i].size, c->v[i].d.sha256,
                               c->v[i].d.sha1[0] ? c->v[i].d.sha1 : "-");
    if (rc)
        rc = shoal_err_set(err, rc, "out of memory writing %s", c->path);
    else
        rc = shoal_write_file_atomic(c->path, b.data, b.len, err);
    shoal_buf_free(&b);
    return rc;
}

void hm_etag_cache_free(hm_etag_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->v[i].key);
        free(c->v[i].file);
    }
    free(c->v);
    free(c->path);
    free(c);
}
