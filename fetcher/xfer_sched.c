/* xfer_sched.c — a fetch session and its scheduling: the queues (one per
 * priority, objects sorted by file and offset), when another transfer may
 * start and for which priority, priority changes, cancel, stop, failure,
 * progress reports and the loop's timer.  Does not own cutting requests
 * (xfer_parts.c), libcurl (xfer_curl.c) nor the cache writers
 * (xfer_store.c).  Invariants: fetcher/xfer_int.h.
 */
#include "fetcher/xfer_int.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/sys.h"

/* ---- queues --------------------------------------------------------------------- */

/* 1 when o can be handed out: not finished, bytes still unassigned, on
 * queue p for its priority. */
int xf_obj_queued(const obj *o, int p)
{
    return !o->done && o->assigned < o->it.length && o->it.priority == p;
}

/* The first object of the best non-empty priority (ties: queue order),
 * dropping stale heads; NULL when nothing waits.  *prio gets its queue. */
obj *xf_queue_pick(fetch_session *s, int *prio)
{
    for (int p = 0; p < FETCH_PRIO_COUNT; p++) {
        while (s->qhead[p] < s->qlen[p]) {
            obj *o = &s->objs[s->queue[p][s->qhead[p]]];
            if (xf_obj_queued(o, p)) {
                *prio = p;
                return o;
            }
            o->inq &= ~(1u << p);
            s->qhead[p]++;
        }
    }
    return NULL;
}

static const fetch_session *sort_session;   /* qsort has no context argument */

static int queue_cmp(const void *a, const void *b)
{
    const obj *x = &sort_session->objs[*(const size_t *)a];
    const obj *y = &sort_session->objs[*(const size_t *)b];
    if (x->it.file != y->it.file)
        return x->it.file < y->it.file ? -1 : 1;
    return x->it.offset < y->it.offset ? -1 : x->it.offset > y->it.offset;
}

/* Make room for n more entries on queue p, dropping its consumed head. */
static int queue_reserve(fetch_session *s, int p, size_t n)
{
    size_t live = s->qlen[p] - s->qhead[p];
    size_t *q;
    if (live > 0 && s->qhead[p] > 0)
        memmove(s->queue[p], s->queue[p] + s->qhead[p], live * sizeof *s->queue[p]);
    s->qlen[p] = live;
    s->qhead[p] = 0;
    q = realloc(s->queue[p], (live + n + 1) * sizeof *q);
    if (!q)
        return SHOAL_ENOMEM;
    s->queue[p] = q;
    return 0;
}

static void queue_sort(fetch_session *s, int p)
{
    sort_session = s;
    qsort(s->queue[p] + s->qhead[p], s->qlen[p] - s->qhead[p], sizeof *s->queue[p], queue_cmp);
    sort_session = NULL;
}

/* ---- what goes on a connection -------------------------------------------------- */

/* May another transfer start?  Up to `parallel`; beyond that, up to
 * demand_headroom more for a demand item while a warm transfer holds a
 * connection (background warming never delays an engine by a whole part).
 * A prefetch gets no such pass: it is the engine's own guess, kept inside
 * the connection budget, and its parts are small (part_length) so a demand
 * waits at most one small part for a connection. */
static int slot_free(fetch_session *s)
{
    int p = 0;
    if (s->nxfers < s->u->o.parallel)
        return 1;
    if (s->nxfers >= s->u->o.parallel + s->u->o.demand_headroom || !xf_queue_pick(s, &p)
        || p != FETCH_PRIO_DEMAND)
        return 0;
    for (xfer *x = s->xfers; x; x = x->next)
        if (x->prio == FETCH_PRIO_WARM)
            return 1;
    return 0;
}

static void schedule(fetch_session *s)
{
    while (s->rc == 0 && !s->u->local && s->nwaiting > 0 && slot_free(s)) {
        xfer *x = xf_new(s);
        int rc;
        if (!x) {
            xf_session_fail(s, SHOAL_ENOMEM, "out of memory");
            return;
        }
        rc = xf_take_work(s, x);
        if (rc < 0 || s->rc) {
            if (s->rc == 0)
                xf_session_fail(s, rc, "out of memory");
            return;   /* xf_session_fail's stop_all freed x */
        }
        if (x->nobj == 0) {   /* nothing queued after all */
            xf_free(s, x);
            break;
        }
        {
            seg *g = &x->segs[x->nobj - 1];
            x->last = s->objs[g->obj].it.offset + g->hi - 1;
        }
        xf_go(x);
    }
}

/* ---- progress and the timer ----------------------------------------------------- */

static void progress(fetch_session *s, int final)
{
    uint64_t now = shoal_now_ns();
    fetch_progress p;
    if (!s->pfn || (!final && now - s->plast_ns < s->pinterval_ns))
        return;
    if (now > s->plast_ns && s->plast_ns) {
        double inst = (double)(s->u->st.bytes_fetched - s->plast_bytes) * 1e9
                      / (double)(now - s->plast_ns);
        s->rate = s->rate == 0 ? inst : 0.6 * s->rate + 0.4 * inst;
    }
    s->plast_ns = now;
    s->plast_bytes = s->u->st.bytes_fetched;
    p = (fetch_progress){ s->bytes_done, s->bytes_total, s->objects_done, s->nobjs, s->rate,
                          s->u->st.retries, final };
    s->pfn(&p, s->pctx);
}

static void rearm(fetch_session *s)
{
    uint64_t now = shoal_now_ns(), next = UINT64_MAX;
    long ms;

    if (s->curl_timer_ns)
        next = s->curl_timer_ns;
    for (xfer *x = s->xfers; x; x = x->next)
        if (x->state == X_WAIT_RETRY && x->retry_at_ns < next)
            next = x->retry_at_ns;
    for (size_t i = 0; s->files && i < s->m->nfiles; i++)
        if (s->files[i].r.waiting && s->files[i].r.retry_at_ns < next)
            next = s->files[i].r.retry_at_ns;
    if (s->u->local && s->rc == 0 && s->nwaiting > 0)
        next = now;
    if (s->pfn && !fetch_session_idle(s) && s->plast_ns + s->pinterval_ns < next)
        next = s->plast_ns + s->pinterval_ns;
    if (next == UINT64_MAX)
        ms = -1;
    else if (next <= now)
        ms = 0;
    else
        ms = (long)((next - now + 999999) / 1000000);
    s->ops->timer(s->loop, ms);
}

void xf_after(fetch_session *s)
{
    xf_process(s);
    schedule(s);
    xf_process(s);
    if (s->orphan && s->rc == 0)
        xf_session_fail(s, SHOAL_EINTERNAL, "an object's parts all ended before its last byte");
    if (fetch_session_idle(s)) {
        if (!s->final_sent)
            progress(s, 1);
        s->final_sent = 1;
    } else {
        progress(s, 0);
    }
    rearm(s);
}

/* ---- the session ---------------------------------------------------------------- */

static void stop_all(fetch_session *s)
{
    xf_curl_stop(s);   /* every transfer and resolve off the multi handle */
    for (size_t i = 0; i < s->nobjs; i++) {
        xf_obj_pause(&s->objs[i]);   /* once per object, whatever its parts did */
        if (!s->objs[i].done)     /* everyone waiting hears why */
            xf_obj_finish(s, &s->objs[i], s->rc ? s->rc : SHOAL_ECANCELED);
    }
    for (int p = 0; p < FETCH_PRIO_COUNT; p++)
        s->qhead[p] = s->qlen[p];
}

void xf_session_fail(fetch_session *s, int rc, const char *msg)
{
    if (s->rc)
        return;
    s->rc = rc;
    shoal_err_set(&s->err, rc, "%s", msg);
    LOG_DEBUG("fetch", "session failed: %s", msg);   /* the caller reports it */
    stop_all(s);
}

int fetch_session_new(fetch_upstream *u, cache *c, const manifest *m, const fetch_loop_ops *ops,
                      void *loop, fetch_session **out, shoal_err *err)
{
    fetch_session *s = calloc(1, sizeof *s);

    *out = NULL;
    if (!s)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    s->u = u;
    s->c = c;
    s->m = m;
    s->ops = ops;
    s->loop = loop;
    s->pinterval_ns = 250000000ull;
    s->split_min = u->o.split_min == 0 ? FETCH_DEFAULT_SPLIT_MIN
                   : u->o.split_min == FETCH_SPLIT_NEVER ? 0 : u->o.split_min;
    s->split_ways = u->o.split_ways > 0 ? u->o.split_ways : u->o.parallel;
    http_user_agent(s->ua, sizeof s->ua);
    s->files = calloc(m->nfiles ? m->nfiles : 1, sizeof *s->files);
    if (!s->files) {
        free(s);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < m->nfiles; i++)
        s->files[i].local_fd = -1;
    if (u->local) {
        s->buf = malloc(XF_LOCAL_CHUNK);
        if (!s->buf) {
            fetch_session_free(s);
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        }
    } else if (xf_curl_init(s) != 0) {
        fetch_session_free(s);
        return shoal_err_set(err, SHOAL_EINTERNAL, "libcurl multi initialisation failed");
    }
    *out = s;
    return 0;
}

void fetch_session_free(fetch_session *s)
{
    if (!s)
        return;
    if (s->files)
        stop_all(s);
    xf_curl_free(s);   /* the resolvers' handles, the multi handle */
    for (size_t i = 0; s->files && i < s->m->nfiles; i++)
        if (s->files[i].local_fd >= 0)
            close(s->files[i].local_fd);
    free(s->files);
    free(s->objs);
    for (int p = 0; p < FETCH_PRIO_COUNT; p++)
        free(s->queue[p]);
    free(s->buf);
    free(s);
}

void fetch_session_on_progress(fetch_session *s, fetch_progress_fn fn, void *ctx, long interval_ms)
{
    s->pfn = fn;
    s->pctx = ctx;
    s->pinterval_ns = (uint64_t)(interval_ms > 0 ? interval_ms : 250) * 1000000ull;
}

void fetch_session_on_done(fetch_session *s, fetch_done_fn fn, void *ctx)
{
    s->dfn = fn;
    s->dctx = ctx;
}

int fetch_session_add(fetch_session *s, const fetch_item *items, size_t n, shoal_err *err)
{
    size_t per[FETCH_PRIO_COUNT] = { 0 };
    if (s->rc)
        return fetch_session_status(s, err);
    for (size_t i = 0; i < n; i++) {
        if (items[i].priority < 0 || items[i].priority >= FETCH_PRIO_COUNT)
            return shoal_err_set(err, SHOAL_EINVAL, "item priority %d out of range",
                                 items[i].priority);
        per[items[i].priority]++;
    }
    if (s->nobjs + n > s->cap_objs) {
        size_t nc = s->nobjs + n + 64;
        obj *p = realloc(s->objs, nc * sizeof *p);
        if (!p)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        s->objs = p;
        s->cap_objs = nc;
    }
    for (int p = 0; p < FETCH_PRIO_COUNT; p++)
        if (per[p] && queue_reserve(s, p, per[p]) != 0)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const fetch_item *it = &items[i];
        cache_key key;
        cache_obj co;
        obj *o;
        if (it->file >= s->m->nfiles || it->length == 0
            || it->offset + it->length > s->m->files[it->file].size)
            return shoal_err_set(err, SHOAL_ERANGE, "item outside its file");
        o = &s->objs[s->nobjs];
        memset(o, 0, sizeof *o);
        o->it = *it;
        s->bytes_total += it->length;
        s->u->st.objects_total++;
        s->u->st.bytes_total += it->length;
        key = (cache_key){ s->m->files[it->file].etag, it->offset, it->length };
        if (cache_lookup(s->c, &key, NULL, &co, NULL) == 0) {
            close(co.fd);
            s->nobjs++;
            s->bytes_done += it->length;
            s->u->st.objects_cached++;
            o->assigned = it->length;
            xf_obj_finish(s, o, 0);
            continue;
        }
        s->nwaiting++;
        s->unassigned += it->length;
        o->inq = 1u << it->priority;
        s->queue[it->priority][s->qlen[it->priority]++] = s->nobjs++;
    }
    s->final_sent = 0;
    for (int p = 0; p < FETCH_PRIO_COUNT; p++)
        if (per[p])
            queue_sort(s, p);
    xf_after(s);
    return 0;
}

/* The unfinished object (file, offset, length), newest first; NULL if none. */
static obj *obj_find(fetch_session *s, uint32_t file, uint64_t offset, uint64_t length)
{
    for (size_t i = s->nobjs; i-- > 0;) {
        obj *o = &s->objs[i];
        if (!o->done && o->it.file == file && o->it.offset == offset && o->it.length == length)
            return o;
    }
    return NULL;
}

int fetch_session_set_priority(fetch_session *s, uint32_t file, uint64_t offset, uint64_t length,
                               int prio)
{
    obj *o;
    if (prio < 0 || prio >= FETCH_PRIO_COUNT)
        return SHOAL_EINVAL;
    if (!(o = obj_find(s, file, offset, length)))
        return SHOAL_ENOTFOUND;
    if (o->it.priority == prio)
        return 0;
    o->it.priority = prio;
    if (o->assigned < o->it.length && !(o->inq & (1u << prio))) {
        /* the entry on the old queue goes stale (queue_pick drops it) */
        if (queue_reserve(s, prio, 1) != 0)
            return SHOAL_ENOMEM;
        s->queue[prio][s->qlen[prio]++] = (size_t)(o - s->objs);
        o->inq |= 1u << prio;
        queue_sort(s, prio);
    }
    xf_after(s);
    return 0;
}

int fetch_session_cancel(fetch_session *s, uint32_t file, uint64_t offset, uint64_t length)
{
    obj *o = obj_find(s, file, offset, length);
    size_t oi;
    if (!o)
        return SHOAL_ENOTFOUND;
    oi = (size_t)(o - s->objs);
    xf_obj_pause(o);   /* keeps the contiguous prefix (invariant 5) */
    xf_obj_finish(s, o, SHOAL_ECANCELED);
    /* Stop the transfers that carry only this object; a coalesced run
     * with others goes on and drops its bytes (the object is done). */
    for (xfer *x = s->xfers, *nx; x; x = nx) {
        int mine = 0, others = 0;
        nx = x->next;
        for (size_t i = 0; i < x->nobj; i++) {
            if (x->segs[i].obj == oi)
                mine = 1;
            else if (!s->objs[x->segs[i].obj].done)
                others = 1;
        }
        if (!mine || others)
            continue;
        xf_drop(s, x);
    }
    xf_after(s);
    return 0;
}

int fetch_session_idle(const fetch_session *s)
{
    return s->nwaiting == 0 && s->nxfers == 0;
}

int fetch_session_status(const fetch_session *s, shoal_err *err)
{
    if (s->rc && err)
        *err = s->err;
    return s->rc;
}

void fetch_session_stop(fetch_session *s)
{
    if (s->rc == 0) {
        s->rc = SHOAL_ECANCELED;
        shoal_err_set(&s->err, SHOAL_ECANCELED, "stopped; partial objects are kept and a "
                      "later run resumes them");
    }
    stop_all(s);
    rearm(s);
}
