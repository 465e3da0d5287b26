/* test_k3_config.c — config.json text_config parsing and the derived
 * layer schedule, on K3's real values and on tiny-k3's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "common/k3_config.h"

/* text_config with K3's values (k3.md §1); %s slots: kda list, full list,
 * quantization format. */
static const char *const k3_tmpl =
    "{\"model_type\":\"kimi_k3\",\"text_config\":{"
    "\"hidden_size\":7168,\"vocab_size\":163840,\"max_position_embeddings\":1048576,"
    "\"num_hidden_layers\":93,\"first_k_dense_replace\":1,\"moe_layer_freq\":1,"
    "\"intermediate_size\":33792,\"num_experts\":896,\"num_experts_per_token\":16,"
    "\"num_shared_experts\":2,\"moe_intermediate_size\":3072,\"routed_expert_hidden_size\":3584,"
    "\"moe_renormalize\":true,\"routed_scaling_factor\":1.0,\"latent_moe_use_norm\":true,"
    "\"activation_situ_beta\":4.0,\"activation_situ_linear_beta\":25.0,"
    "\"num_attention_heads\":96,\"num_key_value_heads\":96,\"q_lora_rank\":1536,\"kv_lora_rank\":512,"
    "\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"v_head_dim\":128,"
    "\"attn_res_block_size\":12,\"rms_norm_eps\":1e-5,"
    "\"bos_token_id\":163584,\"eos_token_id\":163586,\"pad_token_id\":163839,"
    "\"linear_attn_config\":{\"num_heads\":96,\"head_dim\":128,\"short_conv_kernel_size\":4,"
    "\"gate_lower_bound\":-5.0,\"use_full_rank_gate\":true,\"kda_layers\":[%s],\"full_attn_layers\":[%s]},"
    "\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"%s\","
    "\"config_groups\":{\"group_0\":{\"format\":\"%s\",\"weights\":{\"num_bits\":4,\"group_size\":32}}}}}}";

static int parse_k3(const char *kda, const char *full, const char *fmt, k3_config *c, shoal_err *e)
{
    shoal_buf b;
    shoal_json *j;
    int rc;
    shoal_buf_init(&b, 0);
    assert_int_equal(shoal_buf_appendf(&b, k3_tmpl, kda, full, fmt, fmt), 0);
    j = shoal_json_parse((char *)b.data, b.len, e);
    assert_non_null(j);
    rc = k3_config_parse(j, c, e);
    shoal_json_free(j);
    shoal_buf_free(&b);
    return rc;
}

/* K3's lists: full attention at 1-based 4,8,...,88,92,93; KDA the rest. */
static void k3_lists(char *kda, size_t kcap, char *full, size_t fcap)
{
    size_t kn = 0, fn = 0;
    kda[0] = full[0] = '\0';
    for (int l = 1; l <= 93; l++) {
        int is_full = (l % 4 == 0 && l <= 92) || l == 93;
        if (is_full)
            fn += (size_t)snprintf(full + fn, fcap - fn, "%s%d", fn ? "," : "", l);
        else
            kn += (size_t)snprintf(kda + kn, kcap - kn, "%s%d", kn ? "," : "", l);
    }
}

static void test_k3_values(void **state)
{
    char kda[512], full[256];
    k3_config c;
    shoal_err e = { 0 };
    uint64_t rec[6], sum = 0;
    int mla = 0, snaps = 0;
    (void)state;
    k3_lists(kda, sizeof kda, full, sizeof full);
    assert_int_equal(parse_k3(kda, full, "mxfp4-pack-quantized", &c, &e), 0);
    assert_int_equal(c.hidden, 7168);
    assert_int_equal(c.n_layers, 93);
    assert_true(c.expert_bytes == 17547264ull);
    k3_expert_record_sizes(&c, rec);
    assert_true(rec[0] == 5505024ull && rec[1] == 344064ull);
    for (int i = 0; i < 6; i++)
        sum += rec[i];
    assert_true(sum == c.expert_bytes);
    assert_int_equal(c.n_moe_layers, 92);
    assert_int_equal(c.layers[0].moe, 0);
    assert_int_equal(c.layers[1].moe, 1);
    for (int l = 0; l < 93; l++) {
        mla += c.layers[l].attn == K3_ATTN_MLA;
        snaps += c.layers[l].snapshot;
    }
    assert_int_equal(mla, 24);
    assert_int_equal(snaps, 8);
    /* 0-based: (KKKM)x22 then KKKMM. */
    assert_int_equal(c.layers[3].attn, K3_ATTN_MLA);
    assert_int_equal(c.layers[90].attn, K3_ATTN_KDA);
    assert_int_equal(c.layers[91].attn, K3_ATTN_MLA);
    assert_int_equal(c.layers[92].attn, K3_ATTN_MLA);
    assert_int_equal(c.kda_heads, 96);
    assert_int_equal(c.quant_group, 32);
    assert_true(c.situ_linear_beta == 25.0);
}

static void test_tiny_schedule(void **state)
{
    k3_config c;
    shoal_err e = { 0 };
    const char *tiny =
        "{\"text_config\":{\"hidden_size\":256,\"vocab_size\":1024,\"max_position_embeddings\":4096,"
        "\"num_hidden_layers\":8,\"first_k_dense_replace\":1,\"moe_layer_freq\":1,"
        "\"intermediate_size\":512,\"num_experts\":64,\"num_experts_per_token\":4,"
        "\"num_shared_experts\":2,\"moe_intermediate_size\":64,\"routed_expert_hidden_size\":128,"
        "\"moe_renormalize\":true,\"routed_scaling_factor\":1,\"latent_moe_use_norm\":true,"
        "\"activation_situ_beta\":4.0,\"activation_situ_linear_beta\":25.0,"
        "\"num_attention_heads\":4,\"q_lora_rank\":64,\"kv_lora_rank\":32,"
        "\"qk_nope_head_dim\":16,\"qk_rope_head_dim\":8,\"v_head_dim\":16,"
        "\"attn_res_block_size\":3,\"rms_norm_eps\":1e-5,"
        "\"bos_token_id\":768,\"eos_token_id\":770,\"pad_token_id\":1023,"
        "\"linear_attn_config\":{\"num_heads\":4,\"head_dim\":32,\"short_conv_kernel_size\":4,"
        "\"gate_lower_bound\":-5.0,\"kda_layers\":[1,2,3,5,6],\"full_attn_layers\":[4,7,8]},"
        "\"quantization_config\":{\"format\":\"mxfp4-pack-quantized\","
        "\"config_groups\":{\"group_0\":{\"weights\":{\"num_bits\":4,\"group_size\":32}}}}}}";
    shoal_json *j = shoal_json_parse(tiny, strlen(tiny), &e);
    const char *want = "KKKMKKMM";
    (void)state;
    assert_non_null(j);
    assert_int_equal(k3_config_parse(j, &c, &e), 0);
    shoal_json_free(j);
    for (int l = 0; l < 8; l++)
        assert_int_equal(c.layers[l].attn == K3_ATTN_MLA ? 'M' : 'K', want[l]);
    assert_true(c.expert_bytes == 13056u);
    assert_int_equal(c.layers[0].snapshot + c.layers[3].snapshot + c.layers[6].snapshot, 3);
    assert_int_equal(c.layers[1].snapshot, 0);
    assert_int_equal(c.n_moe_layers, 7);
}

static void test_errors_name_the_problem(void **state)
{
    char kda[512], full[256];
    k3_config c;
    shoal_err e = { 0 };
    (void)state;
    k3_lists(kda, sizeof kda, full, sizeof full);
    /* 0-based lists are refused: layer 0 is outside 1..93. */
    assert_int_equal(parse_k3("0,1,2", full, "mxfp4-pack-quantized", &c, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "1-based"));
    /* A layer named twice. */
    assert_int_equal(parse_k3("1,2,4", full, "mxfp4-pack-quantized", &c, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "layer 4 is listed twice"));
    /* A layer missing from both. */
    assert_int_equal(parse_k3("1,2", full, "mxfp4-pack-quantized", &c, &e), SHOAL_EFORMAT);
    assert_non_null(strstr(e.msg, "layer 3 (1-based)"));
    /* Another quantization. */
    assert_int_equal(parse_k3(kda, full, "float-quantized", &c, &e), SHOAL_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "float-quantized"));
    /* A missing key is named. */
    {
        const char *text = "{\"text_config\":{\"hidden_size\":7168}}";
        shoal_json *j = shoal_json_parse(text, strlen(text), &e);
        assert_int_equal(k3_config_parse(j, &c, &e), SHOAL_ENOTFOUND);
        assert_non_null(strstr(e.msg, "vocab_size"));
        shoal_json_free(j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_k3_values),
        cmocka_unit_test(test_tiny_schedule),
        cmocka_unit_test(test_errors_name_the_problem),
    };
    return cmocka_run_group_tests_name("k3_config", tests, NULL, NULL);
}
