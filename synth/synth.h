/* synth.h — synthetic Kimi-K3-family models: layout, files, and their bytes.
 *
 * One synthesis, two users: tools/mkmodel writes a model to disk, and
 * tools/hubmock serves the same model from no disk, as a Hub repo.  A model
 * is a list of files (config.json, tokenizer_config.json, tiktoken.model,
 * model.safetensors.index.json and the model-NNNNN-of-NNNNNN.safetensors
 * shards); synth_read() answers any byte range of any file without history:
 * header bytes come from the rendered header, tensor bytes from a
 * random-access generator (SplitMix64 output i needs only the start state
 * and i).  The rule: the bytes are exactly what `mkmodel` writes for the
 * same preset and flags, whatever ranges they are read in.
 *
 * A model is read-only once built, so any number of threads may call
 * synth_read() and the digest functions on it at once.
 *
 * Presets (docs/mkmodel.md has the tables): tiny (k3.md §6), slice (K3's
 * expert sizes, 4 layers x 32 experts), k3 (the full checkpoint of
 * k3.md §1/§2: 96 shards, 497,220 tensors, ~1.56 TB) and oracle (tiny's
 * files with constructed weights: its greedy continuation of
 * SYNTH_ORACLE_PROMPT is SYNTH_ORACLE_TEXT, docs/mkmodel.md "The oracle").
 * Layers and experts can be reduced (or, for tiny and slice, raised); the
 * oracle keeps tiny's 8 layers and 64 experts.
 */
#ifndef SHOAL_SYNTH_H
#define SHOAL_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Changes whenever any byte of any preset's files changes: it keys the etag
 * caches (hubmock's file and the committed K3 table). */
#define SYNTH_GEN_VERSION 1

#define SYNTH_MAX_LAYERS  128
#define SYNTH_MAX_EXPERTS 1024
#define SYNTH_SPECIALS    256      /* reserved ids at the top of the vocabulary */

typedef enum synth_preset {
    SYNTH_PRESET_TINY, SYNTH_PRESET_SLICE, SYNTH_PRESET_K3, SYNTH_PRESET_ORACLE
} synth_preset;

/* The oracle preset's raw prompt (no BOS) and the text its greedy decoding
 * continues it with, up to eos (<|end_of_msg|>, id 770).  config.json of
 * the preset carries both ("oracle": {"prompt", "text", "prompt_ids",
 * "ids"}), so a checker needs no copy of them. */
#define SYNTH_ORACLE_PROMPT "The oracle says:"
#define SYNTH_ORACLE_TEXT   " Each token was routed to its expert, and this came out right."
/* The ids of both with the synthetic tokenizer (checked against the
 * engine's tokenizer in tests/integration/test_oracle.sh). */
#define SYNTH_ORACLE_PROMPT_TOKENS 9
#define SYNTH_ORACLE_TEXT_TOKENS   22
extern const uint16_t synth_oracle_prompt_ids[SYNTH_ORACLE_PROMPT_TOKENS];
extern const uint16_t synth_oracle_text_ids[SYNTH_ORACLE_TEXT_TOKENS];

/* Every value the layout and the files depend on. */
typedef struct synth_config {
    synth_preset preset;
    uint64_t seed;              /* 0..2^63-1; 0 = the k3.md §6 values */
    int hidden;                 /* hidden_size */
    int layers;                 /* num_hidden_layers */
    int dense_inter;            /* intermediate_size (layer 0 MLP) */
    int vocab;                  /* vocab_size; base ranks = vocab - SYNTH_SPECIALS */
    int max_pos;                /* max_position_embeddings */
    int kda_heads, kda_head_dim, conv_kernel;
    int mla_heads, q_lora, kv_lora, qk_nope, qk_rope, v_head;
    int experts, topk, shared_experts;
    int latent;                 /* routed_expert_hidden_size (L) */
    int moe_inter;              /* moe_intermediate_size (I) */
    int attn_res_block;
    int layers_per_shard;       /* 0: one shard per layer */
    int vision;                 /* 1: K3's 168 vision tensors in two shards;
                                   0: one vision_tower.dummy with the globals */
    int packed8;                /* 1: expert bytes take 8 bytes per draw */
    unsigned char is_mla[SYNTH_MAX_LAYERS];   /* 0-based */
} synth_config;

/* "tiny", "slice", "k3", "oracle" -> preset; 0 or SHOAL_EINVAL. */
int synth_preset_parse(const char *name, synth_preset *out);
const char *synth_preset_name(synth_preset p);
/* Fill cfg with a preset's values (seed 0, default pattern).  Cannot fail. */
void synth_config_init(synth_config *cfg, synth_preset p);
/* Apply --layers / --experts overrides (<= 0: keep), recompute the layer
 * pattern and top-k, validate.  0 or SHOAL_EINVAL with a message (the
 * oracle refuses any count but its own). */
int synth_config_finish(synth_config *cfg, int layers, int experts, shoal_err *err);
/* 1-based MLA layers: every 4th and the last two, never layer 1; this gives
 * K3's own lists for 93 layers and k3.md §6's [4,7,8] for 8. */
void synth_pattern(int layers, unsigned char *is_mla);
/* Bytes of one routed expert: 3·I·L·17/32. */
uint64_t synth_expert_bytes(const synth_config *cfg);

/* ---- models ------------------------------------------------------------ */

typedef struct synth_model synth_model;

/* Build the tensor list, the shard headers, the index and the small files
 * of cfg (copied).  Memory: about 70 bytes per tensor plus the rendered
 * headers and index (~200 MB for the full K3, under 1 MB for tiny).
 * Caller frees with synth_model_free. */
int synth_model_new(const synth_config *cfg, synth_model **out, shoal_err *err);
void synth_model_free(synth_model *m);
/* Borrowed, lives as long as m. */
const synth_config *synth_model_config(const synth_model *m);
/* "gen=1 preset=k3 layers=93 experts=896 seed=0": every input of the bytes.
 * Borrowed, lives as long as m. */
const char *synth_model_key(const synth_model *m);
/* "gen=1 preset=k3 seed=0": the key without the layer and expert counts.
 * Two shards of one family with the same header hold the same bytes (a
 * tensor's bytes follow from its name, dtype, shape, the preset's recipes
 * and the seed), whatever model they belong to. */
const char *synth_model_family(const synth_model *m);
size_t synth_model_tensors(const synth_model *m);
int synth_model_shards(const synth_model *m);
uint64_t synth_model_tensor_bytes(const synth_model *m);   /* index total_size */

/* Files, in the order mkmodel writes them: config.json,
 * tokenizer_config.json, tiktoken.model, the shards, and
 * model.safetensors.index.json last. */
size_t synth_file_count(const synth_model *m);
/* Borrowed names, living as long as m. */
const char *synth_file_name(const synth_model *m, size_t i);
uint64_t synth_file_size(const synth_model *m, size_t i);
/* 1 for a safetensors shard, 0 otherwise. */
int synth_file_is_shard(const synth_model *m, size_t i);
/* Bytes before a shard's tensor data (8 + header length); a whole small
 * file's size otherwise. */
uint64_t synth_file_header_size(const synth_model *m, size_t i);
/* Index of the file called name, or -1. */
long synth_file_find(const synth_model *m, const char *name);

/* Copy bytes [off, off+len) of file i into buf.  0, or SHOAL_ERANGE (the
 * range passes the end of the file; nothing is promised about buf) or
 * SHOAL_EINVAL (no such file). */
int synth_read(const synth_model *m, size_t file, uint64_t off, size_t len, void *buf);

/* ---- digests ------------------------------------------------------------ */

typedef struct synth_digest {
    char sha256[65];            /* of the content: the LFS oid, X-Linked-Etag */
    char sha1[41];              /* git blob sha1 of the content ("" unless asked) */
} synth_digest;

/* Hash the first len bytes of file i (len <= its size; a shorter len
 * hashes a prefix, as a deliberately cut file would be served). */
int synth_digest_file(const synth_model *m, size_t file, uint64_t len, int want_sha1,
                      synth_digest *out, shoal_err *err);

/* One file to hash; `rc` and `out` are filled by synth_digest_run. */
typedef struct synth_digest_job {
    const synth_model *m;
    size_t   file;
    uint64_t len;
    int      want_sha1;
    synth_digest out;
    int      rc;
} synth_digest_job;

/* Called from the calling thread about once a second while jobs run. */
typedef void (*synth_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* Hash every job with `threads` worker threads (>= 1), biggest files first.
 * Returns 0 when every job succeeded, else the first failure (with err). */
int synth_digest_run(synth_digest_job *jobs, size_t n, int threads, synth_progress_fn progress,
                     void *ctx, shoal_err *err);

/* A cheap fingerprint of file i: sha256 of its first MiB, the MiB at the
 * middle (offset size/2 rounded down to 4 KiB) and its last MiB (the whole
 * file when it is under 3 MiB).  The committed table carries one per file so
 * a test can see that the generator still makes the bytes the table hashed,
 * without hashing 1.56 TB. */
int synth_probe(const synth_model *m, size_t file, char out[65], shoal_err *err);
/* sha256 of a shard's first synth_file_header_size() bytes ("" otherwise). */
int synth_header_sha256(const synth_model *m, size_t file, char out[65], shoal_err *err);

/* ---- the committed table (synth/k3_etags.inc) --------------------------- */

typedef struct synth_known {
    const char *file;
    uint64_t    size;
    const char *sha256;
    const char *sha1;           /* "" for shards */
    const char *probe;
    const char *header;         /* synth_header_sha256 of a shard, "" otherwise */
} synth_known;

/* The committed digests of the model whose key is synth_known_key(), or
 * NULL with *n = 0. */
const synth_known *synth_known_table(size_t *n);
const char *synth_known_key(void);
const char *synth_known_family(void);
/* 1 and *out filled if the table knows file i of m at length len, else 0:
 * either the model key, the name and the size all match, or file i is a
 * whole shard of the table's family whose size and header equal a row's
 * (so a reduced k3 — `k3,layers=8` — finds its layer 0, globals, vision and
 * every layer laid out as in K3 without hashing them). */
int synth_known_digest(const synth_model *m, size_t file, uint64_t len, synth_digest *out);

#endif
