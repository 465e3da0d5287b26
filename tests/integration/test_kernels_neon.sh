#!/usr/bin/env bash
# test_kernels_neon.sh — cross-build engine/kernels for aarch64 and run a
# self-check under qemu-user: the NEON variant against the scalar reference
# (fast MXFP4, int8 and int4 bit-identical, exact MXFP4 and f32 within the
# f32 summation bound against a double decode), batches (4-row tiles: rows
# around the tile, n = 1, 2, 15, 16, 17, 64, 65, the largest integer sums)
# against scalar and single calls, threads against one thread, the int4
# quantizer against a hand computation, the expert helper against its
# composition and batched against one vector at a time.
# Skips when aarch64-linux-gnu-gcc or qemu-aarch64 is missing
# (apt-get install gcc-aarch64-linux-gnu qemu-user).
source "$(dirname "$0")/lib.sh"

CC_A64=${CC_A64:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}
command -v "$CC_A64" >/dev/null || skip "no $CC_A64 (apt-get install gcc-aarch64-linux-gnu)"
command -v "$QEMU" >/dev/null || skip "no $QEMU (apt-get install qemu-user)"

cat >"$T/neon_check.c" <<'EOF'
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernels.h"

static int failures;
#define CHECK(c, ...) do { if (!(c)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static unsigned long long st = 88172645463325252ull;
static unsigned long long rnd(void) { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static float rf(void) { return (float)((double)(rnd() >> 11) / 9007199254740992.0 - 0.5) * 3; }

static double wref(const kernels_mxfp4 *w, size_t r, size_t j)
{
    static const double e2m1[8] = { 0, 0.5, 1, 1.5, 2, 3, 4, 6 };
    unsigned char b = w->packed[r * w->cols / 2 + j / 2];
    int code = (j % 2) ? b >> 4 : b & 15, s = w->scale[r * w->cols / 32 + j / 32];
    return s == 0 ? 0.0 : ldexp(e2m1[code & 7] * (code & 8 ? -1 : 1), s - 127);
}

static void run_all(kernels_isa isa, kernels_pool *pool, const kernels_mxfp4 *m,
                    const kernels_q8 *q8, const kernels_f32 *f, const kernels_q4 *q4,
                    const kernels_act *a, const float *x, size_t n, float *y)
{
    size_t one = n * m->rows;
    kernels_set_isa(isa, NULL);
    kernels_mxfp4_mul_fast(pool, m, a, y, NULL);
    kernels_mxfp4_mul_exact(pool, m, x, n, y + one, NULL);
    kernels_q8_mul(pool, q8, a, y + 2 * one, NULL);
    kernels_f32_mul(pool, f, x, n, y + 3 * one, NULL);
    kernels_q4_mul(pool, q4, a, y + 4 * one, NULL);
}

/* Fast MXFP4, int8 and int4 of one shape: NEON == scalar, bit for bit.
 * pat 0: random; 1: every weight and activation at its extreme (the
 * largest int16 partial sums of the tiles). */
static void batch_shape(size_t rows, size_t cols, size_t n, int pat)
{
    size_t np = rows * cols / 2, ns = rows * cols / 32;
    unsigned char *p4 = malloc(np + ns + 3), *q4p = malloc(np + 2 * ns + 5);
    signed char *q8 = malloc(rows * cols + 1);
    float *wf = malloc(rows * cols * sizeof *wf), *qs = malloc(rows * sizeof *qs);
    float *x = malloc(n * cols * sizeof *x);
    float *y0 = malloc(n * rows * sizeof *y0), *y1 = malloc(n * rows * sizeof *y1);
    kernels_act *a = kernels_act_new(cols, n);
    for (size_t i = 0; i < rows * cols; i++)
        wf[i] = rf();
    for (size_t i = 0; i < n * cols; i++)
        x[i] = pat ? ((i / 32) % 2 ? -1.5f : 2.5f) : rf();
    for (size_t i = 0; i < np + ns + 3; i++)
        p4[i] = (unsigned char)rnd();
    kernels_q8_quantize_f32(wf, rows, cols, q8 + 1, qs, NULL);
    kernels_q4_quantize_f32(wf, rows, cols, q4p + 1, q4p + 3 + np, NULL);
    kernels_mxfp4 m = { p4 + 1, p4 + 2 + np, rows, cols };
    kernels_q4 m4 = { q4p + 1, q4p + 3 + np, rows, cols };
    kernels_q8 m8 = { q8 + 1, qs, rows, cols };
    if (pat)
        for (size_t i = 0; i < np; i++) {
            p4[1 + i] = rnd() % 2 ? 0x77 : 0xFF;
            q4p[1 + i] = rnd() % 2 ? 0xFF : 0x00;
            q8[1 + 2 * i] = rnd() % 2 ? 127 : -127;
            q8[2 + 2 * i] = rnd() % 2 ? 127 : -127;
        }
    kernels_act_quantize(a, x, cols, n, NULL);
    for (int f = 0; f < 3; f++) {
        for (int k = 0; k < 2; k++) {
            float *y = k ? y1 : y0;
            kernels_set_isa(k ? KERNELS_ISA_NEON : KERNELS_ISA_SCALAR, NULL);
            memset(y, 0xAB, n * rows * sizeof *y);
            if (f == 0) kernels_mxfp4_mul_fast(NULL, &m, a, y, NULL);
            else if (f == 1) kernels_q8_mul(NULL, &m8, a, y, NULL);
            else kernels_q4_mul(NULL, &m4, a, y, NULL);
        }
        CHECK(!memcmp(y0, y1, n * rows * sizeof *y0), "batch %s rows %zu cols %zu n %zu pat %d: neon != scalar",
              f == 0 ? "mxfp4" : f == 1 ? "q8" : "q4", rows, cols, n, pat);
    }
    kernels_act_free(a);
    free(p4); free(q4p); free(q8); free(wf); free(qs); free(x); free(y0); free(y1);
}

int main(void)
{
    static const size_t cols_list[] = { 32, 64, 96, 128, 160, 3584 };
    kernels_pool *pool = kernels_pool_new(2);

    CHECK(kernels_init() == KERNELS_ISA_NEON, "picked %s, not neon", kernels_isa_name(kernels_init()));
    for (size_t ci = 0; ci < sizeof cols_list / sizeof cols_list[0]; ci++) {
        size_t cols = cols_list[ci], rows = 65 + rnd() % 70, n = 1 + rnd() % 3;
        size_t np = rows * cols / 2, ns = rows * cols / 32, all = 5 * n * rows;
        unsigned char *mem = malloc(np + ns + 8);
        signed char *qmem = malloc(rows * cols + 4);
        float *wf = malloc(rows * cols * sizeof *wf), *qs = malloc(rows * sizeof *qs);
        float *x = malloc(n * cols * sizeof *x);
        unsigned char *q4mem = malloc(rows * cols / 2 + rows * cols / 16 + 3);
        float *y0 = malloc(all * sizeof *y0), *y1 = malloc(all * sizeof *y1), *y2 = malloc(all * sizeof *y2);
        kernels_act *a = kernels_act_new(cols, n);
        for (size_t i = 0; i < np + ns + 8; i++)
            mem[i] = (unsigned char)rnd();
        kernels_mxfp4 m = { mem + 1, mem + 1 + np + 2, rows, cols };  /* unaligned */
        for (size_t i = 0; i < ns; i++)
            ((unsigned char *)m.scale)[i] = (unsigned char)(rnd() % 23 ? 119 + rnd() % 12 : 0);
        for (size_t i = 0; i < rows * cols; i++)
            wf[i] = rf();
        for (size_t i = 0; i < n * cols; i++)
            x[i] = rf();
        kernels_q8_quantize_f32(wf, rows, cols, qmem + 1, qs, NULL);
        kernels_q8 q8 = { qmem + 1, qs, rows, cols };
        kernels_f32 f = { wf, rows, cols };
        kernels_q4_quantize_f32(wf, rows, cols, q4mem + 1, q4mem + 2 + np, NULL);
        kernels_q4 q4 = { q4mem + 1, q4mem + 2 + np, rows, cols };
        kernels_act_quantize(a, x, cols, n, NULL);

        run_all(KERNELS_ISA_SCALAR, NULL, &m, &q8, &f, &q4, a, x, n, y0);
        run_all(KERNELS_ISA_NEON, NULL, &m, &q8, &f, &q4, a, x, n, y1);
        run_all(KERNELS_ISA_NEON, pool, &m, &q8, &f, &q4, a, x, n, y2);
        CHECK(!memcmp(y0, y1, n * rows * sizeof *y0), "cols %zu: neon fast mxfp4 != scalar", cols);
        CHECK(!memcmp(y0 + 2 * n * rows, y1 + 2 * n * rows, n * rows * sizeof *y0),
              "cols %zu: neon q8 != scalar", cols);
        CHECK(!memcmp(y0 + 4 * n * rows, y1 + 4 * n * rows, n * rows * sizeof *y0),
              "cols %zu: neon q4 != scalar", cols);
        CHECK(!memcmp(y1, y2, all * sizeof *y1), "cols %zu: 2 threads != 1 thread", cols);
        for (size_t v = 0; v < n; v++)
            for (size_t r = 0; r < rows; r++) {
                double yd = 0, mag = 0, fd = 0, fmag = 0;
                for (size_t j = 0; j < cols; j++) {
                    double t = wref(&m, r, j) * x[v * cols + j], u = (double)wf[r * cols + j] * x[v * cols + j];
                    yd += t; mag += fabs(t); fd += u; fmag += fabs(u);
                }
                double bound = (double)(cols + 2) * 5.9604644775390625e-08;
                CHECK(fabs(y1[n * rows + v * rows + r] - yd) <= bound * mag + 1e-30,
                      "cols %zu row %zu: neon exact %.9g vs %.9g", cols, r, y1[n * rows + v * rows + r], yd);
                CHECK(fabs(y1[3 * n * rows + v * rows + r] - fd) <= bound * fmag,
                      "cols %zu row %zu: neon f32", cols, r);
            }
        /* batch == single calls (fast path) */
        kernels_act *a1 = kernels_act_new(cols, 1);
        for (size_t v = 0; v < n; v++) {
            kernels_act_quantize(a1, x + v * cols, cols, 1, NULL);
            kernels_mxfp4_mul_fast(NULL, &m, a1, y2, NULL);
            CHECK(!memcmp(y2, y1 + v * rows, rows * sizeof *y2), "cols %zu: batch != single", cols);
        }
        kernels_act_free(a1);
        kernels_act_free(a);
        free(mem); free(qmem); free(q4mem); free(wf); free(qs); free(x); free(y0); free(y1); free(y2);
    }

    /* batches: rows around the 4-row tile, n around the 64-vector pass */
    {
        static const size_t rows_l[] = { 1, 3, 4, 5, 7, 8, 17, 37 }, n_l[] = { 1, 2, 15, 16, 17, 64, 65 };
        static const size_t bcols[] = { 64, 160, 544 };
        for (size_t ci = 0; ci < 3; ci++)
            for (size_t ri = 0; ri < sizeof rows_l / sizeof rows_l[0]; ri++)
                for (size_t ni = 0; ni < sizeof n_l / sizeof n_l[0]; ni++)
                    if (bcols[ci] * rows_l[ri] * n_l[ni] <= 1500000)
                        batch_shape(rows_l[ri], bcols[ci], n_l[ni], 0);
        batch_shape(37, 544, 17, 1);
        batch_shape(9, 16384 + 160, 3, 0);
    }

    /* the int4 quantizer by hand: max 1.75 -> scale 0.25 (BF16 0x3E80);
     * 0.375 -> 1.5 -> 2, 0.625 -> 2.5 -> 2 (half to even), -1.75 -> -7 */
    {
        float w[32] = { 0.375f, 0.625f, -1.75f };
        unsigned char p[16], sc[2];
        CHECK(kernels_q4_quantize_f32(w, 1, 32, p, sc, NULL) == 0, "q4 quantize");
        CHECK(sc[0] == 0x80 && sc[1] == 0x3E, "q4 scale %02x%02x", sc[1], sc[0]);
        CHECK(p[0] == (10 | 10 << 4) && (p[1] & 15) == 1 && p[2] == 0x88, "q4 nibbles %02x %02x", p[0], p[1]);
    }

    /* expert helper == composition, fast numerics, 2 threads */
    {
        size_t I = 96, L = 128, span = kernels_expert_span_bytes(I, L);
        unsigned char *mem = malloc(span + 3);
        float z[128], o1[128], o2[128], g[96], u[96], y[128], wt = 0.75f;
        kernels_expert e;
        kernels_expert_ws *ws = kernels_expert_ws_new(I, L, 1, 4.0f, 25.0f);
        kernels_act *az = kernels_act_new(L, 1), *ah = kernels_act_new(I, 1);
        for (size_t i = 0; i < span + 3; i++)
            mem[i] = (unsigned char)rnd();
        kernels_expert_view(mem + 3, I, L, &e, NULL);
        unsigned char *sc[3] = { (unsigned char *)e.w1.scale, (unsigned char *)e.w2.scale, (unsigned char *)e.w3.scale };
        for (int k = 0; k < 3; k++)
            for (size_t i = 0; i < I * L / 32; i++)
                sc[k][i] = (unsigned char)(120 + rnd() % 4);
        for (size_t i = 0; i < L; i++)
            z[i] = rf(), o1[i] = o2[i] = (float)i;
        kernels_set_isa(KERNELS_ISA_NEON, NULL);
        kernels_expert_apply(ws, pool, &e, z, 1, &wt, o1, KERNELS_FAST, NULL);
        kernels_act_quantize(az, z, L, 1, NULL);
        kernels_mxfp4_mul_fast(NULL, &e.w1, az, g, NULL);
        kernels_mxfp4_mul_fast(NULL, &e.w3, az, u, NULL);
        kernels_situ(g, u, g, I, 4.0f, 25.0f);
        kernels_act_quantize(ah, g, I, 1, NULL);
        kernels_mxfp4_mul_fast(NULL, &e.w2, ah, y, NULL);
        for (size_t i = 0; i < L; i++)
            o2[i] += wt * y[i];
        CHECK(!memcmp(o1, o2, sizeof o1), "expert helper != composition");
        /* a batch of 17 (the tiles) == one vector at a time */
        {
            float zb[17 * 128], ob1[17 * 128], ob2[17 * 128], wb[17];
            kernels_expert_ws *wsb = kernels_expert_ws_new(I, L, 17, 4.0f, 25.0f);
            for (size_t i = 0; i < 17 * L; i++)
                zb[i] = rf(), ob1[i] = ob2[i] = (float)i * 0.001f;
            for (size_t v = 0; v < 17; v++)
                wb[v] = 0.5f + 0.01f * (float)v;
            kernels_expert_apply(wsb, pool, &e, zb, 17, wb, ob1, KERNELS_FAST, NULL);
            for (size_t v = 0; v < 17; v++)
                kernels_expert_apply(wsb, NULL, &e, zb + v * L, 1, wb + v, ob2 + v * L, KERNELS_FAST, NULL);
            CHECK(!memcmp(ob1, ob2, sizeof ob1), "batched expert != one vector at a time");
            kernels_expert_ws_free(wsb);
        }
        kernels_expert_ws_free(ws); kernels_act_free(az); kernels_act_free(ah); free(mem);
    }
    kernels_pool_free(pool);
    printf("neon check: %d failure(s)\n", failures);
    return failures != 0;
}
EOF

cd "$ROOT" || fail "no repo root"
srcs=(engine/kernels/*.c common/err.c "$T/neon_check.c")
check "$CC_A64" -std=c11 -Wall -Wextra -Wshadow -Werror -O2 -D_GNU_SOURCE -pthread -I. \
    -static -o "$T/neon_check" "${srcs[@]}" -lm "cross-build for aarch64"
"$QEMU" "$T/neon_check" | tee "$T/out.txt"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || fail "NEON self-check failed under qemu (exit $rc)"
grep -q '^neon check: 0 failure' "$T/out.txt" || fail "no success line"
echo "neon kernels OK under qemu-aarch64"
