/* kernels.h — the engine's compute core: MXFP4, int8, int4 and f32 matrix
 * products, activation quantization, SiTU, the fused routed-expert helper,
 * the attention kernels (MLA, KDA step and conv), and the small thread
 * pool they run on.
 *
 * Owns: weight layouts as shipped (MXFP4) or as derived at load (int8 and
 * int4 spine), the numerics of every product, ISA selection (scalar reference,
 * AVX2, AVX-512 VNNI, NEON), splitting rows across threads.  Does not own
 * where weights come from (mmap, daemon replies) nor any model logic beyond
 * SiTU and the expert's w2·SiTU(w1·z, w3·z).
 *
 * Shapes: a matrix is [rows, cols], row-major, y = W·x: a rows×cols matrix
 * times a cols-vector gives a rows-vector.  A batch X is n vectors stored
 * [n][cols]; the product Y is stored [n][rows].  n = 1 is matrix-vector; for
 * n > 1 every weight byte is read once for the whole batch.
 *
 * Alignment: byte matrices (MXFP4 packed/scale, int8 q) may sit at any
 * address (records inside an mmap'd span are at arbitrary offsets).  float
 * pointers must be float-aligned, as C requires.
 *
 * Numerics (docs/kernels.md has the full story):
 *   exact  f32 activations; scalar reference sums w·x in column order in f32;
 *          SIMD variants differ only in summation order.
 *   fast   activations quantized once per call to int8 in blocks of 32 with
 *          one f32 scale each (kernels_act); integer dots per block; the
 *          float combination order is fixed, so every ISA variant is
 *          bit-identical to the scalar reference.
 *
 * Threads: every product takes a kernels_pool (NULL = run on the caller's
 * thread only).  Rows are split between threads, never sums, so results do
 * not depend on the thread count.
 */
#ifndef SHOAL_KERNELS_H
#define SHOAL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* ---- ISA selection ------------------------------------------------------ */

typedef enum kernels_isa {
    KERNELS_ISA_SCALAR     = 0,  /* portable C reference, always available */
    KERNELS_ISA_AVX2       = 1,  /* x86-64 AVX2 + FMA */
    KERNELS_ISA_AVX512VNNI = 2,  /* x86-64 AVX-512 F/BW/VL + VNNI */
    KERNELS_ISA_NEON       = 3,  /* aarch64 Advanced SIMD (+ dotprod if present) */
    KERNELS_ISA_COUNT_
} kernels_isa;

/* Pick the best ISA this CPU supports.  Idempotent and thread-safe; every
 * product calls it lazily, so calling it is optional.  Returns the ISA. */
kernels_isa kernels_init(void);

/* Force an ISA (tests, benchmarks).  0, or SHOAL_EUNSUPPORTED if this build
 * or this CPU lacks it (the current choice is then unchanged).  Not meant to
 * be called while products run on other threads. */
int kernels_set_isa(kernels_isa isa, shoal_err *err);

kernels_isa kernels_get_isa(void);
/* 1 if this build and CPU can run `isa`. */
int kernels_isa_supported(kernels_isa isa);
/* "scalar", "avx2", "avx512vnni", "neon"; "?" for anything else. */
const char *kernels_isa_name(kernels_isa isa);

/* ---- thread pool ----------------------------------------------------------- */

typedef struct kernels_pool kernels_pool;

/* A parallel region: runs once on each of the pool's threads. */
typedef void (*kernels_pool_fn)(void *ctx, int tid, int nthreads);

/* A pool of `nthreads` threads counting the caller's (so nthreads - 1 are
 * started).  nthreads 1 starts none.  NULL on failure (bad count, no
 * memory, pthread_create failed). */
kernels_pool *kernels_pool_new(int nthreads);
void kernels_pool_free(kernels_pool *pool);
/* 1 for NULL. */
int kernels_pool_nthreads(const kernels_pool *pool);

/* Run fn(ctx, tid, n) on every thread (tid 0 is the caller) and return when
 * all have finished.  Allocates nothing.  pool NULL or of one thread calls
 * fn(ctx, 0, 1) directly.  One caller at a time per pool. */
void kernels_pool_run(kernels_pool *pool, kernels_pool_fn fn, void *ctx);

/* Like kernels_pool_run, but returns as soon as the caller's own fn(ctx, 0,
 * n) has returned and the workers that had already joined have finished;
 * workers that had not joined by then skip the region.  For work shared
 * through a counter (so any subset of threads completes it): fn must not
 * use the barrier nor rely on every tid running.  Robust when another
 * process holds a core. */
void kernels_pool_run_any(kernels_pool *pool, kernels_pool_fn fn, void *ctx);

/* Inside a kernels_pool_run region only: wait until every thread of the region got here.
 * No-op for NULL or a one-thread pool. */
void kernels_pool_barrier(kernels_pool *pool);

/* ---- weight layouts ---------------------------------------------------------- */

/* MXFP4 matrix as shipped in the checkpoint.
 *   packed U8 [rows, cols/2]: code of column j = low nibble of packed[r][j/2]
 *                             for even j, high nibble for odd j;
 *                             e2m1 {0,.5,1,1.5,2,3,4,6}, bit 3 = sign.
 *   scale  U8 [rows, cols/32]: ue8m0, 2^(s-127) built as float bits s<<23
 *                             (s = 0 gives 0).
 * w[r][j] = e2m1(code) * 2^(scale[r][j/32] - 127).  cols % 32 == 0. */
typedef struct kernels_mxfp4 {
    const uint8_t *packed;
    const uint8_t *scale;
    size_t rows, cols;
} kernels_mxfp4;

/* int8 matrix with one f32 scale per row (the spine, quantized at load by
 * kernels_q8_quantize_*).  w[r][j] = scale[r] * q(r, j), q in [-127, 127].
 * Inside each block of 32 columns the bytes are stored in the same order as
 * quantized activations: positions 0..15 hold even columns 32g+0,2,..,30,
 * positions 16..31 the odd ones (see kernels_q8_value).  cols % 32 == 0.
 *   q     I8  [rows, cols]
 *   scale F32 [rows] */
typedef struct kernels_q8 {
    const int8_t *q;
    const float *scale;
    size_t rows, cols;
} kernels_q8;

/* f32 matrix [rows, cols], plain row-major; any cols >= 1. */
typedef struct kernels_f32 {
    const float *w;
    size_t rows, cols;
} kernels_f32;

/* ---- activations ------------------------------------------------------------- */

/* n vectors of `cols` activations quantized to int8 in blocks of 32: per
 * block d = max|x| / 127 and q = round(x / d) (half to even), d = 0 and
 * q = 0 for an all-zero block.  Stored in even/odd order within each block
 * so a block lines up with its 16 packed MXFP4 bytes.  Caller-owned,
 * reused across calls; not shared between threads while being written. */
typedef struct kernels_act kernels_act;

/* Room for n vectors of up to `cols` (cols_max * nmax values in all).  NULL
 * on bad sizes or no memory. */
kernels_act *kernels_act_new(size_t cols_max, size_t nmax);
void kernels_act_free(kernels_act *act);

/* Quantize x [n][cols] into act.  cols % 32 == 0, cols * n within the
 * capacity.  Non-finite input is refused (SHOAL_ERANGE).  0 or a negative
 * code; on failure act holds nothing usable. */
int kernels_act_quantize(kernels_act *act, const float *x, size_t cols, size_t n,
                         shoal_err *err);
size_t kernels_act_cols(const kernels_act *act);
size_t kernels_act_count(const kernels_act *act);
/* Dequantized value d * q of vector v, column j (tests, debugging). */
float kernels_act_value(const kernels_act *act, size_t v, size_t j);

/* ---- conversions and quantizers --------------------------------------------- */

/* BF16 -> f32 by bits << 16.  src may be unaligned (little-endian bytes). */
void kernels_bf16_to_f32(const void *src, float *dst, size_t n);

/* Quantize a [rows, cols] BF16 (or f32) matrix to int8 with one scale per
 * row: scale = max|w| / 127, q = round(w / scale); a zero row gets scale 0.
 * q [rows*cols] and scale [rows] are caller-owned outputs in the kernels_q8
 * layout.  cols % 32 == 0; non-finite weights are refused (SHOAL_ERANGE). */
int kernels_q8_quantize_bf16(const void *src, size_t rows, size_t cols,
                             int8_t *q, float *scale, shoal_err *err);
int kernels_q8_quantize_f32(const float *src, size_t rows, size_t cols,
                            int8_t *q, float *scale, shoal_err *err);
/* w[r][j] = scale[r] * q(r, j), undoing the in-block order. */
float kernels_q8_value(const kernels_q8 *w, size_t r, size_t j);

/* ---- products ---------------------------------------------------------------- */
/* All: Y [n][rows] = W · X.  0, SHOAL_EINVAL for a bad shape (cols not a
 * multiple of 32 where required, act quantized for other cols), with Y
 * untouched. */

/* MXFP4, fast: n = kernels_act_count(x). */
int kernels_mxfp4_mul_fast(kernels_pool *pool, const kernels_mxfp4 *w,
                           const kernels_act *x, float *y, shoal_err *err);
/* MXFP4, exact: x [n][cols] in f32. */
int kernels_mxfp4_mul_exact(kernels_pool *pool, const kernels_mxfp4 *w,
                            const float *x, size_t n, float *y, shoal_err *err);
/* int8 spine: activations quantized per 32 (kernels_act), integer dots. */
int kernels_q8_mul(kernels_pool *pool, const kernels_q8 *w,
                   const kernels_act *x, float *y, shoal_err *err);
/* f32: x [n][cols]. */
int kernels_f32_mul(kernels_pool *pool, const kernels_f32 *w,
                    const float *x, size_t n, float *y, shoal_err *err);

/* ---- int4 spine (issue 15) ---------------------------------------------------- */

/* Columns per int4 scale group: one scale per 32 columns, the activation
 * block (docs/kernels.md: group 64 saves 0.03 byte per weight but had
 * 11-22 % more error on heavy-tailed weights). */
#define KERNELS_Q4_GROUP 32

/* Symmetric int4 matrix, derived at load by kernels_q4_quantize_*.
 * w[r][j] = scale(r, j/32) * q, q in [-7, 7].
 *   packed U8   [rows, cols/2]: MXFP4's nibble order (column j: low nibble of
 *               packed[r][j/2] for even j, high nibble for odd j), each nibble
 *               holding q + 8 (1..15), so a block's 16 bytes line up with its
 *               32 quantized activations with no shuffle.
 *   scale  BF16 [rows, cols/32]: little-endian pairs of bytes, any address;
 *               the f32 scale has the bits u16 << 16.
 * cols % 32 == 0. */
typedef struct kernels_q4 {
    const uint8_t *packed;
    const uint8_t *scale;
    size_t rows, cols;
} kernels_q4;

/* Bytes of the packed and scale records of a rows x cols int4 matrix. */
size_t kernels_q4_packed_bytes(size_t rows, size_t cols);
size_t kernels_q4_scale_bytes(size_t rows, size_t cols);

/* Quantize a [rows, cols] BF16 (or f32) matrix to int4: per group of 32
 * columns scale = bf16(max|w| / 7) (rounded to nearest even) and
 * q = round(w * (1 / scale)) (half to even) clamped to [-7, 7]; a group whose
 * scale is 0 gets q = 0.  packed and scale are caller-owned outputs of
 * kernels_q4_packed_bytes / _scale_bytes.  cols % 32 == 0; non-finite weights
 * are refused (SHOAL_ERANGE). */
int kernels_q4_quantize_bf16(const void *src, size_t rows, size_t cols,
                             uint8_t *packed, uint8_t *scale, shoal_err *err);
int kernels_q4_quantize_f32(const float *src, size_t rows, size_t cols,
                            uint8_t *packed, uint8_t *scale, shoal_err *err);
/* w[r][j] = scale * q (tests, debugging). */
float kernels_q4_value(const kernels_q4 *w, size_t r, size_t j);

/* int4: activations quantized per 32 (kernels_act), integer dots, the fold
 * of the fast MXFP4 product (bit-identical on every ISA, any n, any thread
 * count).  0 or SHOAL_EINVAL, as the other products. */
int kernels_q4_mul(kernels_pool *pool, const kernels_q4 *w,
                   const kernels_act *x, float *y, shoal_err *err);

/* ---- SiTU and the routed expert --------------------------------------------- */

/* h[i] = [b1·tanh(g/b1)·σ(g)] · [b2·tanh(u/b2)] for i < n (K3: b1 = 4,
 * b2 = 25).  h may alias g or u. */
void kernels_situ(const float *g, const float *u, float *h, size_t n,
                  float beta1, float beta2);

/* One routed expert: w1 (gate) and w3 (up) [I, L], w2 (down) [L, I]. */
typedef struct kernels_expert {
    kernels_mxfp4 w1, w2, w3;
} kernels_expert;

/* Bytes of one expert span: 3·I·L·17/32 (K3, I=3072 L=3584: 17,547,264). */
size_t kernels_expert_span_bytes(size_t I, size_t L);

/* Slice an expert span into its six records (borrowed: live as long as the
 * span).  Offset table, I and L multiples of 32:
 *   0                w1.packed [I, L/2]
 *   I·L/2            w1.scale  [I, L/32]
 *   I·L·17/32        w2.packed [L, I/2]
 *   I·L·(17/32+1/2)  w2.scale  [L, I/32]
 *   I·L·34/32        w3.packed [I, L/2]
 *   I·L·(34/32+1/2)  w3.scale  [I, L/32]
 * 0 or SHOAL_EINVAL. */
int kernels_expert_view(const uint8_t *span, size_t I, size_t L,
                        kernels_expert *out, shoal_err *err);

typedef enum kernels_numerics {
    KERNELS_FAST  = 0,  /* int8 activations per 32, integer dots */
    KERNELS_EXACT = 1   /* f32 activations */
} kernels_numerics;

/* Scratch for kernels_expert_apply (activations, g, u, h, y for up to nmax
 * vectors), plus the SiTU betas.  NULL on bad sizes or no memory. */
typedef struct kernels_expert_ws kernels_expert_ws;
kernels_expert_ws *kernels_expert_ws_new(size_t I, size_t L, size_t nmax,
                                         float beta1, float beta2);
void kernels_expert_ws_free(kernels_expert_ws *ws);

/* out[v] += weight[v] · (w2 · SiTU(w1·z[v], w3·z[v])) for v < n, in one
 * parallel region (w2 starts when all of h is done).  z, out [n][L]; weight [n].  In fast
 * mode z is quantized once and h = SiTU(...) is quantized per block by the
 * thread that computed it; the result is bit-identical to composing
 * kernels_act_quantize, kernels_mxfp4_mul_fast, kernels_situ and
 * out += weight * y with the same ISA.  0 or SHOAL_EINVAL. */
int kernels_expert_apply(kernels_expert_ws *ws, kernels_pool *pool,
                         const kernels_expert *e, const float *z, size_t n,
                         const float *weight, float *out, kernels_numerics mode,
                         shoal_err *err);

/* ---- attention: MLA and KDA (attn*.c) -----------------------------------------
 * f32 arithmetic in a fixed order per output element (docs/kernels.md,
 * "Attention"; the definition is in attn_int.h): every ISA is
 * bit-identical to the scalar reference, and results depend neither on
 * the thread count nor on how many tokens a call carries (token t of a
 * chunk gets the bits it gets alone). */

/* How cache rows are stored.  BF16 and F16 halve the bytes; values are
 * rounded to nearest even when stored (F16 overflows to inf beyond
 * 65504) and widened exactly when read. */
typedef enum kernels_kv_type {
    KERNELS_KV_F32  = 0,
    KERNELS_KV_BF16 = 1,
    KERNELS_KV_F16  = 2
} kernels_kv_type;

/* Bytes per value (4 or 2); 0 for an unknown type. */
size_t kernels_kv_size(kernels_kv_type t);
/* dst [n] of type t = src [n] rounded; src [n] = dst [n] widened. */
void kernels_kv_store(kernels_kv_type t, const float *src, void *dst, size_t n);
void kernels_kv_load(kernels_kv_type t, const void *src, float *dst, size_t n);

/* One call of absorbed MLA attention (k3.md §3.4) for n tokens:
 *   score_h(s) = (qa_h·c_s + qx_h·r_s) * scale,  p = softmax over s < len_t,
 *   ctx_h = Σ_s p_h(s) c_s,   len_t = pos0 + t + 1.
 * The cache is read once per call for all heads (K3: 96 heads share each
 * 576-value row). */
typedef struct kernels_mla {
    size_t heads, kl, rope;     /* K3: 96, 512, 64 (rope may be 0) */
    kernels_kv_type type;       /* of c and r */
    const void *c;              /* [>= pos0 + n][kl] latents (RMS-normed) */
    const void *r;              /* [>= pos0 + n][rope] shared rope part */
    size_t pos0, n;             /* token t sees positions 0..pos0 + t */
    const float *qa;            /* [n][heads][kl] W_UK,hᵀ q_nope,h */
    const float *qx;            /* token t, head h: rope floats at qx + t*qx_tok + h*qx_head */
    size_t qx_tok, qx_head;
    float scale;                /* 1/sqrt(qk_nope + qk_rope) */
    float *ctx;                 /* [n][heads][kl] out */
} kernels_mla;

/* Scratch for up to nmax tokens a call and a pool of up to nthreads;
 * reused across calls (one call at a time).  NULL on bad sizes or no
 * memory. */
typedef struct kernels_mla_ws kernels_mla_ws;
kernels_mla_ws *kernels_mla_ws_new(size_t heads, size_t kl, size_t rope, size_t nmax,
                                   int nthreads);
void kernels_mla_ws_free(kernels_mla_ws *ws);
size_t kernels_mla_ws_bytes(const kernels_mla_ws *ws);

/* 0, or SHOAL_EINVAL (shapes other than the workspace's, n > nmax, a pool
 * larger than the workspace's nthreads, NULL pointers) with ctx untouched. */
int kernels_mla_attend(kernels_mla_ws *ws, kernels_pool *pool, const kernels_mla *a,
                       shoal_err *err);

/* The expanded form of the same attention (k3.md §3.4 allows either):
 *   K_h(s) = W_UK,h c_s, V_h(s) = W_UV,h c_s (materialized a block at a
 *   time), score_h(s) = (q_nope,h·K_h(s) + qx_h·r_s) * scale,
 *   o_h = Σ_s p_h(s) V_h(s)  — the output of W_UV already.
 * It spends 2·(nope + vd)·kl flops per head and position on the expansion
 * plus 2·(nope + rope + vd) per token, against the absorbed form's
 * 2·(2·kl + rope) per token (plus its q_abs and W_UV projections): cheaper
 * for large chunks (docs/kernels.md gives the crossover).  Its numbers
 * differ from the absorbed form's by f32 rounding only, so a caller must
 * not mix the two for one sequence where it wants chunking to keep bits. */
typedef struct kernels_mla_x {
    size_t heads, kl, rope, nope, vd;   /* K3: 96, 512, 64, 128, 128 */
    kernels_kv_type type;
    const void *c, *r;          /* the cache, as in kernels_mla */
    size_t pos0, n;
    const float *qn;            /* token t, head h: nope floats at qn + t*qn_tok + h*qn_head */
    size_t qn_tok, qn_head;
    const float *qx;            /* rope floats at qx + t*qx_tok + h*qx_head */
    size_t qx_tok, qx_head;
    const float *wkv;           /* [heads][nope + vd][kl]: W_UK,h rows, then W_UV,h (kv_b_proj) */
    float scale;
    float *o;                   /* [n][heads][vd] out */
} kernels_mla_x;

typedef struct kernels_mla_xws kernels_mla_xws;
kernels_mla_xws *kernels_mla_xws_new(size_t heads, size_t kl, size_t rope, size_t nope,
                                     size_t vd, size_t nmax, int nthreads);
void kernels_mla_xws_free(kernels_mla_xws *ws);
size_t kernels_mla_xws_bytes(const kernels_mla_xws *ws);
/* 0, or SHOAL_EINVAL as kernels_mla_attend. */
int kernels_mla_expanded(kernels_mla_xws *ws, kernels_pool *pool, const kernels_mla_x *a,
                         shoal_err *err);

/* The KDA delta rule (k3.md §3.3, step 6) for n tokens in order, every
 * head: S ← diag(α)S; u = v − Sᵀk; S ← S + β k uᵀ; o = Sᵀq.  Heads are
 * split between threads. */
typedef struct kernels_kda {
    size_t heads, dk, dv;       /* K3: 96, 128, 128 */
    float *S;                   /* [heads][dk][dv] state S[k][v], updated */
    size_t n;
    const float *q, *k;         /* [n][heads][dk] (q already scaled) */
    const float *alpha;         /* [n][heads][dk] decay factors */
    const float *v;             /* [n][heads][dv] */
    const float *beta;          /* [n][heads] */
    float *o;                   /* [n][heads][dv] out */
} kernels_kda;

/* 0, or SHOAL_EINVAL for a zero size or NULL pointer. */
int kernels_kda_step(kernels_pool *pool, const kernels_kda *a, shoal_err *err);

/* Causal depthwise conv then SiLU, in place, over n tokens in order:
 * x [n][p]; taps [kw][p] (tap kw-1 multiplies the current input; see
 * kernels_kda_conv_taps); win [kw-1][p] the previous kw-1 inputs, oldest
 * first, updated.  kw >= 1. */
void kernels_kda_conv(kernels_pool *pool, float *x, size_t n, size_t p, size_t kw,
                      const float *taps, float *win);
/* taps as stored in the checkpoint, [p][kw], to the [kw][p] order above. */
void kernels_kda_conv_taps(const float *src, size_t p, size_t kw, float *dst);

/* The decay (k3.md §3.3, step 4), in place over n tokens of p channels:
 * z[t][c] = exp(lower · σ(A[c] · (z[t][c] + dt_bias[c]))), σ(x) = 1/(1 + exp(-x)). */
void kernels_kda_decay(kernels_pool *pool, float *z, size_t n, size_t p, const float *A,
                       const float *dt_bias, float lower);

#endif
