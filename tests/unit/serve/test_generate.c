/* test_generate.c — engine/serve/serve.h (generation) over a toy backend: greedy decoding,
 * conversation-state reuse from the snapshot and from the live state,
 * results identical with and without reuse, eos / callback stop /
 * max_tokens / context limits, cancellation, a failing backend, the PRNG's
 * documented sequence, sampling frequencies and top-p, penalties, top-k,
 * min-p, min_tokens, stop ids and log-probabilities against hand-computed
 * values, seeded reproducibility, and the stop-string matcher's hold-back.
 *
 * The toy model: a state is a running hash of the ids it has run; the
 * logits are a fixed function of that hash, so any two paths to the same
 * ids give the same logits, like a real model without rounding noise.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "engine/serve/serve.h"

#define NV 50
#define NCTX 64

typedef struct toy_state { uint64_t h; size_t pos; } toy_state;
typedef struct toy { size_t ran, news, copies; int fail_at; } toy;   /* fail_at: run call count */

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void toy_logits(uint64_t h, float *l)
{
    for (uint32_t i = 0; i < NV; i++)
        l[i] = (float)(mix(h * 131 + i) >> 40) / 16777216.0f * 8.0f;
}

static int t_new(void *impl, void **st, shoal_err *err)
{
    (void)err;
    ((toy *)impl)->news++;
    *st = calloc(1, sizeof(toy_state));
    return *st ? 0 : SHOAL_ENOMEM;
}

static void t_free(void *impl, void *st)
{
    (void)impl;
    free(st);
}

static int t_copy(void *impl, void *dst, const void *src, shoal_err *err)
{
    (void)err;
    ((toy *)impl)->copies++;
    memcpy(dst, src, sizeof(toy_state));
    return 0;
}

static int t_run(void *impl, void *st, const uint32_t *ids, size_t n, float *logits, shoal_err *err)
{
    toy *t = impl;
    toy_state *s = st;
    if (t->fail_at > 0 && --t->fail_at == 0)
        return shoal_err_set(err, SHOAL_EIO, "toy failure");
    for (size_t i = 0; i < n; i++) {
        s->h = mix(s->h ^ (ids[i] + 1));
        s->pos++;
    }
    t->ran += n;
    if (logits)
        toy_logits(s->h, logits);
    return 0;
}

static const gen_backend_ops TOY_OPS = { t_new, t_free, t_copy, t_run };

typedef struct rec {
    uint32_t ids[128];
    size_t n;
    int stop_after;        /* return 1 after this many (0: never) */
    atomic_int *cancel_at3;
} rec;

static int on_tok(void *ctx, const gen_token *t)
{
    rec *r = ctx;
    r->ids[r->n++] = t->id;
    if (r->cancel_at3 && r->n == 3)
        atomic_store(r->cancel_at3, 1);
    return r->stop_after && (int)r->n == r->stop_after ? 1 : 0;
}

static generator *make(toy *t)
{
    gen_backend b = { &TOY_OPS, t, NV, NCTX, 0 };   /* chunk 0: prefill steps of 64 */
    generator *g = NULL;
    shoal_err err;
    assert_int_equal(generator_new(&b, &g, &err), 0);
    return g;
}

static void run(generator *g, const uint32_t *p, size_t n, size_t max, rec *r, gen_result *res)
{
    gen_params gp;
    shoal_err err;
    gen_params_default(&gp);
    gp.max_tokens = max;
    memset(r, 0, sizeof *r);
    assert_int_equal(generator_run(g, p, n, &gp, on_tok, r, res, &err), 0);
}

/* Greedy by hand: hash the ids, argmax the logits, feed back. */
static void expected(const uint32_t *p, size_t n, size_t max, uint32_t *out)
{
    toy_state s = { 0, 0 };
    float l[NV];
    for (size_t i = 0; i < n; i++)
        s.h = mix(s.h ^ (p[i] + 1));
    for (size_t k = 0; k < max; k++) {
        uint32_t best = 0;
        toy_logits(s.h, l);
        for (uint32_t i = 1; i < NV; i++)
            if (l[i] > l[best])
                best = i;
        out[k] = best;
        s.h = mix(s.h ^ (best + 1));
    }
}

static void test_greedy_and_reuse(void **state)
{
    toy t = { 0 };
    generator *g = make(&t);
    uint32_t p1[3] = { 1, 2, 3 }, p2[5] = { 1, 2, 3, 9, 9 }, want[8], p3[16];
    gen_result res;
    gen_stats st;
    rec r;
    (void)state;

    run(g, p1, 3, 5, &r, &res);
    expected(p1, 3, 5, want);
    assert_int_equal(r.n, 5);
    assert_memory_equal(r.ids, want, 5 * sizeof *want);
    assert_int_equal(res.finish, GEN_FINISH_LENGTH);
    assert_int_equal(res.reused_tokens, 0);
    assert_int_equal(res.computed_tokens, 3);
    assert_int_equal(t.ran, 3 + 4);          /* the last token is not fed back */

    /* Extends the first prompt: continues from the snapshot. */
    t.ran = 0;
    run(g, p2, 5, 4, &r, &res);
    expected(p2, 5, 4, want);
    assert_memory_equal(r.ids, want, 4 * sizeof *want);
    assert_int_equal(res.reused_tokens, 3);
    assert_int_equal(res.computed_tokens, 2);
    assert_int_equal(t.ran, 2 + 3);

    /* Extends the live state (prompt + the tokens fed back). */
    memcpy(p3, p2, sizeof p2);
    memcpy(p3 + 5, r.ids, 3 * sizeof *p3);
    p3[8] = 7;
    t.ran = 0;
    run(g, p3, 9, 2, &r, &res);
    expected(p3, 9, 2, want);
    assert_memory_equal(r.ids, want, 2 * sizeof *want);
    assert_int_equal(res.reused_tokens, 8);
    assert_int_equal(res.computed_tokens, 1);

    /* The same prompt again: nothing to compute, same tokens. */
    t.ran = 0;
    run(g, p3, 9, 2, &r, &res);
    assert_memory_equal(r.ids, want, 2 * sizeof *want);
    assert_int_equal(res.reused_tokens, 9);
    assert_int_equal(res.computed_tokens, 0);
    assert_int_equal(t.ran, 1);

    /* Diverges inside the saved states: starts over. */
    p3[1] = 40;
    run(g, p3, 9, 1, &r, &res);
    assert_int_equal(res.reused_tokens, 0);
    assert_int_equal(res.computed_tokens, 9);
    generator_stats(g, &st);
    assert_int_equal(st.runs, 5);
    assert_int_equal(st.last_computed, 9);
    assert_int_equal(st.snap_tokens, 9);
    generator_free(g);
    generator_free(NULL);
}

static void test_limits(void **state)
{
    toy t = { 0 };
    generator *g = make(&t);
    uint32_t p[NCTX] = { 0 }, want[4];
    gen_params gp;
    gen_result res;
    shoal_err err;
    rec r;
    (void)state;

    /* eos: the first greedy token is made an eos id. */
    expected(p, 2, 1, want);
    gen_params_default(&gp);
    gp.eos = want;
    gp.n_eos = 1;
    memset(&r, 0, sizeof r);
    assert_int_equal(generator_run(g, p, 2, &gp, on_tok, &r, &res, &err), 0);
    assert_int_equal(res.completion_tokens, 1);
    assert_int_equal(res.finish, GEN_FINISH_STOP);

    /* the callback stops it */
    gen_params_default(&gp);
    memset(&r, 0, sizeof r);
    r.stop_after = 2;
    assert_int_equal(generator_run(g, p, 3, &gp, on_tok, &r, &res, &err), 0);
    assert_int_equal(res.completion_tokens, 2);
    assert_int_equal(res.finish, GEN_FINISH_STOP);

    /* the context: a 60-id prompt leaves room for 4 positions */
    memset(&r, 0, sizeof r);
    assert_int_equal(generator_run(g, p, 60, &gp, on_tok, &r, &res, &err), 0);
    assert_int_equal(res.finish, GEN_FINISH_LENGTH);
    assert_int_equal(res.completion_tokens, 4);

    assert_int_equal(generator_run(g, p, NCTX, &gp, on_tok, &r, &res, &err), SHOAL_ERANGE);
    assert_int_equal(generator_run(g, p, 0, &gp, on_tok, &r, &res, &err), SHOAL_EINVAL);
    p[1] = NV;
    assert_int_equal(generator_run(g, p, 3, &gp, on_tok, &r, &res, &err), SHOAL_ERANGE);
    generator_free(g);
}

static void test_cancel_and_failure(void **state)
{
    toy t = { 0 };
    generator *g = make(&t);
    uint32_t p[8] = { 5, 6, 7, 8, 9, 10, 11, 12 };
    atomic_int cancel;
    gen_params gp;
    gen_result res;
    shoal_err err;
    rec r;
    (void)state;

    atomic_init(&cancel, 0);
    gen_params_default(&gp);
    gp.cancel = &cancel;
    memset(&r, 0, sizeof r);
    r.cancel_at3 = &cancel;
    assert_int_equal(generator_run(g, p, 4, &gp, on_tok, &r, &res, &err), 0);
    assert_int_equal(res.finish, GEN_FINISH_CANCELLED);
    assert_int_equal(res.completion_tokens, 3);

    /* Cancelled before the prefill: nothing runs. */
    t.ran = 0;
    assert_int_equal(generator_run(g, p, 8, &gp, on_tok, &r, &res, &err), 0);
    assert_int_equal(res.finish, GEN_FINISH_CANCELLED);
    assert_int_equal(res.completion_tokens, 0);
    assert_int_equal(t.ran, 0);

    /* A failing backend fails the run; the next run starts afresh. */
    atomic_store(&cancel, 0);
    gp.cancel = NULL;
    gp.prefill_step = 2;
    t.fail_at = 2;
    assert_int_equal(generator_run(g, p, 8, &gp, on_tok, &r, &res, &err), SHOAL_EIO);
    t.news = 0;
    memset(&r, 0, sizeof r);
    gp.max_tokens = 2;
    assert_int_equal(generator_run(g, p, 8, &gp, on_tok, &r, &res, &err), 0);
    assert_int_equal(res.reused_tokens, 0);
    assert_true(t.news >= 1);
    {
        uint32_t want[2];
        expected(p, 8, 2, want);
        assert_memory_equal(r.ids, want, sizeof want);
    }
    generator_free(g);
}

static gen_sampling samp(double t, double top_p)
{
    gen_sampling s = { .temperature = t, .top_p = top_p };
    return s;
}

static void test_rng_and_sampling(void **state)
{
    gen_rng r;
    uint32_t scratch[4];
    gen_sampling s1 = samp(1.0, 1.0), s05 = samp(1.0, 0.5), s50 = samp(5.0, 0.0);
    gen_sampling g0 = samp(0.0, 1.0), s13 = samp(1.3, 0.9);
    float l[3] = { 0.0f, logf(3.0f), -INFINITY };
    int count[3] = { 0 };
    (void)state;

    /* xoshiro256** seeded by splitmix64(42), as documented. */
    gen_rng_seed(&r, 42);
    assert_true(gen_rng_next(&r) == 0x15780b2e0c2ec716ull);
    assert_true(gen_rng_next(&r) == 0x6104d9866d113a7eull);
    assert_true(gen_rng_next(&r) == 0xae17533239e499a1ull);

    gen_rng_seed(&r, 7);
    for (int i = 0; i < 20000; i++)
        count[gen_sample(l, 3, &s1, &r, scratch)]++;
    assert_int_equal(count[2], 0);
    assert_true(fabs(count[1] / 20000.0 - 0.75) < 0.02);
    /* top_p 0.5: only the most likely id (mass 0.75) is kept. */
    for (int i = 0; i < 100; i++)
        assert_int_equal(gen_sample(l, 3, &s05, &r, scratch), 1);
    assert_int_equal(gen_sample(l, 3, &s50, &r, scratch), 1);
    /* temperature 0: argmax, lowest id on ties */
    {
        float t[4] = { 1, 3, 3, 2 };
        assert_int_equal(gen_sample(t, 4, &g0, &r, scratch), 1);
    }
    /* Same seed, same draws. */
    {
        gen_rng a, b;
        gen_rng_seed(&a, 99);
        gen_rng_seed(&b, 99);
        for (int i = 0; i < 50; i++)
            assert_int_equal(gen_sample(l, 3, &s13, &a, scratch),
                             gen_sample(l, 3, &s13, &b, scratch));
    }
}

/* Penalties by hand: logits {2, 1, 0.5, -1, 3}, prompt {0, 3}, output
 * {1, 1, 3}; repetition 2, presence 0.5, frequency 0.25:
 *   id 0 (prompt, l > 0):        2 / 2                     =  1
 *   id 1 (output twice, l > 0):  1 / 2 - (0.25 * 2 + 0.5)  = -0.5
 *   id 2 (never seen):                                       0.5
 *   id 3 (prompt + output once): -1 * 2 - (0.25 + 0.5)     = -2.75
 *   id 4 (never seen):                                       3 */
static void test_penalties(void **state)
{
    float l[5] = { 2, 1, 0.5f, -1, 3 };
    uint32_t hist[5] = { 0, 3, 1, 1, 3 }, work[5] = { 0 };
    gen_penalties p = { .repetition = 2, .presence = 0.5, .frequency = 0.25 };
    const float want[5] = { 1, -0.5f, 0.5f, -2.75f, 3 };
    (void)state;

    gen_penalize(l, 5, hist, 5, 3, &p, work);
    for (int i = 0; i < 5; i++) {
        assert_float_equal(l[i], want[i], 1e-6);
        assert_int_equal(work[i], 0);        /* left zeroed */
    }
    /* repetition alone: the prompt counts, presence/frequency do not */
    {
        float m[5] = { 2, 1, 0.5f, -1, 3 };
        gen_penalties r = { .repetition = 4 };
        gen_penalize(m, 5, hist, 2, 0, &r, work);
        assert_float_equal(m[0], 0.5f, 1e-6);
        assert_float_equal(m[3], -4.0f, 1e-6);
        assert_float_equal(m[1], 1.0f, 1e-6);
    }
    /* frequency/presence count the output only; negative values reward */
    {
        float m[5] = { 0, 0, 0, 0, 0 };
        gen_penalties f = { .repetition = 1, .presence = -1, .frequency = 1 };
        gen_penalize(m, 5, hist, 5, 3, &f, work);
        assert_float_equal(m[0], 0.0f, 1e-6);   /* prompt only */
        assert_float_equal(m[1], -1.0f, 1e-6);  /* -(1 * 2 - 1) */
        assert_float_equal(m[3], 0.0f, 1e-6);   /* -(1 * 1 - 1) */
    }
}

/* Log-probabilities by hand: logits {0, ln 3, -inf} are p = {1/4, 3/4, 0}. */
static void test_logprobs(void **state)
{
    float l[3] = { 0.0f, logf(3.0f), -INFINITY };
    float t[4] = { 1, 2, 2, 0 };
    gen_alt top[GEN_TOP_LOGPROBS_MAX];
    double lse;
    (void)state;

    lse = gen_logsumexp(l, 3);
    assert_float_equal(lse, log(4.0), 1e-6);
    assert_int_equal(gen_top_logprobs(l, 3, lse, 2, top), 2);
    assert_int_equal(top[0].id, 1);
    assert_float_equal(top[0].logprob, log(0.75), 1e-6);
    assert_int_equal(top[1].id, 0);
    assert_float_equal(top[1].logprob, log(0.25), 1e-6);
    /* more than there are finite ids: the -inf one comes last */
    assert_int_equal(gen_top_logprobs(l, 3, lse, 5, top), 3);
    assert_int_equal(top[2].id, 2);
    assert_true(isinf(top[2].logprob) && top[2].logprob < 0);
    /* ties: the lower id first; k = 0 gives none */
    lse = gen_logsumexp(t, 4);
    assert_int_equal(gen_top_logprobs(t, 4, lse, 3, top), 3);
    assert_int_equal(top[0].id, 1);
    assert_int_equal(top[1].id, 2);
    assert_int_equal(top[2].id, 0);
    assert_float_equal(top[0].logprob, 2.0 - log(exp(1.0) + 2 * exp(2.0) + 1.0), 1e-6);
    assert_int_equal(gen_top_logprobs(t, 4, lse, 0, top), 0);
}

/* Frequencies of 20,000 seeded draws (deterministic: a fixed seed). */
static void draw_counts(const float *l, uint32_t n, const gen_sampling *s, int *count)
{
    gen_rng r;
    uint32_t scratch[8];
    gen_rng_seed(&r, 11);
    memset(count, 0, n * sizeof *count);
    for (int i = 0; i < 20000; i++)
        count[gen_sample(l, n, s, &r, scratch)]++;
}

/* Weights {1, 3, 2, 4} at temperature 1 (sorted: ids 3, 1, 2, 0). */
static void test_truncation(void **state)
{
    float l[4] = { 0.0f, logf(3.0f), logf(2.0f), logf(4.0f) };
    gen_sampling s = { .temperature = 1, .top_p = 1 };
    int c[4];
    (void)state;

    /* top_k 2: ids 3 and 1, p = 4/7, 3/7 */
    s.top_k = 2;
    draw_counts(l, 4, &s, c);
    assert_int_equal(c[0] + c[2], 0);
    assert_true(fabs(c[3] / 20000.0 - 4.0 / 7) < 0.02);
    /* min_p 0.45: weights >= 0.45 * 4 stay (ids 3, 1, 2), p = 4/9, 3/9, 2/9 */
    s.top_k = 0;
    s.min_p = 0.45;
    draw_counts(l, 4, &s, c);
    assert_int_equal(c[0], 0);
    assert_true(fabs(c[2] / 20000.0 - 2.0 / 9) < 0.02);
    /* top_p 0.75 then min_p 0.6: mass 0.4, 0.7, 0.9 keeps ids 3, 1, 2; then
     * 2/4 < 0.6 drops id 2: p = 4/7, 3/7 */
    s.top_p = 0.75;
    s.min_p = 0.6;
    draw_counts(l, 4, &s, c);
    assert_int_equal(c[0] + c[2], 0);
    assert_true(fabs(c[1] / 20000.0 - 3.0 / 7) < 0.02);
    /* top_k 1 is greedy whatever the temperature */
    s = (gen_sampling){ .temperature = 2, .top_p = 1, .top_k = 1 };
    draw_counts(l, 4, &s, c);
    assert_int_equal(c[3], 20000);
    /* temperature 2 flattens: p ~ w^(1/2) = {1, 1.73, 1.41, 2} / 6.15 */
    s.top_k = 0;
    draw_counts(l, 4, &s, c);
    assert_true(fabs(c[0] / 20000.0 - 1.0 / (1 + sqrt(3.0) + sqrt(2.0) + 2)) < 0.02);
    /* top_k over a larger vocabulary than it keeps: the heap selection */
    {
        float big[8] = { 5, 1, 7, 3, 7, 0, 2, 6 };
        gen_sampling k3 = { .temperature = 100, .top_p = 1, .top_k = 3 };
        int cb[8];
        draw_counts(big, 8, &k3, cb);
        assert_int_equal(cb[2] + cb[4] + cb[7], 20000);   /* the three largest */
        assert_true(cb[2] > 0 && cb[4] > 0 && cb[7] > 0);
    }
}

/* Runs with params through the toy; the first token's logits by hand. */
static void run_params(generator *g, const uint32_t *p, size_t n, gen_params *gp, rec *r,
                       gen_result *res)
{
    shoal_err err;
    memset(r, 0, sizeof *r);
    assert_int_equal(generator_run(g, p, n, gp, on_tok, r, res, &err), 0);
}

typedef struct lp_rec {
    rec r;
    float lp[16];
    gen_alt top0[3];
    size_t n_top0;
} lp_rec;

static int on_tok_lp(void *ctx, const gen_token *t)
{
    lp_rec *r = ctx;
    if (r->r.n == 0) {
        memcpy(r->top0, t->top, t->n_top * sizeof *t->top);
        r->n_top0 = t->n_top;
    }
    r->lp[r->r.n] = t->logprob;
    return on_tok(&r->r, t);
}

static void test_generator_sampling(void **state)
{
    toy t = { 0 };
    generator *g = make(&t);
    uint32_t p[4] = { 3, 1, 4, 1 }, want[1], eos[2];
    float l0[NV];
    toy_state st = { 0, 0 };
    gen_params gp;
    gen_result res;
    rec r;
    (void)state;

    for (size_t i = 0; i < 4; i++)
        st.h = mix(st.h ^ (p[i] + 1));
    toy_logits(st.h, l0);
    expected(p, 4, 1, want);

    /* min_tokens 3: the greedy first token is made the eos and is masked,
     * so the run goes on for at least 3 tokens */
    gen_params_default(&gp);
    eos[0] = want[0];
    gp.eos = eos;
    gp.n_eos = 1;
    gp.min_tokens = 3;
    gp.max_tokens = 10;
    run_params(g, p, 4, &gp, &r, &res);
    assert_true(r.n >= 3);
    for (size_t i = 0; i < 2; i++)
        assert_int_not_equal(r.ids[i], want[0]);
    {   /* the first is the second best of the model's logits */
        uint32_t second = want[0] == 0 ? 1 : 0;
        for (uint32_t i = 0; i < NV; i++)
            if (i != want[0] && l0[i] > l0[second])
                second = i;
        assert_int_equal(r.ids[0], second);
    }

    /* frequency penalty 100: a greedy run never repeats an output id
     * (toy logits are in [0, 8)); repetition 1e9 keeps the prompt's out */
    gen_params_default(&gp);
    gp.pen.frequency = 100;
    gp.pen.repetition = 1e9;
    gp.max_tokens = 12;
    run_params(g, p, 4, &gp, &r, &res);
    assert_int_equal(r.n, 12);
    for (size_t i = 0; i < r.n; i++) {
        for (size_t k = 0; k < i; k++)
            assert_int_not_equal(r.ids[i], r.ids[k]);
        for (size_t k = 0; k < 4; k++)
            assert_int_not_equal(r.ids[i], p[k]);
    }

    /* a stop id beside the eos ends the reply */
    gen_params_default(&gp);
    eos[0] = NV + 5;             /* never sampled */
    eos[1] = want[0];
    gp.eos = eos;
    gp.n_eos = 2;
    run_params(g, p, 4, &gp, &r, &res);
    assert_int_equal(r.n, 1);
    assert_int_equal(res.finish, GEN_FINISH_STOP);

    /* logprobs: the log-softmax of the model's logits (no penalty set) */
    {
        lp_rec lr;
        shoal_err err;
        double lse = 0, mx = l0[0];
        for (uint32_t i = 1; i < NV; i++)
            if (l0[i] > mx)
                mx = l0[i];
        for (uint32_t i = 0; i < NV; i++)
            lse += exp(l0[i] - mx);
        lse = mx + log(lse);
        gen_params_default(&gp);
        gp.logprobs = 1;
        gp.top_logprobs = 3;
        gp.max_tokens = 2;
        memset(&lr, 0, sizeof lr);
        assert_int_equal(generator_run(g, p, 4, &gp, on_tok_lp, &lr, &res, &err), 0);
        assert_int_equal(lr.r.ids[0], want[0]);
        assert_float_equal(lr.lp[0], l0[want[0]] - lse, 1e-5);
        assert_int_equal(lr.n_top0, 3);
        assert_int_equal(lr.top0[0].id, want[0]);
        assert_true(lr.top0[1].logprob <= lr.top0[0].logprob);
        assert_float_equal(lr.top0[2].logprob, l0[lr.top0[2].id] - lse, 1e-5);
    }

    /* seeded: the same parameters and seed give the same tokens */
    {
        rec a, b;
        gen_params_default(&gp);
        gp.s = (gen_sampling){ .temperature = 1.5, .top_p = 0.9, .top_k = 20, .min_p = 0.05 };
        gp.pen = (gen_penalties){ .repetition = 1.3, .presence = 0.4, .frequency = 0.2 };
        gp.seed = 77;
        gp.has_seed = 1;
        gp.max_tokens = 16;
        run_params(g, p, 4, &gp, &a, &res);
        run_params(g, p, 4, &gp, &b, &res);
        assert_int_equal(a.n, 16);
        assert_memory_equal(a.ids, b.ids, 16 * sizeof *a.ids);
        gp.seed = 78;
        run_params(g, p, 4, &gp, &b, &res);
        assert_memory_not_equal(a.ids, b.ids, 16 * sizeof *a.ids);
    }
    generator_free(g);
}

static void test_stop_strings(void **state)
{
    const char *stops[] = { "lo w", "", "\xC3\xA9" };
    gen_stop *s = gen_stop_new(stops, 3);
    shoal_buf out;
    (void)state;

    shoal_buf_init(&out, 0);
    assert_int_equal(gen_stop_push(s, "Hel", 3, &out), 0);
    assert_int_equal(out.len, 2);            /* "l" could start "lo w" */
    assert_int_equal(gen_stop_push(s, "lo wor", 6, &out), 1);
    assert_string_equal((const char *)out.data, "Hel");
    assert_int_equal(gen_stop_push(s, "more", 4, &out), 1);
    assert_int_equal(gen_stop_flush(s, &out), 0);
    assert_string_equal((const char *)out.data, "Hel");
    gen_stop_free(s);

    /* No match: held text comes out once it cannot start a stop. */
    s = gen_stop_new(stops, 3);
    shoal_buf_reset(&out);
    assert_int_equal(gen_stop_push(s, "xxlo", 4, &out), 0);
    assert_string_equal((const char *)out.data, "xx");
    assert_int_equal(gen_stop_push(s, "!", 1, &out), 0);
    assert_string_equal((const char *)out.data, "xxlo!");
    /* A stop split inside a character. */
    assert_int_equal(gen_stop_push(s, "a\xC3", 2, &out), 0);
    assert_string_equal((const char *)out.data, "xxlo!a");
    assert_int_equal(gen_stop_push(s, "\xA9z", 2, &out), 1);
    assert_string_equal((const char *)out.data, "xxlo!a");
    gen_stop_free(s);

    /* End of text: what was held is emitted. */
    s = gen_stop_new(stops, 1);
    shoal_buf_reset(&out);
    assert_int_equal(gen_stop_push(s, "hello", 5, &out), 0);
    assert_string_equal((const char *)out.data, "hel");
    assert_int_equal(gen_stop_flush(s, &out), 0);
    assert_string_equal((const char *)out.data, "hello");
    gen_stop_free(s);
    gen_stop_free(NULL);

    /* No stop strings: everything passes at once. */
    s = gen_stop_new(NULL, 0);
    shoal_buf_reset(&out);
    assert_int_equal(gen_stop_push(s, "lo w", 4, &out), 0);
    assert_string_equal((const char *)out.data, "lo w");
    gen_stop_free(s);
    shoal_buf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_reuse),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_cancel_and_failure),
        cmocka_unit_test(test_rng_and_sampling),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_generator_sampling),
        cmocka_unit_test(test_stop_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
