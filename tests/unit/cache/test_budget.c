/* test_budget.c — the budget as something that plans: cache_plan_make (what
 * a selection fetches, keeps, cannot fit and evicts), lifted kind pins
 * (cache_pin_lift: the BF16 spine a derived pack replaces becomes
 * evictable, survives a reopen, unpin leaves it, clear restores it) and a
 * budget larger than the disk refused with its figures.
 *
 * Objects are 64 KiB: "x<l>" experts of layer l and "s" spine tensors.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <string.h>
#include <sys/statvfs.h>

#include "cache/cache.h"
#include "tests/unit/cache/cache_testutil.h"

#define OBJ (64u << 10)

typedef struct fx {
    char dir[256];
    cache *c;
    cache_config cfg;
} fx;

static int fx_setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    tu_tmpdir(f->dir, "budget");
    cache_config_default(&f->cfg);
    f->cfg.max_bytes = 16 * OBJ;
    f->cfg.no_fsync = 1;
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

static void fx_open(fx *f)
{
    shoal_err e = { 0, "" };
    cache_close(f->c);
    f->c = NULL;
    if (cache_open(f->dir, &f->cfg, &f->c, NULL, &e))
        fail_msg("open: %s", e.msg);
}

static void put(fx *f, const char *etag, uint64_t i, cache_kind kind, int layer)
{
    shoal_err e = { 0, "" };
    cache_names n = CACHE_NAMES_NONE;
    n.layer = layer;
    n.expert = (int32_t)i;
    if (tu_write_obj(f->c, etag, i * OBJ, OBJ, kind, &n, OBJ, &e))
        fail_msg("write %s %" PRIu64 ": %s", etag, i, e.msg);
}

static int cached(fx *f, const char *etag, uint64_t i)
{
    cache_obj o;
    if (cache_lookup(f->c, &(cache_key){ etag, i * OBJ, OBJ }, NULL, &o, NULL) != 0)
        return 0;
    close(o.fd);
    return 1;
}

/* 2 spine tensors (pinned by kind) and 8 experts of layer 0 in a budget of
 * 16: a selection of 4 cached and 8 new experts keeps the 4, fetches 6
 * (the room: 16 - 2 pinned - 4 kept - 4 held back by another job = 6),
 * cannot fit 2, and evicts the 4 other experts, oldest first — never one
 * of the selection. */
static void test_plan(void **state)
{
    fx *f = *state;
    cache_key keys[12];
    cache_kind kinds[12];
    uint8_t fate[12];
    cache_plan p;
    shoal_err e = { 0, "" };

    fx_open(f);
    put(f, "s", 0, CACHE_KIND_SPINE, -1);
    put(f, "s", 1, CACHE_KIND_SPINE, -1);
    for (uint64_t i = 0; i < 8; i++)
        put(f, "x0", i, CACHE_KIND_EXPERT, 0);
    for (int i = 0; i < 12; i++) {
        /* x0 0..3 (the oldest) are cached; x1 0..7 are new */
        keys[i] = i < 4 ? (cache_key){ "x0", (uint64_t)i * OBJ, OBJ }
                        : (cache_key){ "x1", (uint64_t)(i - 4) * OBJ, OBJ };
        kinds[i] = CACHE_KIND_EXPERT;
    }
    usleep(3000);   /* access times are in ms: the touch must come later */
    assert_int_equal(cache_plan_make(f->c, keys, kinds, 12, 4 * OBJ, 1, &p, fate, &e), 0);
    usleep(3000);
    assert_int_equal(p.budget, 16 * OBJ);
    assert_int_equal(p.pinned, 2 * OBJ);
    assert_int_equal(p.objects, 12);
    assert_int_equal(p.cached_objects, 4);
    assert_int_equal(p.room, 6 * OBJ);
    assert_int_equal(p.fetch_objects, 6);
    assert_int_equal(p.over_objects, 2);
    assert_int_equal(p.over_pinned, 0);
    for (int i = 0; i < 12; i++)
        assert_int_equal(fate[i], i < 4 ? CACHE_PLAN_CACHED : i < 10 ? CACHE_PLAN_FETCH
                                                                    : CACHE_PLAN_OVER);
    /* 10 used + 4 held + 6 fetched = 20 > 16: 4 evicted, x0 4..7 */
    assert_int_equal(p.evict_objects, 4);
    assert_int_equal(p.evict_bytes, 4 * OBJ);
    assert_int_equal(p.evict_kind[CACHE_KIND_EXPERT], 4 * OBJ);
    /* The plan changed nothing (a lookup would count hits: the usage)... */
    cache_usage u;
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_int_equal(u.objects, 10);
    assert_int_equal(u.evicted, 0);
    /* ...but touched the selection: writing 8 new objects evicts x0 4, 5
     * and keeps x0 0..3, written before them but touched since (without
     * the touch the oldest, x0 0 and 1, would go). */
    for (uint64_t i = 0; i < 8; i++)
        put(f, "x1", i, CACHE_KIND_EXPERT, 1);
    for (uint64_t i = 0; i < 4; i++)
        assert_true(cached(f, "x0", i));
    assert_false(cached(f, "x0", 4));
    /* A spine that cannot fit is counted apart: the caller refuses it. */
    cache_key big[20];
    cache_kind bk[20];
    for (int i = 0; i < 20; i++) {
        big[i] = (cache_key){ "s2", (uint64_t)i * OBJ, OBJ };
        bk[i] = CACHE_KIND_SPINE;
    }
    assert_int_equal(cache_plan_make(f->c, big, bk, 20, 0, 0, &p, NULL, &e), 0);
    assert_int_equal(p.over_pinned, p.over_objects);
    assert_true(p.over_objects >= 6);
}

/* Lifting the kind pin of the two spine tensors makes them evictable (and
 * counted as lifted), across a reopen; unpin leaves them lifted; clearing
 * pins them again; an object pinned by cache_pin is never lifted. */
static void test_pin_lift(void **state)
{
    fx *f = *state;
    cache_key sp[3] = { { "s", 0, OBJ }, { "s", OBJ, OBJ }, { "nothing", 0, OBJ } };
    cache_usage u;
    size_t changed = 0;
    shoal_err e = { 0, "" };

    fx_open(f);
    put(f, "s", 0, CACHE_KIND_SPINE, -1);
    put(f, "s", 1, CACHE_KIND_SPINE, -1);
    put(f, "s", 2, CACHE_KIND_SPINE, -1);
    assert_int_equal(cache_pin(f->c, &(cache_key){ "s", 2 * OBJ, OBJ }, 1, &e), 0);
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_int_equal(u.pinned, 3 * OBJ);
    cache_key lift[4] = { sp[0], sp[1], sp[2], { "s", 2 * OBJ, OBJ } };
    assert_int_equal(cache_pin_lift(f->c, lift, 4, 1, &changed, &e), 0);
    assert_int_equal(changed, 2);   /* s2 is pinned by hand; "nothing" is not cached */
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_int_equal(u.pinned, OBJ);
    assert_int_equal(u.lifted, 2 * OBJ);
    fx_open(f);   /* stored */
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_int_equal(u.lifted, 2 * OBJ);
    assert_int_equal(cache_pin(f->c, &sp[0], 0, &e), 0);   /* unpin: still lifted */
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_int_equal(u.lifted, 2 * OBJ);
    /* Filling the cache evicts the lifted tensors, never s2. */
    for (uint64_t i = 0; i < 15; i++)
        put(f, "x0", i, CACHE_KIND_EXPERT, 0);
    assert_false(cached(f, "s", 0));
    assert_false(cached(f, "s", 1));
    assert_true(cached(f, "s", 2));
    put(f, "s", 0, CACHE_KIND_SPINE, -1);
    assert_int_equal(cache_pin_lift(f->c, sp, 1, 1, &changed, &e), 0);
    assert_int_equal(changed, 1);
    assert_int_equal(cache_pin_lift_clear(f->c, &changed, &e), 0);
    assert_int_equal(changed, 1);
    assert_int_equal(cache_usage_get(f->c, &u, &e), 0);
    assert_int_equal(u.lifted, 0);
    assert_int_equal(u.pinned, 2 * OBJ);
}

/* budget_fits_disk: a budget past free space + the cache is refused with
 * the figures and a size that fits; within it, accepted. */
static void test_budget_past_disk(void **state)
{
    fx *f = *state;
    struct statvfs sv;
    shoal_err e = { 0, "" };

    assert_int_equal(statvfs(f->dir, &sv), 0);
    f->cfg.budget_fits_disk = 1;
    f->cfg.max_bytes = (uint64_t)sv.f_bavail * sv.f_frsize * 2 + (1ull << 40);
    assert_int_equal(cache_open(f->dir, &f->cfg, &f->c, NULL, &e), SHOAL_EINVAL);
    assert_null(f->c);
    assert_non_null(strstr(e.msg, "larger than the disk can give the cache"));
    assert_non_null(strstr(e.msg, "free +"));
    assert_non_null(strstr(e.msg, "ask for at most"));
    f->cfg.max_bytes = 16 * OBJ;
    fx_open(f);
}

/* Writers are charged in disk blocks, as committed objects are: with a
 * budget of 8 blocks, 8 one-byte writers fill it and a ninth is refused
 * (charged in bytes, 8 bytes would leave the budget nearly empty and 4 KiB
 * files would overshoot it); an abort gives its block back. */
static void test_writers_in_blocks(void **state)
{
    fx *f = *state;
    shoal_err e = { 0, "" };
    struct statvfs sv;
    cache_writer *w[9] = { 0 };
    char etag[9][16];
    uint64_t bs;

    assert_int_equal(statvfs(f->dir, &sv), 0);
    bs = sv.f_bsize ? (uint64_t)sv.f_bsize : 4096;
    f->cfg.max_bytes = 8 * bs;
    f->cfg.budget_fits_disk = 0;
    fx_open(f);
    for (int i = 0; i < 9; i++)
        snprintf(etag[i], sizeof etag[i], "w%d", i);
    for (int i = 0; i < 8; i++)
        if (cache_write_begin(f->c, &(cache_key){ etag[i], 0, 1 }, CACHE_KIND_EXPERT, NULL,
                              &w[i], &e))
            fail_msg("writer %d: %s", i, e.msg);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ etag[8], 0, 1 }, CACHE_KIND_EXPERT,
                                       NULL, &w[8], &e), SHOAL_ENOSPC);
    assert_null(w[8]);
    cache_write_abort(w[0]);
    w[0] = NULL;
    if (cache_write_begin(f->c, &(cache_key){ etag[8], 0, 1 }, CACHE_KIND_EXPERT, NULL, &w[8], &e))
        fail_msg("a writer after an abort: %s", e.msg);
    for (int i = 0; i < 9; i++)
        cache_write_abort(w[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_plan, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_pin_lift, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_budget_past_disk, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_writers_in_blocks, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
