/* ops.c — what each request does (docs/protocol.md's message table).
 *
 * Owns: the handlers, GET's hit / miss / join decision and its counting,
 * answering a transfer's waiters, and the control operations (PIN, GC,
 * VERIFY, REPORT, RELEASE).  Does not own framing (conn.c), scheduling
 * (sched.c), jobs (warm.c) or the STATS document (stats.c).
 *
 * A handler returns 0 when the connection goes on (its reply, or an ERROR
 * for a request that failed, is queued), or a negative code for a protocol
 * error: then an ERROR is queued and conn.c closes the connection.
 */
#include "daemon/daemon_int.h"
#include "common/json.h"
#include "common/log.h"
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

static int fail(conn *c, uint64_t id, const shoal_err *err)
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

static model *handle_model(conn *c, uint32_t handle, shoal_err *err)
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

    if (rq->version != SHOAL_PROTO_VERSION) {
        snprintf(msg, sizeof msg, "this shoald speaks protocol %u, the client %u: use matching "
                 "versions", SHOAL_PROTO_VERSION, rq->version);
        conn_send_error(c, rq->id, SHOAL_EUNSUPPORTED, msg);
        return SHOAL_EUNSUPPORTED;
    }
    if (session_open(c, rq, &err) != 0) {
        fail(c, rq->id, &err);
        return err.code;
    }
    shoal_msg_begin(m, SHOAL_MSG_HELLO_OK, SHOAL_MSG_F_LAST, rq->id);
    shoal_msg_put_u16(m, SHOAL_PROTO_VERSION);
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
    int fd = memfd_create("shoal-manifest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (shoal_write_all(fd, md->encoded.data, md->encoded.len) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    lseek(fd, 0, SEEK_SET);
    return fd;
}

static int op_open(conn *c, const daemon_request *rq)
{
    shoal_msg_builder *b = conn_builder(c);
    shoal_err err = { 0 };
    model *md;
    int fd;

    if (c->nhandles == DAEMON_CONN_MAX_HANDLES) {
        shoal_err_set(&err, SHOAL_ETOOBIG, "%d models are open on this connection: release some",
                      DAEMON_CONN_MAX_HANDLES);
        return fail(c, rq->id, &err), 0;
    }
    if (model_acquire(c->d, rq->text, &md, &err) != 0) {
        LOG_WARN("ops", "OPEN %s: %s", rq->text, err.msg);
        return fail(c, rq->id, &err), 0;
    }
    fd = manifest_fd(md);
    if (fd < 0) {
        model_release(c->d, md);
        shoal_err_set(&err, shoal_err_from_errno(errno), "cannot pass the manifest: %s",
                      strerror(errno));
        return fail(c, rq->id, &err), 0;
    }
    session_handle_add(c, md->handle);
    shoal_msg_begin(b, SHOAL_MSG_OPEN_OK, SHOAL_MSG_F_FD | SHOAL_MSG_F_LAST, rq->id);
    shoal_msg_put_u32(b, md->handle);
    shoal_msg_put_str(b, md->man->commit, strlen(md->man->commit));
    shoal_msg_put_u64(b, md->encoded.len);
    shoal_msg_put_u16(b, (uint16_t)md->man->n_layers);
    shoal_msg_put_u32(b, md->man->experts_per_layer);
    shoal_msg_put_u64(b, md->man->expert_bytes);
    if (shoal_msg_end(b) != 0) {
        close(fd);
        return SHOAL_EINTERNAL;
    }
    conn_send(c, b->buf.data, b->buf.len, fd);
    return 0;
}

static int op_release(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = handle_model(c, rq->handle, &err);
    if (!m)
        return fail(c, rq->id, &err), 0;
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
    if (sched_find(d->sched, &o.key)) {
        c->counts.joins++;
        cache_stats_add(d->cache, &req, CACHE_JOIN, 0, 0, 0);
        w->source = SHOAL_SRC_JOIN;
    } else {
        rc = cache_lookup(d->cache, &o.key, &req, &obj, &err);
        if (rc == 0) {
            c->counts.hits++;
            session_item_send(c, g, i, 0, SHOAL_SRC_HIT, &obj);
            return;
        }
        if (rc != SHOAL_ENOTFOUND) {
            session_item_send(c, g, i, rc, SHOAL_SRC_MISS, NULL);
            return;
        }
        c->counts.misses++;
        w->source = SHOAL_SRC_MISS;
    }
    rc = sched_attach(d->sched, m, &o, w, &err);
    if (rc)
        session_item_send(c, g, i, rc, w->source, NULL);
}

static int op_get(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = handle_model(c, rq->handle, &err);
    getreq *g;

    if (!m)
        return fail(c, rq->id, &err), 0;
    if (session_get_find(c, rq->id)) {
        conn_send_error(c, rq->id, SHOAL_EPROTO, "request id already in use by an open GET");
        return SHOAL_EPROTO;
    }
    if (c->ngets >= DAEMON_CONN_MAX_GETS || c->outstanding + rq->nkeys > DAEMON_CONN_MAX_KEYS) {
        shoal_err_set(&err, SHOAL_EBUSY, "too many keys outstanding on this connection (%zu, "
                      "at most %d): wait for replies", c->outstanding, DAEMON_CONN_MAX_KEYS);
        return fail(c, rq->id, &err), 0;
    }
    g = calloc(1, sizeof *g);
    if (g)
        g->w = calloc(rq->nkeys, sizeof *g->w);
    if (!g || !g->w) {
        free(g);
        shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
        return fail(c, rq->id, &err), 0;
    }
    g->id = rq->id;
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
    model *m = handle_model(c, rq->handle, &err);
    uint64_t job;

    if (!m)
        return fail(c, rq->id, &err), 0;
    if (rq->warm_flags & SHOAL_WARM_F_PLAN) {    /* the plan only (shoal warm --dry-run) */
        shoal_buf out;
        shoal_buf_init(&out, DAEMON_JSON_MAX);
        if (warm_plan(c->d->warm, m, rq->selection, rq->warm_flags, rq->a, rq->b, rq->keys,
                      rq->nkeys, &out, &err) != 0)
            fail(c, rq->id, &err);
        else
            conn_send_json(c, rq->id, &out);
        shoal_buf_free(&out);
        return 0;
    }
    if (warm_start(c->d->warm, m, rq->selection, rq->warm_flags, rq->a, rq->b, rq->keys,
                   rq->nkeys, &job, &err))
        return fail(c, rq->id, &err), 0;
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
    char last[256];

    if (warm_status(c->d->warm, rq->u64, &state, &bd, &bt, &od, &ot, &errs, last,
                    sizeof last) != 0) {
        snprintf(last, sizeof last, "no job %llu", (unsigned long long)rq->u64);
        return conn_send_error(c, rq->id, SHOAL_ENOTFOUND, last), 0;
    }
    shoal_msg_begin(b, SHOAL_MSG_JOB_STATUS, SHOAL_MSG_F_LAST, rq->id);
    shoal_msg_put_u8(b, state);
    shoal_msg_put_u64(b, bd);
    shoal_msg_put_u64(b, bt);
    shoal_msg_put_u32(b, od);
    shoal_msg_put_u32(b, ot);
    shoal_msg_put_u32(b, errs);
    shoal_msg_put_str(b, last, strlen(last));
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
        fail(c, rq->id, &err);
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

/* {"tier":"ram","hits":N,"misses":N,"bytes":N,"handle":H,"layer":L}:
 * handle and layer optional.  bytes: what the client's tier served. */
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
        model *m = handle_model(c, (uint32_t)handle, &err);
        if (!m)
            goto bad;
        req.model = m->model_id;
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
    return fail(c, rq->id, &err), 0;
}

/* ---- PIN, GC, VERIFY ----------------------------------------------------------------- */

static int op_pin(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = handle_model(c, rq->handle, &err);
    if (!m)
        return fail(c, rq->id, &err), 0;
    for (unsigned i = 0; i < rq->nkeys; i++) {
        objref o;
        char etag[CACHE_ETAG_MAX + 1];
        const shoal_key *k = &rq->keys[i];
        if ((k->kind == SHOAL_KEY_DERIVED
                 ? derived_resolve(c->d, m, k, &o, etag, sizeof etag, &err)
                 : model_key_resolve(m, k, &o, &err)) != 0 ||
            cache_pin(c->d->cache, &o.key, rq->priority, &err) != 0) {
            shoal_err_wrap(&err, err.code, "key %u", i);
            return fail(c, rq->id, &err), 0;
        }
    }
    return conn_send_ok(c, rq->id), 0;
}

/* GC and VERIFY answer the cache's reports ("shoal.gc", "shoal.verify":
 * docs/stats-json.md), the same documents the CLI builds itself when no
 * daemon runs.  Both run on the loop: VERIFY reads every blob it checks. */
static int op_gc(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    shoal_buf out;
    shoal_buf_init(&out, SHOAL_PROTO_MAX_BODY - 4);
    if (cache_report_gc(c->d->cache, rq->u64, &out, &err) != 0)
        fail(c, rq->id, &err);
    else
        conn_send_json(c, rq->id, &out);
    shoal_buf_free(&out);
    return 0;
}

static int op_verify(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    shoal_buf out;
    shoal_buf_init(&out, SHOAL_PROTO_MAX_BODY - 4);
    if (cache_report_verify(c->d->cache, rq->text[0] ? rq->text : NULL, rq->priority, &out,
                            &err) != 0)
        fail(c, rq->id, &err);
    else
        conn_send_json(c, rq->id, &out);
    shoal_buf_free(&out);
    return 0;
}

/* ---- PUT ---------------------------------------------------------------------------- */

static int op_put(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    model *m = handle_model(c, rq->handle, &err);
    int rc = m ? derived_put(c->d, m, rq, &err) : err.code;

    close(rq->fd);
    if (rc != 0) {
        LOG_WARN("ops", "PUT %s: %s", rq->text, err.msg);
        return fail(c, rq->id, &err), 0;
    }
    return conn_send_ok(c, rq->id), 0;
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
    default:
        conn_send_error(c, rq->id, SHOAL_EPROTO, "not a request");
        return SHOAL_EPROTO;
    }
}
