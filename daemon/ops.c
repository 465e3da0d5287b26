/* ops.c — what each request does (docs/protocol.md's message table).
 *
 * Owns: the handlers, GET's hit / miss / join decision and its counting,
 * answering a transfer's waiters, and the control operations (PIN, GC,
 * VERIFY, REPORT, RELEASE).  Does not own framing (conn.c), scheduling
 * (sched.c), jobs (warm.c), derived objects (derived.c) or the STATS
 * document (stats.c).
 *
 * Long requests answer later: OPEN of a model not open yet (model.c runs
 * it on a worker), VERIFY (a worker scans; the loop removes what was bad
 * in steps of DAEMON_REMOVE_STEP) and GC (loop steps of DAEMON_GC_STEP
 * bytes), each as a pending request with PROGRESS frames (work.c).
 *
 * A handler returns 0 when the connection goes on (its reply, or an ERROR
 * for a request that failed, is queued), or a negative code for a protocol
 * error: then an ERROR is queued and conn.c closes the connection.
 */
#include "daemon/daemon_int.h"
#include "common/json.h"
#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"
#include "common/version.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define REPORT_MAX_EVENTS 1000000u   /* counts one REPORT may add */

int ops_fail(conn *c, uint64_t id, const shoal_err *err)
{
    return conn_send_error(c, id, err->code ? err->code : SHOAL_EINTERNAL,
                           err->msg[0] ? err->msg : shoal_strerror(err->code));
}

static int conn_holds(const conn *c, uint32_t handle)
{
    for (unsigned i = 0; i < c->nhandles; i++)
        if (c->handles[i] == handle)
            return 1;
    return 0;
}

model *ops_handle_model(conn *c, uint32_t handle, shoal_err *err)
{
    model *m = conn_holds(c, handle) ? model_by_handle(c->d, handle) : NULL;
    if (!m)
        shoal_err_set(err, SHOAL_ENOTFOUND, "handle %u is not open on this connection (OPEN first)",
                      handle);
    return m;
}

/* ---- HELLO, OPEN, RELEASE ------------------------------------------------------ */

static int op_hello(conn *c, const daemon_request *rq)
{
    shoal_msg_builder *m = conn_builder(c);
    shoal_err err = { 0 };
    char msg[160];

    /* The client names the version it speaks; the daemon speaks it on this
     * connection when it still knows it (docs/protocol.md, principle 2). */
    if (rq->version < SHOAL_PROTO_VERSION_MIN || rq->version > SHOAL_PROTO_VERSION) {
        snprintf(msg, sizeof msg, "this shoald speaks protocol %u..%u, the client %u: use "
                 "matching versions", SHOAL_PROTO_VERSION_MIN, SHOAL_PROTO_VERSION, rq->version);
        conn_send_error(c, rq->id, SHOAL_EUNSUPPORTED, msg);
        return SHOAL_EUNSUPPORTED;
    }
    if (session_open(c, rq, &err) != 0) {
        ops_fail(c, rq->id, &err);
        return err.code;
    }
    c->version = rq->version;
    shoal_msg_begin(m, SHOAL_MSG_HELLO_OK, SHOAL_MSG_F_LAST, rq->id);
    shoal_msg_put_u16(m, rq->version);
    shoal_msg_put_str(m, SHOAL_VERSION, strlen(SHOAL_VERSION));
    shoal_msg_put_u64(m, c->session);
    shoal_msg_put_u32(m, SHOAL_PROTO_MAX_BODY);
    if (shoal_msg_end(m) != 0)
        return SHOAL_EINTERNAL;
    return conn_send(c, m->buf.data, m->buf.len, -1) == 0 ? 0 : SHOAL_ENET;
}

/* A sealed memfd holding the manifest's encoding.  -1 on failure. */
static int manifest_fd(const model *md)
{
    return shoal_sealed_file("shoal-manifest", md->encoded.data, md->encoded.len);
}

/* OPEN_OK with a fresh descriptor of md's manifest; md's reference goes to
 * the connection's handles (or is dropped on failure). */
static void open_reply(conn *c, uint64_t id, model *md)
{
    shoal_msg_builder *b = conn_builder(c);
    shoal_err err = { 0 };
    int fd;

    if (c->nhandles == DAEMON_CONN_MAX_HANDLES) {
        model_release(c->d, md);
        shoal_err_set(&err, SHOAL_ETOOBIG, "%d models are open on this connection: release some",
                      DAEMON_CONN_MAX_HANDLES);
        ops_fail(c, id, &err);
        return;
    }
    fd = manifest_fd(md);
    if (fd < 0) {
        model_release(c->d, md);
        shoal_err_set(&err, shoal_err_from_errno(errno), "cannot pass the manifest: %s",
                      strerror(errno));
        ops_fail(c, id, &err);
        return;
    }
    session_handle_add(c, md->handle);
    /* Version 4 has OPEN_OK4: the same, and how the upstream stands. */
    shoal_msg_begin(b, c->version >= 4 ? SHOAL_MSG_OPEN_OK4 : SHOAL_MSG_OPEN_OK,
                    SHOAL_MSG_F_FD | SHOAL_MSG_F_LAST, id);
    shoal_msg_put_u32(b, md->handle);
    shoal_msg_put_str(b, md->man->commit, strlen(md->man->commit));
    shoal_msg_put_u64(b, md->encoded.len);
    shoal_msg_put_u16(b, (uint16_t)md->man->n_layers);
    shoal_msg_put_u32(b, md->man->experts_per_layer);
    shoal_msg_put_u64(b, md->man->expert_bytes);
    if (c->version >= 4)
        shoal_msg_put_u8(b, (uint8_t)upstream_state(md));
    if (shoal_msg_end(b) != 0) {
        close(fd);
        return;
    }
    conn_send(c, b->buf.data, b->buf.len, fd);
}

/* An open that ran on a worker ended (model.c). */
static void open_ready(shoald *d, void *ctx, model *md, const shoal_err *err)
{
    pending *p = ctx;
    if (!p->c) {   /* the client left: the model lingers for the next one */
        model_release(d, md);
    } else if (md) {
        open_reply(p->c, p->id, md);
    } else {
        LOG_WARN("ops", "OPEN: %s", err->msg);
        ops_fail(p->c, p->id, err);
    }
    pending_end(d, p);
}

static int op_open(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    const work_progress *prog = NULL;
    pending *p;
    model *md;
    int rc;

    if (c->nhandles == DAEMON_CONN_MAX_HANDLES) {
        shoal_err_set(&err, SHOAL_ETOOBIG, "%d models are open on this connection: release some",
                      DAEMON_CONN_MAX_HANDLES);
        return ops_fail(c, rq->id, &err), 0;
    }
    if (!(p = pending_new(c, rq->id, NULL))) {
        shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
        return ops_fail(c, rq->id, &err), 0;
    }
    rc = model_open(c->d, rq->text, open_ready, p, &prog, &md, &err);
    if (rc == 1) {   /* on a worker: open_ready answers */
        p->prog = prog;
        return 0;
    }
    pending_end(c->d, p);
    if (rc < 0) {
        LOG_WARN("ops", "OPEN %s: %s", rq->text, err.msg);
        return ops_fail(c, rq->id, &err), 0;
    }
    open_reply(c, rq->id, md);
    return 0;
}

static int op_release(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = ops_handle_model(c, rq->handle, &err);
    if (!m)
        return ops_fail(c, rq->id, &err), 0;
    session_handle_drop(c, rq->handle);
    model_release(c->d, m);
    return conn_send_ok(c, rq->id), 0;
}

/* ---- GET and CANCEL -------------------------------------------------------------- */

/* One key of a GET: a hit answered now, a miss or a join attached to its
 * transfer, an error answered now. */
static void get_key(conn *c, model *m, getreq *g, uint16_t i, const shoal_key *k)
{
    shoald *d = c->d;
    shoal_err err = { 0 };
    cache_obj obj;
    objref o;
    waiter *w = &g->w[i];
    cache_req req;
    char etag[CACHE_ETAG_MAX + 1];
    int rc;

    /* a derived object is made by clients, never fetched: found or not */
    rc = k->kind == SHOAL_KEY_DERIVED
             ? derived_resolve(d, m, k, &o, etag, sizeof etag, &err)
             : model_key_resolve(m, k, &o, &err);
    if (rc == 0 && k->kind == SHOAL_KEY_DERIVED) {
        req = (cache_req){ c->session, m->model_id, -1, -1, CACHE_TIER_DISK };
        rc = cache_lookup(d->cache, &o.key, &req, &obj, &err);
        if (rc == 0) {
            c->counts.hits++;
            session_item_send(c, g, i, 0, SHOAL_SRC_HIT, &obj);
            return;
        }
    }
    if (rc) {
        session_item_send(c, g, i, rc, SHOAL_SRC_MISS, NULL);
        return;
    }
    req = (cache_req){ c->session, m->model_id, o.layer, o.expert, CACHE_TIER_DISK };
    w->c = c;
    w->g = g;
    w->index = i;
    w->prio = g->prio;
    if (!sched_find(d->sched, &o.key)) {
        /* counted here, not by the lookup: an HF cache object is a hit */
        rc = cache_lookup(d->cache, &o.key, NULL, &obj, &err);
        if (rc == 0) {
            cache_stats_add(d->cache, &req, CACHE_HIT, 0, obj.length, 0);
            c->counts.hits++;
            session_item_send(c, g, i, 0, SHOAL_SRC_HIT, &obj);
            return;
        }
        if (rc != SHOAL_ENOTFOUND) {
            cache_stats_add(d->cache, &req, CACHE_MISS, 0, 0, 0);
            session_item_send(c, g, i, rc, SHOAL_SRC_MISS, NULL);
            return;
        }
        if (peer_serve(c, m, g, i, &o))   /* in place, from the HF cache (now or later) */
            return;
    }
    ops_get_fetch(c, m, g, i, &o);
}

void ops_get_fetch(conn *c, model *m, getreq *g, uint16_t i, const objref *o)
{
    shoald *d = c->d;
    shoal_err err = { 0 };
    waiter *w = &g->w[i];
    cache_req req = { c->session, m->model_id, o->layer, o->expert, CACHE_TIER_DISK };
    int rc;

    if (sched_find(d->sched, &o->key)) {
        c->counts.joins++;
        cache_stats_add(d->cache, &req, CACHE_JOIN, 0, 0, 0);
        w->source = SHOAL_SRC_JOIN;
    } else {
        c->counts.misses++;
        cache_stats_add(d->cache, &req, CACHE_MISS, 0, 0, 0);
        w->source = SHOAL_SRC_MISS;
    }
    rc = sched_attach(d->sched, m, o, w, &err);
    if (rc)
        session_item_send(c, g, i, rc, w->source, NULL);
}

static int op_get(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = ops_handle_model(c, rq->handle, &err);
    getreq *g;

    if (!m)
        return ops_fail(c, rq->id, &err), 0;
    if (session_get_find(c, rq->id)) {
        conn_send_error(c, rq->id, SHOAL_EPROTO, "request id already in use by an open GET");
        return SHOAL_EPROTO;
    }
    if (c->ngets >= DAEMON_CONN_MAX_GETS || c->outstanding + rq->nkeys > DAEMON_CONN_MAX_KEYS) {
        shoal_err_set(&err, SHOAL_EBUSY, "too many keys outstanding on this connection (%zu, "
                      "at most %d): wait for replies", c->outstanding, DAEMON_CONN_MAX_KEYS);
        return ops_fail(c, rq->id, &err), 0;
    }
    g = calloc(1, sizeof *g);
    if (g)
        g->w = calloc(rq->nkeys, sizeof *g->w);
    if (!g || !g->w) {
        free(g);
        shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
        return ops_fail(c, rq->id, &err), 0;
    }
    g->id = rq->id;
    g->serial = ++c->d->get_serial;
    g->nkeys = g->remaining = rq->nkeys;
    g->prio = rq->priority;
    g->next = c->gets;
    c->gets = g;
    c->ngets++;
    c->outstanding += rq->nkeys;
    /* The last key answered frees g: read nkeys first and stop there. */
    for (uint16_t i = 0, n = rq->nkeys; i < n; i++)
        get_key(c, m, g, i, &rq->keys[i]);
    return 0;
}

static int op_cancel(conn *c, const daemon_request *rq)
{
    getreq *g = session_get_find(c, rq->u64);
    if (g && g->prio == PRIO_PREFETCH) {
        uint16_t left = g->remaining;
        for (uint16_t i = 0, n = g->nkeys; i < n && left > 0; i++) {
            if (g->w[i].answered)
                continue;
            sched_detach(c->d->sched, &g->w[i]);
            left--;
            session_item_send(c, g, i, SHOAL_ECANCELED, g->w[i].source, NULL);
        }
    }
    return conn_send_ok(c, rq->id), 0;
}

void ops_xfer_finished(shoald *d, xfer *x, int rc, const char *msg)
{
    waiter *w = x->waiters, *next;
    uint64_t now = shoal_now_ns();

    /* Unlink every waiter first: answering one may free its GET, which
     * detaches that GET's other waiters. */
    x->waiters = NULL;
    x->nwaiters = 0;
    for (waiter *v = w; v; v = v->next)
        v->x = NULL;
    for (; w; w = next) {
        next = w->next;
        w->prev = w->next = NULL;
        if (w->job) {
            warm_waiter_done(w->job, w, rc, msg, rc == 0 ? x->key.length : 0);
            continue;
        }
        if (rc == 0) {
            cache_req req = { w->c->session, x->m->model_id, x->obj.layer, x->obj.expert,
                              CACHE_TIER_DISK };
            shoal_err err = { 0 };
            cache_obj obj;
            int lrc = cache_lookup(d->cache, &x->key, NULL, &obj, &err);
            if (lrc == 0) {
                cache_stats_add(d->cache, &req, CACHE_NONE, 0, obj.length, now - w->t0_ns);
                w->c->counts.wait_ns += now - w->t0_ns;
                session_item_send(w->c, w->g, w->index, 0, w->source, &obj);
            } else {
                session_item_send(w->c, w->g, w->index, lrc, w->source, NULL);
            }
        } else {
            session_item_send(w->c, w->g, w->index, rc, w->source, NULL);
        }
    }
}

/* ---- WARM, JOB ------------------------------------------------------------------------ */

static int op_warm(conn *c, const daemon_request *rq)
{
    shoal_msg_builder *b = conn_builder(c);
    shoal_err err = { 0 };
    model *m = ops_handle_model(c, rq->handle, &err);
    uint64_t job;

    if (!m)
        return ops_fail(c, rq->id, &err), 0;
    if (rq->warm_flags & SHOAL_WARM_F_PLAN) {    /* the plan only (shoal warm --dry-run) */
        shoal_buf out;
        shoal_buf_init(&out, DAEMON_JSON_MAX);
        if (warm_plan(c->d->warm, m, rq->selection, rq->warm_flags, rq->a, rq->b, rq->keys,
                      rq->nkeys, &out, &err) != 0)
            ops_fail(c, rq->id, &err);
        else
            conn_send_json(c, rq->id, &out);
        shoal_buf_free(&out);
        return 0;
    }
    if (warm_start(c->d->warm, m, rq->selection, rq->warm_flags, rq->a, rq->b, rq->keys,
                   rq->nkeys, &job, &err))
        return ops_fail(c, rq->id, &err), 0;
    shoal_msg_begin(b, SHOAL_MSG_JOB_OK, SHOAL_MSG_F_LAST, rq->id);
    shoal_msg_put_u64(b, job);
    if (shoal_msg_end(b) != 0)
        return SHOAL_EINTERNAL;
    conn_send(c, b->buf.data, b->buf.len, -1);
    return 0;
}

static int op_job(conn *c, const daemon_request *rq)
{
    shoal_msg_builder *b = conn_builder(c);
    uint8_t state;
    uint64_t bd, bt;
    uint32_t od, ot, errs;
    int code = 0;
    char last[256];

    if (warm_status(c->d->warm, rq->u64, &state, &bd, &bt, &od, &ot, &errs, &code, last,
                    sizeof last) != 0) {
        snprintf(last, sizeof last, "no job %llu", (unsigned long long)rq->u64);
        return conn_send_error(c, rq->id, SHOAL_ENOTFOUND, last), 0;
    }
    /* Version 3 has JOB_STATUS3: the same, and the last error's code. */
    shoal_msg_begin(b, c->version >= 3 ? SHOAL_MSG_JOB_STATUS3 : SHOAL_MSG_JOB_STATUS,
                    SHOAL_MSG_F_LAST, rq->id);
    shoal_msg_put_u8(b, state);
    shoal_msg_put_u64(b, bd);
    shoal_msg_put_u64(b, bt);
    shoal_msg_put_u32(b, od);
    shoal_msg_put_u32(b, ot);
    shoal_msg_put_u32(b, errs);
    shoal_msg_put_str(b, last, strlen(last));
    if (c->version >= 3)
        shoal_msg_put_i32(b, code);
    if (shoal_msg_end(b) != 0)
        return SHOAL_EINTERNAL;
    conn_send(c, b->buf.data, b->buf.len, -1);
    return 0;
}

/* ---- STATS, REPORT ------------------------------------------------------------------- */

static int op_stats(conn *c, const daemon_request *rq)
{
    shoal_buf out;
    shoal_err err = { 0 };
    shoal_buf_init(&out, DAEMON_JSON_MAX);     /* sent in frames: conn_send_json */
    if (stats_json(c->d, rq->text, strlen(rq->text), &out, &err) != 0)
        ops_fail(c, rq->id, &err);
    else
        conn_send_json(c, rq->id, &out);
    shoal_buf_free(&out);
    return 0;
}

static int report_u64(const shoal_json *j, const char *key, uint64_t *out, shoal_err *err)
{
    int64_t v = 0;
    *out = 0;
    if (!shoal_json_get(j, key))
        return 0;
    if (shoal_json_int(j, key, &v, err) != 0 || v < 0)
        return shoal_err_set(err, SHOAL_EINVAL, "REPORT: \"%s\" must be a count >= 0", key);
    *out = (uint64_t)v;
    return 0;
}

/* {"tier":"ram","hits":N,"misses":N,"bytes":N,"handle":H,"layer":L,
 *  "damaged":[{"layer":L,"expert":E}]}: all but tier optional (damaged
 * needs handle).  bytes: what the client's tier served; damaged: objects
 * whose bytes did not match their checksum as the client read them. */
static int op_report(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    shoal_json *j = shoal_json_parse(rq->json, rq->json_len, &err);
    const char *tier = NULL;
    uint64_t hits, misses, bytes, handle = 0, layer = 0;
    cache_req req = { c->session, 0, -1, -1, CACHE_TIER_RAM };

    if (!j)
        goto bad;
    if (shoal_json_str(j, "tier", &tier, &err) != 0 || strcmp(tier, "ram") != 0) {
        shoal_err_set(&err, SHOAL_EINVAL, "REPORT: \"tier\" must be \"ram\" (the only tier a "
                      "client keeps)");
        goto bad;
    }
    if (report_u64(j, "hits", &hits, &err) || report_u64(j, "misses", &misses, &err) ||
        report_u64(j, "bytes", &bytes, &err) || report_u64(j, "handle", &handle, &err) ||
        report_u64(j, "layer", &layer, &err))
        goto bad;
    if (hits + misses > REPORT_MAX_EVENTS || hits > REPORT_MAX_EVENTS) {
        shoal_err_set(&err, SHOAL_ETOOBIG, "REPORT: at most %u events per report",
                      REPORT_MAX_EVENTS);
        goto bad;
    }
    if (handle) {
        model *m = ops_handle_model(c, (uint32_t)handle, &err);
        if (!m)
            goto bad;
        req.model = m->model_id;
    }
    if (shoal_json_get(j, "damaged")) {   /* docs/protocol.md: REPORT */
        model *m = handle ? ops_handle_model(c, (uint32_t)handle, &err) : NULL;
        if (!m) {
            if (!handle)
                shoal_err_set(&err, SHOAL_EINVAL, "REPORT: \"damaged\" needs \"handle\"");
            goto bad;
        }
        if (integrity_damaged(c->d, m, shoal_json_get(j, "damaged"), &err) != 0)
            goto bad;
    }
    if (shoal_json_get(j, "layer"))
        req.layer = (int32_t)(layer > INT32_MAX ? INT32_MAX : layer);
    for (uint64_t i = 0; i < hits; i++)
        cache_stats_add(c->d->cache, &req, CACHE_HIT, 0, i == 0 ? bytes : 0, 0);
    for (uint64_t i = 0; i < misses; i++)
        cache_stats_add(c->d->cache, &req, CACHE_MISS, 0, 0, 0);
    if (hits == 0 && bytes)
        cache_stats_add(c->d->cache, &req, CACHE_NONE, 0, bytes, 0);
    shoal_json_free(j);
    return conn_send_ok(c, rq->id), 0;
bad:
    shoal_json_free(j);
    return ops_fail(c, rq->id, &err), 0;
}

/* ---- PIN, GC, VERIFY ----------------------------------------------------------------- */

static int op_pin(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = ops_handle_model(c, rq->handle, &err);
    if (!m)
        return ops_fail(c, rq->id, &err), 0;
    for (unsigned i = 0; i < rq->nkeys; i++) {
        objref o;
        char etag[CACHE_ETAG_MAX + 1];
        const shoal_key *k = &rq->keys[i];
        if ((k->kind == SHOAL_KEY_DERIVED
                 ? derived_resolve(c->d, m, k, &o, etag, sizeof etag, &err)
                 : model_key_resolve(m, k, &o, &err)) != 0 ||
            cache_pin(c->d->cache, &o.key, rq->priority, &err) != 0) {
            shoal_err_wrap(&err, err.code, "key %u", i);
            return ops_fail(c, rq->id, &err), 0;
        }
    }
    return conn_send_ok(c, rq->id), 0;
}

/* GC and VERIFY answer the cache's reports ("shoal.gc", "shoal.verify":
 * docs/stats-json.md), the same documents the CLI builds itself when no
 * daemon runs.  Neither holds the loop: GC evicts in steps of at most
 * DAEMON_GC_STEP bytes (one sort and one transaction each; the blobs are
 * unlinked on a worker), VERIFY reads every blob on a worker (side handle)
 * and the loop removes what was bad, DAEMON_REMOVE_STEP objects a step. */

/* A long request's job: `size` bytes whose first members are a work and
 * a pending (the request waiting, with the job's progress).  NULL, with
 * the ERROR sent, when out of memory. */
typedef struct long_call {
    work     w;
    pending *p;
} long_call;

static void *long_call_new(conn *c, uint64_t id, size_t size)
{
    shoal_err err = { 0 };
    long_call *x = calloc(1, size);
    if (x && !(x->p = pending_new(c, id, &x->w.prog))) {
        free(x);
        x = NULL;
    }
    if (!x) {
        shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
        ops_fail(c, id, &err);
    }
    return x;
}

typedef struct gc_job {
    long_call lc;                  /* first: steps only, no run() */
    uint64_t max;
    cache_gc_state st;
} gc_job;

static void gc_reply(shoald *d, gc_job *g, int rc, const shoal_err *err)
{
    shoal_buf out;
    shoal_err e = { 0 };
    if (g->lc.p->c) {
        shoal_buf_init(&out, SHOAL_PROTO_MAX_BODY - 4);
        if (rc == 0 && (rc = cache_gc_json(d->cache, &g->st, &out, &e)) != 0)
            err = &e;
        if (rc)
            ops_fail(g->lc.p->c, g->lc.p->id, err);
        else
            conn_send_json(g->lc.p->c, g->lc.p->id, &out);
        shoal_buf_free(&out);
    }
    pending_end(d, g->lc.p);
    free(g);
}

static void gc_step(work *w)
{
    gc_job *g = (gc_job *)w;
    shoald *d = w->d;
    shoal_err err = { 0 };
    int done = 0, rc;

    if (d->stopping) {
        shoal_err_set(&err, SHOAL_ECANCELED, "shoald is stopping");
        gc_reply(d, g, SHOAL_ECANCELED, &err);
        return;
    }
    rc = cache_gc_step(d->cache, &g->st, g->max, DAEMON_GC_STEP, &done, &err);
    work_progress_set(&w->prog, "gc", g->st.freed, g->st.goal);
    if (rc || done)
        gc_reply(d, g, rc, &err);
    else
        work_step(d, w);
}

static int op_gc(conn *c, const daemon_request *rq)
{
    gc_job *g = long_call_new(c, rq->id, sizeof *g);
    if (!g)
        return 0;
    g->max = rq->u64;
    g->lc.w.done = gc_step;
    work_step(c->d, &g->lc.w);
    return 0;
}

typedef struct verify_job {
    long_call lc;                  /* first */
    char     spec[SHOAL_PROTO_MAX_STR + 1];
    int      deep;
    /* the worker's results */
    int      rc;
    shoal_err err;
    cache_verify_report tot;
    cache_verify_list bad;
    cache_deep_report dr;
    shoal_buf bad_files;
    size_t   removed;              /* of bad: handled by the loop's steps */
} verify_job;

static int verify_progress(void *ctx, uint64_t done, uint64_t total)
{
    verify_job *v = ctx;
    work_progress_set(&v->lc.w.prog, v->deep > 1 ? "deep" : "verify", done, total);
    return atomic_load(&v->lc.w.stop) ? 1 : 0;
}

/* Where the next issue quarantines and fetches again; today: the log. */
static void verify_bad_file(void *ctx, const char *path, const char *etag)
{
    (void)ctx;
    LOG_ERROR("ops", "deep verify: %s (etag %s) does not hash to its etag", path, etag);
}

/* Worker: the whole scan (and the deep check) on a side handle. */
static void verify_run(work *w)
{
    verify_job *v = (verify_job *)w;
    cache *side = NULL;
    cache_deep_opts o = { verify_progress, verify_bad_file, v };
    const char *spec = v->spec[0] ? v->spec : NULL;

    v->rc = work_side_open(w->d, &side, &v->err);
    if (v->rc == 0)
        v->rc = cache_verify_scan(side, spec, &v->tot, &v->bad, verify_progress, v, &v->err);
    if (v->rc == 0 && v->deep) {
        v->deep = 2;   /* the phase the progress names */
        v->rc = cache_verify_deep(side, spec, &o, &v->dr, &v->bad_files, &v->err);
    }
    cache_close(side);
}

static void verify_free(shoald *d, verify_job *v)
{
    pending_end(d, v->lc.p);
    cache_verify_list_free(&v->bad);
    shoal_buf_free(&v->bad_files);
    free(v);
}

/* Loop: remove what was bad, a step at a time; then the answer. */
static void verify_done(work *w)
{
    verify_job *v = (verify_job *)w;
    shoald *d = w->d;
    shoal_buf out;
    uint64_t gb = 0, gm = 0;

    if (v->rc == 0 && d->stopping)
        v->rc = shoal_err_set(&v->err, SHOAL_ECANCELED, "shoald is stopping");
    if (v->rc == 0 && v->removed < v->bad.n) {
        size_t n = v->bad.n - v->removed;
        if (n > DAEMON_REMOVE_STEP)
            n = DAEMON_REMOVE_STEP;
        v->rc = cache_verify_remove(d->cache, &v->bad, v->removed, n, &gb, &gm, &v->err);
        v->tot.bad -= gb;
        v->tot.missing -= gm;
        v->removed += n;
        if (v->rc == 0 && v->removed < v->bad.n) {
            work_step(d, w);
            return;
        }
    }
    if (v->lc.p->c) {
        shoal_buf_init(&out, SHOAL_PROTO_MAX_BODY - 4);
        if (v->rc == 0)
            v->rc = cache_verify_json(d->cache, v->spec, &v->tot, v->deep ? &v->dr : NULL,
                                      &v->bad_files, &out, &v->err);
        if (v->rc)
            ops_fail(v->lc.p->c, v->lc.p->id, &v->err);
        else
            conn_send_json(v->lc.p->c, v->lc.p->id, &out);
        shoal_buf_free(&out);
    }
    verify_free(d, v);
}

static int op_verify(conn *c, const daemon_request *rq)
{
    verify_job *v = long_call_new(c, rq->id, sizeof *v);
    if (!v)
        return 0;
    snprintf(v->spec, sizeof v->spec, "%s", rq->text);
    v->deep = rq->priority != 0;
    shoal_buf_init(&v->bad_files, 0);
    v->lc.w.run = verify_run;
    v->lc.w.done = verify_done;
    work_post(c->d, &v->lc.w);
    return 0;
}

/* ---- RM ------------------------------------------------------------------------------ */

/* RM (protocol 3): the models matching the spec must be idle (no client,
 * job or transfer holds them: EBUSY naming how many do); the idle ones are
 * dropped from memory, then the cache removes their objects, rows and
 * counters on the loop (one transaction; the blobs unlinked after it) and
 * answers "shoal.rm", as `shoal rm` does without a daemon. */
static int op_rm(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    shoal_buf out;
    int rc;

    if (model_drop_idle(c->d, rq->text, &err) != 0)
        return ops_fail(c, rq->id, &err), 0;
    shoal_buf_init(&out, SHOAL_PROTO_MAX_BODY - 4);
    rc = cache_report_rm(c->d->cache, rq->text, &out, &err);
    if (rc)
        ops_fail(c, rq->id, &err);
    else
        conn_send_json(c, rq->id, &out);
    shoal_buf_free(&out);
    if (rc == 0)
        LOG_INFO("ops", "rm %s", rq->text);
    return 0;
}

/* ---- PUT ---------------------------------------------------------------------------- */

static int op_put(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = ops_handle_model(c, rq->handle, &err);
    if (!m) {
        close(rq->fd);
        return ops_fail(c, rq->id, &err), 0;
    }
    return derived_put(c, m, rq);
}

static int op_put_begin(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = ops_handle_model(c, rq->handle, &err);
    if (!m)
        return ops_fail(c, rq->id, &err), 0;
    return derived_put_begin(c, m, rq);
}

int ops_dispatch(conn *c, const daemon_request *rq)
{
    LOG_TRACE("ops", "session %llu: %s id %llu", (unsigned long long)c->session,
              shoal_msg_type_name(rq->type), (unsigned long long)rq->id);
    switch (rq->type) {
    case SHOAL_MSG_HELLO:   return op_hello(c, rq);
    case SHOAL_MSG_OPEN:    return op_open(c, rq);
    case SHOAL_MSG_GET:     return op_get(c, rq);
    case SHOAL_MSG_CANCEL:  return op_cancel(c, rq);
    case SHOAL_MSG_WARM:    return op_warm(c, rq);
    case SHOAL_MSG_JOB:     return op_job(c, rq);
    case SHOAL_MSG_STATS:   return op_stats(c, rq);
    case SHOAL_MSG_REPORT:  return op_report(c, rq);
    case SHOAL_MSG_PIN:     return op_pin(c, rq);
    case SHOAL_MSG_GC:      return op_gc(c, rq);
    case SHOAL_MSG_VERIFY:  return op_verify(c, rq);
    case SHOAL_MSG_RELEASE: return op_release(c, rq);
    case SHOAL_MSG_PUT:     return op_put(c, rq);
    case SHOAL_MSG_PUT_BEGIN:  return op_put_begin(c, rq);
    case SHOAL_MSG_PUT_COMMIT: return derived_put_commit(c, rq);
    case SHOAL_MSG_RM:      return op_rm(c, rq);
    default:
        conn_send_error(c, rq->id, SHOAL_EPROTO, "not a request");
        return SHOAL_EPROTO;
    }
}
