/* test_cache_parts.c — positional writes (cache_write_at): parts of one
 * object arriving in any order give the same blob and the same XXH3 as one
 * append; overlaps are refused; a pause keeps only the contiguous prefix;
 * a commit with a hole is refused; ENOSPC from a positional write leaves
 * the cache as it was. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/cache_test.h"
#include "tests/unit/cache/cache_testutil.h"

#define LEN 1000003u     /* odd, so parts do not line up with anything */

static cache *open_cache(char *dir, uint64_t checkpoint)
{
    cache_config cfg;
    cache *c = NULL;
    shoal_err err = { 0, "" };
    tu_tmpdir(dir, "parts");
    cache_config_default(&cfg);
    cfg.max_bytes = 256u << 20;
    cfg.checkpoint_bytes = checkpoint;
    cfg.no_fsync = 1;
    assert_int_equal(cache_open(dir, &cfg, &c, NULL, &err), 0);
    return c;
}

/* Write [lo, hi) of (etag, 0) at its position, in two calls. */
static int put(cache_writer *w, const char *etag, uint64_t lo, uint64_t hi, shoal_err *err)
{
    uint8_t *buf = malloc(hi - lo);
    uint64_t mid = lo + (hi - lo) / 3;
    int rc;
    assert_non_null(buf);
    tu_fill(buf, hi - lo, etag, 0, lo);
    rc = cache_write_at(w, lo, buf, mid - lo, err);
    if (rc == 0)
        rc = cache_write_at(w, mid, buf + (mid - lo), hi - mid, err);
    free(buf);
    return rc;
}

static cache_writer *begin(cache *c, const char *etag)
{
    cache_writer *w = NULL;
    shoal_err err = { 0, "" };
    assert_int_equal(cache_write_begin(c, &(cache_key){ etag, 0, LEN }, CACHE_KIND_EXPERT, NULL,
                                       &w, &err), 0);
    return w;
}

/* Four parts of unequal size in all 24 orders (with checkpoints every
 * 64 KiB, so the prefix moving over parts also checkpoints). */
static void test_every_order(void **state)
{
    static const uint64_t cut[5] = { 0, 123457, 400000, 812345, LEN };
    char dir[256];
    cache *c = open_cache(dir, 65536);
    shoal_err err = { 0, "" };
    int perm[4] = { 0, 1, 2, 3 }, n = 0;
    (void)state;

    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++)
            for (int d = 0; d < 4; d++)
                for (int e = 0; e < 4; e++) {
                    char etag[64];
                    cache_writer *w;
                    uint64_t prefix = 0;
                    int done[4] = { 0 };
                    if (a == b || a == d || a == e || b == d || b == e || d == e)
                        continue;
                    perm[0] = a, perm[1] = b, perm[2] = d, perm[3] = e;
                    snprintf(etag, sizeof etag, "order%d%d%d%d", a, b, d, e);
                    w = begin(c, etag);
                    for (int k = 0; k < 4; k++) {
                        int p = perm[k];
                        assert_int_equal(put(w, etag, cut[p], cut[p + 1], &err), 0);
                        done[p] = 1;
                        /* the prefix is exactly the run of parts from 0 */
                        prefix = 0;
                        for (int q = 0; q < 4 && done[q]; q++)
                            prefix = cut[q + 1];
                        assert_int_equal(cache_writer_offset(w), prefix);
                    }
                    assert_int_equal(cache_write_commit(w, NULL, &err), 0);
                    assert_int_equal(tu_check_obj(c, etag, 0, LEN), 0);
                    n++;
                }
    assert_int_equal(n, 24);
    /* The same object written again in one append has the same XXH3. */
    {
        cache_obj x, y;
        cache_key k = { "order3120", 0, LEN };
        assert_int_equal(cache_lookup(c, &k, NULL, &x, &err), 0);
        assert_int_equal(cache_remove(c, &k, &err), 0);
        assert_int_equal(tu_write_obj(c, "order3120", 0, LEN, CACHE_KIND_EXPERT, NULL, LEN, &err), 0);
        assert_int_equal(cache_lookup(c, &k, NULL, &y, &err), 0);
        assert_memory_equal(x.xxh128, y.xxh128, 16);
        close(x.fd);
        close(y.fd);
    }
    assert_int_equal(tu_count_files(dir, "tmp"), 0);
    cache_close(c);
    tu_rm_rf(dir);
}

static void test_overlap_refused(void **state)
{
    char dir[256];
    cache *c = open_cache(dir, 0);
    shoal_err err = { 0, "" };
    uint8_t buf[300];
    cache_writer *w = begin(c, "ov");
    (void)state;

    assert_int_equal(put(w, "ov", 1000, 2000, &err), 0);
    tu_fill(buf, sizeof buf, "ov", 0, 1900);
    /* across the end of the extent */
    assert_int_equal(cache_write_at(w, 1900, buf, 200, &err), SHOAL_ERANGE);
    /* across its start */
    tu_fill(buf, sizeof buf, "ov", 0, 900);
    assert_int_equal(cache_write_at(w, 900, buf, 200, &err), SHOAL_ERANGE);
    /* an append running into it */
    assert_int_equal(put(w, "ov", 0, 500, &err), 0);
    tu_fill(buf, sizeof buf, "ov", 0, 500);
    assert_int_equal(cache_write_append(w, buf, 300, &err), 0);     /* 500..800 fine */
    tu_fill(buf, sizeof buf, "ov", 0, 800);
    assert_int_equal(cache_write_append(w, buf, 300, &err), SHOAL_ERANGE);   /* 800..1100 */
    /* behind the prefix */
    tu_fill(buf, sizeof buf, "ov", 0, 100);
    assert_int_equal(cache_write_at(w, 100, buf, 10, &err), SHOAL_ERANGE);
    /* past the length */
    assert_int_equal(cache_write_at(w, LEN - 5, buf, 10, &err), SHOAL_ERANGE);
    /* The refusals wrote nothing: fill the gaps and the object is right. */
    assert_int_equal(cache_writer_offset(w), 800);
    assert_int_equal(put(w, "ov", 2000, LEN, &err), 0);
    assert_int_equal(cache_writer_offset(w), 800);
    assert_int_equal(put(w, "ov", 800, 1000, &err), 0);
    assert_int_equal(cache_writer_offset(w), LEN);
    assert_int_equal(cache_write_commit(w, NULL, &err), 0);
    assert_int_equal(tu_check_obj(c, "ov", 0, LEN), 0);
    cache_close(c);
    tu_rm_rf(dir);
}

/* Garbage ahead of the prefix must never survive a pause: the resumed
 * write rewrites those positions with different bytes in order. */
static void test_pause_with_parts_ahead(void **state)
{
    char dir[256];
    cache *c = open_cache(dir, 0);
    shoal_err err = { 0, "" };
    cache_writer *w = begin(c, "pz");
    uint8_t junk[5000];
    cache_open_report rep;
    (void)state;

    assert_int_equal(put(w, "pz", 0, 300000, &err), 0);
    memset(junk, 0xA5, sizeof junk);
    assert_int_equal(cache_write_at(w, 310000, junk, sizeof junk, &err), 0);
    assert_int_equal(put(w, "pz", 600000, LEN, &err), 0);
    assert_int_equal(cache_writer_offset(w), 300000);
    assert_int_equal(cache_write_pause(w, &err), 0);

    /* In this process ... */
    w = begin(c, "pz");
    assert_int_equal(cache_writer_offset(w), 300000);
    assert_int_equal(put(w, "pz", 700000, LEN, &err), 0);   /* ahead again, then paused */
    assert_int_equal(cache_write_pause(w, &err), 0);
    cache_close(c);

    /* ... and after a reopen (the repair cuts to durable too). */
    {
        cache_config cfg;
        cache_config_default(&cfg);
        cfg.max_bytes = 256u << 20;
        cfg.no_fsync = 1;
        c = NULL;
        assert_int_equal(cache_open(dir, &cfg, &c, &rep, &err), 0);
        assert_int_equal(rep.partials_kept, 1);
    }
    w = begin(c, "pz");
    assert_int_equal(cache_writer_offset(w), 300000);
    assert_int_equal(put(w, "pz", 500000, LEN, &err), 0);
    assert_int_equal(put(w, "pz", 300000, 500000, &err), 0);
    assert_int_equal(cache_write_commit(w, NULL, &err), 0);
    assert_int_equal(tu_check_obj(c, "pz", 0, LEN), 0);
    assert_int_equal(tu_count_files(dir, "tmp"), 0);
    cache_close(c);
    tu_rm_rf(dir);
}

static void test_commit_with_hole(void **state)
{
    char dir[256];
    cache *c = open_cache(dir, 0);
    shoal_err err = { 0, "" };
    cache_writer *w = begin(c, "hole");
    cache_usage u;
    cache_obj o;
    (void)state;

    assert_int_equal(put(w, "hole", 0, 400000, &err), 0);
    assert_int_equal(put(w, "hole", 400001, LEN, &err), 0);   /* one byte missing */
    assert_int_equal(cache_write_commit(w, NULL, &err), SHOAL_ERANGE);
    assert_non_null(strstr(err.msg, "contiguous"));
    assert_int_equal(cache_lookup(c, &(cache_key){ "hole", 0, LEN }, NULL, &o, &err), SHOAL_ENOTFOUND);
    assert_int_equal(cache_usage_get(c, &u, &err), 0);
    assert_int_equal(u.objects, 0);
    assert_int_equal(u.reserved, 0);
    assert_int_equal(tu_count_files(dir, "tmp"), 0);
    assert_int_equal(tu_count_files(dir, "blobs") >= 0, 1);
    cache_close(c);
    tu_rm_rf(dir);
}

/* ---- ENOSPC from the pwrite of a part ahead ---- */

static cache_io real;
static int pwrite_calls, pwrite_fail_at;

static ssize_t f_pwrite(int fd, const void *p, size_t n, off_t o)
{
    if (++pwrite_calls == pwrite_fail_at) {
        errno = ENOSPC;
        return -1;
    }
    return real.pwrite(fd, p, n, o);
}

static void test_enospc_positional(void **state)
{
    char dir[256];
    cache *c = open_cache(dir, 0);
    shoal_err err = { 0, "" };
    cache_io faulty;
    cache_usage before, after;
    cache_writer *w;
    cache_obj o;
    (void)state;

    assert_int_equal(tu_write_obj(c, "old", 0, 100000, CACHE_KIND_EXPERT, NULL, 65536, &err), 0);
    assert_int_equal(cache_usage_get(c, &before, &err), 0);
    cache_test_io_default(&real);
    faulty = real;
    faulty.pwrite = f_pwrite;
    pwrite_calls = 0;
    pwrite_fail_at = 3;   /* put() writes in two calls */
    cache_test_io_set(&faulty);

    w = begin(c, "full");
    assert_int_equal(put(w, "full", 500000, 600000, &err), 0);              /* pwrites 1, 2 */
    assert_int_equal(put(w, "full", 700000, 800000, &err), SHOAL_ENOSPC);   /* pwrite 3 */
    assert_int_equal(pwrite_calls, 3);
    /* The writer is unusable now: nothing more is written. */
    assert_int_equal(put(w, "full", 0, 1000, &err), SHOAL_EIO);
    assert_int_not_equal(cache_write_pause(w, &err), 0);   /* consumes it, keeps nothing */
    cache_test_io_set(NULL);

    assert_int_equal(cache_usage_get(c, &after, &err), 0);
    assert_int_equal(after.used, before.used);
    assert_int_equal(after.objects, before.objects);
    assert_int_equal(after.reserved, 0);
    assert_int_equal(tu_count_files(dir, "tmp"), 0);
    assert_int_equal(cache_lookup(c, &(cache_key){ "full", 0, LEN }, NULL, &o, &err), SHOAL_ENOTFOUND);
    assert_int_equal(tu_check_obj(c, "old", 0, 100000), 0);

    /* Nothing resumable was left: the next begin starts from 0 and works. */
    w = begin(c, "full");
    assert_int_equal(cache_writer_offset(w), 0);
    assert_int_equal(put(w, "full", 500000, LEN, &err), 0);
    assert_int_equal(put(w, "full", 0, 500000, &err), 0);
    assert_int_equal(cache_write_commit(w, NULL, &err), 0);
    assert_int_equal(tu_check_obj(c, "full", 0, LEN), 0);
    cache_close(c);
    tu_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_order),
        cmocka_unit_test(test_overlap_refused),
        cmocka_unit_test(test_pause_with_parts_ahead),
        cmocka_unit_test(test_commit_with_hole),
        cmocka_unit_test(test_enospc_positional),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
