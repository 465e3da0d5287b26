/* test_kernels.c — engine/kernels: every product against an independent
 * double-precision decode and every ISA variant against the scalar
 * reference; quantizers, SiTU, the expert helper, the pool, edge cases.
 *
 * Tolerances.  For a sum of m products computed in f32 in any order (with
 * or without FMA) the error is at most gamma_m * sum|w_j x_j| with
 * gamma_m ~ m * 2^-24 (Higham, Accuracy and Stability, 3.1); the tests use
 * (m + 2) * 2^-24 * sum|w_j x_j|.  The fast path sums each block's
 * products exactly in integers, so only the per-block scale product, one
 * FMA per block (MXFP4: nb/16 per accumulator, then a 4-step reduction;
 * int8: nb/4 per lane accumulator, then 5 steps) round: its bound against
 * the dequantized activations is (nb + 8) * 2^-24 * sum.
 * Bit-exact comparisons use memcmp.
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

#include "engine/kernels/kernels.h"

#define U 5.9604644775390625e-08 /* 2^-24 */

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static float rnd_float(void) /* roughly N(0,1) with rare outliers */
{
    double s = 0;
    for (int i = 0; i < 4; i++)
        s += (double)(rnd() >> 11) / 9007199254740992.0 - 0.5;
    if (rnd() % 97 == 0)
        s *= 40;
    return (float)(s * 1.7);
}

static void fill_floats(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = rnd_float();
}

/* An MXFP4 matrix in one allocation, its records at odd offsets. */
struct mat {
    uint8_t *mem;
    kernels_mxfp4 w;
};

static void mat_make(struct mat *m, size_t rows, size_t cols, int zero_scale_every)
{
    size_t np = rows * cols / 2, ns = rows * cols / 32;
    uint8_t *p, *s;
    m->mem = malloc(np + ns + 16);
    assert_non_null(m->mem);
    p = m->mem + 1 + rnd() % 3;  /* unaligned on purpose */
    s = p + np + 1;
    for (size_t i = 0; i < np; i++)
        p[i] = (uint8_t)rnd();
    for (size_t i = 0; i < ns; i++) {
        s[i] = (uint8_t)(119 + rnd() % 12);
        if (zero_scale_every && rnd() % (unsigned)zero_scale_every == 0)
            s[i] = 0;
    }
    m->w = (kernels_mxfp4){ p, s, rows, cols };
}

/* Independent decode: e2m1 table in double, ldexp for the scale. */
static double w_ref(const kernels_mxfp4 *w, size_t r, size_t j)
{
    static const double e2m1[8] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6 };
    uint8_t byte = w->packed[r * w->cols / 2 + j / 2];
    int code = (j % 2) ? byte >> 4 : byte & 15;
    int s = w->scale[r * w->cols / 32 + j / 32];
    double v = e2m1[code & 7] * (code & 8 ? -1 : 1);
    return s == 0 ? 0.0 : ldexp(v, s - 127);
}

/* sum w*x in double and sum |w*x|, for one row and an f32 vector. */
static void dot_ref(const kernels_mxfp4 *w, size_t r, const float *x, double *y, double *mag)
{
    *y = 0;
    *mag = 0;
    for (size_t j = 0; j < w->cols; j++) {
        double t = w_ref(w, r, j) * (double)x[j];
        *y += t;
        *mag += fabs(t);
    }
}

static const kernels_isa all_isas[] = { KERNELS_ISA_SCALAR, KERNELS_ISA_AVX2,
                                        KERNELS_ISA_AVX512VNNI, KERNELS_ISA_NEON };
#define N_ISAS (sizeof all_isas / sizeof all_isas[0])

static void use_isa(kernels_isa isa)
{
    assert_int_equal(kernels_set_isa(isa, NULL), 0);
}

/* Shapes with every block count mod 4 and both tiny and K3-sized rows. */
static const size_t test_cols[] = { 32, 64, 96, 128, 160, 224, 1024, 3584 };
#define N_COLS (sizeof test_cols / sizeof test_cols[0])

/* ---- MXFP4 exact ------------------------------------------------------------- */

static void check_exact_against_double(kernels_isa isa, kernels_pool *pool)
{
    use_isa(isa);
    for (size_t ci = 0; ci < N_COLS; ci++) {
        size_t cols = test_cols[ci], rows = 1 + rnd() % 70, n = 1 + rnd() % 3;
        struct mat m;
        float *x = malloc(n * cols * sizeof *x), *y = malloc(n * rows * sizeof *y);
        mat_make(&m, rows, cols, 0);
        fill_floats(x, n * cols);
        assert_int_equal(kernels_mxfp4_mul_exact(pool, &m.w, x, n, y, NULL), 0);
        for (size_t v = 0; v < n; v++)
            for (size_t r = 0; r < rows; r++) {
                double yd, mag;
                dot_ref(&m.w, r, x + v * cols, &yd, &mag);
                if (fabs((double)y[v * rows + r] - yd) > (double)(cols + 2) * U * mag + 1e-30)
                    fail_msg("%s exact cols=%zu r=%zu: %.9g vs %.9g (mag %.3g)",
                             kernels_isa_name(isa), cols, r, (double)y[v * rows + r], yd, mag);
            }
        free(m.mem);
        free(x);
        free(y);
    }
}

static void test_mxfp4_exact_vs_ldexp(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_ISAS; i++)
        if (kernels_isa_supported(all_isas[i]))
            check_exact_against_double(all_isas[i], NULL);
}

/* ---- MXFP4 fast -------------------------------------------------------------- */

static void test_mxfp4_fast_vs_dequantized(void **state)
{
    (void)state;
    use_isa(KERNELS_ISA_SCALAR);
    for (size_t ci = 0; ci < N_COLS; ci++) {
        size_t cols = test_cols[ci], rows = 1 + rnd() % 40, nb = cols / 32;
        struct mat m;
        float *x = malloc(cols * sizeof *x), *y = malloc(rows * sizeof *y);
        kernels_act *a = kernels_act_new(cols, 1);
        mat_make(&m, rows, cols, 0);
        fill_floats(x, cols);
        assert_int_equal(kernels_act_quantize(a, x, cols, 1, NULL), 0);
        assert_int_equal(kernels_mxfp4_mul_fast(NULL, &m.w, a, y, NULL), 0);
        for (size_t r = 0; r < rows; r++) {
            double yd = 0, mag = 0, yx = 0, qerr = 0;
            for (size_t j = 0; j < cols; j++) {
                double wj = w_ref(&m.w, r, j), amax = 0;
                yd += wj * (double)kernels_act_value(a, 0, j);
                mag += fabs(wj * (double)kernels_act_value(a, 0, j));
                yx += wj * (double)x[j];
                for (size_t k = j / 32 * 32; k < j / 32 * 32 + 32; k++)
                    amax = fmax(amax, fabs((double)x[k]));
                qerr += fabs(wj) * amax / 254 * (1 + 1e-5);
            }
            if (fabs((double)y[r] - yd) > (double)(nb + 8) * U * mag + 1e-30)
                fail_msg("fast cols=%zu r=%zu: %.9g vs %.9g", cols, r, (double)y[r], yd);
            /* Against the f32 activations: the quantization error, at most
             * half a step (amax/254 of the block) per activation. */
            if (fabs((double)y[r] - yx) > qerr + (double)(nb + 8) * U * mag + 1e-30)
                fail_msg("fast vs f32 cols=%zu r=%zu: %.9g vs %.9g (bound %.3g)", cols, r,
                         (double)y[r], yx, qerr);
        }
        kernels_act_free(a);
        free(m.mem);
        free(x);
        free(y);
    }
}

/* Every ISA's fast product, single and batched, memcmp-equal to scalar;
 * the last shape's rows are too long for the batched row buffer. */
/* Fast MXFP4 of m and a on every supported ISA equals scalar, bit for bit
 * (y0, y1: n * rows floats of scratch). */
static void expect_isas_equal(const struct mat *m, const kernels_act *a, float *y0, float *y1,
                              size_t rows, size_t n, const char *what, size_t cols)
{
    use_isa(KERNELS_ISA_SCALAR);
    assert_int_equal(kernels_mxfp4_mul_fast(NULL, &m->w, a, y0, NULL), 0);
    for (size_t i = 1; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        memset(y1, 0xAB, n * rows * sizeof *y1);
        assert_int_equal(kernels_mxfp4_mul_fast(NULL, &m->w, a, y1, NULL), 0);
        if (memcmp(y0, y1, n * rows * sizeof *y0) != 0)
            fail_msg("%s %s differs from scalar: cols=%zu rows=%zu n=%zu",
                     kernels_isa_name(all_isas[i]), what, cols, rows, n);
    }
}

/* Fast MXFP4 on every supported ISA against scalar, bit for bit, for one
 * random rows x cols matrix (mat_make's zero_scale_every) and n vectors. */
static void check_fast_vs_scalar(size_t cols, size_t rows, size_t n, int zero_scale_every,
                                 const char *what)
{
    struct mat m;
    float *x = malloc(n * cols * sizeof *x);
    float *y0 = malloc(n * rows * sizeof *y0), *y1 = malloc(n * rows * sizeof *y1);
    kernels_act *a = kernels_act_new(cols, n);
    mat_make(&m, rows, cols, zero_scale_every);
    fill_floats(x, n * cols);
    assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
    expect_isas_equal(&m, a, y0, y1, rows, n, what, cols);
    kernels_act_free(a);
    free(m.mem);
    free(x);
    free(y0);
    free(y1);
}

static void test_mxfp4_fast_variants_bitexact(void **state)
{
    (void)state;
    for (int iter = 0; iter < 4; iter++)
        for (size_t ci = 0; ci < N_COLS; ci++) {
            size_t cols = iter == 3 ? 16384 + 32 * (ci + 1) : test_cols[ci];
            size_t rows = 1 + rnd() % (iter == 3 ? 5 : 67), n = 1 + rnd() % 4;
            check_fast_vs_scalar(cols, rows, n, 17, "fast");
        }
}

/* Batched fast MXFP4 against scalar at the edges of the float range (the
 * batched kernels compute c = (s * 0.5) * d per block and row like the
 * scalar one, and must keep its bits where c is subnormal or zero).
 * Scenarios: realistic scales, scales over the whole ue8m0 range, tiny
 * activations times small scales (subnormal products), and all-zero
 * activation blocks. */
static void test_mxfp4_fast_batched_scale_edges(void **state)
{
    (void)state;
    for (int sc = 0; sc < 4; sc++)
        for (size_t ci = 0; ci < N_COLS; ci++) {
            size_t cols = test_cols[ci], nb = cols / 32;
            size_t rows = 1 + rnd() % 67, n = 2 + rnd() % 5;
            struct mat m;
            float *x = malloc(n * cols * sizeof *x);
            float *y0 = malloc(n * rows * sizeof *y0), *y1 = malloc(n * rows * sizeof *y1);
            kernels_act *a = kernels_act_new(cols, n);
            uint8_t *s;
            mat_make(&m, rows, cols, 0);
            s = (uint8_t *)m.w.scale;
            fill_floats(x, n * cols);
            for (size_t i = 0; i < rows * nb; i++) {
                if (sc == 1)
                    s[i] = (uint8_t)(1 + rnd() % 254);
                else if (sc == 2)
                    s[i] = (uint8_t)(2 + rnd() % 20);
            }
            for (size_t i = 0; i < n * cols; i++) {
                if (sc == 2)
                    x[i] *= 1e-30f;
                else if (sc == 3 && (i / 32) % 5 == 2)
                    x[i] = 0;
            }
            assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
            {
                char what[64];
                snprintf(what, sizeof what, "batched fast, scenario %d,", sc);
                expect_isas_equal(&m, a, y0, y1, rows, n, what, cols);
            }
            kernels_act_free(a);
            free(m.mem);
            free(x);
            free(y0);
            free(y1);
        }
}

/* Batched fast MXFP4 with whole 16-row tiles (AVX-512 puts 16 rows in the
 * lanes of a register) and more vectors than one pass of the tile kernel
 * takes (64): rows 16, 37 (two tiles and 5 single rows), 85; column counts
 * with a partial last group and blocks after the last full 16; memcmp-equal
 * to scalar. */
static void test_mxfp4_fast_batched_tiles(void **state)
{
    static const size_t cols_t[] = { 32, 96, 544, 1024, 3584 };
    static const size_t rows_t[] = { 16, 37, 85 };
    static const size_t n_t[] = { 2, 33, 70 };
    (void)state;
    for (size_t ci = 0; ci < sizeof cols_t / sizeof cols_t[0]; ci++)
        for (size_t ri = 0; ri < sizeof rows_t / sizeof rows_t[0]; ri++)
            for (size_t ni = 0; ni < sizeof n_t / sizeof n_t[0]; ni++) {
                size_t cols = cols_t[ci], rows = rows_t[ri], n = n_t[ni];
                if (cols * rows * n > 8000000)
                    continue;  /* keeps the scalar reference quick */
                check_fast_vs_scalar(cols, rows, n, 13, "batched fast (tiles)");
            }
}

/* Batched int8 products (n > 1, row tiles) memcmp-equal to scalar. */
static void test_q8_batched_bitexact(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < N_COLS; ci++) {
        size_t cols = test_cols[ci], rows = 1 + rnd() % 67, n = 2 + rnd() % 5;
        float *w = malloc(rows * cols * sizeof *w), *x = malloc(n * cols * sizeof *x);
        int8_t *q = malloc(rows * cols + 5);
        float *sc = malloc(rows * sizeof *sc);
        float *y0 = malloc(n * rows * sizeof *y0), *y1 = malloc(n * rows * sizeof *y1);
        kernels_act *a = kernels_act_new(cols, n);
        fill_floats(w, rows * cols);
        fill_floats(x, n * cols);
        assert_int_equal(kernels_q8_quantize_f32(w, rows, cols, q + 5, sc, NULL), 0);
        kernels_q8 m = { q + 5, sc, rows, cols };
        assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
        use_isa(KERNELS_ISA_SCALAR);
        assert_int_equal(kernels_q8_mul(NULL, &m, a, y0, NULL), 0);
        for (size_t i = 1; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            memset(y1, 0xAB, n * rows * sizeof *y1);
            assert_int_equal(kernels_q8_mul(NULL, &m, a, y1, NULL), 0);
            if (memcmp(y0, y1, n * rows * sizeof *y0) != 0)
                fail_msg("%s batched q8 differs from scalar: cols=%zu rows=%zu n=%zu",
                         kernels_isa_name(all_isas[i]), cols, rows, n);
        }
        kernels_act_free(a);
        free(w);
        free(x);
        free(q);
        free(sc);
        free(y0);
        free(y1);
    }
}

/* ---- batch and threads ---------------------------------------------------- */

struct prod_case {
    struct mat m;
    kernels_q8 q8;
    int8_t *q8q;
    float *q8s;
    kernels_f32 f;
    float *fw;
    size_t rows, cols, n;
    float *x;
    kernels_act *a;
};

static void case_make(struct prod_case *c, size_t rows, size_t cols, size_t n)
{
    float *wf = malloc(rows * cols * sizeof *wf);
    c->rows = rows;
    c->cols = cols;
    c->n = n;
    mat_make(&c->m, rows, cols, 0);
    c->q8q = malloc(rows * cols + 8);
    c->q8s = malloc(rows * sizeof *c->q8s);
    c->fw = malloc(rows * cols * sizeof *c->fw);
    fill_floats(wf, rows * cols);
    memcpy(c->fw, wf, rows * cols * sizeof *wf);
    /* int8 weights at an odd address too */
    assert_int_equal(kernels_q8_quantize_f32(wf, rows, cols, c->q8q + 3, c->q8s, NULL), 0);
    c->q8 = (kernels_q8){ c->q8q + 3, c->q8s, rows, cols };
    c->f = (kernels_f32){ c->fw, rows, cols };
    c->x = malloc(n * cols * sizeof *c->x);
    fill_floats(c->x, n * cols);
    c->a = kernels_act_new(cols, n);
    assert_int_equal(kernels_act_quantize(c->a, c->x, cols, n, NULL), 0);
    free(wf);
}

static void case_free(struct prod_case *c)
{
    free(c->m.mem);
    free(c->q8q);
    free(c->q8s);
    free(c->fw);
    free(c->x);
    kernels_act_free(c->a);
}

/* All four products of a case into y [4][n][rows]. */
static void case_run(struct prod_case *c, kernels_pool *pool, float *y)
{
    size_t one = c->n * c->rows;
    assert_int_equal(kernels_mxfp4_mul_fast(pool, &c->m.w, c->a, y, NULL), 0);
    assert_int_equal(kernels_mxfp4_mul_exact(pool, &c->m.w, c->x, c->n, y + one, NULL), 0);
    assert_int_equal(kernels_q8_mul(pool, &c->q8, c->a, y + 2 * one, NULL), 0);
    assert_int_equal(kernels_f32_mul(pool, &c->f, c->x, c->n, y + 3 * one, NULL), 0);
}

/* Batch of n == n single-vector calls, bit for bit, every ISA. */
static void test_batch_equals_single_calls(void **state)
{
    (void)state;
    struct prod_case c;
    size_t rows = 71, cols = 160, n = 5;
    float *yb = malloc(4 * n * rows * sizeof *yb), *ys = malloc(4 * rows * sizeof *ys);
    kernels_act *a1 = kernels_act_new(cols, 1);
    case_make(&c, rows, cols, n);
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        case_run(&c, NULL, yb);
        for (size_t v = 0; v < n; v++) {
            const float *xv = c.x + v * cols;
            assert_int_equal(kernels_act_quantize(a1, xv, cols, 1, NULL), 0);
            assert_int_equal(kernels_mxfp4_mul_fast(NULL, &c.m.w, a1, ys, NULL), 0);
            assert_int_equal(kernels_mxfp4_mul_exact(NULL, &c.m.w, xv, 1, ys + rows, NULL), 0);
            assert_int_equal(kernels_q8_mul(NULL, &c.q8, a1, ys + 2 * rows, NULL), 0);
            assert_int_equal(kernels_f32_mul(NULL, &c.f, xv, 1, ys + 3 * rows, NULL), 0);
            for (int k = 0; k < 4; k++)
                if (memcmp(yb + k * n * rows + v * rows, ys + k * rows, rows * sizeof(float)))
                    fail_msg("%s product %d vector %zu: batch differs", kernels_isa_name(all_isas[i]),
                             k, v);
        }
    }
    kernels_act_free(a1);
    case_free(&c);
    free(yb);
    free(ys);
}

/* 2 and 3 threads give the same bits as the caller alone. */
static void test_threads_bitexact(void **state)
{
    (void)state;
    struct prod_case c;
    size_t rows = 131, cols = 96, n = 3, all = 4 * n * rows;
    float *y1 = malloc(all * sizeof *y1), *yt = malloc(all * sizeof *yt);
    kernels_pool *p2 = kernels_pool_new(2), *p3 = kernels_pool_new(3);
    assert_non_null(p2);
    assert_non_null(p3);
    assert_int_equal(kernels_pool_nthreads(p3), 3);
    case_make(&c, rows, cols, n);
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        case_run(&c, NULL, y1);
        case_run(&c, p2, yt);
        assert_memory_equal(y1, yt, all * sizeof *y1);
        memset(yt, 0, all * sizeof *yt);
        case_run(&c, p3, yt);
        assert_memory_equal(y1, yt, all * sizeof *y1);
    }
    check_exact_against_double(kernels_get_isa(), p3);
    kernels_pool_free(p2);
    kernels_pool_free(p3);
    case_free(&c);
    free(y1);
    free(yt);
}

/* ---- int8 and f32 ---------------------------------------------------------- */

static void test_q8_products(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < N_COLS; ci++) {
        struct prod_case c;
        size_t rows = 1 + rnd() % 50, cols = test_cols[ci], nb = cols / 32;
        float *y0 = malloc(rows * sizeof *y0), *y1 = malloc(rows * sizeof *y1);
        case_make(&c, rows, cols, 1);
        use_isa(KERNELS_ISA_SCALAR);
        assert_int_equal(kernels_q8_mul(NULL, &c.q8, c.a, y0, NULL), 0);
        for (size_t r = 0; r < rows; r++) {
            double yd = 0, mag = 0;
            for (size_t j = 0; j < cols; j++) {
                double t = (double)kernels_q8_value(&c.q8, r, j) * kernels_act_value(c.a, 0, j);
                yd += t;
                mag += fabs(t);
            }
            if (fabs((double)y0[r] - yd) > (double)(nb + 10) * U * mag + 1e-30)
                fail_msg("q8 cols=%zu r=%zu: %.9g vs %.9g", cols, r, (double)y0[r], yd);
        }
        for (size_t i = 1; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            assert_int_equal(kernels_q8_mul(NULL, &c.q8, c.a, y1, NULL), 0);
            if (memcmp(y0, y1, rows * sizeof *y0))
                fail_msg("%s q8 differs from scalar, cols=%zu", kernels_isa_name(all_isas[i]), cols);
        }
        case_free(&c);
        free(y0);
        free(y1);
    }
}

static void test_f32_products(void **state)
{
    (void)state;
    static const size_t cols_list[] = { 1, 7, 32, 45, 100, 3584 };
    for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ci++) {
        size_t cols = cols_list[ci], rows = 1 + rnd() % 80, n = 2;
        float *w = malloc(rows * cols * sizeof *w), *x = malloc(n * cols * sizeof *x);
        float *y = malloc(n * rows * sizeof *y);
        kernels_f32 m = { w, rows, cols };
        fill_floats(w, rows * cols);
        fill_floats(x, n * cols);
        for (size_t i = 0; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            assert_int_equal(kernels_f32_mul(NULL, &m, x, n, y, NULL), 0);
            for (size_t v = 0; v < n; v++)
                for (size_t r = 0; r < rows; r++) {
                    double yd = 0, mag = 0;
                    for (size_t j = 0; j < cols; j++) {
                        double t = (double)w[r * cols + j] * x[v * cols + j];
                        yd += t;
                        mag += fabs(t);
                    }
                    if (fabs((double)y[v * rows + r] - yd) > (double)(cols + 2) * U * mag)
                        fail_msg("%s f32 cols=%zu", kernels_isa_name(all_isas[i]), cols);
                }
        }
        free(w);
        free(x);
        free(y);
    }
}

/* ---- quantizers and conversions -------------------------------------------- */

static void test_act_quantize(void **state)
{
    (void)state;
    size_t cols = 128;
    float x[2 * 128];
    kernels_act *a = kernels_act_new(cols, 2);
    shoal_err e;
    assert_non_null(a);
    fill_floats(x, 2 * cols);
    for (size_t j = 32; j < 64; j++)
        x[j] = 0;  /* one all-zero block */
    x[70] = 1000;  /* an outlier in another block */
    assert_int_equal(kernels_act_quantize(a, x, cols, 2, NULL), 0);
    assert_int_equal(kernels_act_cols(a), cols);
    assert_int_equal(kernels_act_count(a), 2);
    for (size_t v = 0; v < 2; v++)
        for (size_t b = 0; b < cols / 32; b++) {
            float amax = 0;
            for (size_t j = 0; j < 32; j++)
                amax = fmaxf(amax, fabsf(x[v * cols + b * 32 + j]));
            for (size_t j = 0; j < 32; j++) {
                float deq = kernels_act_value(a, v, b * 32 + j), xj = x[v * cols + b * 32 + j];
                assert_false(isnan(deq));
                /* half a step of amax/127, plus float rounding */
                assert_true(fabs((double)deq - xj) <= amax / 254.0 * (1 + 1e-5) + 1e-30);
                if (amax == 0)
                    assert_true(deq == 0);
            }
        }
    assert_true(kernels_act_value(a, 0, 70) == 1000);
    /* shapes and values it must refuse */
    assert_int_equal(kernels_act_quantize(a, x, 48, 1, &e), SHOAL_EINVAL);
    assert_int_equal(kernels_act_quantize(a, x, 128, 3, NULL), SHOAL_EINVAL);
    assert_int_equal(kernels_act_quantize(a, x, 256, 1, NULL), 0);  /* same room, other shape */
    x[5] = NAN;
    assert_int_equal(kernels_act_quantize(a, x, cols, 1, NULL), SHOAL_ERANGE);
    x[5] = INFINITY;
    assert_int_equal(kernels_act_quantize(a, x, cols, 1, NULL), SHOAL_ERANGE);
    assert_null(kernels_act_new(33, 1));
    assert_null(kernels_act_new(32, 0));
    kernels_act_free(a);
    kernels_act_free(NULL);
}

static void test_q8_quantizers(void **state)
{
    (void)state;
    size_t rows = 9, cols = 96;
    float *w = malloc(rows * cols * sizeof *w), *wb = malloc(rows * cols * sizeof *wb);
    uint8_t *bf = malloc(rows * cols * 2 + 1);
    int8_t *q1 = malloc(rows * cols), *q2 = malloc(rows * cols);
    float s1[9], s2[9];
    fill_floats(w, rows * cols);
    for (size_t j = 0; j < cols; j++)
        w[4 * cols + j] = 0;  /* a zero row */
    /* BF16 bytes at an odd address; widened reference by bits << 16 */
    for (size_t i = 0; i < rows * cols; i++) {
        uint32_t bits;
        memcpy(&bits, &w[i], 4);
        bf[1 + 2 * i] = (uint8_t)(bits >> 16);
        bf[2 + 2 * i] = (uint8_t)(bits >> 24);
        bits &= 0xFFFF0000u;
        memcpy(&wb[i], &bits, 4);
    }
    assert_int_equal(kernels_q8_quantize_f32(w, rows, cols, q1, s1, NULL), 0);
    assert_int_equal(kernels_q8_quantize_bf16(bf + 1, rows, cols, q2, s2, NULL), 0);
    kernels_q8 m1 = { q1, s1, rows, cols };
    for (size_t r = 0; r < rows; r++) {
        float amax = 0;
        for (size_t j = 0; j < cols; j++)
            amax = fmaxf(amax, fabsf(w[r * cols + j]));
        assert_true(s1[r] == amax / 127.0f);
        for (size_t j = 0; j < cols; j++)
            assert_true(fabs((double)kernels_q8_value(&m1, r, j) - w[r * cols + j]) <=
                        amax / 254.0 * (1 + 1e-5) + 1e-30);
    }
    assert_true(s1[4] == 0);
    /* BF16 quantizer == f32 quantizer on the widened values */
    assert_int_equal(kernels_q8_quantize_f32(wb, rows, cols, q1, s1, NULL), 0);
    assert_memory_equal(q1, q2, rows * cols);
    assert_memory_equal(s1, s2, sizeof s1);
    assert_int_equal(kernels_q8_quantize_f32(w, rows, 40, q1, s1, NULL), SHOAL_EINVAL);
    w[7] = NAN;
    assert_int_equal(kernels_q8_quantize_f32(w, rows, cols, q1, s1, NULL), SHOAL_ERANGE);
    free(w);
    free(wb);
    free(bf);
    free(q1);
    free(q2);
}

static void test_bf16_to_f32(void **state)
{
    (void)state;
    const uint8_t src[] = { 0xEE, 0x80, 0x3F, 0x00, 0xC0, 0x00, 0x00, 0x80, 0x7F };
    float out[4];
    kernels_bf16_to_f32(src + 1, out, 4);  /* unaligned */
    assert_true(out[0] == 1.0f);
    assert_true(out[1] == -2.0f);
    assert_true(out[2] == 0.0f);
    assert_true(isinf(out[3]) && out[3] > 0);
}

/* ---- edge cases --------------------------------------------------------------- */

static void test_edges_zero_scale_and_zero_input(void **state)
{
    (void)state;
    size_t rows = 70, cols = 96;
    struct mat m;
    float x[96], zero[96] = { 0 }, y[70];
    kernels_act *a = kernels_act_new(cols, 1);
    mat_make(&m, rows, cols, 0);
    memset((uint8_t *)m.w.scale, 0, rows * cols / 32);
    fill_floats(x, cols);
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        assert_int_equal(kernels_act_quantize(a, x, cols, 1, NULL), 0);
        assert_int_equal(kernels_mxfp4_mul_fast(NULL, &m.w, a, y, NULL), 0);
        for (size_t r = 0; r < rows; r++)
            assert_true(y[r] == 0);
        assert_int_equal(kernels_mxfp4_mul_exact(NULL, &m.w, x, 1, y, NULL), 0);
        for (size_t r = 0; r < rows; r++)
            assert_true(y[r] == 0);
    }
    free(m.mem);
    mat_make(&m, rows, cols, 0);
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        assert_int_equal(kernels_act_quantize(a, zero, cols, 1, NULL), 0);
        assert_true(kernels_act_value(a, 0, 5) == 0);
        assert_int_equal(kernels_mxfp4_mul_fast(NULL, &m.w, a, y, NULL), 0);
        for (size_t r = 0; r < rows; r++)
            assert_true(y[r] == 0 && !isnan(y[r]));
    }
    kernels_act_free(a);
    free(m.mem);
}

static void test_bad_shapes_and_isa(void **state)
{
    (void)state;
    uint8_t bytes[64] = { 0 };
    float x[48] = { 0 }, y[2] = { 7, 7 };
    kernels_mxfp4 bad = { bytes, bytes, 2, 48 };
    kernels_mxfp4 ok = { bytes, bytes, 1, 64 };
    kernels_q8 q8bad = { (const int8_t *)bytes, x, 1, 48 };
    kernels_act *a = kernels_act_new(32, 1);
    shoal_err e;
    shoal_err_clear(&e);
    assert_int_equal(kernels_mxfp4_mul_exact(NULL, &bad, x, 1, y, &e), SHOAL_EINVAL);
    assert_int_equal(e.code, SHOAL_EINVAL);
    assert_true(y[0] == 7);
    assert_int_equal(kernels_act_quantize(a, x, 32, 1, NULL), 0);
    assert_int_equal(kernels_mxfp4_mul_fast(NULL, &bad, a, y, NULL), SHOAL_EINVAL);
    assert_int_equal(kernels_mxfp4_mul_fast(NULL, &ok, a, y, NULL), SHOAL_EINVAL);  /* 32 != 64 */
    assert_int_equal(kernels_q8_mul(NULL, &q8bad, a, y, NULL), SHOAL_EINVAL);
    assert_true(y[0] == 7);
#if defined(__x86_64__)
    assert_int_equal(kernels_set_isa(KERNELS_ISA_NEON, &e), SHOAL_EUNSUPPORTED);
#endif
    assert_int_equal(kernels_set_isa(KERNELS_ISA_COUNT_, NULL), SHOAL_EUNSUPPORTED);
    assert_string_equal(kernels_isa_name(KERNELS_ISA_AVX2), "avx2");
    assert_true(kernels_isa_supported(KERNELS_ISA_SCALAR));
    kernels_act_free(a);
}

/* ---- SiTU, expert, pool --------------------------------------------------------- */

static void test_situ(void **state)
{
    (void)state;
    float g[200], u[200], h[200];
    for (int i = 0; i < 200; i++) {
        g[i] = (float)(i - 100) * 0.37f;
        u[i] = (float)(137 - i) * 0.71f;
    }
    g[0] = -1e30f;  /* σ underflows to 0: no NaN */
    kernels_situ(g, u, h, 200, 4.0f, 25.0f);
    for (int i = 0; i < 200; i++) {
        double gd = g[i], ud = u[i];
        double ref = 4 * tanh(gd / 4) / (1 + exp(-gd)) * 25 * tanh(ud / 25);
        assert_false(isnan(h[i]));
        assert_true(fabs(h[i] - ref) <= 1e-5 * (fabs(ref) + 1e-3));
    }
}

/* SiTU (own exp/tanh in double, no libm) against float64 over a wide range, and every
 * ISA bit-identical to the scalar one (tails included: odd n). */
static void test_situ_isas_bitexact(void **state)
{
    (void)state;
    size_t n = 4099;
    float *g = malloc(n * sizeof *g), *u = malloc(n * sizeof *u);
    float *h0 = malloc(n * sizeof *h0), *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        /* magnitudes from 1e-8 to ~300, both signs */
        double e = (double)(rnd() % 1000) / 1000.0 * 18 - 10;
        g[i] = (float)(pow(2.0, e) * (rnd() & 1 ? 1 : -1));
        u[i] = (float)(pow(2.0, (double)(rnd() % 1000) / 1000.0 * 20 - 11) * (rnd() & 1 ? 1 : -1));
    }
    g[0] = 0;
    u[1] = 0;
    g[2] = -0.0f;
    g[3] = 1e30f;
    u[4] = -1e30f;
    use_isa(KERNELS_ISA_SCALAR);
    kernels_situ(g, u, h0, n, 4.0f, 25.0f);
    for (size_t i = 0; i < n; i++) {
        double gd = g[i], ud = u[i];
        double ref = 4 * tanh(gd / 4) / (1 + exp(-gd)) * 25 * tanh(ud / 25);
        /* exp and tanh correctly rounded, then 8 f32 roundings at most
         * (divisions, 1 + e, products): 8 * 2^-24 relative */
        if (!(fabs(h0[i] - ref) <= 8 * U * fabs(ref) + 1e-37))
            fail_msg("situ g=%.9g u=%.9g: %.9g vs %.9g", (double)g[i], (double)u[i], (double)h0[i], ref);
    }
    for (size_t k = 1; k < N_ISAS; k++) {
        if (!kernels_isa_supported(all_isas[k]))
            continue;
        use_isa(all_isas[k]);
        for (size_t len = n - 3; len <= n; len++) {
            memset(h, 0xA5, n * sizeof *h);
            kernels_situ(g, u, h, len, 4.0f, 25.0f);
            if (memcmp(h, h0, len * sizeof *h) != 0)
                fail_msg("situ %s differs from scalar (n %zu)", kernels_isa_name(all_isas[k]), len);
        }
    }
    kernels_init();
    free(g);
    free(u);
    free(h0);
    free(h);
}

/* The activation quantizer of every ISA stores the scalar one's q, d and
 * bias terms: values compared directly, bias terms through a VNNI product
 * (it starts its lanes at them). */
static void test_act_quantize_isas_bitexact(void **state)
{
    (void)state;
    static const size_t colsl[] = { 32, 96, 160, 224, 3584 };
    for (size_t ci = 0; ci < sizeof colsl / sizeof colsl[0]; ci++) {
        size_t cols = colsl[ci], n = 3, rows = 70;
        float *x = malloc(n * cols * sizeof *x), *y0 = malloc(n * rows * sizeof *y0);
        float *y = malloc(n * rows * sizeof *y);
        kernels_act *a0 = kernels_act_new(cols, n), *a = kernels_act_new(cols, n);
        struct mat m;
        mat_make(&m, rows, cols, 0);
        fill_floats(x, n * cols);
        for (size_t j = 0; j < 32; j++)
            x[cols + j] = 0;                 /* an all-zero block */
        x[2 * cols + 5] = 3e-39f;            /* a subnormal */
        x[7] = -2.5f;
        use_isa(KERNELS_ISA_SCALAR);
        assert_int_equal(kernels_act_quantize(a0, x, cols, n, NULL), 0);
        kernels_isa prod_isa = kernels_isa_supported(KERNELS_ISA_AVX512VNNI) ? KERNELS_ISA_AVX512VNNI
                             : kernels_isa_supported(KERNELS_ISA_AVX2) ? KERNELS_ISA_AVX2
                                                                       : KERNELS_ISA_SCALAR;
        use_isa(prod_isa);
        assert_int_equal(kernels_mxfp4_mul_fast(NULL, &m.w, a0, y0, NULL), 0);
        for (size_t k = 1; k < N_ISAS; k++) {
            if (!kernels_isa_supported(all_isas[k]))
                continue;
            use_isa(all_isas[k]);
            assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
            for (size_t v = 0; v < n; v++)
                for (size_t j = 0; j < cols; j++) {
                    float f0 = kernels_act_value(a0, v, j), f1 = kernels_act_value(a, v, j);
                    if (memcmp(&f0, &f1, sizeof f0) != 0)
                        fail_msg("act %s cols=%zu v=%zu j=%zu: %.9g vs %.9g",
                                 kernels_isa_name(all_isas[k]), cols, v, j, (double)f1, (double)f0);
                }
            use_isa(prod_isa);
            assert_int_equal(kernels_mxfp4_mul_fast(NULL, &m.w, a, y, NULL), 0);
            assert_memory_equal(y, y0, n * rows * sizeof *y);
        }
        kernels_init();
        free(m.mem);
        free(x);
        free(y0);
        free(y);
        kernels_act_free(a0);
        kernels_act_free(a);
    }
}

static void test_expert_view(void **state)
{
    (void)state;
    kernels_expert e;
    const uint8_t *base = (const uint8_t *)(uintptr_t)0x1000;
    assert_int_equal(kernels_expert_span_bytes(3072, 3584), 17547264);
    assert_int_equal(kernels_expert_view(base, 3072, 3584, &e, NULL), 0);
    assert_ptr_equal(e.w1.packed, base);
    assert_ptr_equal(e.w1.scale, base + 5505024);
    assert_ptr_equal(e.w2.packed, base + 5505024 + 344064);
    assert_ptr_equal(e.w2.scale, base + 2 * 5505024 + 344064);
    assert_ptr_equal(e.w3.packed, base + 2 * 5505024 + 2 * 344064);
    assert_ptr_equal(e.w3.scale, base + 3 * 5505024 + 2 * 344064);
    assert_int_equal(e.w1.rows, 3072);
    assert_int_equal(e.w1.cols, 3584);
    assert_int_equal(e.w2.rows, 3584);
    assert_int_equal(e.w2.cols, 3072);
    assert_int_equal(kernels_expert_view(base, 3072, 3580, &e, NULL), SHOAL_EINVAL);
}

/* The fused expert == composing the public products by hand. */
static void expert_compose(const kernels_expert *e, const float *z, size_t n, const float *wt,
                           float *out, kernels_numerics mode, size_t I, size_t L)
{
    float *g = malloc(n * I * sizeof *g), *u = malloc(n * I * sizeof *u);
    float *y = malloc(n * L * sizeof *y);
    kernels_act *az = kernels_act_new(L, n), *ah = kernels_act_new(I, n);
    if (mode == KERNELS_FAST) {
        assert_int_equal(kernels_act_quantize(az, z, L, n, NULL), 0);
        assert_int_equal(kernels_mxfp4_mul_fast(NULL, &e->w1, az, g, NULL), 0);
        assert_int_equal(kernels_mxfp4_mul_fast(NULL, &e->w3, az, u, NULL), 0);
    } else {
        assert_int_equal(kernels_mxfp4_mul_exact(NULL, &e->w1, z, n, g, NULL), 0);
        assert_int_equal(kernels_mxfp4_mul_exact(NULL, &e->w3, z, n, u, NULL), 0);
    }
    kernels_situ(g, u, g, n * I, 4.0f, 25.0f);
    if (mode == KERNELS_FAST) {
        assert_int_equal(kernels_act_quantize(ah, g, I, n, NULL), 0);
        assert_int_equal(kernels_mxfp4_mul_fast(NULL, &e->w2, ah, y, NULL), 0);
    } else {
        assert_int_equal(kernels_mxfp4_mul_exact(NULL, &e->w2, g, n, y, NULL), 0);
    }
    for (size_t v = 0; v < n; v++)
        for (size_t r = 0; r < L; r++)
            out[v * L + r] += wt[v] * y[v * L + r];
    free(g);
    free(u);
    free(y);
    kernels_act_free(az);
    kernels_act_free(ah);
}

static void test_expert_apply(void **state)
{
    (void)state;
    size_t I = 96, L = 160, n = 3, span = kernels_expert_span_bytes(I, L);
    uint8_t *mem = malloc(span + 8);
    float z[3 * 160], o1[3 * 160], o2[3 * 160], wt[3] = { 0.5f, 0.25f, 0.125f };
    kernels_expert e;
    kernels_expert_ws *ws = kernels_expert_ws_new(I, L, n, 4.0f, 25.0f);
    kernels_pool *pool = kernels_pool_new(2);
    assert_non_null(ws);
    for (size_t i = 0; i < span + 8; i++)
        mem[i] = (uint8_t)rnd();
    assert_int_equal(kernels_expert_view(mem + 5, I, L, &e, NULL), 0);  /* odd offset */
    /* sane scales so h is neither saturated nor zero */
    uint8_t *scales[3] = { (uint8_t *)e.w1.scale, (uint8_t *)e.w2.scale, (uint8_t *)e.w3.scale };
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < I * L / 32; i++)
            scales[k][i] = (uint8_t)(120 + rnd() % 4);
    fill_floats(z, n * L);
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        for (int mode = 0; mode < 2; mode++)
            for (int pi = 0; pi < 2; pi++) {
                for (size_t j = 0; j < n * L; j++)
                    o1[j] = o2[j] = (float)j * 0.001f;
                assert_int_equal(kernels_expert_apply(ws, pi ? pool : NULL, &e, z, n, wt, o1,
                                                      (kernels_numerics)mode, NULL), 0);
                expert_compose(&e, z, n, wt, o2, (kernels_numerics)mode, I, L);
                if (memcmp(o1, o2, sizeof o1))
                    fail_msg("%s mode %d pool %d: expert differs from composition",
                             kernels_isa_name(all_isas[i]), mode, pi);
            }
    }
    /* a different shape is refused */
    kernels_expert e2;
    assert_int_equal(kernels_expert_view(mem, 64, L, &e2, NULL), 0);
    assert_int_equal(kernels_expert_apply(ws, NULL, &e2, z, 1, wt, o1, KERNELS_FAST, NULL),
                     SHOAL_EINVAL);
    assert_int_equal(kernels_expert_apply(ws, NULL, &e, z, 4, wt, o1, KERNELS_FAST, NULL),
                     SHOAL_EINVAL);
    kernels_expert_ws_free(ws);
    kernels_expert_ws_free(NULL);
    kernels_pool_free(pool);
    free(mem);
}

struct pool_probe {
    kernels_pool *pool;
    int hits[4];
    int phase1[4];
    int bad;
};

static void pool_probe_fn(void *ctx, int tid, int nthreads)
{
    struct pool_probe *p = ctx;
    p->hits[tid]++;
    __atomic_store_n(&p->phase1[tid], p->hits[tid], __ATOMIC_RELEASE);
    kernels_pool_barrier(p->pool);
    for (int t = 0; t < nthreads; t++)
        if (__atomic_load_n(&p->phase1[t], __ATOMIC_ACQUIRE) != p->hits[tid])
            __atomic_store_n(&p->bad, 1, __ATOMIC_RELAXED);
    kernels_pool_barrier(p->pool);
}

/* run_any: work shared by a counter is done exactly once, whoever joins. */
struct pool_items {
    unsigned next;
    unsigned char mark[1000];
};

static void pool_items_fn(void *ctx, int tid, int nthreads)
{
    struct pool_items *it = ctx;
    unsigned i;
    (void)tid;
    (void)nthreads;
    while ((i = __atomic_fetch_add(&it->next, 1, __ATOMIC_RELAXED)) < 1000)
        __atomic_fetch_add(&it->mark[i], 1, __ATOMIC_RELAXED);
}

static void test_pool_run_any(void **state)
{
    (void)state;
    kernels_pool *pool = kernels_pool_new(3);
    assert_non_null(pool);
    for (int r = 0; r < 500; r++) {
        struct pool_items it;
        memset(&it, 0, sizeof it);
        kernels_pool_run_any(r % 7 ? pool : NULL, pool_items_fn, &it);
        for (int i = 0; i < 1000; i++)
            assert_int_equal(it.mark[i], 1);
        /* a barrier region right after a closed one still sees every thread */
        if (r % 50 == 0) {
            struct pool_probe p = { .pool = pool };
            kernels_pool_run(pool, pool_probe_fn, &p);
            assert_int_equal(p.hits[0] + p.hits[1] + p.hits[2], 3);
            assert_int_equal(p.bad, 0);
        }
    }
    kernels_pool_free(pool);
}

static void test_pool(void **state)
{
    (void)state;
    for (int nt = 1; nt <= 4; nt++) {
        struct pool_probe p = { 0 };
        p.pool = kernels_pool_new(nt);
        assert_non_null(p.pool);
        for (int i = 0; i < 2000; i++)
            kernels_pool_run(p.pool, pool_probe_fn, &p);
        for (int t = 0; t < nt; t++)
            assert_int_equal(p.hits[t], 2000);
        assert_int_equal(p.bad, 0);
        kernels_pool_free(p.pool);
    }
    struct pool_probe p = { 0 };
    kernels_pool_run(NULL, pool_probe_fn, &p);  /* no pool: caller only */
    assert_int_equal(p.hits[0], 1);
    assert_null(kernels_pool_new(0));
    kernels_pool_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mxfp4_exact_vs_ldexp),
        cmocka_unit_test(test_mxfp4_fast_vs_dequantized),
        cmocka_unit_test(test_mxfp4_fast_variants_bitexact),
        cmocka_unit_test(test_mxfp4_fast_batched_scale_edges),
        cmocka_unit_test(test_mxfp4_fast_batched_tiles),
        cmocka_unit_test(test_q8_batched_bitexact),
        cmocka_unit_test(test_batch_equals_single_calls),
        cmocka_unit_test(test_threads_bitexact),
        cmocka_unit_test(test_q8_products),
        cmocka_unit_test(test_f32_products),
        cmocka_unit_test(test_act_quantize),
        cmocka_unit_test(test_q8_quantizers),
        cmocka_unit_test(test_bf16_to_f32),
        cmocka_unit_test(test_edges_zero_scale_and_zero_input),
        cmocka_unit_test(test_bad_shapes_and_isa),
        cmocka_unit_test(test_situ),
        cmocka_unit_test(test_situ_isas_bitexact),
        cmocka_unit_test(test_act_quantize_isas_bitexact),
        cmocka_unit_test(test_expert_view),
        cmocka_unit_test(test_expert_apply),
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_pool_run_any),
    };
    kernels_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
