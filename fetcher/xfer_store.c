/* xfer_store.c — the cache side of a fetch session: each object's writer
 * (opened or resumed from its durable prefix, committed when its last byte
 * lands, paused or aborted exactly once), a response's bytes written into
 * their objects at each segment's next byte, and local snapshot
 * directories copied with pread in bounded steps.  Does not own the
 * queues (xfer_sched.c), cutting requests (xfer_parts.c) nor libcurl
 * (xfer_curl.c).  Invariants: fetcher/xfer_int.h.
 */
#include "fetcher/xfer_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "common/sys.h"

/* ---- objects and their writers -------------------------------------------------- */

static const char *obj_etag(const fetch_session *s, const obj *o)
{
    return s->m->files[o->it.file].etag;
}

/* Hand n more bytes of o to a transfer (or to what its writer holds). */
void xf_obj_take(fetch_session *s, obj *o, uint64_t n)
{
    if (n == 0 || o->assigned >= o->it.length)
        return;
    if (n > o->it.length - o->assigned)
        n = o->it.length - o->assigned;
    o->assigned += n;
    s->unassigned -= n;
    if (o->assigned == o->it.length)
        s->nwaiting--;
}

/* o is done; tell the done function unless the loop reports it itself. */
static void obj_finish(fetch_session *s, obj *o, int rc, int tell)
{
    if (o->done)
        return;
    xf_obj_take(s, o, o->it.length - o->assigned);   /* nothing of it stays queued */
    o->done = 1;
    s->objects_done++;
    if (tell && s->dfn)
        s->dfn(&o->it, rc, s->dctx);
}

void xf_obj_finish(fetch_session *s, obj *o, int rc)
{
    obj_finish(s, o, rc, 1);
}

/* Open (or resume) o's writer.  1: already cached (done); 0: writer open;
 * negative: error in err. */
static int obj_open(fetch_session *s, obj *o, shoal_err *err)
{
    const manifest *m = s->m;
    cache_key key = { obj_etag(s, o), o->it.offset, o->it.length };
    cache_names names = CACHE_NAMES_NONE;
    int rc;

    if (o->done)
        return 1;
    names.endpoint = m->endpoint;   /* the model as the manifest (and the daemon) name it */
    names.repo = m->repo;
    names.revision = m->revision;
    names.commit = m->commit;
    names.file = m->files[o->it.file].path;
    names.tensor = o->it.tensor;
    names.layer = o->it.layer;
    names.expert = o->it.expert;
    rc = cache_write_begin(s->c, &key, o->it.kind, &names, &o->w, err);
    if (rc == 0 && s->ops->checkpoint)
        cache_writer_defer_checkpoints(o->w);
    if (rc == SHOAL_EEXIST) {
        s->bytes_done += o->it.length;
        s->u->st.objects_cached++;
        xf_obj_finish(s, o, 0);
        return 1;
    }
    if (rc == SHOAL_EBUSY) {
        /* Another writer has it (the same object asked twice): not this
         * session's to fetch, and no reason to stop the others.  Callers
         * that need single-flight (the daemon) do it above the session. */
        s->bytes_done += o->it.length;
        xf_obj_finish(s, o, SHOAL_EBUSY);
        return 1;
    }
    if (rc == 0) {
        s->bytes_done += cache_writer_offset(o->w);
        xf_obj_take(s, o, cache_writer_offset(o->w));   /* resumed: from the durable prefix */
    }
    return rc;
}

/* A due checkpoint of o's writer goes to the loop (deferred writers only). */
static void obj_checkpoint(fetch_session *s, obj *o)
{
    uint64_t durable, id;
    if (o->w && s->ops->checkpoint && cache_writer_checkpoint_due(o->w, &durable, &id))
        s->ops->checkpoint(s->loop, o->w, id, durable);
}

static int obj_commit(fetch_session *s, obj *o, shoal_err *err)
{
    int rc;
    if (s->ops->commit) {   /* synced and committed off the loop's thread; it tells */
        cache_writer *w = o->w;
        o->w = NULL;
        s->u->st.objects_fetched++;
        obj_finish(s, o, 0, 0);
        s->ops->commit(s->loop, w, &o->it);
        return 0;
    }
    rc = cache_write_commit(o->w, NULL, err);
    o->w = NULL;
    if (rc == 0) {
        s->u->st.objects_fetched++;
        xf_obj_finish(s, o, 0);
    }
    return rc;
}

/* Keep what a writer has (resumable: its contiguous prefix) unless it is
 * empty.  Forgets the writer, so it happens once (invariant 5). */
void xf_obj_pause(obj *o)
{
    if (!o->w)
        return;
    if (cache_writer_offset(o->w) > 0)
        cache_write_pause(o->w, NULL);
    else
        cache_write_abort(o->w);
    o->w = NULL;
}

/* Open o's writer if needed.  1: o finished (cached, busy, or resumed
 * complete and committed); 0: ready; negative: the session failed. */
int xf_obj_ready(fetch_session *s, obj *o)
{
    shoal_err e;
    int rc;
    if (o->done)
        return 1;
    if (!o->w) {
        rc = obj_open(s, o, &e);
        if (rc < 0) {
            if (rc == SHOAL_ENOSPC)
                shoal_err_wrap(&e, rc, "disk full or over the cache budget: free space or "
                               "raise the budget");
            xf_session_fail(s, rc, e.msg);
            return rc;
        }
        if (rc == 1)
            return 1;
    }
    if (cache_writer_offset(o->w) == o->it.length && o->running == 0) {
        /* a paused write that had every byte: nothing to fetch */
        if ((rc = obj_commit(s, o, &e)) != 0) {
            xf_session_fail(s, rc, e.msg);
            return rc;
        }
        return 1;
    }
    return 0;
}

/* ---- a response's bytes --------------------------------------------------------- */

/* Byte p of the response goes to its segment's object only when it is
 * that segment's next byte (invariant 2); what the writer has already is
 * skipped; an object commits when its last byte lands. */
int xf_body_write(xfer *x, const char *p, size_t len)
{
    fetch_session *s = x->s;
    size_t left = len;

    while (left > 0) {
        seg *g;
        obj *o;
        uint64_t end, take, rel;
        if (x->cur >= x->nobj) {
            x->refused = 1;
            shoal_err_set(&x->xerr, SHOAL_EPROTO, "the body is longer than the range");
            return -1;
        }
        g = &x->segs[x->cur];
        o = &s->objs[g->obj];
        end = o->it.offset + g->hi;
        take = end - x->pos < left ? end - x->pos : left;
        rel = x->pos - o->it.offset;
        if (o->w && !o->done && g->next < rel + take) {
            size_t skip;
            int rc;
            if (g->next < rel) {   /* a hole: invariant 3 broken */
                x->fatal = shoal_err_set(&x->xerr, SHOAL_EINTERNAL, "a part skipped bytes");
                return -1;
            }
            skip = (size_t)(g->next - rel);
            rc = cache_write_at(o->w, g->next, p + skip, (size_t)take - skip, &x->xerr);
            if (rc) {
                x->fatal = rc;
                return -1;
            }
            g->next += take - skip;
            s->bytes_done += take - skip;
            s->u->st.bytes_fetched += take - skip;
            obj_checkpoint(s, o);
            if (cache_writer_offset(o->w) == o->it.length) {   /* the last byte landed */
                rc = obj_commit(s, o, &x->xerr);
                if (rc) {
                    x->fatal = rc;
                    return -1;
                }
            }
        }
        x->pos += take;
        p += take;
        left -= (size_t)take;
        if (x->pos == end) {
            if (o->w && !o->done && g->next != g->hi) {
                x->fatal = shoal_err_set(&x->xerr, SHOAL_EINTERNAL, "a part ended short");
                return -1;
            }
            x->cur++;
        }
    }
    return 0;
}

/* ---- local upstreams ------------------------------------------------------------ */

/* Copy up to XF_LOCAL_STEP bytes of queued objects with pread, best
 * priority first.  1 if work remains. */
int xf_local_step(fetch_session *s)
{
    uint64_t budget = XF_LOCAL_STEP;
    shoal_err e;
    obj *o;
    int p;

    while (s->rc == 0 && budget > 0 && (o = xf_queue_pick(s, &p)) != NULL) {
        sfile *f = &s->files[o->it.file];
        int rc;
        if (f->local_fd < 0) {
            char full[PATH_MAX];
            if (up_local_path(s->u, s->m->files[o->it.file].path, full, sizeof full)
                || (f->local_fd = open(full, O_RDONLY | O_CLOEXEC)) < 0) {
                xf_session_fail(s, SHOAL_ENOTFOUND, "cannot open a snapshot file");
                return 0;
            }
        }
        if (xf_obj_ready(s, o) != 0)
            continue;   /* finished, or the session failed */
        while (budget > 0 && cache_writer_offset(o->w) < o->it.length) {
            uint64_t off = cache_writer_offset(o->w), n = o->it.length - off;
            if (n > XF_LOCAL_CHUNK)
                n = XF_LOCAL_CHUNK;
            rc = shoal_pread_all(f->local_fd, s->buf, (size_t)n, (off_t)(o->it.offset + off));
            if (rc) {
                shoal_err_set(&e, rc, "reading %s at %" PRIu64 ": %s",
                              s->m->files[o->it.file].path, o->it.offset + off,
                              rc == SHOAL_ERANGE ? "the file is shorter than the manifest says"
                                                 : strerror(errno));
                xf_session_fail(s, rc, e.msg);
                return 0;
            }
            if ((rc = cache_write_append(o->w, s->buf, (size_t)n, &e)) != 0) {
                xf_session_fail(s, rc, e.msg);
                return 0;
            }
            s->bytes_done += n;
            s->u->st.bytes_fetched += n;
            budget -= n < budget ? n : budget;
            obj_checkpoint(s, o);
        }
        if (cache_writer_offset(o->w) == o->it.length) {
            if ((rc = obj_commit(s, o, &e)) != 0) {
                xf_session_fail(s, rc, e.msg);
                return 0;
            }
        }
    }
    return s->rc == 0 && s->nwaiting > 0;
}
