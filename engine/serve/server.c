/* server.c — the HTTP side of the OpenAI-compatible server: evhttp on the
 * caller's thread, routing, API keys, admission to the bounded FIFO,
 * delivery of the worker's output, disconnect detection, statistics and
 * shutdown (serve.h part 3; serve_int.h has the threading rules).
 *
 * Owns: every libevent object.  Does not own generation (server_worker.c)
 * nor JSON shapes (openai_*.c).
 *
 * Disconnects.  evhttp stops reading a connection while its request is
 * being answered, so a client that goes away is noticed only when a write
 * fails.  To notice it while a request waits in the queue, or while a
 * long prefill sends nothing, a 100 ms timer peeks at each live request's
 * socket (recv MSG_PEEK: 0 means EOF) and frees the connection, which
 * cancels the job through the close callback.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <event2/util.h>

#include "common/json.h"
#include "common/log.h"
#include "common/sys.h"
#include "engine/serve/serve_int.h"

#define TAG "server"
#define ERR_NOT_FOUND_TYPE "invalid_request_error"

void server_config_default(server_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->queue = 16;
    c->max_body = (size_t)4 << 20;
    c->model_name = "model";
}

/* ---- worker -> loop ------------------------------------------------------------ */

int server_post(server *srv, job *j, out_kind kind, int status, shoal_buf *body)
{
    int final = kind == OUT_STREAM_END || kind == OUT_REPLY;
    out_msg *m = final ? &j->fin : calloc(1, sizeof *m);

    if (!m) {
        shoal_buf_free(body);
        atomic_store(&j->cancel, 1);
        return SHOAL_ENOMEM;
    }
    m->j = j;
    m->kind = kind;
    m->status = status;
    m->next = NULL;
    shoal_buf_init(&m->body, 0);
    if (body) {
        m->body = *body;
        shoal_buf_init(body, 0);
    }
    pthread_mutex_lock(&srv->mu);
    if (final && srv->running == j)
        srv->running = NULL;    /* the loop may free j as soon as it sees m */
    if (srv->out_tail)
        srv->out_tail->next = m;
    else
        srv->out_head = m;
    srv->out_tail = m;
    pthread_mutex_unlock(&srv->mu);
    event_active(srv->wake, EV_READ, 0);
    return 0;
}

void server_post_error(server *srv, job *j, const openai_error *e)
{
    shoal_buf b;
    shoal_buf_init(&b, 0);
    if (openai_error_json(e, &b) != 0)
        shoal_buf_free(&b);
    server_post(srv, j, OUT_REPLY, e->status, &b);
}

/* ---- replies (loop thread) --------------------------------------------------------- */

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Error";
    }
}

static void send_json(struct evhttp_request *req, int status, const void *body, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    if (b)
        evbuffer_add(b, body, len);
    evhttp_send_reply(req, status, reason(status), b);
    evbuffer_free(b);
}

static void send_error(struct evhttp_request *req, int status, const char *type, const char *param,
                       const char *code, const char *msg)
{
    openai_error e;
    shoal_buf b;
    openai_error_set(&e, status, type, param, code, "%s", msg);
    shoal_buf_init(&b, 0);
    if (openai_error_json(&e, &b) == 0)
        send_json(req, status, b.data, b.len);
    else
        evhttp_send_error(req, 500, NULL);
    shoal_buf_free(&b);
}

/* ---- live jobs (loop thread) -------------------------------------------------------- */

static void live_add(server *srv, job *j)
{
    j->lnext = srv->live;
    j->lprev = NULL;
    if (srv->live)
        srv->live->lprev = j;
    srv->live = j;
}

static void live_remove(server *srv, job *j)
{
    if (j->lprev)
        j->lprev->lnext = j->lnext;
    else
        srv->live = j->lnext;
    if (j->lnext)
        j->lnext->lprev = j->lprev;
}

static void job_free(job *j)
{
    openai_request_free(&j->r);
    shoal_buf_free(&j->fin.body);
    free(j);
}

/* The connection of j went away.  If libevent detached the request from
 * it (a failed write while we held the request), the request is ours to
 * free with the final reply; otherwise libevent frees it with the
 * connection. */
static void on_conn_close(struct evhttp_connection *evcon, void *arg)
{
    job *j = arg;
    server *srv = j->srv;
    int queued = 0;

    (void)evcon;
    atomic_store(&j->cancel, 1);
    if (j->req && evhttp_request_get_connection(j->req) == NULL)
        j->orphan = 1;
    else
        j->req = NULL;
    j->evcon = NULL;
    /* Still waiting: take it out of the queue now, so it neither holds a
     * place nor reaches the worker (which then never sees it). */
    pthread_mutex_lock(&srv->mu);
    for (job **pp = &srv->q_head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->qnext) {
        if (*pp != j)
            continue;
        *pp = j->qnext;
        if (srv->q_tail == j)
            srv->q_tail = prev;
        srv->q_len--;
        srv->n.cancelled++;
        queued = 1;
        break;
    }
    pthread_mutex_unlock(&srv->mu);
    LOG_INFO(TAG, "%s: client went away (%s); %s", j->id, j->orphan ? "write failed" : "closed",
             queued ? "dropped from the queue" : "generation cancelled");
    if (queued) {
        live_remove(srv, j);
        if (j->req)     /* detached: this only frees it */
            evhttp_send_reply(j->req, 500, "Gone", NULL);
        job_free(j);
    }
}

static void deliver(server *srv, out_msg *m)
{
    job *j = m->j;
    struct evhttp_request *req = j->req;
    int final = m->kind == OUT_STREAM_END || m->kind == OUT_REPLY;

    if (final) {
        if (j->evcon)
            evhttp_connection_set_closecb(j->evcon, NULL, NULL);
        live_remove(srv, j);
    }
    if (req && !j->orphan) {
        switch (m->kind) {
        case OUT_STREAM_START: {
            struct evkeyvalq *h = evhttp_request_get_output_headers(req);
            evhttp_add_header(h, "Content-Type", "text/event-stream");
            evhttp_add_header(h, "Cache-Control", "no-cache");
            evhttp_send_reply_start(req, 200, "OK");
            j->streaming = 1;
            break;
        }
        case OUT_DATA: {
            struct evbuffer *b = evbuffer_new();
            if (b && evbuffer_add(b, m->body.data, m->body.len) == 0)
                evhttp_send_reply_chunk(req, b);
            evbuffer_free(b);
            break;
        }
        case OUT_STREAM_END:
            evhttp_send_reply_end(req);
            break;
        case OUT_REPLY:
            if (j->streaming)   /* an error after the stream began: end it */
                evhttp_send_reply_end(req);
            else if (m->body.len)
                send_json(req, m->status, m->body.data, m->body.len);
            else
                send_error(req, m->status ? m->status : 500, "server_error", NULL, NULL,
                           "internal error");
            break;
        }
    } else if (req && j->orphan && final) {
        /* Detached from its dead connection: these calls only free it. */
        if (j->streaming)
            evhttp_send_reply_end(req);
        else
            evhttp_send_reply(req, 500, "Gone", NULL);
    }
    if (final)
        job_free(j);
    else {
        shoal_buf_free(&m->body);
        free(m);
    }
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    server *srv = arg;
    out_msg *m;
    (void)fd;
    (void)what;
    pthread_mutex_lock(&srv->mu);
    m = srv->out_head;
    srv->out_head = srv->out_tail = NULL;
    pthread_mutex_unlock(&srv->mu);
    while (m) {
        out_msg *next = m->next;
        deliver(srv, m);
        m = next;
    }
}

static void on_poll(evutil_socket_t fd, short what, void *arg)
{
    server *srv = arg;
    job *j = srv->live, *next;
    (void)fd;
    (void)what;
    for (; j; j = next) {
        struct bufferevent *bev;
        evutil_socket_t s;
        char c;
        ssize_t r;
        next = j->lnext;
        if (!j->evcon || j->orphan || !(bev = evhttp_connection_get_bufferevent(j->evcon)))
            continue;
        if ((s = bufferevent_getfd(bev)) < 0)
            continue;
        r = recv(s, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            evhttp_connection_free(j->evcon);   /* runs on_conn_close */
    }
}

/* ---- statistics -------------------------------------------------------------------- */

static void send_stats(server *srv, struct evhttp_request *req)
{
    shoal_json *root = shoal_json_object(), *q = shoal_json_object(), *rq = shoal_json_object();
    shoal_json *ru = shoal_json_object();
    server_counters n;
    size_t waiting;
    int running, bad;
    shoal_buf b;

    pthread_mutex_lock(&srv->mu);
    n = srv->n;
    waiting = srv->q_len;
    running = srv->running != NULL;
    pthread_mutex_unlock(&srv->mu);
    bad = !root || !q || !rq || !ru || shoal_json_set_str(root, "status", "ok") ||
          shoal_json_set_str(root, "model", srv->cfg.model_name) ||
          shoal_json_set_int(q, "waiting", (int64_t)waiting) ||
          shoal_json_set_int(q, "running", running) ||
          shoal_json_set_int(q, "limit", (int64_t)srv->cfg.queue) ||
          shoal_json_set_int(rq, "admitted", (int64_t)n.requests) ||
          shoal_json_set_int(rq, "completed", (int64_t)n.completed) ||
          shoal_json_set_int(rq, "cancelled", (int64_t)n.cancelled) ||
          shoal_json_set_int(rq, "failed", (int64_t)n.failed) ||
          shoal_json_set_int(rq, "rejected_busy", (int64_t)n.rejected_busy) ||
          shoal_json_set_int(ru, "last_reused_tokens", (int64_t)n.gen.last_reused) ||
          shoal_json_set_int(ru, "last_computed_tokens", (int64_t)n.gen.last_computed) ||
          shoal_json_set_int(ru, "reused_tokens", (int64_t)n.gen.reused_tokens) ||
          shoal_json_set_int(ru, "computed_tokens", (int64_t)n.gen.computed_tokens) ||
          shoal_json_set_int(ru, "prompt_tokens", (int64_t)n.gen.prompt_tokens) ||
          shoal_json_set_int(ru, "completion_tokens", (int64_t)n.gen.completion_tokens) ||
          shoal_json_set_int(ru, "saved_live_tokens", (int64_t)n.gen.live_tokens) ||
          shoal_json_set_int(ru, "saved_snapshot_tokens", (int64_t)n.gen.snap_tokens) ||
          shoal_json_set_int(ru, "last_decode_ns", (int64_t)n.last_decode_ns) ||
          shoal_json_set_int(ru, "last_decode_model_ns", (int64_t)n.last_decode_model_ns) ||
          shoal_json_set_int(ru, "last_prefill_ns", (int64_t)n.last_prefill_ns) ||
          shoal_json_set_int(ru, "last_completion_tokens", (int64_t)n.last_completion_tokens);
    if (!bad) {
        bad = shoal_json_set_take(root, "queue", q) | shoal_json_set_take(root, "requests", rq) |
              shoal_json_set_take(root, "generation", ru);
        q = rq = ru = NULL;
    }
    shoal_buf_init(&b, 0);
    if (!bad && shoal_json_dump(root, SHOAL_JSON_COMPACT, &b) == 0)
        send_json(req, 200, b.data, b.len);
    else
        evhttp_send_error(req, 500, NULL);
    shoal_buf_free(&b);
    shoal_json_free(q);
    shoal_json_free(rq);
    shoal_json_free(ru);
    shoal_json_free(root);
}

/* ---- requests --------------------------------------------------------------------- */

/* Constant-time comparison, so response timing does not leak the key. */
static int key_ok(const server *srv, struct evhttp_request *req)
{
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    const char *key = srv->cfg.api_key;
    size_t kl = strlen(key), hl;
    unsigned diff = 0;

    if (!h || strncmp(h, "Bearer ", 7) != 0)
        return 0;
    h += 7;
    hl = strlen(h);
    for (size_t i = 0; i < kl; i++)
        diff |= (unsigned)(unsigned char)key[i] ^ (unsigned char)(i < hl ? h[i] : 0);
    return diff == 0 && hl == kl;
}

static void admit(server *srv, struct evhttp_request *req, openai_kind kind)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    openai_error e;
    job *j = calloc(1, sizeof *j);
    int full;

    if (!j) {
        send_error(req, 500, "server_error", NULL, NULL, "out of memory");
        return;
    }
    if (openai_request_parse(kind, body, len, &j->r, &e) != 0) {
        free(j);
        send_error(req, e.status, e.type, e.param[0] ? e.param : NULL, e.code[0] ? e.code : NULL,
                   e.message);
        return;
    }
    if (j->r.model && strcmp(j->r.model, srv->cfg.model_name) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "The model '%.100s' does not exist; this server serves '%.100s'",
                 j->r.model, srv->cfg.model_name);
        job_free(j);
        send_error(req, 404, ERR_NOT_FOUND_TYPE, "model", "model_not_found", msg);
        return;
    }
    j->srv = srv;
    j->req = req;
    j->evcon = evhttp_request_get_connection(req);
    j->created = (int64_t)time(NULL);
    atomic_init(&j->cancel, 0);
    pthread_mutex_lock(&srv->mu);
    full = srv->q_len >= srv->cfg.queue || srv->stopping;
    if (!full) {
        srv->n.requests++;
        snprintf(j->id, sizeof j->id, "%s-%llu", kind == OPENAI_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)srv->n.requests);
        if (srv->q_tail)
            srv->q_tail->qnext = j;
        else
            srv->q_head = j;
        srv->q_tail = j;
        srv->q_len++;
        pthread_cond_signal(&srv->cv);
    } else {
        srv->n.rejected_busy++;
    }
    pthread_mutex_unlock(&srv->mu);
    if (full) {
        job_free(j);
        evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
        send_error(req, 429, "rate_limit_exceeded", NULL, "queue_full",
                   "The server is busy: the request queue is full; retry later");
        return;
    }
    live_add(srv, j);
    evhttp_connection_set_closecb(j->evcon, on_conn_close, j);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    server *srv = arg;
    const char *uri = evhttp_request_get_uri(req);
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    char path[128];
    size_t n = strcspn(uri, "?");

    if (n >= sizeof path)
        n = sizeof path - 1;
    memcpy(path, uri, n);
    path[n] = 0;
    if (n > 1 && path[n - 1] == '/')
        path[n - 1] = 0;
    if (strcmp(path, "/health") == 0 || strcmp(path, "/v1/stats") == 0) {
        if (cmd != EVHTTP_REQ_GET)
            send_error(req, 405, "invalid_request_error", NULL, NULL, "use GET");
        else
            send_stats(srv, req);
        return;
    }
    if (strncmp(path, "/v1/", 4) != 0) {
        send_error(req, 404, ERR_NOT_FOUND_TYPE, NULL, "unknown_url", "Unknown URL");
        return;
    }
    if (srv->cfg.api_key && !key_ok(srv, req)) {
        send_error(req, 401, "invalid_request_error", NULL, "invalid_api_key",
                   "Incorrect or missing API key: send 'Authorization: Bearer KEY'");
        return;
    }
    if (strcmp(path, "/v1/models") == 0) {
        shoal_buf b;
        shoal_buf_init(&b, 0);
        if (cmd != EVHTTP_REQ_GET)
            send_error(req, 405, "invalid_request_error", NULL, NULL, "use GET");
        else if (openai_models_json(srv->cfg.model_name, 0, &b) == 0)
            send_json(req, 200, b.data, b.len);
        else
            evhttp_send_error(req, 500, NULL);
        shoal_buf_free(&b);
        return;
    }
    if (strcmp(path, "/v1/chat/completions") == 0 || strcmp(path, "/v1/completions") == 0) {
        if (cmd != EVHTTP_REQ_POST)
            send_error(req, 405, "invalid_request_error", NULL, NULL, "use POST");
        else
            admit(srv, req, path[4] == 'c' && path[5] == 'h' ? OPENAI_CHAT : OPENAI_COMPLETION);
        return;
    }
    send_error(req, 404, ERR_NOT_FOUND_TYPE, NULL, "unknown_url", "Unknown URL");
}

/* ---- lifecycle ---------------------------------------------------------------------- */

/* SIGINT/SIGTERM: cancel everything, let the worker answer what it holds,
 * deliver those answers, then leave the loop. */
static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    server *srv = arg;
    (void)what;
    if (srv->shutting_down)
        return;
    srv->shutting_down = 1;
    LOG_INFO(TAG, "signal %d: shutting down", (int)sig);
    pthread_mutex_lock(&srv->mu);
    srv->stopping = 1;
    if (srv->running)
        atomic_store(&srv->running->cancel, 1);
    for (job *j = srv->q_head; j; j = j->qnext)
        atomic_store(&j->cancel, 1);
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    if (srv->worker_started) {
        pthread_join(srv->worker, NULL);
        srv->worker_started = 0;
    }
    on_wake(-1, 0, srv);
    event_base_loopexit(srv->base, NULL);
}

static int setup(server *srv, shoal_err *err)
{
    struct evhttp_bound_socket *bs;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    struct timeval tick = { 0, 100 * 1000 };
    int port = 0;

    if (evthread_use_pthreads() != 0)
        return shoal_err_set(err, SHOAL_EINTERNAL, "libevent: no pthreads support");
    if (!(srv->base = event_base_new()) || !(srv->http = evhttp_new(srv->base)))
        return shoal_err_set(err, SHOAL_ENOMEM, "libevent: cannot create the event loop");
    evhttp_set_max_body_size(srv->http, (ev_ssize_t)srv->cfg.max_body);
    evhttp_set_allowed_methods(srv->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_gencb(srv->http, on_request, srv);
    bs = evhttp_bind_socket_with_handle(srv->http, srv->cfg.host, (ev_uint16_t)srv->cfg.port);
    if (!bs)
        return shoal_err_set(err, SHOAL_EIO, "cannot listen on %s:%d: %s", srv->cfg.host,
                             srv->cfg.port, strerror(errno));
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    srv->wake = event_new(srv->base, -1, 0, on_wake, srv);
    srv->poll = event_new(srv->base, -1, EV_PERSIST, on_poll, srv);
    srv->sig_int = evsignal_new(srv->base, SIGINT, on_signal, srv);
    srv->sig_term = evsignal_new(srv->base, SIGTERM, on_signal, srv);
    if (!srv->wake || !srv->poll || !srv->sig_int || !srv->sig_term || event_add(srv->poll, &tick) ||
        event_add(srv->sig_int, NULL) || event_add(srv->sig_term, NULL))
        return shoal_err_set(err, SHOAL_ENOMEM, "libevent: cannot create events");
    if (pthread_create(&srv->worker, NULL, server_worker_main, srv) != 0)
        return shoal_err_set(err, SHOAL_EINTERNAL, "cannot start the worker thread");
    srv->worker_started = 1;
    LOG_INFO(TAG, "listening on http://%s:%d", srv->cfg.host, port);
    if (srv->cfg.on_listen)
        srv->cfg.on_listen(srv->cfg.on_listen_ctx, srv->cfg.host, port);
    return 0;
}

static void teardown(server *srv)
{
    if (srv->worker_started) {
        pthread_mutex_lock(&srv->mu);
        srv->stopping = 1;
        pthread_cond_broadcast(&srv->cv);
        pthread_mutex_unlock(&srv->mu);
        pthread_join(srv->worker, NULL);
    }
    if (srv->wake)
        on_wake(-1, 0, srv);
    /* Every job got its final message; evhttp_free closes the connections. */
    if (srv->http)
        evhttp_free(srv->http);
    if (srv->wake)
        event_free(srv->wake);
    if (srv->poll)
        event_free(srv->poll);
    if (srv->sig_int)
        event_free(srv->sig_int);
    if (srv->sig_term)
        event_free(srv->sig_term);
    if (srv->base)
        event_base_free(srv->base);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cv);
}

int server_run(const server_config *cfg, const server_model *m, shoal_err *err)
{
    server srv;
    int rc;

    memset(&srv, 0, sizeof srv);
    srv.cfg = *cfg;
    srv.m = *m;
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.cv, NULL);
    rc = setup(&srv, err);
    if (rc == 0 && event_base_dispatch(srv.base) < 0)
        rc = shoal_err_set(err, SHOAL_EINTERNAL, "libevent: the event loop failed");
    teardown(&srv);
    return rc;
}
