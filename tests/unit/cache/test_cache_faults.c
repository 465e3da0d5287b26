/* test_cache_faults.c — ENOSPC and EIO from each system call of the write
 * path, injected through the cache's I/O table (cache/cache_test.h): the
 * write fails with the right code, the index is unchanged, no tmp file
 * leaks, the cache keeps working and a reopen finds nothing to repair. */
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

/* Which call fails, and on which of its calls (1 = the next one). */
static struct {
    const char *call;
    int countdown;
    int err;
    int fired;
} inj;
static cache_io real;

static int hit(const char *call)
{
    if (!inj.call || strcmp(inj.call, call) != 0 || inj.countdown <= 0)
        return 0;
    if (--inj.countdown > 0)
        return 0;
    inj.fired++;
    errno = inj.err;
    return 1;
}

static int f_open(const char *p, int fl, mode_t m) { return hit("open") ? -1 : real.open(p, fl, m); }
static ssize_t f_write(int fd, const void *p, size_t n) { return hit("write") ? -1 : real.write(fd, p, n); }
static ssize_t f_pwrite(int fd, const void *p, size_t n, off_t o) { return hit("pwrite") ? -1 : real.pwrite(fd, p, n, o); }
static int f_fsync(int fd) { return hit("fsync") ? -1 : real.fsync(fd); }
static int f_fdatasync(int fd) { return hit("fdatasync") ? -1 : real.fdatasync(fd); }
static int f_rename(const char *a, const char *b) { return hit("rename") ? -1 : real.rename(a, b); }
static int f_unlink(const char *p) { return hit("unlink") ? -1 : real.unlink(p); }
static int f_ftruncate(int fd, off_t l) { return hit("ftruncate") ? -1 : real.ftruncate(fd, l); }
static int f_fallocate(int fd, int m, off_t o, off_t l) { return hit("fallocate") ? -1 : real.fallocate(fd, m, o, l); }

static void inject(const char *call, int nth, int e)
{
    static const cache_io faulty = { f_open, f_write, f_pwrite, f_fsync, f_fdatasync,
                                     f_rename, f_unlink, f_ftruncate, f_fallocate };
    cache_test_io_default(&real);
    inj.call = call;
    inj.countdown = nth;
    inj.err = e;
    inj.fired = 0;
    cache_test_io_set(&faulty);
}

static void uninject(void)
{
    inj.call = NULL;
    cache_test_io_set(NULL);
}

typedef struct snap { cache_usage u; int blobs, tmp; } snap;

static void take(cache *c, const char *dir, snap *s)
{
    shoal_err err = { 0, "" };
    assert_int_equal(cache_usage_get(c, &s->u, &err), 0);
    s->blobs = tu_count_files(dir, "blobs");
    s->tmp = tu_count_files(dir, "tmp");
}

/* One fault case: the call, which occurrence, the errno and the code the
 * write must fail with. */
static void one_case(const char *call, int nth, int e, int want, uint64_t checkpoint)
{
    char dir[256];
    cache *c = NULL;
    cache_config cfg;
    shoal_err err = { 0, "" };
    snap before, after;
    cache_open_report rep;

    tu_tmpdir(dir, "fault");
    cache_config_default(&cfg);
    cfg.max_bytes = 64u << 20;
    cfg.checkpoint_bytes = checkpoint;
    assert_int_equal(cache_open(dir, &cfg, &c, NULL, &err), 0);
    assert_int_equal(tu_write_obj(c, "old1", 0, 100000, CACHE_KIND_EXPERT, NULL, 65536, &err), 0);
    assert_int_equal(tu_write_obj(c, "old2", 0, 50000, CACHE_KIND_SPINE, NULL, 65536, &err), 0);
    take(c, dir, &before);

    inject(call, nth, e);
    int rc = tu_write_obj(c, "new", 0, 1000000, CACHE_KIND_EXPERT, NULL, 65536, &err);
    int fired = inj.fired;
    uninject();
    if (fired != 1)
        fail_msg("%s #%d: the fault did not fire", call, nth);
    if (rc != want)
        fail_msg("%s #%d errno %d: got %d (%s), want %d", call, nth, e, rc, err.msg, want);

    take(c, dir, &after);
    assert_int_equal(after.u.used, before.u.used);
    assert_int_equal(after.u.objects, before.u.objects);
    assert_int_equal(after.u.reserved, 0);
    assert_int_equal(after.blobs, before.blobs);
    assert_int_equal(after.tmp, 0);
    cache_obj o;
    assert_int_equal(cache_lookup(c, &(cache_key){ "new", 0, 1000000 }, NULL, &o, &err), SHOAL_ENOTFOUND);
    assert_int_equal(tu_check_obj(c, "old1", 0, 100000), 0);
    assert_int_equal(tu_check_obj(c, "old2", 0, 50000), 0);

    /* Once the fault is gone, the same write succeeds. */
    assert_int_equal(tu_write_obj(c, "new", 0, 1000000, CACHE_KIND_EXPERT, NULL, 65536, &err), 0);
    assert_int_equal(tu_check_obj(c, "new", 0, 1000000), 0);
    cache_close(c);
    c = NULL;
    assert_int_equal(cache_open(dir, &cfg, &c, &rep, &err), 0);
    assert_int_equal(rep.objects, 3);
    assert_int_equal(rep.tmp_removed + rep.orphans_removed + rep.rows_missing + rep.rows_bad_size +
                     rep.partials_dropped + rep.partials_kept, 0);
    cache_close(c);
    tu_rm_rf(dir);
}

static void test_open_fails(void **s)
{
    (void)s;
    one_case("open", 1, ENOSPC, SHOAL_ENOSPC, 64u << 20);
    one_case("open", 1, EIO, SHOAL_EIO, 64u << 20);
}

static void test_fallocate_fails(void **s)
{
    (void)s;
    one_case("fallocate", 1, ENOSPC, SHOAL_ENOSPC, 64u << 20);
    one_case("fallocate", 1, EIO, SHOAL_EIO, 64u << 20);
}

static void test_write_fails(void **s)
{
    (void)s;
    one_case("write", 1, ENOSPC, SHOAL_ENOSPC, 64u << 20);
    one_case("write", 5, ENOSPC, SHOAL_ENOSPC, 64u << 20);
    one_case("write", 16, EIO, SHOAL_EIO, 64u << 20);
}

static void test_fsync_fails(void **s)
{
    (void)s;
    one_case("fsync", 1, ENOSPC, SHOAL_ENOSPC, 64u << 20);
    one_case("fsync", 1, EIO, SHOAL_EIO, 64u << 20);
}

static void test_checkpoint_fdatasync_fails(void **s)
{
    (void)s;
    /* With 128 KiB checkpoints the write makes a partial row first; the
     * failure must take it away again. */
    one_case("fdatasync", 1, EIO, SHOAL_EIO, 128u << 10);
    one_case("fdatasync", 3, ENOSPC, SHOAL_ENOSPC, 128u << 10);
}

static void test_rename_fails(void **s)
{
    (void)s;
    one_case("rename", 1, ENOSPC, SHOAL_ENOSPC, 64u << 20);
    one_case("rename", 1, EIO, SHOAL_EIO, 64u << 20);
    one_case("rename", 1, EIO, SHOAL_EIO, 128u << 10);
}

/* A pause whose fsync fails drops the partial instead of keeping bytes
 * that may not be on disk. */
static void test_pause_fails(void **s)
{
    char dir[256];
    cache *c = NULL;
    cache_config cfg;
    cache_writer *w = NULL;
    shoal_err err = { 0, "" };
    uint8_t buf[4096];
    (void)s;

    tu_tmpdir(dir, "pause");
    cache_config_default(&cfg);
    cfg.max_bytes = 64u << 20;
    assert_int_equal(cache_open(dir, &cfg, &c, NULL, &err), 0);
    assert_int_equal(cache_write_begin(c, &(cache_key){ "p", 0, 10000 }, CACHE_KIND_EXPERT, NULL, &w, &err), 0);
    tu_fill(buf, sizeof buf, "p", 0, 0);
    assert_int_equal(cache_write_append(w, buf, sizeof buf, &err), 0);
    inject("fdatasync", 1, EIO);
    assert_int_equal(cache_write_pause(w, &err), SHOAL_EIO);
    uninject();
    assert_int_equal(tu_count_files(dir, "tmp"), 0);
    assert_int_equal(cache_write_begin(c, &(cache_key){ "p", 0, 10000 }, CACHE_KIND_EXPERT, NULL, &w, &err), 0);
    assert_int_equal(cache_writer_offset(w), 0);
    cache_write_abort(w);
    cache_close(c);
    tu_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_fails),
        cmocka_unit_test(test_fallocate_fails),
        cmocka_unit_test(test_write_fails),
        cmocka_unit_test(test_fsync_fails),
        cmocka_unit_test(test_checkpoint_fdatasync_fails),
        cmocka_unit_test(test_rename_fails),
        cmocka_unit_test(test_pause_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
