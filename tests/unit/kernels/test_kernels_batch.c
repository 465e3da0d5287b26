/* test_kernels_batch.c — engine/kernels, the batched products of issue 16:
 * fast MXFP4, int8 and int4 with n > 1 vectors (rows in the lanes of a
 * register: 4 rows on NEON, 8 on AVX2, 16 on AVX-512) against the scalar
 * reference bit for bit on every ISA the machine runs: rows around every
 * tile size and the 64-row thread chunk, n = 1, 2, 15, 16, 17, 64, 65
 * (one more than a 64-vector pass), rows longer than 16K columns, the
 * largest integer sums each format can produce (the int16 partial sums of
 * the AVX2 kernels), threads, and the fused expert with batches.
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

static uint64_t rng_state = 0x3C6EF372FE94F82Bull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static float rnd_float(void)
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

static const kernels_isa all_isas[] = { KERNELS_ISA_SCALAR, KERNELS_ISA_AVX2,
                                        KERNELS_ISA_AVX512VNNI, KERNELS_ISA_NEON };
#define N_ISAS (sizeof all_isas / sizeof all_isas[0])

static void use_isa(kernels_isa isa)
{
    assert_int_equal(kernels_set_isa(isa, NULL), 0);
}

enum fmt { FMT_MXFP4, FMT_Q8, FMT_Q4 };
static const char *const fmt_names[] = { "mxfp4", "q8", "q4" };

/* One matrix of each format over the same shape, records at odd offsets:
 * MXFP4 random bytes with realistic scales, int8 and int4 quantized from
 * random weights. */
struct mats {
    uint8_t *mem4, *memq4;
    int8_t *q8;
    float *q8s;
    kernels_mxfp4 mx;
    kernels_q8 m8;
    kernels_q4 m4;
};

static void mats_make(struct mats *m, size_t rows, size_t cols)
{
    size_t np = rows * cols / 2, ns = rows * cols / 32;
    float *wf = malloc(rows * cols * sizeof *wf);
    assert_non_null(wf);
    fill_floats(wf, rows * cols);
    m->mem4 = malloc(np + ns + 8);
    m->memq4 = malloc(np + 2 * ns + 8);
    m->q8 = malloc(rows * cols + 8);
    m->q8s = malloc(rows * sizeof *m->q8s);
    assert_true(m->mem4 && m->memq4 && m->q8 && m->q8s);
    uint8_t *p = m->mem4 + 3, *s = p + np + 1;
    for (size_t i = 0; i < np; i++)
        p[i] = (uint8_t)rnd();
    for (size_t i = 0; i < ns; i++)
        s[i] = (uint8_t)(rnd() % 13 ? 119 + rnd() % 12 : 0);
    m->mx = (kernels_mxfp4){ p, s, rows, cols };
    assert_int_equal(kernels_q8_quantize_f32(wf, rows, cols, m->q8 + 5, m->q8s, NULL), 0);
    m->m8 = (kernels_q8){ m->q8 + 5, m->q8s, rows, cols };
    uint8_t *qp = m->memq4 + 1, *qs = qp + np + 2;
    assert_int_equal(kernels_q4_quantize_f32(wf, rows, cols, qp, qs, NULL), 0);
    m->m4 = (kernels_q4){ qp, qs, rows, cols };
    free(wf);
}

static void mats_free(struct mats *m)
{
    free(m->mem4);
    free(m->memq4);
    free(m->q8);
    free(m->q8s);
}

static void mul(const struct mats *m, enum fmt f, kernels_pool *pool, const kernels_act *a, float *y)
{
    int rc = f == FMT_MXFP4 ? kernels_mxfp4_mul_fast(pool, &m->mx, a, y, NULL)
           : f == FMT_Q8    ? kernels_q8_mul(pool, &m->m8, a, y, NULL)
                            : kernels_q4_mul(pool, &m->m4, a, y, NULL);
    assert_int_equal(rc, 0);
}

/* Every format on every supported ISA equals scalar, bit for bit. */
static void expect_isas_equal(const struct mats *m, const kernels_act *a, size_t n, const char *what)
{
    size_t rows = m->mx.rows;
    float *y0 = malloc(n * rows * sizeof *y0), *y1 = malloc(n * rows * sizeof *y1);
    for (int f = FMT_MXFP4; f <= FMT_Q4; f++) {
        use_isa(KERNELS_ISA_SCALAR);
        mul(m, (enum fmt)f, NULL, a, y0);
        for (size_t i = 1; i < N_ISAS; i++) {
            if (!kernels_isa_supported(all_isas[i]))
                continue;
            use_isa(all_isas[i]);
            memset(y1, 0xAB, n * rows * sizeof *y1);
            mul(m, (enum fmt)f, NULL, a, y1);
            if (memcmp(y0, y1, n * rows * sizeof *y0) != 0)
                fail_msg("%s %s %s differs from scalar: cols=%zu rows=%zu n=%zu",
                         kernels_isa_name(all_isas[i]), fmt_names[f], what, m->mx.cols, rows, n);
        }
    }
    kernels_init();
    free(y0);
    free(y1);
}

static void check_shape(size_t rows, size_t cols, size_t n, const char *what)
{
    struct mats m;
    float *x = malloc(n * cols * sizeof *x);
    kernels_act *a = kernels_act_new(cols, n);
    mats_make(&m, rows, cols);
    fill_floats(x, n * cols);
    if (n > 1)
        for (size_t j = 0; j < 32; j++)
            x[cols + 32 + j] = 0;  /* a zero activation block */
    assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
    expect_isas_equal(&m, a, n, what);
    kernels_act_free(a);
    mats_free(&m);
    free(x);
}

static void test_batch_shapes(void **state)
{
    static const size_t cols_l[] = { 64, 160, 544, 3584 };
    static const size_t rows_l[] = { 1, 3, 4, 7, 8, 9, 15, 16, 17, 33, 67, 131 };
    static const size_t n_l[] = { 1, 2, 15, 16, 17, 64, 65 };
    (void)state;
    for (size_t ci = 0; ci < sizeof cols_l / sizeof cols_l[0]; ci++)
        for (size_t ri = 0; ri < sizeof rows_l / sizeof rows_l[0]; ri++)
            for (size_t ni = 0; ni < sizeof n_l / sizeof n_l[0]; ni++) {
                size_t cols = cols_l[ci], rows = rows_l[ri], n = n_l[ni];
                if (cols * rows * n > 4000000)
                    continue;  /* keeps the scalar reference quick */
                check_shape(rows, cols, n, "batch");
            }
    check_shape(19, 16384 + 160, 3, "long rows");
}

/* The largest sums each format can give: every weight at its extreme code
 * and every activation at +-127 (int4: nibbles 15 and 0, i.e. q = 7 and the
 * -8 the quantizer never writes; int8: +-127; MXFP4: +-6), so the int16
 * partial sums of the AVX2 kernels and the int32 lanes reach their bounds. */
static void test_batch_integer_extremes(void **state)
{
    (void)state;
    size_t rows = 37, cols = 544, n = 17, nb = cols / 32;
    struct mats m;
    float *x = malloc(n * cols * sizeof *x);
    kernels_act *a = kernels_act_new(cols, n);
    mats_make(&m, rows, cols);
    for (int pat = 0; pat < 4; pat++) {
        uint8_t *p4 = (uint8_t *)m.mx.packed, *q4 = (uint8_t *)m.m4.packed;
        for (size_t i = 0; i < rows * cols / 2; i++) {
            /* MXFP4 0x77 = +6 +6, 0xFF = -6 -6; int4 0xFF = +7, 0x00 = -8 */
            p4[i] = pat & 1 ? 0xFF : 0x77;
            q4[i] = pat & 1 ? 0x00 : 0xFF;
            if (pat >= 2 && rnd() % 2) {
                p4[i] ^= 0x88;
                q4[i] ^= 0xFF;
            }
        }
        for (size_t i = 0; i < rows * cols; i++)
            m.q8[5 + i] = (int8_t)(pat & 1 ? -127 : 127) * (pat >= 2 && rnd() % 2 ? -1 : 1);
        for (size_t i = 0; i < rows * nb; i++)
            ((uint8_t *)m.mx.scale)[i] = 127;
        /* equal values in a block quantize to +-127 */
        for (size_t i = 0; i < n * cols; i++)
            x[i] = pat >= 2 ? ((i / 32) % 2 ? -1.5f : 2.5f) : 1.0f;
        assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
        char what[32];
        snprintf(what, sizeof what, "extremes %d", pat);
        expect_isas_equal(&m, a, n, what);
    }
    kernels_act_free(a);
    mats_free(&m);
    free(x);
}

/* Batched products with 1, 2 and 3 threads, every ISA: the same bits. */
static void test_batch_threads(void **state)
{
    (void)state;
    size_t rows = 203, cols = 224, n = 19;
    struct mats m;
    float *x = malloc(n * cols * sizeof *x);
    float *y1 = malloc(n * rows * sizeof *y1), *yt = malloc(n * rows * sizeof *yt);
    kernels_act *a = kernels_act_new(cols, n);
    kernels_pool *p2 = kernels_pool_new(2), *p3 = kernels_pool_new(3);
    assert_non_null(p2);
    assert_non_null(p3);
    mats_make(&m, rows, cols);
    fill_floats(x, n * cols);
    assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        for (int f = FMT_MXFP4; f <= FMT_Q4; f++) {
            mul(&m, (enum fmt)f, NULL, a, y1);
            mul(&m, (enum fmt)f, p2, a, yt);
            assert_memory_equal(y1, yt, n * rows * sizeof *y1);
            memset(yt, 0, n * rows * sizeof *yt);
            mul(&m, (enum fmt)f, p3, a, yt);
            assert_memory_equal(y1, yt, n * rows * sizeof *y1);
        }
    }
    kernels_init();
    kernels_pool_free(p2);
    kernels_pool_free(p3);
    kernels_act_free(a);
    mats_free(&m);
    free(x);
    free(y1);
    free(yt);
}

/* The fused expert with batches (its products take the tiles for n > 1)
 * equals the same expert applied one vector at a time, on every ISA, and
 * every ISA's batch equals scalar's. */
static void test_batch_expert(void **state)
{
    (void)state;
    size_t I = 96, L = 160, nmax = 17, span = kernels_expert_span_bytes(I, L);
    uint8_t *mem = malloc(span + 8);
    float *z = malloc(nmax * L * sizeof *z), *wt = malloc(nmax * sizeof *wt);
    float *o1 = malloc(nmax * L * sizeof *o1), *o2 = malloc(nmax * L * sizeof *o2);
    float *o0 = malloc(nmax * L * sizeof *o0);
    kernels_expert e;
    kernels_expert_ws *ws = kernels_expert_ws_new(I, L, nmax, 4.0f, 25.0f);
    kernels_pool *pool = kernels_pool_new(2);
    assert_non_null(ws);
    for (size_t i = 0; i < span + 8; i++)
        mem[i] = (uint8_t)rnd();
    assert_int_equal(kernels_expert_view(mem + 3, I, L, &e, NULL), 0);
    uint8_t *scales[3] = { (uint8_t *)e.w1.scale, (uint8_t *)e.w2.scale, (uint8_t *)e.w3.scale };
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < I * L / 32; i++)
            scales[k][i] = (uint8_t)(120 + rnd() % 4);
    fill_floats(z, nmax * L);
    for (size_t v = 0; v < nmax; v++)
        wt[v] = 0.25f + 0.01f * (float)v;
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        for (size_t n = 2; n <= nmax; n += 15) {
            for (size_t j = 0; j < n * L; j++)
                o1[j] = o2[j] = (float)j * 0.001f;
            assert_int_equal(kernels_expert_apply(ws, pool, &e, z, n, wt, o1, KERNELS_FAST, NULL), 0);
            for (size_t v = 0; v < n; v++)
                assert_int_equal(kernels_expert_apply(ws, NULL, &e, z + v * L, 1, wt + v, o2 + v * L,
                                                      KERNELS_FAST, NULL), 0);
            if (memcmp(o1, o2, n * L * sizeof *o1))
                fail_msg("%s n %zu: batched expert differs from one vector at a time",
                         kernels_isa_name(all_isas[i]), n);
            if (all_isas[i] == KERNELS_ISA_SCALAR && n == nmax)
                memcpy(o0, o1, n * L * sizeof *o0);
            else if (n == nmax && memcmp(o0, o1, n * L * sizeof *o1))
                fail_msg("%s: batched expert differs from scalar", kernels_isa_name(all_isas[i]));
        }
    }
    kernels_init();
    kernels_expert_ws_free(ws);
    kernels_pool_free(pool);
    free(mem);
    free(z);
    free(wt);
    free(o0);
    free(o1);
    free(o2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_shapes),
        cmocka_unit_test(test_batch_integer_extremes),
        cmocka_unit_test(test_batch_threads),
        cmocka_unit_test(test_batch_expert),
    };
    kernels_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
