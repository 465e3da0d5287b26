/* test_plan_chunk.c — the prefill chunk the memory plan picks (plan_options
 * chunk 0, docs/engine.md "Layer-major prefill") on K3's config: the
 * largest of chunk_max, chunk_max/2, ... whose plan keeps chunk 16's spine,
 * verdict and context and takes at most a quarter (PLAN_CONTEXT_SHARE) of its RAM tier; the prompt's
 * length when that is less than 16; an explicit chunk as given. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "engine/plan/plan.h"
#include "tests/lib/k3_fixture.h"

#define GiB ((uint64_t)1 << 30)

static k3_config k3;

static int setup(void **state)
{
    (void)state;
    return k3_fixture_config(&k3);
}

static int plan_at(uint64_t mem, size_t chunk, size_t chunk_max, plan *p)
{
    shoal_mem_limits lim = { .mem_total = mem, .mem_available = mem, .limit = mem };
    plan_options o;
    snprintf(lim.limit_by, sizeof lim.limit_by, "MemTotal");
    plan_options_default(&o);
    o.threads = 2;
    o.chunk = chunk;
    o.chunk_max = chunk_max;
    return plan_make(&k3, &lim, &o, p, NULL);
}

/* The auto plan against the fixed-16 plan of the same machine. */
static void check_auto(uint64_t mem, size_t chunk_max, size_t *picked)
{
    plan a, f;
    assert_int_equal(plan_at(mem, 0, chunk_max, &a), 0);
    assert_int_equal(plan_at(mem, 16, 0, &f), 0);
    print_message("%llu GiB, at most %zu tokens: chunk %zu, scratch %.1f MiB (16: %.1f MiB), "
                  "tier %.1f GiB (16: %.1f GiB)\n", (unsigned long long)(mem / GiB), chunk_max,
                  a.chunk, (double)a.scratch / 1048576.0, (double)f.scratch / 1048576.0,
                  (double)a.tier / (double)GiB, (double)f.tier / (double)GiB);
    assert_true(a.chunk_auto);
    assert_true(a.chunk >= 16 && a.chunk <= PLAN_CHUNK_MAX);
    assert_true(!chunk_max || a.chunk <= chunk_max);
    assert_int_equal(a.verdict, f.verdict);
    assert_int_equal(a.spine, f.spine);
    assert_int_equal(a.context, f.context);
    assert_int_equal(a.scratch, plan_scratch_bytes(&k3, a.chunk, 2));
    assert_true(a.scratch - f.scratch <= f.tier_planned / PLAN_CONTEXT_SHARE);
    /* the next larger candidate would have broken a rule */
    if (a.chunk > 16 && a.chunk * 2 <= (chunk_max ? chunk_max : PLAN_CHUNK_MAX)) {
        plan b;
        int rc = plan_at(mem, a.chunk * 2, 0, &b);
        assert_true(rc != 0 || b.spine != f.spine || b.context != f.context ||
                    b.scratch - f.scratch > f.tier_planned / PLAN_CONTEXT_SHARE);
    }
    *picked = a.chunk;
}

static void test_large_machine_takes_the_prompt(void **state)
{
    size_t c;
    (void)state;
    /* 1 TB: room for any prompt up to the session's limit */
    check_auto(1024 * GiB, 512, &c);
    assert_int_equal(c, 512);
    check_auto(1024 * GiB, 0, &c);
    assert_int_equal(c, PLAN_CHUNK_MAX);
}

static void test_small_machine_stays_within_the_tier(void **state)
{
    size_t c64, c24;
    (void)state;
    check_auto(64 * GiB, 0, &c64);
    check_auto(24 * GiB, 0, &c24);
    assert_int_equal(c64, 2048);       /* tier 20.8 -> 17.1 GiB */
    assert_true(c24 <= 64);            /* streamed: little tier to give */
    /* just above int8's threshold a larger scratch would push the tier
     * under one token's experts (and the spine to int4): smaller */
    check_auto(88 * GiB, 0, &c64);
    assert_true(c64 >= 16 && c64 < PLAN_CHUNK_MAX);
    check_auto(128 * GiB, 0, &c64);
    assert_int_equal(c64, PLAN_CHUNK_MAX);
}

static void test_short_prompt_and_explicit_chunk(void **state)
{
    plan p;
    (void)state;
    /* a prompt shorter than 16: that many */
    assert_int_equal(plan_at(1024 * GiB, 0, 11, &p), 0);
    assert_int_equal(p.chunk, 11);
    assert_int_equal(p.scratch, plan_scratch_bytes(&k3, 11, 2));
    /* --chunk N: N, whatever the machine */
    assert_int_equal(plan_at(1024 * GiB, 3, 512, &p), 0);
    assert_int_equal(p.chunk, 3);
    assert_false(p.chunk_auto);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_large_machine_takes_the_prompt),
        cmocka_unit_test(test_small_machine_stays_within_the_tier),
        cmocka_unit_test(test_short_prompt_and_explicit_chunk),
    };
    return cmocka_run_group_tests_name("plan_chunk", tests, setup, NULL);
}
