/* server.c — the HTTP side of the OpenAI-compatible server: evhttp on the
 * caller's thread, routing, API keys, admission to the bounded FIFO,
 * delivery of the worker's output, disconnect detection and shutdown
 * (serve.h part 3; serve_int.h has the threading rules).
 *
 * Owns: the loop's events, jobs from admission to their last byte, the
 * request counters.  Does not own the connections and their limits
 * (server_conn.c), statistics pages (server_info.c), generation
 * (server_worker.c) nor JSON shapes (openai_*.c).
 *
 * Start-up.  The port opens first and the worker binds the model while
 * the loop answers: /health says 503 "loading", /v1/... 503 with
 * Retry-After, until the worker says the model is ready (srv->ready).
 *
 * Disconnects.  evhttp stops reading a connection while its request is
 * being answered, so a client that goes away is noticed only when a write
 * fails.  To notice it while a request waits in the queue, or while a
 * long prefill sends nothing, a 100 ms timer peeks at each live request's
 * socket (recv MSG_PEEK: 0 means EOF) and frees the connection, which
 * cancels the job through the close callback.
 *
 * Shutdown.  The first SIGINT/SIGTERM stops accepting, cancels every job
 * (a running stream ends with its last chunk and [DONE]) and lets the loop
 * run until every answer has been written (the drain), at most
 * SERVER_DRAIN_S; a second signal leaves at once.
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

#include "common/log.h"
#include "common/sys.h"
#include "engine/serve/serve_int.h"

#define TAG "server"
#define ERR_INVALID "invalid_request_error"
#define SERVER_DRAIN_S 10

const int SERVER_CODES[SERVER_N_CODES] = { 200, 400, 401, 404, 405, 408, 413, 429, 500, 503, 0 };

void server_config_default(server_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8000;
    c->queue = 16;
    c->max_body = (size_t)4 << 20;
    c->max_header = (size_t)32 << 10;
    c->request_timeout_s = 60;
    c->idle_timeout_s = 30;
    c->max_connections = 256;
    c->model_name = "model";
}

/* "hf://org/name@rev" -> "org/name": the part that names a repo */
static size_t repo_part(const char *s, const char **start)
{
    if (strncmp(s, "hf://", 5) == 0)
        s += 5;
    *start = s;
    return strcspn(s, "@");
}

static const char *last_part(const char *s, size_t n, size_t *len)
{
    const char *p = s;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '/')
            p = s + i + 1;
    *len = n - (size_t)(p - s);
    return p;
}

int server_model_matches(const char *served, const char *asked)
{
    const char *a, *s, *la, *ls;
    size_t na, ns, nla, nls;

    if (strcmp(served, asked) == 0)
        return 1;
    na = repo_part(asked, &a);
    ns = repo_part(served, &s);
    if (na == ns && memcmp(a, s, na) == 0)
        return 1;
    /* "Kimi-K3" for "moonshotai/Kimi-K3", and the other way round; never a
     * different org's repo of the same name */
    la = last_part(a, na, &nla);
    ls = last_part(s, ns, &nls);
    if ((la != a) == (ls != s))
        return 0;
    return nla == nls && nla > 0 && memcmp(la, ls, nla) == 0;
}

const char *server_ep_name(server_ep e)
{
    static const char *const names[EP_COUNT] = { "/v1/chat/completions", "/v1/completions",
                                                  "/v1/models", "/health", "/metrics",
                                                  "/tokenize", "/detokenize", "other" };
    return (unsigned)e < EP_COUNT ? names[e] : "other";
}

const char *server_link_name(server_link l)
{
    switch (l) {
    case LINK_OK: return "ok";
    case LINK_RECONNECTING: return "reconnecting";
    case LINK_DOWN: return "down";
    default: return "local";
    }
}

server_link server_link_now(server *srv)
{
    if (srv->link == LINK_RECONNECTING &&
        shoal_now_ns() - srv->link_lost_ns >= (uint64_t)SERVER_LINK_DOWN_S * 1000000000ull)
        return LINK_DOWN;
    return srv->link;
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

void server_post_error(server *srv, job *j, const openai_error *e, int retry_after)
{
    shoal_buf b;
    shoal_buf_init(&b, 0);
    if (openai_error_json(e, &b) != 0)
        shoal_buf_free(&b);
    j->fin.retry_after = retry_after;
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
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Error";
    }
}

void server_count(server *srv, server_ep ep, int status)
{
    int k = SERVER_N_CODES - 1;
    for (int i = 0; i < SERVER_N_CODES - 1; i++)
        if (SERVER_CODES[i] == status)
            k = i;
    srv->http_count[(unsigned)ep < EP_COUNT ? ep : EP_OTHER][k]++;
}

void server_send_text(server *srv, struct evhttp_request *req, server_ep ep, int status,
                      const char *content_type, const void *body, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", content_type);
    if (b)
        evbuffer_add(b, body, len);
    server_count(srv, ep, status);
    evhttp_send_reply(req, status, reason(status), b);
    evbuffer_free(b);
}

void server_send_json(server *srv, struct evhttp_request *req, server_ep ep, int status,
                      const void *body, size_t len)
{
    server_send_text(srv, req, ep, status, "application/json", body, len);
}

void server_send_error(server *srv, struct evhttp_request *req, server_ep ep, int status,
                       const char *type, const char *param, const char *code, const char *msg)
{
    openai_error e;
    shoal_buf b;
    openai_error_set(&e, status, type, param, code, "%s", msg);
    shoal_buf_init(&b, 0);
    if (openai_error_json(&e, &b) == 0) {
        server_send_json(srv, req, ep, status, b.data, b.len);
    } else {
        server_count(srv, ep, 500);
        evhttp_send_error(req, 500, NULL);
    }
    shoal_buf_free(&b);
}

static void retry_after(struct evhttp_request *req, int secs)
{
    char v[16];
    snprintf(v, sizeof v, "%d", secs);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", v);
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
void server_job_conn_closed(server *srv, job *j)
{
    int queued = 0;

    atomic_store(&j->cancel, 1);
    if (j->req && evhttp_request_get_connection(j->req) == NULL)
        j->orphan = 1;
    else
        j->req = NULL;
    j->conn = NULL;
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

static void deliver_reply(server *srv, job *j, const out_msg *m)
{
    struct evhttp_request *req = j->req;
    if (j->streaming) {   /* an error after the stream began: end it */
        evhttp_send_reply_end(req);
        return;
    }
    if (m->retry_after)
        retry_after(req, m->retry_after);
    if (m->body.len)
        server_send_json(srv, req, j->ep, m->status, m->body.data, m->body.len);
    else
        server_send_error(srv, req, j->ep, m->status ? m->status : 500, "server_error", NULL,
                          NULL, "internal error");
}

static void deliver(server *srv, out_msg *m)
{
    job *j = m->j;
    struct evhttp_request *req = j->req;
    int final = m->kind == OUT_STREAM_END || m->kind == OUT_REPLY;

    if (final) {
        if (j->conn)
            j->conn->job = NULL;
        live_remove(srv, j);
    }
    if (req && !j->orphan) {
        switch (m->kind) {
        case OUT_STREAM_START: {
            struct evkeyvalq *h = evhttp_request_get_output_headers(req);
            evhttp_add_header(h, "Content-Type", "text/event-stream");
            evhttp_add_header(h, "Cache-Control", "no-cache");
            server_count(srv, j->ep, 200);
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
            deliver_reply(srv, j, m);
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
        if (!j->conn || !j->conn->evcon || j->orphan ||
            !(bev = evhttp_connection_get_bufferevent(j->conn->evcon)))
            continue;
        if ((s = bufferevent_getfd(bev)) < 0)
            continue;
        r = recv(s, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            evhttp_connection_free(j->conn->evcon);   /* runs the close callback */
    }
    server_conn_sweep(srv);
}

/* ---- requests --------------------------------------------------------------------- */

/* Constant-time comparison, so response timing does not leak the key: every
 * byte of the key is looked at whatever the header holds. */
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

/* 503 while the daemon of an hf:// model is away: the request would fail. */
static int link_refuses(server *srv, struct evhttp_request *req, server_ep ep)
{
    char msg[320];
    server_link l;
    pthread_mutex_lock(&srv->mu);
    l = server_link_now(srv);
    if (l == LINK_RECONNECTING || l == LINK_DOWN) {
        srv->n.rejected_link++;
        snprintf(msg, sizeof msg, "the model's shoald is not reachable (%s: %s); retry later",
                 server_link_name(l), srv->link_err);
    }
    pthread_mutex_unlock(&srv->mu);
    if (l != LINK_RECONNECTING && l != LINK_DOWN)
        return 0;
    retry_after(req, 2);
    server_send_error(srv, req, ep, 503, "server_error", NULL, "backend_unavailable", msg);
    return 1;
}

static void admit(server *srv, struct evhttp_request *req, server_ep ep)
{
    openai_kind kind = ep == EP_CHAT ? OPENAI_CHAT : OPENAI_COMPLETION;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *body = len ? (const char *)evbuffer_pullup(in, -1) : "";
    openai_error e;
    job *j;
    int full;

    if (link_refuses(srv, req, ep))
        return;
    if (!(j = calloc(1, sizeof *j))) {
        server_send_error(srv, req, ep, 500, "server_error", NULL, NULL, "out of memory");
        return;
    }
    if (openai_request_parse(kind, body, len, &j->r, &e) != 0) {
        free(j);
        server_send_error(srv, req, ep, e.status, e.type, e.param[0] ? e.param : NULL,
                          e.code[0] ? e.code : NULL, e.message);
        return;
    }
    if (j->r.model && !server_model_matches(srv->cfg.model_name, j->r.model)) {
        char msg[256];
        snprintf(msg, sizeof msg, "The model '%.100s' does not exist; this server serves '%.100s'",
                 j->r.model, srv->cfg.model_name);
        job_free(j);
        server_send_error(srv, req, ep, 404, ERR_INVALID, "model", "model_not_found", msg);
        return;
    }
    j->srv = srv;
    j->ep = ep;
    j->req = req;
    j->conn = server_conn_of(srv, req);
    j->created = (int64_t)time(NULL);
    atomic_init(&j->cancel, 0);
    pthread_mutex_lock(&srv->mu);
    /* --queue N: N may wait while one runs; --queue 0 still runs one */
    full = srv->q_len + (srv->running != NULL) > srv->cfg.queue || srv->stopping;
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
        retry_after(req, 1);
        server_send_error(srv, req, ep, 429, "rate_limit_exceeded", NULL, "queue_full",
                          "The server is busy: the request queue is full; retry later");
        return;
    }
    live_add(srv, j);
    if (j->conn)
        j->conn->job = j;
}

static server_ep endpoint(const char *path)
{
    static const struct { const char *p; server_ep ep; } map[] = {
        { "/v1/chat/completions", EP_CHAT }, { "/v1/completions", EP_COMPLETIONS },
        { "/v1/models", EP_MODELS }, { "/health", EP_HEALTH }, { "/v1/stats", EP_HEALTH },
        { "/metrics", EP_METRICS }, { "/tokenize", EP_TOKENIZE }, { "/detokenize", EP_DETOKENIZE },
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (strcmp(path, map[i].p) == 0)
            return map[i].ep;
    return EP_OTHER;
}

static int wrong_method(server *srv, struct evhttp_request *req, server_ep ep,
                        enum evhttp_cmd_type want)
{
    if (evhttp_request_get_command(req) == want)
        return 0;
    server_send_error(srv, req, ep, 405, ERR_INVALID, NULL, NULL,
                      want == EVHTTP_REQ_GET ? "use GET" : "use POST");
    return 1;
}

/* After the key check: the routes that need the model. */
static void route_model(server *srv, struct evhttp_request *req, server_ep ep)
{
    server_phase ph;
    pthread_mutex_lock(&srv->mu);
    ph = srv->phase;
    pthread_mutex_unlock(&srv->mu);
    if (ph != SRV_READY) {
        retry_after(req, 2);
        server_send_error(srv, req, ep, 503, "server_error", NULL, "model_loading",
                          "The model is still loading; retry later (GET /health says when "
                          "it is ready)");
        return;
    }
    if (ep == EP_MODELS) {
        shoal_buf b;
        shoal_buf_init(&b, 0);
        if (wrong_method(srv, req, ep, EVHTTP_REQ_GET))
            ;
        else if (openai_models_json(srv->cfg.model_name, 0, &b) == 0)
            server_send_json(srv, req, ep, 200, b.data, b.len);
        else
            server_send_error(srv, req, ep, 500, "server_error", NULL, NULL, "out of memory");
        shoal_buf_free(&b);
    } else if (!wrong_method(srv, req, ep, EVHTTP_REQ_POST)) {
        if (ep == EP_TOKENIZE || ep == EP_DETOKENIZE)
            server_tokenize(srv, req, ep == EP_DETOKENIZE);
        else
            admit(srv, req, ep);
    }
}

static void on_request(struct evhttp_request *req, void *arg)
{
    server *srv = arg;
    const char *uri = evhttp_request_get_uri(req);
    char path[128];
    size_t n = strcspn(uri, "?");
    server_ep ep;

    server_conn_answering(srv, req);
    if (n >= sizeof path)
        n = sizeof path - 1;
    memcpy(path, uri, n);
    path[n] = 0;
    if (n > 1 && path[n - 1] == '/')
        path[n - 1] = 0;
    ep = endpoint(path);
    if (ep == EP_HEALTH || ep == EP_METRICS) {   /* no key: for probes and scrapers */
        if (!wrong_method(srv, req, ep, EVHTTP_REQ_GET)) {
            if (ep == EP_HEALTH)
                server_health(srv, req, ep);
            else
                server_metrics(srv, req);
        }
        return;
    }
    if (ep == EP_OTHER) {
        server_send_error(srv, req, ep, 404, ERR_INVALID, NULL, "unknown_url", "Unknown URL");
        return;
    }
    if (srv->cfg.api_key && !key_ok(srv, req)) {
        server_send_error(srv, req, ep, 401, ERR_INVALID, NULL, "invalid_api_key",
                          "Incorrect or missing API key: send 'Authorization: Bearer KEY'");
        return;
    }
    route_model(srv, req, ep);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

/* The worker bound the model (or failed to). */
static void on_ready(evutil_socket_t fd, short what, void *arg)
{
    server *srv = arg;
    server_phase ph;
    shoal_err e;
    uint64_t ms;
    (void)fd;
    (void)what;
    pthread_mutex_lock(&srv->mu);
    ph = srv->phase;
    e = srv->load_err;
    ms = srv->load_ns / 1000000;
    pthread_mutex_unlock(&srv->mu);
    if (ph == SRV_FAILED) {
        LOG_ERROR(TAG, "the model did not open: %s", e.msg);
        srv->rc = e.code ? e.code : SHOAL_EINTERNAL;
        event_base_loopexit(srv->base, NULL);
        return;
    }
    LOG_INFO(TAG, "%s ready after %llu ms: serving on http://%s:%d", srv->cfg.model_name,
             (unsigned long long)ms, srv->cfg.host, srv->port);
    if (srv->cfg.on_listen && !srv->shutting_down)
        srv->cfg.on_listen(srv->cfg.on_listen_ctx, srv->cfg.host, srv->port);
}

/* While shutting down: leave once the worker is done and everything it
 * answered has been written, or at the deadline. */
static void on_drain(evutil_socket_t fd, short what, void *arg)
{
    server *srv = arg;
    int done;
    (void)fd;
    (void)what;
    pthread_mutex_lock(&srv->mu);
    done = srv->worker_done && !srv->out_head;
    pthread_mutex_unlock(&srv->mu);
    if (done && !srv->live && server_conn_unsent(srv) == 0) {
        event_base_loopexit(srv->base, NULL);
    } else if (shoal_now_ns() > srv->drain_deadline_ns) {
        LOG_WARN(TAG, "shutdown: %zu bytes still unsent after %d s; closing", server_conn_unsent(srv),
                 SERVER_DRAIN_S);
        event_base_loopexit(srv->base, NULL);
    }
}

/* SIGINT/SIGTERM: stop accepting, cancel everything, let the worker answer
 * what it holds, and drain; a second signal leaves now. */
static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    server *srv = arg;
    struct timeval tick = { 0, 20 * 1000 };
    server_phase ph;
    (void)what;
    if (srv->signals++ > 0) {
        LOG_WARN(TAG, "signal %d again: leaving without waiting for the answers", (int)sig);
        event_base_loopexit(srv->base, NULL);
        return;
    }
    srv->shutting_down = 1;
    pthread_mutex_lock(&srv->mu);
    ph = srv->phase;
    srv->stopping = 1;
    if (srv->running)
        atomic_store(&srv->running->cancel, 1);
    for (job *j = srv->q_head; j; j = j->qnext)
        atomic_store(&j->cancel, 1);
    pthread_cond_broadcast(&srv->cv);
    pthread_mutex_unlock(&srv->mu);
    LOG_INFO(TAG, "signal %d: shutting down%s", (int)sig,
             ph == SRV_LOADING ? " once the model's load step ends" : "");
    server_conn_stop_accepting(srv);
    srv->drain_deadline_ns = shoal_now_ns() + (uint64_t)SERVER_DRAIN_S * 1000000000ull;
    if (!srv->drain || event_add(srv->drain, &tick) != 0)
        event_base_loopexit(srv->base, NULL);
}

static int setup(server *srv, shoal_err *err)
{
    struct timeval tick = { 0, 100 * 1000 };
    int rc;

    if (evthread_use_pthreads() != 0)
        return shoal_err_set(err, SHOAL_EINTERNAL, "libevent: no pthreads support");
    if (!(srv->base = event_base_new()) || !(srv->http = evhttp_new(srv->base)))
        return shoal_err_set(err, SHOAL_ENOMEM, "libevent: cannot create the event loop");
    evhttp_set_allowed_methods(srv->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    evhttp_set_gencb(srv->http, on_request, srv);
    srv->wake = event_new(srv->base, -1, 0, on_wake, srv);
    srv->ready = event_new(srv->base, -1, 0, on_ready, srv);
    srv->poll = event_new(srv->base, -1, EV_PERSIST, on_poll, srv);
    srv->drain = event_new(srv->base, -1, EV_PERSIST, on_drain, srv);
    srv->sig_int = evsignal_new(srv->base, SIGINT, on_signal, srv);
    srv->sig_term = evsignal_new(srv->base, SIGTERM, on_signal, srv);
    if (!srv->wake || !srv->ready || !srv->poll || !srv->drain || !srv->sig_int ||
        !srv->sig_term || event_add(srv->poll, &tick) || event_add(srv->sig_int, NULL) ||
        event_add(srv->sig_term, NULL))
        return shoal_err_set(err, SHOAL_ENOMEM, "libevent: cannot create events");
    if ((rc = server_conn_listen(srv, err)) != 0)
        return rc;
    srv->load_t0_ns = shoal_now_ns();
    snprintf(srv->load_what, sizeof srv->load_what, "starting");
    if (pthread_create(&srv->worker, NULL, server_worker_main, srv) != 0)
        return shoal_err_set(err, SHOAL_EINTERNAL, "cannot start the worker thread");
    srv->worker_started = 1;
    LOG_INFO(TAG, "port open on http://%s:%d; loading %s", srv->cfg.host, srv->port,
             srv->cfg.model);
    return 0;
}

static void teardown(server *srv)
{
    if (srv->worker_started) {
        pthread_mutex_lock(&srv->mu);
        srv->stopping = 1;
        if (srv->running)
            atomic_store(&srv->running->cancel, 1);
        pthread_cond_broadcast(&srv->cv);
        pthread_mutex_unlock(&srv->mu);
        pthread_join(srv->worker, NULL);
    }
    if (srv->wake)
        on_wake(-1, 0, srv);
    server_conn_release(srv);
    /* Every job got its final message; evhttp_free closes the connections
     * (and frees the listener it was given). */
    if (srv->http)
        evhttp_free(srv->http);
    if (srv->resolve)
        event_free(srv->resolve);
    if (srv->resume)
        event_free(srv->resume);
    if (srv->wake)
        event_free(srv->wake);
    if (srv->ready)
        event_free(srv->ready);
    if (srv->poll)
        event_free(srv->poll);
    if (srv->drain)
        event_free(srv->drain);
    if (srv->sig_int)
        event_free(srv->sig_int);
    if (srv->sig_term)
        event_free(srv->sig_term);
    if (srv->base)
        event_base_free(srv->base);
    gen_model_close(&srv->gm);
    pthread_mutex_destroy(&srv->mu);
    pthread_cond_destroy(&srv->cv);
}

int server_run(const server_config *cfg, shoal_err *err)
{
    server *srv = calloc(1, sizeof *srv);
    int rc;

    if (!srv)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    srv->cfg = *cfg;
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->cv, NULL);
    rc = setup(srv, err);
    if (rc == 0 && event_base_dispatch(srv->base) < 0)
        rc = shoal_err_set(err, SHOAL_EINTERNAL, "libevent: the event loop failed");
    if (rc == 0 && srv->rc != 0) {
        rc = srv->rc;
        *err = srv->load_err;
    }
    teardown(srv);
    free(srv);
    return rc;
}
