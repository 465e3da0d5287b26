/* test_fetch_parts.c — priorities, raising a priority, cancelling one item
 * and objects split into parts, in fetch sessions against a real hubmock
 * (per-connection bandwidth cap, resets).  Starts bin/mkmodel and
 * bin/hubmock ($BIN, default bin/) as child processes; tiny-k3's experts
 * (13,056 bytes) split with a 2 KiB minimum part. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sys.h"
#include "fetcher/fetch.h"
#include "tests/lib/testhub.h"
#include "tests/lib/testhub_cache.h"

static test_hub g_th;
#define g_dir (g_th.dir)
#define g_endpoint (g_th.endpoint)
static int g_home;

static int setup(void **state)
{
    static const char *const args[] = { "--bw", "400000", "--seed", "3", NULL };
    (void)state;
    return test_hub_start(&g_th, "fetchparts", args);
}

static int teardown(void **state)
{
    (void)state;
    return test_hub_stop(&g_th);
}

static void faults(const char *q)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "curl -sS -f -X POST '%s/_mock/faults?%s' -o /dev/null", g_endpoint, q);
    assert_int_equal(system(cmd), 0);
}

static int same_bytes(cache *c, const manifest *m, const fetch_item *it)
{
    return test_hub_same_bytes(&g_th, c, m, it);
}

/* A cache, an upstream with these options and the manifest. */
typedef struct env {
    cache *c;
    fetch_upstream *u;
    manifest *m;
    fetch_poll *p;
    fetch_session *s;
    fetch_item *items;     /* every expert, in file order */
    size_t n;
} env;

static void env_open(env *e, int parallel, uint64_t split_min)
{
    char home[300];
    cache_config cc;
    fetch_options fo;
    fetch_selection sel = { 0, 0, 1, -1, -1, NULL, 0 };
    shoal_err err;

    memset(e, 0, sizeof *e);
    snprintf(home, sizeof home, "%s/home%d", g_dir, g_home++);
    cache_config_default(&cc);
    cc.no_fsync = 1;
    assert_int_equal(cache_open(home, &cc, &e->c, NULL, &err), 0);
    memset(&fo, 0, sizeof fo);
    fo.model = "hf://org/m";
    fo.endpoint = g_endpoint;
    fo.parallel = parallel;
    fo.coalesce_bytes = 1;
    fo.split_min = split_min;
    fo.backoff_ms = 10;
    fo.max_attempts = 30;
    fo.seed = 9;
    assert_int_equal(fetch_upstream_open(&fo, e->c, &e->u, &err), 0);
    assert_int_equal(fetch_manifest_get(e->u, e->c, &e->m, NULL, &err), 0);
    assert_int_equal(fetch_select(e->m, &sel, &e->items, &e->n, &err), 0);
    assert_true(e->n > 100);
    assert_int_equal(fetch_poll_new(&e->p, &err), 0);
    assert_int_equal(fetch_session_new(e->u, e->c, e->m, fetch_poll_ops(), e->p, &e->s, &err), 0);
}

static void env_close(env *e)
{
    fetch_session_free(e->s);
    fetch_poll_free(e->p);
    free(e->items);
    manifest_free(e->m);
    fetch_upstream_free(e->u);
    cache_close(e->c);
}

/* Completion order: the item's index in env.items per done call. */
typedef struct order {
    const env *e;
    int idx[64], rc[64], n;
} order;

static void on_done(const fetch_item *it, int rc, void *ctx)
{
    order *o = ctx;
    for (size_t i = 0; i < o->e->n; i++)
        if (o->e->items[i].offset == it->offset && o->e->items[i].file == it->file) {
            assert_true(o->n < 64);
            o->idx[o->n] = (int)i;
            o->rc[o->n++] = rc;
            return;
        }
    fail_msg("a completion for an item never asked");
}

/* One connection: demand before prefetch before warm whatever the queue
 * order, and a raised warm item goes next. */
static void test_priorities(void **state)
{
    env e;
    order o;
    fetch_item it[9];
    shoal_err err;
    (void)state;

    env_open(&e, 1, FETCH_SPLIT_NEVER);
    memset(&o, 0, sizeof o);
    o.e = &e;
    fetch_session_on_done(e.s, on_done, &o);
    /* items 0-2 warm, 3-5 prefetch, 6-8 demand */
    for (int i = 0; i < 9; i++) {
        it[i] = e.items[i];
        it[i].priority = i < 3 ? FETCH_PRIO_WARM : i < 6 ? FETCH_PRIO_PREFETCH : FETCH_PRIO_DEMAND;
    }
    assert_int_equal(fetch_session_add(e.s, it, 9, &err), 0);
    /* item 6 (demand) took the one connection; raise item 2 (warm) */
    assert_int_equal(fetch_session_set_priority(e.s, it[2].file, it[2].offset, it[2].length,
                                                FETCH_PRIO_DEMAND), 0);
    assert_int_equal(fetch_session_set_priority(e.s, 0, 1, 2, 0), SHOAL_ENOTFOUND);
    assert_int_equal(fetch_poll_run(e.p, e.s, NULL, &err), 0);
    assert_int_equal(o.n, 9);
    {
        static const int want[9] = { 6, 2, 7, 8, 3, 4, 5, 0, 1 };
        for (int i = 0; i < 9; i++) {
            assert_int_equal(o.rc[i], 0);
            if (o.idx[i] != want[i])
                fail_msg("completion %d was item %d, want %d", i, o.idx[i], want[i]);
        }
    }
    for (int i = 0; i < 9; i++)
        assert_true(same_bytes(e.c, e.m, &it[i]));
    env_close(&e);
}

/* Cancel one split item while its parts run: it reports ECANCELED once,
 * the others finish, and asking again in the same session completes it. */
static void test_cancel(void **state)
{
    env e;
    order o;
    shoal_err err;
    fetch_stats st;
    (void)state;

    env_open(&e, 4, 2048);
    memset(&o, 0, sizeof o);
    o.e = &e;
    fetch_session_on_done(e.s, on_done, &o);
    assert_int_equal(fetch_session_add(e.s, e.items, 3, &err), 0);
    assert_int_equal(fetch_session_cancel(e.s, e.items[1].file, e.items[1].offset,
                                          e.items[1].length), 0);
    assert_int_equal(o.n, 1);
    assert_int_equal(o.idx[0], 1);
    assert_int_equal(o.rc[0], SHOAL_ECANCELED);
    assert_int_equal(fetch_session_cancel(e.s, e.items[1].file, e.items[1].offset,
                                          e.items[1].length), SHOAL_ENOTFOUND);
    assert_int_equal(fetch_poll_run(e.p, e.s, NULL, &err), 0);
    assert_int_equal(o.n, 3);
    for (int i = 1; i < 3; i++) {
        assert_int_equal(o.rc[i], 0);
        assert_int_not_equal(o.idx[i], 1);
    }
    assert_true(same_bytes(e.c, e.m, &e.items[0]));
    assert_true(same_bytes(e.c, e.m, &e.items[2]));
    assert_false(same_bytes(e.c, e.m, &e.items[1]));
    /* again: it is fetched (resuming what was kept) */
    assert_int_equal(fetch_session_add(e.s, &e.items[1], 1, &err), 0);
    assert_int_equal(fetch_poll_run(e.p, e.s, NULL, &err), 0);
    assert_int_equal(o.n, 4);
    assert_int_equal(o.idx[3], 1);
    assert_int_equal(o.rc[3], 0);
    assert_true(same_bytes(e.c, e.m, &e.items[1]));
    fetch_upstream_stats(e.u, &st);
    assert_int_equal(st.objects_fetched, 3);
    env_close(&e);
}

/* Many small objects split 2 KiB-wise over 8 connections through resets:
 * every byte right, each written once. */
static void test_split_through_resets(void **state)
{
    env e;
    shoal_err err;
    fetch_stats st;
    size_t n;
    uint64_t bytes = 0;
    (void)state;

    faults("bw=0&rate_reset=0.2&reset_after=0&seed=5");
    env_open(&e, 8, 2048);
    n = e.n < 40 ? e.n : 40;
    for (size_t i = 0; i < n; i++)
        bytes += e.items[i].length;
    assert_int_equal(fetch_session_add(e.s, e.items, n, &err), 0);
    assert_int_equal(fetch_poll_run(e.p, e.s, NULL, &err), 0);
    fetch_upstream_stats(e.u, &st);
    assert_int_equal(st.objects_fetched, n);
    assert_int_equal(st.bytes_fetched, bytes);    /* no byte written twice */
    assert_true(st.retries > 0);
    /* 40 objects, 8 ways: the tail went out in parts (more requests than
     * objects, not counting the resolve and the retries) */
    assert_true(st.requests - st.resolves - st.retries > n);
    for (size_t i = 0; i < n; i++)
        assert_true(same_bytes(e.c, e.m, &e.items[i]));
    faults("clear=1&bw=400000");
    env_close(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_priorities),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_split_through_resets),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
