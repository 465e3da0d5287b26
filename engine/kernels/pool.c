/* pool.c — a small persistent thread pool for the kernels: parallel
 * regions, a barrier, nothing allocated per call.
 *
 * A region is published by storing fn/ctx, then `claim` = (generation << 32
 * | seats), then bumping `gen`.  A worker that sees a new generation takes a
 * seat with a compare-and-swap on `claim` (only if the generation still
 * matches and a seat is left), runs fn, and counts itself in `done`.
 * Workers spin for a short while after a region (the engine issues products
 * back to back, and a condition-variable wake-up costs tens of
 * microseconds, a sizeable part of a 100 us matrix-vector product), then
 * sleep on the condition variable.
 *
 * kernels_pool_run waits until every seat was taken and done: fn may use
 * the barrier.  kernels_pool_run_any closes the region as soon as the
 * caller's own fn returns: seats not yet taken are withdrawn, and it waits
 * only for the workers that joined.  On a shared machine a worker whose
 * core is busy with another process then costs nothing, instead of stalling
 * every product by a scheduler time slice; such regions share work through
 * a counter, not by tid, and must not use the barrier.
 *
 * Invariants:
 *  1. fn/ctx are written only while no worker is inside a region, and are
 *     published by the release store of `claim`; a worker reads them only
 *     after taking a seat of the current generation.
 *  2. `gen` changes only under `mu`, so a worker that checked it under `mu`
 *     and went to sleep cannot miss the broadcast.
 *  3. A worker that took no seat never touches fn/ctx, so the caller may
 *     return (and ctx die) once `done` equals the seats taken.
 */
#include "engine/kernels/kernels.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker spins before sleeping. */
#define POOL_SPIN_NS 200000ull
/* Spins before a waiter starts yielding its core. */
#define POOL_SPINS_BEFORE_YIELD 4000

struct worker {
    kernels_pool *pool;
    int tid;
    pthread_t th;
};

struct kernels_pool {
    int nthreads;
    struct worker *workers;      /* [nthreads - 1] */
    int started;                 /* workers created */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic unsigned gen;        /* region number, bumped to wake workers */
    _Atomic uint64_t claim;      /* generation << 32 | seats left */
    _Atomic int done;            /* workers that finished this region */
    _Atomic int stop;
    kernels_pool_fn fn;
    void *ctx;
    _Atomic unsigned bar_count;  /* threads arrived at the barrier */
    _Atomic unsigned bar_gen;    /* barrier episodes completed */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void backoff(unsigned *spins)
{
    if (++*spins < POOL_SPINS_BEFORE_YIELD)
        cpu_relax();
    else
        sched_yield();
}

/* Take a seat in region `g`; 0 if it is closed, full or already newer. */
static int seat_take(kernels_pool *p, uint32_t g)
{
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
    while ((uint32_t)(c >> 32) == g && (uint32_t)c > 0)
        if (atomic_compare_exchange_weak_explicit(&p->claim, &c, c - 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return 1;
    return 0;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    kernels_pool *p = w->pool;
    unsigned seen = 0;

    for (;;) {
        uint64_t t0 = now_ns();
        unsigned spins = 0;
        while (atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
               !atomic_load(&p->stop)) {
            if ((++spins & 255) == 0 && now_ns() - t0 > POOL_SPIN_NS) {
                pthread_mutex_lock(&p->mu);
                while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                    pthread_cond_wait(&p->cv, &p->mu);
                pthread_mutex_unlock(&p->mu);
                break;
            }
            cpu_relax();
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (seat_take(p, seen)) {
            p->fn(p->ctx, w->tid, p->nthreads);
            atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        }
    }
}

kernels_pool *kernels_pool_new(int nthreads)
{
    kernels_pool *p;

    if (nthreads < 1 || nthreads > 256)
        return NULL;
    p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->nthreads = nthreads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (nthreads > 1) {
        p->workers = calloc((size_t)nthreads - 1, sizeof *p->workers);
        if (!p->workers) {
            kernels_pool_free(p);
            return NULL;
        }
        for (int i = 0; i < nthreads - 1; i++) {
            p->workers[i] = (struct worker){ .pool = p, .tid = i + 1 };
            if (pthread_create(&p->workers[i].th, NULL, worker_main, &p->workers[i]) != 0) {
                kernels_pool_free(p);
                return NULL;
            }
            p->started++;
        }
    }
    return p;
}

void kernels_pool_free(kernels_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->started; i++)
        pthread_join(pool->workers[i].th, NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->workers);
    free(pool);
}

int kernels_pool_nthreads(const kernels_pool *pool)
{
    return pool ? pool->nthreads : 1;
}

/* Publish a region to the workers (invariant 1, 2). */
static void region_open(kernels_pool *pool, kernels_pool_fn fn, void *ctx)
{
    unsigned g;

    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    g = atomic_load_explicit(&pool->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&pool->claim, (uint64_t)g << 32 | (uint32_t)(pool->nthreads - 1),
                          memory_order_release);
    atomic_store_explicit(&pool->gen, g, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
}

static void region_wait(kernels_pool *pool, int joined)
{
    unsigned spins = 0;
    while (atomic_load_explicit(&pool->done, memory_order_acquire) < joined)
        backoff(&spins);
}

void kernels_pool_run(kernels_pool *pool, kernels_pool_fn fn, void *ctx)
{
    if (!pool || pool->nthreads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    region_open(pool, fn, ctx);
    fn(ctx, 0, pool->nthreads);
    region_wait(pool, pool->nthreads - 1);
}

void kernels_pool_run_any(kernels_pool *pool, kernels_pool_fn fn, void *ctx)
{
    uint64_t c;
    uint32_t left;

    if (!pool || pool->nthreads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    region_open(pool, fn, ctx);
    fn(ctx, 0, pool->nthreads);
    /* close: withdraw the seats nobody took (invariant 3) */
    c = atomic_load_explicit(&pool->claim, memory_order_acquire);
    while (!atomic_compare_exchange_weak_explicit(&pool->claim, &c, c & ~(uint64_t)0xFFFFFFFFu,
                                                  memory_order_acq_rel, memory_order_acquire))
        ;
    left = (uint32_t)c;
    region_wait(pool, pool->nthreads - 1 - (int)left);
}

void kernels_pool_barrier(kernels_pool *pool)
{
    unsigned g, spins = 0;

    if (!pool || pool->nthreads == 1)
        return;
    g = atomic_load_explicit(&pool->bar_gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&pool->bar_count, 1, memory_order_acq_rel) ==
        (unsigned)pool->nthreads - 1) {
        atomic_store_explicit(&pool->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&pool->bar_gen, 1, memory_order_release);
        return;
    }
    while (atomic_load_explicit(&pool->bar_gen, memory_order_acquire) == g)
        backoff(&spins);
}
