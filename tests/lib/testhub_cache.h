/* testhub_cache.h — compare what a fetch stored with the generated
 * model's bytes.  Header-only: it needs the cache and fetcher libraries,
 * which not every unit test links. */
#ifndef SHOAL_TESTS_LIB_TESTHUB_CACHE_H
#define SHOAL_TESTS_LIB_TESTHUB_CACHE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/sys.h"
#include "fetcher/fetch.h"
#include "tests/lib/testhub.h"

/* 1 when the cache holds item `it` of manifest m with exactly the bytes
 * of the model file under h->dir/model. */
static inline int test_hub_same_bytes(const test_hub *h, cache *c, const manifest *m,
                                      const fetch_item *it)
{
    cache_key key = { m->files[it->file].etag, it->offset, it->length };
    cache_obj o;
    char path[512];
    uint8_t *a = malloc(it->length), *b = malloc(it->length);
    int fd, ok = 0;
    snprintf(path, sizeof path, "%s/model/%s", h->dir, m->files[it->file].path);
    fd = open(path, O_RDONLY);
    if (a && b && fd >= 0 && cache_lookup(c, &key, NULL, &o, NULL) == 0) {
        ok = o.length == it->length && shoal_pread_all(o.fd, a, it->length, 0) == 0
             && shoal_pread_all(fd, b, it->length, (off_t)it->offset) == 0
             && memcmp(a, b, it->length) == 0;
        close(o.fd);
    }
    if (fd >= 0)
        close(fd);
    free(a);
    free(b);
    return ok;
}

#endif
