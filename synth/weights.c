/* weights.c — the deterministic values of every synthetic tensor.
 *
 * Owns: the generator (k3.md §6) and the value recipes of mk_init.
 *
 *   state_0  = FNV-1a-64(full tensor name) XOR (seed · 0x9E3779B97F4A7C15)
 *              (seed 0 gives exactly k3.md §6)
 *   x_i      = SplitMix64 output i (i = 0, 1, ...: element i, row-major)
 *   u_i      = (x_i >> 40) · 2^-24, in [0, 1)
 *   value    = recipe(u_i) computed in double, rounded to float (RNE), and
 *              for BF16 tensors rounded again to BF16 (RNE)
 *   U8 bytes = floor(256 u) = x >> 56 (packed), 119 + floor(5 u) (scales)
 *
 * Does not own where the bytes go (shard.c).
 */
#include "tools/mkmodel/mkmodel_int.h"

#include <math.h>
#include <string.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL

uint64_t mk_fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t mk_seed_state(const char *name, uint64_t seed)
{
    return mk_fnv1a64(name) ^ (seed * GOLDEN);
}

static inline uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += GOLDEN);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline double unit(uint64_t x)
{
    return (double)(x >> 40) * (1.0 / 16777216.0);
}

uint16_t mk_bf16_from_float(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u)      /* NaN: keep it a quiet NaN */
        return (uint16_t)((b >> 16) | 0x40);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

/* Value of element `i` of t for a draw u (floating recipes only). */
static inline double value(const mk_tensor *t, double scale, uint64_t i, double u)
{
    switch (t->init) {
    case MK_INIT_MATRIX:     return (2.0 * u - 1.0) * scale;
    case MK_INIT_NORM:       return 1.0 + 0.2 * (2.0 * u - 1.0);
    case MK_INIT_RES_PROJ:
    case MK_INIT_CONV:       return 0.5 * (2.0 * u - 1.0);
    case MK_INIT_DT_BIAS:    return -4.0 + 4.0 * u;
    case MK_INIT_A_LOG:      return i < t->used ? log(1.0 + 15.0 * u) : 0.0;
    case MK_INIT_SCORE_BIAS: return 0.1 * (2.0 * u - 1.0);
    default:                 return 0.0;
    }
}

void mk_fill(const mk_tensor *t, uint64_t *state, uint64_t first, uint8_t *out,
             uint64_t count)
{
    /* in = the last dimension: y = W·x with W [out, in]. */
    double scale = t->init == MK_INIT_MATRIX && t->ndim > 0
                       ? sqrt(3.0 / (double)t->shape[t->ndim - 1]) : 0.0;

    switch (t->init) {
    case MK_INIT_PACKED:
        for (uint64_t i = 0; i < count; i++)
            out[i] = (uint8_t)(splitmix64(state) >> 56);
        return;
    case MK_INIT_SCALE:
        for (uint64_t i = 0; i < count; i++)
            out[i] = (uint8_t)(119 + (((splitmix64(state) >> 40) * 5) >> 24));
        return;
    default:
        break;
    }
    if (t->dtype == MK_BF16) {
        for (uint64_t i = 0; i < count; i++) {
            uint16_t h = mk_bf16_from_float((float)value(t, scale, first + i,
                                                         unit(splitmix64(state))));
            out[2 * i] = (uint8_t)h;
            out[2 * i + 1] = (uint8_t)(h >> 8);
        }
    } else {   /* F32, stored little-endian */
        for (uint64_t i = 0; i < count; i++) {
            float f = (float)value(t, scale, first + i, unit(splitmix64(state)));
            uint32_t b;
            memcpy(&b, &f, 4);
            out[4 * i] = (uint8_t)b;
            out[4 * i + 1] = (uint8_t)(b >> 8);
            out[4 * i + 2] = (uint8_t)(b >> 16);
            out[4 * i + 3] = (uint8_t)(b >> 24);
        }
    }
}
