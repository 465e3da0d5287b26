/* synth_int.h — internal interface of synth/ (not for other folders).
 *
 *   preset.c          presets, flags -> synth_config, the KDA/MLA pattern
 *   tensors.c         the tensor list (names, dtypes, shapes, value recipes),
 *                     its split into shards and the order inside a shard
 *   vision.c          K3's 168 vision tensors (k3 preset)
 *   weights.c         deterministic values: FNV-1a-64, SplitMix64, BF16
 *   oracle.c          the oracle preset's constructed weights
 *   render.c          shard headers and model.safetensors.index.json
 *   config_json.c     config.json and tokenizer_config.json
 *   tokenizer_train.c tiktoken.model (byte-level BPE on corpus.c)
 *   model.c           the file table and synth_read()
 *   digest.c          sha256 / git sha1 of files, probes, worker threads,
 *                     the committed K3 table (k3_etags.inc)
 */
#ifndef SHOAL_SYNTH_INT_H
#define SHOAL_SYNTH_INT_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "synth/synth.h"

#define SYNTH_GOLDEN 0x9E3779B97F4A7C15ULL

/* How a tensor's values are made (k3.md §6 table, plus the vision biases). */
typedef enum synth_init {
    SYNTH_INIT_MATRIX,      /* (2u-1)·sqrt(3/in), in = last dimension */
    SYNTH_INIT_NORM,        /* 1 + 0.2(2u-1) */
    SYNTH_INIT_RES_PROJ,    /* 0.5(2u-1) */
    SYNTH_INIT_CONV,        /* 0.5(2u-1) */
    SYNTH_INIT_DT_BIAS,     /* -4 + 4u */
    SYNTH_INIT_A_LOG,       /* ln(1 + 15u) for the first `used` entries, then 0 */
    SYNTH_INIT_SCORE_BIAS,  /* 0.1(2u-1) */
    SYNTH_INIT_BIAS,        /* 0.02(2u-1): vision biases */
    SYNTH_INIT_PACKED,      /* floor(256u) */
    SYNTH_INIT_SCALE,       /* 119 + floor(5u) */
    SYNTH_INIT_PACKED8,     /* byte k of draw i/8: the k3 preset's packed codes */
    SYNTH_INIT_SCALE8,      /* 119 + (5·(byte k of draw i/8) >> 8) */
    SYNTH_INIT_ORACLE       /* constructed: oracle.c, by role, layer and expert */
} synth_init;

/* The three dtypes a K3 checkpoint uses.  synth does not link the fetcher:
 * the writer stays independent of the reader tests check it with. */
typedef enum synth_dtype { SYNTH_F32, SYNTH_BF16, SYNTH_U8 } synth_dtype;
const char *synth_dtype_name(synth_dtype t);    /* "F32", "BF16", "U8" */
unsigned synth_dtype_size(synth_dtype t);       /* bytes per element */

#define SYNTH_MAX_DIMS 4

typedef struct synth_tensor {
    uint64_t begin;               /* relative to the shard's data, set by layout */
    uint64_t nbytes;
    uint64_t state0;              /* FNV-1a-64(name) ^ seed·golden */
    uint64_t shape[SYNTH_MAX_DIMS];
    uint32_t name;                /* offset of the NUL-terminated name in names */
    uint16_t used;                /* SYNTH_INIT_A_LOG: entries that are not padding */
    uint16_t shard;               /* 0-based */
    uint16_t expert;              /* SYNTH_INIT_ORACLE: the routed expert */
    uint8_t  dtype;               /* synth_dtype */
    uint8_t  ndim;
    uint8_t  init;                /* synth_init */
    uint8_t  role;                /* SYNTH_INIT_ORACLE: what the tensor is (oracle.c) */
    uint8_t  layer;               /* SYNTH_INIT_ORACLE: its layer */
} synth_tensor;

typedef struct synth_tensors {
    synth_tensor *t;              /* all tensors, in file order per shard */
    size_t        count, cap;
    shoal_buf     names;          /* NUL-terminated full names */
    int           shards;
    uint64_t      total_bytes;    /* sum of nbytes (index total_size) */
} synth_tensors;

static inline const char *synth_tensor_name(const synth_tensors *ts, const synth_tensor *t)
{
    return (const char *)ts->names.data + t->name;
}

/* ---- tensors.c ---- */
/* Build the tensor list for cfg, assign shards, sort each shard in file
 * order (dtype F32, BF16, U8, then name) and lay out the offsets. */
int synth_tensors_build(const synth_config *cfg, synth_tensors *ts, shoal_err *err);
void synth_tensors_free(synth_tensors *ts);
/* "model-00001-of-000003.safetensors" for 0-based shard i of n. */
void synth_shard_name(int i, int n, char *out, size_t cap);

/* Appending one tensor (tensors.c, used by vision.c). */
typedef struct synth_builder {
    synth_tensors *ts;
    uint64_t       seed;
    int            shard;
    int            rc;
    shoal_err     *err;
} synth_builder;
void synth_add(synth_builder *b, synth_init init, synth_dtype dt, unsigned ndim,
               const uint64_t *shape, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* ---- vision.c ---- */
/* K3's vision tower and projector (168 tensors) into shards first, first+1. */
void synth_vision_add(synth_builder *b, const synth_config *cfg, int first);
#define SYNTH_VISION_SHARDS 2

/* ---- weights.c ---- */
uint64_t synth_fnv1a64(const char *s);
/* Initial SplitMix64 state of a tensor: FNV-1a-64(name) ^ seed·golden. */
uint64_t synth_seed_state(const char *name, uint64_t seed);
/* Write the bytes of elements [first, first+count) of t into out. */
void synth_fill(const synth_tensor *t, uint64_t first, uint64_t count, uint8_t *out);
uint16_t synth_bf16_from_float(float f);
/* Draw i of t's generator (SplitMix64 output i from state0), and the same
 * as u in [0, 1): what the random recipes are made of. */
uint64_t synth_draw(const synth_tensor *t, uint64_t i);
double synth_unit(const synth_tensor *t, uint64_t i);

/* ---- oracle.c ---- */
/* Give the oracle's constructed tensors their role (by name); the others
 * keep tiny's recipes.  Called by synth_tensors_build for the preset. */
void synth_oracle_tag(const synth_config *cfg, synth_tensors *ts);
/* SYNTH_INIT_ORACLE elements [first, first+count) of t into out. */
void synth_oracle_fill(const synth_tensor *t, uint64_t first, uint64_t count, uint8_t *out);

/* ---- render.c ---- */
/* The 8-byte length and the JSON header of tensors [lo, hi) into out. */
int synth_header_render(const synth_tensors *ts, size_t lo, size_t hi, shoal_buf *out);
int synth_index_render(const synth_tensors *ts, shoal_buf *out);

/* ---- config_json.c ---- */
int synth_config_render(const synth_config *cfg, shoal_buf *out, shoal_err *err);
int synth_tokenizer_config_render(const synth_config *cfg, shoal_buf *out, shoal_err *err);

/* ---- tokenizer_train.c ---- */
/* tiktoken.model: 256 bytes, min(512, base-256) trained merges, then inert
 * 3-byte padding ranks up to base = vocab - SYNTH_SPECIALS. */
int synth_tiktoken_render(const synth_config *cfg, shoal_buf *out, shoal_err *err);
/* The embedded training text (corpus.c). */
extern const char synth_corpus[];

#endif
