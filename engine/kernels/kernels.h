/* kernels.h — the engine's compute core: MXFP4, int8, int4 and f32 matrix
 * products, activation quantization, SiTU, the fused routed-expert helper,
 * and the small thread pool they run on.
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

#endif
