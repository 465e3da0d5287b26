/* generate.h — token generation over a model's forward pass: feed prompt
 * ids, then sample one token at a time, with a callback per token; stop
 * sequences on text; conversation-state reuse.
 *
 * Owns: the generator (the saved conversation states and their token ids),
 * sampling (greedy, temperature, top-p, a seeded PRNG), cancellation, the
 * stop-sequence matcher.  Does not own the forward pass: it drives a
 * backend (gen_backend_ops), normally an engine_session (generate_session.c),
 * and in tests a toy model.  Does not own chat rendering (chat.h) nor
 * detokenizing (tokenizer.h).
 *
 * Reuse.  The generator keeps two states:
 *   - live: the state after everything run so far (last prompt + the tokens
 *     generated and fed back);
 *   - snap: a copy of the state taken right after the last prompt's prefill,
 *     before generation (only when the backend can copy states).
 * A request whose prompt starts with all the ids of one of them continues
 * from it and runs only the rest; the longer match wins.  A chat's next
 * turn re-renders the previous reply from its text (think block emptied,
 * k3.md §4), which rarely equals the sampled ids, so it is the snapshot
 * that a conversation normally extends.  States cannot be rewound (KDA is
 * recurrent), so a prompt that diverges inside a saved state starts over.
 *
 * Sampling.  temperature 0: argmax (lowest id on ties).  Otherwise softmax
 * of logits/temperature restricted to the smallest set of most likely ids
 * whose mass reaches top_p, then one draw.  The PRNG is xoshiro256**
 * seeded by four splitmix64 outputs from `seed`; a draw is
 * (next() >> 11) * 2^-53.  The same seed, prompt and backend give the same
 * tokens.
 *
 * Thread safety: a generator is used by one thread at a time; `cancel` may
 * be set from any thread.
 */
#ifndef SHOAL_ENGINE_GENERATE_H
#define SHOAL_ENGINE_GENERATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "engine/tokenizer.h"

/* ---- backend ---------------------------------------------------------------- */

typedef struct gen_backend_ops {
    /* A new empty state at position 0. */
    int (*state_new)(void *impl, void **state, shoal_err *err);
    void (*state_free)(void *impl, void *state);
    /* Make dst (from state_new) a copy of src.  NULL: no snapshots. */
    int (*state_copy)(void *impl, void *dst, const void *src, shoal_err *err);
    /* Run ids[0..n) at the state's next positions; logits of the last one
     * into logits[n_vocab].  On failure the state is discarded. */
    int (*run)(void *impl, void *state, const uint32_t *ids, size_t n, float *logits,
               shoal_err *err);
} gen_backend_ops;

typedef struct gen_backend {
    const gen_backend_ops *ops;
    void    *impl;
    uint32_t n_vocab;          /* logits per position */
    size_t   n_ctx;            /* most positions a state holds */
} gen_backend;

/* ---- generator -------------------------------------------------------------- */

typedef struct generator generator;

/* b is copied; b->impl is borrowed and must outlive the generator.
 * 0, SHOAL_EINVAL or SHOAL_ENOMEM. */
int generator_new(const gen_backend *b, generator **out, shoal_err *err);
void generator_free(generator *g);

typedef struct gen_params {
    double   temperature;      /* 0: greedy */
    double   top_p;            /* (0, 1]; 1: off */
    uint64_t seed;
    int      has_seed;         /* 0: seed from the clock */
    size_t   max_tokens;       /* 0: until eos or the context is full */
    const uint32_t *eos;       /* ids that end the reply (passed to the callback) */
    size_t   n_eos;
    size_t   prefill_step;     /* prompt ids per backend call (cancellation
                                  granularity); 0: 64 */
    atomic_int *cancel;        /* may be NULL; non-zero stops at the next step */
} gen_params;

void gen_params_default(gen_params *p);

typedef enum gen_finish {
    GEN_FINISH_STOP = 0,       /* an eos id, or the callback asked to stop */
    GEN_FINISH_LENGTH = 1,     /* max_tokens or the context */
    GEN_FINISH_CANCELLED = 2
} gen_finish;

const char *gen_finish_name(gen_finish f);   /* "stop", "length", "cancelled" */

typedef struct gen_result {
    size_t     prompt_tokens;
    size_t     reused_tokens;      /* prompt ids taken from a saved state */
    size_t     computed_tokens;    /* prompt ids run (prompt - reused) */
    size_t     completion_tokens;  /* ids sampled, eos included */
    gen_finish finish;
    uint64_t   prefill_ns, decode_ns;
    uint64_t   decode_model_ns;    /* of decode_ns, inside the backend (the
                                      rest: sampling and the callbacks) */
} gen_result;

/* Called with each sampled id (is_eos: it is one of params.eos, the last
 * call).  Return 0 to go on, 1 to stop here (finish "stop"), or a negative
 * code to fail the run with it. */
typedef int (*gen_token_fn)(void *ctx, uint32_t id, int is_eos);

/* Run prompt[0..n) (n >= 1) and generate.  res is filled on success and on
 * failure as far as it got.  0, or SHOAL_EINVAL (empty prompt),
 * SHOAL_ERANGE (prompt longer than the context), a backend error, or the
 * callback's code.  Cancellation is a success with finish "cancelled". */
int generator_run(generator *g, const uint32_t *prompt, size_t n, const gen_params *p,
                  gen_token_fn fn, void *ctx, gen_result *res, shoal_err *err);

typedef struct gen_stats {
    uint64_t runs;
    uint64_t prompt_tokens, reused_tokens, computed_tokens, completion_tokens;
    size_t   last_reused, last_computed;
    size_t   live_tokens, snap_tokens;   /* ids held by the saved states */
} gen_stats;

void generator_stats(const generator *g, gen_stats *out);

/* Drop the saved states (the next run starts from position 0). */
void generator_reset(generator *g);

/* ---- sampling (exposed for tests) -------------------------------------------- */

typedef struct gen_rng { uint64_t s[4]; } gen_rng;

void gen_rng_seed(gen_rng *r, uint64_t seed);
uint64_t gen_rng_next(gen_rng *r);
double gen_rng_double(gen_rng *r);       /* [0, 1) */

/* Pick an id from logits[0..n) as described above; scratch needs n
 * entries.  Greedy when temperature <= 0. */
uint32_t gen_sample(const float *logits, uint32_t n, double temperature, double top_p,
                    gen_rng *r, uint32_t *scratch);

/* ---- stop sequences ------------------------------------------------------------ */

/* Matches stop strings on streamed text, holding back any tail that could
 * be the start of one, so text after a stop is never emitted.  Held text
 * is always a prefix of a stop string, hence starts on a character
 * boundary. */
typedef struct gen_stop gen_stop;

#define GEN_STOP_MAX 4          /* OpenAI's limit on `stop` entries */

/* stops[0..n) are copied (empty strings are ignored).  NULL on no memory. */
gen_stop *gen_stop_new(const char *const *stops, size_t n);
void gen_stop_free(gen_stop *s);
/* Add text; append to out what is safe to emit.  Returns 1 when a stop
 * string matched (the text before it is emitted, it and the rest never),
 * 0 otherwise, or a negative code.  After a match further pushes emit
 * nothing. */
int gen_stop_push(gen_stop *s, const char *p, size_t n, shoal_buf *out);
/* End of text: emit what was held back (nothing after a match). */
int gen_stop_flush(gen_stop *s, shoal_buf *out);

/* ---- over engine sessions (generate_session.c) ------------------------------------ */

/* The backend over engine sessions (generate_session.c): states are
 * engine_sessions made with *opt (copied; its pool and source are borrowed
 * and, like m, must outlive the backend); n_ctx is the model's
 * max_position_embeddings.  Free with gen_backend_session_free. */
struct engine_model;
struct engine_session_options;
int gen_backend_session_new(const struct engine_model *m, const struct engine_session_options *opt,
                            gen_backend *out, shoal_err *err);
void gen_backend_session_free(gen_backend *b);

/* Everything a generating command binds from a local model directory: the
 * model, a thread pool, the local expert source, the tokenizer, the
 * session backend and a generator.  For `serve` and `run --prompt`. */
struct kernels_pool;
struct expert_source;
typedef struct gen_model {
    struct engine_model *model;
    struct kernels_pool *pool;
    struct expert_source *src;
    tokenizer *tok;
    gen_backend backend;
    generator *gen;
    uint32_t eos;              /* <|end_of_msg|>, else config eos_token_id */
    struct engine_remote *remote;  /* an hf:// model through shoald; owns model and src */
} gen_model;

typedef struct gen_model_options {
    int    threads;            /* compute threads, >= 1 */
    size_t chunk;              /* prefill chunk (session), >= 1 */
    int    spine_f32;          /* 1: f32 spine and exact experts */
    const char *home;          /* shoald's home for an hf:// model (engine/remote.h) */
} gen_model_options;

/* `dir` is a model directory, or hf://org/name[@rev] read through the
 * shoald of o->home.  0 or a negative code with err naming what failed; out is zeroed on
 * failure.  Close with gen_model_close (accepts a zeroed one). */
int gen_model_open(const char *dir, const gen_model_options *o, gen_model *out, shoal_err *err);
void gen_model_close(gen_model *gm);

#endif
