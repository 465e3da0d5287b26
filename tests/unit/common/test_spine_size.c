/* test_spine_size.c — the spine's bytes per format at Kimi K3's size,
 * against specs/k3.md §8's table (GB = 10^9; each row to its printed
 * precision), and the formats against each other exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "common/spine_size.h"

/* K3's text_config (k3.md §1) as the parser leaves it. */
static void k3(k3_config *c)
{
    memset(c, 0, sizeof *c);
    c->hidden = 7168;
    c->vocab = 163840;
    c->n_layers = 93;
    c->intermediate = 33792;
    c->n_experts = 896;
    c->n_experts_per_token = 16;
    c->n_shared_experts = 2;
    c->moe_intermediate = 3072;
    c->latent = 3584;
    c->n_heads = 96;
    c->q_lora_rank = 1536;
    c->kv_lora_rank = 512;
    c->qk_nope_dim = 128;
    c->qk_rope_dim = 64;
    c->v_head_dim = 128;
    c->kda_heads = 96;
    c->kda_head_dim = 128;
    c->kda_conv = 4;
    for (int l = 0; l < 93; l++) {
        /* 1-based full_attn_layers 4, 8, ..., 92, 93 */
        c->layers[l].attn = ((l + 1) % 4 == 0 || l == 92) ? K3_ATTN_MLA : K3_ATTN_KDA;
        c->layers[l].moe = l >= 1;
        c->n_moe_layers += c->layers[l].moe;
    }
}

/* |bytes/1e9 - gb| within half the last printed digit of gb. */
static void near(uint64_t bytes, double gb, double half, const char *what)
{
    double got = (double)bytes / 1e9;
    if (fabs(got - gb) > half)
        fail_msg("%s: %.4f GB, expected %.3f", what, got, gb);
}

static void test_k3_table(void **state)
{
    static const struct { spine_part p; double bf16, int8, half; } rows[] = {
        { SPINE_KDA_PROJ, 60.78, 30.40, 0.005 }, { SPINE_KDA_GATE, 0.44, 0.88, 0.005 },
        { SPINE_KDA_SMALL, 0.044, 0.044, 0.0005 }, { SPINE_MLA, 11.15, 5.58, 0.005 },
        { SPINE_SHARED, 24.31, 12.16, 0.005 }, { SPINE_LATENT, 9.45, 4.73, 0.005 },
        { SPINE_ROUTER, 1.18, 2.36, 0.005 }, { SPINE_DENSE, 1.45, 0.73, 0.005 },
        { SPINE_LM_HEAD, 2.35, 1.18, 0.005 }, { SPINE_EMBED, 2.35, 2.35, 0.005 },
        { SPINE_VECTORS, 0.008, 0.016, 0.0005 },
    };
    k3_config c;
    spine_size b, q8;
    (void)state;
    k3(&c);
    spine_size_of(&c, SPINE_FMT_BF16, &b);
    spine_size_of(&c, SPINE_FMT_INT8, &q8);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        near(b.part[rows[i].p], rows[i].bf16, rows[i].half, spine_part_name(rows[i].p));
        near(q8.part[rows[i].p], rows[i].int8, rows[i].half, spine_part_name(rows[i].p));
    }
    assert_int_equal(b.tensors, 2460);
    near(b.total, 113.5, 0.05, "the BF16 spine");
    near(q8.matrices, 58.0, 0.05, "the int8 pack");
    near(q8.embedding, 2.35, 0.005, "the mapped embedding");
    assert_int_equal(q8.total, q8.matrices + q8.vectors + q8.embedding);
    assert_int_equal(q8.per_token, q8.matrices + q8.vectors + 7168 * 2);
}

/* int4 and f32 from the same shapes: int4 is 17/32 bytes a weight for the
 * large projections (int4 + an f16 scale per 64) and int8's for the rest;
 * f32 twice BF16 for every matrix. */
static void test_formats_agree(void **state)
{
    k3_config c;
    spine_size b, q8, q4, f;
    (void)state;
    k3(&c);
    spine_size_of(&c, SPINE_FMT_BF16, &b);
    spine_size_of(&c, SPINE_FMT_INT8, &q8);
    spine_size_of(&c, SPINE_FMT_INT4, &q4);
    spine_size_of(&c, SPINE_FMT_F32, &f);
    static const spine_part large[] = { SPINE_KDA_PROJ, SPINE_SHARED, SPINE_LATENT, SPINE_DENSE };
    uint64_t sum = 0;
    for (size_t i = 0; i < 4; i++) {
        /* the latent row also holds routed_expert_norm [3584] x 92: f32 in both */
        uint64_t v16 = large[i] == SPINE_LATENT ? 92ull * 3584 * 2 : 0;
        assert_int_equal(q4.part[large[i]], (b.part[large[i]] - v16) / 2 * 17 / 32 + 2 * v16);
    }
    for (int p = 0; p < SPINE_PART_COUNT; p++) {
        int is_large = p == SPINE_KDA_PROJ || p == SPINE_SHARED || p == SPINE_LATENT || p == SPINE_DENSE;
        if (!is_large)
            assert_int_equal(q4.part[p], q8.part[p]);
        sum += q4.part[p];
    }
    assert_int_equal(q4.total, sum);
    print_message("K3 spine: bf16 %.2f GB, int8 %.2f + %.2f GB, int4 %.2f + %.2f GB, f32 %.2f GB\n",
                  b.total / 1e9, q8.matrices / 1e9, q8.embedding / 1e9, q4.matrices / 1e9,
                  q4.embedding / 1e9, f.matrices / 1e9);
    near(q4.matrices, 35.50, 0.005, "the int4 pack");
    assert_int_equal(f.matrices, 2 * b.matrices);
    assert_int_equal(f.embedding, b.embedding);
}

static void test_names(void **state)
{
    spine_format f;
    (void)state;
    for (int i = 0; i < SPINE_FMT_COUNT; i++) {
        assert_int_equal(spine_format_parse(spine_format_name((spine_format)i), &f), 0);
        assert_int_equal(f, i);
    }
    assert_int_equal(spine_format_parse("int3", &f), SHOAL_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_k3_table),
        cmocka_unit_test(test_formats_agree),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
