/* k3_fixture.c — K3's config.json for tests (see k3_fixture.h). */
#include "tests/lib/k3_fixture.h"

#include <stdio.h>
#include <string.h>

#include "common/json.h"

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
    "\"gate_lower_bound\":-5.0,\"use_full_rank_gate\":true,\"kda_layers\":[%s],"
    "\"full_attn_layers\":[%s]},"
    "\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
    "\"format\":\"mxfp4-pack-quantized\",\"config_groups\":{\"group_0\":{"
    "\"format\":\"mxfp4-pack-quantized\",\"weights\":{\"num_bits\":4,\"group_size\":32}}}}}}";

static const char *const small_json =
    "{\"model_type\":\"kimi_k3\",\"text_config\":{"
    "\"hidden_size\":64,\"vocab_size\":256,\"max_position_embeddings\":4096,"
    "\"num_hidden_layers\":4,\"first_k_dense_replace\":1,\"moe_layer_freq\":1,"
    "\"intermediate_size\":96,\"num_experts\":4,\"num_experts_per_token\":2,"
    "\"num_shared_experts\":1,\"moe_intermediate_size\":32,\"routed_expert_hidden_size\":32,"
    "\"moe_renormalize\":true,\"routed_scaling_factor\":1.0,\"latent_moe_use_norm\":true,"
    "\"activation_situ_beta\":4.0,\"activation_situ_linear_beta\":25.0,"
    "\"num_attention_heads\":2,\"num_key_value_heads\":2,\"q_lora_rank\":32,\"kv_lora_rank\":32,"
    "\"qk_nope_head_dim\":16,\"qk_rope_head_dim\":16,\"v_head_dim\":16,"
    "\"attn_res_block_size\":2,\"rms_norm_eps\":1e-5,"
    "\"bos_token_id\":1,\"eos_token_id\":2,\"pad_token_id\":3,"
    "\"linear_attn_config\":{\"num_heads\":2,\"head_dim\":32,\"short_conv_kernel_size\":4,"
    "\"gate_lower_bound\":-5.0,\"use_full_rank_gate\":true,\"kda_layers\":[1,2,4],"
    "\"full_attn_layers\":[3]},"
    "\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
    "\"format\":\"mxfp4-pack-quantized\",\"config_groups\":{\"group_0\":{"
    "\"format\":\"mxfp4-pack-quantized\",\"weights\":{\"num_bits\":4,\"group_size\":32}}}}}}";

int k3_fixture_small_json(shoal_buf *out)
{
    return shoal_buf_append(out, small_json, strlen(small_json)) == 0 ? 0 : -1;
}

static int parse_into(int (*fill)(shoal_buf *), k3_config *out)
{
    shoal_buf b;
    shoal_json *j;
    int rc = -1;

    shoal_buf_init(&b, 0);
    if (fill(&b) == 0 && (j = shoal_json_parse((const char *)b.data, b.len, NULL))) {
        rc = k3_config_parse(j, out, NULL) == 0 ? 0 : -1;
        shoal_json_free(j);
    }
    shoal_buf_free(&b);
    return rc;
}

int k3_fixture_small_config(k3_config *out)
{
    return parse_into(k3_fixture_small_json, out);
}

int k3_fixture_json(shoal_buf *out)
{
    char kda[512], full[256];
    size_t kn = 0, fn = 0;

    kda[0] = full[0] = '\0';
    for (int l = 1; l <= 93; l++) {          /* 1-based: MLA at 4, 8, ..., 92 and 93 */
        if ((l % 4 == 0 && l <= 92) || l == 93)
            fn += (size_t)snprintf(full + fn, sizeof full - fn, "%s%d", fn ? "," : "", l);
        else
            kn += (size_t)snprintf(kda + kn, sizeof kda - kn, "%s%d", kn ? "," : "", l);
    }
    return shoal_buf_appendf(out, k3_tmpl, kda, full) == 0 ? 0 : -1;
}

int k3_fixture_config(k3_config *out)
{
    return parse_into(k3_fixture_json, out);
}
