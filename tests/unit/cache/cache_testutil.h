/* cache_testutil.h — helpers shared by the cache tests (header-only so each
 * test program stays one file).
 *
 * Object contents are a pure function of (etag, offset, position), so a
 * test can check any blob it finds without remembering what it wrote; the
 * checksum oracle is xxhash itself, independent of the cache's code.
 */
#ifndef SHOAL_CACHE_TESTUTIL_H
#define SHOAL_CACHE_TESTUTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "cache/cache.h"

static inline uint64_t tu_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Bytes [pos, pos+n) of the object (etag, offset). */
static inline void tu_fill(uint8_t *p, size_t n, const char *etag, uint64_t offset, uint64_t pos)
{
    uint64_t seed = XXH3_64bits(etag, strlen(etag)) ^ tu_mix(offset);
    for (size_t i = 0; i < n; i++) {
        uint64_t at = pos + i;
        p[i] = (uint8_t)(tu_mix(seed ^ (at >> 3)) >> ((at & 7) * 8));
    }
}

/* A fresh empty directory under $TMPDIR (or /tmp); out must hold 256. */
static inline void tu_tmpdir(char *out, const char *tag)
{
    const char *base = "/tmp";
    snprintf(out, 256, "%s/shoal-cache-%s-XXXXXX", base, tag);
    if (!mkdtemp(out))
        abort();
}

static inline void tu_rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

/* Number of entries (not . or ..) in dir/sub. */
static inline int tu_count_files(const char *dir, const char *sub)
{
    char p[512];
    DIR *d;
    struct dirent *de;
    int n = 0;
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    d = opendir(p);
    if (!d)
        return -1;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* Write a whole object in chunks of `chunk` bytes.  0 or the failing code. */
static inline int tu_write_obj(cache *c, const char *etag, uint64_t offset, uint64_t len,
                               cache_kind kind, const cache_names *names, size_t chunk,
                               shoal_err *err)
{
    cache_writer *w = NULL;
    uint8_t *buf = malloc(chunk);
    int rc = cache_write_begin(c, &(cache_key){ etag, offset, len }, kind, names, &w, err);
    if (rc) {
        free(buf);
        return rc;
    }
    for (uint64_t at = cache_writer_offset(w); at < len && rc == 0;) {
        size_t n = len - at < chunk ? (size_t)(len - at) : chunk;
        tu_fill(buf, n, etag, offset, at);
        rc = cache_write_append(w, buf, n, err);
        at += n;
    }
    free(buf);
    if (rc) {
        cache_write_abort(w);
        return rc;
    }
    return cache_write_commit(w, NULL, err);
}

/* Read the whole object through a descriptor from cache_lookup and check
 * its length, checksum and contents.  0 if all is right. */
static inline int tu_check_obj(cache *c, const char *etag, uint64_t offset, uint64_t len)
{
    cache_obj o;
    uint8_t *got, *want;
    XXH128_canonical_t can;
    int bad = 0;
    struct stat st;

    if (cache_lookup(c, &(cache_key){ etag, offset, len }, NULL, &o, NULL) != 0)
        return 1;
    got = malloc(len ? len : 1);
    want = malloc(len ? len : 1);
    if (fstat(o.fd, &st) != 0 || (uint64_t)st.st_size != len || o.length != len)
        bad = 2;
    else if (pread(o.fd, got, len, 0) != (ssize_t)len)
        bad = 3;
    close(o.fd);
    if (!bad) {
        tu_fill(want, len, etag, offset, 0);
        if (memcmp(got, want, len) != 0)
            bad = 4;
        XXH128_canonicalFromHash(&can, XXH3_128bits(got, len));
        if (memcmp(can.digest, o.xxh128, 16) != 0)
            bad = 5;
    }
    free(got);
    free(want);
    return bad;
}

#endif
