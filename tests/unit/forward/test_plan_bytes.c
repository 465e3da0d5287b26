/* test_plan_bytes.c — the memory plan counts what a session really holds:
 * engine/plan's scratch and state estimate against engine_session_bytes
 * of a real session at K3's shapes (chunk 1 and 16, 1 and 2 threads), and
 * the MLA cache stops at the plan's context. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "engine/forward/forward.h"
#include "engine/plan/plan.h"
#include "tests/lib/k3_fixture.h"

/* A session needs the config only until it runs. */
static engine_model model;

static int noop_fetch(void *impl, int layer, const int32_t *ids, size_t n, expert_ready_fn fn,
                      void *ctx, shoal_err *err)
{
    (void)impl; (void)layer; (void)ids; (void)n; (void)fn; (void)ctx; (void)err;
    return 0;
}

static void noop_free(void *impl)
{
    (void)impl;
}

static void check(size_t chunk, int threads)
{
    static const expert_source_ops ops = { noop_fetch, noop_free };
    expert_source *src = expert_source_new(&ops, NULL);
    kernels_pool *pool = kernels_pool_new(threads);
    engine_session_options so = { .chunk = chunk, .pool = pool, .src = src };
    engine_session *s = NULL;
    const k3_config *c = &model.cfg;

    assert_int_equal(engine_session_new(&model, &so, &s, NULL), 0);
    /* the session starts with 64 positions of MLA cache and scores; the
     * rest is its state and its chunk scratch */
    uint64_t fixed = k3_kda_state_bytes(c) + 64 * (k3_mla_bytes_per_token(c) +
                                                   4 * (uint64_t)threads);
    uint64_t planned = plan_scratch_bytes(c, chunk, threads), real;
    assert_true(engine_session_bytes(s) > fixed);
    real = engine_session_bytes(s) - fixed;
    print_message("chunk %zu, %d threads: scratch planned %llu, session %llu bytes\n", chunk,
                  threads, (unsigned long long)planned, (unsigned long long)real);
    assert_true(planned >= real);
    assert_true(planned <= real + real / 10);
    engine_session_free(s);
    kernels_pool_free(pool);
    expert_source_free(src);
}

static void test_scratch_and_state(void **state)
{
    (void)state;
    assert_int_equal(k3_fixture_config(&model.cfg), 0);
    check(1, 1);
    check(16, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scratch_and_state),
    };
    return cmocka_run_group_tests_name("plan_bytes", tests, NULL, NULL);
}
