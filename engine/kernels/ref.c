/* ref.c — scalar reference kernels: the definition every ISA variant is
 * checked against.  Plain C, always built.
 *
 * Exact MXFP4: y = sum_j w[j]*x[j] in f32, j in column order, w decoded
 * exactly (e2m1 times a power of two).  Fast MXFP4, int8 and int4: the
 * integer block sums and the float order of kernels_int.h invariants 2-4.
 * f32: column order.
 */
#include "engine/kernels/kernels_int.h"

#include <math.h>

const int8_t kernels_e2m1x2[16] = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12
};

/* Fast MXFP4, int8, int4: invariants 2-4 one row and vector at a time. */
static inline void scalar_rows(int kind, const kernels_bmat *m, size_t r0, size_t r1,
                               const kernels_act *a, float *y, size_t ldy)
{
    for (size_t r = r0; r < r1; r++)
        for (size_t v = 0; v < a->n; v++)
            y[v * ldy + r] = kernels_row_scalar(kind, m, r, a, v);
}

static void scalar_mxfp4_fast(const kernels_mxfp4 *w, size_t r0, size_t r1,
                              const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_mxfp4(w);
    scalar_rows(KERNELS_KIND_MXFP4, &m, r0, r1, a, y, ldy);
}

void kernels_q4_rows_scalar(const kernels_q4 *w, size_t r0, size_t r1,
                            const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_q4(w);
    scalar_rows(KERNELS_KIND_Q4, &m, r0, r1, a, y, ldy);
}

static void scalar_mxfp4_exact(const kernels_mxfp4 *w, size_t r0, size_t r1,
                               const float *x, size_t n, float *y, size_t ldy)
{
    size_t cols = w->cols, nb = cols / KERNELS_BLOCK;
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *p = w->packed + r * (cols / 2), *s = w->scale + r * nb;
        for (size_t v = 0; v < n; v++) {
            const float *xv = x + v * cols;
            float acc = 0;
            for (size_t j = 0; j < cols; j++) {
                int code = (j & 1) ? p[j / 2] >> 4 : p[j / 2] & 15;
                float wj = (float)kernels_e2m1x2[code] * (kernels_ue8m0(s[j / 32]) * 0.5f);
                acc += wj * xv[j];
            }
            y[v * ldy + r] = acc;
        }
    }
}

static void scalar_q8(const kernels_q8 *w, size_t r0, size_t r1,
                      const kernels_act *a, float *y, size_t ldy)
{
    kernels_bmat m = kernels_bmat_q8(w);
    scalar_rows(KERNELS_KIND_Q8, &m, r0, r1, a, y, ldy);
}

static void scalar_f32(const kernels_f32 *w, size_t r0, size_t r1,
                       const float *x, size_t n, float *y, size_t ldy)
{
    for (size_t r = r0; r < r1; r++) {
        const float *wr = w->w + r * w->cols;
        for (size_t v = 0; v < n; v++) {
            const float *xv = x + v * w->cols;
            float acc = 0;
            for (size_t j = 0; j < w->cols; j++)
                acc += wr[j] * xv[j];
            y[v * ldy + r] = acc;
        }
    }
}

const kernels_ops kernels_ops_scalar = {
    scalar_mxfp4_fast, scalar_mxfp4_exact, scalar_q8, scalar_f32,
    kernels_act_quant_scalar, kernels_situ_scalar
};
