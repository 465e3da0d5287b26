/* test_cache_threads.c — the cache's rules for threads (cache.h,
 * "Threads"): a side handle beside the writer, a writer filled on another
 * thread and adopted, verify in two halves (a scan on the side handle, the
 * writer's removal), GC in steps, the unlinker hook, lengths by etag. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache.h"
#include "tests/unit/cache/cache_testutil.h"

typedef struct fx {
    char dir[256];
    cache *c;
    cache_config cfg;
} fx;

static int fx_setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    shoal_err err = { 0, "" };
    tu_tmpdir(f->dir, "threads");
    cache_config_default(&f->cfg);
    f->cfg.max_bytes = 64ull << 20;
    f->cfg.no_fsync = 1;
    if (cache_open(f->dir, &f->cfg, &f->c, NULL, &err) != 0)
        fail_msg("open: %s", err.msg);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx *f = *state;
    cache_close(f->c);
    tu_rm_rf(f->dir);
    free(f);
    return 0;
}

static cache *side_open(const fx *f, int mode)
{
    cache_config cc;
    cache *s = NULL;
    shoal_err err = { 0, "" };
    cache_config_default(&cc);
    cc.read_only = mode;
    if (cache_open(f->dir, &cc, &s, NULL, &err) != 0)
        fail_msg("side open: %s", err.msg);
    return s;
}

/* A side handle records models and files, which the writer then reads;
 * objects stay the writer's.  A reader records nothing. */
static void test_side_handle(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache *s = side_open(f, CACHE_OPEN_SIDE), *r = side_open(f, CACHE_OPEN_READER);
    cache_file cf, got;
    cache_writer *w = NULL;
    int64_t id = 0, id2 = 0;

    memset(&cf, 0, sizeof cf);
    snprintf(cf.endpoint, sizeof cf.endpoint, "h");
    snprintf(cf.repo, sizeof cf.repo, "org/m");
    snprintf(cf.commit, sizeof cf.commit, "c1");
    snprintf(cf.path, sizeof cf.path, "config.json");
    snprintf(cf.etag, sizeof cf.etag, "e1");
    cf.size = 10;
    assert_int_equal(cache_file_put(s, &cf, &err), 0);
    assert_int_equal(cache_model_put(s, "h", "org/m", "main", "c1", &id, &err), 0);
    assert_int_equal(cache_file_get(f->c, "h", "org/m", "c1", "config.json", &got, &err), 0);
    assert_string_equal(got.etag, "e1");
    assert_int_equal(cache_model_put(f->c, "h", "org/m", "main", "c1", &id2, &err), 0);
    assert_int_equal(id, id2);
    assert_int_equal(cache_write_begin(s, &(cache_key){ "x", 0, 10 }, CACHE_KIND_SMALL, NULL, &w,
                                       &err), SHOAL_EINVAL);
    assert_int_equal(cache_file_put(r, &cf, &err), SHOAL_EINVAL);
    /* what the writer commits, the side handle finds */
    assert_int_equal(tu_write_obj(f->c, "obj", 8, 5000, CACHE_KIND_SPINE, NULL, 1000, &err), 0);
    assert_int_equal(tu_check_obj(s, "obj", 8, 5000), 0);
    cache_close(s);
    cache_close(r);
}

typedef struct filler {
    cache_writer *w;
    const char   *etag;
    uint64_t      len, write_len;
    int           rc, calls, stop_at;
    shoal_err     err;
} filler;

static int fill_progress(void *ctx, uint64_t done, uint64_t total)
{
    filler *x = ctx;
    x->calls++;
    assert_true(done <= total);
    return x->stop_at && x->calls >= x->stop_at;
}

/* The other thread: allocate, write through a descriptor of its own,
 * adopt.  Only the writer's own calls (rule 4). */
static void *fill_thread(void *arg)
{
    filler *x = arg;
    uint8_t *buf = malloc(x->write_len ? x->write_len : 1);
    int fd = -1;
    tu_fill(buf, x->write_len, x->etag, 0, 0);
    x->rc = cache_writer_allocate(x->w, &x->err);
    if (x->rc == 0)
        x->rc = cache_writer_open_fd(x->w, O_WRONLY, &fd, &x->err);
    if (x->rc == 0 && pwrite(fd, buf, x->write_len, 0) != (ssize_t)x->write_len)
        x->rc = -1;
    if (fd >= 0)
        close(fd);
    if (x->rc == 0)
        x->rc = cache_writer_adopt(x->w, fill_progress, x, &x->err);
    free(buf);
    return NULL;
}

static int fill_on_thread(fx *f, const char *etag, uint64_t len, uint64_t write_len, int stop_at,
                          filler *x)
{
    pthread_t t;
    shoal_err err = { 0, "" };
    memset(x, 0, sizeof *x);
    x->etag = etag;
    x->len = len;
    x->write_len = write_len;
    x->stop_at = stop_at;
    assert_int_equal(cache_write_begin_flags(f->c, &(cache_key){ etag, 0, len },
                                             CACHE_KIND_DERIVED, NULL, CACHE_BEGIN_NO_ALLOC, &x->w,
                                             &err), 0);
    assert_int_equal(pthread_create(&t, NULL, fill_thread, x), 0);
    pthread_join(t, NULL);
    return x->rc;
}

static void test_fill_and_adopt(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    uint8_t want[16], got[16];
    filler x;
    XXH128_canonical_t can;
    uint8_t *buf = malloc(9 << 20);

    /* 9 MiB: three progress calls of 4 MiB steps */
    assert_int_equal(fill_on_thread(f, "adopted", 9 << 20, 9 << 20, 0, &x), 0);
    assert_true(x.calls >= 3);
    tu_fill(buf, 9 << 20, "adopted", 0, 0);
    XXH128_canonicalFromHash(&can, XXH3_128bits(buf, 9 << 20));
    memcpy(want, can.digest, 16);
    cache_writer_xxh(x.w, got);
    assert_memory_equal(got, want, 16);
    assert_int_equal(cache_write_commit(x.w, NULL, &err), 0);
    assert_int_equal(tu_check_obj(f->c, "adopted", 0, 9 << 20), 0);
    free(buf);

    /* a file shorter than announced: ERANGE saying what it holds */
    assert_int_equal(fill_on_thread(f, "short", 5000, 4000, 0, &x), SHOAL_ERANGE);
    assert_non_null(strstr(x.err.msg, "4000"));
    cache_write_abort(x.w);
    /* stopped by its progress callback: ECANCELED */
    assert_int_equal(fill_on_thread(f, "stopped", 9 << 20, 9 << 20, 1, &x), SHOAL_ECANCELED);
    cache_write_abort(x.w);
    assert_int_equal(tu_count_files(f->dir, "tmp"), 0);
    assert_int_equal(cache_lookup_length(f->c, "short", 0, &(uint64_t){ 0 }, &err),
                     SHOAL_ENOTFOUND);
}

static void flip_byte(const fx *f, const char *etag, uint64_t len, uint64_t at)
{
    cache_obj o;
    char p[512];
    uint8_t b;
    int fd;
    assert_int_equal(cache_lookup(f->c, &(cache_key){ etag, 0, len }, NULL, &o, NULL), 0);
    close(o.fd);
    snprintf(p, sizeof p, "%s/blobs/%016llx", f->dir, (unsigned long long)o.id);
    fd = open(p, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, (off_t)at), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)at), 1);
    close(fd);
}

/* The scan reads on a side handle and removes nothing; the writer's
 * removal skips what was evicted meanwhile and says so. */
static void test_verify_halves(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache *s;
    cache_verify_report rep;
    cache_verify_list bad = { 0 };
    uint64_t gb = 0, gm = 0, len = 0;
    cache_names nm = { "h", "org/v", "main", "c", "f", NULL, 0, 1 };

    for (int i = 0; i < 4; i++) {
        char e[8];
        snprintf(e, sizeof e, "o%d", i);
        assert_int_equal(tu_write_obj(f->c, e, 0, 30000, CACHE_KIND_EXPERT, &nm, 7000, &err), 0);
    }
    flip_byte(f, "o1", 30000, 29999);
    flip_byte(f, "o2", 30000, 0);
    s = side_open(f, CACHE_OPEN_SIDE);
    memset(&rep, 0, sizeof rep);
    assert_int_equal(cache_verify_scan(s, "org/v", &rep, &bad, NULL, NULL, &err), 0);
    assert_int_equal(rep.checked, 4);
    assert_int_equal(rep.bad, 2);
    assert_int_equal(bad.n, 2);
    assert_true(tu_check_obj(f->c, "o1", 0, 30000) > 1);   /* still there, still bad */
    /* o2 leaves by another way before the writer's half runs */
    assert_int_equal(cache_remove(f->c, &(cache_key){ "o2", 0, 30000 }, &err), 0);
    assert_int_equal(cache_verify_remove(f->c, &bad, 0, bad.n, &gb, &gm, &err), 0);
    assert_int_equal(gb, 1);
    assert_int_equal(gm, 0);
    assert_int_equal(cache_lookup_length(f->c, "o1", 0, &len, &err), SHOAL_ENOTFOUND);
    assert_int_equal(cache_lookup_length(s, "o3", 0, &len, &err), 0);
    assert_int_equal(len, 30000);
    assert_int_equal(cache_verify_scan(s, "org/none", &rep, &bad, NULL, NULL, &err),
                     SHOAL_ENOTFOUND);
    cache_verify_list_free(&bad);
    cache_close(s);
}

static void test_gc_steps(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_gc_state st;
    cache_usage u;
    shoal_buf out;
    int done = 0, steps = 0;

    for (int i = 0; i < 20; i++) {
        char e[8];
        snprintf(e, sizeof e, "g%d", i);
        assert_int_equal(tu_write_obj(f->c, e, 0, 1 << 20, CACHE_KIND_EXPERT, NULL, 1 << 20,
                                      &err), 0);
    }
    memset(&st, 0, sizeof st);
    while (!done) {
        assert_int_equal(cache_gc_step(f->c, &st, 4 << 20, 3 << 20, &done, &err), 0);
        assert_true(++steps < 50);
    }
    assert_true(steps >= 4);   /* 16 MiB to free, at most 3 MiB (+ slack) a step */
    assert_int_equal(cache_usage_get(f->c, &u, &err), 0);
    assert_true(u.used <= 4 << 20);
    assert_true(st.freed >= 16 << 20 && st.freed <= st.goal + (1 << 20));
    shoal_buf_init(&out, 0);
    assert_int_equal(cache_gc_json(f->c, &st, &out, &err), 0);
    assert_non_null(strstr((const char *)out.data, "\"reached\":true"));
    shoal_buf_free(&out);
}

typedef struct unlinks {
    char paths[8][512];
    int  n;
} unlinks;

static void record_unlink(const char *path, void *ctx)
{
    unlinks *u = ctx;
    if (u->n < 8)
        snprintf(u->paths[u->n++], sizeof u->paths[0], "%s", path);
}

static void test_unlinker(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    unlinks u = { .n = 0 };
    cache_writer *w = NULL;

    assert_int_equal(tu_write_obj(f->c, "u", 0, 4096, CACHE_KIND_EXPERT, NULL, 4096, &err), 0);
    cache_set_unlinker(f->c, record_unlink, &u);
    assert_int_equal(cache_remove(f->c, &(cache_key){ "u", 0, 4096 }, &err), 0);
    assert_int_equal(u.n, 1);
    assert_int_equal(access(u.paths[0], F_OK), 0);   /* the hook's to unlink */
    assert_int_equal(tu_count_files(f->dir, "blobs"), 1);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "t", 0, 100 }, CACHE_KIND_EXPERT, NULL,
                                       &w, &err), 0);
    cache_write_abort(w);
    assert_int_equal(u.n, 2);
    assert_non_null(strstr(u.paths[1], "/tmp/"));
    for (int i = 0; i < u.n; i++)
        unlink(u.paths[i]);
    cache_set_unlinker(f->c, NULL, NULL);
    assert_int_equal(tu_count_files(f->dir, "blobs"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_side_handle, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_fill_and_adopt, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_verify_halves, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_gc_steps, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_unlinker, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
