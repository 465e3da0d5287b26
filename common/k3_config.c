/* k3_config.c — parse and check config.json's text_config (k3.md §1). */
#include "common/k3_config.h"

#include <string.h>

/* Read one integer key of text_config into *out, naming it on error. */
static int get_i(const shoal_json *tc, const char *key, int64_t *out, shoal_err *err)
{
    int rc = shoal_json_int(tc, key, out, err);
    if (rc)
        shoal_err_wrap(err, rc, "config.json text_config");
    return rc;
}

static int get_d(const shoal_json *tc, const char *key, double *out, shoal_err *err)
{
    int rc = shoal_json_num(tc, key, out, err);
    if (rc)
        shoal_err_wrap(err, rc, "config.json text_config");
    return rc;
}

static int get_b(const shoal_json *tc, const char *key, int *out, shoal_err *err)
{
    int rc = shoal_json_bool(tc, key, out, err);
    if (rc)
        shoal_err_wrap(err, rc, "config.json text_config");
    return rc;
}

static int bad(shoal_err *err, const char *what)
{
    return shoal_err_set(err, SHOAL_EFORMAT, "config.json text_config: %s", what);
}

static int parse_sizes(const shoal_json *tc, k3_config *c, shoal_err *err)
{
    int rc = 0;
    rc = rc ? rc : get_i(tc, "hidden_size", &c->hidden, err);
    rc = rc ? rc : get_i(tc, "vocab_size", &c->vocab, err);
    rc = rc ? rc : get_i(tc, "num_hidden_layers", &c->n_layers, err);
    rc = rc ? rc : get_i(tc, "intermediate_size", &c->intermediate, err);
    rc = rc ? rc : get_i(tc, "max_position_embeddings", &c->max_positions, err);
    rc = rc ? rc : get_i(tc, "num_experts", &c->n_experts, err);
    rc = rc ? rc : get_i(tc, "num_experts_per_token", &c->n_experts_per_token, err);
    rc = rc ? rc : get_i(tc, "num_shared_experts", &c->n_shared_experts, err);
    rc = rc ? rc : get_i(tc, "moe_intermediate_size", &c->moe_intermediate, err);
    rc = rc ? rc : get_i(tc, "routed_expert_hidden_size", &c->latent, err);
    rc = rc ? rc : get_i(tc, "first_k_dense_replace", &c->first_k_dense, err);
    rc = rc ? rc : get_i(tc, "moe_layer_freq", &c->moe_layer_freq, err);
    rc = rc ? rc : get_b(tc, "moe_renormalize", &c->renormalize, err);
    rc = rc ? rc : get_b(tc, "latent_moe_use_norm", &c->latent_norm, err);
    rc = rc ? rc : get_d(tc, "routed_scaling_factor", &c->routed_scaling, err);
    rc = rc ? rc : get_i(tc, "num_attention_heads", &c->n_heads, err);
    rc = rc ? rc : get_i(tc, "q_lora_rank", &c->q_lora_rank, err);
    rc = rc ? rc : get_i(tc, "kv_lora_rank", &c->kv_lora_rank, err);
    rc = rc ? rc : get_i(tc, "qk_nope_head_dim", &c->qk_nope_dim, err);
    rc = rc ? rc : get_i(tc, "qk_rope_head_dim", &c->qk_rope_dim, err);
    rc = rc ? rc : get_i(tc, "v_head_dim", &c->v_head_dim, err);
    rc = rc ? rc : get_i(tc, "attn_res_block_size", &c->attn_res_block, err);
    rc = rc ? rc : get_d(tc, "rms_norm_eps", &c->rms_eps, err);
    rc = rc ? rc : get_d(tc, "activation_situ_beta", &c->situ_beta, err);
    rc = rc ? rc : get_d(tc, "activation_situ_linear_beta", &c->situ_linear_beta, err);
    rc = rc ? rc : get_i(tc, "bos_token_id", &c->bos_id, err);
    rc = rc ? rc : get_i(tc, "eos_token_id", &c->eos_id, err);
    rc = rc ? rc : get_i(tc, "pad_token_id", &c->pad_id, err);
    rc = rc ? rc : get_i(tc, "linear_attn_config.num_heads", &c->kda_heads, err);
    rc = rc ? rc : get_i(tc, "linear_attn_config.head_dim", &c->kda_head_dim, err);
    rc = rc ? rc : get_i(tc, "linear_attn_config.short_conv_kernel_size", &c->kda_conv, err);
    rc = rc ? rc : get_d(tc, "linear_attn_config.gate_lower_bound", &c->kda_gate_lower_bound, err);
    return rc;
}

static int check_sizes(const k3_config *c, shoal_err *err)
{
    if (c->hidden <= 0 || c->hidden % 32)
        return bad(err, "hidden_size must be a positive multiple of 32");
    if (c->n_layers <= 0 || c->n_layers > K3_MAX_LAYERS)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "config.json text_config: num_hidden_layers must be 1..%d", K3_MAX_LAYERS);
    if (c->vocab <= 0 || c->vocab > (1 << 24))
        return bad(err, "vocab_size out of range");
    if (c->n_experts <= 0 || c->n_experts > 65536)
        return bad(err, "num_experts out of range");
    if (c->n_experts_per_token <= 0 || c->n_experts_per_token > c->n_experts)
        return bad(err, "num_experts_per_token must be 1..num_experts");
    if (c->moe_intermediate <= 0 || c->moe_intermediate % 32 || c->latent <= 0 || c->latent % 32)
        return bad(err, "moe_intermediate_size and routed_expert_hidden_size must be positive multiples of 32");
    if (c->intermediate <= 0 || c->n_shared_experts < 0)
        return bad(err, "intermediate_size / num_shared_experts out of range");
    if (c->n_heads <= 0 || c->q_lora_rank <= 0 || c->kv_lora_rank <= 0 || c->qk_nope_dim <= 0 ||
        c->qk_rope_dim < 0 || c->v_head_dim <= 0)
        return bad(err, "MLA dimensions must be positive");
    if (c->kda_heads <= 0 || c->kda_head_dim <= 0 || c->kda_conv <= 0 || c->kda_conv > 16)
        return bad(err, "linear_attn_config dimensions out of range");
    if (c->attn_res_block <= 0)
        return bad(err, "attn_res_block_size must be positive");
    if (c->rms_eps <= 0 || c->situ_beta <= 0 || c->situ_linear_beta <= 0)
        return bad(err, "rms_norm_eps and the SiTU betas must be positive");
    if (c->first_k_dense < 0 || c->moe_layer_freq <= 0)
        return bad(err, "first_k_dense_replace / moe_layer_freq out of range");
    if (c->eos_id < 0 || c->eos_id >= c->vocab || c->bos_id < 0 || c->bos_id >= c->vocab)
        return bad(err, "bos/eos token ids must be inside the vocabulary");
    return 0;
}

/* Mark the attention kind of each layer from the 1-based lists; every layer
 * must be named exactly once. */
static int parse_schedule(const shoal_json *tc, k3_config *c, shoal_err *err)
{
    int64_t kda[K3_MAX_LAYERS], full[K3_MAX_LAYERS];
    int seen[K3_MAX_LAYERS] = { 0 };
    size_t nk = 0, nf = 0;
    int rc;

    rc = shoal_json_int_array(tc, "linear_attn_config.kda_layers", kda, K3_MAX_LAYERS, &nk, err);
    if (!rc)
        rc = shoal_json_int_array(tc, "linear_attn_config.full_attn_layers", full, K3_MAX_LAYERS, &nf, err);
    if (rc)
        return shoal_err_wrap(err, rc, "config.json text_config");
    for (size_t i = 0; i < nk + nf; i++) {
        int64_t l = i < nk ? kda[i] : full[i - nk];
        if (l < 1 || l > c->n_layers)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "config.json text_config: layer %lld in %s is outside 1..%lld (the lists are 1-based)",
                                 (long long)l, i < nk ? "kda_layers" : "full_attn_layers",
                                 (long long)c->n_layers);
        if (seen[l - 1]++)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "config.json text_config: layer %lld is listed twice in kda_layers/full_attn_layers",
                                 (long long)l);
        c->layers[l - 1].attn = i < nk ? K3_ATTN_KDA : K3_ATTN_MLA;
    }
    for (int64_t l = 0; l < c->n_layers; l++)
        if (!seen[l])
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "config.json text_config: layer %lld (1-based) is in neither kda_layers nor full_attn_layers",
                                 (long long)l + 1);
    c->n_moe_layers = 0;
    for (int64_t l = 0; l < c->n_layers; l++) {
        c->layers[l].moe = l >= c->first_k_dense && (l - c->first_k_dense) % c->moe_layer_freq == 0;
        c->layers[l].snapshot = l % c->attn_res_block == 0;
        c->n_moe_layers += c->layers[l].moe;
    }
    return 0;
}

static int parse_quant(const shoal_json *tc, k3_config *c, shoal_err *err)
{
    const char *fmt = NULL;
    int64_t bits = 0;
    if (!shoal_json_path(tc, "quantization_config"))
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "config.json text_config: no quantization_config; shoal runs MXFP4 experts (\"mxfp4-pack-quantized\")");
    if (shoal_json_str(tc, "quantization_config.format", &fmt, err) ||
        shoal_json_int(tc, "quantization_config.config_groups.group_0.weights.num_bits", &bits, err) ||
        shoal_json_int(tc, "quantization_config.config_groups.group_0.weights.group_size", &c->quant_group, err))
        return shoal_err_wrap(err, SHOAL_EFORMAT, "config.json text_config");
    if (strcmp(fmt, "mxfp4-pack-quantized") != 0 || bits != 4 || c->quant_group != 32)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "config.json text_config: quantization \"%s\" with %lld bits in groups of %lld; "
                             "shoal runs mxfp4-pack-quantized, 4 bits, groups of 32",
                             fmt, (long long)bits, (long long)c->quant_group);
    return 0;
}

int k3_config_parse(const shoal_json *root, k3_config *cfg, shoal_err *err)
{
    const shoal_json *tc = shoal_json_get(root, "text_config");
    int rc;

    memset(cfg, 0, sizeof *cfg);
    if (!tc)
        tc = root;
    rc = parse_sizes(tc, cfg, err);
    if (!rc)
        rc = check_sizes(cfg, err);
    if (!rc)
        rc = parse_schedule(tc, cfg, err);
    if (!rc)
        rc = parse_quant(tc, cfg, err);
    if (rc)
        return rc;
    cfg->expert_bytes = 3ull * (uint64_t)cfg->moe_intermediate * (uint64_t)cfg->latent * 17u / 32u;
    return 0;
}

int k3_config_load(const char *path, k3_config *cfg, shoal_err *err)
{
    shoal_json *j = shoal_json_load_file(path, 16u << 20, err);
    int rc;
    if (!j)
        return err ? err->code : SHOAL_EFORMAT;
    rc = k3_config_parse(j, cfg, err);
    shoal_json_free(j);
    return rc;
}

void k3_expert_record_sizes(const k3_config *cfg, uint64_t sizes[6])
{
    uint64_t i = (uint64_t)cfg->moe_intermediate, l = (uint64_t)cfg->latent;
    sizes[0] = i * l / 2;     /* w1.weight_packed [I, L/2] */
    sizes[1] = i * l / 32;    /* w1.weight_scale  [I, L/32] */
    sizes[2] = l * i / 2;     /* w2.weight_packed [L, I/2] */
    sizes[3] = l * i / 32;    /* w2.weight_scale  [L, I/32] */
    sizes[4] = i * l / 2;     /* w3.weight_packed */
    sizes[5] = i * l / 32;    /* w3.weight_scale */
}
