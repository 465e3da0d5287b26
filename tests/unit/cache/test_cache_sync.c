/* test_cache_sync.c — syncing a writer off its owner's thread (cache/cache.h,
 * "syncing off the owner's thread"): a writer with deferred checkpoints
 * never fdatasyncs inside cache_write_at, says once per due checkpoint what
 * to make durable, and a recorded checkpoint is what a reopen resumes
 * from; cache_writer_sync on another thread makes the commit skip its
 * fsync; a checkpoint recorded for a writer that is gone changes nothing. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/cache_test.h"
#include "tests/unit/cache/cache_testutil.h"

static cache_io real;
static int n_fsync, n_fdatasync;

static int c_fsync(int fd) { n_fsync++; return real.fsync(fd); }
static int c_fdatasync(int fd) { n_fdatasync++; return real.fdatasync(fd); }

/* Count the syncs; every other call is the real one. */
static void counting(void)
{
    static cache_io io;
    cache_test_io_default(&real);
    io = real;
    io.fsync = c_fsync;
    io.fdatasync = c_fdatasync;
    n_fsync = n_fdatasync = 0;
    cache_test_io_set(&io);
}

static cache *open_cache(const char *dir, uint64_t checkpoint, cache_open_report *rep)
{
    cache *c = NULL;
    cache_config cfg;
    shoal_err err = { 0, "" };
    cache_config_default(&cfg);
    cfg.max_bytes = 64u << 20;
    cfg.checkpoint_bytes = checkpoint;
    assert_int_equal(cache_open(dir, &cfg, &c, rep, &err), 0);
    return c;
}

static void append(cache_writer *w, const char *etag, uint64_t from, uint64_t n)
{
    uint8_t buf[4096];
    shoal_err err = { 0, "" };
    for (uint64_t at = from; at < from + n; at += sizeof buf) {
        tu_fill(buf, sizeof buf, etag, 0, at);
        assert_int_equal(cache_write_append(w, buf, sizeof buf, &err), 0);
    }
}

static void test_deferred_checkpoint_resumes(void **s)
{
    char dir[256];
    cache_writer *w = NULL;
    shoal_err err = { 0, "" };
    uint64_t durable = 0, id = 0, d2, id2;
    int fd = -1;
    cache_open_report rep;
    (void)s;

    tu_tmpdir(dir, "defer");
    cache *c = open_cache(dir, 64u << 10, NULL);
    counting();
    assert_int_equal(cache_write_begin(c, &(cache_key){ "d", 0, 1u << 20 }, CACHE_KIND_SPINE,
                                       NULL, &w, &err), 0);
    cache_writer_defer_checkpoints(w);
    append(w, "d", 0, 100u << 10);
    assert_int_equal(n_fdatasync, 0);                    /* not inside cache_write_at */
    assert_int_equal(cache_writer_checkpoint_due(w, &durable, &id), 1);
    assert_true(durable >= 64u << 10 && durable <= 100u << 10);
    assert_int_equal(cache_writer_checkpoint_due(w, &d2, &id2), 0);   /* once per checkpoint */
    /* the owner syncs its own descriptor (a worker would), then records */
    assert_int_equal(cache_writer_open_fd(w, O_WRONLY, &fd, &err), 0);
    append(w, "d", 100u << 10, 8u << 10);               /* the writer goes on meanwhile */
    assert_int_equal(cache_sync_fd(c, fd, &err), 0);
    close(fd);
    assert_int_equal(n_fdatasync, 1);
    assert_int_equal(cache_checkpoint_record(c, id, durable, &err), 0);
    /* an older checkpoint coming back later, or one past the prefix, changes nothing */
    assert_int_equal(cache_checkpoint_record(c, id, durable - 4096, &err), 0);
    assert_int_equal(cache_checkpoint_record(c, id, 2u << 20, &err), 0);
    cache_test_io_set(NULL);
    cache_close(c);   /* the writer ends with the cache: its partial row stays */

    c = open_cache(dir, 64u << 20, &rep);
    assert_int_equal(rep.partials_kept, 1);
    assert_int_equal(cache_write_begin(c, &(cache_key){ "d", 0, 1u << 20 }, CACHE_KIND_SPINE,
                                       NULL, &w, &err), 0);
    assert_int_equal(cache_writer_offset(w), durable);  /* what was recorded, no more */
    append(w, "d", durable, (1u << 20) - durable);
    assert_int_equal(cache_write_commit(w, NULL, &err), 0);
    assert_int_equal(tu_check_obj(c, "d", 0, 1u << 20), 0);
    cache_close(c);
    tu_rm_rf(dir);
}

typedef struct sync_arg { cache_writer *w; int rc; } sync_arg;

static void *sync_thread(void *p)
{
    sync_arg *a = p;
    shoal_err err = { 0, "" };
    a->rc = cache_writer_sync(a->w, &err);
    return NULL;
}

static void test_sync_elsewhere_then_commit(void **s)
{
    char dir[256];
    cache_writer *w = NULL;
    shoal_err err = { 0, "" };
    pthread_t th;
    sync_arg a;
    (void)s;

    tu_tmpdir(dir, "sync");
    cache *c = open_cache(dir, 64u << 20, NULL);
    counting();
    assert_int_equal(cache_write_begin(c, &(cache_key){ "e", 0, 256u << 10 }, CACHE_KIND_EXPERT,
                                       NULL, &w, &err), 0);
    append(w, "e", 0, 128u << 10);
    assert_int_equal(cache_writer_sync(w, &err), SHOAL_EIO);   /* not complete */
    append(w, "e", 128u << 10, 128u << 10);
    a = (sync_arg){ w, -1 };
    assert_int_equal(pthread_create(&th, NULL, sync_thread, &a), 0);
    pthread_join(th, NULL);
    assert_int_equal(a.rc, 0);
    assert_int_equal(n_fsync, 1);
    assert_int_equal(cache_write_commit(w, NULL, &err), 0);
    assert_int_equal(n_fsync, 1);                        /* the commit did not sync again */
    assert_int_equal(tu_check_obj(c, "e", 0, 256u << 10), 0);
    /* a checkpoint for a writer that is gone: nothing */
    assert_int_equal(cache_checkpoint_record(c, 12345, 4096, &err), 0);
    cache_test_io_set(NULL);
    cache_close(c);
    tu_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deferred_checkpoint_resumes),
        cmocka_unit_test(test_sync_elsewhere_then_commit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
