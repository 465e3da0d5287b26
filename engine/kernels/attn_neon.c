/* attn_neon.c — the attention family on aarch64 Advanced SIMD (base ISA,
 * no flags): the kernels of attn_simd.h on 4 lanes.  Numerics:
 * attn_int.h; vfmaq is fused like fmaf.  mx(a, b) is a compare and
 * select: vmaxq_f32 orders +0 above -0 and x86 max_ps does not, and the
 * numerics are x86's.
 *
 * Tiles (32 registers): MLA scores 4 positions x 16 heads (16
 * accumulators), context 6 heads x 16 columns (24 accumulators), KDA 32
 * columns.
 */
#if defined(__aarch64__)

#include <arm_neon.h>

#include "engine/kernels/attn_int.h"

#define AV float32x4_t
#define AW 4
#define av_zero() vdupq_n_f32(0)
#define av_set1(x) vdupq_n_f32(x)
#define av_load(p) vld1q_f32(p)
#define av_store(p, v) vst1q_f32((p), (v))
#define av_add(a, b) vaddq_f32((a), (b))
#define av_sub(a, b) vsubq_f32((a), (b))
#define av_mul(a, b) vmulq_f32((a), (b))
#define av_div(a, b) vdivq_f32((a), (b))
#define av_fma(a, b, c) vfmaq_f32((c), (a), (b))
#define av_neg(v) vnegq_f32(v)
#define AV_PF(p) __builtin_prefetch((p), 0, 2)
#define AT_ROWS 4
#define AT_Z 4
#define AC_H 6
#define AC_Z 4
#define AK_Z 8

/* compare and select: x86's max_ps / min_ps (kernels_attn_max) */
#define av_max(a, b) vbslq_f32(vcgtq_f32((a), (b)), (a), (b))
#define av_min(a, b) vbslq_f32(vcltq_f32((a), (b)), (a), (b))
#define av_fnma(a, b, c) vfmsq_f32((c), (a), (b))
/* 2^k from the bits of y = k + 1.5*2^23 (kernels_attn_exp) */
#define av_pow2(y, rnd)                                                                  \
    vreinterpretq_f32_u32(vshlq_n_u32(                                                   \
        vaddq_u32(vsubq_u32(vreinterpretq_u32_f32(y), vreinterpretq_u32_f32(rnd)),       \
                  vdupq_n_u32(127)), 23))
#define av_zero_below(x, lo, v) vbslq_f32(vcltq_f32((x), (lo)), vdupq_n_f32(0), (v))

/* AW bf16 (shifted) or f16 (converted) values at p, widened exactly. */
#define av_widen(t, p)                                                                   \
    ((t) == KERNELS_KV_BF16 ? vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16))          \
                            : vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))))

#include "engine/kernels/attn_simd.h"

const kernels_attn_ops kernels_attn_ops_neon = KERNELS_ATTN_TABLE;

#else
/* Not aarch64: nothing to build (ISO C wants a declaration per file). */
typedef int kernels_attn_neon_unused;
#endif
