/* dispatch.c — ISA selection and the public products: check shapes, split
 * rows between the pool's threads, call the chosen ISA's row kernel.
 *
 * The ISA is picked once (pthread_once) from what the build contains and
 * what the CPU reports; kernels_set_isa() overrides it for tests and
 * benchmarks.  Threads take chunks of KERNELS_CHUNK_ROWS consecutive rows
 * from a shared counter until none are left: a row's sum never depends on
 * which thread computed it, and a thread slowed down by a neighbour on its
 * core (this machine is shared) just takes fewer chunks.  A fixed split
 * was rejected for that reason: every product waited for the slowest half.
 */
#include "engine/kernels/kernels_int.h"

#include <pthread.h>
#include <stdatomic.h>

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static _Atomic int isa_current = KERNELS_ISA_SCALAR;

int kernels_isa_supported(kernels_isa isa)
{
    switch (isa) {
    case KERNELS_ISA_SCALAR:
        return 1;
#if defined(__x86_64__)
    case KERNELS_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case KERNELS_ISA_AVX512VNNI:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
#if defined(__aarch64__)
    case KERNELS_ISA_NEON:
        return 1;  /* Advanced SIMD is part of the aarch64 base ISA */
#endif
    default:
        return 0;
    }
}

const char *kernels_isa_name(kernels_isa isa)
{
    static const char *const names[KERNELS_ISA_COUNT_] = { "scalar", "avx2", "avx512vnni", "neon" };
    return (unsigned)isa < KERNELS_ISA_COUNT_ ? names[isa] : "?";
}

static void isa_pick(void)
{
    static const kernels_isa order[] = { KERNELS_ISA_AVX512VNNI, KERNELS_ISA_AVX2, KERNELS_ISA_NEON };
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (kernels_isa_supported(order[i])) {
            atomic_store(&isa_current, order[i]);
            return;
        }
    atomic_store(&isa_current, KERNELS_ISA_SCALAR);
}

kernels_isa kernels_init(void)
{
    pthread_once(&isa_once, isa_pick);
    return (kernels_isa)atomic_load(&isa_current);
}

kernels_isa kernels_get_isa(void) { return kernels_init(); }

int kernels_set_isa(kernels_isa isa, shoal_err *err)
{
    kernels_init();
    if (!kernels_isa_supported(isa))
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "kernels: ISA %s not supported here",
                             kernels_isa_name(isa));
    atomic_store(&isa_current, isa);
    return 0;
}

const kernels_ops *kernels_ops_get(void)
{
    switch (kernels_init()) {
#if defined(__x86_64__)
    case KERNELS_ISA_AVX2:       return &kernels_ops_avx2;
    case KERNELS_ISA_AVX512VNNI: return &kernels_ops_avx512;
#endif
#if defined(__aarch64__)
    case KERNELS_ISA_NEON:       return &kernels_ops_neon;
#endif
    default:                     return &kernels_ops_scalar;
    }
}

/* ---- products --------------------------------------------------------------- */

enum prod_kind { PROD_MXFP4_FAST, PROD_MXFP4_EXACT, PROD_Q8, PROD_F32, PROD_Q4 };

struct prod {
    enum prod_kind kind;
    const kernels_ops *ops;
    kernels_q4_fn q4;
    const void *w;
    size_t rows;
    const kernels_act *act;
    const float *x;
    size_t n;
    float *y;
    _Atomic size_t next;  /* first row not yet taken */
};

static void prod_rows(const struct prod *p, size_t r0, size_t r1)
{
    switch (p->kind) {
    case PROD_MXFP4_FAST:  p->ops->mxfp4_fast(p->w, r0, r1, p->act, p->y, p->rows); break;
    case PROD_MXFP4_EXACT: p->ops->mxfp4_exact(p->w, r0, r1, p->x, p->n, p->y, p->rows); break;
    case PROD_Q8:          p->ops->q8(p->w, r0, r1, p->act, p->y, p->rows); break;
    case PROD_F32:         p->ops->f32(p->w, r0, r1, p->x, p->n, p->y, p->rows); break;
    case PROD_Q4:          p->q4(p->w, r0, r1, p->act, p->y, p->rows); break;
    }
}

static void prod_task(void *ctx, int tid, int nthreads)
{
    struct prod *p = ctx;
    size_t r0;

    (void)tid;
    if (nthreads == 1) {
        prod_rows(p, 0, p->rows);
        return;
    }
    while ((r0 = atomic_fetch_add_explicit(&p->next, KERNELS_CHUNK_ROWS,
                                           memory_order_relaxed)) < p->rows)
        prod_rows(p, r0, r0 + KERNELS_CHUNK_ROWS < p->rows ? r0 + KERNELS_CHUNK_ROWS : p->rows);
}

static void prod_run(kernels_pool *pool, struct prod *p)
{
    p->ops = kernels_ops_get();
    p->q4 = kernels_q4_rows_get();
    if (p->rows == 0 || p->n == 0)
        return;
    atomic_init(&p->next, 0);
    /* Tiny products are not worth waking threads for. */
    if (p->rows < 64)
        prod_task(p, 0, 1);
    else
        kernels_pool_run_any(pool, prod_task, p);
}

static int check_cols(size_t cols, shoal_err *err)
{
    if (cols == 0 || cols % KERNELS_BLOCK)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: cols %zu is not a multiple of 32", cols);
    return 0;
}

static int check_act(const kernels_act *x, size_t cols, shoal_err *err)
{
    if (!x || x->n == 0 || x->cols != cols)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: activations hold %zu cols, matrix has %zu",
                             x ? x->cols : 0, cols);
    return 0;
}

int kernels_mxfp4_mul_fast(kernels_pool *pool, const kernels_mxfp4 *w,
                           const kernels_act *x, float *y, shoal_err *err)
{
    int rc = check_cols(w->cols, err);
    if (rc == 0)
        rc = check_act(x, w->cols, err);
    if (rc == 0) {
        struct prod p = { .kind = PROD_MXFP4_FAST, .w = w, .rows = w->rows, .act = x,
                          .n = x->n, .y = y };
        prod_run(pool, &p);
    }
    return rc;
}

int kernels_mxfp4_mul_exact(kernels_pool *pool, const kernels_mxfp4 *w,
                            const float *x, size_t n, float *y, shoal_err *err)
{
    int rc = check_cols(w->cols, err);
    if (rc == 0) {
        struct prod p = { .kind = PROD_MXFP4_EXACT, .w = w, .rows = w->rows, .x = x,
                          .n = n, .y = y };
        prod_run(pool, &p);
    }
    return rc;
}

int kernels_q8_mul(kernels_pool *pool, const kernels_q8 *w,
                   const kernels_act *x, float *y, shoal_err *err)
{
    int rc = check_cols(w->cols, err);
    if (rc == 0)
        rc = check_act(x, w->cols, err);
    if (rc == 0) {
        struct prod p = { .kind = PROD_Q8, .w = w, .rows = w->rows, .act = x, .n = x->n,
                          .y = y };
        prod_run(pool, &p);
    }
    return rc;
}

int kernels_f32_mul(kernels_pool *pool, const kernels_f32 *w,
                    const float *x, size_t n, float *y, shoal_err *err)
{
    if (w->cols == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "kernels: f32 matrix with 0 cols");
    struct prod p = { .kind = PROD_F32, .w = w, .rows = w->rows, .x = x, .n = n, .y = y };
    prod_run(pool, &p);
    return 0;
}

/* ---- int4 (issue 15) ------------------------------------------------------- */

kernels_q4_fn kernels_q4_rows_get(void)
{
    switch (kernels_init()) {
#if defined(__x86_64__)
    case KERNELS_ISA_AVX2:       return kernels_q4_rows_avx2;
    case KERNELS_ISA_AVX512VNNI: return kernels_q4_rows_avx512;
#endif
#if defined(__aarch64__)
    case KERNELS_ISA_NEON:       return kernels_q4_rows_neon;
#endif
    default:                     return kernels_q4_rows_scalar;
    }
}

int kernels_q4_mul(kernels_pool *pool, const kernels_q4 *w,
                   const kernels_act *x, float *y, shoal_err *err)
{
    int rc = check_cols(w->cols, err);
    if (rc == 0)
        rc = check_act(x, w->cols, err);
    if (rc == 0) {
        struct prod p = { .kind = PROD_Q4, .w = w, .rows = w->rows, .act = x, .n = x->n,
                          .y = y };
        prod_run(pool, &p);
    }
    return rc;
}
