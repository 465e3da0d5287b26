/* forward.h — the engine's forward pass: a K3 model bound in memory and one
 * sequence run through it, on CPU.  It takes its routed experts through the
 * expert-source interface (part 4) and knows neither shoald nor HTTP; it
 * uses engine/kernels/ and common/ only (never common/client.h).
 *
 * Five parts, each with its own contract below, in the order they build on
 * each other:
 *   1. ops          the small per-token steps (ops.c)
 *   2. the model    config, weights with their shapes, binding (model.c)
 *   3. spine pack   the derived spine serialized (spine_pack.c)
 *   4. experts      the expert-source interface and the local source
 *                   (expert_source.c)
 *   5. sessions     one sequence's state and the pass itself (forward.c,
 *                   with the router lookahead in lookahead.c)
 * forward.c reads top to bottom as one token flows through the stack.
 */
#ifndef SHOAL_ENGINE_FORWARD_H
#define SHOAL_ENGINE_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/k3_config.h"
#include "common/k3_sizes.h"
#include "engine/kernels/kernels.h"

/* ---- 1. ops ---------------------------------------------------------------
 *
 * the small per-token operations of the K3 forward pass
 * (specs/k3.md §3) that are not matrix products: RMSNorm, the AttnRes mix,
 * the router's top-k, the KDA L2 norm and one delta-rule step.
 *
 * Owns: the arithmetic of these steps and its summation order.  Does not own
 * weights, state lifetimes nor threading (forward.c calls these per token and
 * per head).  Public so unit tests can check each step against
 * a hand computation.
 *
 * Numerics: inputs and outputs are f32; reductions over a vector (sums of
 * squares, dot products, softmax) are accumulated in double, which costs
 * nothing at these sizes and keeps the f32 path within 1e-5 of the float64
 * reference.
 */

/* Logistic sigmoid, 1 / (1 + e^-x), without overflow for large |x|. */
float engine_sigmoid(float x);

/* out = w ⊙ x / sqrt(mean(x²) + eps) over n values.  out may alias x. */
void engine_rmsnorm(const float *x, const float *w, size_t n, double eps, float *out);

/* AttnRes Mix (k3.md §3.2): V = anchors[0..n_anchors) ++ [prefix];
 * score_i = Σ_d V_i[d]·sw[d] / sqrt(mean(V_i²) + eps) with sw = w_norm ⊙
 * w_proj precomputed; out = Σ_i softmax(score)_i · V_i (raw vectors).
 * out may alias prefix but no anchor.  n_anchors may be 0 (out = prefix). */
void engine_attnres_mix(const float *prefix, const float *const *anchors, size_t n_anchors,
                        const float *sw, size_t dim, double eps, float *out);

/* Router selection (k3.md §3.5 steps 2-3): the k largest of scores+bias,
 * ties to the lowest index, written to ids[0..k) best first (routing order);
 * weights[i] = scores[ids[i]] / (Σ selected scores + 1e-20) · scaling when
 * renormalize, else scores[ids[i]] · scaling.  k <= n.  bias may be NULL. */
void engine_route_topk(const float *scores, const float *bias, size_t n, size_t k,
                       int renormalize, double scaling, int32_t *ids, float *weights);

/* L2-normalize x[0..n) in place.  ENGINE_L2_FLA: x / sqrt(Σx² + 1e-6) (the
 * spec's choice); ENGINE_L2_MAX: x / max(‖x‖, 1e-12) (Deltafin's form). */
typedef enum engine_l2_mode { ENGINE_L2_FLA = 0, ENGINE_L2_MAX = 1 } engine_l2_mode;
void engine_l2norm(float *x, size_t n, engine_l2_mode mode);

/* One KDA delta-rule step for one head (k3.md §3.3 step 6).  S is [dk][dv]
 * (S[k][v], row k = key dimension), alpha [dk] the per-key decay, beta the
 * write strength:
 *   S <- diag(alpha) S;  u = v - Sᵀk;  S <- S + beta·k uᵀ;  o = Sᵀq.
 * o [dv]; tmp is scratch of dv floats. */
void engine_kda_step(float *S, const float *q, const float *k, const float *v,
                     const float *alpha, float beta, size_t dk, size_t dv,
                     float *o, float *tmp);

/* ---- 2. the model ---------------------------------------------------------
 *
 * a K3-family model bound from a local snapshot directory: the
 * config, every tensor as a typed view with its shape, and the location of
 * every routed expert's span.
 *
 * Owns: reading config.json and model.safetensors.index.json, mapping the
 * shards (read-only mmap), finding every language tensor by name, checking
 * its dtype and shape against the config (errors name the tensor), and
 * deriving the spine at load: each BF16 matrix in the format its spine mode
 * gives it (common/k3_sizes.h: int8 with one scale per row, int4 in groups of
 * 32, or f32), small tensors widened to f32.  Routed experts stay as mapped, never copied nor re-encoded.  Vision
 * tensors are never looked up.  Does not own running the model (part 5)
 * nor fetching experts (part 4).
 *
 * Shapes use the config's names: D hidden, V vocab, P = KDA heads·head_dim,
 * Hk KDA heads, Dk KDA head dim, K conv taps, H MLA heads, ql q_lora_rank,
 * kl kv_lora_rank, nope/rope/vd head dims, E experts, L latent, I
 * moe_intermediate, Id dense intermediate, S = shared experts · I.
 */

/* The spine modes are common/k3_sizes.h's: which format each matrix gets. */
typedef enum engine_spine {
    ENGINE_SPINE_INT8 = K3_SPINE_INT8,
    ENGINE_SPINE_INT4 = K3_SPINE_INT4,
    ENGINE_SPINE_F32 = K3_SPINE_F32
} engine_spine;

struct spine_pack;
struct spine_pack_writer;

/* Progress of a long step of a load: `phase` ("quantizing", "storing",
 * "reading"), done of total bytes (total 0: not known). */
typedef void (*engine_progress_fn)(void *ctx, const char *phase, uint64_t done, uint64_t total);

/* Which A_log entry scales a KDA channel (k3.md §3.3 ⚠). */
typedef enum engine_alog_mode {
    ENGINE_ALOG_PER_HEAD = 0,     /* A[h] = exp(A_log[h]), the spec */
    ENGINE_ALOG_PER_CHANNEL = 1   /* A[h][d] = exp(A_log[d]), Deltafin */
} engine_alog_mode;

/* Load-time choices.  engine_model_options_default() gives the spec's. */
typedef struct engine_model_options {
    engine_spine     spine;       /* int8 (default), int4 or f32 */
    engine_alog_mode alog;
    engine_l2_mode   l2;          /* KDA q/k L2 norm form */
    double           mla_eps;     /* q_a / kv_a latent RMSNorm ε (1e-6) */
    kernels_pool    *pool;        /* threads for quantizing at load; may be NULL */
    /* int8 / int4 spine: take every derived matrix from this pack instead
     * of quantizing (part 3); it must outlive the model.  NULL: derive
     * them. */
    struct spine_pack *pack;
    /* Build a pack instead of a model: every derived matrix is written to
     * this writer as soon as it is made and then freed, so the load holds
     * one matrix at a time; the model that results has the vectors but no
     * matrices (build_only) and can only be freed.  NULL: a normal load. */
    struct spine_pack_writer *pack_out;
    engine_progress_fn progress;  /* with pack_out: after each matrix; may be NULL */
    void *progress_ctx;
    /* The memory plan's streamed part (docs/engine.md, "Smaller machines"):
     * the last stream_layers layers' matrices, but their routers, are
     * written to an unlinked file in stream_dir (NULL: /var/tmp, on
     * disk where /tmp may be RAM) at load and read back with O_DIRECT every token, layer L+1
     * while layer L runs, through two buffers of one layer each.  0: all
     * resident.  Derived spines only (not with pack / pack_out). */
    int stream_layers;
    const char *stream_dir;
} engine_model_options;

/* The streamed part's counters (engine_model_stream_stats). */
typedef struct engine_stream_stats {
    int      first_layer;          /* layers [first_layer, n) streamed; n_layers: none */
    int      direct;               /* read with O_DIRECT (else buffered, pages dropped after) */
    uint64_t file_bytes;           /* the stream file */
    uint64_t buffer_bytes;         /* its two buffers */
    uint64_t reads, bytes;         /* layer reads and their bytes */
    uint64_t sync_reads;           /* ... of them not read ahead (a layer out of order) */
    uint64_t wait_ns;              /* time a layer waited for its bytes */
    uint64_t check_ns;             /* in place: hashing reads against the load's hashes */
} engine_stream_stats;

void engine_model_options_default(engine_model_options *o);

/* A spine matrix [rows, cols]: int8 with per-row scales, int4 in groups
 * of 32, or f32 (exactly one of q8.q / q4.packed / f32.w is non-NULL).
 * Views into the model's buffers or a pack. */
typedef struct engine_mat {
    size_t rows, cols;
    kernels_q8  q8;
    kernels_q4  q4;
    kernels_f32 f32;
} engine_mat;

/* Its format. */
k3_fmt engine_mat_fmt(const engine_mat *m);

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
    int build_only;               /* bound with pack_out: no matrices (free it) */
    struct engine_model_priv *priv;
} engine_model;

/* Bind the model in directory `dir` (config.json, the index and its shards,
 * or a single model.safetensors).  *out is a new model (engine_model_free);
 * on failure NULL and err names the file, key or tensor at fault. */
int engine_model_open(const char *dir, const engine_model_options *opt,
                      engine_model **out, shoal_err *err);
void engine_model_free(engine_model *m);

/* Layer `layer` of m is about to run: with a streamed part, its matrices
 * are read (or were read ahead) and bound, and the next streamed layer's
 * read starts (one forward pass at a time per model).  0 at once for a
 * resident layer; an I/O error otherwise. */
int engine_model_layer_ready(const engine_model *m, int layer, shoal_err *err);
void engine_model_stream_stats(const engine_model *m, engine_stream_stats *out);

/* A model bound from a spine pack (opt.pack) held in one anonymous buffer
 * at `pack`, pack[0] at file offset file_off of fd: layers [first, n)
 * are streamed in place (their bytes never read at load; each pass reads
 * them with O_DIRECT where the pack keeps them and releases them after;
 * their routers are copied out now).  *resident_end: the pack offset where
 * the streamed part begins (the caller reads the pack before it). */
int engine_model_stream_pack(engine_model *m, int first, int fd, uint64_t file_off,
                             uint8_t *pack, uint64_t *resident_end, shoal_err *err);

/* Checked streamed layers (after engine_model_stream_pack): the file
 * range [*off, *off + *len) of fd that each pass reads for layer `layer`
 * (SHOAL_EINVAL for a layer not streamed in place); its XXH3-128
 * (canonical), computed at load as the pack was checked, every read is
 * checked against from then on; fn(ctx, layer), on the thread running the
 * pass, when a layer's bytes stay wrong after a second read (the pass
 * then fails with SHOAL_ECORRUPT). */
typedef void (*engine_stream_damaged_fn)(void *ctx, int layer);
int  engine_model_stream_region(const engine_model *m, int layer, uint64_t *off, uint64_t *len);
void engine_model_stream_expect(engine_model *m, int layer, const uint8_t xxh[16]);
void engine_model_stream_on_damaged(engine_model *m, engine_stream_damaged_fn fn, void *ctx);

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

/* y [n][rows] = m · x [n][cols], on the model's spine numerics: int8 and
 * int4 matrices quantize x per 32 into act (room for n·cols), f32 ones use
 * it as is.  0 or a negative code. */
int engine_mat_mul(kernels_pool *pool, const engine_mat *m, const float *x, size_t n,
                   float *y, kernels_act *act, shoal_err *err);

/* ---- 3. the spine pack ----------------------------------------------------
 *
 * the derived spine serialized: every matrix the engine derives from the
 * BF16 spine in an int8 or int4 mode (each in its format, common/k3_sizes.h),
 * in load order, so a later load reads it instead of fetching and
 * quantizing (docs/engine.md, "Cached spine").
 *
 * Owns: the pack's layout, laid out from the config alone before anything
 * is quantized (so a load can write each matrix into the pack as it makes
 * it, holding one at a time), writing it to a descriptor with its
 * XXH3-128, and parsing a pack strictly — it crosses a process boundary
 * (it comes back from shoald's cache), so every offset and size is checked
 * against the pack's length at open, and every matrix against what the
 * model's config expects when the model takes it (spine_pack_next).  Does
 * not own where the bytes live (the caller reads or maps them and keeps
 * them while the model lives) nor the vectors, norms and the embedding
 * (those stay their own objects).
 *
 * Threads: a pack or a writer is used by one thread (the model load).
 */

#define SPINE_PACK_FORMAT  2     /* the layout below (2: int4 entries, the mode in the header) */
/* The quantizers it was made with: 2 = kernels_q8_quantize_* (one scale
 * per row) and kernels_q4_quantize_* (groups of 32, BF16 scales). */
#define SPINE_PACK_QUANT   2
#define SPINE_PACK_ALIGN   64
#define SPINE_PACK_HEADER  64

/* The derived-object name in shoald for a spine mode (int8 or int4):
 * "spine-int8-p2-q2", "spine-int4-g32-p2-q2" — the mode, group size, pack
 * format and quantizer versions are in it, so a change of any is another
 * object.  NULL for the f32 mode (never packed). */
const char *spine_pack_name(engine_spine mode);

typedef struct spine_pack spine_pack;
typedef struct spine_pack_writer spine_pack_writer;

/* Lay out the pack of `mode` (int8 or int4) for config `c`, whose bytes
 * are config[0..config_len); nothing is written yet.  0 or a negative
 * code. */
int spine_pack_writer_new(const k3_config *c, engine_spine mode, const uint8_t *config,
                          size_t config_len, spine_pack_writer **out, shoal_err *err);
/* The pack's length (known from the layout). */
uint64_t spine_pack_writer_length(const spine_pack_writer *w);
/* Write the header and table to fd at offset 0; the matrices follow at
 * their offsets (positional writes: fd's own offset is not used). */
int spine_pack_writer_begin(spine_pack_writer *w, int fd, shoal_err *err);
/* Bytes of matrices written so far. */
uint64_t spine_pack_writer_done(const spine_pack_writer *w);
/* Write the next matrix: it must be the layout's next (name, shape and
 * format), else SHOAL_EFORMAT naming both. */
int spine_pack_writer_put(spine_pack_writer *w, const char *name, const engine_mat *m,
                          shoal_err *err);
/* After the last matrix: the tail's padding, and the pack's XXH3-128
 * (canonical, big-endian) over every byte.  SHOAL_EINVAL if matrices are
 * missing. */
int spine_pack_writer_finish(spine_pack_writer *w, uint8_t xxh128_out[16], shoal_err *err);
void spine_pack_writer_free(spine_pack_writer *w);

/* Write a bound model's derived matrices (m bound in an int8 or int4 mode,
 * not from a pack) as a pack to fd, for the config whose bytes are
 * config[0..config_len).  *len_out: bytes written; xxh128_out: their
 * XXH3-128.  0 or a negative code. */
int spine_pack_write(const engine_model *m, const uint8_t *config, size_t config_len, int fd,
                     uint64_t *len_out, uint8_t xxh128_out[16], shoal_err *err);

/* Parse the pack data[0..len) (borrowed: keep it while the pack and any
 * model bound from it live) of spine mode `mode`, made for
 * config[0..config_len).  SHOAL_EFORMAT naming what is wrong;
 * SHOAL_EUNSUPPORTED for another format or quantizer version;
 * SHOAL_ECORRUPT when the table's hash fails. */
int spine_pack_open(const uint8_t *data, uint64_t len, engine_spine mode, const uint8_t *config,
                    size_t config_len, spine_pack **out, shoal_err *err);
void spine_pack_free(spine_pack *p);

size_t spine_pack_count(const spine_pack *p);
/* Is `name` the source tensor of some matrix in the pack? */
int spine_pack_covers(const spine_pack *p, const char *name);

/* The model's next matrix: it must be `name`, [rows, cols], in format fmt,
 * else SHOAL_EFORMAT naming the difference.  out views the pack. */
int spine_pack_next(spine_pack *p, const char *name, size_t rows, size_t cols, k3_fmt fmt,
                    engine_mat *out, shoal_err *err);
/* Matrices not taken yet (0 after a complete load). */
size_t spine_pack_remaining(const spine_pack *p);
/* Start taking from the first matrix again (another load). */
void spine_pack_rewind(spine_pack *p);

/* ---- 4. expert sources ----------------------------------------------------
 *
 * where the routed experts' bytes come from.
 *
 * Owns: the contract between the MoE layer and an expert provider.  The
 * layer asks once per MoE layer (and chunk) for every distinct expert it
 * needs, sorted into file order (expert_source_order: one pass over the
 * layer's part of each file, however many tokens the chunk holds); the
 * source calls back once per expert, in whatever order the bytes
 * become ready, with a borrowed pointer to the expert's whole span (the six
 * records back to back, k3.md §2: cfg.expert_bytes bytes) or with an error.
 * The layer computes each expert inside its callback, so I/O and compute
 * overlap for sources that deliver progressively.
 *
 * Implementations:
 *   - local (expert_source_local_new): a bound local snapshot directory; the
 *     span points into the model's read-only mapping and every callback runs
 *     before fetch returns, in the order asked;
 *   - shoald (expert_source_shoald_new in engine/source/source.h, DESIGN.md
 *     decision 9): batched GETs through common/client.h, each returned
 *     descriptor mapped (or read, per the page-cache policy) and called back
 *     as it arrives; it holds the engine's RAM tier (experts kept mapped, a
 *     quota per layer, least recently used out first) and the prefetches
 *     (expert_source_request), and REPORTs RAM hits to shoald.
 * The forward pass sees only this interface: it knows neither shoald nor
 * HTTP.
 *
 * Does not own routing, compute, nor the predictions (forward.c,
 * lookahead.c).
 */

/* Where a delivered expert came from (DESIGN.md decision 9). */
typedef enum expert_tier {
    EXPERT_TIER_RAM = 0,      /* the engine's own expert cache */
    EXPERT_TIER_LOCAL = 1,    /* a local snapshot's mapping (page cache or disk) */
    EXPERT_TIER_DISK = 2,     /* shoald's disk cache */
    EXPERT_TIER_NETWORK = 3,  /* fetched upstream by shoald */
    EXPERT_TIER_COUNT
} expert_tier;

const char *expert_tier_name(expert_tier t);

/* Called once per requested expert.  On success status is 0 and span holds
 * `bytes` bytes, borrowed until the callback returns.  On failure status is
 * negative, span NULL and detail says why.  Return 0 to go on; a negative
 * return stops the fetch (remaining experts are not delivered) and fetch
 * returns that code. */
typedef int (*expert_ready_fn)(void *ctx, int layer, int32_t expert, const uint8_t *span,
                               size_t bytes, expert_tier tier, int status,
                               const shoal_err *detail);

typedef struct expert_source_stats {
    uint64_t experts;                    /* spans delivered */
    uint64_t bytes;                      /* their bytes */
    uint64_t hits[EXPERT_TIER_COUNT];    /* spans per tier */
    uint64_t wait_ns;                    /* time fetch spent not in callbacks */
    /* filled by sources that prefetch / keep a RAM tier (0 otherwise) */
    uint64_t prefetch_sent;              /* experts asked for as a guess */
    uint64_t prefetch_used;              /* ... that a fetch then used */
    uint64_t prefetch_early;             /* ... that were already in when fetched */
    uint64_t ram_resident;               /* experts held in the RAM tier now */
    uint64_t ram_bytes;                  /* their bytes */
    uint64_t ram_quota;                  /* experts per MoE layer the tier may hold */
    /* sources that read with their own threads (0 otherwise) */
    uint64_t read_bytes;                 /* read for demand and guesses */
    uint64_t read_guess_bytes;           /* ... of them read as a guess */
    uint64_t read_busy_ns;               /* time at least one read was running */
    uint64_t pool_peak, pool_max;        /* expert buffers held outside the RAM tier: most, bound */
} expert_source_stats;

typedef struct expert_source expert_source;

/* The implementation's side: every source provides these. */
typedef struct expert_source_ops {
    /* Deliver ids[0..n) of `layer` (distinct ids) through fn. */
    int (*fetch)(void *impl, int layer, const int32_t *ids, size_t n,
                 expert_ready_fn fn, void *ctx, shoal_err *err);
    void (*free)(void *impl);
} expert_source_ops;

/* Optional operations (expert_source_new_more). */
typedef struct expert_source_more_ops {
    /* Start moving ids of `layer` towards the engine without
     * waiting.  prefetch 1: a guess, at low priority and cancelled when the
     * layer's own fetch comes; 0: the layer fetches exactly these next. */
    int (*request)(void *impl, int layer, const int32_t *ids, size_t n, int prefetch,
                   shoal_err *err);
    /* Optional: add the source's own counters (prefetch_*, ram_*). */
    void (*stats)(void *impl, expert_source_stats *out);
    /* Optional: sort ids[0..n) of `layer` into the order their bytes lie
     * in the model's files (file, then offset), the order a layer-major
     * prefill asks for and reads them in. */
    void (*order)(void *impl, int layer, int32_t *ids, size_t n);
} expert_source_more_ops;

/* Wrap an implementation (taken: freed by expert_source_free).  NULL on no
 * memory (impl is then freed through ops->free). */
expert_source *expert_source_new(const expert_source_ops *ops, void *impl);
/* The same with the optional operations (more may be NULL). */
expert_source *expert_source_new_more(const expert_source_ops *ops,
                                      const expert_source_more_ops *more, void *impl);
void expert_source_free(expert_source *src);

/* Fetch ids[0..n) of MoE layer `layer`; fn runs once per delivered expert.
 * Returns 0 when every expert was delivered and every callback returned 0;
 * otherwise the first negative code (from the source or a callback), with
 * err filled.  Counts into the source's stats. */
int expert_source_fetch(expert_source *src, int layer, const int32_t *ids, size_t n,
                        expert_ready_fn fn, void *ctx, shoal_err *err);

void expert_source_stats_get(const expert_source *src, expert_source_stats *out);

/* See expert_source_more_ops.request; a no-op (0) for sources without it. */
int expert_source_request(expert_source *src, int layer, const int32_t *ids, size_t n,
                          int prefetch, shoal_err *err);

/* See expert_source_more_ops.order; ids are left as they are for sources
 * without it. */
void expert_source_order(expert_source *src, int layer, int32_t *ids, size_t n);

/* The local-directory source over a bound model (borrowed: must outlive the
 * source).  NULL on no memory. */
expert_source *expert_source_local_new(const engine_model *m);

/* ---- 4b. experts applied elsewhere (optional) -----------------------------
 *
 * A MoE layer's routed experts computed by someone else: other processes
 * that own them (engine/ranks/, over MPI; docs/mpi.md).  The session hands
 * over the chunk's latent inputs and the grouping of its (token, slot)
 * pairs by expert; the applier writes each expert's output for each pair
 * into slots.  Its contract is moe_expert_ready's arithmetic: for expert e,
 * the rows z[t] of its pairs in pair order, one kernels_expert_apply over
 * those cnt[e] rows with weight 1 onto zeros, in the session's numerics
 * (opt.experts).  Then the sums in routing order, and so the logits, are
 * the bits of a run that computes the experts itself.
 *
 * The session still asks its expert source (opt.src) for every layer's
 * experts and the lookahead's guesses (expert_source_request), at the
 * same points as before, so an applier can pass them on as prefetch
 * notes; the source's fetch is not called.
 */
typedef struct engine_moe_batch {
    int layer;
    size_t n, k, latent;          /* tokens, experts per token, L */
    const float *z;               /* [n][L] the latent inputs */
    size_t n_ids;
    const int32_t *ids;           /* [n_ids] the distinct experts, ascending */
    const int32_t *cnt;           /* [E] pairs of expert e */
    const int32_t *first;         /* [E+1] expert e's first entry in pairs */
    const int32_t *pairs;         /* [n·k] t·k + slot, grouped by expert, t ascending */
    float *slots;                 /* [n·k][L] out: expert output of pair t·k + slot */
} engine_moe_batch;

typedef struct engine_expert_applier {
    /* Hand the batch over without waiting for results (the layer then
     * computes its shared experts); b and what it points to stay valid
     * until wait returns. */
    int (*send)(void *ctx, const engine_moe_batch *b, shoal_err *err);
    /* Wait for every output of the batch sent and fill b->slots. */
    int (*wait)(void *ctx, const engine_moe_batch *b, shoal_err *err);
    void *ctx;
} engine_expert_applier;

/* ---- 5. sessions ----------------------------------------------------------
 *
 * one sequence running through a bound model: its decode state
 * (KDA conv windows and recurrent states, the MLA latent cache, the
 * position) and the forward pass over chunks of tokens (k3.md §3, §3.6).
 *
 * Owns: per-sequence state and scratch, the layer-major chunked forward
 * pass, timing and expert-load counts.  Does not own weights (part 2, read
 * only and shareable between sessions), nor where experts come from
 * (part 4, borrowed), nor sampling (the caller picks tokens from
 * the logits).
 *
 * Layer-major prefill: a chunk of n tokens runs layer by layer; every
 * matrix product takes the n vectors at once; sequential state (KDA conv
 * and recurrence, the MLA cache) advances token by token in position order,
 * so attention inside the chunk is causal; each MoE layer fetches the union
 * of the chunk's routed experts once, in file order, and applies each to
 * all its tokens as it arrives.  The chunk is as large as the memory plan
 * allows (engine/plan: plan.chunk, up to 4096), so a prompt usually goes
 * through each layer whole.  Results do not depend on n: see
 * docs/engine.md for what is bit-identical and why.
 */

/* Called after each layer with the layer output h of position `pos`
 * (dim values, borrowed for the call).  For per-layer comparisons. */
typedef void (*engine_hidden_fn)(void *ctx, int64_t pos, int layer, const float *h, size_t dim);

typedef struct engine_session_options {
    kernels_numerics experts;   /* routed-expert numerics: KERNELS_FAST / KERNELS_EXACT */
    size_t chunk;               /* most tokens per forward chunk, >= 1 */
    kernels_pool *pool;         /* borrowed; NULL = caller's thread only */
    expert_source *src;         /* borrowed; required if the model has MoE layers */
    engine_hidden_fn hidden;    /* optional */
    void *hidden_ctx;
    /* Router lookahead (docs/performance.md): 0 guesses the next MoE
     * layer's experts and prefetches them; 1 scores the guesses (recall)
     * without sending them; 2 does neither. */
    int no_prefetch;
    double prefetch_cutoff;     /* recall below which a layer stops; 0: 0.5 */
    /* Most positions the session holds (the memory plan's context): the
     * MLA cache never grows past it and a run past it is SHOAL_ERANGE.
     * 0: max_position_embeddings. */
    int64_t max_positions;
    /* Optional (part 4b): the routed experts applied elsewhere; borrowed.
     * NULL: computed here as src delivers them. */
    const engine_expert_applier *applier;
} engine_session_options;

/* One MoE layer's predictors: how many of the experts it used had been
 * guessed by the router lookahead and by the previous call's set. */
typedef struct engine_layer_recall {
    uint64_t look_hits, look_total;
    uint64_t prev_hits, prev_total;
    uint64_t prefetches;        /* experts sent as guesses for this layer */
    int predictor;              /* last choice: 0 none (recall too low), 1 lookahead, 2 previous */
} engine_layer_recall;

typedef struct engine_session_stats {
    uint64_t positions;         /* tokens run through the stack */
    uint64_t chunks;
    uint64_t moe_calls;         /* MoE layer runs (one per MoE layer per chunk) */
    uint64_t expert_loads;      /* distinct experts fetched, summed over MoE calls */
    uint64_t expert_uses;       /* (token, expert) pairs computed */
    uint64_t spine_ns;          /* int8/f32 spine products (projections, router, head) */
    uint64_t attn_ns;           /* KDA conv/recurrence, MLA scores and context */
    uint64_t expert_ns;         /* routed-expert compute, inside the source's callbacks */
    uint64_t wait_ns;           /* in the expert source, outside callbacks */
    uint64_t moe_ns;            /* whole MoE layers (routing .. output), for per-layer time */
    uint64_t total_ns;          /* whole forward calls */
} engine_session_stats;

typedef struct engine_session engine_session;

/* A new empty sequence (position 0).  0, or SHOAL_EINVAL / SHOAL_ENOMEM
 * with *out NULL. */
int engine_session_new(const engine_model *m, const engine_session_options *opt,
                       engine_session **out, shoal_err *err);
void engine_session_free(engine_session *s);

/* Run tokens[0..n) at positions pos..pos+n-1, in chunks of at most
 * opt.chunk, and write the logits of the last one to logits[V] (NULL: skip
 * the head).  Every id is checked first: one outside [0, V), or positions
 * past the session's context (opt.max_positions), are refused with
 * SHOAL_ERANGE and nothing runs.  On another failure the session is left in
 * an undefined state: free it. */
int engine_session_run(engine_session *s, const int32_t *tokens, size_t n, float *logits,
                       shoal_err *err);

/* Make dst continue from where src is: copy the decode state (KDA states,
 * the MLA cache up to the position, the position).  Both sessions belong
 * to the same model; dst's previous state is replaced, its options and
 * stats are kept.  0 or SHOAL_ENOMEM (dst unchanged but possibly with a
 * larger cache) / SHOAL_EINVAL (another model). */
int engine_session_copy(engine_session *dst, const engine_session *src, shoal_err *err);

int64_t engine_session_pos(const engine_session *s);
/* Bytes this session holds: decode state (KDA, MLA cache at its current
 * capacity) and scratch, including the kernels' activation buffers. */
uint64_t engine_session_bytes(const engine_session *s);
void engine_session_stats_get(const engine_session *s, engine_session_stats *out);

/* The predictors of `layer` (zeros for a dense layer). */
void engine_session_recall(const engine_session *s, int layer, engine_layer_recall *out);

/* Distinct experts MoE layer `layer` fetched, summed over its calls (one
 * per chunk): a prefill of T tokens in one chunk fetches at most
 * min(T x top-k, experts) (0 for a dense layer or a bad index). */
uint64_t engine_session_layer_loads(const engine_session *s, int layer);

#endif
