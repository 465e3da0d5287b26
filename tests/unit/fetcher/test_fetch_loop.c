/* test_fetch_loop.c — fetch sessions driven by libevent through
 * fetch_loop_ops (as the daemon will), against a real hubmock with faults
 * (429s, resets, expiring CDN URLs): every expert and spine tensor of
 * tiny-k3 ends up in the cache byte-identical to the shards.  Starts
 * bin/mkmodel and bin/hubmock ($BIN, default bin/) as child processes. */
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
#include <event2/event.h>

#include "common/sys.h"
#include "fetcher/fetch.h"
#include "tests/lib/testhub.h"
#include "tests/lib/testhub_cache.h"

#define MAX_FD 4096

typedef struct evloop {
    struct event_base *base;
    struct event      *ev[MAX_FD];
    struct event      *timer;
    fetch_session     *s;
    int                watches, timers;
} evloop;

static void check_done(evloop *l)
{
    if (fetch_session_idle(l->s) || fetch_session_status(l->s, NULL) != 0)
        event_base_loopbreak(l->base);
}

static void on_fd(evutil_socket_t fd, short what, void *arg)
{
    evloop *l = arg;
    fetch_session_io(l->s, (int)fd, ((what & EV_READ) ? FETCH_WATCH_IN : 0)
                                    | ((what & EV_WRITE) ? FETCH_WATCH_OUT : 0));
    check_done(l);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    evloop *l = arg;
    (void)fd;
    (void)what;
    fetch_session_timeout(l->s);
    check_done(l);
}

static int ev_watch(void *loop, int fd, unsigned what)
{
    evloop *l = loop;
    if (fd < 0 || fd >= MAX_FD)
        return SHOAL_EINVAL;
    if (l->ev[fd]) {
        event_free(l->ev[fd]);
        l->ev[fd] = NULL;
    }
    if (what == FETCH_WATCH_NONE)
        return 0;
    l->ev[fd] = event_new(l->base, fd, (short)(EV_PERSIST | ((what & FETCH_WATCH_IN) ? EV_READ : 0)
                                               | ((what & FETCH_WATCH_OUT) ? EV_WRITE : 0)),
                          on_fd, l);
    l->watches++;
    return l->ev[fd] && event_add(l->ev[fd], NULL) == 0 ? 0 : SHOAL_ENOMEM;
}

static void ev_timer(void *loop, long ms)
{
    evloop *l = loop;
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    evtimer_del(l->timer);
    if (ms >= 0) {
        evtimer_add(l->timer, &tv);
        l->timers++;
    }
}

static const fetch_loop_ops ev_ops = { ev_watch, ev_timer, NULL, NULL };

static test_hub g_th;
#define g_dir (g_th.dir)
#define g_endpoint (g_th.endpoint)

static int setup(void **state)
{
    static const char *const args[] = { "--rate-429", "0.1", "--retry-after", "0", "--rate-reset",
                                 "0.1", "--cdn-ttl", "1", "--seed", "11", NULL };
    (void)state;
    return test_hub_start(&g_th, "fetchloop", args);
}

static int teardown(void **state)
{
    (void)state;
    return test_hub_stop(&g_th);
}

static int same_bytes(cache *c, const manifest *m, const fetch_item *it)
{
    return test_hub_same_bytes(&g_th, c, m, it);
}

static void count_done(const fetch_item *it, int rc, void *ctx)
{
    (void)it;
    assert_true(rc == 0 || rc == SHOAL_EBUSY);
    (*(int *)ctx)++;
}

static void test_libevent_session(void **state)
{
    char home[300];
    cache_config cc;
    cache *c = NULL;
    fetch_options fo;
    fetch_upstream *u = NULL;
    manifest *m = NULL;
    fetch_selection sel = { 1, 1, 1, -1, -1, NULL, 0 };
    fetch_item *items = NULL;
    size_t n = 0;
    fetch_stats st;
    evloop l;
    shoal_err err;
    (void)state;

    snprintf(home, sizeof home, "%s/home", g_dir);
    cache_config_default(&cc);
    cc.no_fsync = 1;
    assert_int_equal(cache_open(home, &cc, &c, NULL, &err), 0);
    memset(&fo, 0, sizeof fo);
    fo.model = "hf://org/m";
    fo.endpoint = g_endpoint;
    fo.coalesce_bytes = 128 * 1024;
    fo.backoff_ms = 20;
    fo.max_attempts = 20;   /* 8 failures in a row at these fault rates is rare, not impossible */
    fo.seed = 5;
    assert_int_equal(fetch_upstream_open(&fo, c, &u, &err), 0);
    assert_int_equal(fetch_manifest_get(u, c, &m, NULL, &err), 0);
    assert_int_equal(m->nexperts, 448);
    assert_int_equal(fetch_select(m, &sel, &items, &n, &err), 0);
    assert_true(n > 600);

    memset(&l, 0, sizeof l);
    l.base = event_base_new();
    assert_non_null(l.base);
    l.timer = evtimer_new(l.base, on_timer, &l);
    assert_int_equal(fetch_session_new(u, c, m, &ev_ops, &l, &l.s, &err), 0);
    assert_int_equal(fetch_session_add(l.s, items, n, &err), 0);
    if (!fetch_session_idle(l.s))
        assert_int_equal(event_base_dispatch(l.base), 0);
    assert_int_equal(fetch_session_status(l.s, &err), 0);
    assert_true(fetch_session_idle(l.s));
    assert_true(l.watches > 0 && l.timers > 0);   /* the loop really drove it */
    fetch_upstream_stats(u, &st);
    assert_int_equal(st.objects_fetched, n);
    assert_true(st.retries > 0);                  /* the faults happened */
    for (size_t i = 0; i < n; i++)
        assert_true(same_bytes(c, m, &items[i]));

    fetch_session_free(l.s);

    /* Asked twice over in a new session on an empty cache: the second copy
     * of each object finds it in flight or stored; nothing fails, each is
     * reported done, and the bytes are right. */
    {
        int done = 0;
        cache *c2 = NULL;
        snprintf(home, sizeof home, "%s/home2", g_dir);
        assert_int_equal(cache_open(home, &cc, &c2, NULL, &err), 0);
        l.s = NULL;
        assert_int_equal(fetch_session_new(u, c2, m, &ev_ops, &l, &l.s, &err), 0);
        fetch_session_on_done(l.s, count_done, &done);
        assert_int_equal(fetch_session_add(l.s, items, n, &err), 0);
        assert_int_equal(fetch_session_add(l.s, items, n, &err), 0);
        if (!fetch_session_idle(l.s))
            assert_int_equal(event_base_dispatch(l.base), 0);
        assert_int_equal(fetch_session_status(l.s, &err), 0);
        assert_int_equal(done, (int)(2 * n));
        for (size_t i = 0; i < n; i++)
            assert_true(same_bytes(c2, m, &items[i]));
        fetch_session_free(l.s);
        cache_close(c2);
    }
    for (int i = 0; i < MAX_FD; i++)
        if (l.ev[i])
            event_free(l.ev[i]);
    event_free(l.timer);
    event_base_free(l.base);
    free(items);
    manifest_free(m);
    fetch_upstream_free(u);
    cache_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_libevent_session),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
