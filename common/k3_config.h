/* k3_config.h — the K3-family model configuration (config.json's
 * text_config) as one validated struct, and the layer schedule derived
 * from it.
 *
 * Owns: reading every key specs/k3.md §1 lists, checking the values fit
 * together (dimensions, lists, quantization), and the derived facts the
 * fetcher, the engine and the CLI all need: which layers are KDA or MLA,
 * dense or MoE, where AttnRes snapshots fall, and the size of one routed
 * expert's span.  Lives in common/ because all three use it and the engine
 * never links the fetcher.
 */
#ifndef SHOAL_K3_CONFIG_H
#define SHOAL_K3_CONFIG_H

#include <stdint.h>

#include "common/err.h"
#include "common/json.h"

#define K3_MAX_LAYERS 256

typedef enum k3_attn_kind { K3_ATTN_KDA = 0, K3_ATTN_MLA = 1 } k3_attn_kind;

typedef struct k3_layer_info {
    k3_attn_kind attn;      /* from the 1-based kda_layers / full_attn_layers */
    int          moe;       /* 1: LatentMoE, 0: dense SiTU MLP */
    int          snapshot;  /* 1: AttnRes appends an anchor here (i % block == 0) */
} k3_layer_info;

typedef struct k3_config {
    /* sizes */
    int64_t hidden;                 /* hidden_size (K3 7168) */
    int64_t vocab;                  /* vocab_size (K3 163840) */
    int64_t n_layers;               /* num_hidden_layers (K3 93) */
    int64_t intermediate;           /* intermediate_size, dense MLP (K3 33792) */
    int64_t max_positions;          /* max_position_embeddings */
    /* MoE */
    int64_t n_experts;              /* num_experts (K3 896) */
    int64_t n_experts_per_token;    /* num_experts_per_token (K3 16) */
    int64_t n_shared_experts;       /* num_shared_experts (K3 2) */
    int64_t moe_intermediate;       /* moe_intermediate_size, I (K3 3072) */
    int64_t latent;                 /* routed_expert_hidden_size, L (K3 3584) */
    int64_t first_k_dense;          /* first_k_dense_replace (K3 1) */
    int64_t moe_layer_freq;         /* moe_layer_freq (K3 1) */
    int     renormalize;            /* moe_renormalize */
    int     latent_norm;            /* latent_moe_use_norm */
    double  routed_scaling;         /* routed_scaling_factor */
    /* attention */
    int64_t n_heads;                /* num_attention_heads (MLA) */
    int64_t q_lora_rank, kv_lora_rank;
    int64_t qk_nope_dim, qk_rope_dim, v_head_dim;
    int64_t kda_heads, kda_head_dim; /* linear_attn_config num_heads, head_dim */
    int64_t kda_conv;               /* short_conv_kernel_size (4) */
    double  kda_gate_lower_bound;   /* gate_lower_bound (-5.0) */
    int64_t attn_res_block;         /* attn_res_block_size (K3 12) */
    /* numerics */
    double  rms_eps;                /* rms_norm_eps */
    double  situ_beta, situ_linear_beta;  /* activation_situ_beta / _linear_beta */
    /* tokens */
    int64_t bos_id, eos_id, pad_id;
    /* quantization: group size of the MXFP4 experts (32) */
    int64_t quant_group;
    /* derived */
    k3_layer_info layers[K3_MAX_LAYERS];
    int64_t n_moe_layers;
    uint64_t expert_bytes;          /* one routed expert's span: 3·I·L·17/32 */
} k3_config;

/* Fill `cfg` from a parsed config.json (the root object; text_config is
 * read from inside it, or from the root itself when it has no
 * text_config).  Checks every key and the consistency of the values;
 * 0, or SHOAL_EFORMAT / SHOAL_ENOTFOUND / SHOAL_EUNSUPPORTED with a message
 * naming the key. */
int k3_config_parse(const shoal_json *root, k3_config *cfg, shoal_err *err);

/* Same, from a file path. */
int k3_config_load(const char *path, k3_config *cfg, shoal_err *err);

/* Byte sizes of the six records of one routed expert, in checkpoint order
 * (w1.packed, w1.scale, w2.packed, w2.scale, w3.packed, w3.scale). */
void k3_expert_record_sizes(const k3_config *cfg, uint64_t sizes[6]);

#endif
