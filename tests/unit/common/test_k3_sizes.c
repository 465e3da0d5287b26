/* test_k3_sizes.c — the spine's bytes per mode at K3's size against
 * specs/k3.md §8, the per-mode formats, and the load-order walk. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/k3_sizes.h"
#include "tests/lib/k3_fixture.h"

/* |bytes - gb·1e9| within half of the table's last digit */
static void near_gb(uint64_t bytes, double gb, double digit)
{
    double got = (double)bytes / 1e9;
    if (got < gb - digit / 2 || got > gb + digit / 2)
        fail_msg("%.4f GB, k3.md §8 says %.3f GB", got, gb);
}

/* k3.md §8, "as shoal keeps it today": the int8 spine. */
static void test_int8_matches_k3_md(void **state)
{
    k3_config c;
    k3_spine_sizes s;
    (void)state;
    assert_int_equal(k3_fixture_config(&c), 0);
    k3_spine_sizes_get(&c, K3_SPINE_INT8, &s);
    near_gb(s.part[K3_PART_KDA_PROJ], 30.40, 0.01);
    near_gb(s.part[K3_PART_KDA_GATE], 0.88, 0.01);
    near_gb(s.part[K3_PART_MLA], 5.58, 0.01);
    near_gb(s.part[K3_PART_SHARED], 12.16, 0.01);
    near_gb(s.part[K3_PART_LATENT], 4.73, 0.01);
    near_gb(s.part[K3_PART_ROUTER], 2.36, 0.01);
    near_gb(s.part[K3_PART_DENSE], 0.73, 0.01);
    near_gb(s.part[K3_PART_HEAD], 1.18, 0.01);
    near_gb(s.matrices, 58.0, 0.1);             /* the pack: matrices only */
    /* every spine tensor as stored: what test_daemon_k3.sh counts in the
     * synthesized checkpoint's headers */
    assert_int_equal(s.checkpoint, 113509540864ull);
    near_gb(s.embedding, 2.35, 0.01);
    /* conv taps, A_log, dt_bias, o_norm 0.044 GB and norms 16 MB */
    near_gb(s.vectors, 0.060, 0.002);
}

/* k3.md §8, "BF16 in the checkpoint", and the number of tensors. */
static void test_bf16_matches_k3_md(void **state)
{
    k3_config c;
    k3_spine_sizes s;
    (void)state;
    assert_int_equal(k3_fixture_config(&c), 0);
    k3_spine_sizes_get(&c, K3_SPINE_INT8, &s);
    near_gb(s.bf16_part[K3_PART_KDA_PROJ], 60.78, 0.01);
    near_gb(s.bf16_part[K3_PART_KDA_GATE], 0.44, 0.01);
    near_gb(s.bf16_part[K3_PART_MLA], 11.15, 0.01);
    near_gb(s.bf16_part[K3_PART_SHARED], 24.31, 0.01);
    near_gb(s.bf16_part[K3_PART_LATENT], 9.45, 0.01);
    near_gb(s.bf16_part[K3_PART_ROUTER], 1.18, 0.01);
    near_gb(s.bf16_part[K3_PART_DENSE], 1.45, 0.01);
    near_gb(s.bf16_part[K3_PART_HEAD], 2.35, 0.01);
    /* 69 KDA x 8 + 24 MLA x 7 (kv_b twice) + 92 MoE x 6 + 3 dense + lm_head */
    assert_int_equal(s.n_matrices, 69 * 8 + 24 * 7 + 92 * 6 + 3 + 1);
}

/* The int4 mode: the large projections at 0.5625 bytes a weight, MLA and
 * the head at int8, routers and the gate path f32. */
static void test_int4(void **state)
{
    k3_config c;
    k3_spine_sizes s4, s8;
    (void)state;
    assert_int_equal(k3_fixture_config(&c), 0);
    k3_spine_sizes_get(&c, K3_SPINE_INT4, &s4);
    k3_spine_sizes_get(&c, K3_SPINE_INT8, &s8);
    near_gb(s4.part[K3_PART_KDA_PROJ], 17.09, 0.01);
    near_gb(s4.part[K3_PART_SHARED], 6.84, 0.01);
    near_gb(s4.part[K3_PART_LATENT], 2.66, 0.01);
    near_gb(s4.part[K3_PART_DENSE], 0.41, 0.01);
    assert_int_equal(s4.part[K3_PART_MLA], s8.part[K3_PART_MLA]);
    assert_int_equal(s4.part[K3_PART_HEAD], s8.part[K3_PART_HEAD]);
    assert_int_equal(s4.part[K3_PART_ROUTER], s8.part[K3_PART_ROUTER]);
    assert_int_equal(s4.part[K3_PART_KDA_GATE], s8.part[K3_PART_KDA_GATE]);
    near_gb(s4.matrices + s4.vectors, 37.06, 0.01);
    /* per-sequence state, k3.md §8 */
    near_gb(k3_kda_state_bytes(&c), 0.465, 0.001);
    assert_int_equal(k3_mla_bytes_per_token(&c), 55296);
}

static void test_formats(void **state)
{
    (void)state;
    assert_int_equal(k3_spine_fmt(K3_SPINE_INT8, K3_PART_KDA_PROJ, 7168), K3_FMT_INT8);
    assert_int_equal(k3_spine_fmt(K3_SPINE_INT8, K3_PART_ROUTER, 7168), K3_FMT_F32);
    assert_int_equal(k3_spine_fmt(K3_SPINE_INT8, K3_PART_MLA, 16), K3_FMT_F32);
    assert_int_equal(k3_spine_fmt(K3_SPINE_INT4, K3_PART_SHARED, 7168), K3_FMT_INT4);
    assert_int_equal(k3_spine_fmt(K3_SPINE_INT4, K3_PART_MLA, 7168), K3_FMT_INT8);
    assert_int_equal(k3_spine_fmt(K3_SPINE_INT4, K3_PART_HEAD, 7168), K3_FMT_INT8);
    assert_int_equal(k3_spine_fmt(K3_SPINE_INT4, K3_PART_KDA_GATE, 7168), K3_FMT_F32);
    assert_int_equal(k3_spine_fmt(K3_SPINE_F32, K3_PART_KDA_PROJ, 7168), K3_FMT_F32);
    k3_spine_mat m = { .rows = 2, .cols = 64, .fmt = K3_FMT_INT4 };
    assert_int_equal(k3_mat_bytes(&m), 64 + 8);
    m.fmt = K3_FMT_INT8;
    assert_int_equal(k3_mat_bytes(&m), 128 + 8);
    m.fmt = K3_FMT_F32;
    assert_int_equal(k3_mat_bytes(&m), 512);
}

typedef struct seen { int n; char first[96], fifth[96]; int stop_at; } seen;

static int record(void *ctx, const k3_spine_mat *m)
{
    seen *s = ctx;
    if (s->n == 0)
        memcpy(s->first, m->name, sizeof s->first);
    if (s->n == 4)
        memcpy(s->fifth, m->name, sizeof s->fifth);
    return ++s->n == s->stop_at ? 7 : 0;
}

static void test_walk_order(void **state)
{
    k3_config c;
    seen s = { 0 };
    (void)state;
    assert_int_equal(k3_fixture_config(&c), 0);
    assert_int_equal(k3_spine_walk(&c, K3_SPINE_INT8, record, &s), 0);
    assert_string_equal(s.first, "lm_head.weight");
    assert_string_equal(s.fifth, "model.layers.0.self_attn.g_proj.weight");
    seen t = { .stop_at = 3 };
    assert_int_equal(k3_spine_walk(&c, K3_SPINE_INT8, record, &t), 7);
    assert_int_equal(t.n, 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int8_matches_k3_md),
        cmocka_unit_test(test_bf16_matches_k3_md),
        cmocka_unit_test(test_int4),
        cmocka_unit_test(test_formats),
        cmocka_unit_test(test_walk_order),
    };
    return cmocka_run_group_tests_name("k3_sizes", tests, NULL, NULL);
}
