/* session.h — one sequence running through a bound model: its decode state
 * (KDA conv windows and recurrent states, the MLA latent cache, the
 * position) and the forward pass over chunks of tokens (k3.md §3, §3.6).
 *
 * Owns: per-sequence state and scratch, the layer-major chunked forward
 * pass, timing and expert-load counts.  Does not own weights (model.h, read
 * only and shareable between sessions), nor where experts come from
 * (expert_source.h, borrowed), nor sampling (the caller picks tokens from
 * the logits).
 *
 * Chunked prefill: a chunk of n tokens runs layer by layer; every matrix
 * product takes the n vectors at once; sequential state (KDA conv and
 * recurrence, the MLA cache) advances token by token in position order; each
 * MoE layer fetches the union of the chunk's routed experts once.  Results do
 * not depend on n: see docs/engine.md for what is bit-identical and why.
 */
#ifndef SHOAL_ENGINE_SESSION_H
#define SHOAL_ENGINE_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/expert_source.h"
#include "engine/kernels/kernels.h"
#include "engine/model.h"

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
 * the head).  Every id is checked first: one outside [0, V) is refused with
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

#endif
