/* bench/kernels — MXFP4 and int8 products on weights streamed from DRAM,
 * as ratios to a STREAM-style read measured right before and after each
 * figure (this machine's bandwidth swings 20-30% between runs).
 *
 *   MXFP4 matrix-vector over K3 slice experts (w1, w3: 3072x3584; w2:
 *   3584x3072), 40 experts (~700 MB, far beyond the caches) cycled, 2
 *   threads; every ISA variant, fast and exact.  Target: 0.6x STREAM
 *   (0.75x for the VNNI variant).
 *   int8 spine product over ~700 MB of [12288, 7168] matrices: 0.5x.
 *   Matrix-matrix speedup per vector, n = 16 and 64, vs n matrix-vector
 *   calls.  The fused expert helper vs three separate products.
 * Robustness on a shared, noisy machine: each bandwidth figure is measured
 * in ROUNDS rounds of (STREAM, one kernel pass, STREAM); each round gives a
 * ratio to the mean of its own two STREAM reads, and the round with the
 * median ratio is reported (value and baseline from that round), so one
 * burst of contention neither sinks nor inflates a figure.
 * SHOAL_BENCH_QUICK=1 shrinks the buffers for a smoke run.
 */
#include "bench/lib/bench.h"
#include "engine/kernels/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define I_DIM 3072
#define L_DIM 3584
#define THREADS 2
#define PASSES 3
#define ROUNDS 5

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void fill_random(uint8_t *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rnd();
        memcpy(p + i, &v, 8);
    }
    for (; i < n; i++)
        p[i] = (uint8_t)rnd();
}

static void fill_floats(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(rnd() >> 11) / 9007199254740992.0 - 0.5);
}

struct setup {
    size_t nexp, span;
    uint8_t *experts;          /* nexp spans back to back */
    kernels_expert *views;
    kernels_pool *pool;
    kernels_act *az, *ah;      /* z [L], h [I], n up to 64 */
    float *z, *h, *y;          /* [64][L] each (L > I) */
    size_t stream_bytes;
};

/* STREAM-style read over a buffer as large as the weights, best of 2. */
static double stream_gbps(const struct setup *s)
{
    return bench_stream_read_gbps(s->stream_bytes, THREADS, 2);
}

/* One timed pass over some weights; returns seconds. */
typedef double (*pass_fn)(struct setup *s, const void *arg);

/* ROUNDS x (STREAM, pass, STREAM); the median round by ratio.  `bytes`
 * is what one pass reads.  Sets *gbps and *base (mean STREAM of that round). */
static void measure(struct setup *s, pass_fn fn, const void *arg, double bytes,
                    double *gbps, double *base)
{
    double g[ROUNDS], b[ROUNDS], r[ROUNDS];
    int order[ROUNDS];

    fn(s, arg);  /* warm-up: page tables, caches, pool threads */
    for (int i = 0; i < ROUNDS; i++) {
        double before = stream_gbps(s), t = fn(s, arg), after = stream_gbps(s);
        g[i] = bytes / t / 1e9;
        b[i] = (before + after) / 2;
        r[i] = g[i] / b[i];
        order[i] = i;
    }
    for (int i = 1; i < ROUNDS; i++)  /* insertion sort by ratio */
        for (int j = i; j > 0 && r[order[j]] < r[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    *gbps = g[order[ROUNDS / 2]];
    *base = b[order[ROUNDS / 2]];
}

struct mv_arg {
    kernels_numerics mode;
    size_t nexp;
};

/* One pass: every expert, w1·z, w3·z, w2·h as separate products. */
static double pass_mv(struct setup *s, const void *argp)
{
    const struct mv_arg *arg = argp;
    double t0 = bench_now();
    for (size_t e = 0; e < arg->nexp; e++) {
        const kernels_expert *x = &s->views[e];
        if (arg->mode == KERNELS_FAST) {
            kernels_mxfp4_mul_fast(s->pool, &x->w1, s->az, s->y, NULL);
            kernels_mxfp4_mul_fast(s->pool, &x->w3, s->az, s->y, NULL);
            kernels_mxfp4_mul_fast(s->pool, &x->w2, s->ah, s->y, NULL);
        } else {
            kernels_mxfp4_mul_exact(s->pool, &x->w1, s->z, 1, s->y, NULL);
            kernels_mxfp4_mul_exact(s->pool, &x->w3, s->z, 1, s->y, NULL);
            kernels_mxfp4_mul_exact(s->pool, &x->w2, s->h, 1, s->y, NULL);
        }
    }
    return bench_now() - t0;
}

static void bench_mxfp4(struct setup *s)
{
    static const kernels_isa isas[] = { KERNELS_ISA_SCALAR, KERNELS_ISA_AVX2,
                                        KERNELS_ISA_AVX512VNNI, KERNELS_ISA_NEON };
    kernels_isa best = kernels_init();
    double scalar_fast = 0;

    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (kernels_set_isa(isas[i], NULL) != 0)
            continue;
        for (int m = 0; m < 2; m++) {
            kernels_numerics mode = m ? KERNELS_EXACT : KERNELS_FAST;
            /* the scalar kernels are slow: a quarter of the experts still
             * spans ~175 MB, far beyond the caches */
            size_t nexp = isas[i] == KERNELS_ISA_SCALAR ? s->nexp / 4 + 1 : s->nexp;
            char name[96];
            struct mv_arg arg = { mode, nexp };
            double g, base, target = 0;
            measure(s, pass_mv, &arg, (double)(nexp * s->span), &g, &base);
            if (mode == KERNELS_FAST && isas[i] == KERNELS_ISA_AVX2)
                target = 0.6;
            if (mode == KERNELS_FAST && isas[i] == KERNELS_ISA_AVX512VNNI)
                target = 0.75;
            snprintf(name, sizeof name, "kernels.mxfp4_mv_%s_%s", m ? "exact" : "fast",
                     kernels_isa_name(isas[i]));
            bench_record(name, g, "GB/s", "STREAM read, 2 threads", base, "higher", target);
            if (isas[i] == KERNELS_ISA_SCALAR && mode == KERNELS_FAST)
                scalar_fast = g;
            else if (mode == KERNELS_FAST && scalar_fast > 0) {
                snprintf(name, sizeof name, "kernels.mxfp4_mv_fast_%s_vs_scalar",
                         kernels_isa_name(isas[i]));
                bench_record(name, g, "GB/s", "scalar fast kernel", scalar_fast, "higher", 0);
            }
        }
    }
    kernels_set_isa(best, NULL);
}

/* Matrix-matrix: n vectors at once vs n matrix-vector calls, per vector,
 * over the w1 of nexp experts (~5.5 MB each; 11 of them exceed the L3). */
static void bench_batch(struct setup *s, size_t nexp)
{
    static const size_t ns[] = { 16, 64 };
    kernels_act *a1 = kernels_act_new(L_DIM, 1);

    for (size_t k = 0; k < 2; k++) {
        size_t n = ns[k];
        double t_mm = 1e30, t_mv = 1e30;
        char name[96];
        kernels_act_quantize(s->az, s->z, L_DIM, n, NULL);
        kernels_act_quantize(a1, s->z, L_DIM, 1, NULL);
        for (int p = 0; p < PASSES; p++) {
            double t0 = bench_now(), t;
            for (size_t e = 0; e < nexp; e++)
                kernels_mxfp4_mul_fast(s->pool, &s->views[e].w1, s->az, s->y, NULL);
            t = bench_now() - t0;
            t_mm = t < t_mm ? t : t_mm;
            /* one vector at a time through all the experts, as decoding
             * token by token would: the weights come from DRAM each time */
            t0 = bench_now();
            for (size_t v = 0; v < n; v++)
                for (size_t e = 0; e < nexp; e++)
                    kernels_mxfp4_mul_fast(s->pool, &s->views[e].w1, a1, s->y, NULL);
            t = bench_now() - t0;
            t_mv = t < t_mv ? t : t_mv;
        }
        snprintf(name, sizeof name, "kernels.mxfp4_mm_fast_n%zu_%s", n,
                 kernels_isa_name(kernels_get_isa()));
        /* figure: vectors per second; baseline: the same with n calls */
        bench_record(name, (double)(n * nexp) / t_mm, "vec/s", "n matrix-vector calls",
                     (double)(n * nexp) / t_mv, "higher", 0);
    }
    kernels_act_quantize(s->az, s->z, L_DIM, 1, NULL);
    kernels_act_free(a1);
}

struct expert_arg {
    kernels_expert_ws *ws;
};

static double pass_expert(struct setup *s, const void *argp)
{
    const struct expert_arg *arg = argp;
    float weight = 0.5f;
    double t0 = bench_now();
    for (size_t e = 0; e < s->nexp; e++)
        kernels_expert_apply(arg->ws, s->pool, &s->views[e], s->z, 1, &weight, s->h,
                             KERNELS_FAST, NULL);
    return bench_now() - t0;
}

/* The fused expert: w1, w3, SiTU, w2 in one region per expert. */
static void bench_expert(struct setup *s)
{
    struct expert_arg arg = { kernels_expert_ws_new(I_DIM, L_DIM, 1, 4.0f, 25.0f) };
    double g, base;

    measure(s, pass_expert, &arg, (double)(s->nexp * s->span), &g, &base);
    bench_record("kernels.expert_fused_fast", g, "GB/s", "STREAM read, 2 threads", base,
                 "higher", 0.6);
    kernels_expert_ws_free(arg.ws);
}

struct q8_arg {
    const int8_t *q;
    const float *scale;
    size_t nmat, rows, cols;
    const kernels_act *a;
    float *y;
};

static double pass_q8(struct setup *s, const void *argp)
{
    const struct q8_arg *arg = argp;
    double t0 = bench_now();
    for (size_t m = 0; m < arg->nmat; m++) {
        kernels_q8 w = { arg->q + m * arg->rows * arg->cols, arg->scale, arg->rows, arg->cols };
        kernels_q8_mul(s->pool, &w, arg->a, arg->y, NULL);
    }
    return bench_now() - t0;
}

static void bench_q8(struct setup *s, size_t nmat)
{
    static const kernels_isa isas[] = { KERNELS_ISA_AVX2, KERNELS_ISA_AVX512VNNI, KERNELS_ISA_NEON };
    kernels_isa isa0 = kernels_init();
    size_t rows = 12288, cols = 7168, bytes = rows * cols;
    int8_t *q = malloc(nmat * bytes);
    float *scale = malloc(rows * sizeof *scale), *x = malloc(cols * sizeof *x);
    float *y = malloc(rows * sizeof *y);
    kernels_act *a = kernels_act_new(cols, 1);
    if (!q || !scale || !x || !y || !a) {
        fprintf(stderr, "bench kernels: no memory for the int8 matrices\n");
        goto out;
    }
    fill_random((uint8_t *)q, nmat * bytes);
    for (size_t i = 0; i < nmat * bytes; i++)
        if (q[i] == -128)
            q[i] = -127;
    for (size_t r = 0; r < rows; r++)
        scale[r] = 1.0f / 127;
    fill_floats(x, cols);
    kernels_act_quantize(a, x, cols, 1, NULL);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        struct q8_arg arg = { q, scale, nmat, rows, cols, a, y };
        char name[64];
        double g, base;
        if (kernels_set_isa(isas[i], NULL) != 0)
            continue;
        measure(s, pass_q8, &arg, (double)(nmat * bytes), &g, &base);
        snprintf(name, sizeof name, "kernels.q8_mv_%s", kernels_isa_name(isas[i]));
        bench_record(name, g, "GB/s", "STREAM read, 2 threads", base, "higher", 0.5);
    }
    kernels_set_isa(isa0, NULL);
out:
    kernels_act_free(a);
    free(q);
    free(scale);
    free(x);
    free(y);
}

int main(void)
{
    struct setup s = { 0 };
    const char *quick = getenv("SHOAL_BENCH_QUICK");
    int rc = 1;

    s.nexp = quick && quick[0] == '1' ? 4 : 40;
    s.span = kernels_expert_span_bytes(I_DIM, L_DIM);
    s.stream_bytes = s.nexp * s.span;
    s.experts = malloc(s.nexp * s.span);
    s.views = calloc(s.nexp, sizeof *s.views);
    s.pool = kernels_pool_new(THREADS);
    s.az = kernels_act_new(L_DIM, 64);
    s.ah = kernels_act_new(I_DIM, 1);
    s.z = malloc(64 * L_DIM * sizeof(float));
    s.h = malloc(64 * L_DIM * sizeof(float));
    s.y = malloc(64 * L_DIM * sizeof(float));
    if (!s.experts || !s.views || !s.pool || !s.az || !s.ah || !s.z || !s.h || !s.y) {
        fprintf(stderr, "bench kernels: setup failed (memory?)\n");
        goto out;
    }
    printf("kernels: isa %s, %d threads, %zu experts of %zu bytes (%.0f MB)\n",
           kernels_isa_name(kernels_init()), THREADS, s.nexp, s.span,
           (double)(s.nexp * s.span) / 1e6);
    fill_random(s.experts, s.nexp * s.span);
    for (size_t e = 0; e < s.nexp; e++) {
        kernels_expert_view(s.experts + e * s.span, I_DIM, L_DIM, &s.views[e], NULL);
        /* realistic ue8m0 scales (weights around 2^-8..2^-2) */
        const kernels_mxfp4 *m[3] = { &s.views[e].w1, &s.views[e].w2, &s.views[e].w3 };
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < m[k]->rows * m[k]->cols / 32; i++)
                ((uint8_t *)m[k]->scale)[i] = (uint8_t)(119 + rnd() % 7);
    }
    fill_floats(s.z, 64 * L_DIM);
    fill_floats(s.h, 64 * L_DIM);
    kernels_act_quantize(s.az, s.z, L_DIM, 1, NULL);
    kernels_act_quantize(s.ah, s.h, I_DIM, 1, NULL);

    bench_mxfp4(&s);
    bench_expert(&s);
    bench_batch(&s, s.nexp / 4 + 1);
    bench_q8(&s, quick && quick[0] == '1' ? 1 : 8);
    rc = 0;
out:
    kernels_pool_free(s.pool);
    kernels_act_free(s.az);
    kernels_act_free(s.ah);
    free(s.experts);
    free(s.views);
    free(s.z);
    free(s.h);
    free(s.y);
    return rc;
}
