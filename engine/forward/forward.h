/* model.h — a K3-family model bound from a local snapshot directory: the
 * config, every tensor as a typed view with its shape, and the location of
 * every routed expert's span.
 *
 * Owns: reading config.json and model.safetensors.index.json, mapping the
 * shards (read-only mmap), finding every language tensor by name, checking
 * its dtype and shape against the config (errors name the tensor), and
 * deriving the spine at load: BF16 matrices quantized to int8 with one scale
 * per row (or widened to f32 with ENGINE_SPINE_F32), small tensors widened to
 * f32.  Routed experts stay as mapped, never copied nor re-encoded.  Vision
 * tensors are never looked up.  Does not own running the model (session.h)
 * nor fetching experts (expert_source.h).
 *
 * Shapes use the config's names: D hidden, V vocab, P = KDA heads·head_dim,
 * Hk KDA heads, Dk KDA head dim, K conv taps, H MLA heads, ql q_lora_rank,
 * kl kv_lora_rank, nope/rope/vd head dims, E experts, L latent, I
 * moe_intermediate, Id dense intermediate, S = shared experts · I.
 */
#ifndef SHOAL_ENGINE_MODEL_H
#define SHOAL_ENGINE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/k3_config.h"
#include "engine/kernels/kernels.h"
#include "engine/ops.h"

typedef enum engine_spine { ENGINE_SPINE_INT8 = 0, ENGINE_SPINE_F32 = 1 } engine_spine;

/* Which A_log entry scales a KDA channel (k3.md §3.3 ⚠). */
typedef enum engine_alog_mode {
    ENGINE_ALOG_PER_HEAD = 0,     /* A[h] = exp(A_log[h]), the spec */
    ENGINE_ALOG_PER_CHANNEL = 1   /* A[h][d] = exp(A_log[d]), Deltafin */
} engine_alog_mode;

/* Load-time choices.  engine_model_options_default() gives the spec's. */
typedef struct engine_model_options {
    engine_spine     spine;       /* int8 (default) or f32 */
    engine_alog_mode alog;
    engine_l2_mode   l2;          /* KDA q/k L2 norm form */
    double           mla_eps;     /* q_a / kv_a latent RMSNorm ε (1e-6) */
    kernels_pool    *pool;        /* threads for quantizing at load; may be NULL */
    /* int8 spine only: take every derived matrix from this pack instead of
     * quantizing (engine/spine_pack.h); it must outlive the model.  NULL:
     * derive them. */
    struct spine_pack *pack;
} engine_model_options;

void engine_model_options_default(engine_model_options *o);

/* A spine matrix [rows, cols]: int8 with per-row scales, or f32 (exactly
 * one of q8.q / f32.w is non-NULL).  Views into the model's buffers. */
typedef struct engine_mat {
    size_t rows, cols;
    kernels_q8  q8;
    kernels_f32 f32;
} engine_mat;

/* Rows [r0, r0+n) of m, as a matrix of its own. */
engine_mat engine_mat_rows(const engine_mat *m, size_t r0, size_t n);

typedef struct engine_kda_w {
    engine_mat q, k, v, g;        /* [P, D] */
    engine_mat o;                 /* [D, P] */
    engine_mat fa;                /* [Dk, D]  (f32 in both spines: gate path) */
    engine_mat fb;                /* [P, Dk]  (f32) */
    engine_mat b;                 /* [Hk, D]  (f32) */
    const float *conv[3];         /* q, k, v taps [P][K] */
    float *A;                     /* [P] exp(A_log) per channel, per the alog mode */
    const float *dt_bias;         /* [P] */
    const float *o_norm;          /* [Dk] */
} engine_kda_w;

typedef struct engine_mla_w {
    engine_mat q_a;               /* [ql, D] */
    const float *q_a_norm;        /* [ql] */
    engine_mat q_b;               /* [H·(nope+rope), ql] */
    engine_mat kv_a;              /* [kl+rope, D] */
    const float *kv_a_norm;       /* [kl] */
    engine_mat ukt;               /* [H·kl, nope]: W_UK of head h transposed, rows h·kl.. */
    engine_mat uv;                /* [H·vd, kl]:  W_UV of head h, rows h·vd.. */
    engine_mat g;                 /* [H·vd, D] */
    engine_mat o;                 /* [D, H·vd] */
} engine_mla_w;

typedef struct engine_mlp_w {
    engine_mat gate, up;          /* [Id or S, D] */
    engine_mat down;              /* [D, Id or S] */
} engine_mlp_w;

typedef struct engine_moe_w {
    engine_mat gate;              /* [E, D] router, always f32 */
    const float *bias;            /* [E] e_score_correction_bias */
    engine_mat down;              /* [L, D] routed_expert_down_proj */
    engine_mat up;                /* [D, L] routed_expert_up_proj */
    const float *norm;            /* [L] routed_expert_norm */
    engine_mlp_w shared;          /* fused shared experts, width S */
    const uint8_t **span;         /* [E] each expert's 6 records in the mapping; NULL when bound from views */
} engine_moe_w;

typedef struct engine_layer_w {
    k3_layer_info info;           /* KDA/MLA, dense/MoE, snapshot */
    float *attn_sw;               /* [D] self_attention_res_norm ⊙ _res_proj */
    float *mlp_sw;                /* [D] mlp_res_norm ⊙ mlp_res_proj */
    const float *in_norm;         /* [D] input_layernorm */
    const float *post_norm;       /* [D] post_attention_layernorm */
    engine_kda_w kda;             /* when info.attn == K3_ATTN_KDA */
    engine_mla_w mla;             /* when info.attn == K3_ATTN_MLA */
    engine_mlp_w dense;           /* when !info.moe */
    engine_moe_w moe;             /* when info.moe */
} engine_layer_w;

typedef struct engine_model {
    k3_config cfg;
    engine_model_options opt;
    const uint8_t *embed;         /* [V, D] BF16 as mapped (rows widened on use) */
    int embed_f32;                /* 1 if the table is F32 instead */
    float *out_sw;                /* [D] output_attn_res_norm ⊙ output_attn_res_proj */
    const float *final_norm;      /* [D] model.norm */
    engine_mat lm_head;           /* [V, D] */
    engine_layer_w *layers;       /* [n_layers] */
    uint64_t spine_bytes;         /* bytes of derived weights held in RAM */
    struct engine_model_priv *priv;
} engine_model;

/* Bind the model in directory `dir` (config.json, the index and its shards,
 * or a single model.safetensors).  *out is a new model (engine_model_free);
 * on failure NULL and err names the file, key or tensor at fault. */
int engine_model_open(const char *dir, const engine_model_options *opt,
                      engine_model **out, shoal_err *err);
void engine_model_free(engine_model *m);

/* One tensor handed in already in memory (a spine object mapped from
 * shoald's cache).  name without the "language_model." prefix; dtype the
 * safetensors name ("BF16"); data stays valid until `release` runs. */
typedef struct engine_tensor_view {
    const char *name;
    const char *dtype;
    unsigned ndim;
    uint64_t shape[8];
    const uint8_t *data;
    uint64_t length;
} engine_tensor_view;

/* Bind a model from config.json's bytes and the non-expert tensors as
 * views (copied: names and shapes; the data are borrowed).  Routed experts
 * are not looked up: layers[i].moe.span[] are all NULL and the experts must
 * come from an expert source.  `release(release_ctx)` runs exactly once,
 * from engine_model_free or on failure here, to free what the views point
 * into.  label names the model in errors and logs. */
int engine_model_open_views(const char *label, const uint8_t *config, size_t config_len,
                            const engine_tensor_view *views, size_t n,
                            void (*release)(void *), void *release_ctx,
                            const engine_model_options *opt, engine_model **out, shoal_err *err);

/* A derived spine matrix and the tensor it came from (name without the
 * "language_model." prefix for a model bound from views). */
typedef struct engine_spine_mat {
    const char *name;
    engine_mat  mat;
} engine_spine_mat;

/* The spine matrices in load order, as a pack stores them; *out borrowed
 * until engine_model_free.  Returns their number. */
size_t engine_model_spine_mats(const engine_model *m, const engine_spine_mat **out);

/* Embedding row of `token` as f32 into out[D].  token < V (unchecked). */
void engine_model_embed(const engine_model *m, int32_t token, float *out);

/* y [n][rows] = m · x [n][cols], on the model's spine numerics: int8
 * matrices quantize x per 32 into act (room for n·cols), f32 ones use it
 * as is.  0 or a negative code. */
int engine_mat_mul(kernels_pool *pool, const engine_mat *m, const float *x, size_t n,
                   float *y, kernels_act *act, shoal_err *err);

#endif
