/* sched.c — single-flight transfers, priorities and waiters.
 *
 * Owns: the table of objects in flight (one transfer per object however
 * many ask), three FIFO queues (demand, prefetch, warm), the bound on
 * transfers running at once, and the waiters of each transfer.  Does not
 * own moving bytes (upstream.c) or answering waiters (ops.c, warm.c).
 *
 * Invariants:
 *   1. An object has at most one xfer in the table; a queued xfer is on the
 *      queue of its priority, a running one on the running list.
 *   2. x->prio is the best (lowest) priority of its waiters; a join of a
 *      better priority raises it and moves a queued xfer to that queue.
 *   3. At most cfg.parallel transfers run, plus upstream_headroom() more
 *      for a demand or prefetch while a transfer of a worse priority runs
 *      (the fetch session then serves the better one's parts first), so
 *      background work never delays an engine.  (With upstream_can_park(),
 *      the newest running warm transfer would be parked instead: writer
 *      paused, requeued.)
 *   4. Starting transfers happens in a deferred callback, never inside
 *      sched_attach, so a caller's loop over keys is never re-entered.
 *
 *   waiter attach -> QUEUED --pump--> RUNNING --upstream done--> (answered)
 *                      |  ^              |
 *                      |  +----park------+  (preempted by demand, shutdown)
 *                      +-- no waiters: dropped; RUNNING prefetch/warm with
 *                          no waiters: stopped (partial kept)
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/sys.h"

#include <assert.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#define SCHED_BUCKETS 4096

struct sched {
    shoald *d;
    xfer   *buckets[SCHED_BUCKETS];
    xfer   *q_head[PRIO_COUNT], *q_tail[PRIO_COUNT];
    size_t  q_len[PRIO_COUNT];
    xfer   *run_head, *run_tail;   /* oldest first */
    size_t  running;
    struct event *ev_pump;
};

static uint64_t key_hash(const cache_key *k)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = k->etag; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h ^= k->offset * 0x9e3779b97f4a7c15ull;
    h ^= k->length + (h << 6) + (h >> 2);
    return h;
}

static int key_eq(const cache_key *a, const cache_key *b)
{
    return a->offset == b->offset && a->length == b->length && strcmp(a->etag, b->etag) == 0;
}

xfer *sched_find(struct sched *s, const cache_key *key)
{
    for (xfer *x = s->buckets[key_hash(key) % SCHED_BUCKETS]; x; x = x->hnext)
        if (key_eq(&x->key, key))
            return x;
    return NULL;
}

static void table_remove(struct sched *s, xfer *x)
{
    for (xfer **pp = &s->buckets[key_hash(&x->key) % SCHED_BUCKETS]; *pp; pp = &(*pp)->hnext) {
        if (*pp == x) {
            *pp = x->hnext;
            return;
        }
    }
}

/* ---- lists ---------------------------------------------------------------- */

static void list_append(xfer **head, xfer **tail, xfer *x)
{
    x->qnext = NULL;
    x->qprev = *tail;
    if (*tail)
        (*tail)->qnext = x;
    else
        *head = x;
    *tail = x;
}

static void list_prepend(xfer **head, xfer **tail, xfer *x)
{
    x->qprev = NULL;
    x->qnext = *head;
    if (*head)
        (*head)->qprev = x;
    else
        *tail = x;
    *head = x;
}

static void list_remove(xfer **head, xfer **tail, xfer *x)
{
    if (x->qprev)
        x->qprev->qnext = x->qnext;
    else
        *head = x->qnext;
    if (x->qnext)
        x->qnext->qprev = x->qprev;
    else
        *tail = x->qprev;
    x->qprev = x->qnext = NULL;
}

static void queue_put(struct sched *s, xfer *x, int front)
{
    x->state = XFER_QUEUED;
    x->qprio = x->prio;
    if (front)
        list_prepend(&s->q_head[x->qprio], &s->q_tail[x->qprio], x);
    else
        list_append(&s->q_head[x->qprio], &s->q_tail[x->qprio], x);
    s->q_len[x->qprio]++;
}

static void queue_take(struct sched *s, xfer *x)
{
    list_remove(&s->q_head[x->qprio], &s->q_tail[x->qprio], x);
    s->q_len[x->qprio]--;
}

static void schedule_pump(struct sched *s)
{
    if (!s->d->stopping)
        event_active(s->ev_pump, EV_TIMEOUT, 0);
}

static void xfer_free(struct sched *s, xfer *x)
{
    assert(x->waiters == NULL);
    model_release(s->d, x->m);
    free(x);
}

/* ---- pump ------------------------------------------------------------------- */

static void xfer_fail_now(struct sched *s, xfer *x, int rc, const char *msg)
{
    table_remove(s, x);
    x->state = XFER_DONE;
    s->d->up.failed++;
    ops_xfer_finished(s->d, x, rc, msg);
    xfer_free(s, x);
}

static void run_start(struct sched *s, xfer *x)
{
    shoal_err err = { 0 };
    int rc;

    queue_take(s, x);
    x->state = XFER_RUNNING;
    x->t0_ns = shoal_now_ns();
    list_append(&s->run_head, &s->run_tail, x);
    s->running++;
    s->d->up.started++;
    rc = upstream_start(s->d, x, &err);
    if (rc) {
        list_remove(&s->run_head, &s->run_tail, x);
        s->running--;
        LOG_WARN("sched", "cannot start a transfer of %s: %s", x->m->man->files[x->obj.file].path,
                 err.msg);
        xfer_fail_now(s, x, rc, err.msg);
    }
}

/* Is a transfer of a worse priority than p running?  Then a p transfer
 * may take a headroom slot: the fetch session serves its parts before the
 * other's (priorities per connection), so it does not wait for a whole
 * prefetch or warm object to finish. */
static int sched_lower_running(const struct sched *s, int p)
{
    for (xfer *x = s->run_head; x; x = x->qnext)
        if (x->prio > p)
            return 1;
    return 0;
}

/* Park the newest running warm transfer to free a slot.  1 if one was. */
static int preempt_warm(struct sched *s)
{
    for (xfer *x = s->run_tail; x; x = x->qprev) {
        if (x->prio != PRIO_WARM)
            continue;
        upstream_stop(s->d, x, 1);
        list_remove(&s->run_head, &s->run_tail, x);
        s->running--;
        s->d->up.parked++;
        queue_put(s, x, 1);
        LOG_DEBUG("sched", "parked a warm transfer for a demand");
        return 1;
    }
    return 0;
}

static void sched_pump(evutil_socket_t fd, short what, void *arg)
{
    struct sched *s = arg;
    (void)fd;
    (void)what;
    for (;;) {
        int p = 0;
        while (p < PRIO_COUNT && !s->q_head[p])
            p++;
        if (p == PRIO_COUNT || s->d->stopping)
            return;
        if (s->running >= (size_t)s->d->cfg.parallel) {
            if (p == PRIO_WARM)
                return;
            if (upstream_can_park()) {
                if (!preempt_warm(s))
                    return;
            } else if (!sched_lower_running(s, p) ||
                       s->running >= (size_t)(s->d->cfg.parallel + upstream_headroom(s->d))) {
                return;
            }
        }
        run_start(s, s->q_head[p]);
    }
}

/* ---- waiters ------------------------------------------------------------------- */

static void xfer_reprioritise(struct sched *s, xfer *x)
{
    int best = PRIO_WARM;
    for (waiter *w = x->waiters; w; w = w->next)
        if (w->prio < best)
            best = w->prio;
    if (x->state == XFER_RUNNING && best < x->prio) {
        x->prio = best;
        upstream_set_priority(s->d, x);   /* its parts not yet started go first */
    }
    x->prio = best;
    if (best == PRIO_DEMAND)
        x->had_demand = 1;
    if (x->state == XFER_QUEUED && x->qprio != best) {
        queue_take(s, x);
        queue_put(s, x, 0);
    }
}

int sched_attach(struct sched *s, model *m, const objref *o, waiter *w, shoal_err *err)
{
    xfer *x = sched_find(s, &o->key);

    if (!x) {
        size_t n = strlen(o->key.etag);
        int rc;
        if (n > CACHE_ETAG_MAX)
            return shoal_err_set(err, SHOAL_EINVAL, "etag too long");
        if ((rc = integrity_refused(s->d, o->key.etag, err)) != 0)
            return rc;   /* upstream keeps lying about this file */
        x = calloc(1, sizeof *x);
        if (!x)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        memcpy(x->etag, o->key.etag, n + 1);
        x->obj = *o;
        x->key = o->key;
        x->key.etag = x->etag;
        x->obj.key.etag = x->etag;
        x->m = m;
        m->refs++;
        x->prio = w->prio;
        x->had_demand = w->prio == PRIO_DEMAND;
        x->hnext = s->buckets[key_hash(&x->key) % SCHED_BUCKETS];
        s->buckets[key_hash(&x->key) % SCHED_BUCKETS] = x;
        queue_put(s, x, 0);
    }
    w->x = x;
    w->prev = NULL;
    w->next = x->waiters;
    if (x->waiters)
        x->waiters->prev = w;
    x->waiters = w;
    x->nwaiters++;
    w->t0_ns = shoal_now_ns();
    if (w->prio < x->prio)
        xfer_reprioritise(s, x);
    schedule_pump(s);
    return 0;
}

void sched_detach(struct sched *s, waiter *w)
{
    xfer *x = w->x;
    if (!x)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        x->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->x = NULL;
    w->prev = w->next = NULL;
    x->nwaiters--;
    if (x->waiters) {
        xfer_reprioritise(s, x);
        return;
    }
    if (x->state == XFER_QUEUED) {
        queue_take(s, x);
        table_remove(s, x);
        xfer_free(s, x);
        return;
    }
    if (x->state == XFER_RUNNING && !x->had_demand && upstream_can_cancel()) {
        /* Nobody wants it: a cancelled prefetch.  Keep what arrived.  (An
         * upstream that cannot stop one transfer lets it finish into the
         * cache instead: a new ask for the object then joins it rather
         * than racing a second writer.) */
        upstream_stop(s->d, x, 1);
        list_remove(&s->run_head, &s->run_tail, x);
        s->running--;
        s->d->up.cancelled++;
        table_remove(s, x);
        xfer_free(s, x);
        schedule_pump(s);
    }
    /* A running transfer left running finishes for the cache (and any
     * later ask joins it). */
}

void sched_xfer_done(struct sched *s, xfer *x, int rc, const char *msg, uint64_t bytes)
{
    shoald *d = s->d;
    uint64_t ns = shoal_now_ns() - x->t0_ns;

    assert(x->state == XFER_RUNNING);
    list_remove(&s->run_head, &s->run_tail, x);
    s->running--;
    table_remove(s, x);
    x->state = XFER_DONE;
    d->up.bytes += bytes;
    d->up.wait_ns += ns;
    if (rc == 0) {
        cache_req req = { 0, x->m->model_id, x->obj.layer, x->obj.expert, CACHE_TIER_DISK };
        d->up.completed++;
        cache_stats_add(d->cache, &req, CACHE_NONE, bytes, 0, 0);
    } else {
        d->up.failed++;
        LOG_WARN("sched", "transfer of %s [%llu, +%llu) failed: %s",
                 x->m->man->files[x->obj.file].path, (unsigned long long)x->key.offset,
                 (unsigned long long)x->key.length, msg ? msg : shoal_strerror(rc));
    }
    ops_xfer_finished(d, x, rc, msg);
    xfer_free(s, x);
    schedule_pump(s);
}

void sched_fail_model(struct sched *s, model *m, int rc, const char *msg)
{
    for (xfer *x = s->run_head; x;) {
        if (x->m == m && x->up) {
            x->up = NULL;
            sched_xfer_done(s, x, rc, msg, 0);
            x = s->run_head;   /* the list changed */
            continue;
        }
        x = x->qnext;
    }
}

void sched_park_all(struct sched *s)
{
    while (s->run_head) {
        xfer *x = s->run_head;
        upstream_stop(s->d, x, 1);
        list_remove(&s->run_head, &s->run_tail, x);
        s->running--;
        s->d->up.parked++;
        queue_put(s, x, 1);
    }
}

/* Drop everything (after the loop stopped): waiters are let go unanswered. */
static void sched_clear(struct sched *s)
{
    sched_park_all(s);
    for (int p = 0; p < PRIO_COUNT; p++) {
        while (s->q_head[p]) {
            xfer *x = s->q_head[p];
            queue_take(s, x);
            table_remove(s, x);
            while (x->waiters) {
                waiter *w = x->waiters;
                x->waiters = w->next;
                w->x = NULL;
                w->prev = w->next = NULL;
            }
            xfer_free(s, x);
        }
    }
}

size_t sched_running(const struct sched *s) { return s->running; }
size_t sched_queued(const struct sched *s, int prio) { return s->q_len[prio]; }

int sched_new(shoald *d, struct sched **out)
{
    struct sched *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return SHOAL_ENOMEM;
    s->d = d;
    s->ev_pump = event_new(d->base, -1, 0, sched_pump, s);
    if (!s->ev_pump) {
        free(s);
        return SHOAL_ENOMEM;
    }
    *out = s;
    return 0;
}

void sched_free(struct sched *s)
{
    if (!s)
        return;
    sched_clear(s);
    event_free(s->ev_pump);
    free(s);
}
