/* upstream.c — moving an object's bytes from upstream into the cache,
 * through the fetcher (fetcher/fetch.h) driven by the daemon's libevent loop.
 *
 * Owns: one fetch_upstream and one fetch_session per open model, the
 * libevent implementation of fetch_loop_ops (a persistent event per watched
 * socket, one timer per session), and turning the session's per-item
 * completions into sched_xfer_done() calls.
 *
 * Completions are deferred: the fetcher may finish an item inside
 * fetch_session_add (it was cached already) or inside a loop callback; we
 * record (key, rc) and report from a separate event, so sched never sees
 * a completion inside upstream_start and a session is never freed inside
 * its own callback.
 *
 * The session has --parallel connections (the P of its guided
 * self-scheduling), as many as sched runs transfers: an object alone on the
 * wire goes over several connections as parts (docs/fetcher.md), so the
 * last objects of a layer do not leave connections idle.  Each item
 * carries its transfer's priority, raised in the session when a demand
 * joins a running prefetch (upstream_set_priority).
 *
 * upstream_stop cancels one item in the session (fetch_session_cancel):
 * its running parts stop and its writer is paused, keeping the contiguous
 * prefix (parts ahead of it are lost).  So sched stops a prefetch nobody
 * waits for (upstream_can_cancel()).  It does not park warm transfers for
 * a demand (upstream_can_park() is 0): demand gets upstream_headroom()
 * extra transfers, which the session mirrors (demand_headroom: extra
 * connections for demand items while a prefetch or warm one runs).  The
 * cancel's own completion (ECANCELED) is not reported: the
 * xfer is gone or requeued, and a later transfer of the same key must not
 * receive it.  After a fatal session error (disk full, refused
 * credentials, too many failures) every transfer of that session fails
 * with it and the session is rebuilt on the next start.
 *
 * Nor does the loop wait on an fsync (docs/daemon.md, "What never waits"):
 * an object's last byte hands its writer here (fetch_loop_ops.commit); its
 * fsync (~11 ms for a 17.55 MB expert here, hundreds behind another
 * writer's GBs) runs on the workers' quick lane, then the loop commits
 * (rename + one transaction) and reports it as the item's completion.  A
 * transfer of the same key asked meanwhile waits for that completion
 * rather than starting.  A long object's 64 MiB checkpoints go the same
 * way (fetch_loop_ops.checkpoint): fdatasync on the lane, the partial row
 * recorded on the loop if the writer is still there.
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "fetcher/fetch.h"

#include "common/sys.h"

#include <event2/event.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* After a transfer found the upstream unreachable (SHOAL_EOFFLINE), new
 * transfers of that model fail at once for this long (docs/fetcher.md,
 * "Offline"): a warm job or an engine asking for 600 missing objects gets
 * 600 immediate errors, not 600 connection attempts. */
#define UPSTREAM_UNREACHABLE_MS 10000

typedef struct watch {
    int fd;                          /* -1: free slot */
    unsigned what;
    struct event *ev;
} watch;

struct upstream_model {
    shoald *d;
    model  *m;
    fetch_upstream *u;
    fetch_session  *s;
    struct event   *ev_timer;
    watch  *w;
    size_t  nw;
    int     broken;                  /* session failed: rebuild before use */
    int64_t unreachable_until_ms;    /* EOFFLINE: fail new transfers at once */
    char    unreachable[SHOAL_ERR_MSG_MAX];
    int     cancelling;              /* inside fetch_session_cancel */
};

typedef struct done_rec {
    struct done_rec *next;
    int     rc;
    char    msg[SHOAL_ERR_MSG_MAX];
    uint64_t offset, length;
    char    etag[CACHE_ETAG_MAX + 1];
} done_rec;

typedef struct commit_job {
    work wk;                         /* first: work.c casts */
    struct commit_job *next;         /* up.committing */
    cache_writer *w;
    done_rec *r;                     /* the completion it reports */
    int rc;
    shoal_err err;
} commit_job;

typedef struct ckpt_job {
    work wk;
    int fd;                          /* the writer's file, its own descriptor */
    uint64_t writer_id, durable;
    int rc;
    shoal_err err;
} ckpt_job;

static struct {
    shoald *d;
    struct event *ev_done;
    done_rec *head, *tail;
    commit_job *committing;          /* synced on the quick lane now */
} up;

/* ---- fetch_loop_ops over libevent ---------------------------------------------- */

static void on_io(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_model *um = arg;
    unsigned w = ((what & EV_READ) ? FETCH_WATCH_IN : 0) | ((what & EV_WRITE) ? FETCH_WATCH_OUT : 0);
    if (um->s)
        fetch_session_io(um->s, fd, w);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_model *um = arg;
    (void)fd;
    (void)what;
    if (um->s)
        fetch_session_timeout(um->s);
}

static int loop_watch(void *loop, int fd, unsigned what)
{
    struct upstream_model *um = loop;
    watch *slot = NULL;
    short ev = (short)(((what & FETCH_WATCH_IN) ? EV_READ : 0) | ((what & FETCH_WATCH_OUT) ? EV_WRITE : 0));

    for (size_t i = 0; i < um->nw; i++) {
        if (um->w[i].fd == fd) {
            slot = &um->w[i];
            break;
        }
    }
    if (what == FETCH_WATCH_NONE) {
        if (slot) {
            event_del(slot->ev);   /* freed with the session: we may be inside its callback */
            slot->fd = -1;
        }
        return 0;
    }
    if (!slot) {
        for (size_t i = 0; i < um->nw && !slot; i++)
            if (um->w[i].fd < 0)
                slot = &um->w[i];
        if (!slot) {
            watch *nw = realloc(um->w, (um->nw + 1) * sizeof *nw);
            if (!nw)
                return SHOAL_ENOMEM;
            um->w = nw;
            slot = &um->w[um->nw++];
            slot->ev = event_new(um->d->base, -1, 0, on_io, um);
            if (!slot->ev) {
                um->nw--;
                return SHOAL_ENOMEM;
            }
        }
        slot->fd = fd;
        slot->what = 0;
    }
    if (slot->what == what && event_pending(slot->ev, EV_READ | EV_WRITE, NULL))
        return 0;
    event_del(slot->ev);
    if (event_assign(slot->ev, um->d->base, fd, (short)(ev | EV_PERSIST), on_io, um) != 0 ||
        event_add(slot->ev, NULL) != 0)
        return SHOAL_EIO;
    slot->what = what;
    return 0;
}

static void loop_timer(void *loop, long ms)
{
    struct upstream_model *um = loop;
    struct timeval tv;
    if (ms < 0) {
        event_del(um->ev_timer);
        return;
    }
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    event_add(um->ev_timer, &tv);
}

static void loop_commit(void *loop, cache_writer *w, const fetch_item *it);
static void loop_checkpoint(void *loop, cache_writer *w, uint64_t writer_id, uint64_t durable);
static const fetch_loop_ops loop_ops = { loop_watch, loop_timer, loop_commit, loop_checkpoint };

/* ---- completions ------------------------------------------------------------------- */

static void done_push(done_rec *r)
{
    if (up.tail)
        up.tail->next = r;
    else
        up.head = r;
    up.tail = r;
    event_active(up.ev_done, EV_TIMEOUT, 0);
}

static void on_item_done(const fetch_item *it, int rc, void *ctx)
{
    struct upstream_model *um = ctx;
    const manifest *man = um->m->man;
    done_rec *r = calloc(1, sizeof *r);
    shoal_err err = { 0 };

    if (um->cancelling) {   /* upstream_stop's own cancel: nobody to tell */
        free(r);
        return;
    }
    if (!r) {
        LOG_ERROR("upstream", "out of memory recording a completion");
        return;
    }
    r->rc = rc;
    r->offset = it->offset;
    r->length = it->length;
    snprintf(r->etag, sizeof r->etag, "%s", man->files[it->file].etag);
    if (rc && fetch_session_status(um->s, &err) != 0)
        snprintf(r->msg, sizeof r->msg, "%s", err.msg);
    else if (rc)
        snprintf(r->msg, sizeof r->msg, "fetching %s: %s", man->files[it->file].path,
                 shoal_strerror(rc));
    done_push(r);
}

/* ---- commits and checkpoints off the loop (the header comment) ----------------- */

static void commit_run(work *wk)
{
    commit_job *j = (commit_job *)wk;
    j->rc = cache_writer_sync(j->w, &j->err);
}

static void commit_done(work *wk)
{
    commit_job *j = (commit_job *)wk;
    for (commit_job **pp = &up.committing; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    if (j->rc == 0)
        j->rc = cache_write_commit(j->w, NULL, &j->err);   /* synced: renames and records */
    else
        cache_write_abort(j->w);
    if (j->rc == SHOAL_ENOSPC)   /* as the session says it for a writer it cannot open */
        shoal_err_wrap(&j->err, j->rc, "disk full or over the cache budget: free space or "
                       "raise the budget");
    if (j->rc) {
        LOG_WARN("upstream", "storing %s [%llu+%llu]: %s", j->r->etag,
                 (unsigned long long)j->r->offset, (unsigned long long)j->r->length, j->err.msg);
        snprintf(j->r->msg, sizeof j->r->msg, "%s", j->err.msg);
    }
    j->r->rc = j->rc;
    done_push(j->r);   /* at shutdown upstream_shutdown frees it */
    free(j);
}

static void loop_commit(void *loop, cache_writer *w, const fetch_item *it)
{
    struct upstream_model *um = loop;
    commit_job *j = calloc(1, sizeof *j);
    done_rec *r = calloc(1, sizeof *r);

    if (!j || !r) {   /* out of memory: the old way, on the loop */
        shoal_err e = { 0 };
        int rc;
        free(j);
        free(r);
        rc = cache_write_commit(w, NULL, &e);
        on_item_done(it, rc, um);
        return;
    }
    r->offset = it->offset;
    r->length = it->length;
    snprintf(r->etag, sizeof r->etag, "%s", um->m->man->files[it->file].etag);
    j->w = w;
    j->r = r;
    j->wk.run = commit_run;
    j->wk.done = commit_done;
    j->next = up.committing;
    up.committing = j;
    work_post_quick(um->d, &j->wk);
}

static void ckpt_run(work *wk)
{
    ckpt_job *j = (ckpt_job *)wk;
    j->rc = cache_sync_fd(wk->d->cache, j->fd, &j->err);
}

static void ckpt_done(work *wk)
{
    ckpt_job *j = (ckpt_job *)wk;
    close(j->fd);
    if (j->rc == 0 && !wk->d->stopping)
        j->rc = cache_checkpoint_record(wk->d->cache, j->writer_id, j->durable, &j->err);
    if (j->rc)   /* only resumability is lost: the transfer goes on */
        LOG_WARN("upstream", "a checkpoint of a long transfer: %s", j->err.msg);
    free(j);
}

static void loop_checkpoint(void *loop, cache_writer *w, uint64_t writer_id, uint64_t durable)
{
    struct upstream_model *um = loop;
    ckpt_job *j = calloc(1, sizeof *j);
    shoal_err e = { 0 };

    if (!j || cache_writer_open_fd(w, O_WRONLY, &j->fd, &e) != 0) {
        LOG_DEBUG("upstream", "a checkpoint skipped: %s", j ? e.msg : "out of memory");
        free(j);
        return;
    }
    j->writer_id = writer_id;
    j->durable = durable;
    j->wk.run = ckpt_run;
    j->wk.done = ckpt_done;
    work_post_quick(um->d, &j->wk);
}

/* 1 when key's last bytes came and its commit is under way: its transfer
 * completes when that does. */
static int committing(const cache_key *key)
{
    for (commit_job *j = up.committing; j; j = j->next)
        if (j->r->offset == key->offset && j->r->length == key->length &&
            strcmp(j->r->etag, key->etag) == 0)
            return 1;
    return 0;
}

static void session_drop(struct upstream_model *um)
{
    if (um->s) {
        fetch_session_free(um->s);
        um->s = NULL;
    }
    if (um->ev_timer)
        event_del(um->ev_timer);
    for (size_t i = 0; i < um->nw; i++) {
        event_free(um->w[i].ev);
    }
    free(um->w);
    um->w = NULL;
    um->nw = 0;
    um->broken = 0;
}

/* A session that failed fatally: fail its transfers still running. */
static void session_check(struct upstream_model *um)
{
    shoal_err err = { 0 };
    if (!um->s || fetch_session_status(um->s, &err) == 0)
        return;
    LOG_WARN("upstream", "%s: transfers stopped: %s", um->m->spec, err.msg);
    um->broken = 1;
    if (err.code == SHOAL_EOFFLINE) {
        /* The upstream cannot be reached: for a while, what is not cached
         * fails now rather than each object trying (and waiting) again. */
        um->unreachable_until_ms = shoal_wall_ms() + UPSTREAM_UNREACHABLE_MS;
        snprintf(um->unreachable, sizeof um->unreachable, "%s", err.msg);
    }
    sched_fail_model(um->d->sched, um->m, err.code ? err.code : SHOAL_EIO, err.msg);
}

static void on_done_event(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    while (up.head) {
        done_rec *r = up.head;
        cache_key key = { r->etag, r->offset, r->length };
        xfer *x;
        up.head = r->next;
        if (!up.head)
            up.tail = NULL;
        x = sched_find(up.d->sched, &key);
        if (x && x->state == XFER_RUNNING && x->up) {
            x->up = NULL;
            sched_xfer_done(up.d->sched, x, r->rc, r->rc ? r->msg : NULL,
                            r->rc ? 0 : r->length);
        }
        free(r);
    }
    /* Sessions that failed are rebuilt at the next start; transfers of
     * theirs still marked running get their failure now. */
    for (int i = 0; i < DAEMON_MODELS_MAX; i++) {
        model *m = up.d->models[i];
        if (m && m->up && m->up->s && !m->up->broken)
            session_check(m->up);
    }
}

/* ---- the interface to sched and model ---------------------------------------------- */

int upstream_init(shoald *d, shoal_err *err)
{
    up.d = d;
    up.ev_done = event_new(d->base, -1, 0, on_done_event, NULL);
    if (!up.ev_done)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    return 0;
}

void upstream_shutdown(shoald *d)
{
    (void)d;
    while (up.head) {
        done_rec *r = up.head;
        up.head = r->next;
        free(r);
    }
    up.tail = NULL;
    if (up.ev_done)
        event_free(up.ev_done);
    up.ev_done = NULL;
}

/* Parking would cost a warm transfer its parts ahead of the prefix and a
 * new request; demand gets extra slots instead, here and in the session
 * (fetch_options.demand_headroom), and the session serves demand parts
 * first. */
int upstream_can_park(void) { return 0; }
int upstream_can_cancel(void) { return 1; }

static void prep_phase(void *ctx, const char *phase, uint64_t done, uint64_t total)
{
    work_progress_set(ctx, phase, done, total);
}

int upstream_model_prepare(const daemon_config *cfg, const char *spec, cache *side,
                           const _Atomic int *stop, work_progress *prog,
                           struct upstream_model **out, manifest **man, int *from_cache,
                           struct fetch_keep **keep, shoal_err *err)
{
    struct upstream_model *um = calloc(1, sizeof *um);
    fetch_options o = { 0 };
    fetch_build_opts bo = { 0 };
    int rc;

    *out = NULL;
    *man = NULL;
    *keep = NULL;
    if (!um)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    o.model = spec;
    o.endpoint = cfg->endpoint;
    o.token = cfg->token;
    o.parallel = cfg->parallel;
    o.split_ways = cfg->parallel;
    o.demand_headroom = cfg->parallel / 2 < 1 ? 1 : cfg->parallel / 2;   /* upstream_headroom */
    o.split_min = cfg->split_min;
    o.low_speed_rate = cfg->low_speed_rate ? cfg->low_speed_rate : FETCH_LOW_SPEED_OFF;
    o.low_speed_secs = (long)cfg->low_speed_secs;
    o.offline = cfg->offline;
    o.hf_cache = cfg->hf_cache[0] ? cfg->hf_cache : NULL;
    o.peer_memo = cfg->peer_memo[0] ? cfg->peer_memo : NULL;
    o.stop = stop;
    o.defer_records = 1;   /* the side handle only reads; the loop records (attach) */
    rc = fetch_upstream_open(&o, side, &um->u, err);
    if (rc == 0) {
        bo.parallel = cfg->parallel;
        bo.progress = prep_phase;
        bo.ctx = prog;
        rc = fetch_manifest_build(um->u, side, &bo, man, from_cache, keep, err);
    }
    if (rc == 0) {
        /* The HF cache's blobs of this model: hashed here (the worker) the
         * first time, then only stat'ed; served in place (peer.c). */
        int n;
        work_progress_set(prog, "hfcache", 0, 0);
        n = fetch_upstream_peer_scan(um->u, *man);
        if (n)
            LOG_INFO("upstream", "%s: %d of %zu files are read in place from the Hugging Face "
                     "cache", spec, n, (*man)->nfiles);
    }
    if (um->u)   /* the side handle is the worker's: forget it */
        fetch_upstream_set_cache(um->u, NULL, NULL);
    if (rc) {
        upstream_model_discard(um);
        return rc;
    }
    LOG_DEBUG("upstream", "%s: manifest %s", spec, *from_cache ? "from the cache" : "built");
    *out = um;
    return 0;
}

int upstream_model_attach(shoald *d, model *m, struct upstream_model *um, shoal_err *err)
{
    shoal_err e = { 0 };
    um->d = d;
    um->m = m;
    m->up = um;
    m->local = fetch_upstream_is_local(um->u);
    /* what the worker resolved, recorded now: one transaction */
    if (fetch_upstream_set_cache(um->u, d->cache, &e) != 0)
        LOG_WARN("upstream", "%s: recording its resolutions: %s", m->spec, e.msg);
    um->ev_timer = event_new(d->base, -1, 0, on_timer, um);
    if (!um->ev_timer)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    return 0;
}

void upstream_model_discard(struct upstream_model *um)
{
    if (!um)
        return;
    fetch_upstream_free(um->u);
    free(um);
}

void upstream_model_free(model *m)
{
    struct upstream_model *um = m->up;
    if (!um)
        return;
    session_drop(um);
    if (um->ev_timer)
        event_free(um->ev_timer);
    fetch_upstream_free(um->u);
    free(um);
    m->up = NULL;
}

int upstream_start(shoald *d, xfer *x, shoal_err *err)
{
    struct upstream_model *um = x->m->up;
    fetch_item it;
    int rc;

    if (committing(&x->key)) {
        x->up = (struct upstream_xfer *)um;
        return 0;
    }
    if (fetch_upstream_offline(um->u) == FETCH_OFFLINE) {
        /* HF_HUB_OFFLINE: what is not cached fails now, named. */
        const manifest_file *f = x->obj.file < x->m->man->nfiles ? &x->m->man->files[x->obj.file]
                                                                 : NULL;
        if (x->obj.layer >= 0)
            return shoal_err_set(err, SHOAL_EOFFLINE, "layer %d expert %d of %s is not in the "
                                 "cache and HF_HUB_OFFLINE is set: unset it (and restart "
                                 "shoald) to fetch it", x->obj.layer, x->obj.expert, x->m->spec);
        return shoal_err_set(err, SHOAL_EOFFLINE, "%s (%s bytes %llu-%llu) of %s is not in the "
                             "cache and HF_HUB_OFFLINE is set: unset it (and restart shoald) to "
                             "fetch it", x->obj.tensor ? x->obj.tensor : "the object",
                             f ? f->path : "?", (unsigned long long)x->key.offset,
                             (unsigned long long)(x->key.offset + x->key.length - 1), x->m->spec);
    }
    if (um->unreachable_until_ms > shoal_wall_ms())
        return shoal_err_set(err, SHOAL_EOFFLINE, "%s is not in the cache and the upstream of "
                             "%s could not be reached %lld s ago (%s); it is tried again after "
                             "%d s", x->obj.layer >= 0 ? "the expert" : "the object", x->m->spec,
                             (long long)((shoal_wall_ms() - um->unreachable_until_ms
                                          + UPSTREAM_UNREACHABLE_MS) / 1000),
                             um->unreachable, UPSTREAM_UNREACHABLE_MS / 1000);
    if (um->s && um->broken)
        session_drop(um);
    if (!um->s) {
        rc = fetch_session_new(um->u, d->cache, x->m->man, &loop_ops, um, &um->s, err);
        if (rc)
            return rc;
        fetch_session_on_done(um->s, on_item_done, um);
    }
    memset(&it, 0, sizeof it);
    it.kind = x->obj.kind;
    it.file = x->obj.file;
    it.offset = x->key.offset;
    it.length = x->key.length;
    it.layer = x->obj.layer;
    it.expert = x->obj.expert;
    it.tensor = x->obj.tensor;
    it.priority = x->prio;   /* PRIO_* and FETCH_PRIO_* agree */
    rc = fetch_session_add(um->s, &it, 1, err);
    if (rc)
        return rc;
    x->up = (struct upstream_xfer *)um;
    return 0;
}

void upstream_stop(shoald *d, xfer *x, int keep_partial)
{
    struct upstream_model *um = (struct upstream_model *)x->up;
    (void)d;
    /* The fetcher always keeps the contiguous prefix (a paused writer); a
     * partial nobody resumes is dropped by the cache's age limit. */
    (void)keep_partial;
    x->up = NULL;
    if (!um || !um->s || um->broken)
        return;
    um->cancelling = 1;
    if (fetch_session_cancel(um->s, x->obj.file, x->key.offset, x->key.length) != 0)
        LOG_DEBUG("upstream", "stop: the item had already finished");
    um->cancelling = 0;
}

void upstream_set_priority(shoald *d, xfer *x)
{
    struct upstream_model *um = (struct upstream_model *)x->up;
    (void)d;
    if (um && um->s && !um->broken)
        fetch_session_set_priority(um->s, x->obj.file, x->key.offset, x->key.length, x->prio);
}

void upstream_park_all(shoald *d)
{
    for (int i = 0; i < DAEMON_MODELS_MAX; i++) {
        model *m = d->models[i];
        if (m && m->up && m->up->s)
            fetch_session_stop(m->up->s);
    }
}

int upstream_headroom(const shoald *d)
{
    int h = d->cfg.parallel / 2;   /* as upstream_model_prepare's demand_headroom */
    return h < 1 ? 1 : h;
}

int upstream_peer_blob(const model *m, uint32_t file, char *out, size_t cap,
                       struct fetch_peer_stat *st)
{
    if (!m->up || !m->up->u || file >= m->man->nfiles)
        return -1;
    return fetch_upstream_peer_blob(m->up->u, m->man->files[file].path, out, cap, st);
}

int upstream_peer_drop(model *m, uint32_t file)
{
    if (!m->up || !m->up->u || file >= m->man->nfiles)
        return -1;
    return fetch_upstream_peer_drop(m->up->u, m->man->files[file].path);
}

int upstream_state(const model *m)
{
    if (m->local)
        return SHOAL_UPSTREAM_LOCAL;
    if (!m->up || !m->up->u)
        return SHOAL_UPSTREAM_ONLINE;
    switch (fetch_upstream_offline(m->up->u)) {
    case FETCH_OFFLINE:     return SHOAL_UPSTREAM_OFFLINE;
    case FETCH_UNREACHABLE: return SHOAL_UPSTREAM_UNREACHABLE;
    default:                return SHOAL_UPSTREAM_ONLINE;
    }
}

const char *upstream_state_name(const model *m)
{
    static const char *const names[] = { "online", "local", "offline", "unreachable" };
    return names[upstream_state(m)];
}

void upstream_stats(const model *m, fetch_stats *out)
{
    memset(out, 0, sizeof *out);
    if (m->up && m->up->u)
        fetch_upstream_stats(m->up->u, out);
}
