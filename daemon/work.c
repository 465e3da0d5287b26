/* work.c — shoald's worker threads, and the requests that wait on them.
 *
 * Owns: DAEMON_WORKERS threads and a FIFO of jobs the loop posts; handing
 * each finished job back to the loop thread; loop "steps" (a job's done
 * function run again on a later loop turn, after the loop has polled its
 * sockets, for work done on the loop in bounded slices: GC, removals);
 * unlinking large files off the loop (the cache's unlinker); and the
 * requests clients wait on while a job runs (pending), with their
 * PROGRESS frames.  Does not own what a job does (model.c, derived.c,
 * keep.c, ops.c).
 *
 * Rules (DESIGN decision 12, cache/cache.h "Threads"):
 *   1. run() executes on a worker and touches only what its job owns: its
 *      own fields, a side handle of the cache it opened itself, files and
 *      network.  Never connections, sched, models or the writer handle
 *      (except a cache_writer the loop handed it: cache.h rule 4).
 *   2. done() executes on the loop thread, after run() returned; it may
 *      post the job again or schedule a step; when it does neither, the
 *      job is its own again (free it).
 *   3. The loop asks a job to end early by setting w->stop (shutdown, or
 *      nobody waits any more); run() checks it between steps, and the
 *      fetcher's blocking calls abandon a request when it is set.
 *   4. Progress is written by run() into w->prog (atomics) and read by the
 *      loop's progress timer, which sends a pending request's PROGRESS
 *      frame at most every SHOAL_PROGRESS_MS and only when the counters
 *      moved since the last one ("while work advances": a job that stalls
 *      sends nothing, and the client's own timeout stays armed).
 *
 * Completions cross threads through a mutex-guarded list and
 * event_active() on an event of the loop's base, which is thread-safe
 * because main.c turned on libevent's pthreads support before creating
 * the base.
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"

#include <errno.h>
#include <event2/event.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define WORK_TICK_MS 100          /* progress timer; frames at most every 500 ms */
#define WORK_CHECKPOINT_TICKS 20  /* a WAL checkpoint every 2 s */

struct workers {
    shoald         *d;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    work           *q_head, *q_tail;    /* posted, not started */
    /* the quick lane: one thread of its own for short I/O (a committing
     * transfer's fsync) that must not queue behind a K3 open or a shard's
     * hash on the others (work_post_quick) */
    work           *qq_head, *qq_tail;
    pthread_cond_t  qcv;
    work           *done_head, *done_tail;
    work           *steps_head, *steps_tail;   /* loop steps for the next turn */
    unsigned        running;            /* jobs inside run() */
    int             quit;
    pthread_t       th[DAEMON_WORKERS + 1];   /* the last: the quick lane's */
    unsigned        nth;
    struct event   *ev_done, *ev_steps, *ev_tick;
    pending        *pend;               /* every pending request */
    unsigned        ticks;
    int             checkpointing;      /* a checkpoint job is out */
};

/* ---- progress -------------------------------------------------------------------- */

void work_progress_set(work_progress *p, const char *phase, uint64_t done, uint64_t total)
{
    atomic_store(&p->phase, phase);
    atomic_store(&p->done, done);
    atomic_store(&p->total, total);
    atomic_fetch_add(&p->ticks, 1);
}

/* ---- the threads --------------------------------------------------------------- */

static void list_push(work **head, work **tail, work *w)
{
    w->next = NULL;
    if (*tail)
        (*tail)->next = w;
    else
        *head = w;
    *tail = w;
}

static work *list_pop(work **head, work **tail)
{
    work *w = *head;
    if (w) {
        *head = w->next;
        if (!*head)
            *tail = NULL;
        w->next = NULL;
    }
    return w;
}

/* Workers yield the CPU to the loop: a K3 build parses 76 MB of headers on
 * 8 threads (which inherit this), and the loop must still answer within
 * milliseconds on a 2-core machine.  Linux's nice value is per thread. */
#define WORK_NICE 5

/* A thread serving one lane's queue until quit and the queue drained. */
static void serve_lane(struct workers *W, work **head, work **tail, pthread_cond_t *cv)
{
    pthread_mutex_lock(&W->mu);
    for (;;) {
        work *w;
        while (!*head && !W->quit)
            pthread_cond_wait(cv, &W->mu);
        if (!*head)
            break;   /* quit, and the queue drained */
        w = list_pop(head, tail);
        W->running++;
        pthread_mutex_unlock(&W->mu);
        if (w->run)
            w->run(w);
        pthread_mutex_lock(&W->mu);
        W->running--;
        list_push(&W->done_head, &W->done_tail, w);
        if (W->ev_done)
            event_active(W->ev_done, EV_READ, 0);
    }
    pthread_mutex_unlock(&W->mu);
}

static void *worker_main(void *arg)
{
    struct workers *W = arg;
    if (shoal_thread_nice(WORK_NICE) != 0)
        LOG_DEBUG("work", "cannot lower a worker's priority: %s", strerror(errno));
    serve_lane(W, &W->q_head, &W->q_tail, &W->cv);
    return NULL;
}

/* The quick lane's jobs wait on the disk, not the CPU: normal priority. */
static void *quick_main(void *arg)
{
    struct workers *W = arg;
    serve_lane(W, &W->qq_head, &W->qq_tail, &W->qcv);
    return NULL;
}

static void live_drop(shoald *d, work *w)
{
    for (work **pp = &d->work_live; *pp; pp = &(*pp)->live_next) {
        if (*pp == w) {
            *pp = w->live_next;
            break;
        }
    }
    w->live_next = NULL;
    w->live = 0;
}

/* A job's done() on the loop, timed: one that holds the loop longer than
 * a few milliseconds is a bug of this file's rule 2 (log level debug). */
static void run_done(work *w)
{
    uint64_t t0 = shoal_now_ns(), dt;
    w->done(w);
    dt = shoal_now_ns() - t0;
    if (dt > 5000000)
        LOG_DEBUG("work", "a job's step held the loop %.1f ms", (double)dt / 1e6);
}

/* Run the done() of every finished job (loop thread). */
static void drain_done(struct workers *W)
{
    for (;;) {
        work *w;
        pthread_mutex_lock(&W->mu);
        w = list_pop(&W->done_head, &W->done_tail);
        pthread_mutex_unlock(&W->mu);
        if (!w)
            return;
        live_drop(W->d, w);
        if (w->done)
            run_done(w);
    }
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    drain_done(arg);
}

static void on_steps(evutil_socket_t fd, short what, void *arg)
{
    struct workers *W = arg;
    work *head = W->steps_head;
    (void)fd;
    (void)what;
    /* One step of each job that asked; steps asked for now run next turn. */
    W->steps_head = W->steps_tail = NULL;
    while (head) {
        work *w = head;
        head = w->next;
        w->next = NULL;
        run_done(w);
    }
}

/* The loop's list of jobs posted and not yet done (loop thread only), so
 * a shutdown can reach those inside run(). */
static void live_add(shoald *d, work *w)
{
    if (w->live)
        return;
    w->live = 1;
    w->live_next = d->work_live;
    d->work_live = w;
}

static void post_lane(shoald *d, work *w, int quick)
{
    struct workers *W = d->workers;
    w->d = d;
    if (d->stopping)
        atomic_store(&w->stop, 1);
    live_add(d, w);
    pthread_mutex_lock(&W->mu);
    if (W->quit) {   /* shutting down, threads gone: run here (w->stop is set) */
        pthread_mutex_unlock(&W->mu);
        if (w->run)
            w->run(w);
        pthread_mutex_lock(&W->mu);
        list_push(&W->done_head, &W->done_tail, w);
        pthread_mutex_unlock(&W->mu);
        return;
    }
    if (quick) {
        list_push(&W->qq_head, &W->qq_tail, w);
        pthread_cond_signal(&W->qcv);
    } else {
        list_push(&W->q_head, &W->q_tail, w);
        pthread_cond_signal(&W->cv);
    }
    pthread_mutex_unlock(&W->mu);
}

void work_post(shoald *d, work *w)
{
    post_lane(d, w, 0);
}

void work_post_quick(shoald *d, work *w)
{
    post_lane(d, w, 1);
}

void work_step(shoald *d, work *w)
{
    struct workers *W = d->workers;
    struct timeval now = { 0, 0 };
    w->d = d;
    if (d->stopping)
        atomic_store(&w->stop, 1);
    list_push(&W->steps_head, &W->steps_tail, w);
    /* A timer, not event_active: it fires after the next poll, so the
     * loop answers its sockets between two steps. */
    event_add(W->ev_steps, &now);
}

unsigned work_busy(const shoald *d)
{
    struct workers *W = d->workers;
    unsigned n;
    pthread_mutex_lock((pthread_mutex_t *)&W->mu);
    n = W->running;
    for (work *w = W->q_head; w; w = w->next)
        n++;
    for (work *w = W->qq_head; w; w = w->next)
        n++;
    pthread_mutex_unlock((pthread_mutex_t *)&W->mu);
    return n;
}

/* ---- unlinking off the loop ------------------------------------------------------ */

typedef struct unlink_job {
    work w;
    char path[SHOAL_PATH_MAX];
} unlink_job;

static void unlink_run(work *w)
{
    unlink_job *u = (unlink_job *)w;
    if (unlink(u->path) != 0 && errno != ENOENT)
        LOG_WARN("work", "unlink %s: %s", u->path, strerror(errno));
}

static void unlink_done(work *w)
{
    free(w);
}

/* The cache's unlinker: freeing a large file's extents takes 0.1-0.2 s. */
static void unlink_later(const char *path, void *ctx)
{
    shoald *d = ctx;
    unlink_job *u = calloc(1, sizeof *u);
    if (!u || strlen(path) >= sizeof u->path) {
        free(u);
        if (unlink(path) != 0 && errno != ENOENT)
            LOG_WARN("work", "unlink %s: %s", path, strerror(errno));
        return;
    }
    memcpy(u->path, path, strlen(path) + 1);
    u->w.run = unlink_run;
    u->w.done = unlink_done;
    work_post(d, &u->w);
}

/* ---- the index's WAL checkpoints ---------------------------------------------------
 * The writer never checkpoints (cache_config.manual_wal_checkpoint): a
 * checkpoint syncs index.db, and an fsync waits behind every other write
 * of the disk (0.3 s measured while a PUT streamed GBs).  A worker runs a
 * PASSIVE one every 2 s on a side handle, which never waits for the loop. */

int work_side_open(shoald *d, cache **side, shoal_err *err)
{
    cache_config cc;
    cache_config_default(&cc);
    cc.read_only = CACHE_OPEN_SIDE;
    *side = NULL;
    return cache_open(d->cfg.home, &cc, side, NULL, err);
}

typedef struct ckpt_job {
    work w;
    int  rc;
    shoal_err err;
} ckpt_job;

static void ckpt_run(work *w)
{
    ckpt_job *k = (ckpt_job *)w;
    cache *side = NULL;
    k->rc = work_side_open(w->d, &side, &k->err);
    if (k->rc == 0)
        k->rc = cache_wal_checkpoint(side, &k->err);
    cache_close(side);
}

static void ckpt_done(work *w)
{
    ckpt_job *k = (ckpt_job *)w;
    if (k->rc && k->rc != SHOAL_EBUSY)
        LOG_WARN("work", "checkpointing the index: %s", k->err.msg);
    w->d->workers->checkpointing = 0;
    free(k);
}

static void checkpoint_later(shoald *d)
{
    struct workers *W = d->workers;
    ckpt_job *k;
    if (W->checkpointing || d->stopping || !(k = calloc(1, sizeof *k)))
        return;
    k->w.run = ckpt_run;
    k->w.done = ckpt_done;
    W->checkpointing = 1;
    work_post(d, &k->w);
}

/* ---- pending requests and their progress ------------------------------------------ */

pending *pending_new(conn *c, uint64_t id, const work_progress *prog)
{
    struct workers *W = c->d->workers;
    pending *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->c = c;
    p->id = id;
    p->prog = prog;
    p->sent_ms = shoal_wall_ms();
    p->sent_ticks = prog ? atomic_load(&prog->ticks) : 0;
    p->next = W->pend;
    if (W->pend)
        W->pend->prev = p;
    W->pend = p;
    p->cnext = c->pending;
    c->pending = p;
    return p;
}

static void pending_unlink_conn(pending *p)
{
    if (!p->c)
        return;
    for (pending **pp = &p->c->pending; *pp; pp = &(*pp)->cnext) {
        if (*pp == p) {
            *pp = p->cnext;
            break;
        }
    }
    p->c = NULL;
    p->cnext = NULL;
}

void pending_end(shoald *d, pending *p)
{
    struct workers *W = d->workers;
    if (!p)
        return;
    pending_unlink_conn(p);
    if (p->prev)
        p->prev->next = p->next;
    else
        W->pend = p->next;
    if (p->next)
        p->next->prev = p->prev;
    free(p);
}

void pending_conn_gone(conn *c)
{
    while (c->pending) {
        pending *p = c->pending;
        c->pending = p->cnext;
        p->cnext = NULL;
        p->c = NULL;   /* the job goes on; its end answers nobody */
    }
}

static void progress_send(pending *p, uint64_t done, uint64_t total, const char *phase)
{
    shoal_msg_builder *b = conn_builder(p->c);
    size_t n = strlen(phase);
    shoal_msg_begin(b, SHOAL_MSG_PROGRESS, 0, p->id);
    shoal_msg_put_u64(b, done);
    shoal_msg_put_u64(b, total);
    shoal_msg_put_str(b, phase, n > SHOAL_PROGRESS_PHASE_MAX ? SHOAL_PROGRESS_PHASE_MAX : n);
    if (shoal_msg_end(b) == 0)
        conn_send(p->c, b->buf.data, b->buf.len, -1);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct workers *W = arg;
    int64_t now = shoal_wall_ms();
    (void)fd;
    (void)what;
    if (++W->ticks % WORK_CHECKPOINT_TICKS == 0)
        checkpoint_later(W->d);
    for (pending *p = W->pend; p; p = p->next) {
        uint64_t t;
        const char *phase;
        if (!p->c || !p->prog || p->c->version < 2 || now - p->sent_ms < SHOAL_PROGRESS_MS)
            continue;
        t = atomic_load(&p->prog->ticks);
        /* a client that does not read its replies gets no more of these */
        if (t == p->sent_ticks || p->c->out_control >= DAEMON_CONN_MAX_CONTROL / 2)
            continue;
        phase = atomic_load(&p->prog->phase);
        p->sent_ticks = t;
        p->sent_ms = now;
        progress_send(p, atomic_load(&p->prog->done), atomic_load(&p->prog->total),
                      phase ? phase : "");
    }
}

/* ---- start and stop --------------------------------------------------------------------- */

int work_init(shoald *d, shoal_err *err)
{
    struct workers *W = calloc(1, sizeof *W);
    struct timeval tick = { 0, WORK_TICK_MS * 1000 };

    if (!W)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    W->d = d;
    d->workers = W;
    pthread_mutex_init(&W->mu, NULL);
    pthread_cond_init(&W->cv, NULL);
    pthread_cond_init(&W->qcv, NULL);
    W->ev_done = event_new(d->base, -1, EV_PERSIST, on_done, W);
    W->ev_steps = event_new(d->base, -1, 0, on_steps, W);
    W->ev_tick = event_new(d->base, -1, EV_PERSIST, on_tick, W);
    if (!W->ev_done || !W->ev_steps || !W->ev_tick || event_add(W->ev_tick, &tick) != 0)
        return shoal_err_set(err, SHOAL_ENOMEM, "cannot create the worker events");
    for (; W->nth < DAEMON_WORKERS; W->nth++) {
        int e = pthread_create(&W->th[W->nth], NULL, worker_main, W);
        if (e)
            return shoal_err_set(err, SHOAL_EINTERNAL, "cannot start a worker thread: %s",
                                 strerror(e));
    }
    {
        int e = pthread_create(&W->th[W->nth], NULL, quick_main, W);
        if (e)
            return shoal_err_set(err, SHOAL_EINTERNAL, "cannot start the quick lane's thread: "
                                 "%s", strerror(e));
        W->nth++;
    }
    cache_set_unlinker(d->cache, unlink_later, d);
    return integrity_init(d, err);
}

void work_stop_all(shoald *d)
{
    for (work *w = d->work_live; w; w = w->live_next)
        atomic_store(&w->stop, 1);
    if (d->workers)
        for (work *w = d->workers->steps_head; w; w = w->next)
            atomic_store(&w->stop, 1);
}

void work_shutdown(shoald *d)
{
    struct workers *W = d->workers;
    if (!W)
        return;
    work_stop_all(d);
    /* Files freed from now on are unlinked at once. */
    if (d->cache)
        cache_set_unlinker(d->cache, NULL, NULL);
    pthread_mutex_lock(&W->mu);
    W->quit = 1;
    pthread_cond_broadcast(&W->cv);
    pthread_cond_broadcast(&W->qcv);
    pthread_mutex_unlock(&W->mu);
    for (unsigned i = 0; i < W->nth; i++)
        pthread_join(W->th[i], NULL);
    /* What finished, and the steps that were asked for, end now: each
     * sees d->stopping and w->stop and lets go of what it holds. */
    drain_done(W);
    while (W->steps_head || W->done_head) {
        on_steps(-1, 0, W);
        drain_done(W);
    }
    while (W->pend)
        pending_end(d, W->pend);
    integrity_shutdown(d);   /* after the last check job's done() */
    peer_shutdown(d);        /* after the last hash job's done() */
    if (W->ev_done)
        event_free(W->ev_done);
    if (W->ev_steps)
        event_free(W->ev_steps);
    if (W->ev_tick)
        event_free(W->ev_tick);
    pthread_cond_destroy(&W->cv);
    pthread_cond_destroy(&W->qcv);
    pthread_mutex_destroy(&W->mu);
    free(W);
    d->workers = NULL;
}
