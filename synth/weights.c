/* weights.c — the deterministic values of every synthetic tensor.
 *
 * Owns: the generator (k3.md §6) and the value recipes of synth_init.
 *
 *   state_0  = FNV-1a-64(full tensor name) XOR (seed · 0x9E3779B97F4A7C15)
 *              (seed 0 gives exactly k3.md §6)
 *   x_i      = SplitMix64 output i = mix(state_0 + (i+1)·golden), so any
 *              element is found without generating the ones before it
 *   u_i      = (x_i >> 40) · 2^-24, in [0, 1)
 *   value    = recipe(u_i) computed in double, rounded to float (RNE), and
 *              for BF16 tensors rounded again to BF16 (RNE)
 *   U8 bytes = floor(256 u) = x >> 56 (packed), 119 + floor(5 u) (scales)
 *
 * The k3 preset's expert bytes (1.45 TB of its 1.56) take 8 bytes from one
 * draw instead: byte i of the tensor is byte (i mod 8) of x_(i/8), little-
 * endian; a packed code byte is that byte b, a scale byte 119 + (5b >> 8)
 * (the same 119..123 range, scales 2^-8..2^-4).  Tiny and slice keep the
 * per-byte §6 rule.  Does not own where the bytes go (model.c).
 */
#include "synth/synth_int.h"

#include <math.h>
#include <string.h>

uint64_t synth_fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t synth_seed_state(const char *name, uint64_t seed)
{
    return synth_fnv1a64(name) ^ (seed * SYNTH_GOLDEN);
}

static inline uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t splitmix64(uint64_t *s)
{
    return mix(*s += SYNTH_GOLDEN);
}

static inline double unit(uint64_t x)
{
    return (double)(int64_t)(x >> 40) * (1.0 / 16777216.0);   /* signed: one instruction */
}

uint16_t synth_bf16_from_float(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u)      /* NaN: keep it a quiet NaN */
        return (uint16_t)((b >> 16) | 0x40);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

/* Value of element `i` of t for a draw u (floating recipes only). */
static inline double value(const synth_tensor *t, double scale, uint64_t i, double u)
{
    switch (t->init) {
    case SYNTH_INIT_MATRIX:     return (2.0 * u - 1.0) * scale;
    case SYNTH_INIT_NORM:       return 1.0 + 0.2 * (2.0 * u - 1.0);
    case SYNTH_INIT_RES_PROJ:
    case SYNTH_INIT_CONV:       return 0.5 * (2.0 * u - 1.0);
    case SYNTH_INIT_DT_BIAS:    return -4.0 + 4.0 * u;
    case SYNTH_INIT_A_LOG:      return i < t->used ? log(1.0 + 15.0 * u) : 0.0;
    case SYNTH_INIT_SCORE_BIAS: return 0.1 * (2.0 * u - 1.0);
    case SYNTH_INIT_BIAS:       return 0.02 * (2.0 * u - 1.0);
    default:                    return 0.0;
    }
}

static inline uint8_t scale8(uint8_t b)
{
    return (uint8_t)(119 + ((5u * b) >> 8));
}

/* Bytes [first, first+count) of an 8-bytes-per-draw tensor. */
static void fill_packed8(const synth_tensor *t, uint64_t first, uint64_t count, uint8_t *out)
{
    int scale = t->init == SYNTH_INIT_SCALE8;
    uint64_t i = first, end = first + count;

    while (i < end) {
        uint64_t x = mix(t->state0 + ((i >> 3) + 1) * SYNTH_GOLDEN);
        if ((i & 7) == 0 && end - i >= 8) {
            uint8_t *o = out + (i - first);
            shoal_wr_le64(o, x);
            if (scale)
                for (int k = 0; k < 8; k++)
                    o[k] = scale8(o[k]);
            i += 8;
            continue;
        }
        for (; i < end; i++) {      /* a partial draw at either end */
            uint8_t b = (uint8_t)(x >> (8 * (i & 7)));
            out[i - first] = scale ? scale8(b) : b;
            if ((i & 7) == 7) {
                i++;
                break;
            }
        }
    }
}

/* BF16 elements.  `init` is a constant at the hot call (matrices are 99.9%
 * of the BF16 bytes), so the recipe's switch folds out of the loop. */
static inline __attribute__((always_inline)) void
fill_bf16(const synth_tensor *t, unsigned init, double scale, uint64_t first, uint64_t count,
          uint64_t state, uint8_t *out)
{
    for (uint64_t i = 0; i < count; i++) {
        double u = unit(splitmix64(&state));
        double v = init == SYNTH_INIT_MATRIX ? (2.0 * u - 1.0) * scale
                                             : value(t, scale, first + i, u);
        uint16_t h = synth_bf16_from_float((float)v);
        out[2 * i] = (uint8_t)h;
        out[2 * i + 1] = (uint8_t)(h >> 8);
    }
}

/* F32 elements, stored little-endian. */
static void fill_f32(const synth_tensor *t, uint64_t first, uint64_t count, uint64_t state,
                     uint8_t *out)
{
    for (uint64_t i = 0; i < count; i++) {
        float f = (float)value(t, 0.0, first + i, unit(splitmix64(&state)));
        uint32_t b;
        memcpy(&b, &f, 4);
        shoal_wr_le32(out + 4 * i, b);
    }
}

uint64_t synth_draw(const synth_tensor *t, uint64_t i)
{
    return mix(t->state0 + (i + 1) * SYNTH_GOLDEN);
}

double synth_unit(const synth_tensor *t, uint64_t i)
{
    return unit(synth_draw(t, i));
}

void synth_fill(const synth_tensor *t, uint64_t first, uint64_t count, uint8_t *out)
{
    /* in = the last dimension: y = W·x with W [out, in]. */
    double scale = t->init == SYNTH_INIT_MATRIX && t->ndim > 0
                       ? sqrt(3.0 / (double)t->shape[t->ndim - 1]) : 0.0;
    uint64_t state = t->state0 + first * SYNTH_GOLDEN;

    switch (t->init) {
    case SYNTH_INIT_PACKED8:
    case SYNTH_INIT_SCALE8:
        fill_packed8(t, first, count, out);
        return;
    case SYNTH_INIT_ORACLE:
        synth_oracle_fill(t, first, count, out);
        return;
    case SYNTH_INIT_PACKED:
        for (uint64_t i = 0; i < count; i++)
            out[i] = (uint8_t)(splitmix64(&state) >> 56);
        return;
    case SYNTH_INIT_SCALE:
        for (uint64_t i = 0; i < count; i++)
            out[i] = (uint8_t)(119 + (((splitmix64(&state) >> 40) * 5) >> 24));
        return;
    default:
        break;
    }
    if (t->dtype == SYNTH_BF16 && t->init == SYNTH_INIT_MATRIX)
        fill_bf16(t, SYNTH_INIT_MATRIX, scale, first, count, state, out);
    else if (t->dtype == SYNTH_BF16)
        fill_bf16(t, t->init, scale, first, count, state, out);
    else
        fill_f32(t, first, count, state, out);
}
