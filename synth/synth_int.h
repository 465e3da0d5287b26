/* mkmodel_int.h — internal interface of tools/mkmodel (not for other folders).
 *
 * mkmodel writes a synthetic K3-family model directory (k3.md §6):
 *   preset.c          presets, flags -> mk_config, the KDA/MLA pattern
 *   tensors.c         the tensor list (names, dtypes, shapes, value recipes)
 *                     and its split into shards
 *   weights.c         deterministic values: FNV-1a-64, SplitMix64, BF16
 *   shard.c           streaming safetensors writer, index.json
 *   config_json.c     config.json and tokenizer_config.json
 *   tokenizer_train.c synthetic tiktoken.model (byte-level BPE on corpus.c)
 */
#ifndef SHOAL_MKMODEL_INT_H
#define SHOAL_MKMODEL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define MK_MAX_LAYERS  128
#define MK_MAX_EXPERTS 1024
#define MK_NAME_MAX    128
#define MK_SPECIALS    256        /* reserved ids at the top of the vocabulary */

typedef enum mk_preset { MK_PRESET_TINY, MK_PRESET_SLICE } mk_preset;

/* Every value config.json carries that the layout depends on. */
typedef struct mk_config {
    mk_preset preset;
    uint64_t  seed;
    int hidden;                 /* hidden_size */
    int layers;                 /* num_hidden_layers */
    int dense_inter;            /* intermediate_size (layer 0 MLP) */
    int vocab;                  /* vocab_size; base = vocab - MK_SPECIALS */
    int max_pos;                /* max_position_embeddings */
    int kda_heads, kda_head_dim, conv_kernel;
    int mla_heads, q_lora, kv_lora, qk_nope, qk_rope, v_head;
    int experts, topk, shared_experts;
    int latent;                 /* routed_expert_hidden_size (L) */
    int moe_inter;              /* moe_intermediate_size (I) */
    int attn_res_block;
    int layers_per_shard;       /* 0: one shard per layer */
    unsigned char is_mla[MK_MAX_LAYERS];   /* 0-based */
} mk_config;

/* Fill cfg with a preset's values (seed 0, default pattern). */
void mk_preset_init(mk_config *cfg, mk_preset p);
/* Apply --layers/--experts overrides (<=0: keep), recompute the layer
 * pattern and top-k, and validate.  0 or SHOAL_EINVAL with a message. */
int mk_config_finish(mk_config *cfg, int layers, int experts, shoal_err *err);
/* 1-based MLA layers: every 4th, and the last two (K3's trailing MM),
 * never layer 1 (K3's layer 0 is KDA with the dense MLP). */
void mk_pattern(int layers, unsigned char *is_mla);
/* Bytes of one routed expert: 3·I·L·17/32. */
uint64_t mk_expert_bytes(const mk_config *cfg);

/* How a tensor's values are made (k3.md §6 table). */
typedef enum mk_init {
    MK_INIT_MATRIX,      /* (2u-1)·sqrt(3/in), in = last dimension */
    MK_INIT_NORM,        /* 1 + 0.2(2u-1) */
    MK_INIT_RES_PROJ,    /* 0.5(2u-1) */
    MK_INIT_CONV,        /* 0.5(2u-1) */
    MK_INIT_DT_BIAS,     /* -4 + 4u */
    MK_INIT_A_LOG,       /* ln(1 + 15u) for the first `used` entries, then 0 */
    MK_INIT_SCORE_BIAS,  /* 0.1(2u-1) */
    MK_INIT_PACKED,      /* floor(256u) */
    MK_INIT_SCALE        /* 119 + floor(5u) */
} mk_init;

/* The three dtypes a K3 checkpoint uses.  mkmodel does not link the fetcher:
 * the writer stays independent of the reader that tests check it with. */
typedef enum mk_dtype { MK_F32, MK_BF16, MK_U8 } mk_dtype;
const char *mk_dtype_name(mk_dtype t);    /* "F32", "BF16", "U8" */
unsigned mk_dtype_size(mk_dtype t);       /* bytes per element */

typedef struct mk_tensor {
    char     name[MK_NAME_MAX];   /* full name, "language_model." prefix */
    mk_dtype dtype;
    unsigned ndim;
    uint64_t shape[3];
    mk_init  init;
    uint64_t used;                /* MK_INIT_A_LOG: entries that are not padding */
    int      shard;               /* 0-based */
    uint64_t nbytes;
    uint64_t begin;               /* relative to the shard's data, set by layout */
} mk_tensor;

typedef struct mk_model {
    mk_tensor *t;                 /* all tensors, in file order per shard */
    size_t     count, cap;
    int        shards;
    uint64_t   total_bytes;       /* sum of nbytes (index.json total_size) */
} mk_model;

/* Build the whole tensor list for cfg, assign shards and sort each shard in
 * file order (dtype F32, BF16, U8, then name).  Caller frees with
 * mk_model_free. */
int mk_model_build(const mk_config *cfg, mk_model *m, shoal_err *err);
void mk_model_free(mk_model *m);
/* "model-00001-of-000003.safetensors" for 0-based shard i. */
void mk_shard_name(const mk_model *m, int i, char *out, size_t cap);

/* ---- weights.c ---- */
uint64_t mk_fnv1a64(const char *s);
/* Initial SplitMix64 state of a tensor: FNV-1a-64(name) ^ seed·golden. */
uint64_t mk_seed_state(const char *name, uint64_t seed);
/* Fill out[0..n) with the bytes of elements [first, first+n/elsize) of t,
 * given the generator state positioned at element `first` (advanced). */
void mk_fill(const mk_tensor *t, uint64_t *state, uint64_t first, uint8_t *out,
             uint64_t count);
uint16_t mk_bf16_from_float(float f);

/* ---- shard.c ---- */
typedef struct mk_progress {
    uint64_t done, total;
    int tty;                      /* redraw with \r */
    int verbose;                  /* a line per shard */
} mk_progress;
/* Write every shard into dir (temp name, then rename). */
int mk_shards_write(const mk_config *cfg, const mk_model *m, const char *dir,
                    mk_progress *pr, shoal_err *err);
int mk_index_write(const mk_model *m, const char *dir, shoal_err *err);

/* ---- config_json.c ---- */
int mk_config_write(const mk_config *cfg, const char *dir, shoal_err *err);
int mk_tokenizer_config_write(const mk_config *cfg, const char *dir, shoal_err *err);

/* ---- tokenizer_train.c ---- */
/* Train vocab-256-256 merges on the embedded corpus and write
 * dir/tiktoken.model. */
int mk_tiktoken_write(const mk_config *cfg, const char *dir, shoal_err *err);
/* The embedded training text (corpus.c). */
extern const char mk_corpus[];

#endif
