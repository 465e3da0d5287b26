/* test_plan.c — the memory plan on K3's config: which spine and context
 * each machine size gets, the streamed part below the int4 spine, the
 * refusal below the floor naming the smallest RAM, --context and
 * --expert-ram, and the JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/path.h"
#include "engine/plan/plan.h"
#include "tests/lib/k3_fixture.h"

#define GiB ((uint64_t)1 << 30)

static k3_config k3;

static int setup(void **state)
{
    (void)state;
    return k3_fixture_config(&k3);
}

/* A machine of `mem` bytes (MemTotal), no cgroup; planned as serve does. */
static int plan_at(uint64_t mem, const plan_options *o, plan *p, shoal_err *e)
{
    shoal_mem_limits lim = { .mem_total = mem, .mem_available = mem, .limit = mem };
    plan_options d;
    snprintf(lim.limit_by, sizeof lim.limit_by, "MemTotal");
    if (!o) {
        plan_options_default(&d);
        d.threads = 2;
        o = &d;
    }
    int rc = plan_make(&k3, &lim, o, p, e);
    plan_print(p, &k3, stdout);
    return rc;
}

/* The parts add up to the limit exactly (the tier is what is left). */
static void sums(const plan *p)
{
    if (p->verdict == PLAN_RESIDENT && !p->tier_set)
        assert_int_equal(p->reserve + p->spine_resident + p->scratch + p->pool + p->kv_bytes +
                         p->tier, p->limit);
}

/* 64 GB (MemTotal 62.8 GiB): int8 does not leave a useful tier; int4 does,
 * with a context of 32k capped from 1M. */
static void test_64gb_picks_int4(void **state)
{
    plan p;
    (void)state;
    assert_int_equal(plan_at(62 * GiB + 800 * (GiB >> 10), NULL, &p, NULL), 0);
    assert_int_equal(p.verdict, PLAN_RESIDENT);
    assert_int_equal(p.spine, K3_SPINE_INT4);
    assert_true(p.spine_resident > 36 * 1000000000ull && p.spine_resident < 38 * 1000000000ull);
    assert_int_equal(p.context, 32768);
    assert_true(p.context_capped);
    assert_true(p.tier > 18 * GiB && p.tier < 24 * GiB);
    assert_int_equal(p.pool_buffers, 32);
    assert_int_equal(p.pool_buffer_bytes, 18u << 20);      /* 17.5 MB + 4 KiB, in 2 MiB pages */
    assert_int_equal(p.reserve, (62 * GiB + 800 * (GiB >> 10)) / 100 * 6);
    assert_int_equal(p.state_bytes, 2 * k3_kda_state_bytes(&k3));
    assert_non_null(strstr(p.why, "int4 fits"));
    sums(&p);
}

/* 128 GB: int8 with a tier above one token's experts (25.8 GB). */
static void test_128gb_picks_int8(void **state)
{
    plan p;
    (void)state;
    assert_int_equal(plan_at(125 * GiB, NULL, &p, NULL), 0);
    assert_int_equal(p.spine, K3_SPINE_INT8);
    assert_true(p.tier >= p.tier_useful);
    assert_true(p.tier_useful > 25 * 1000000000ull && p.tier_useful < 26 * 1000000000ull);
    assert_true(p.context >= 32768 && p.context_capped);
    sums(&p);
    /* min_int8 / min_int4: the limits where each begins */
    plan q;
    assert_int_equal(plan_at(p.min_int8, NULL, &q, NULL), 0);
    assert_int_equal(q.spine, K3_SPINE_INT8);
    assert_int_equal(q.context, 4096);
    assert_int_equal(plan_at(p.min_int8 - (64u << 20), NULL, &q, NULL), 0);
    assert_int_equal(q.spine, K3_SPINE_INT4);
    assert_int_equal(plan_at(p.min_int4, NULL, &q, NULL), 0);
    assert_int_equal(q.spine, K3_SPINE_INT4);
    assert_int_equal(q.verdict, PLAN_RESIDENT);
}

/* 32 GB: not even int4 fits; a prefix of layers resident, the rest
 * streamed, with its cost per token. */
static void test_32gb_streams(void **state)
{
    plan p;
    (void)state;
    assert_int_equal(plan_at(31 * GiB, NULL, &p, NULL), 0);
    assert_int_equal(p.verdict, PLAN_STREAMED);
    assert_int_equal(p.spine, K3_SPINE_INT4);
    assert_true(p.first_streamed_layer > 40 && p.first_streamed_layer < 93);
    assert_true(p.spine_streamed > 5 * 1000000000ull && p.spine_streamed < 15 * 1000000000ull);
    assert_true(p.stream_s_per_token > 0.5 && p.stream_s_per_token < 2.5);
    assert_int_equal(p.context, 4096);
    /* what is left is less than one more layer could have kept */
    assert_true(p.tier < p.stream_buffers);
    /* the streamed regions hold their routers too (read in place with the
     * layer, used from the resident copy) and each array's alignment */
    assert_true(p.spine_resident + p.spine_streamed >= p.spine_bytes);
    assert_true(p.spine_resident + p.spine_streamed < p.spine_bytes + p.spine_bytes / 50);
    assert_true(p.limit >= p.reserve + p.spine_resident + p.stream_buffers + p.kv_bytes +
                           p.scratch + p.pool);
}

/* 8 GB: below the floor; refused, naming the smallest RAM that works. */
static void test_8gb_refused(void **state)
{
    plan p, q;
    shoal_err e = { 0 };
    char want[32];
    (void)state;
    assert_int_equal(plan_at(8 * GiB, NULL, &p, &e), SHOAL_ENOMEM);
    assert_int_equal(p.verdict, PLAN_REFUSED);
    assert_true(p.min_floor > 14 * GiB && p.min_floor < 20 * GiB);
    shoal_size_format(p.min_floor, want, sizeof want);
    assert_non_null(strstr(e.msg, want));
    assert_non_null(strstr(e.msg, "needs at least"));
    /* and it does work there */
    assert_int_equal(plan_at(p.min_floor, NULL, &q, NULL), 0);
    assert_int_equal(q.verdict, PLAN_STREAMED);
    assert_int_equal(plan_at(p.min_floor - (256u << 20), NULL, &q, NULL), SHOAL_ENOMEM);
}

/* --ram, --context, --spine and --expert-ram */
static void test_options(void **state)
{
    plan_options o;
    plan p;
    shoal_err e = { 0 };
    (void)state;
    plan_options_default(&o);
    o.threads = 2;
    o.ram = 62 * GiB;
    assert_int_equal(plan_at(256 * GiB, &o, &p, NULL), 0);
    assert_string_equal(p.limit_by, "--ram");
    assert_int_equal(p.limit, 62 * GiB);
    assert_int_equal(p.spine, K3_SPINE_INT4);
    /* an explicit context is taken as asked when it fits */
    o.context = 131072;
    assert_int_equal(plan_at(256 * GiB, &o, &p, NULL), 0);
    assert_int_equal(p.context, 131072);
    assert_true(p.kv_bytes > 15 * 1000000000ull);       /* k3.md §8: 7.71 GB x 2 */
    o.context = 2 * 1048576;
    assert_int_equal(plan_at(256 * GiB, &o, &p, &e), SHOAL_EINVAL);
    assert_non_null(strstr(e.msg, "max_position_embeddings"));
    o.context = 0;
    o.spine = K3_SPINE_INT8;
    assert_int_equal(plan_at(256 * GiB, &o, &p, NULL), 0);
    assert_int_equal(p.verdict, PLAN_RESIDENT);         /* int8 asked for: 58 GB fits 62 GiB */
    assert_int_equal(p.spine, K3_SPINE_INT8);
    assert_true(p.tier < p.tier_useful);
    o.ram = 56 * GiB;
    assert_int_equal(plan_at(256 * GiB, &o, &p, NULL), 0);
    assert_int_equal(p.verdict, PLAN_STREAMED);         /* ... and does not fit 56 GiB */
    assert_int_equal(p.spine, K3_SPINE_INT8);
    o.ram = 62 * GiB;
    o.spine = -1;
    o.expert_ram_set = 1;
    o.expert_ram = 4 * GiB;
    assert_int_equal(plan_at(256 * GiB, &o, &p, NULL), 0);
    assert_int_equal(p.tier, 4 * GiB);
    assert_true(p.tier_set && p.tier_planned > 4 * GiB);
    /* run --tokens holds one state: a larger context at the same RAM */
    plan_options_default(&o);
    o.copies = 1;
    o.ram = 62 * GiB;
    plan q;
    assert_int_equal(plan_at(256 * GiB, &o, &q, NULL), 0);
    assert_int_equal(q.state_bytes, k3_kda_state_bytes(&k3));
    /* a local directory has no expert buffers */
    o.remote = 0;
    assert_int_equal(plan_at(256 * GiB, &o, &q, NULL), 0);
    assert_int_equal(q.pool, 0);
}

static void test_json(void **state)
{
    plan p;
    shoal_json *j;
    (void)state;
    assert_int_equal(plan_at(62 * GiB, NULL, &p, NULL), 0);
    j = plan_to_json(&p);
    assert_non_null(j);
    assert_string_equal(shoal_json_str_value(shoal_json_path(j, "spine.mode")), "int4");
    assert_string_equal(shoal_json_str_value(shoal_json_get(j, "verdict")), "resident");
    assert_int_equal(shoal_json_int_value(shoal_json_get(j, "context")), p.context);
    assert_int_equal(shoal_json_int_value(shoal_json_path(j, "expert_pool.buffers")), 32);
    assert_int_equal(shoal_json_int_value(shoal_json_get(j, "ram_tier")), (int64_t)p.tier);
    assert_int_equal(shoal_json_int_value(shoal_json_path(j, "min_ram.floor")),
                     (int64_t)p.min_floor);
    shoal_json_free(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_64gb_picks_int4),
        cmocka_unit_test(test_128gb_picks_int8),
        cmocka_unit_test(test_32gb_streams),
        cmocka_unit_test(test_8gb_refused),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_json),
    };
    return cmocka_run_group_tests_name("plan", tests, setup, NULL);
}
