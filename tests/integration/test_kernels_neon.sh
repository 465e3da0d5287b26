#!/usr/bin/env bash
# test_kernels_neon.sh — cross-build engine/kernels for aarch64 and run a
# self-check under qemu-user: the NEON variant against the scalar reference
# (fast MXFP4, int8 and int4 bit-identical, exact MXFP4 and f32 within the
# f32 summation bound against a double decode), batches (4-row tiles: rows
# around the tile, n = 1, 2, 15, 16, 17, 64, 65, the largest integer sums)
# against scalar and single calls, threads against one thread, the int4
# quantizer against a hand computation, the expert helper against its
# composition and batched against one vector at a time.
# Then the attention family (MLA, KDA step and conv) the same way.
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

# The attention family (engine/kernels/attn*.c): MLA (absorbed and
# expanded), the KDA step, conv and decay on NEON against the scalar reference
# bit for bit, 2 threads against 1, a chunk against token at a time.
cat >"$T/attn_check.c" <<'EOF'
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kernels/kernels.h"

static int failures;
#define CHECK(c, ...) do { if (!(c)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static unsigned long long st = 0x9E3779B97F4A7C15ull;
static unsigned long long rnd(void) { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; }
static float rf(double s) { return (float)(((double)(rnd() >> 11) / 9007199254740992.0 - 0.5) * s); }
static float *fill(size_t n, double s) { float *x = malloc((n + 1) * sizeof *x); for (size_t i = 0; i < n; i++) x[i] = rf(s); return x; }

/* MLA over P positions, tokens [t0, t0 + cnt) of the last n, qx rows strided. */
static void mla(kernels_isa isa, kernels_pool *pool, size_t H, size_t kl, size_t rope, size_t P,
                size_t n, kernels_kv_type ty, const void *c, const void *r, const float *qa,
                const float *q, size_t t0, size_t cnt, float *ctx)
{
    kernels_mla_ws *ws = kernels_mla_ws_new(H, kl, rope, n, 2);
    kernels_mla a = { H, kl, rope, ty, c, r, P - n + t0, cnt, qa + t0 * H * kl,
                      q + t0 * H * (rope + 3) + 3, H * (rope + 3), rope + 3, 0.0721f, ctx };
    kernels_set_isa(isa, NULL);
    CHECK(kernels_mla_attend(ws, pool, &a, NULL) == 0, "mla rc");
    kernels_mla_ws_free(ws);
}

int main(void)
{
    static const size_t shapes[][6] = { { 5, 40, 8, 300, 3, 0 }, { 96, 512, 64, 90, 2, 0 },
                                        { 96, 512, 64, 40, 1, 1 }, { 7, 33, 0, 40, 5, 2 },
                                        { 22, 100, 12, 270, 2, 0 }, { 17, 48, 16, 60, 19, 1 } };
    static const size_t kda[][4] = { { 4, 128, 128, 2 }, { 5, 32, 40, 3 }, { 3, 17, 13, 2 } };
    static const size_t conv[][3] = { { 37, 4, 3 }, { 3000, 4, 2 }, { 10, 1, 2 } };
    kernels_pool *pool = kernels_pool_new(2);

    CHECK(kernels_init() == KERNELS_ISA_NEON, "picked %s, not neon", kernels_isa_name(kernels_init()));
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        size_t H = shapes[si][0], kl = shapes[si][1], rope = shapes[si][2], P = shapes[si][3];
        size_t n = shapes[si][4], one = H * kl;
        kernels_kv_type ty = (kernels_kv_type)shapes[si][5];
        float *c = fill(P * kl, 4), *r = fill(P * rope, 4), *qa = fill(n * one, 2);
        float *q = fill(n * H * (rope + 3), 2);
        void *ct = malloc(P * kl * 4 + 4), *rt = malloc(P * rope * 4 + 4);
        float *y0 = malloc(n * one * 4), *y1 = malloc(n * one * 4), *y2 = malloc(n * one * 4);
        kernels_kv_store(ty, c, ct, P * kl);
        kernels_kv_store(ty, r, rt, P * rope);
        mla(KERNELS_ISA_SCALAR, NULL, H, kl, rope, P, n, ty, ct, rt, qa, q, 0, n, y0);
        mla(KERNELS_ISA_NEON, NULL, H, kl, rope, P, n, ty, ct, rt, qa, q, 0, n, y1);
        mla(KERNELS_ISA_NEON, pool, H, kl, rope, P, n, ty, ct, rt, qa, q, 0, n, y2);
        CHECK(!memcmp(y0, y1, n * one * 4), "mla shape %zu: neon != scalar", si);
        CHECK(!memcmp(y1, y2, n * one * 4), "mla shape %zu: 2 threads != 1", si);
        for (size_t t = 0; t < n; t++) {
            mla(KERNELS_ISA_NEON, pool, H, kl, rope, P, n, ty, ct, rt, qa, q, t, 1, y2);
            CHECK(!memcmp(y1 + t * one, y2, one * 4), "mla shape %zu token %zu: chunk != alone", si, t);
        }
        free(c); free(r); free(qa); free(q); free(ct); free(rt); free(y0); free(y1); free(y2);
    }
    /* the expanded form: NEON vs scalar, 2 threads, token at a time */
    {
        size_t H = 4, kl = 32, rope = 8, nope = 16, vd = 24, P = 70, n = 5, one = H * vd;
        float *c = fill(P * kl, 4), *r = fill(P * rope, 4), *qn = fill(n * H * nope, 2);
        float *qx = fill(n * H * rope, 2), *w = fill(H * (nope + vd) * kl, 0.4);
        float *o0 = malloc(n * one * 4), *o1 = malloc(n * one * 4), *o2 = malloc(one * 4);
        kernels_mla_xws *ws = kernels_mla_xws_new(H, kl, rope, nope, vd, n, 2);
        kernels_mla_x a = { H, kl, rope, nope, vd, KERNELS_KV_F32, c, r, P - n, n, qn, H * nope,
                            nope, qx, H * rope, rope, w, 0.0721f, o0 };
        kernels_set_isa(KERNELS_ISA_SCALAR, NULL);
        CHECK(kernels_mla_expanded(ws, NULL, &a, NULL) == 0, "expanded rc");
        kernels_set_isa(KERNELS_ISA_NEON, NULL);
        a.o = o1;
        kernels_mla_expanded(ws, pool, &a, NULL);
        CHECK(!memcmp(o0, o1, n * one * 4), "expanded: neon != scalar");
        for (size_t t = 0; t < n; t++) {
            kernels_mla_x b = a;
            b.pos0 = P - n + t;
            b.n = 1;
            b.qn = qn + t * H * nope;
            b.qx = qx + t * H * rope;
            b.o = o2;
            kernels_mla_expanded(ws, NULL, &b, NULL);
            CHECK(!memcmp(o2, o1 + t * one, one * 4), "expanded token %zu: alone != chunk", t);
        }
        kernels_mla_xws_free(ws);
        free(c); free(r); free(qn); free(qx); free(w); free(o0); free(o1); free(o2);
    }
    for (size_t si = 0; si < sizeof kda / sizeof kda[0]; si++) {
        size_t H = kda[si][0], dk = kda[si][1], dv = kda[si][2], n = kda[si][3], ns = H * dk * dv;
        float *S = fill(ns, 1), *S0 = malloc(ns * 4), *S1 = malloc(ns * 4);
        float *qq = fill(n * H * dk, 0.2), *kk = fill(n * H * dk, 0.2), *al = fill(n * H * dk, 0.5);
        float *vv = fill(n * H * dv, 2), *be = fill(n * H, 0.5), *o0 = malloc(n * H * dv * 4);
        float *o1 = malloc(n * H * dv * 4);
        for (size_t i = 0; i < n * H * dk; i++) al[i] += 0.5f;
        for (size_t i = 0; i < n * H; i++) be[i] += 0.5f;
        kernels_kda a = { H, dk, dv, S0, n, qq, kk, al, vv, be, o0 };
        memcpy(S0, S, ns * 4);
        kernels_set_isa(KERNELS_ISA_SCALAR, NULL);
        kernels_kda_step(NULL, &a, NULL);
        kernels_set_isa(KERNELS_ISA_NEON, NULL);
        memcpy(S1, S, ns * 4);
        for (size_t t = 0; t < n; t++) {
            kernels_kda b = { H, dk, dv, S1, 1, qq + t * H * dk, kk + t * H * dk, al + t * H * dk,
                              vv + t * H * dv, be + t * H, o1 + t * H * dv };
            kernels_kda_step(pool, &b, NULL);
        }
        CHECK(!memcmp(S0, S1, ns * 4) && !memcmp(o0, o1, n * H * dv * 4), "kda shape %zu: neon != scalar", si);
        free(S); free(S0); free(S1); free(qq); free(kk); free(al); free(vv); free(be); free(o0); free(o1);
    }
    for (size_t si = 0; si < sizeof conv / sizeof conv[0]; si++) {
        size_t p = conv[si][0], kw = conv[si][1], n = conv[si][2], nw = (kw - 1) * p + 1;
        float *taps = fill(kw * p, 1), *x = fill(n * p, 4), *w = fill(nw, 4);
        float *x0 = malloc(n * p * 4), *x1 = malloc(n * p * 4), *w0 = malloc(nw * 4), *w1 = malloc(nw * 4);
        memcpy(x0, x, n * p * 4); memcpy(w0, w, nw * 4);
        memcpy(x1, x, n * p * 4); memcpy(w1, w, nw * 4);
        kernels_set_isa(KERNELS_ISA_SCALAR, NULL);
        kernels_kda_conv(NULL, x0, n, p, kw, taps, w0);
        kernels_set_isa(KERNELS_ISA_NEON, NULL);
        kernels_kda_conv(pool, x1, n, p, kw, taps, w1);
        CHECK(!memcmp(x0, x1, n * p * 4) && !memcmp(w0, w1, (nw - 1) * 4), "conv case %zu: neon != scalar", si);
        free(taps); free(x); free(w); free(x0); free(x1); free(w0); free(w1);
    }
    {
        size_t p = 3001, n = 2;
        float *z = fill(n * p, 12), *A = fill(p, 2), *dt = fill(p, 1);
        float *z0 = malloc(n * p * 4), *z1 = malloc(n * p * 4);
        memcpy(z0, z, n * p * 4);
        memcpy(z1, z, n * p * 4);
        kernels_set_isa(KERNELS_ISA_SCALAR, NULL);
        kernels_kda_decay(NULL, z0, n, p, A, dt, -5.0f);
        kernels_set_isa(KERNELS_ISA_NEON, NULL);
        kernels_kda_decay(pool, z1, n, p, A, dt, -5.0f);
        CHECK(!memcmp(z0, z1, n * p * 4), "decay: neon != scalar");
        free(z); free(A); free(dt); free(z0); free(z1);
    }
    kernels_pool_free(pool);
    printf("attn neon check: %d failure(s)\n", failures);
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
check "$CC_A64" -std=c11 -Wall -Wextra -Wshadow -Werror -O2 -D_GNU_SOURCE -pthread -I. \
    -static -o "$T/attn_check" engine/kernels/*.c common/err.c "$T/attn_check.c" -lm \
    "cross-build the attention check for aarch64"
"$QEMU" "$T/attn_check" | tee "$T/attn_out.txt"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || fail "NEON attention self-check failed under qemu (exit $rc)"
grep -q '^attn neon check: 0 failure' "$T/attn_out.txt" || fail "no attention success line"
echo "neon kernels and attention OK under qemu-aarch64"
