/* test_cache_fill.c — a full filesystem.
 *
 * Run without arguments it is a cmocka test: a disk of 6 MiB is simulated
 * through the cache's I/O table (fallocate and write fail with ENOSPC past
 * that much).  Run as `test_cache_fill --fill DIR` it fills the real
 * filesystem DIR lives on (tests/integration/test_cache_fill.sh mounts a
 * small tmpfs there) and exits 0 when every check holds, 1 otherwise.
 *
 * Either way: objects are written until the disk is full; the write that
 * fails says SHOAL_ENOSPC, leaves no tmp file and no row; every object
 * committed before still verifies; removing two objects makes room for a
 * new one; a reopen has nothing to repair.
 */
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
#include "common/log.h"
#include "tests/unit/cache/cache_testutil.h"

#define OBJ_LEN 700000u

static char why[1200];

#define CHECK(cond, ...) do { if (!(cond)) { snprintf(why, sizeof why, __VA_ARGS__); goto out; } } while (0)

static void fill_key(char *etag, size_t cap, int i)
{
    snprintf(etag, cap, "fill%d", i);
}

/* 0 if every check held; else 1 with the reason in `why`. */
static int fill_run(const char *dir)
{
    cache_config cfg;
    cache *c = NULL;
    shoal_err err = { 0, "" };
    char etag[32];
    int committed = 0, tiny = 0, rc, ok = 1;
    cache_usage u;
    cache_open_report rep;

    cache_config_default(&cfg);
    cfg.max_bytes = 1ull << 30;          /* far more than the disk */
    cfg.checkpoint_bytes = 256u << 10;
    CHECK(cache_open(dir, &cfg, &c, NULL, &err) == 0, "open: %s", err.msg);
    for (;;) {
        fill_key(etag, sizeof etag, committed);
        rc = tu_write_obj(c, etag, 0, OBJ_LEN, CACHE_KIND_EXPERT, NULL, 1u << 16, &err);
        if (rc)
            break;
        committed++;
        CHECK(committed < 1000, "the disk never filled up");
    }
    printf("fill: %d objects of %u bytes committed, then: %s\n", committed, OBJ_LEN, err.msg);
    CHECK(rc == SHOAL_ENOSPC, "the failing write said %s, not ENOSPC: %s", shoal_err_name(rc), err.msg);
    CHECK(committed >= 2, "only %d objects fit", committed);
    CHECK(tu_count_files(dir, "tmp") == 0, "a tmp file leaked");
    /* Then the last crumbs with 4 KiB objects, until the index or a blob
     * finds no room either. */
    for (;;) {
        char small[32];
        snprintf(small, sizeof small, "crumb%d", tiny);
        rc = tu_write_obj(c, small, 0, 4096, CACHE_KIND_EXPERT, NULL, 4096, &err);
        if (rc)
            break;
        tiny++;
        CHECK(tiny < 100000, "the disk never filled up with small objects");
    }
    printf("fill: then %d objects of 4096 bytes, then: %s\n", tiny, err.msg);
    CHECK(rc == SHOAL_ENOSPC, "the failing small write said %s, not ENOSPC: %s",
          shoal_err_name(rc), err.msg);
    CHECK(tu_count_files(dir, "tmp") == 0, "a tmp file leaked");
    for (int i = 0; i < tiny; i++) {
        char small[32];
        snprintf(small, sizeof small, "crumb%d", i);
        CHECK(tu_check_obj(c, small, 0, 4096) == 0, "object %s does not verify", small);
    }
    CHECK(cache_usage_get(c, &u, &err) == 0, "usage: %s", err.msg);
    CHECK(u.objects == (uint64_t)(committed + tiny) && u.reserved == 0,
          "index has %llu objects (%llu reserved), want %d", (unsigned long long)u.objects,
          (unsigned long long)u.reserved, committed);
    CHECK(tu_count_files(dir, "blobs") == committed + tiny, "blobs/ holds %d files, want %d",
          tu_count_files(dir, "blobs"), committed + tiny);
    for (int i = 0; i < committed; i++) {
        fill_key(etag, sizeof etag, i);
        CHECK(tu_check_obj(c, etag, 0, OBJ_LEN) == 0, "object %s does not verify", etag);
    }
    fill_key(etag, sizeof etag, committed);
    {
        cache_obj o;
        CHECK(cache_lookup(c, &(cache_key){ etag, 0, OBJ_LEN }, NULL, &o, &err) == SHOAL_ENOTFOUND,
              "the failed object is visible");
    }
    /* Making room makes writes work again. */
    for (int i = 0; i < 2; i++) {
        char old[32];
        fill_key(old, sizeof old, i);
        CHECK(cache_remove(c, &(cache_key){ old, 0, OBJ_LEN }, &err) == 0, "remove: %s", err.msg);
    }
    CHECK(tu_write_obj(c, etag, 0, OBJ_LEN, CACHE_KIND_EXPERT, NULL, 1u << 16, &err) == 0,
          "after freeing space: %s", err.msg);
    CHECK(tu_check_obj(c, etag, 0, OBJ_LEN) == 0, "the new object does not verify");
    cache_close(c);
    c = NULL;
    CHECK(cache_open(dir, &cfg, &c, &rep, &err) == 0, "reopen: %s", err.msg);
    CHECK(rep.objects == (uint64_t)(committed + tiny - 1), "reopen found %llu objects, want %d",
          (unsigned long long)rep.objects, committed + tiny - 1);
    CHECK(rep.tmp_removed + rep.orphans_removed + rep.rows_missing + rep.rows_bad_size == 0,
          "reopen had to repair something");
    ok = 0;
out:
    cache_close(c);
    return ok;
}

/* ---- the simulated disk ---------------------------------------------------- */

static cache_io real;
static uint64_t disk_cap, disk_used;

static ssize_t small_write(int fd, const void *p, size_t n)
{
    if (disk_used + n > disk_cap) {
        errno = ENOSPC;
        return -1;
    }
    ssize_t k = real.write(fd, p, n);
    if (k > 0)
        disk_used += (uint64_t)k;
    return k;
}

static int small_fallocate(int fd, int mode, off_t off, off_t len)
{
    /* The model counts written bytes; a reservation must fit in what is
     * left, as on a real disk where fallocate fails first. */
    if (disk_used + (uint64_t)len > disk_cap) {
        errno = ENOSPC;
        return -1;
    }
    return real.fallocate(fd, mode, off, len);
}

static int small_unlink(const char *p)
{
    struct stat st;
    if (stat(p, &st) == 0 && disk_used >= (uint64_t)st.st_size)
        disk_used -= (uint64_t)st.st_size;
    return real.unlink(p);
}

static void test_simulated_full_disk(void **state)
{
    char dir[256];
    cache_io io;
    (void)state;

    tu_tmpdir(dir, "fill");
    cache_test_io_default(&real);
    io = real;
    io.write = small_write;
    io.fallocate = small_fallocate;
    io.unlink = small_unlink;
    disk_cap = 6u << 20;
    disk_used = 0;
    cache_test_io_set(&io);
    int rc = fill_run(dir);
    cache_test_io_set(NULL);
    tu_rm_rf(dir);
    if (rc)
        fail_msg("%s", why);
}

int main(int argc, char **argv)
{
    shoal_log_set_level(SHOAL_LOG_ERROR);
    if (argc == 3 && strcmp(argv[1], "--fill") == 0) {
        if (fill_run(argv[2]) != 0) {
            printf("FAIL: %s\n", why);
            return 1;
        }
        printf("ok: full filesystem handled cleanly\n");
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_simulated_full_disk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
