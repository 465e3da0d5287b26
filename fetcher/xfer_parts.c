/* xfer_parts.c — cutting a fetch session's queued work into requests: a
 * part of a large object, sized by guided self-scheduling so every
 * connection finishes at about the same time, or a run of adjacent small
 * objects of one file coalesced into one range.  Does not own which
 * queue or connection (xfer_sched.c), the requests themselves
 * (xfer_curl.c) nor the writers (xfer_store.c).
 */
#include "fetcher/xfer_int.h"

#include <stdlib.h>

static int big_object(const fetch_session *s, const obj *o)
{
    return s->split_min && o->it.length >= 2 * s->split_min;
}

/* Guided self-scheduling: the part is max(split_min, ceil(U / P)) of all
 * unassigned bytes U, clipped to the object's rest, and the whole rest
 * when less than split_min would remain.  With much queued (U / P at least
 * an object) whole objects go out, one request each; as the queue drains
 * parts shrink, so every connection finishes at about the same time.  A
 * prefetch always goes in split_min parts: a demand arriving behind it
 * then waits at most one small part for a connection. */
static uint64_t part_length(const fetch_session *s, const obj *o)
{
    uint64_t rest = o->it.length - o->assigned;
    uint64_t p = s->split_ways > 0 ? (uint64_t)s->split_ways : 1;
    uint64_t n = (s->unassigned + p - 1) / p;
    if (n < s->split_min || o->it.priority == FETCH_PRIO_PREFETCH)
        n = s->split_min;
    if (n >= rest || rest - n < s->split_min)
        n = rest;
    return n;
}

static int seg_add(xfer *x, size_t *cap, size_t oi, uint64_t lo, uint64_t hi, uint64_t next)
{
    if (x->nobj == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        seg *ng;
        if (nc > XF_MAX_RUN)
            return SHOAL_ETOOBIG;
        ng = realloc(x->segs, nc * sizeof *ng);
        if (!ng)
            return SHOAL_ENOMEM;
        x->segs = ng;
        *cap = nc;
    }
    x->segs[x->nobj++] = (seg){ oi, lo, hi, next };
    return 0;
}

/* Fill x from the best queued object: a part of a big object, or a run of
 * adjacent small objects of one file (up to coalesce bytes).  0 with
 * x->nobj == 0 when nothing is queued. */
int xf_take_work(fetch_session *s, xfer *x)
{
    size_t cap = 0;
    uint64_t total = 0, end;
    int p = 0, rc;
    obj *o;

    for (;;) {
        if (!(o = xf_queue_pick(s, &p)))
            return 0;
        rc = xf_obj_ready(s, o);
        if (rc < 0)
            return rc;
        if (rc == 0 && o->assigned < o->it.length)
            break;
    }
    x->file = o->it.file;
    x->prio = p;
    if (big_object(s, o)) {
        uint64_t n = part_length(s, o);
        if ((rc = seg_add(x, &cap, (size_t)(o - s->objs), o->assigned, o->assigned + n,
                          o->assigned)) != 0)
            return rc;
        xf_obj_take(s, o, n);
        o->running++;
        return 0;
    }
    /* A small object goes whole (from what its writer holds), then its
     * neighbours on the same queue while they are adjacent and small. */
    if ((rc = seg_add(x, &cap, (size_t)(o - s->objs), o->assigned, o->it.length, o->assigned)) != 0)
        return rc;
    total = o->it.length - o->assigned;
    xf_obj_take(s, o, o->it.length - o->assigned);
    o->running++;
    end = o->it.offset + o->it.length;
    for (size_t i = s->qhead[p] + 1; i < s->qlen[p] && x->nobj < XF_MAX_RUN; i++) {
        obj *n = &s->objs[s->queue[p][i]];
        if (!xf_obj_queued(n, p) || n->assigned != 0 || n->it.file != x->file
            || n->it.offset != end || big_object(s, n)
            || total + n->it.length > s->u->o.coalesce_bytes)
            break;
        rc = xf_obj_ready(s, n);
        if (rc < 0)
            return rc;
        if (rc == 1)
            break;
        /* the response covers all of n; what its writer holds is skipped */
        if ((rc = seg_add(x, &cap, (size_t)(n - s->objs), 0, n->it.length, n->assigned)) != 0)
            return rc == SHOAL_ETOOBIG ? 0 : rc;
        total += n->it.length;
        xf_obj_take(s, n, n->it.length - n->assigned);
        n->running++;
        end = n->it.offset + n->it.length;
    }
    return 0;
}
