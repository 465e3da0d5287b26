/* bench/attn — the attention kernels at K3 width, 2 threads, as ratios to
 * baselines measured in the same run.
 *
 *   MLA decode (96 heads, kl 512, rope 64) with 4k, 32k and 128k cached
 *   positions: time per layer per token against
 *     - cache bytes / STREAM read (2 threads, a buffer as large as the
 *       caches cycled) — issue 16's target 1.5;
 *     - the kernel's FMAs / the FMA peak of the same ISA (2 threads of
 *       independent FMA chains): MLA at 96 heads does 2·96·(576 + 512)
 *       flops per 2,304-byte row, ~90 flops per byte, so its floor on a
 *       CPU is the FMA rate, not the memory;
 *     - the engine's old code (scalar double, per head and position,
 *       heads split between threads) for 4k and 32k.
 *   bf16 and f16 caches at 32k against f32; a 64-token chunk at 4k per
 *   token against decode; the expanded form against the absorbed one for
 *   chunks of 64 and 256 tokens, as a whole prompt and at 4k.  KDA step at K3 width (96 heads x 128 x 128)
 *   the conv + SiLU (3 x 12,288 channels) and the decay gate against the
 *   engine's old code (engine_kda_step and layers.c's loops).
 * Caches (and KDA states) of several layers are cycled, as a decode step
 * walks the layers, so nothing stays in the caches between calls: at
 * least ~600 MB, at most 24 MLA / 69 KDA layers (K3's counts).  Each
 * figure is the median-ratio round of ROUNDS rounds of (baseline, pass,
 * baseline).  SHOAL_BENCH_QUICK=1: fewer positions and rounds.
 */
#include "bench/lib/bench.h"
#include "engine/kernels/kernels.h"
#include "engine/forward/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define THREADS 2
#define H 96
#define KL 512
#define ROPE 64
#define NOPE 128
#define QK (NOPE + ROPE)
#define ROUNDS 5
#define CYCLE_BYTES (600.0 * 1e6)

static int quick;
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static double rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0 - 0.5;
}

static float *floats(size_t n, double scale)
{
    float *x = malloc(n * sizeof *x);
    if (x)
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(rnd() * scale);
    return x;
}

/* ---- baselines ------------------------------------------------------------------- */

/* FMA peak in GFMA/s of one ISA on every thread of the pool: 24
 * independent chains per thread (enough to cover the FMA latency). */
struct peak_arg {
    kernels_isa isa;
    long iters;
    double sink[64];
};

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static double peak_avx512(long iters)
{
    __m512 x[24], m = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 24; i++)
        x[i] = _mm512_set1_ps(1.0f + (float)i * 1e-3f);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++)
            x[i] = _mm512_fmadd_ps(x[i], m, b);
    for (int i = 1; i < 24; i++)
        x[0] = _mm512_add_ps(x[0], x[i]);
    return _mm512_reduce_add_ps(x[0]);
}

__attribute__((target("avx2,fma"))) static double peak_avx2(long iters)
{
    __m256 x[12], m = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    float out[8];
    for (int i = 0; i < 12; i++)
        x[i] = _mm256_set1_ps(1.0f + (float)i * 1e-3f);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            x[i] = _mm256_fmadd_ps(x[i], m, b);
    for (int i = 1; i < 12; i++)
        x[0] = _mm256_add_ps(x[0], x[i]);
    _mm256_storeu_ps(out, x[0]);
    return out[0] + out[7];
}
#endif

static void peak_task(void *ctx, int tid, int nthreads)
{
    struct peak_arg *pa = ctx;
    (void)nthreads;
#if defined(__x86_64__)
    pa->sink[tid] = pa->isa == KERNELS_ISA_AVX512VNNI ? peak_avx512(pa->iters) : peak_avx2(2 * pa->iters);
#else
    pa->sink[tid] = 0;
#endif
}

/* GFMA/s of `isa` on the pool, 0 where there is no SIMD peak to measure. */
static double fma_peak(kernels_pool *pool, kernels_isa isa)
{
    struct peak_arg pa = { isa, 2000000, { 0 } };
    if (isa != KERNELS_ISA_AVX512VNNI && isa != KERNELS_ISA_AVX2)
        return 0;
    double t0 = bench_now();
    kernels_pool_run(pool, peak_task, &pa);
    double dt = bench_now() - t0;
    /* per thread: iters x 24 x 16 FMAs (AVX-512) or 2 iters x 12 x 8 (AVX2) */
    double per = isa == KERNELS_ISA_AVX512VNNI ? 24.0 * 16 : 2.0 * 12 * 8;
    return (double)pa.iters * per * kernels_pool_nthreads(pool) / dt / 1e9;
}

/* ---- MLA -------------------------------------------------------------------------- */

struct mla_setup {
    size_t P, layers, cbytes;      /* positions, caches cycled, bytes of one layer's cache */
    kernels_kv_type type;
    void **c, **r;
    float *qa, *q, *ctx;           /* [64][H][KL], [64][H][QK], [64][H][KL] */
    kernels_mla_ws *ws;
    kernels_pool *pool;
};

static int mla_setup_make(struct mla_setup *m, size_t P, kernels_kv_type type, kernels_pool *pool)
{
    size_t es = kernels_kv_size(type);
    float *tmp = malloc(P * KL * sizeof *tmp);

    memset(m, 0, sizeof *m);
    m->P = P;
    m->type = type;
    m->pool = pool;
    m->cbytes = P * (KL + ROPE) * es;
    m->layers = (size_t)ceil(CYCLE_BYTES / (double)m->cbytes);
    m->layers = m->layers > 24 ? 24 : m->layers < 1 ? 1 : m->layers;
    if (quick)
        m->layers = 1;
    m->c = calloc(m->layers, sizeof *m->c);
    m->r = calloc(m->layers, sizeof *m->r);
    m->qa = floats(64 * H * KL, 0.8);
    m->q = floats(64 * H * QK, 0.8);
    m->ctx = malloc(64 * H * KL * sizeof(float));
    m->ws = kernels_mla_ws_new(H, KL, ROPE, 64, THREADS);
    if (!tmp || !m->c || !m->r || !m->qa || !m->q || !m->ctx || !m->ws)
        return free(tmp), -1;
    for (size_t L = 0; L < m->layers; L++) {
        m->c[L] = malloc(P * KL * es);
        m->r[L] = malloc(P * ROPE * es);
        if (!m->c[L] || !m->r[L])
            return free(tmp), -1;
        for (size_t i = 0; i < P * KL; i++)
            tmp[i] = (float)(rnd() * 3.4);
        kernels_kv_store(type, tmp, m->c[L], P * KL);
        for (size_t i = 0; i < P * ROPE; i++)
            tmp[i] = (float)(rnd() * 3.4);
        kernels_kv_store(type, tmp, m->r[L], P * ROPE);
    }
    free(tmp);
    return 0;
}

static void mla_setup_free(struct mla_setup *m)
{
    for (size_t L = 0; m->c && L < m->layers; L++) {
        free(m->c[L]);
        free(m->r[L]);
    }
    free(m->c);
    free(m->r);
    free(m->qa);
    free(m->q);
    free(m->ctx);
    kernels_mla_ws_free(m->ws);
}

/* n tokens at the end of every layer's cache; seconds per layer. */
static double mla_pass(struct mla_setup *m, size_t n)
{
    double t0 = bench_now();
    for (size_t L = 0; L < m->layers; L++) {
        kernels_mla a = { H, KL, ROPE, m->type, m->c[L], m->r[L], m->P - n, n, m->qa,
                          m->q + NOPE, H * QK, QK, (float)(1.0 / sqrt((double)QK)), m->ctx };
        kernels_mla_attend(m->ws, m->pool, &a, NULL);
    }
    return (bench_now() - t0) / (double)m->layers;
}

/* The engine's MLA attention before issue 16 (layers.c, mla_attend_run):
 * per (token, head) item, scores in double over every position, softmax,
 * the weighted sum; items split between threads. */
struct old_mla {
    const struct mla_setup *m;
    size_t L, n;
    float *score;   /* [THREADS][P] */
};

static void old_mla_run(void *ctx, int tid, int nthreads)
{
    struct old_mla *j = ctx;
    const struct mla_setup *m = j->m;
    const float *cc = m->c[j->L], *rr = m->r[j->L];
    double scale = 1.0 / sqrt((double)QK);
    float *p = j->score + (size_t)tid * m->P;

    for (size_t item = (size_t)tid; item < j->n * H; item += (size_t)nthreads) {
        size_t t = item / H, hh = item % H, len = m->P - j->n + t + 1;
        const float *qa = m->qa + (t * H + hh) * KL, *qx = m->q + t * H * QK + hh * QK + NOPE;
        float *cx = m->ctx + (t * H + hh) * KL;
        double mx = -INFINITY, sum = 0;
        for (size_t sp = 0; sp < len; sp++) {
            double acc = 0;
            for (size_t l = 0; l < KL; l++)
                acc += (double)qa[l] * cc[sp * KL + l];
            for (size_t r = 0; r < ROPE; r++)
                acc += (double)qx[r] * rr[sp * ROPE + r];
            p[sp] = (float)(acc * scale);
            if (p[sp] > mx)
                mx = p[sp];
        }
        for (size_t sp = 0; sp < len; sp++) {
            p[sp] = (float)exp(p[sp] - mx);
            sum += p[sp];
        }
        for (size_t l = 0; l < KL; l++)
            cx[l] = 0;
        for (size_t sp = 0; sp < len; sp++) {
            float pw = (float)(p[sp] / sum);
            for (size_t l = 0; l < KL; l++)
                cx[l] += pw * cc[sp * KL + l];
        }
    }
}

static double old_mla_time(struct mla_setup *m)
{
    struct old_mla j = { m, 0, 1, malloc(THREADS * m->P * sizeof(float)) };
    double t0 = bench_now();
    if (!j.score)
        return 0;
    kernels_pool_run(m->pool, old_mla_run, &j);
    t0 = bench_now() - t0;
    free(j.score);
    return t0;
}

/* ROUNDS x (baseline, pass, baseline) -> the median round by ratio of the
 * pass's time to the baseline's (time) figure.  base(ctx) returns the
 * baseline in seconds for this pass. */
typedef double (*base_fn)(void *ctx);

static void median_round(double (*pass)(void *), void *pctx, base_fn base, void *bctx,
                         double *t, double *b)
{
    double ts[ROUNDS], bs[ROUNDS], r[ROUNDS];
    int order[ROUNDS], rounds = quick ? 1 : ROUNDS;

    pass(pctx);  /* warm-up: pool, page tables */
    for (int i = 0; i < rounds; i++) {
        double b0 = base(bctx);
        ts[i] = pass(pctx);
        bs[i] = (b0 + base(bctx)) / 2;
        r[i] = ts[i] / bs[i];
        order[i] = i;
    }
    for (int i = 1; i < rounds; i++)
        for (int j = i; j > 0 && r[order[j]] < r[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    *t = ts[order[rounds / 2]];
    *b = bs[order[rounds / 2]];
}

struct mla_pass_arg {
    struct mla_setup *m;
    size_t n;
};

static double mla_pass_fn(void *ctx)
{
    struct mla_pass_arg *a = ctx;
    return mla_pass(a->m, a->n) / (double)a->n;
}

/* Baselines in seconds for one layer's pass over one token. */
struct mla_base {
    struct mla_setup *m;
    kernels_isa isa;
};

static double stream_base(void *ctx)
{
    struct mla_base *b = ctx;
    double bytes = (double)b->m->cbytes * (double)b->m->layers;
    return (double)b->m->cbytes / (bench_stream_read_gbps((size_t)bytes, THREADS, 2) * 1e9);
}

static double fma_base(void *ctx)
{
    struct mla_base *b = ctx;
    double fmas = (double)b->m->P * H * (KL + ROPE + KL);
    return fmas / (fma_peak(b->m->pool, b->isa) * 1e9);
}

static void bench_mla_isa(struct mla_setup *m, kernels_isa isa, const char *tag, double target)
{
    struct mla_pass_arg pa = { m, 1 };
    struct mla_base mb = { m, isa };
    char name[96];
    double t, b;

    if (kernels_set_isa(isa, NULL) != 0)
        return;
    median_round(mla_pass_fn, &pa, stream_base, &mb, &t, &b);
    snprintf(name, sizeof name, "attn.mla_decode_%s_%s", tag, kernels_isa_name(isa));
    bench_record(name, t, "s", "cache bytes / STREAM read, 2 threads", b, "lower", target);
    if (fma_peak(m->pool, isa) > 0) {
        median_round(mla_pass_fn, &pa, fma_base, &mb, &t, &b);
        snprintf(name, sizeof name, "attn.mla_decode_%s_%s_vs_fma_peak", tag, kernels_isa_name(isa));
        bench_record(name, t, "s", "FMAs / FMA peak, 2 threads", b, "lower", 1.5);
    }
}

static void bench_mla(kernels_pool *pool)
{
    static const size_t Ps[] = { 4096, 32768, 131072 };
    static const char *const tags[] = { "4k", "32k", "128k" };
    kernels_isa best = kernels_init();

    for (size_t pi = 0; pi < 3; pi++) {
        struct mla_setup m;
        size_t P = quick ? Ps[pi] / 16 : Ps[pi];
        if (mla_setup_make(&m, P, KERNELS_KV_F32, pool) != 0) {
            fprintf(stderr, "bench attn: no memory for %zu positions\n", P);
            mla_setup_free(&m);
            continue;
        }
        printf("attn: %zu positions, %zu layer caches of %.1f MB cycled\n", P, m.layers,
               (double)m.cbytes / 1e6);
        bench_mla_isa(&m, best, tags[pi], pi < 2 ? 1.5 : 0);
        if (pi < 2 && best != KERNELS_ISA_AVX2)
            bench_mla_isa(&m, KERNELS_ISA_AVX2, tags[pi], pi < 2 ? 1.5 : 0);
        kernels_set_isa(best, NULL);
        if (pi < 2) {
            struct mla_pass_arg pa = { &m, 1 };
            double tnew = 1e30, told = old_mla_time(&m);
            for (int i = 0; i < 3; i++) {
                double x = mla_pass_fn(&pa);
                tnew = x < tnew ? x : tnew;
            }
            char name[96];
            snprintf(name, sizeof name, "attn.mla_decode_%s_%s_vs_scalar_double", tags[pi],
                     kernels_isa_name(best));
            bench_record(name, tnew, "s", "old kernel (scalar double, 2 threads)", told, "lower", 0);
        }
        if (pi == 0) {
            /* a 64-token chunk ending at 4k, per token, against decode */
            struct mla_pass_arg pc = { &m, 64 }, pd = { &m, 1 };
            double tc = 1e30, td = 1e30;
            for (int i = 0; i < (quick ? 1 : 3); i++) {
                double x = mla_pass_fn(&pc), y = mla_pass_fn(&pd);
                tc = x < tc ? x : tc;
                td = y < td ? y : td;
            }
            bench_record("attn.mla_chunk64_4k_per_token", tc, "s", "decode at 4k, per token", td,
                         "lower", 0);
        }
        if (pi == 1) {
            double tf = 1e30;
            struct mla_pass_arg pa = { &m, 1 };
            for (int i = 0; i < 3; i++) {
                double x = mla_pass_fn(&pa);
                tf = x < tf ? x : tf;
            }
            for (int ty = KERNELS_KV_BF16; ty <= KERNELS_KV_F16; ty++) {
                struct mla_setup mh;
                if (mla_setup_make(&mh, P, (kernels_kv_type)ty, pool) == 0) {
                    struct mla_pass_arg ph = { &mh, 1 };
                    double th = 1e30;
                    char name[96];
                    for (int i = 0; i < 3; i++) {
                        double x = mla_pass_fn(&ph);
                        th = x < th ? x : th;
                    }
                    snprintf(name, sizeof name, "attn.mla_decode_32k_%s_cache_%s",
                             ty == KERNELS_KV_BF16 ? "bf16" : "f16", kernels_isa_name(best));
                    bench_record(name, th, "s", "f32 cache", tf, "lower", 0);
                }
                mla_setup_free(&mh);
            }
        }
        mla_setup_free(&m);
    }
}

/* ---- MLA: expanded against absorbed ----------------------------------------------------- */

/* n tokens ending at P positions: the expanded form against the absorbed
 * one (the attention kernels only: the absorbed form's q_abs and W_UV
 * projections, 2·2·128·512 flops per token and head, come on top). */
static void bench_expanded(kernels_pool *pool, size_t n, size_t P)
{
    float *c = floats(P * KL, 3.4), *r = floats(P * ROPE, 3.4), *qa = floats(n * H * KL, 0.8);
    float *q = floats(n * H * QK, 0.8), *w = floats((size_t)H * (NOPE + 128) * KL, 0.09);
    float *ctx = malloc(n * H * KL * sizeof(float)), *o = malloc(n * H * 128 * sizeof(float));
    kernels_mla_ws *ws = kernels_mla_ws_new(H, KL, ROPE, n, THREADS);
    kernels_mla_xws *xws = kernels_mla_xws_new(H, KL, ROPE, NOPE, 128, n, THREADS);
    double ta = 1e30, tx = 1e30;
    char name[96];

    if (!c || !r || !qa || !q || !w || !ctx || !o || !ws || !xws) {
        fprintf(stderr, "bench attn: no memory for the expanded form\n");
        goto out;
    }
    kernels_mla a = { H, KL, ROPE, KERNELS_KV_F32, c, r, P - n, n, qa, q + NOPE, H * QK, QK,
                      0.0722f, ctx };
    kernels_mla_x x = { H, KL, ROPE, NOPE, 128, KERNELS_KV_F32, c, r, P - n, n, q, H * QK, QK,
                        q + NOPE, H * QK, QK, w, 0.0722f, o };
    for (int i = 0; i < (quick ? 1 : 2); i++) {
        double t0 = bench_now();
        kernels_mla_attend(ws, pool, &a, NULL);
        double t1 = bench_now();
        kernels_mla_expanded(xws, pool, &x, NULL);
        double t2 = bench_now();
        ta = t1 - t0 < ta ? t1 - t0 : ta;
        tx = t2 - t1 < tx ? t2 - t1 : tx;
    }
    snprintf(name, sizeof name, "attn.mla_expanded_n%zu_p%zu_%s", n, P, kernels_isa_name(kernels_get_isa()));
    bench_record(name, tx, "s", "absorbed form, same call", ta, "lower", 0);
out:
    free(c);
    free(r);
    free(qa);
    free(q);
    free(w);
    free(ctx);
    free(o);
    kernels_mla_ws_free(ws);
    kernels_mla_xws_free(xws);
}

/* ---- KDA ---------------------------------------------------------------------------- */

#define DK 128
#define KP (H * DK)

struct kda_setup {
    size_t layers;
    float **S;
    float *q, *k, *v, *alpha, *beta, *o, *tmp;
    kernels_pool *pool;
};

struct old_kda {
    struct kda_setup *s;
    size_t L;
};

/* The engine's recurrence before issue 16 (layers.c, kda_heads_run). */
static void old_kda_run(void *ctx, int tid, int nthreads)
{
    struct old_kda *j = ctx;
    struct kda_setup *s = j->s;
    for (size_t h = (size_t)tid; h < H; h += (size_t)nthreads)
        engine_kda_step(s->S[j->L] + h * DK * DK, s->q + h * DK, s->k + h * DK, s->v + h * DK,
                        s->alpha + h * DK, s->beta[h], DK, DK, s->o + h * DK,
                        s->tmp + (size_t)tid * DK);
}

static double kda_pass(void *ctx)
{
    struct kda_setup *s = ctx;
    double t0 = bench_now();
    for (size_t L = 0; L < s->layers; L++) {
        kernels_kda a = { H, DK, DK, s->S[L], 1, s->q, s->k, s->alpha, s->v, s->beta, s->o };
        kernels_kda_step(s->pool, &a, NULL);
    }
    return (bench_now() - t0) / (double)s->layers;
}

static double old_kda_pass(void *ctx)
{
    struct kda_setup *s = ctx;
    double t0 = bench_now();
    for (size_t L = 0; L < s->layers; L++) {
        struct old_kda j = { s, L };
        kernels_pool_run(s->pool, old_kda_run, &j);
    }
    return (bench_now() - t0) / (double)s->layers;
}

static double kda_stream_base(void *ctx)
{
    struct kda_setup *s = ctx;
    double bytes = (double)H * DK * DK * sizeof(float);
    /* the state is read and written once per token */
    return 2 * bytes / (bench_stream_read_gbps((size_t)(bytes * (double)s->layers), THREADS, 2) * 1e9);
}

/* The conv + SiLU before issue 16 (layers.c, kda_conv). */
static void old_conv(float *x, size_t n, size_t p, size_t kw, const float *taps, float *win)
{
    for (size_t t = 0; t < n; t++) {
        float *xt = x + t * p;
        for (size_t ch = 0; ch < p; ch++) {
            const float *tp = taps + ch * kw;
            float in = xt[ch], y = 0;
            for (size_t j = 0; j + 1 < kw; j++)
                y += tp[j] * win[j * p + ch];
            y += tp[kw - 1] * in;
            for (size_t j = 0; j + 2 < kw; j++)
                win[j * p + ch] = win[(j + 1) * p + ch];
            if (kw > 1)
                win[(kw - 2) * p + ch] = in;
            xt[ch] = y * engine_sigmoid(y);
        }
    }
}

static void bench_conv(kernels_pool *pool)
{
    float *x = floats(3 * KP, 4), *taps = floats(4 * KP, 1), *tk = malloc(4 * KP * sizeof(float));
    float *win = floats(3 * KP, 4);
    double tn = 1e30, to = 1e30;
    if (!x || !taps || !tk || !win)
        goto out;
    kernels_kda_conv_taps(taps, KP, 4, tk);
    for (int r = 0; r < 20; r++) {
        double t0 = bench_now();
        for (int a = 0; a < 3; a++)
            kernels_kda_conv(pool, x + a * KP, 1, KP, 4, tk, win);
        double t1 = bench_now();
        for (int a = 0; a < 3; a++)
            old_conv(x + a * KP, 1, KP, 4, taps, win);
        double t2 = bench_now();
        tn = t1 - t0 < tn ? t1 - t0 : tn;
        to = t2 - t1 < to ? t2 - t1 : to;
        for (size_t i = 0; i < 3 * KP; i++)  /* keep the values in range */
            x[i] = (float)(rnd() * 4);
    }
    bench_record("attn.kda_conv_k3", tn, "s", "old loop (scalar, libm expf, 1 thread)", to, "lower", 0);
    /* the decay gate over the same 12,288 channels */
    kernels_kda_decay(pool, x, 1, KP, taps, taps + KP, -5.0f);  /* warm-up */
    tn = to = 1e30;
    for (int r = 0; r < 20; r++) {
        for (size_t i = 0; i < KP; i++)
            x[i] = (float)(rnd() * 4);
        double t0 = bench_now();
        kernels_kda_decay(pool, x, 1, KP, taps, taps + KP, -5.0f);
        double t1 = bench_now();
        for (size_t c = 0; c < KP; c++)
            x[KP + c] = expf(-5.0f * engine_sigmoid(taps[c] * (x[KP + c] + taps[KP + c])));
        double t2 = bench_now();
        tn = t1 - t0 < tn ? t1 - t0 : tn;
        to = t2 - t1 < to ? t2 - t1 : to;
    }
    bench_record("attn.kda_decay_k3", tn, "s", "old loop (scalar, libm expf, 1 thread)", to, "lower", 0);
out:
    free(x);
    free(taps);
    free(tk);
    free(win);
}

static void bench_kda(kernels_pool *pool)
{
    struct kda_setup s = { 0 };
    size_t ns = (size_t)H * DK * DK;
    double t, b, told, bold;

    s.pool = pool;
    s.layers = quick ? 2 : 69;
    s.S = calloc(s.layers, sizeof *s.S);
    s.q = floats(KP, 0.1);
    s.k = floats(KP, 0.1);
    s.v = floats(KP, 1);
    s.alpha = floats(KP, 0.02);
    s.beta = floats(H, 0.5);
    s.o = malloc(KP * sizeof(float));
    s.tmp = malloc(THREADS * DK * sizeof(float));
    if (!s.S || !s.q || !s.k || !s.v || !s.alpha || !s.beta || !s.o || !s.tmp)
        goto out;
    for (size_t i = 0; i < KP; i++)
        s.alpha[i] += 0.99f;  /* decays near 1 keep the state bounded */
    for (size_t i = 0; i < H; i++)
        s.beta[i] += 0.5f;
    for (size_t L = 0; L < s.layers; L++)
        if (!(s.S[L] = floats(ns, 0.1)))
            goto out;
    median_round(kda_pass, &s, kda_stream_base, &s, &t, &b);
    char name[96];
    snprintf(name, sizeof name, "attn.kda_step_k3_%s", kernels_isa_name(kernels_get_isa()));
    bench_record(name, t, "s", "state bytes read + written / STREAM read, 2 threads", b, "lower", 0);
    median_round(old_kda_pass, &s, kda_stream_base, &s, &told, &bold);
    snprintf(name, sizeof name, "attn.kda_step_k3_%s_vs_old", kernels_isa_name(kernels_get_isa()));
    bench_record(name, t, "s", "engine_kda_step (scalar, 2 threads)", told, "lower", 0);
out:
    for (size_t L = 0; s.S && L < s.layers; L++)
        free(s.S[L]);
    free(s.S);
    free(s.q);
    free(s.k);
    free(s.v);
    free(s.alpha);
    free(s.beta);
    free(s.o);
    free(s.tmp);
}

int main(void)
{
    const char *q = getenv("SHOAL_BENCH_QUICK");
    kernels_pool *pool = kernels_pool_new(THREADS);

    quick = q && q[0] == '1';
    if (!pool) {
        fprintf(stderr, "bench attn: no thread pool\n");
        return 1;
    }
    printf("attn: isa %s, %d threads\n", kernels_isa_name(kernels_init()), THREADS);
    bench_mla(pool);
    {
        static const size_t grid[][2] = { { 64, 64 }, { 64, 4096 }, { 256, 256 }, { 256, 4096 } };
        for (size_t i = 0; i < sizeof grid / sizeof grid[0]; i++)
            bench_expanded(pool, quick ? grid[i][0] / 4 : grid[i][0], quick ? grid[i][1] / 4 : grid[i][1]);
    }
    bench_kda(pool);
    bench_conv(pool);
    kernels_pool_free(pool);
    return 0;
}
