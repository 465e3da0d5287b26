/* preset.c — the two model presets, flag overrides and the layer pattern.
 *
 * Owns: every config value of tiny-k3 (k3.md §6) and k3-slice (real K3
 * expert dimensions, few layers and experts).  Does not own writing them
 * (config_json.c) nor the tensor list derived from them (tensors.c).
 */
#include "tools/mkmodel/mkmodel_int.h"

#include <string.h>

void mk_pattern(int layers, unsigned char *is_mla)
{
    for (int i = 1; i <= layers; i++)
        is_mla[i - 1] = i != 1 && (i % 4 == 0 || i >= layers - 1);
}

void mk_preset_init(mk_config *cfg, mk_preset p)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->preset = p;
    cfg->vocab = 1024;
    cfg->conv_kernel = 4;
    if (p == MK_PRESET_TINY) {
        cfg->hidden = 256;
        cfg->layers = 8;
        cfg->dense_inter = 512;
        cfg->max_pos = 4096;
        cfg->kda_heads = 4;
        cfg->kda_head_dim = 32;
        cfg->mla_heads = 4;
        cfg->q_lora = 64;
        cfg->kv_lora = 32;
        cfg->qk_nope = 16;
        cfg->qk_rope = 8;
        cfg->v_head = 16;
        cfg->experts = 64;
        cfg->topk = 4;
        cfg->shared_experts = 2;
        cfg->latent = 128;
        cfg->moe_inter = 64;
        cfg->attn_res_block = 3;
        cfg->layers_per_shard = 4;
    } else {
        /* K3's expert and attention head dimensions; two heads of each
         * kind, one shared expert and a 1024-token vocabulary keep the
         * spine small. */
        cfg->hidden = 7168;
        cfg->layers = 4;
        cfg->dense_inter = 2048;
        cfg->max_pos = 1048576;
        cfg->kda_heads = 2;
        cfg->kda_head_dim = 128;
        cfg->mla_heads = 2;
        cfg->q_lora = 1536;
        cfg->kv_lora = 512;
        cfg->qk_nope = 128;
        cfg->qk_rope = 64;
        cfg->v_head = 128;
        cfg->experts = 32;
        cfg->topk = 16;
        cfg->shared_experts = 1;
        cfg->latent = 3584;
        cfg->moe_inter = 3072;
        cfg->attn_res_block = 12;
        cfg->layers_per_shard = 0;
    }
    mk_pattern(cfg->layers, cfg->is_mla);
}

int mk_config_finish(mk_config *cfg, int layers, int experts, shoal_err *err)
{
    if (layers > 0)
        cfg->layers = layers;
    if (experts > 0)
        cfg->experts = experts;
    if (cfg->layers < 1 || cfg->layers > MK_MAX_LAYERS)
        return shoal_err_set(err, SHOAL_EINVAL, "--layers must be 1..%d", MK_MAX_LAYERS);
    if (cfg->experts < 1 || cfg->experts > MK_MAX_EXPERTS)
        return shoal_err_set(err, SHOAL_EINVAL, "--experts must be 1..%d", MK_MAX_EXPERTS);
    if (cfg->preset == MK_PRESET_TINY)
        cfg->topk = cfg->experts < 4 ? cfg->experts : 4;
    else
        cfg->topk = cfg->experts < 16 ? cfg->experts : 16;
    mk_pattern(cfg->layers, cfg->is_mla);
    return 0;
}

uint64_t mk_expert_bytes(const mk_config *cfg)
{
    return 3ULL * (uint64_t)cfg->moe_inter * (uint64_t)cfg->latent * 17 / 32;
}
