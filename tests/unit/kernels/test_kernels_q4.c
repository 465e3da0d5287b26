/* test_kernels_q4.c — engine/kernels, the int4 spine format (issue 15):
 * the quantizer against a hand computation and its refusals, the value
 * accessor, the product against a double-precision sum over the
 * dequantized weights and activations, every ISA against the scalar
 * reference bit for bit (edge shapes, batches, zero groups, extreme
 * scales, unaligned records), threads, and the int4 error against f32 on
 * weights shaped like a model's (reported; bounded only loosely).
 *
 * Tolerance of the product against the dequantized sum: each block's
 * products are summed exactly in integers, so only the per-block scale
 * product and one FMA per block (nb / 16 per accumulator), then a 4-step
 * reduction, round: (nb + 8) * 2^-24 * sum |w x|, as for fast MXFP4.
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

static uint64_t rng_state = 0x7F4A7C159E3779B9ull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static double rnd_unit(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }

static float rnd_float(void) /* roughly N(0,1) with rare outliers */
{
    double s = 0;
    for (int i = 0; i < 4; i++)
        s += rnd_unit() - 0.5;
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

/* An int4 matrix in one allocation, its records at odd offsets. */
struct q4m {
    uint8_t *mem;
    kernels_q4 w;
};

/* Quantized from random f32 weights (zero_group_every: that share of the
 * groups zeroed first, 0 for none). */
static void q4_make(struct q4m *m, size_t rows, size_t cols, int zero_group_every)
{
    size_t np = kernels_q4_packed_bytes(rows, cols), ns = kernels_q4_scale_bytes(rows, cols);
    float *wf = malloc(rows * cols * sizeof *wf);
    assert_non_null(wf);
    fill_floats(wf, rows * cols);
    if (zero_group_every)
        for (size_t g = 0; g < rows * cols / 32; g++)
            if (rnd() % (unsigned)zero_group_every == 0)
                memset(wf + g * 32, 0, 32 * sizeof *wf);
    m->mem = malloc(np + ns + 8);
    assert_non_null(m->mem);
    uint8_t *p = m->mem + 1 + rnd() % 3, *s = p + np + 1;  /* unaligned on purpose */
    assert_int_equal(kernels_q4_quantize_f32(wf, rows, cols, p, s, NULL), 0);
    m->w = (kernels_q4){ p, s, rows, cols };
    free(wf);
}

/* ---- the quantizer ------------------------------------------------------------- */

static uint16_t scale_bits(const kernels_q4 *w, size_t r, size_t g)
{
    const uint8_t *p = w->scale + (r * (w->cols / 32) + g) * 2;
    return (uint16_t)(p[0] | p[1] << 8);
}

static int nibble(const kernels_q4 *w, size_t r, size_t j)
{
    uint8_t b = w->packed[r * w->cols / 2 + j / 2];
    return (j & 1) ? b >> 4 : b & 15;
}

/* One row of four groups worked out by hand:
 *  group 0: max 1.75, scale 1.75/7 = 0.25 (BF16 0x3E80, exact), 1/scale = 4:
 *     0.375 -> 1.5 -> 2 (half to even), 0.625 -> 2.5 -> 2, -0.375 -> -2,
 *     0.125 -> 0.5 -> 0, 0.3 -> 1.2 -> 1, -1.75 -> -7, 1.0 -> 4, the rest 0;
 *  group 1: max 1, 1/7 = 0.142857149 (f32 0x3E124925) rounds down to BF16
 *     0x3E12 = 0.142578125, 1/that = 7.01369858: 1 -> 7, 0.5 -> 3.51 -> 4,
 *     -0.2 -> -1.40 -> -1, -1 -> -7, 0.07 -> 0.49 -> 0, 0.08 -> 0.56 -> 1;
 *  group 2: all zero: scale 0, every q 0;
 *  group 3: max 3, 3/7 = 0.428571433 (f32 0x3EDB6DB7; the low half 0x6DB7
 *     is below 0x8000) rounds down to BF16 0x3EDB = 0.427734375, 1/that =
 *     2.33789954: 3 -> 7.01 -> 7, -3 -> -7, 1.5 -> 3.51 -> 4, 0.2 -> 0.47
 *     -> 0. */
static void test_q4_quantizer_by_hand(void **state)
{
    (void)state;
    float w[128] = { 0 };
    uint8_t packed[64], scale[8];
    kernels_q4 m = { packed, scale, 1, 128 };
    w[0] = 0.375f; w[1] = 0.625f; w[2] = -0.375f; w[3] = 0.125f; w[4] = 0.3f;
    w[5] = -1.75f; w[6] = 1.0f;
    w[32] = 1.0f; w[33] = 0.5f; w[34] = -0.2f; w[35] = -1.0f; w[36] = 0.07f; w[37] = 0.08f;
    w[96] = 3.0f; w[97] = -3.0f; w[98] = 1.5f; w[99] = 0.2f;
    assert_int_equal(kernels_q4_quantize_f32(w, 1, 128, packed, scale, NULL), 0);
    assert_int_equal(scale_bits(&m, 0, 0), 0x3E80);
    assert_int_equal(scale_bits(&m, 0, 1), 0x3E12);
    assert_int_equal(scale_bits(&m, 0, 2), 0x0000);
    assert_int_equal(scale_bits(&m, 0, 3), 0x3EDB);
    static const int q0[7] = { 2, 2, -2, 0, 1, -7, 4 };
    static const int q1[6] = { 7, 4, -1, -7, 0, 1 };
    static const int q3[4] = { 7, -7, 4, 0 };
    for (size_t j = 0; j < 32; j++) {
        assert_int_equal(nibble(&m, 0, j), 8 + (j < 7 ? q0[j] : 0));
        assert_int_equal(nibble(&m, 0, 32 + j), 8 + (j < 6 ? q1[j] : 0));
        assert_int_equal(nibble(&m, 0, 64 + j), 8);
        assert_int_equal(nibble(&m, 0, 96 + j), 8 + (j < 4 ? q3[j] : 0));
    }
    /* the packing: byte 0 holds columns 0 (low) and 1 (high) */
    assert_int_equal(packed[0], (8 + 2) | (8 + 2) << 4);
    assert_true(kernels_q4_value(&m, 0, 5) == -1.75f);
    assert_true(kernels_q4_value(&m, 0, 33) == 4 * 0.142578125f);
    assert_true(kernels_q4_value(&m, 0, 70) == 0.0f);
    assert_true(kernels_q4_value(&m, 0, 98) == 4 * 0.427734375f);

    /* the BF16 entry point gives the same bytes for BF16-exact input */
    uint8_t bf[256], p2[64], s2[8];
    for (size_t j = 0; j < 128; j++) {
        uint32_t bits;
        float v = w[j];
        memcpy(&bits, &v, 4);
        bits &= 0xFFFF0000u;  /* truncate to BF16, then compare with f32 of that */
        memcpy(&v, &bits, 4);
        w[j] = v;
        bf[2 * j] = (uint8_t)(bits >> 16);
        bf[2 * j + 1] = (uint8_t)(bits >> 24);
    }
    assert_int_equal(kernels_q4_quantize_f32(w, 1, 128, packed, scale, NULL), 0);
    assert_int_equal(kernels_q4_quantize_bf16(bf, 1, 128, p2, s2, NULL), 0);
    assert_memory_equal(packed, p2, sizeof p2);
    assert_memory_equal(scale, s2, sizeof s2);
}

static void test_q4_quantizer_refusals(void **state)
{
    (void)state;
    float w[64];
    uint8_t packed[32], scale[4], bf[128] = { 0 };
    shoal_err e;
    fill_floats(w, 64);
    shoal_err_clear(&e);
    assert_int_equal(kernels_q4_quantize_f32(w, 1, 48, packed, scale, &e), SHOAL_EINVAL);
    assert_int_equal(e.code, SHOAL_EINVAL);
    assert_int_equal(kernels_q4_quantize_f32(w, 1, 0, packed, scale, NULL), SHOAL_EINVAL);
    w[40] = NAN;
    assert_int_equal(kernels_q4_quantize_f32(w, 1, 64, packed, scale, &e), SHOAL_ERANGE);
    w[40] = INFINITY;
    assert_int_equal(kernels_q4_quantize_f32(w, 1, 64, packed, scale, NULL), SHOAL_ERANGE);
    bf[2 * 17 + 1] = 0x7F;  /* BF16 0x7F80: +inf */
    bf[2 * 17] = 0x80;
    assert_int_equal(kernels_q4_quantize_bf16(bf, 1, 64, packed, scale, NULL), SHOAL_ERANGE);
    assert_int_equal(kernels_q4_quantize_bf16(bf, 1, 33, packed, scale, NULL), SHOAL_EINVAL);
    assert_int_equal(kernels_q4_packed_bytes(3, 64), 96);
    assert_int_equal(kernels_q4_scale_bytes(3, 64), 12);
}

/* Every weight comes back within half a step of its group, and the
 * group's largest weight within a step (the scale is rounded to BF16). */
static void test_q4_roundtrip(void **state)
{
    (void)state;
    size_t rows = 7, cols = 3584;
    float *w = malloc(rows * cols * sizeof *w);
    uint8_t *p = malloc(rows * cols / 2), *s = malloc(rows * cols / 16);
    fill_floats(w, rows * cols);
    w[5] = 1e30f;       /* huge and tiny groups: BF16 has f32's range */
    w[40] = 3e-38f;
    for (size_t j = 33; j < 64; j++)
        w[j] = 0;
    assert_int_equal(kernels_q4_quantize_f32(w, rows, cols, p, s, NULL), 0);
    kernels_q4 m = { p, s, rows, cols };
    for (size_t r = 0; r < rows; r++)
        for (size_t g = 0; g < cols / 32; g++) {
            double amax = 0;
            for (size_t j = 0; j < 32; j++)
                amax = fmax(amax, fabs(w[r * cols + g * 32 + j]));
            for (size_t j = 0; j < 32; j++) {
                double x = w[r * cols + g * 32 + j], v = kernels_q4_value(&m, r, g * 32 + j);
                double step = amax / 7 * (1 + 1.0 / 128);  /* BF16 rounding of the scale */
                if (fabs(x - v) > step / 2 * (1 + 1e-6) + 1e-45)
                    fail_msg("r %zu col %zu: %.9g -> %.9g (step %.3g)", r, g * 32 + j, x, v, step);
            }
        }
    free(w);
    free(p);
    free(s);
}

/* ---- the product ---------------------------------------------------------------- */

static void test_q4_vs_dequantized(void **state)
{
    (void)state;
    static const size_t cols_l[] = { 32, 64, 96, 128, 160, 224, 1024, 3584 };
    use_isa(KERNELS_ISA_SCALAR);
    for (size_t ci = 0; ci < sizeof cols_l / sizeof cols_l[0]; ci++) {
        size_t cols = cols_l[ci], rows = 1 + rnd() % 40, nb = cols / 32;
        struct q4m m;
        float *x = malloc(cols * sizeof *x), *y = malloc(rows * sizeof *y);
        kernels_act *a = kernels_act_new(cols, 1);
        q4_make(&m, rows, cols, 9);
        fill_floats(x, cols);
        assert_int_equal(kernels_act_quantize(a, x, cols, 1, NULL), 0);
        assert_int_equal(kernels_q4_mul(NULL, &m.w, a, y, NULL), 0);
        for (size_t r = 0; r < rows; r++) {
            double yd = 0, mag = 0;
            for (size_t j = 0; j < cols; j++) {
                double t = (double)kernels_q4_value(&m.w, r, j) * kernels_act_value(a, 0, j);
                yd += t;
                mag += fabs(t);
            }
            if (fabs((double)y[r] - yd) > (double)(nb + 8) * U * mag + 1e-30)
                fail_msg("q4 cols=%zu r=%zu: %.9g vs %.9g", cols, r, (double)y[r], yd);
        }
        kernels_act_free(a);
        free(m.mem);
        free(x);
        free(y);
    }
}

/* Every supported ISA's q4 product equals scalar's bit for bit. */
static void expect_isas_equal(const kernels_q4 *w, const kernels_act *a, size_t rows, size_t n,
                              const char *what)
{
    float *y0 = malloc(n * rows * sizeof *y0), *y1 = malloc(n * rows * sizeof *y1);
    use_isa(KERNELS_ISA_SCALAR);
    assert_int_equal(kernels_q4_mul(NULL, w, a, y0, NULL), 0);
    for (size_t i = 1; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        memset(y1, 0xAB, n * rows * sizeof *y1);
        assert_int_equal(kernels_q4_mul(NULL, w, a, y1, NULL), 0);
        if (memcmp(y0, y1, n * rows * sizeof *y0) != 0)
            fail_msg("%s q4 %s differs from scalar: cols=%zu rows=%zu n=%zu",
                     kernels_isa_name(all_isas[i]), what, w->cols, rows, n);
    }
    free(y0);
    free(y1);
}

static void check_q4_shape(size_t rows, size_t cols, size_t n, const char *what)
{
    struct q4m m;
    float *x = malloc(n * cols * sizeof *x);
    kernels_act *a = kernels_act_new(cols, n);
    q4_make(&m, rows, cols, 11);
    fill_floats(x, n * cols);
    for (size_t j = 0; j < 32 && 2 * cols <= n * cols; j++)
        x[cols + j] = 0;  /* a zero activation block in vector 1 */
    assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
    expect_isas_equal(&m.w, a, rows, n, what);
    kernels_act_free(a);
    free(m.mem);
    free(x);
}

/* Edge shapes: rows around the tiles (4 NEON, 8 AVX2, 16 AVX-512) and the
 * 64-row thread chunk, n around the 64-vector pass, column counts with a
 * partial group of 4 blocks and blocks after the last full 16. */
static void test_q4_isas_bitexact(void **state)
{
    static const size_t cols_l[] = { 32, 96, 160, 544, 1024, 3584 };
    static const size_t rows_l[] = { 1, 3, 7, 8, 9, 15, 16, 17, 37, 85 };
    static const size_t n_l[] = { 1, 2, 15, 16, 17, 64, 65 };
    (void)state;
    for (size_t ci = 0; ci < sizeof cols_l / sizeof cols_l[0]; ci++)
        for (size_t ri = 0; ri < sizeof rows_l / sizeof rows_l[0]; ri++)
            for (size_t ni = 0; ni < sizeof n_l / sizeof n_l[0]; ni++) {
                size_t cols = cols_l[ci], rows = rows_l[ri], n = n_l[ni];
                if (cols * rows * n > 6000000)
                    continue;  /* keeps the scalar reference quick */
                check_q4_shape(rows, cols, n, "shapes");
            }
    /* rows longer than any buffer the kernels might keep */
    check_q4_shape(17, 16384 + 96, 3, "long rows");
    check_q4_shape(5, 16384 + 96, 1, "long rows");
}

/* Scales and activations at the edges of the float range: BF16 scales over
 * their whole exponent range (c = scale * d subnormal, huge or inf), tiny
 * activations, zero scales, all-zero activation blocks. */
static void test_q4_scale_edges(void **state)
{
    (void)state;
    for (int sc = 0; sc < 4; sc++) {
        size_t cols = 544, rows = 37, n = sc == 3 ? 17 : 3;
        struct q4m m;
        float *x = malloc(n * cols * sizeof *x);
        kernels_act *a = kernels_act_new(cols, n);
        q4_make(&m, rows, cols, 0);
        uint8_t *s = (uint8_t *)m.w.scale;
        for (size_t i = 0; i < rows * cols / 32; i++) {
            uint16_t bits = sc == 0 ? (uint16_t)(rnd() & 0x7FFF)             /* any exponent */
                          : sc == 1 ? (uint16_t)(0x0001 + rnd() % 0x0100)      /* subnormal, tiny */
                          : sc == 2 ? (uint16_t)(0x7E00 + rnd() % 0x0080)      /* ~2^125 */
                                    : (uint16_t)(rnd() % 3 ? 0x3C00 : 0);      /* zeros */
            s[2 * i] = (uint8_t)bits;
            s[2 * i + 1] = (uint8_t)(bits >> 8);
        }
        fill_floats(x, n * cols);
        for (size_t i = 0; i < n * cols; i++) {
            if (sc == 1)
                x[i] *= 1e-30f;
            if (sc == 3 && (i / 32) % 5 == 2)
                x[i] = 0;
        }
        assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
        char what[32];
        snprintf(what, sizeof what, "scale scenario %d", sc);
        expect_isas_equal(&m.w, a, rows, n, what);
        kernels_act_free(a);
        free(m.mem);
        free(x);
    }
}

/* A batch equals n single-vector calls; 2 and 3 threads equal 1. */
static void test_q4_batch_and_threads(void **state)
{
    (void)state;
    size_t rows = 131, cols = 224, n = 17;
    struct q4m m;
    float *x = malloc(n * cols * sizeof *x), *yb = malloc(n * rows * sizeof *yb);
    float *ys = malloc(rows * sizeof *ys), *yt = malloc(n * rows * sizeof *yt);
    kernels_act *a = kernels_act_new(cols, n), *a1 = kernels_act_new(cols, 1);
    kernels_pool *p2 = kernels_pool_new(2), *p3 = kernels_pool_new(3);
    assert_non_null(p2);
    assert_non_null(p3);
    q4_make(&m, rows, cols, 0);
    fill_floats(x, n * cols);
    assert_int_equal(kernels_act_quantize(a, x, cols, n, NULL), 0);
    for (size_t i = 0; i < N_ISAS; i++) {
        if (!kernels_isa_supported(all_isas[i]))
            continue;
        use_isa(all_isas[i]);
        assert_int_equal(kernels_q4_mul(NULL, &m.w, a, yb, NULL), 0);
        for (size_t v = 0; v < n; v++) {
            assert_int_equal(kernels_act_quantize(a1, x + v * cols, cols, 1, NULL), 0);
            assert_int_equal(kernels_q4_mul(NULL, &m.w, a1, ys, NULL), 0);
            if (memcmp(ys, yb + v * rows, rows * sizeof *ys))
                fail_msg("%s q4 vector %zu: batch differs from a single call",
                         kernels_isa_name(all_isas[i]), v);
        }
        assert_int_equal(kernels_q4_mul(p2, &m.w, a, yt, NULL), 0);
        assert_memory_equal(yb, yt, n * rows * sizeof *yb);
        memset(yt, 0, n * rows * sizeof *yt);
        assert_int_equal(kernels_q4_mul(p3, &m.w, a, yt, NULL), 0);
        assert_memory_equal(yb, yt, n * rows * sizeof *yb);
        assert_int_equal(kernels_q4_mul(p2, &m.w, a1, yt, NULL), 0);
        assert_memory_equal(ys, yt, rows * sizeof *ys);
    }
    kernels_init();
    kernels_pool_free(p2);
    kernels_pool_free(p3);
    kernels_act_free(a);
    kernels_act_free(a1);
    free(m.mem);
    free(x);
    free(yb);
    free(ys);
    free(yt);
}

static void test_q4_bad_shapes(void **state)
{
    (void)state;
    uint8_t bytes[64] = { 0 };
    float x[64] = { 0 }, y[2] = { 7, 7 };
    kernels_q4 bad = { bytes, bytes, 2, 48 }, ok = { bytes, bytes, 1, 64 };
    kernels_act *a = kernels_act_new(32, 1);
    shoal_err e;
    shoal_err_clear(&e);
    assert_int_equal(kernels_act_quantize(a, x, 32, 1, NULL), 0);
    assert_int_equal(kernels_q4_mul(NULL, &bad, a, y, &e), SHOAL_EINVAL);
    assert_int_equal(e.code, SHOAL_EINVAL);
    assert_int_equal(kernels_q4_mul(NULL, &ok, a, y, NULL), SHOAL_EINVAL);  /* 32 != 64 */
    assert_true(y[0] == 7 && y[1] == 7);
    kernels_act_free(a);
}

/* ---- int4 error against f32 on weights shaped like a model's --------------------- */

/* Student-t with 5 degrees of freedom (heavier tails than a Gaussian, as
 * trained weights), by the ratio of a normal and a chi. */
static double rnd_normal(void)
{
    double u = rnd_unit() + 1e-300, v = rnd_unit();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

static double rnd_t5(void)
{
    double c = 0;
    for (int i = 0; i < 5; i++) {
        double z = rnd_normal();
        c += z * z;
    }
    return rnd_normal() / sqrt(c / 5);
}

/* Relative RMS errors of the int4 weights and of y = W x (int4 weights,
 * int8 activations per 32) against f32, on rows with their own scales,
 * t5 entries and a few outlier columns (x8). */
static void test_q4_error_report(void **state)
{
    (void)state;
    size_t rows = 256, cols = 3584;
    float *w = malloc(rows * cols * sizeof *w), *x = malloc(cols * sizeof *x);
    float *y = malloc(rows * sizeof *y);
    uint8_t *p = malloc(rows * cols / 2), *s = malloc(rows * cols / 16);
    kernels_act *a = kernels_act_new(cols, 1);
    unsigned char *outlier = calloc(cols, 1);
    for (size_t j = 0; j < cols / 200; j++)
        outlier[rnd() % cols] = 1;
    for (size_t r = 0; r < rows; r++) {
        double rs = 0.02 * exp(0.5 * rnd_normal());
        for (size_t j = 0; j < cols; j++)
            w[r * cols + j] = (float)(rs * rnd_t5() * (outlier[j] ? 8 : 1));
    }
    for (size_t j = 0; j < cols; j++)
        x[j] = (float)rnd_normal() * (rnd() % 200 == 0 ? 20.0f : 1.0f);
    assert_int_equal(kernels_q4_quantize_f32(w, rows, cols, p, s, NULL), 0);
    assert_int_equal(kernels_act_quantize(a, x, cols, 1, NULL), 0);
    kernels_q4 m = { p, s, rows, cols };
    assert_int_equal(kernels_q4_mul(NULL, &m, a, y, NULL), 0);
    double ew = 0, nw = 0, ey = 0, ny = 0;
    for (size_t r = 0; r < rows; r++) {
        double yd = 0;
        for (size_t j = 0; j < cols; j++) {
            double d = (double)kernels_q4_value(&m, r, j) - w[r * cols + j];
            ew += d * d;
            nw += (double)w[r * cols + j] * w[r * cols + j];
            yd += (double)w[r * cols + j] * x[j];
        }
        ey += (y[r] - yd) * (y[r] - yd);
        ny += yd * yd;
    }
    print_message("int4 (group 32, BF16 scales) vs f32 on t5 weights with outlier columns: "
                  "weights %.4f, y %.4f relative RMS\n", sqrt(ew / nw), sqrt(ey / ny));
    /* 15 levels per group: about 0.1-0.2; far above that means a broken quantizer */
    assert_true(sqrt(ew / nw) < 0.3 && sqrt(ey / ny) < 0.3);
    kernels_act_free(a);
    free(outlier);
    free(w);
    free(x);
    free(y);
    free(p);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4_quantizer_by_hand),
        cmocka_unit_test(test_q4_quantizer_refusals),
        cmocka_unit_test(test_q4_roundtrip),
        cmocka_unit_test(test_q4_vs_dequantized),
        cmocka_unit_test(test_q4_isas_bitexact),
        cmocka_unit_test(test_q4_scale_edges),
        cmocka_unit_test(test_q4_batch_and_threads),
        cmocka_unit_test(test_q4_bad_shapes),
        cmocka_unit_test(test_q4_error_report),
    };
    kernels_init();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
