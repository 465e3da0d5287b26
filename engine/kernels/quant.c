/* quant.c — activation quantization (kernels_act), the int8 spine
 * quantizers and BF16 widening (the int4 quantizers are in q4.c).
 *
 * Owns the one definition of how f32 becomes int8 in this engine: blocks of
 * 32 activations with one scale each, whole rows of spine weights with one
 * scale each, both round-half-to-even.  Does not own the products.
 */
#include "engine/kernels/kernels_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

kernels_act *kernels_act_new(size_t cols_max, size_t nmax)
{
    kernels_act *a;
    size_t blocks;

    if (cols_max == 0 || cols_max % KERNELS_BLOCK || nmax == 0 ||
        nmax > SIZE_MAX / cols_max)
        return NULL;
    blocks = cols_max / KERNELS_BLOCK * nmax;
    if (blocks > SIZE_MAX / (8 * sizeof(int32_t)))
        return NULL;
    a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->cap_blocks = blocks;
    a->q = malloc(blocks * KERNELS_BLOCK);
    a->d = malloc(blocks * sizeof *a->d);
    a->bias = malloc(blocks * 8 * sizeof *a->bias);
    a->bsum = malloc(blocks * sizeof *a->bsum);
    a->bsum8 = malloc(blocks * sizeof *a->bsum8);
    a->bsum128 = malloc(blocks * sizeof *a->bsum128);
    if (!a->q || !a->d || !a->bias || !a->bsum || !a->bsum8 || !a->bsum128) {
        kernels_act_free(a);
        return NULL;
    }
    return a;
}

void kernels_act_free(kernels_act *act)
{
    if (!act)
        return;
    free(act->q);
    free(act->d);
    free(act->bias);
    free(act->bsum);
    free(act->bsum8);
    free(act->bsum128);
    free(act);
}

size_t kernels_act_cols(const kernels_act *act) { return act->cols; }
size_t kernels_act_count(const kernels_act *act) { return act->n; }

float kernels_act_value(const kernels_act *act, size_t v, size_t j)
{
    size_t nb = act->cols / KERNELS_BLOCK;
    int8_t q = act->q[v * act->cols + kernels_colpos(nb, j)];
    return act->d[v * nb + j / KERNELS_BLOCK] * (float)q;
}

void kernels_act_quantize_blocks(kernels_act *act, size_t v, const float *x,
                                 size_t b0, size_t b1)
{
    size_t nb = act->cols / KERNELS_BLOCK;
    const int32_t *bias = act->bias + v * act->cols / 4;

    kernels_ops_get()->act_quant(act, v, x, b0, b1);
    /* per block: the start values of a block sum over unsigned weights,
     * minus the bias times the block's activations: MXFP4 (e2m1 + 12),
     * int4 (q + 8), int8 (w + 128, AVX-512) */
    for (size_t b = b0; b < b1; b++) {
        size_t oe = kernels_bpos(nb, b, 0) / 4, oo = kernels_bpos(nb, b, 16) / 4;
        int32_t bs = bias[oe] + bias[oe + 1] + bias[oe + 2] + bias[oe + 3] +
                     bias[oo] + bias[oo + 1] + bias[oo + 2] + bias[oo + 3];
        act->bsum[v * nb + b] = bs;
        act->bsum8[v * nb + b] = bs / KERNELS_VNNI_BIAS * 8;
        act->bsum128[v * nb + b] = bs / KERNELS_VNNI_BIAS * 128;
    }
}

/* The definition (the SIMD variants store the same bytes): d = amax / 127,
 * q = lrintf(x * (127 / amax)) clamped to +-127, bias per 4 positions. */
void kernels_act_quant_scalar(kernels_act *act, size_t v, const float *x, size_t b0, size_t b1)
{
    size_t nb = act->cols / KERNELS_BLOCK;

    for (size_t b = b0; b < b1; b++) {
        const float *xb = x + b * KERNELS_BLOCK;
        int8_t *q = act->q + v * act->cols;          /* this vector's row */
        int32_t *bias = act->bias + v * act->cols / 4;
        float amax = 0, id;

        for (size_t j = 0; j < KERNELS_BLOCK; j++)
            if (fabsf(xb[j]) > amax)
                amax = fabsf(xb[j]);
        act->d[v * nb + b] = amax / 127.0f;
        id = amax > 0 ? 127.0f / amax : 0.0f;
        for (size_t j = 0; j < KERNELS_BLOCK; j++) {
            long r = lrintf(xb[j] * id);
            q[kernels_colpos(nb, b * KERNELS_BLOCK + j)] =
                (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
        }
        for (size_t l = 0; l < 8; l++) {
            size_t o = kernels_bpos(nb, b, 4 * l);
            bias[o / 4] = -KERNELS_VNNI_BIAS * (q[o] + q[o + 1] + q[o + 2] + q[o + 3]);
        }
    }
}

int kernels_act_quantize(kernels_act *act, const float *x, size_t cols, size_t n,
                         shoal_err *err)
{
    if (cols == 0 || cols % KERNELS_BLOCK)
        return shoal_err_set(err, SHOAL_EINVAL, "act: cols %zu is not a multiple of 32", cols);
    if (n == 0 || n > act->cap_blocks / (cols / KERNELS_BLOCK))
        return shoal_err_set(err, SHOAL_EINVAL, "act: %zu x %zu exceeds the capacity", n, cols);
    for (size_t i = 0; i < n * cols; i++)
        if (!isfinite(x[i])) {
            act->n = 0;
            return shoal_err_set(err, SHOAL_ERANGE, "act: non-finite value at %zu", i);
        }
    act->cols = cols;
    act->n = n;
    for (size_t v = 0; v < n; v++)
        kernels_act_quantize_blocks(act, v, x + v * cols, 0, cols / KERNELS_BLOCK);
    return 0;
}

void kernels_bf16_to_f32(const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = ((uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8) << 16;
        memcpy(&dst[i], &bits, sizeof bits);
    }
}

/* One row of f32 weights to int8 in the kernels_q8 layout. */
static int quantize_row(const float *w, size_t cols, int8_t *q, float *scale)
{
    float amax = 0, id;

    for (size_t j = 0; j < cols; j++) {
        if (!isfinite(w[j]))
            return -1;
        if (fabsf(w[j]) > amax)
            amax = fabsf(w[j]);
    }
    *scale = amax / 127.0f;
    id = amax > 0 ? 127.0f / amax : 0.0f;
    for (size_t j = 0; j < cols; j++) {
        long r = lrintf(w[j] * id);
        q[kernels_colpos(cols / KERNELS_BLOCK, j)] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
    }
    return 0;
}

int kernels_q8_quantize_f32(const float *src, size_t rows, size_t cols,
                            int8_t *q, float *scale, shoal_err *err)
{
    if (cols == 0 || cols % KERNELS_BLOCK)
        return shoal_err_set(err, SHOAL_EINVAL, "q8: cols %zu is not a multiple of 32", cols);
    for (size_t r = 0; r < rows; r++)
        if (quantize_row(src + r * cols, cols, q + r * cols, &scale[r]) < 0)
            return shoal_err_set(err, SHOAL_ERANGE, "q8: non-finite weight in row %zu", r);
    return 0;
}

int kernels_q8_quantize_bf16(const void *src, size_t rows, size_t cols,
                             int8_t *q, float *scale, shoal_err *err)
{
    const uint8_t *p = src;
    float *row;

    if (cols == 0 || cols % KERNELS_BLOCK)
        return shoal_err_set(err, SHOAL_EINVAL, "q8: cols %zu is not a multiple of 32", cols);
    row = malloc(cols * sizeof *row);
    if (!row)
        return shoal_err_set(err, SHOAL_ENOMEM, "q8: no memory for a row of %zu", cols);
    for (size_t r = 0; r < rows; r++) {
        kernels_bf16_to_f32(p + r * cols * 2, row, cols);
        if (quantize_row(row, cols, q + r * cols, &scale[r]) < 0) {
            free(row);
            return shoal_err_set(err, SHOAL_ERANGE, "q8: non-finite weight in row %zu", r);
        }
    }
    free(row);
    return 0;
}

float kernels_q8_value(const kernels_q8 *w, size_t r, size_t j)
{
    return w->scale[r] * (float)w->q[r * w->cols + kernels_colpos(w->cols / KERNELS_BLOCK, j)];
}
