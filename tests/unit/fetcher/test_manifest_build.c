/* test_manifest_build.c — fetch_manifest_build against hubmock: the shard
 * headers read by several threads give the same manifest as one reader;
 * what the build keeps is each shard's header [0, 8+N) and its bytes
 * outside the language model, exactly as on disk; a side handle of a cache
 * records what the build resolved but stores no object; a stop flag ends
 * a build at once; a shard whose header claims more bytes than the file is
 * named in the error whichever thread read it. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cache/cache.h"
#include "common/sys.h"
#include "fetcher/fetch.h"
#include "tests/lib/testhub.h"

static test_hub g_th;

static int setup(void **state)
{
    (void)state;
    return test_hub_start(&g_th, "mbuild", NULL);
}

static int teardown(void **state)
{
    (void)state;
    return test_hub_stop(&g_th);
}

static fetch_upstream *hub_open(cache *c, const _Atomic int *stop)
{
    fetch_options fo;
    fetch_upstream *u = NULL;
    shoal_err err = { 0, "" };
    memset(&fo, 0, sizeof fo);
    fo.model = "hf://org/m";
    fo.endpoint = g_th.endpoint;
    fo.backoff_ms = 10;
    fo.stop = stop;
    if (fetch_upstream_open(&fo, c, &u, &err) != 0)
        fail_msg("open: %s", err.msg);
    return u;
}

typedef struct phases {
    _Atomic uint64_t headers_max;
    _Atomic int      calls;
} phases;

static void on_phase(void *ctx, const char *phase, uint64_t done, uint64_t total)
{
    phases *p = ctx;
    atomic_fetch_add(&p->calls, 1);
    if (strcmp(phase, "headers") == 0 && done > atomic_load(&p->headers_max) && done <= total)
        atomic_store(&p->headers_max, done);
}

/* The bytes [off, off+len) of the model's file `path` equal p. */
static int same_as_disk(const char *path, uint64_t off, const uint8_t *p, uint64_t len)
{
    char full[600];
    uint8_t *b = malloc(len ? len : 1);
    int fd, ok;
    snprintf(full, sizeof full, "%s/model/%s", g_th.dir, path);
    fd = open(full, O_RDONLY);
    ok = fd >= 0 && b && shoal_pread_all(fd, b, (size_t)len, (off_t)off) == 0 &&
         memcmp(b, p, (size_t)len) == 0;
    if (fd >= 0)
        close(fd);
    free(b);
    return ok;
}

static void test_parallel_equals_sequential(void **state)
{
    shoal_err err = { 0, "" };
    fetch_upstream *u1 = hub_open(NULL, NULL), *u4 = hub_open(NULL, NULL);
    fetch_build_opts o1 = { 1, NULL, NULL }, o4 = { 4, on_phase, NULL };
    phases ph;
    manifest *m1 = NULL, *m4 = NULL;
    fetch_keep *k = NULL;
    shoal_buf e1, e4;
    size_t headers = 0, gaps = 0;
    (void)state;

    atomic_init(&ph.headers_max, 0);
    atomic_init(&ph.calls, 0);
    o4.ctx = &ph;
    assert_int_equal(fetch_manifest_build(u1, NULL, &o1, &m1, NULL, NULL, &err), 0);
    assert_int_equal(fetch_manifest_build(u4, NULL, &o4, &m4, NULL, &k, &err), 0);
    shoal_buf_init(&e1, 0);
    shoal_buf_init(&e4, 0);
    assert_int_equal(manifest_encode(m1, &e1, &err), 0);
    assert_int_equal(manifest_encode(m4, &e4, &err), 0);
    assert_int_equal(e1.len, e4.len);
    assert_memory_equal(e1.data, e4.data, e1.len);
    assert_int_equal(atomic_load(&ph.headers_max), 3);   /* tiny-k3: three shards */
    assert_true(atomic_load(&ph.calls) > 4);
    /* kept: the manifest, then per shard its header and the bytes of the
     * tensors outside the language model (tiny-k3's vision dummy) */
    assert_non_null(k);
    for (size_t i = 0; i < fetch_keep_count(k); i++) {
        const fetch_keep_item *it = fetch_keep_at(k, i);
        if (it->kind == CACHE_KIND_DERIVED) {
            assert_string_equal(it->names.file, FETCH_MANIFEST_PATH);
            assert_int_equal(it->key.length, e4.len);
            assert_memory_equal(it->data, e4.data, e4.len);
            continue;
        }
        assert_int_equal(it->kind, CACHE_KIND_SMALL);
        assert_true(same_as_disk(it->names.file, it->key.offset, it->data, it->key.length));
        if (it->key.offset == 0) {
            uint64_t n = 0;
            for (int b = 0; b < 8; b++)
                n |= (uint64_t)it->data[b] << (8 * b);
            assert_int_equal(it->key.length, 8 + n);
            headers++;
        } else {
            gaps++;
        }
    }
    assert_int_equal(headers, 3);
    assert_int_equal(gaps, 1);
    fetch_keep_free(k);
    shoal_buf_free(&e1);
    shoal_buf_free(&e4);
    manifest_free(m1);
    manifest_free(m4);
    fetch_upstream_free(u1);
    fetch_upstream_free(u4);
}

/* On a side handle the build records the pin and the files it resolved,
 * and stores no object; the writer then finds the records. */
static void test_side_handle_records(void **state)
{
    char home[300];
    shoal_err err = { 0, "" };
    cache_config cc;
    cache *w = NULL, *side = NULL;
    cache_file cf;
    cache_usage us;
    fetch_upstream *u;
    manifest *m = NULL;
    fetch_keep *k = NULL;
    int from_cache = 1;
    (void)state;

    snprintf(home, sizeof home, "%s/home-side", g_th.dir);
    cache_config_default(&cc);
    cc.no_fsync = 1;
    assert_int_equal(cache_open(home, &cc, &w, NULL, &err), 0);
    cc.read_only = CACHE_OPEN_SIDE;
    assert_int_equal(cache_open(home, &cc, &side, NULL, &err), 0);
    u = hub_open(side, NULL);
    assert_int_equal(fetch_manifest_build(u, side, NULL, &m, &from_cache, &k, &err), 0);
    assert_int_equal(from_cache, 0);
    fetch_upstream_set_cache(u, w);
    cache_close(side);
    assert_int_equal(cache_usage_get(w, &us, &err), 0);
    assert_int_equal(us.objects, 0);
    assert_int_equal(cache_file_get(w, g_th.endpoint, "org/m", fetch_upstream_commit(u),
                                    m->files[m->nfiles - 1].path, &cf, &err), 0);
    /* stored through the writer, the next build comes from the cache */
    fetch_keep_store(k, w);
    fetch_keep_free(k);
    manifest_free(m);
    m = NULL;
    assert_int_equal(fetch_manifest_build(u, w, NULL, &m, &from_cache, &k, &err), 0);
    assert_int_equal(from_cache, 1);
    assert_null(k);
    manifest_free(m);
    fetch_upstream_free(u);
    cache_close(w);
}

static void test_stop(void **state)
{
    _Atomic int stop;
    shoal_err err = { 0, "" };
    fetch_upstream *u;
    manifest *m = NULL;
    (void)state;
    atomic_init(&stop, 0);
    u = hub_open(NULL, &stop);
    atomic_store(&stop, 1);
    assert_int_equal(fetch_manifest_build(u, NULL, NULL, &m, NULL, NULL, &err), SHOAL_ECANCELED);
    assert_null(m);
    fetch_upstream_free(u);
}

/* A copy of the model as a directory whose second shard's header length
 * claims more than the file holds. */
static void test_bad_header_named(void **state)
{
    char dir[400], cmd[1000], shard[500];
    shoal_err err = { 0, "" };
    fetch_options fo;
    fetch_build_opts o = { 3, NULL, NULL };
    fetch_upstream *u = NULL;
    manifest *m = NULL;
    uint8_t n8[8];
    uint64_t huge = 1ull << 40;
    int fd;
    (void)state;

    snprintf(dir, sizeof dir, "%s/badcopy", g_th.dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s/model' '%s'", g_th.dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(shard, sizeof shard, "%s/model-00002-of-000003.safetensors", dir);
    fd = open(shard, O_WRONLY);
    assert_true(fd >= 0);
    for (int b = 0; b < 8; b++)
        n8[b] = (uint8_t)(huge >> (8 * b));
    assert_int_equal(pwrite(fd, n8, 8, 0), 8);
    close(fd);
    memset(&fo, 0, sizeof fo);
    fo.model = dir;
    assert_int_equal(fetch_upstream_open(&fo, NULL, &u, &err), 0);
    assert_true(fetch_manifest_build(u, NULL, &o, &m, NULL, NULL, &err) < 0);
    printf("error: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "model-00002-of-000003.safetensors"));
    assert_non_null(strstr(err.msg, "header"));
    assert_null(m);
    fetch_upstream_free(u);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_equals_sequential),
        cmocka_unit_test(test_side_handle_records),
        cmocka_unit_test(test_stop),
        cmocka_unit_test(test_bad_header_named),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
