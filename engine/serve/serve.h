/* serve.h — the engine's generation and serving room: sampling and
 * conversation-state reuse over the forward pass, and the OpenAI-compatible
 * server.  Uses engine/text/ (rendering, detokenizing), engine/forward/ (the
 * pass) and engine/source/ (models served by shoald); the command line
 * (engine/cli/) uses it.
 *
 * Three parts, each with its own contract below:
 *   1. generation   generate.c, sample.c, generate_session.c
 *   2. the OpenAI API's data   openai_parse.c, openai_reply.c
 *   3. the HTTP server         server.c, server_worker.c
 */
#ifndef SHOAL_ENGINE_SERVE_H
#define SHOAL_ENGINE_SERVE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "engine/text/text.h"

/* ---- 1. generation --------------------------------------------------------
 *
 * token generation over a model's forward pass: feed prompt
 * ids, then sample one token at a time, with a callback per token; stop
 * sequences on text; conversation-state reuse.
 *
 * Owns: the generator (the saved conversation states and their token ids),
 * sampling (sample.c: greedy, temperature, top-k, top-p, min-p, penalties,
 * log-probabilities, a seeded PRNG), cancellation, the stop-sequence
 * matcher.  Does not own the forward pass: it drives a
 * backend (gen_backend_ops), normally an engine_session (generate_session.c),
 * and in tests a toy model.  Does not own chat rendering nor detokenizing
 * (engine/text/text.h).
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
 * Sampling, in this order, on a copy of the model's logits for the next
 * position (docs/server.md, "Sampling"):
 *   1. min_tokens: the end ids (eos and stop ids) get -inf until
 *      min_tokens ids were generated;
 *   2. repetition penalty r (HF/vLLM): a logit l of an id that occurs in
 *      the prompt or the output becomes l / r when l > 0, l * r otherwise;
 *   3. frequency and presence penalties (OpenAI): l -= frequency * c +
 *      presence * (c > 0), c the id's count in the output so far;
 *   4. logprobs are the log-softmax of these logits (after 1-3, before
 *      temperature and truncation: defined for greedy decoding too, and the
 *      model's own distribution when no penalty is set);
 *   5. temperature 0: argmax (lowest id on ties).  Otherwise weights
 *      exp((l - max) / temperature), then top_k (the k heaviest), top_p (the
 *      smallest prefix whose mass reaches top_p; 0 keeps one id), min_p
 *      (ids whose weight is at least min_p times the heaviest), each on the
 *      renormalised result of the step before, then one draw.
 * The PRNG is xoshiro256** seeded by four splitmix64 outputs from `seed`;
 * a draw is (next() >> 11) * 2^-53, one per sampled token (none when
 * greedy).  The same seed, prompt, parameters and backend give the same
 * tokens.
 *
 * Thread safety: a generator is used by one thread at a time; `cancel` may
 * be set from any thread.
 */

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
    size_t   chunk;            /* prompt ids one run takes in one pass through each
                                  layer (the session's prefill chunk); 0: unknown */
} gen_backend;

/* ---- generator -------------------------------------------------------------- */

typedef struct generator generator;

/* b is copied; b->impl is borrowed and must outlive the generator.
 * 0, SHOAL_EINVAL or SHOAL_ENOMEM. */
int generator_new(const gen_backend *b, generator **out, shoal_err *err);
void generator_free(generator *g);

/* Truncation and temperature (steps 5 above). */
typedef struct gen_sampling {
    double   temperature;      /* 0: greedy */
    uint32_t top_k;            /* 0: off */
    double   top_p;            /* [0, 1]; 1: off */
    double   min_p;            /* [0, 1]; 0: off */
} gen_sampling;

/* Steps 2 and 3 above. */
typedef struct gen_penalties {
    double repetition;         /* > 0; 1: off */
    double presence;           /* 0: off */
    double frequency;          /* 0: off */
} gen_penalties;

#define GEN_TOP_LOGPROBS_MAX 20    /* OpenAI's limit on top_logprobs */

typedef struct gen_params {
    gen_sampling  s;
    gen_penalties pen;
    uint64_t seed;
    int      has_seed;         /* 0: seed from the clock */
    size_t   max_tokens;       /* 0: until eos or the context is full */
    size_t   min_tokens;       /* the end ids are masked until this many were generated */
    const uint32_t *eos;       /* ids that end the reply: the eos and any stop ids
                                  (passed to the callback, which adds no text) */
    size_t   n_eos;
    int      logprobs;         /* 1: each token's log-probability to the callback */
    int      top_logprobs;     /* with logprobs: that many alternatives, 0..20 */
    size_t   prefill_step;     /* prompt ids per backend call (cancellation
                                  granularity); 0: the backend's chunk
                                  (the whole prompt through each layer at
                                  once, layer-major), else 64 */
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

/* An id and its log-probability (step 4 above). */
typedef struct gen_alt {
    uint32_t id;
    float    logprob;
} gen_alt;

/* What the callback gets for each sampled id; pointers live for the call. */
typedef struct gen_token {
    uint32_t id;
    int      is_eos;           /* one of params.eos: the last call */
    float    logprob;          /* with params.logprobs, else 0 */
    const gen_alt *top;        /* params.top_logprobs alternatives, most likely first */
    size_t   n_top;
} gen_token;

/* Called with each sampled id.  Return 0 to go on, 1 to stop here (finish
 * "stop"), or a negative code to fail the run with it. */
typedef int (*gen_token_fn)(void *ctx, const gen_token *t);

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

/* Pick an id from logits[0..n) as step 5 above describes; scratch needs n
 * entries.  Greedy when s->temperature <= 0 (no draw). */
uint32_t gen_sample(const float *logits, uint32_t n, const gen_sampling *s, gen_rng *r,
                    uint32_t *scratch);

/* Steps 2-3 on logits[0..n_vocab) in place: hist[0..n) are the ids so far,
 * of which the last n_out were generated.  work: n_vocab zeroed entries,
 * left zeroed.  Ids of hist must be < n_vocab. */
void gen_penalize(float *logits, uint32_t n_vocab, const uint32_t *hist, size_t n, size_t n_out,
                  const gen_penalties *p, uint32_t *work);

/* Step 4: the log-sum-exp of logits[0..n) (-inf entries weigh nothing), and
 * the k (<= GEN_TOP_LOGPROBS_MAX) most likely ids with their
 * log-probabilities into top (ties: the lower id first).  Returns the
 * log-sum-exp; logprob(id) = logits[id] - it. */
double gen_logsumexp(const float *logits, uint32_t n);
size_t gen_top_logprobs(const float *logits, uint32_t n, double lse, size_t k, gen_alt *top);

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

/* Everything a generating command binds: the model loaded under the
 * memory plan (engine/source/source.h part 3: the pool, the model, the
 * expert source), the tokenizer, the session backend and a generator.
 * For `serve` and `run --prompt`. */
struct kernels_pool;
struct expert_source;
struct engine_loaded;
struct engine_load_options;
typedef struct gen_model {
    struct engine_model *model;
    struct kernels_pool *pool;
    struct expert_source *src;
    tokenizer *tok;
    gen_backend backend;
    generator *gen;
    uint32_t eos;              /* <|end_of_msg|>, else config eos_token_id */
    struct engine_remote *remote;  /* an hf:// model through shoald */
    struct engine_loaded *load;    /* owns pool, model, src and remote */
} gen_model;

typedef struct gen_model_options {
    int    threads;            /* compute threads, >= 1 */
    size_t chunk;              /* prefill chunk (session); 0: the largest the
                                  memory plan allows */
    int    spine_f32;          /* 1: f32 spine and exact experts */
    const char *home;          /* shoald's home for an hf:// model (engine/source/source.h) */
    /* every load option (the plan's, shoald's, the forward pass's); when
     * set, the four fields above are not used.  Its `progress` is told
     * each step of the load: a step's name with done = total = 0
     * ("loading the tokenizer"), and the measured ones of a spine pack
     * being built (engine/forward/forward.h engine_progress_fn). */
    const struct engine_load_options *load;
} gen_model_options;

/* The load options gen_model_open uses for `o`: *o->load, or the defaults
 * with the four fields above. */
void gen_model_load_options(const gen_model_options *o, struct engine_load_options *out);

/* `dir` is a model directory, or hf://org/name[@rev] read through the
 * shoald of o->home.  0 or a negative code with err naming what failed; out is zeroed on
 * failure.  Close with gen_model_close (accepts a zeroed one). */
int gen_model_open(const char *dir, const gen_model_options *o, gen_model *out, shoal_err *err);
void gen_model_close(gen_model *gm);

/* An hf:// model's daemon connection (engine/source/source.h): a round
 * trip that says the daemon still answers, and the replacement of a lost
 * connection.  Both 0 for a local model; otherwise 0 or the failure.  On
 * the thread that generates, between runs. */
int gen_model_ping(gen_model *gm, shoal_err *err);
int gen_model_reconnect(gen_model *gm, shoal_err *err);

/* ---- 2. the OpenAI API ----------------------------------------------------
 *
 * the OpenAI-compatible API's data: parsing and validating
 * request bodies for /v1/chat/completions and /v1/completions, and building
 * the response bodies and SSE chunks.
 *
 * Owns: the allow-lists of request fields (anything else is refused with a
 * 400 naming it), value checks, defaults, and the JSON shapes of replies.
 * Does not own HTTP (part 3, server.c), tokenization or generation.
 * docs/server.md lists every field.
 *
 * Error bodies have OpenAI's shape:
 *   {"error": {"message": "...", "type": "invalid_request_error",
 *              "param": "temperature" | null, "code": "..." | null}}
 */

#define OPENAI_MAX_STOP 4
#define OPENAI_MAX_STOP_IDS 32
#define OPENAI_EFFORT_MAX 16

typedef enum openai_kind { OPENAI_CHAT = 0, OPENAI_COMPLETION = 1 } openai_kind;

typedef enum openai_role { OPENAI_SYSTEM = 0, OPENAI_USER = 1, OPENAI_ASSISTANT = 2 } openai_role;

/* A message; content is owned by the request (text parts joined). */
typedef struct openai_message {
    openai_role role;
    char       *content;
    size_t      content_len;
} openai_message;

/* A parsed request.  Strings are owned; free with openai_request_free. */
typedef struct openai_request {
    openai_kind kind;
    char       *model;             /* NULL if absent */
    /* chat */
    openai_message *msgs;
    size_t      n_msgs;
    int         thinking;          /* 1 unless reasoning_effort "none" or
                                      chat_template_kwargs.thinking false */
    char        effort[OPENAI_EFFORT_MAX];   /* K3 effort: low|medium|high|max */
    /* completion: text, or token ids */
    char       *prompt;
    size_t      prompt_len;
    uint32_t   *prompt_ids;
    size_t      n_prompt_ids;
    /* sampling and limits */
    size_t      max_tokens;        /* 0: not given */
    size_t      min_tokens;        /* 0: not given; <= max_tokens when both are */
    double      temperature;       /* default 0 (greedy) */
    double      top_p;             /* default 1 */
    uint32_t    top_k;             /* 0: off (the API's -1 too) */
    double      min_p;             /* default 0 */
    double      repetition_penalty;    /* default 1 */
    double      presence_penalty, frequency_penalty;   /* default 0 */
    uint64_t    seed;
    int         has_seed;
    char       *stop[OPENAI_MAX_STOP];
    size_t      n_stop;
    uint32_t    stop_ids[OPENAI_MAX_STOP_IDS];   /* stop_token_ids (range-checked later) */
    size_t      n_stop_ids;
    int         logprobs;          /* 1: log-probabilities in the reply */
    int         top_logprobs;      /* alternatives per token, 0..20 (chat: top_logprobs;
                                      completions: the value of logprobs) */
    int         stream;
    int         ignore_eos;     /* vLLM's extension: generation does not end at the eos */
    int         include_usage;     /* stream_options.include_usage */
} openai_request;

/* What went wrong, ready to be sent. */
typedef struct openai_error {
    int  status;                   /* HTTP status */
    char type[32];                 /* "invalid_request_error", ... */
    char param[64];                /* "" for null */
    char code[40];                 /* "" for null */
    char message[384];
} openai_error;

/* Fill e (status, type, param or NULL, code or NULL, printf message). */
void openai_error_set(openai_error *e, int status, const char *type, const char *param,
                      const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The error body as JSON text (appended to out).  0 or SHOAL_ENOMEM. */
int openai_error_json(const openai_error *e, shoal_buf *out);

/* Parse body[0..len) as a request of `kind`.  0, or -1 with e filled (a
 * 400 naming the field for unknown fields, bad types or values; malformed
 * JSON; n != 1) and *r freed.  Only whole numbers fit integer fields. */
int openai_request_parse(openai_kind kind, const char *body, size_t len, openai_request *r,
                         openai_error *e);
void openai_request_free(openai_request *r);

/* ---- replies -------------------------------------------------------------------- */

/* One generated token's log-probability and its alternatives, for a
 * reply's "logprobs" (docs/server.md).  bytes are borrowed (from the
 * tokenizer) and must live until the reply is built. */
typedef struct openai_lp_alt {
    const uint8_t *bytes;
    size_t         n;
    float          logprob;        /* -inf is sent as -9999.0, as OpenAI does */
} openai_lp_alt;

typedef struct openai_lp_token {
    openai_lp_alt tok;
    size_t        text_offset;     /* completions: where its text starts in the text */
    size_t        n_top;
    openai_lp_alt top[GEN_TOP_LOGPROBS_MAX];
} openai_lp_token;

/* A growable list of them; start zeroed, openai_lp_list_free. */
typedef struct openai_lp_list {
    openai_lp_token *v;
    size_t n, cap;
} openai_lp_list;

int openai_lp_push(openai_lp_list *l, const openai_lp_token *t);   /* 0 or SHOAL_ENOMEM */
void openai_lp_list_free(openai_lp_list *l);

/* What a reply needs besides the text. */
typedef struct openai_reply_info {
    const char *id;                /* "chatcmpl-..." / "cmpl-..." */
    const char *model;
    int64_t     created;           /* Unix seconds */
    size_t      prompt_tokens, completion_tokens, cached_tokens;
    const char *finish_reason;     /* "stop", "length" or NULL (not finished) */
    /* log-probabilities of the tokens the reply or chunk covers; NULL:
     * not asked for ("logprobs": null).  Chat: lp those of the answer
     * ("content"), lp_reasoning those of the reasoning (sent as
     * "reasoning_content" beside it, when not NULL); completions: lp. */
    const openai_lp_list *lp, *lp_reasoning;
} openai_reply_info;

/* Whole responses: chat.completion (reasoning may be NULL: no
 * reasoning_content) or text_completion.  Appended to out. */
int openai_chat_json(const openai_reply_info *ri, const char *content, size_t content_len,
                     const char *reasoning, size_t reasoning_len, shoal_buf *out);
int openai_completion_json(const openai_reply_info *ri, const char *text, size_t text_len,
                           shoal_buf *out);

/* One SSE event "data: {...}\n\n" appended to out.
 * Chat: delta with role (first chunk), content or reasoning_content (either
 * may be NULL), finish_reason from ri; with_usage adds "usage": null (the
 * include_usage convention) to non-final chunks.
 * Usage chunk: choices [] and the usage object.
 * Completion: choices[0].text, finish_reason from ri. */
int openai_chat_chunk(const openai_reply_info *ri, int role, const char *content,
                      size_t content_len, const char *reasoning, size_t reasoning_len,
                      int with_usage, shoal_buf *out);
int openai_completion_chunk(const openai_reply_info *ri, const char *text, size_t text_len,
                            int with_usage, shoal_buf *out);
int openai_usage_chunk(const openai_reply_info *ri, int chat, shoal_buf *out);
/* "data: [DONE]\n\n" */
int openai_done_event(shoal_buf *out);

/* GET /v1/models body for one model. */
int openai_models_json(const char *model, int64_t created, shoal_buf *out);

/* ---- 3. the HTTP server ---------------------------------------------------
 *
 * the OpenAI-compatible HTTP server (docs/server.md).
 *
 * Owns: the listening socket and every connection (a cap, header and body
 * limits and deadlines, accept back-off), the libevent HTTP loop (evhttp)
 * on the caller's thread, one worker thread that binds the model once the
 * port is open and then runs generations one at a time, the bounded FIFO
 * of waiting requests, API-key checks, disconnect detection and
 * cancellation, the daemon connection of an hf:// model (probes and
 * reconnection), statistics (/health, /metrics), /tokenize and
 * /detokenize, clean shutdown on SIGINT/SIGTERM.  Does not own request
 * parsing (part 2) nor generation (part 1).
 */

typedef struct server_config {
    const char *host;          /* "127.0.0.1" */
    int         port;          /* 8000; 0 picks a free port */
    const char *api_key;       /* NULL: no key needed.  Compared in constant
                                  time, never logged */
    size_t      queue;         /* waiting requests beyond the running one (16) */
    size_t      max_body;      /* request bodies above this get 413 (4 MiB) */
    size_t      max_header;    /* request line + headers above this get 413 (32 KiB) */
    int         request_timeout_s;  /* a request's header and body arrive within this,
                                       from the connection's start or its last reply (60) */
    int         idle_timeout_s;     /* no byte moved while reading or writing (30) */
    size_t      max_connections;    /* open connections; beyond, new ones wait in the
                                       kernel's backlog (256) */
    const char *model_name;    /* the id /v1/models lists and requests may name */
    const char *model;         /* what the worker opens (gen_model_open) once the
                                  port is open: a directory or hf://org/name[@rev] */
    gen_model_options model_opt;
    size_t      prefill_step;  /* prompt ids per forward call (cancellation
                                  granularity); 0: the backend's chunk
                                  (the whole prompt through each layer at
                                  once, layer-major), else 64 */
    /* Called once the model is bound and requests are served, with the
     * bound port (for a caller that prints where it is).  May be NULL. */
    void (*on_listen)(void *ctx, const char *host, int port);
    void *on_listen_ctx;
} server_config;

void server_config_default(server_config *c);

/* Does a request's "model" name the served id?  The id itself, or its last
 * path component when the id is a repo name ("Kimi-K3" for
 * "moonshotai/Kimi-K3"), or the repo name with an hf:// prefix or an @rev
 * suffix.  1 or 0. */
int server_model_matches(const char *served, const char *asked);

/* Open the port, bind the model on the worker, serve until SIGINT or
 * SIGTERM (the handlers are installed for the call).  0 after a clean
 * shutdown, or a negative code: cannot bind (SHOAL_EIO, with the address in
 * err), or the model did not open (its error). */
int server_run(const server_config *cfg, shoal_err *err);

#endif
