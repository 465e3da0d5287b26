/* kernels_int.h — private to engine/kernels: the quantized-activation
 * record, the per-ISA row kernels and the table that selects them.
 *
 * Invariants of the fast path (every ISA variant keeps them, which is what
 * makes them bit-identical to the scalar reference):
 *  1. A block is 32 columns; position i < 16 of a block is its even column
 *     2i (low nibble of packed byte i), position 16 + i its odd column
 *     2i + 1 (high nibble).  int8 activations and int8 spine weights are
 *     stored in groups of up to 4 blocks (the last group of a row may be
 *     shorter, gs blocks): first the even halves of the group's blocks, 16
 *     bytes each, then their odd halves (kernels_bpos).  So one 64-byte
 *     load of packed MXFP4 bytes, masked to low nibbles, lines up with 64
 *     contiguous activation bytes, and its high nibbles with the next 64:
 *     no shuffle is needed to pair weights with activations.
 *  2. Position i of a block holds the weight code w_i (MXFP4: the doubled
 *     e2m1 value, an integer in [-12, 12]; int8: q in [-127, 127]) and the
 *     activation a_i.  The block gives 8 integer lane sums
 *     P[l] = sum_{k<4} w_{4l+k} * a_{4l+k}: 4 consecutive bytes in memory,
 *     exactly the int32 lanes of maddubs+madd (AVX2), dpbusd (AVX-512) and
 *     smull+pairwise adds (NEON).
 *  3. Block b of a row is folded into float accumulator A[b % 4][l] by
 *     A = fmaf((float)P[l], c_b, A), c_b = (weight scale * 0.5) * d_b for
 *     MXFP4 (0.5 undoes the doubling), c_b = d_b for int8; blocks in order.
 *  4. The row's result is
 *        t[l] = (A[0][l] + A[2][l]) + (A[1][l] + A[3][l])
 *        u[l] = t[l] + t[l+4],  v[l] = u[l] + u[l+2],  y = v[0] + v[1]
 *     times the row scale for int8.
 */
#ifndef SHOAL_KERNELS_INT_H
#define SHOAL_KERNELS_INT_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/kernels/kernels.h"

#define KERNELS_BLOCK 32
/* Added to every doubled e2m1 value so dpbusd sees unsigned weights. */
#define KERNELS_VNNI_BIAS 12
/* Batched fast MXFP4 (n > 1) decodes a row once into a buffer of this many
 * bytes (on the stack) and reuses it for every vector; longer rows fall
 * back to decoding per vector.  AVX-512 decodes tiles of 4 rows (64 KB of
 * weights plus 32 KB of spread scales on the stack; 64 KB for int8). */
#define KERNELS_ROWBUF 16384
/* Rows a thread takes at a time (a multiple of 32: the expert helper
 * quantizes the h rows it computed in whole blocks). */
#define KERNELS_CHUNK_ROWS 64
/* Software prefetch distance on packed bytes (scales: this / 16). */
#ifndef KERNELS_PREFETCH
#define KERNELS_PREFETCH 4096
#endif

struct kernels_act {
    size_t cols, n;          /* current contents */
    size_t cap_blocks;       /* room, in blocks of 32 */
    int8_t *q;               /* [n][cols], invariant 1 order */
    float *d;                /* [n][cols/32] block scales */
    int32_t *bias;           /* [n][cols/4]: -BIAS * sum of q[4j..4j+3] */
};

/* Quantize blocks [b0, b1) of vector v (x points at that vector). */
void kernels_act_quantize_blocks(kernels_act *act, size_t v, const float *x,
                                 size_t b0, size_t b1);

/* Row kernels: Y[v][r] for r in [r0, r1), v < n; y has row stride ldy. */
typedef struct kernels_ops {
    void (*mxfp4_fast)(const kernels_mxfp4 *w, size_t r0, size_t r1,
                       const kernels_act *a, float *y, size_t ldy);
    void (*mxfp4_exact)(const kernels_mxfp4 *w, size_t r0, size_t r1,
                        const float *x, size_t n, float *y, size_t ldy);
    void (*q8)(const kernels_q8 *w, size_t r0, size_t r1,
               const kernels_act *a, float *y, size_t ldy);
    void (*f32)(const kernels_f32 *w, size_t r0, size_t r1,
                const float *x, size_t n, float *y, size_t ldy);
} kernels_ops;

/* The table for the ISA chosen now (kernels_init() first if needed). */
const kernels_ops *kernels_ops_get(void);

extern const kernels_ops kernels_ops_scalar;
#if defined(__x86_64__)
extern const kernels_ops kernels_ops_avx2;
extern const kernels_ops kernels_ops_avx512;
#endif
#if defined(__aarch64__)
extern const kernels_ops kernels_ops_neon;
#endif

/* Shared helpers. */
static inline float kernels_ue8m0(uint8_t s)
{
    uint32_t bits = (uint32_t)s << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Invariant 4, from the 32 accumulators A[p][l] stored as a[p*8 + l]. */
static inline float kernels_reduce32(const float *a)
{
    float t[8], u[4], v[2];
    for (int l = 0; l < 8; l++)
        t[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    for (int l = 0; l < 4; l++)
        u[l] = t[l] + t[l + 4];
    v[0] = u[0] + u[2];
    v[1] = u[1] + u[3];
    return v[0] + v[1];
}

/* Doubled e2m1 values by code (bit 3 = sign). */
extern const int8_t kernels_e2m1x2[16];

/* Offset inside a row of nb blocks of position i (0..31) of block b
 * (invariant 1). */
static inline size_t kernels_bpos(size_t nb, size_t b, size_t i)
{
    size_t g = b / 4, k = b % 4, gs = nb - 4 * g < 4 ? nb - 4 * g : 4;
    return 128 * g + (i < 16 ? 16 * k + i : 16 * gs + 16 * k + (i - 16));
}

/* Offset of column j in a row of nb blocks. */
static inline size_t kernels_colpos(size_t nb, size_t j)
{
    size_t i = j % 32;
    return kernels_bpos(nb, j / 32, (i & 1) ? 16 + i / 2 : i / 2);
}

/* Fast MXFP4 blocks [b0, nb) of a row into A[32] (invariant 3), scalar.
 * The reference uses it for every block, SIMD variants for the last,
 * partial group of a row (never for K3's shapes). */
static inline void kernels_fast_blocks(float *A, const uint8_t *p, const uint8_t *s,
                                       const int8_t *q, const float *d, size_t b0, size_t nb)
{
    for (size_t b = b0; b < nb; b++) {
        float c = (kernels_ue8m0(s[b]) * 0.5f) * d[b];
        float *Ab = A + (b % 4) * 8;
        for (int l = 0; l < 8; l++) {
            const int8_t *qa = q + kernels_bpos(nb, b, 4 * (size_t)l);
            int32_t P = 0;
            for (int k = 0; k < 4; k++) {
                int i = 4 * l + k;
                uint8_t byte = p[b * 16 + (i & 15)];
                P += kernels_e2m1x2[i < 16 ? byte & 15 : byte >> 4] * qa[k];
            }
            Ab[l] = fmaf((float)P, c, Ab[l]);
        }
    }
}

/* int8 blocks [b0, nb) of a row into A[32], scalar (w and q same layout). */
static inline void kernels_q8_blocks(float *A, const int8_t *w, const int8_t *q,
                                     const float *d, size_t b0, size_t nb)
{
    for (size_t b = b0; b < nb; b++) {
        float *Ab = A + (b % 4) * 8;
        for (int l = 0; l < 8; l++) {
            size_t o = kernels_bpos(nb, b, 4 * (size_t)l);
            int32_t P = w[o] * q[o] + w[o + 1] * q[o + 1] + w[o + 2] * q[o + 2] +
                        w[o + 3] * q[o + 3];
            Ab[l] = fmaf((float)P, d[b], Ab[l]);
        }
    }
}

#endif
