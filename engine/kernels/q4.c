/* q4.c — the int4 spine format: its quantizers (BF16 and f32 rows to
 * kernels_q4), record sizes and the value accessor.
 *
 * Owns the one definition of how a weight becomes int4: per group of 32
 * columns (one activation block), scale = max|w| / 7 rounded to BF16, then
 * q = round(w * (1 / scale)) half to even, clamped to [-7, 7], stored as
 * q + 8 in MXFP4's nibble order.  Does not own the products (ref.c and the
 * ISA files) nor which tensors get int4 (the engine's plan).
 *
 * Why these choices (docs/kernels.md has the measurements): symmetric
 * round-to-nearest from the group's max, as the checkpoint's own MXFP4
 * ("observer: minmax"); group 32 rather than 64 (11-22 % less error on
 * heavy-tailed weights for 0.03 byte per weight more); BF16 scales, not f16
 * (same two bytes, f32's range so no group can overflow or go subnormal,
 * widened by a shift on every ISA; the scale's 8-bit mantissa moved the
 * error by under 0.5 %, since q is rounded against the stored scale) nor
 * f32 (twice the scale bytes for nothing measurable).
 */
#include "engine/kernels/kernels_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t kernels_q4_packed_bytes(size_t rows, size_t cols) { return rows * (cols / 2); }

size_t kernels_q4_scale_bytes(size_t rows, size_t cols)
{
    return rows * (cols / KERNELS_Q4_GROUP) * 2;
}

/* f32 to BF16 bits, rounded to nearest even (finite, non-negative input). */
static uint16_t bf16_round(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* One row of f32 weights to int4; -1 on a non-finite weight. */
static int quantize_row(const float *w, size_t cols, uint8_t *packed, uint8_t *scale)
{
    for (size_t j = 0; j < cols; j++)
        if (!isfinite(w[j]))
            return -1;
    for (size_t g = 0; g < cols / KERNELS_Q4_GROUP; g++) {
        const float *wg = w + g * KERNELS_Q4_GROUP;
        uint8_t *pg = packed + g * (KERNELS_Q4_GROUP / 2);
        float amax = 0;
        for (size_t j = 0; j < KERNELS_Q4_GROUP; j++)
            if (fabsf(wg[j]) > amax)
                amax = fabsf(wg[j]);
        uint16_t sb = bf16_round(amax / 7.0f);
        scale[2 * g] = (uint8_t)(sb & 0xFF);
        scale[2 * g + 1] = (uint8_t)(sb >> 8);
        float s = kernels_bf16(scale + 2 * g);
        float id = s > 0 ? 1.0f / s : 0.0f;
        for (size_t j = 0; j < KERNELS_Q4_GROUP; j += 2) {
            long q0 = lrintf(wg[j] * id), q1 = lrintf(wg[j + 1] * id);
            q0 = q0 > 7 ? 7 : q0 < -7 ? -7 : q0;
            q1 = q1 > 7 ? 7 : q1 < -7 ? -7 : q1;
            pg[j / 2] = (uint8_t)((q0 + 8) | (q1 + 8) << 4);
        }
    }
    return 0;
}

static int check_cols(size_t cols, shoal_err *err)
{
    if (cols == 0 || cols % KERNELS_Q4_GROUP)
        return shoal_err_set(err, SHOAL_EINVAL, "q4: cols %zu is not a multiple of %d", cols,
                             KERNELS_Q4_GROUP);
    return 0;
}

int kernels_q4_quantize_f32(const float *src, size_t rows, size_t cols,
                            uint8_t *packed, uint8_t *scale, shoal_err *err)
{
    int rc = check_cols(cols, err);
    for (size_t r = 0; rc == 0 && r < rows; r++)
        if (quantize_row(src + r * cols, cols, packed + r * (cols / 2),
                         scale + r * (cols / KERNELS_Q4_GROUP) * 2) < 0)
            rc = shoal_err_set(err, SHOAL_ERANGE, "q4: non-finite weight in row %zu", r);
    return rc;
}

int kernels_q4_quantize_bf16(const void *src, size_t rows, size_t cols,
                             uint8_t *packed, uint8_t *scale, shoal_err *err)
{
    const uint8_t *p = src;
    float *row = NULL;
    int rc = check_cols(cols, err);

    if (rc == 0 && !(row = malloc(cols * sizeof *row)))
        rc = shoal_err_set(err, SHOAL_ENOMEM, "q4: no memory for a row of %zu", cols);
    for (size_t r = 0; rc == 0 && r < rows; r++) {
        kernels_bf16_to_f32(p + r * cols * 2, row, cols);
        if (quantize_row(row, cols, packed + r * (cols / 2),
                         scale + r * (cols / KERNELS_Q4_GROUP) * 2) < 0)
            rc = shoal_err_set(err, SHOAL_ERANGE, "q4: non-finite weight in row %zu", r);
    }
    free(row);
    return rc;
}

float kernels_q4_value(const kernels_q4 *w, size_t r, size_t j)
{
    uint8_t byte = w->packed[r * (w->cols / 2) + j / 2];
    int q = ((j & 1) ? byte >> 4 : byte & 15) - 8;
    return kernels_bf16(w->scale + (r * (w->cols / KERNELS_Q4_GROUP) + j / KERNELS_Q4_GROUP) * 2) *
           (float)q;
}
