/* preset.c — the model presets, flag overrides and the layer pattern.
 *
 * Owns: every config value of tiny-k3 (k3.md §6), k3-slice (real K3 expert
 * and head dimensions, few layers, heads and experts), k3 (k3.md §1 at
 * full size) and the oracle (tiny's values: only its weights differ,
 * oracle.c).  Does not own writing them (config_json.c) nor the tensor
 * list derived from them (tensors.c).
 */
#include "synth/synth_int.h"

#include <string.h>

static const char *const preset_names[] = { "tiny", "slice", "k3", "oracle" };
#define N_PRESETS ((int)(sizeof preset_names / sizeof preset_names[0]))

int synth_preset_parse(const char *name, synth_preset *out)
{
    for (int i = 0; i < N_PRESETS; i++)
        if (strcmp(name, preset_names[i]) == 0) {
            *out = (synth_preset)i;
            return 0;
        }
    return SHOAL_EINVAL;
}

const char *synth_preset_name(synth_preset p)
{
    return (unsigned)p < (unsigned)N_PRESETS ? preset_names[p] : "?";
}

void synth_pattern(int layers, unsigned char *is_mla)
{
    for (int i = 1; i <= layers; i++)
        is_mla[i - 1] = i != 1 && (i % 4 == 0 || i >= layers - 1);
}

/* K3's attention and expert dimensions (k3.md §1); the slice keeps them
 * with two heads of each kind. */
static void k3_dims(synth_config *cfg)
{
    cfg->hidden = 7168;
    cfg->max_pos = 1048576;
    cfg->kda_head_dim = 128;
    cfg->q_lora = 1536;
    cfg->kv_lora = 512;
    cfg->qk_nope = 128;
    cfg->qk_rope = 64;
    cfg->v_head = 128;
    cfg->latent = 3584;
    cfg->moe_inter = 3072;
    cfg->attn_res_block = 12;
    cfg->topk = 16;
    cfg->layers_per_shard = 0;
}

void synth_config_init(synth_config *cfg, synth_preset p)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->preset = p;
    cfg->vocab = 1024;
    cfg->conv_kernel = 4;
    if (p == SYNTH_PRESET_TINY || p == SYNTH_PRESET_ORACLE) {
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
    } else if (p == SYNTH_PRESET_SLICE) {
        /* Two heads of each kind, one shared expert and a 1024-token
         * vocabulary keep the spine small. */
        k3_dims(cfg);
        cfg->layers = 4;
        cfg->dense_inter = 2048;
        cfg->kda_heads = 2;
        cfg->mla_heads = 2;
        cfg->experts = 32;
        cfg->shared_experts = 1;
    } else {
        k3_dims(cfg);
        cfg->layers = 93;
        cfg->dense_inter = 33792;
        cfg->vocab = 163840;
        cfg->kda_heads = 96;
        cfg->mla_heads = 96;
        cfg->experts = 896;
        cfg->shared_experts = 2;
        cfg->vision = 1;
        /* 1.45 TB of expert bytes: one draw per 8 bytes makes them 8x
         * cheaper to generate (and to hash for the etags). */
        cfg->packed8 = 1;
    }
    synth_pattern(cfg->layers, cfg->is_mla);
}

int synth_config_finish(synth_config *cfg, int layers, int experts, shoal_err *err)
{
    int small = cfg->preset == SYNTH_PRESET_TINY || cfg->preset == SYNTH_PRESET_ORACLE;
    int cap = small ? 4 : 16;

    /* The oracle's construction (oracle.c) is laid out for tiny's 8 layers
     * (snapshots at 0, 3, 6) and 64 experts a layer. */
    if (cfg->preset == SYNTH_PRESET_ORACLE &&
        ((layers > 0 && layers != cfg->layers) || (experts > 0 && experts != cfg->experts)))
        return shoal_err_set(err, SHOAL_EINVAL, "the oracle preset has %d layers and %d experts; "
                             "drop --layers/--experts", cfg->layers, cfg->experts);
    if (layers > 0)
        cfg->layers = layers;
    if (experts > 0)
        cfg->experts = experts;
    if (cfg->layers < 1 || cfg->layers > SYNTH_MAX_LAYERS)
        return shoal_err_set(err, SHOAL_EINVAL, "layers must be 1..%d", SYNTH_MAX_LAYERS);
    if (cfg->experts < 1 || cfg->experts > SYNTH_MAX_EXPERTS)
        return shoal_err_set(err, SHOAL_EINVAL, "experts must be 1..%d", SYNTH_MAX_EXPERTS);
    if (cfg->seed > (uint64_t)INT64_MAX)
        return shoal_err_set(err, SHOAL_EINVAL, "seed must be 0..2^63-1");
    cfg->topk = cfg->experts < cap ? cfg->experts : cap;
    synth_pattern(cfg->layers, cfg->is_mla);
    return 0;
}

uint64_t synth_expert_bytes(const synth_config *cfg)
{
    return 3ULL * (uint64_t)cfg->moe_inter * (uint64_t)cfg->latent * 17 / 32;
}
