/* test_attn.c — engine/kernels attention family: MLA (absorbed) and the
 * KDA step and conv.  Every ISA against the scalar reference bit for bit;
 * 1, 2 and 3 threads and workspaces of other capacities; a chunk against
 * token at a time; causal edges (position 0, a chunk's first and last
 * token, superblock and block boundaries); the expanded form likewise and
 * against the absorbed one through W_UV; f32 against float64 at K3
 * width (96 heads, kl 512, rope 64) over 4k and 32k positions; the
 * half-precision caches' error; the shared exp and the bf16/f16
 * conversions; bad arguments.
 *
 * Magnitudes (realistic_case): c rows are RMS-normed latents (N(0,1)
 * times a norm weight in [0.5, 1.5] plus a shared mean direction), r rows
 * N(0,1), queries scaled so that scores have a standard deviation of 3,
 * and one position in 200 a "needle" that one head scores ~10 higher.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/attn_int.h"

/* ---- helpers ------------------------------------------------------------------ */

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static double uni(void)
{
    return (double)(rnd() >> 11) / 9007199254740992.0;
}

static double gauss(void)
{
    double u = uni() + 1e-300, v = uni();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static const kernels_isa all_isas[] = { KERNELS_ISA_SCALAR, KERNELS_ISA_AVX2,
                                        KERNELS_ISA_AVX512VNNI, KERNELS_ISA_NEON };
#define N_ISAS (sizeof all_isas / sizeof all_isas[0])

static void use_isa(kernels_isa isa)
{
    assert_int_equal(kernels_set_isa(isa, NULL), 0);
}

static kernels_isa best_isa(void)
{
    kernels_isa best = KERNELS_ISA_SCALAR;
    for (size_t i = 0; i < N_ISAS; i++)
        if (kernels_isa_supported(all_isas[i]))
            best = all_isas[i];
    return best;
}

/* An MLA case: an f32 cache, its copy in `type`, queries laid out as the
 * engine keeps them (qx inside [n][H][qk] rows, qk = nope + rope). */
struct mla_case {
    size_t H, kl, rope, P, n, qk;
    kernels_kv_type type;
    float *c, *r;          /* f32 [P][kl], [P][rope] */
    void *ct, *rt;         /* the same rows stored as `type` */
    float *qa, *q;         /* [n][H][kl], [n][H][qk] */
};

static void mla_case_make(struct mla_case *m, size_t H, size_t kl, size_t rope, size_t P,
                          size_t n, kernels_kv_type type)
{
    size_t es = kernels_kv_size(type);
    double sig = 3.0, qs = sig / sqrt((double)(kl + rope)) * sqrt(192.0);
    float *mean = malloc(kl * sizeof *mean), *w = malloc(kl * sizeof *w);

    *m = (struct mla_case){ H, kl, rope, P, n, 7 + rope, type, NULL, NULL, NULL, NULL, NULL, NULL };
    m->c = malloc(P * kl * sizeof(float));
    m->r = malloc((P * rope + 1) * sizeof(float));
    m->ct = malloc(P * kl * es);
    m->rt = malloc((P * rope + 1) * es);
    m->qa = malloc(n * H * kl * sizeof(float));
    m->q = malloc((n * H * m->qk + 1) * sizeof(float));
    assert_true(m->c && m->r && m->ct && m->rt && m->qa && m->q && mean && w);
    for (size_t l = 0; l < kl; l++) {
        mean[l] = (float)(0.3 * gauss());
        w[l] = (float)(0.5 + uni());
    }
    for (size_t i = 0; i < n * H * kl; i++)
        m->qa[i] = (float)(qs * gauss());
    for (size_t i = 0; i < n * H * m->qk; i++)
        m->q[i] = (float)(qs * gauss());
    for (size_t s = 0; s < P; s++) {
        float *c = m->c + s * kl;
        for (size_t l = 0; l < kl; l++)
            c[l] = (float)(gauss() * w[l] + mean[l]);
        for (size_t l = 0; l < rope; l++)
            m->r[s * rope + l] = (float)gauss();
        if (s % 200 == 7) {
            /* a needle: head s % H of the last token scores it ~10 higher */
            const float *qa = m->qa + ((n - 1) * H + s % H) * kl;
            double nn = 0;
            for (size_t l = 0; l < kl; l++)
                nn += (double)qa[l] * qa[l];
            for (size_t l = 0; l < kl; l++)
                c[l] += (float)(10.0 * sqrt(192.0) * qa[l] / nn);
        }
    }
    kernels_kv_store(type, m->c, m->ct, P * kl);
    kernels_kv_store(type, m->r, m->rt, P * rope);
    free(mean);
    free(w);
}

static void mla_case_free(struct mla_case *m)
{
    free(m->c);
    free(m->r);
    free(m->ct);
    free(m->rt);
    free(m->qa);
    free(m->q);
}

/* Tokens [t0, t0 + n) of the case (their positions are P - case.n + t). */
static kernels_mla mla_args(const struct mla_case *m, size_t t0, size_t n, float *ctx)
{
    kernels_mla a = { m->H, m->kl, m->rope, m->type, m->ct, m->rt, m->P - m->n + t0, n,
                      m->qa + t0 * m->H * m->kl, m->q + t0 * m->H * m->qk + 7,
                      m->H * m->qk, m->qk, (float)(1.0 / sqrt(192.0)), ctx };
    return a;
}

static void mla_run(const struct mla_case *m, kernels_mla_ws *ws, kernels_pool *pool,
                    float *ctx)
{
    kernels_mla a = mla_args(m, 0, m->n, ctx);
    assert_int_equal(kernels_mla_attend(ws, pool, &a, NULL), 0);
}

/* float64 attention of token t, head h over the f32 cache values widened
 * from `type` (wide = 1) or the original f32 values (wide = 0). */
static void mla_ref(const struct mla_case *m, size_t t, size_t h, int wide, double *out)
{
    size_t len = m->P - m->n + t + 1, kl = m->kl, rope = m->rope;
    double *sc = malloc(len * sizeof *sc), mx = -INFINITY, L = 0;
    float *row = malloc((kl + rope + 1) * sizeof *row);
    const float *qa = m->qa + (t * m->H + h) * kl, *qx = m->q + (t * m->H + h) * m->qk + 7;
    double scale = (double)(float)(1.0 / sqrt(192.0));

    for (size_t s = 0; s < len; s++) {
        double d = 0;
        if (wide) {
            kernels_kv_load(m->type, (const char *)m->ct + s * kl * kernels_kv_size(m->type), row, kl);
            kernels_kv_load(m->type, (const char *)m->rt + s * rope * kernels_kv_size(m->type),
                            row + kl, rope);
        } else {
            memcpy(row, m->c + s * kl, kl * sizeof *row);
            memcpy(row + kl, m->r + s * rope, rope * sizeof *row);
        }
        for (size_t l = 0; l < kl; l++)
            d += (double)qa[l] * row[l];
        for (size_t l = 0; l < rope; l++)
            d += (double)qx[l] * row[kl + l];
        sc[s] = d * scale;
        mx = sc[s] > mx ? sc[s] : mx;
    }
    for (size_t l = 0; l < kl; l++)
        out[l] = 0;
    for (size_t s = 0; s < len; s++) {
        double p = exp(sc[s] - mx);
        L += p;
        if (wide)
            kernels_kv_load(m->type, (const char *)m->ct + s * kl * kernels_kv_size(m->type), row, kl);
        else
            memcpy(row, m->c + s * kl, kl * sizeof *row);
        for (size_t l = 0; l < kl; l++)
            out[l] += p * row[l];
    }
    for (size_t l = 0; l < kl; l++)
        out[l] /= L;
    free(sc);
    free(row);
}

/* rel-L2 of ctx against float64 over tokens x every `hstep`-th head. */
static double mla_err(const struct mla_case *m, const float *ctx, size_t hstep, int wide)
{
    double *ref = malloc(m->kl * sizeof *ref), e = 0, nr = 0;
    for (size_t t = 0; t < m->n; t++)
        for (size_t h = 0; h < m->H; h += hstep) {
            mla_ref(m, t, h, wide, ref);
            for (size_t l = 0; l < m->kl; l++) {
                double d = ctx[(t * m->H + h) * m->kl + l] - ref[l];
                e += d * d;
                nr += ref[l] * ref[l];
            }
        }
    free(ref);
    return sqrt(e / nr);
}

/* ---- the shared exp and the conversions ------------------------------------- */

static void test_attn_exp(void **state)
{
    double worst = 0;
    (void)state;
    assert_true(kernels_attn_exp(0.0f) == 1.0f);
    assert_true(kernels_attn_exp(-0.0f) == 1.0f);
    assert_true(kernels_attn_exp(-87.31f) == 0.0f);
    assert_true(kernels_attn_exp(-INFINITY) == 0.0f);
    assert_true(kernels_attn_exp(-1e30f) == 0.0f);
    assert_true(isnan(kernels_attn_exp(NAN)));
    assert_true(kernels_attn_exp(-87.29f) > 0.0f);
    assert_true(isfinite(kernels_attn_exp(1e30f)));
    for (int i = 0; i < 200000; i++) {
        float x = (float)(-87.2 + uni() * 175.0);
        if (i < 1000)
            x = (float)(-1.0 + i * 0.002);
        double ref = exp((double)x), got = kernels_attn_exp(x);
        /* in units of the spacing of floats near ref (2^-23 of its binade) */
        double ulp = ldexp(1.0, (int)floor(log2(ref)) - 23);
        double e = fabs(got - ref) / ulp;
        worst = e > worst ? e : worst;
    }
    printf("kernels_attn_exp: worst error %.2f ulp\n", worst);
    assert_true(worst <= 2.0);
}

static void test_kv_convert(void **state)
{
    static const float f16_in[] = { 0.0f, -0.0f, 1.0f, 65504.0f, 65519.0f, 65520.0f, 1e6f,
                                    6.103515625e-05f, 5.9604644775390625e-08f, 2.98e-08f,
                                    2.99e-08f, 1e-10f, -3.14159f, 1.00048828125f,
                                    1.000732421875f };
    static const uint16_t f16_out[] = { 0x0000, 0x8000, 0x3C00, 0x7BFF, 0x7BFF, 0x7C00, 0x7C00,
                                        0x0400, 0x0001, 0x0000, 0x0001, 0x0000, 0xC248, 0x3C00,
                                        0x3C01 };
    uint16_t h;
    float back;
    (void)state;
    for (size_t i = 0; i < sizeof f16_in / sizeof f16_in[0]; i++) {
        kernels_kv_store(KERNELS_KV_F16, &f16_in[i], &h, 1);
        assert_int_equal(h, f16_out[i]);
    }
    /* every f16 value widens and narrows back to itself */
    for (uint32_t v = 0; v < 0x10000; v++) {
        uint16_t in = (uint16_t)v, out;
        if ((in & 0x7C00) == 0x7C00 && (in & 0x3FF))
            continue;  /* NaN: checked below */
        kernels_kv_load(KERNELS_KV_F16, &in, &back, 1);
        kernels_kv_store(KERNELS_KV_F16, &back, &out, 1);
        assert_int_equal(in, out);
        kernels_kv_load(KERNELS_KV_BF16, &in, &back, 1);
        kernels_kv_store(KERNELS_KV_BF16, &back, &out, 1);
        if (!isnan(back))
            assert_int_equal(in, out);
    }
    back = NAN;
    kernels_kv_store(KERNELS_KV_F16, &back, &h, 1);
    assert_true((h & 0x7C00) == 0x7C00 && (h & 0x3FF));
    kernels_kv_store(KERNELS_KV_BF16, &back, &h, 1);
    kernels_kv_load(KERNELS_KV_BF16, &h, &back, 1);
    assert_true(isnan(back));
    /* random values round to the nearest of the two neighbours, ties to even */
    for (int i = 0; i < 100000; i++) {
        float x = (float)(gauss() * ldexp(1.0, (int)(rnd() % 30) - 20)), y;
        uint16_t b;
        kernels_kv_store(KERNELS_KV_BF16, &x, &b, 1);
        kernels_kv_load(KERNELS_KV_BF16, &b, &y, 1);
        assert_true(fabs((double)y - x) <= ldexp(fabs((double)x), -8));
        kernels_kv_store(KERNELS_KV_F16, &x, &b, 1);
        kernels_kv_load(KERNELS_KV_F16, &b, &y, 1);
        if (fabs(x) < 65504)
            assert_true(fabs((double)y - x) <= fmax(ldexp(fabs((double)x), -11), ldexp(1.0, -25)));
    }
    assert_int_equal(kernels_kv_size(KERNELS_KV_F32), 4);
    assert_int_equal(kernels_kv_size(KERNELS_KV_F16), 2);
    assert_int_equal(kernels_kv_size((kernels_kv_type)9), 0);
}

/* ---- MLA ---------------------------------------------------------------------- */

struct shape {
    size_t H, kl, rope, P, n;
    kernels_kv_type type;
};

static const struct shape shapes[] = {
    { 5, 40, 8, 300, 3, KERNELS_KV_F32 },      /* tiny-k3-like, 2 superblocks */
    { 96, 512, 64, 530, 2, KERNELS_KV_F32 },   /* K3 width */
    { 96, 512, 64, 270, 1, KERNELS_KV_BF16 },
    { 96, 512, 64, 270, 1, KERNELS_KV_F16 },
    { 7, 33, 0, 40, 5, KERNELS_KV_F16 },       /* no rope, odd widths */
    { 17, 48, 16, 700, 19, KERNELS_KV_F32 },   /* more tokens than a group */
    { 3, 16, 3, 17, 1, KERNELS_KV_BF16 },
    { 1, 1, 0, 5, 5, KERNELS_KV_F32 },         /* D < 16: empty segments */
    { 22, 100, 12, 257, 2, KERNELS_KV_F32 },   /* head and column tails everywhere */
};

static void test_mla_isas_bitexact(void **state)
{
    kernels_pool *pool = kernels_pool_new(2);
    (void)state;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const struct shape *sh = &shapes[si];
        struct mla_case m;
        size_t sz = sh->n * sh->H * sh->kl * sizeof(float);
        float *ref = malloc(sz), *got = malloc(sz);
        kernels_mla_ws *ws = kernels_mla_ws_new(sh->H, sh->kl, sh->rope, sh->n, 2);
        assert_non_null(ws);
        mla_case_make(&m, sh->H, sh->kl, sh->rope, sh->P, sh->n, sh->type);
        use_isa(KERNELS_ISA_SCALAR);
        mla_run(&m, ws, NULL, ref);
        for (size_t i = 1; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            memset(got, 0xFF, sz);
            mla_run(&m, ws, pool, got);
            if (memcmp(ref, got, sz))
                fail_msg("shape %zu (H %zu kl %zu rope %zu P %zu n %zu type %d): %s != scalar",
                         si, sh->H, sh->kl, sh->rope, sh->P, sh->n, (int)sh->type,
                         kernels_isa_name(all_isas[i]));
        }
        /* and the scalar result is the float64 one within f32 noise */
        assert_true(mla_err(&m, ref, 1 + sh->H / 8, 1) < 1e-5);
        kernels_mla_ws_free(ws);
        mla_case_free(&m);
        free(ref);
        free(got);
    }
    use_isa(best_isa());
    kernels_pool_free(pool);
}

/* Thread counts and workspace capacities (npart, group size) change
 * nothing: 20,000 positions are 79 superblocks, several waves. */
static void test_mla_threads(void **state)
{
    struct mla_case m;
    kernels_pool *p2 = kernels_pool_new(2), *p3 = kernels_pool_new(3);
    kernels_mla_ws *w1 = kernels_mla_ws_new(2, 16, 4, 3, 1), *w8 = kernels_mla_ws_new(2, 16, 4, 40, 8);
    size_t sz = 3 * 2 * 16 * sizeof(float);
    float *a = malloc(sz), *b = malloc(sz), *c = malloc(sz);
    (void)state;
    assert_true(p2 && p3 && w1 && w8);
    mla_case_make(&m, 2, 16, 4, 20000, 3, KERNELS_KV_F32);
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        mla_run(&m, w1, NULL, a);
        mla_run(&m, w8, p2, b);
        mla_run(&m, w8, p3, c);
        assert_memory_equal(a, b, sz);
        assert_memory_equal(a, c, sz);
    }
    assert_true(mla_err(&m, a, 1, 1) < 1e-5);
    use_isa(best_isa());
    mla_case_free(&m);
    kernels_mla_ws_free(w1);
    kernels_mla_ws_free(w8);
    kernels_pool_free(p2);
    kernels_pool_free(p3);
    free(a);
    free(b);
    free(c);
}

/* A chunk gives each token the bits it gets alone: chunks that start at
 * position 0, cross a superblock boundary (256) and block boundaries
 * (16), and are longer than a token group (16). */
static void test_mla_chunk_vs_token(void **state)
{
    static const size_t cases[][2] = { { 40, 40 }, { 600, 64 }, { 270, 20 }, { 17, 1 } };
    kernels_pool *pool = kernels_pool_new(2);
    (void)state;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        size_t P = cases[ci][0], n = cases[ci][1], H = 9, kl = 64, rope = 16, one = H * kl;
        struct mla_case m;
        kernels_mla_ws *ws = kernels_mla_ws_new(H, kl, rope, n, 2);
        float *chunk = malloc(n * one * sizeof(float)), *tok = malloc(one * sizeof(float));
        mla_case_make(&m, H, kl, rope, P, n, KERNELS_KV_F32);
        for (size_t i = 0; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            mla_run(&m, ws, pool, chunk);
            for (size_t t = 0; t < n; t++) {
                kernels_mla a = mla_args(&m, t, 1, tok);
                assert_int_equal(kernels_mla_attend(ws, t % 2 ? pool : NULL, &a, NULL), 0);
                if (memcmp(tok, chunk + t * one, one * sizeof(float)))
                    fail_msg("%s: P %zu n %zu token %zu: chunk != alone",
                             kernels_isa_name(all_isas[i]), P, n, t);
            }
            if (P == n) {
                /* position 0 alone: p = 1, ctx = c_0 exactly */
                assert_memory_equal(chunk, m.c, kl * sizeof(float));
                assert_memory_equal(chunk + (H - 1) * kl, m.c, kl * sizeof(float));
            }
        }
        kernels_mla_ws_free(ws);
        mla_case_free(&m);
        free(chunk);
        free(tok);
    }
    use_isa(best_isa());
    kernels_pool_free(pool);
}

/* K3 width against float64: 4k positions every head, 32k every 6th head
 * (the f32 kernel still runs all 96); the half caches at 4k against the
 * float64 attention over the original f32 rows. */
static void test_mla_vs_float64(void **state)
{
    static const size_t Ps[] = { 4096, 32768 };
    kernels_pool *pool = kernels_pool_new(2);
    (void)state;
    use_isa(best_isa());
    for (size_t pi = 0; pi < 2; pi++) {
        struct mla_case m;
        kernels_mla_ws *ws = kernels_mla_ws_new(96, 512, 64, 1, 2);
        float *ctx = malloc(96 * 512 * sizeof(float));
        mla_case_make(&m, 96, 512, 64, Ps[pi], 1, KERNELS_KV_F32);
        mla_run(&m, ws, pool, ctx);
        double e = mla_err(&m, ctx, pi ? 6 : 1, 0);
        printf("MLA f32 (%s), 96 x (512 + 64), %zu positions: rel-L2 %.3g vs float64\n",
               kernels_isa_name(kernels_get_isa()), Ps[pi], e);
        assert_true(e < 1e-5);
        mla_case_free(&m);
        if (pi == 0)
            for (int t = KERNELS_KV_BF16; t <= KERNELS_KV_F16; t++) {
                double eh;
                mla_case_make(&m, 96, 512, 64, Ps[pi], 1, (kernels_kv_type)t);
                mla_run(&m, ws, pool, ctx);
                eh = mla_err(&m, ctx, 1, 0);
                printf("MLA %s cache, %zu positions: rel-L2 %.3g vs float64 of the f32 rows "
                       "(%.3g vs float64 of the stored rows)\n", t == KERNELS_KV_BF16 ? "bf16" : "f16",
                       Ps[pi], eh, mla_err(&m, ctx, 8, 1));
                assert_true(eh < (t == KERNELS_KV_BF16 ? 2e-2 : 3e-3));
                assert_true(mla_err(&m, ctx, 8, 1) < 1e-5);
                mla_case_free(&m);
            }
        kernels_mla_ws_free(ws);
        free(ctx);
    }
    kernels_pool_free(pool);
}

static void test_mla_bad_args(void **state)
{
    struct mla_case m;
    kernels_mla_ws *ws = kernels_mla_ws_new(4, 32, 8, 2, 1);
    kernels_pool *pool = kernels_pool_new(2);
    float ctx[2 * 4 * 32];
    shoal_err err = { 0 };
    kernels_mla a;
    (void)state;
    mla_case_make(&m, 4, 32, 8, 10, 2, KERNELS_KV_F32);
    memset(ctx, 0x5A, sizeof ctx);
    a = mla_args(&m, 0, 2, ctx);
    assert_int_equal(kernels_mla_attend(ws, pool, &a, &err), SHOAL_EINVAL);  /* 2 threads > 1 */
    assert_non_null(strstr(err.msg, "threads"));
    a.heads = 5;
    assert_int_equal(kernels_mla_attend(ws, NULL, &a, NULL), SHOAL_EINVAL);
    a = mla_args(&m, 0, 2, ctx);
    a.n = 3;
    assert_int_equal(kernels_mla_attend(ws, NULL, &a, NULL), SHOAL_EINVAL);
    a = mla_args(&m, 0, 2, ctx);
    a.type = (kernels_kv_type)7;
    assert_int_equal(kernels_mla_attend(ws, NULL, &a, NULL), SHOAL_EINVAL);
    a = mla_args(&m, 0, 2, ctx);
    a.qx = NULL;
    assert_int_equal(kernels_mla_attend(ws, NULL, &a, NULL), SHOAL_EINVAL);
    assert_int_equal(kernels_mla_attend(NULL, NULL, &a, NULL), SHOAL_EINVAL);
    for (size_t i = 0; i < sizeof ctx / sizeof ctx[0]; i++)
        assert_true(ctx[i] == ctx[0]);  /* untouched */
    a = mla_args(&m, 0, 0, ctx);
    assert_int_equal(kernels_mla_attend(ws, NULL, &a, NULL), 0);
    assert_null(kernels_mla_ws_new(0, 32, 8, 1, 1));
    assert_null(kernels_mla_ws_new(4, 0, 8, 1, 1));
    assert_null(kernels_mla_ws_new(4, 32, 8, 0, 1));
    assert_null(kernels_mla_ws_new(4, 32, 8, 1, 0));
    assert_true(kernels_mla_ws_bytes(ws) > 0);
    kernels_mla_ws_free(NULL);
    kernels_mla_ws_free(ws);
    kernels_pool_free(pool);
    mla_case_free(&m);
}

/* ---- MLA, expanded form ------------------------------------------------------------ */

/* A case for the expanded form: the MLA case's cache and rope queries,
 * q_nope and kv_b (W_UK, W_UV per head), and the absorbed queries
 * q_abs = W_UK^T q_nope computed from them (float64, rounded once). */
struct x_case {
    struct mla_case m;
    size_t nope, vd;
    float *qn;      /* [n][H][nope] */
    float *wkv;     /* [H][nope + vd][kl] */
};

static void x_case_make(struct x_case *x, size_t H, size_t kl, size_t rope, size_t nope,
                        size_t vd, size_t P, size_t n, kernels_kv_type type)
{
    struct mla_case *m = &x->m;
    double sw = 1.0 / sqrt((double)kl);

    mla_case_make(m, H, kl, rope, P, n, type);
    x->nope = nope;
    x->vd = vd;
    x->qn = malloc(n * H * nope * sizeof(float));
    x->wkv = malloc(H * (nope + vd) * kl * sizeof(float));
    assert_true(x->qn && x->wkv);
    for (size_t i = 0; i < H * (nope + vd) * kl; i++)
        x->wkv[i] = (float)(sw * gauss());
    for (size_t i = 0; i < n * H * nope; i++)
        x->qn[i] = (float)(3.0 * gauss() / sqrt((double)nope + rope) * sqrt(192.0));
    for (size_t t = 0; t < n; t++)
        for (size_t h = 0; h < H; h++)
            for (size_t l = 0; l < kl; l++) {
                double acc = 0;
                for (size_t i = 0; i < nope; i++)
                    acc += (double)x->wkv[(h * (nope + vd) + i) * kl + l] * x->qn[(t * H + h) * nope + i];
                m->qa[(t * H + h) * kl + l] = (float)acc;
            }
}

static void x_case_free(struct x_case *x)
{
    mla_case_free(&x->m);
    free(x->qn);
    free(x->wkv);
}

static kernels_mla_x x_args(const struct x_case *x, size_t t0, size_t n, float *o)
{
    const struct mla_case *m = &x->m;
    kernels_mla_x a = { m->H, m->kl, m->rope, x->nope, x->vd, m->type, m->ct, m->rt,
                        m->P - m->n + t0, n, x->qn + t0 * m->H * x->nope, m->H * x->nope, x->nope,
                        m->q + t0 * m->H * m->qk + 7, m->H * m->qk, m->qk, x->wkv,
                        (float)(1.0 / sqrt(192.0)), o };
    return a;
}

static void x_run(const struct x_case *x, kernels_pool *pool, float *o)
{
    kernels_mla_xws *ws = kernels_mla_xws_new(x->m.H, x->m.kl, x->m.rope, x->nope, x->vd,
                                              x->m.n, 3);
    kernels_mla_x a = x_args(x, 0, x->m.n, o);
    assert_non_null(ws);
    assert_int_equal(kernels_mla_expanded(ws, pool, &a, NULL), 0);
    kernels_mla_xws_free(ws);
}

/* o_h = W_UV,h ctx_h in float64 from an absorbed ctx (f32) or from the
 * float64 reference (ctx NULL). */
static void x_from_ctx(const struct x_case *x, size_t t, size_t h, const float *ctx, double *o)
{
    const struct mla_case *m = &x->m;
    double *ref = malloc(m->kl * sizeof *ref);
    if (!ctx)
        mla_ref(m, t, h, 1, ref);
    for (size_t i = 0; i < x->vd; i++) {
        const float *w = x->wkv + (h * (x->nope + x->vd) + x->nope + i) * m->kl;
        double acc = 0;
        for (size_t l = 0; l < m->kl; l++)
            acc += (double)w[l] * (ctx ? (double)ctx[(t * m->H + h) * m->kl + l] : ref[l]);
        o[i] = acc;
    }
    free(ref);
}

static double x_err(const struct x_case *x, const float *o, const float *ctx)
{
    double *ref = malloc(x->vd * sizeof *ref), e = 0, nr = 0;
    for (size_t t = 0; t < x->m.n; t++)
        for (size_t h = 0; h < x->m.H; h++) {
            x_from_ctx(x, t, h, ctx, ref);
            for (size_t i = 0; i < x->vd; i++) {
                double d = o[(t * x->m.H + h) * x->vd + i] - ref[i];
                e += d * d;
                nr += ref[i] * ref[i];
            }
        }
    free(ref);
    return sqrt(e / nr);
}

static void test_mla_expanded(void **state)
{
    static const size_t xs[][8] = {
        { 4, 32, 8, 16, 16, 40, 5, 0 },       /* tiny-k3 */
        { 96, 512, 64, 128, 128, 70, 3, 0 },  /* K3 width */
        { 6, 64, 16, 32, 48, 300, 20, 1 },    /* bf16, a chunk over a superblock boundary */
        { 5, 33, 0, 7, 9, 50, 19, 2 },        /* f16, no rope, odd widths */
    };
    kernels_pool *pool = kernels_pool_new(2), *p3 = kernels_pool_new(3);
    (void)state;
    for (size_t ci = 0; ci < sizeof xs / sizeof xs[0]; ci++) {
        struct x_case x;
        size_t H = xs[ci][0], n = xs[ci][6], vd = xs[ci][4], one = H * vd;
        float *o0 = malloc(n * one * sizeof(float)), *o1 = malloc(n * one * sizeof(float));
        float *ctx = malloc(n * H * xs[ci][1] * sizeof(float));
        kernels_mla_xws *ws = kernels_mla_xws_new(H, xs[ci][1], xs[ci][2], xs[ci][3], vd, n, 2);
        x_case_make(&x, H, xs[ci][1], xs[ci][2], xs[ci][3], vd, xs[ci][5], n,
                    (kernels_kv_type)xs[ci][7]);
        use_isa(KERNELS_ISA_SCALAR);
        x_run(&x, NULL, o0);
        for (size_t i = 1; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            x_run(&x, i % 2 ? pool : p3, o1);
            if (memcmp(o0, o1, n * one * sizeof(float)))
                fail_msg("expanded case %zu: %s != scalar", ci, kernels_isa_name(all_isas[i]));
            /* token at a time gives the chunk's bits */
            for (size_t t = 0; t < n; t++) {
                kernels_mla_x a = x_args(&x, t, 1, o1);
                assert_int_equal(kernels_mla_expanded(ws, t % 2 ? pool : NULL, &a, NULL), 0);
                if (memcmp(o1, o0 + t * one, one * sizeof(float)))
                    fail_msg("expanded case %zu, %s: token %zu alone != in the chunk", ci,
                             kernels_isa_name(all_isas[i]), t);
            }
        }
        /* against float64, and against the absorbed form through W_UV */
        kernels_mla_ws *aws = kernels_mla_ws_new(H, xs[ci][1], xs[ci][2], n, 2);
        mla_run(&x.m, aws, pool, ctx);
        double ef = x_err(&x, o0, NULL), ea = x_err(&x, o0, ctx);
        if (ci == 1)
            printf("MLA expanded, K3 width: rel-L2 %.3g vs float64, %.3g vs absorbed\n", ef, ea);
        assert_true(ef < 1e-5);
        assert_true(ea < 1e-5);
        kernels_mla_ws_free(aws);
        kernels_mla_xws_free(ws);
        x_case_free(&x);
        free(o0);
        free(o1);
        free(ctx);
    }
    use_isa(best_isa());
    kernels_pool_free(pool);
    kernels_pool_free(p3);
}

static void test_mla_expanded_bad_args(void **state)
{
    struct x_case x;
    kernels_mla_xws *ws = kernels_mla_xws_new(4, 32, 8, 16, 16, 2, 1);
    float o[2 * 4 * 16];
    kernels_mla_x a;
    (void)state;
    x_case_make(&x, 4, 32, 8, 16, 16, 10, 2, KERNELS_KV_F32);
    a = x_args(&x, 0, 2, o);
    a.vd = 8;
    assert_int_equal(kernels_mla_expanded(ws, NULL, &a, NULL), SHOAL_EINVAL);
    a = x_args(&x, 0, 2, o);
    a.n = 3;
    assert_int_equal(kernels_mla_expanded(ws, NULL, &a, NULL), SHOAL_EINVAL);
    a = x_args(&x, 0, 2, o);
    a.wkv = NULL;
    assert_int_equal(kernels_mla_expanded(ws, NULL, &a, NULL), SHOAL_EINVAL);
    assert_int_equal(kernels_mla_expanded(NULL, NULL, &a, NULL), SHOAL_EINVAL);
    assert_null(kernels_mla_xws_new(4, 0, 8, 16, 16, 2, 1));
    assert_null(kernels_mla_xws_new(4, 32, 8, 16, 0, 2, 1));
    assert_true(kernels_mla_xws_bytes(ws) > 0);
    kernels_mla_xws_free(NULL);
    kernels_mla_xws_free(ws);
    x_case_free(&x);
}

/* ---- KDA ---------------------------------------------------------------------- */

struct kda_case {
    size_t H, dk, dv, n;
    float *S, *q, *k, *alpha, *v, *beta;
};

static void kda_case_make(struct kda_case *c, size_t H, size_t dk, size_t dv, size_t n)
{
    *c = (struct kda_case){ H, dk, dv, n, NULL, NULL, NULL, NULL, NULL, NULL };
    c->S = malloc(H * dk * dv * sizeof(float));
    c->q = malloc(n * H * dk * sizeof(float));
    c->k = malloc(n * H * dk * sizeof(float));
    c->alpha = malloc(n * H * dk * sizeof(float));
    c->v = malloc(n * H * dv * sizeof(float));
    c->beta = malloc(n * H * sizeof(float));
    assert_true(c->S && c->q && c->k && c->alpha && c->v && c->beta);
    for (size_t i = 0; i < H * dk * dv; i++)
        c->S[i] = (float)(0.3 * gauss());
    for (size_t t = 0; t < n; t++)
        for (size_t h = 0; h < H; h++) {
            /* q, k L2-normed per head (q scaled by dk^-1/2), alpha in (e^-5, 1) */
            float *q = c->q + (t * H + h) * dk, *k = c->k + (t * H + h) * dk;
            double nq = 0, nk = 0;
            for (size_t j = 0; j < dk; j++) {
                q[j] = (float)gauss();
                k[j] = (float)gauss();
                nq += (double)q[j] * q[j];
                nk += (double)k[j] * k[j];
                c->alpha[(t * H + h) * dk + j] = (float)exp(-5.0 / (1.0 + exp(-3 * gauss())));
            }
            for (size_t j = 0; j < dk; j++) {
                q[j] = (float)(q[j] / sqrt(nq) / sqrt((double)dk));
                k[j] = (float)(k[j] / sqrt(nk));
            }
            for (size_t j = 0; j < dv; j++)
                c->v[(t * H + h) * dv + j] = (float)gauss();
            c->beta[t * H + h] = (float)(1.0 / (1.0 + exp(-gauss())));
        }
}

static void kda_case_free(struct kda_case *c)
{
    free(c->S);
    free(c->q);
    free(c->k);
    free(c->alpha);
    free(c->v);
    free(c->beta);
}

/* Tokens [t0, t0 + n) on state S, output o [n][H][dv]. */
static void kda_run(const struct kda_case *c, kernels_pool *pool, float *S, size_t t0, size_t n,
                    float *o)
{
    size_t H = c->H;
    kernels_kda a = { H, c->dk, c->dv, S, n, c->q + t0 * H * c->dk, c->k + t0 * H * c->dk,
                      c->alpha + t0 * H * c->dk, c->v + t0 * H * c->dv, c->beta + t0 * H, o };
    assert_int_equal(kernels_kda_step(pool, &a, NULL), 0);
}

static void test_kda_step(void **state)
{
    static const size_t shapes_kda[][4] = { { 96, 128, 128, 2 }, { 5, 32, 40, 7 },
                                            { 3, 17, 13, 4 }, { 1, 8, 100, 3 } };
    kernels_pool *pool = kernels_pool_new(2);
    (void)state;
    for (size_t si = 0; si < sizeof shapes_kda / sizeof shapes_kda[0]; si++) {
        struct kda_case c;
        size_t H = shapes_kda[si][0], dk = shapes_kda[si][1], dv = shapes_kda[si][2];
        size_t n = shapes_kda[si][3], ns = H * dk * dv, no = n * H * dv;
        float *S0 = malloc(ns * sizeof(float)), *S1 = malloc(ns * sizeof(float));
        float *o0 = malloc(no * sizeof(float)), *o1 = malloc(no * sizeof(float));
        kda_case_make(&c, H, dk, dv, n);
        use_isa(KERNELS_ISA_SCALAR);
        memcpy(S0, c.S, ns * sizeof(float));
        kda_run(&c, NULL, S0, 0, n, o0);
        for (size_t i = 1; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            /* all tokens at once on 2 threads */
            memcpy(S1, c.S, ns * sizeof(float));
            kda_run(&c, pool, S1, 0, n, o1);
            assert_memory_equal(S0, S1, ns * sizeof(float));
            assert_memory_equal(o0, o1, no * sizeof(float));
            /* token at a time on 1 thread */
            memcpy(S1, c.S, ns * sizeof(float));
            for (size_t t = 0; t < n; t++)
                kda_run(&c, NULL, S1, t, 1, o1 + t * H * dv);
            assert_memory_equal(S0, S1, ns * sizeof(float));
            assert_memory_equal(o0, o1, no * sizeof(float));
        }
        /* the delta rule in double (k3.md §3.3 step 6: decay first,
         * u = v - S^T k, S += beta k u^T, o = S^T q), within f32 noise */
        if (dv == dk) {
            double e = 0, nr = 0;
            double *Sd = malloc(ns * sizeof(double)), *u = malloc(dv * sizeof(double));
            for (size_t i = 0; i < ns; i++)
                Sd[i] = c.S[i];
            for (size_t t = 0; t < n; t++)
                for (size_t h = 0; h < H; h++) {
                    size_t off = (t * H + h) * dk;
                    double *S = Sd + h * dk * dv, beta = c.beta[t * H + h];
                    for (size_t k = 0; k < dk; k++)
                        for (size_t v = 0; v < dv; v++)
                            S[k * dv + v] *= c.alpha[off + k];
                    for (size_t v = 0; v < dv; v++) {
                        double a = 0;
                        for (size_t k = 0; k < dk; k++)
                            a += S[k * dv + v] * c.k[off + k];
                        u[v] = c.v[off + v] - a;
                    }
                    for (size_t k = 0; k < dk; k++)
                        for (size_t v = 0; v < dv; v++)
                            S[k * dv + v] += beta * c.k[off + k] * u[v];
                    for (size_t v = 0; v < dv; v++) {
                        double a = 0;
                        for (size_t k = 0; k < dk; k++)
                            a += S[k * dv + v] * c.q[off + k];
                        e += (a - o0[off / dk * dv + v]) * (a - o0[off / dk * dv + v]);
                        nr += a * a;
                    }
                }
            assert_true(sqrt(e / nr) < 1e-5);
            free(Sd);
            free(u);
        }
        kda_case_free(&c);
        free(S0);
        free(S1);
        free(o0);
        free(o1);
    }
    use_isa(best_isa());
    kernels_pool_free(pool);
}

static void test_kda_step_bad_args(void **state)
{
    kernels_kda a = { 0 };
    (void)state;
    assert_int_equal(kernels_kda_step(NULL, &a, NULL), SHOAL_EINVAL);
    a.heads = a.dk = a.dv = 2;
    assert_int_equal(kernels_kda_step(NULL, &a, NULL), 0);  /* n = 0 */
    a.n = 1;
    assert_int_equal(kernels_kda_step(NULL, &a, NULL), SHOAL_EINVAL);
    assert_int_equal(kernels_kda_step(NULL, NULL, NULL), SHOAL_EINVAL);
}

/* Conv + SiLU: every ISA, chunk vs token at a time, threads (p > 1024),
 * against float64, the window's contents. */
static void test_kda_conv(void **state)
{
    static const size_t cases[][3] = { { 37, 4, 5 }, { 3000, 4, 3 }, { 21, 1, 4 }, { 16, 2, 6 },
                                       { 12288, 4, 2 } };
    kernels_pool *pool = kernels_pool_new(2);
    (void)state;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        size_t p = cases[ci][0], kw = cases[ci][1], n = cases[ci][2], nw = (kw - 1) * p;
        float *taps_pk = malloc(p * kw * sizeof(float)), *taps = malloc(p * kw * sizeof(float));
        float *x = malloc(n * p * sizeof(float)), *y0 = malloc(n * p * sizeof(float));
        float *y1 = malloc(n * p * sizeof(float)), *w = malloc((nw + 1) * sizeof(float));
        float *w0 = malloc((nw + 1) * sizeof(float)), *w1 = malloc((nw + 1) * sizeof(float));
        for (size_t i = 0; i < p * kw; i++)
            taps_pk[i] = (float)(0.5 * gauss());
        for (size_t i = 0; i < n * p; i++)
            x[i] = (float)(2 * gauss());
        for (size_t i = 0; i < nw; i++)
            w[i] = (float)(2 * gauss());
        kernels_kda_conv_taps(taps_pk, p, kw, taps);
        assert_true(taps[(kw - 1) * p + 1] == taps_pk[kw + kw - 1]);
        use_isa(KERNELS_ISA_SCALAR);
        memcpy(y0, x, n * p * sizeof(float));
        memcpy(w0, w, nw * sizeof(float));
        kernels_kda_conv(NULL, y0, n, p, kw, taps, w0);
        /* against float64, and the window holds the last kw-1 inputs */
        for (size_t t = 0; t < n; t++)
            for (size_t ch = 0; ch < p; ch++) {
                double acc = 0, mag = 0;
                for (size_t j = 0; j < kw; j++) {
                    long src = (long)t - (long)(kw - 1) + (long)j;
                    double in = src >= 0 ? x[(size_t)src * p + ch] : w[(size_t)((long)nw / (long)p + src) * p + ch];
                    acc += (double)taps_pk[ch * kw + j] * in;
                    mag += fabs((double)taps_pk[ch * kw + j] * in);
                }
                /* kw roundings of the sum (SiLU' <= 1.1), then a few ulp of SiLU */
                double ref = acc / (1.0 + exp(-acc)), got = y0[t * p + ch];
                assert_true(fabs(got - ref) <= ldexp(1.0, -24) * (1.1 * (double)kw * mag + 6 * fabs(ref)));
            }
        for (size_t j = 0; j + 1 < kw; j++) {
            long src = (long)n - (long)(kw - 1) + (long)j;
            for (size_t ch = 0; ch < p; ch++)
                assert_true(w0[j * p + ch] == (src >= 0 ? x[(size_t)src * p + ch]
                                                        : w[(size_t)((long)nw / (long)p + src) * p + ch]));
        }
        for (size_t i = 1; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            memcpy(y1, x, n * p * sizeof(float));
            memcpy(w1, w, nw * sizeof(float));
            kernels_kda_conv(pool, y1, n, p, kw, taps, w1);
            assert_memory_equal(y0, y1, n * p * sizeof(float));
            assert_memory_equal(w0, w1, nw * sizeof(float));
            memcpy(y1, x, n * p * sizeof(float));
            memcpy(w1, w, nw * sizeof(float));
            for (size_t t = 0; t < n; t++)
                kernels_kda_conv(NULL, y1 + t * p, 1, p, kw, taps, w1);
            assert_memory_equal(y0, y1, n * p * sizeof(float));
            assert_memory_equal(w0, w1, nw * sizeof(float));
        }
        free(taps_pk);
        free(taps);
        free(x);
        free(y0);
        free(y1);
        free(w);
        free(w0);
        free(w1);
    }
    use_isa(best_isa());
    kernels_pool_free(pool);
}

/* The decay: every ISA bit for bit (tails, threads), against float64 and
 * against the engine's libm form (ops.c's sigmoid and expf). */
static void test_kda_decay(void **state)
{
    static const size_t ps[] = { 37, 12288 };
    kernels_pool *pool = kernels_pool_new(2);
    (void)state;
    for (size_t pi = 0; pi < 2; pi++) {
        size_t p = ps[pi], n = 3;
        float *z = malloc(n * p * sizeof(float)), *z0 = malloc(n * p * sizeof(float));
        float *z1 = malloc(n * p * sizeof(float)), *A = malloc(p * sizeof(float));
        float *dt = malloc(p * sizeof(float));
        for (size_t i = 0; i < n * p; i++)
            z[i] = (float)(3 * gauss());
        z[0] = 80.0f;
        z[1] = -80.0f;
        for (size_t c = 0; c < p; c++) {
            A[c] = (float)exp(gauss());
            dt[c] = (float)(0.5 * gauss());
        }
        use_isa(KERNELS_ISA_SCALAR);
        memcpy(z0, z, n * p * sizeof(float));
        kernels_kda_decay(NULL, z0, n, p, A, dt, -5.0f);
        for (size_t i = 0; i < n * p; i++) {
            double a = (double)A[i % p] * ((double)z[i] + dt[i % p]);
            double ref = exp(-5.0 / (1.0 + exp(-a)));
            /* the rounding of a, amplified by 5·a·s(1-s): the libm form
             * shows the same worst case (11.5 u measured for both) */
            assert_true(fabs(z0[i] - ref) <= 16 * 5.9604644775390625e-08 * ref);
        }
        for (size_t i = 1; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            memcpy(z1, z, n * p * sizeof(float));
            kernels_kda_decay(pool, z1, n, p, A, dt, -5.0f);
            assert_memory_equal(z0, z1, n * p * sizeof(float));
        }
        free(z);
        free(z0);
        free(z1);
        free(A);
        free(dt);
    }
    use_isa(best_isa());
    kernels_pool_free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_exp),
        cmocka_unit_test(test_kv_convert),
        cmocka_unit_test(test_mla_isas_bitexact),
        cmocka_unit_test(test_mla_threads),
        cmocka_unit_test(test_mla_chunk_vs_token),
        cmocka_unit_test(test_mla_vs_float64),
        cmocka_unit_test(test_mla_bad_args),
        cmocka_unit_test(test_mla_expanded),
        cmocka_unit_test(test_mla_expanded_bad_args),
        cmocka_unit_test(test_kda_step),
        cmocka_unit_test(test_kda_step_bad_args),
        cmocka_unit_test(test_kda_conv),
        cmocka_unit_test(test_kda_decay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
