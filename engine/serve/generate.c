/* generate.c — the generator: state reuse, the prefill/decode loop and
 * the stop-sequence matcher (serve.h part 1 has the contract; the sampling
 * chain itself is sample.c).
 *
 * Owns: two saved states (live, snap) with their ids and last logits, the
 * scratch the sampling chain works in.  Does not own the forward pass (the
 * backend) nor text (callers detokenize).
 *
 * Invariants:
 *   1. a slot's state has run exactly slot.ids (ids.n == its position);
 *   2. slot.logits_ok means slot.logits are the logits after its last id;
 *   3. a slot whose backend call failed is emptied (state freed).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/sys.h"
#include "engine/serve/serve.h"

typedef struct gen_slot {
    void     *state;       /* NULL: empty */
    uint32_t *ids;
    size_t    n, cap;
    float    *logits;      /* [n_vocab] */
    int       logits_ok;
} gen_slot;

struct generator {
    gen_backend b;
    uint64_t run_ns;       /* time in backend runs, summed */
    gen_slot live, snap;
    uint32_t *scratch;     /* [n_vocab] for sampling */
    float    *work;        /* [n_vocab] the logits after masking and penalties */
    uint32_t *pen;         /* [n_vocab] zeroed, for gen_penalize */
    gen_stats st;
};

/* ---- slots ------------------------------------------------------------------------ */

static void slot_clear(generator *g, gen_slot *s)
{
    if (s->state)
        g->b.ops->state_free(g->b.impl, s->state);
    s->state = NULL;
    s->n = 0;
    s->logits_ok = 0;
}

static int slot_push(gen_slot *s, const uint32_t *ids, size_t n)
{
    if (s->n + n > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->n + n)
            cap *= 2;
        uint32_t *v = realloc(s->ids, cap * sizeof *v);
        if (!v)
            return SHOAL_ENOMEM;
        s->ids = v;
        s->cap = cap;
    }
    memcpy(s->ids + s->n, ids, n * sizeof *ids);
    s->n += n;
    return 0;
}

/* Ids of the prompt a slot covers: all of its ids if they prefix the
 * prompt (and, when they are the whole prompt, its logits are known),
 * else 0. */
static size_t slot_match(const gen_slot *s, const uint32_t *prompt, size_t n)
{
    if (!s->state || s->n == 0 || s->n > n || memcmp(s->ids, prompt, s->n * sizeof *prompt))
        return 0;
    if (s->n == n && !s->logits_ok)
        return 0;
    return s->n;
}

/* Run ids on the live slot in steps; fails -> slot emptied. */
static int live_run(generator *g, const uint32_t *ids, size_t n, size_t step, atomic_int *cancel,
                    size_t *done, shoal_err *err)
{
    gen_slot *s = &g->live;
    *done = 0;
    while (*done < n) {
        size_t k = n - *done < step ? n - *done : step;
        int rc;
        if (cancel && atomic_load(cancel))
            return SHOAL_ECANCELED;
        uint64_t t0 = shoal_now_ns();
        s->logits_ok = 0;
        rc = g->b.ops->run(g->b.impl, s->state, ids + *done, k, s->logits, err);
        g->run_ns += shoal_now_ns() - t0;
        if (rc == 0 && slot_push(s, ids + *done, k))
            rc = shoal_err_set(err, SHOAL_ENOMEM, "generate: out of memory");
        if (rc != 0) {
            slot_clear(g, s);
            return rc;
        }
        s->logits_ok = 1;
        *done += k;
    }
    return 0;
}

int generator_new(const gen_backend *b, generator **out, shoal_err *err)
{
    generator *g;

    *out = NULL;
    if (!b || !b->ops || !b->ops->state_new || !b->ops->run || b->n_vocab == 0 || b->n_ctx == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "generate: incomplete backend");
    if (!(g = calloc(1, sizeof *g)))
        return shoal_err_set(err, SHOAL_ENOMEM, "generate: out of memory");
    g->b = *b;
    g->live.logits = malloc(b->n_vocab * sizeof(float));
    g->snap.logits = malloc(b->n_vocab * sizeof(float));
    g->scratch = malloc(b->n_vocab * sizeof(uint32_t));
    g->work = malloc(b->n_vocab * sizeof(float));
    g->pen = calloc(b->n_vocab, sizeof(uint32_t));
    if (!g->live.logits || !g->snap.logits || !g->scratch || !g->work || !g->pen) {
        generator_free(g);
        return shoal_err_set(err, SHOAL_ENOMEM, "generate: out of memory");
    }
    *out = g;
    return 0;
}

void generator_reset(generator *g)
{
    slot_clear(g, &g->live);
    slot_clear(g, &g->snap);
}

void generator_free(generator *g)
{
    if (!g)
        return;
    generator_reset(g);
    free(g->live.ids);
    free(g->live.logits);
    free(g->snap.ids);
    free(g->snap.logits);
    free(g->scratch);
    free(g->work);
    free(g->pen);
    free(g);
}

void generator_stats(const generator *g, gen_stats *out)
{
    *out = g->st;
    out->live_tokens = g->live.state ? g->live.n : 0;
    out->snap_tokens = g->snap.state ? g->snap.n : 0;
}

void gen_params_default(gen_params *p)
{
    memset(p, 0, sizeof *p);
    p->s.top_p = 1.0;
    p->pen.repetition = 1.0;
}

const char *gen_finish_name(gen_finish f)
{
    switch (f) {
    case GEN_FINISH_STOP: return "stop";
    case GEN_FINISH_LENGTH: return "length";
    default: return "cancelled";
    }
}

/* Make the live slot hold a prefix of the prompt, as long as the saved
 * states allow; returns how many prompt ids it covers. */
static int prepare_live(generator *g, const uint32_t *prompt, size_t n, size_t *reused,
                        shoal_err *err)
{
    size_t from_live = slot_match(&g->live, prompt, n);
    size_t from_snap = slot_match(&g->snap, prompt, n);
    int rc;

    *reused = 0;
    if (from_snap > from_live) {
        gen_slot t = g->live;   /* swap: live continues from the snapshot */
        g->live = g->snap;
        g->snap = t;
        *reused = from_snap;
        return 0;
    }
    if (from_live > 0) {
        *reused = from_live;
        return 0;
    }
    slot_clear(g, &g->live);
    rc = g->b.ops->state_new(g->b.impl, &g->live.state, err);
    if (rc != 0)
        g->live.state = NULL;
    return rc;
}

/* Copy live into snap (the state right after the prompt); failure only
 * costs reuse, so it is logged, not returned. */
static void take_snapshot(generator *g)
{
    shoal_err e;
    int rc;

    if (!g->b.ops->state_copy)
        return;
    if (!g->snap.state && g->b.ops->state_new(g->b.impl, &g->snap.state, &e) != 0) {
        g->snap.state = NULL;
        LOG_WARN("generate", "no snapshot: %s", e.msg);
        return;
    }
    g->snap.n = 0;
    g->snap.logits_ok = 0;
    rc = g->b.ops->state_copy(g->b.impl, g->snap.state, g->live.state, &e);
    if (rc == 0)
        rc = slot_push(&g->snap, g->live.ids, g->live.n);
    if (rc != 0) {
        LOG_WARN("generate", "no snapshot: %s", rc == SHOAL_ENOMEM ? "out of memory" : e.msg);
        slot_clear(g, &g->snap);
        return;
    }
    memcpy(g->snap.logits, g->live.logits, g->b.n_vocab * sizeof(float));
    g->snap.logits_ok = 1;
}

static int is_eos(const gen_params *p, uint32_t id)
{
    for (size_t i = 0; i < p->n_eos; i++)
        if (p->eos[i] == id)
            return 1;
    return 0;
}

/* The logits the next id is sampled from: the model's, or a copy with
 * the end ids masked (min_tokens) and the penalties applied (serve.h part
 * 1, steps 1-3).  n_prompt: the prompt's ids at the front of live.ids. */
static const float *next_logits(generator *g, const gen_params *p, size_t n_prompt, size_t done)
{
    const gen_penalties *pen = &p->pen;
    int mask = done < p->min_tokens && p->n_eos > 0;
    int penalize = (pen->repetition > 0 && pen->repetition != 1.0) || pen->presence != 0 ||
                   pen->frequency != 0;

    if (!mask && !penalize)
        return g->live.logits;
    memcpy(g->work, g->live.logits, g->b.n_vocab * sizeof(float));
    if (mask)
        for (size_t i = 0; i < p->n_eos; i++)
            if (p->eos[i] < g->b.n_vocab)
                g->work[p->eos[i]] = -INFINITY;
    if (penalize)
        gen_penalize(g->work, g->b.n_vocab, g->live.ids, g->live.n, g->live.n - n_prompt, pen,
                     g->pen);
    return g->work;
}

/* Sample, report, feed back, until a stop. */
static int decode_loop(generator *g, const gen_params *p, size_t n_prompt, gen_rng *rng,
                       gen_token_fn fn, void *ctx, gen_result *res, shoal_err *err)
{
    gen_alt top[GEN_TOP_LOGPROBS_MAX];

    for (;;) {
        const float *l = next_logits(g, p, n_prompt, res->completion_tokens);
        uint32_t id = gen_sample(l, g->b.n_vocab, &p->s, rng, g->scratch);
        gen_token t = { .id = id, .is_eos = is_eos(p, id) };
        int rc;
        size_t done;

        if (p->logprobs) {
            double lse = gen_logsumexp(l, g->b.n_vocab);
            t.logprob = (float)((double)l[id] - lse);
            t.n_top = gen_top_logprobs(l, g->b.n_vocab, lse, (size_t)p->top_logprobs, top);
            t.top = top;
        }
        res->completion_tokens++;
        rc = fn ? fn(ctx, &t) : 0;
        if (rc < 0)
            return rc;
        if (t.is_eos || rc == 1) {
            res->finish = GEN_FINISH_STOP;
            return 0;
        }
        if ((p->max_tokens && res->completion_tokens >= p->max_tokens) ||
            g->live.n + 1 >= g->b.n_ctx) {
            res->finish = GEN_FINISH_LENGTH;
            return 0;
        }
        if (p->cancel && atomic_load(p->cancel)) {
            res->finish = GEN_FINISH_CANCELLED;
            return 0;
        }
        rc = live_run(g, &id, 1, 1, NULL, &done, err);
        if (rc != 0)
            return rc;
    }
}

int generator_run(generator *g, const uint32_t *prompt, size_t n, const gen_params *p,
                  gen_token_fn fn, void *ctx, gen_result *res, shoal_err *err)
{
    /* one backend call per session chunk: each layer sees the whole chunk
     * (its experts read once for it); cancellation is checked between */
    size_t reused = 0, done = 0,
           step = p->prefill_step ? p->prefill_step : g->b.chunk ? g->b.chunk : 64;
    uint64_t t0 = shoal_now_ns(), t1;
    gen_rng rng;
    int rc;

    memset(res, 0, sizeof *res);
    res->prompt_tokens = n;
    if (n == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "generate: empty prompt");
    if (n >= g->b.n_ctx)
        return shoal_err_set(err, SHOAL_ERANGE,
                             "prompt of %zu tokens does not fit the context of %zu", n, g->b.n_ctx);
    for (size_t i = 0; i < n; i++)
        if (prompt[i] >= g->b.n_vocab)
            return shoal_err_set(err, SHOAL_ERANGE, "token id %u is outside the vocabulary", prompt[i]);
    gen_rng_seed(&rng, p->has_seed ? p->seed : (uint64_t)shoal_wall_ms() ^ shoal_now_ns());

    rc = prepare_live(g, prompt, n, &reused, err);
    if (rc == 0)
        rc = live_run(g, prompt + reused, n - reused, step, p->cancel, &done, err);
    res->reused_tokens = reused;
    res->computed_tokens = done;
    g->st.runs++;
    g->st.prompt_tokens += n;
    g->st.reused_tokens += reused;
    g->st.computed_tokens += done;
    g->st.last_reused = reused;
    g->st.last_computed = done;
    t1 = shoal_now_ns();
    res->prefill_ns = t1 - t0;
    if (rc == SHOAL_ECANCELED) {
        res->finish = GEN_FINISH_CANCELLED;
        return 0;
    }
    if (rc != 0)
        return rc;
    LOG_DEBUG("generate", "prompt %zu tokens: %zu reused, %zu computed", n, reused, done);
    take_snapshot(g);
    {
        uint64_t run0 = g->run_ns;
        rc = decode_loop(g, p, n, &rng, fn, ctx, res, err);
        res->decode_model_ns = g->run_ns - run0;
    }
    g->st.completion_tokens += res->completion_tokens;
    res->decode_ns = shoal_now_ns() - t1;
    return rc;
}

/* ---- stop sequences -------------------------------------------------------------- */

struct gen_stop {
    char  *s[GEN_STOP_MAX];
    size_t len[GEN_STOP_MAX];
    size_t n;
    shoal_buf held;
    int matched;
};

gen_stop *gen_stop_new(const char *const *stops, size_t n)
{
    gen_stop *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    shoal_buf_init(&s->held, 0);
    for (size_t i = 0; i < n && s->n < GEN_STOP_MAX; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0)
            continue;
        if (!(s->s[s->n] = malloc(l + 1))) {
            gen_stop_free(s);
            return NULL;
        }
        memcpy(s->s[s->n], stops[i], l + 1);
        s->len[s->n++] = l;
    }
    return s;
}

void gen_stop_free(gen_stop *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        free(s->s[i]);
    shoal_buf_free(&s->held);
    free(s);
}

int gen_stop_push(gen_stop *s, const char *p, size_t n, shoal_buf *out)
{
    const char *h;
    size_t hl, first = SIZE_MAX, keep = 0;
    int rc;

    if (s->matched)
        return 1;
    if (s->n == 0)
        return shoal_buf_append(out, p, n);
    if ((rc = shoal_buf_append(&s->held, p, n)) != 0)
        return rc;
    h = (const char *)s->held.data;
    hl = s->held.len;
    for (size_t i = 0; i < s->n; i++) {
        const char *m = hl ? memmem(h, hl, s->s[i], s->len[i]) : NULL;
        if (m && (size_t)(m - h) < first)
            first = (size_t)(m - h);
    }
    if (first != SIZE_MAX) {
        s->matched = 1;
        rc = shoal_buf_append(out, h, first);
        shoal_buf_reset(&s->held);
        return rc ? rc : 1;
    }
    /* The longest tail that is a proper prefix of some stop string. */
    for (size_t i = 0; i < s->n; i++) {
        size_t max = s->len[i] - 1 < hl ? s->len[i] - 1 : hl;
        for (size_t k = max; k > keep; k--)
            if (memcmp(h + hl - k, s->s[i], k) == 0) {
                keep = k;
                break;
            }
    }
    rc = shoal_buf_append(out, h, hl - keep);
    if (rc == 0)
        shoal_buf_consume(&s->held, hl - keep);
    return rc;
}

int gen_stop_flush(gen_stop *s, shoal_buf *out)
{
    int rc = 0;
    if (!s->matched && s->held.len)
        rc = shoal_buf_append(out, s->held.data, s->held.len);
    shoal_buf_reset(&s->held);
    return rc;
}
