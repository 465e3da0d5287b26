/* server_conn.c — the server's listening socket and its connections: the
 * limits a hostile client meets (docs/server.md "Limits").
 *
 *   - header size (evhttp_set_max_headers_size) and body size: libevent
 *     stops reading and answers 413;
 *   - idle timeout (evhttp_set_timeout_tv): no byte moved while reading a
 *     request or writing a reply closes the connection;
 *   - request deadline: a request's header and body must have arrived
 *     within request_timeout_s of the connection's start or its previous
 *     reply, however slowly the bytes drip (slowloris): past it, a 408 and
 *     the connection closed;
 *   - connection cap: at max_connections open, a new connection takes the
 *     place of the one that has waited longest for its request (an idle
 *     keep-alive, a slow sender: it gets a 503 and is closed), so a flood of
 *     silent connections cannot keep real clients out; only when every
 *     connection is being answered does the listener pause, new connections
 *     then waiting in the kernel's backlog until one closes;
 *   - accept back-off: when accept fails (no descriptors: EMFILE/ENFILE, no
 *     memory) the listener pauses 50 ms, doubling to 1 s while it keeps
 *     failing, instead of spinning on a socket that stays readable; the
 *     failures are logged once per 10 s with a count.
 *
 * How connections are seen.  libevent 2.1 (what the machines have) tells
 * evhttp's user nothing about a connection before its first complete
 * request, and has no connection cap (evhttp_set_max_connections is 2.2's).
 * Our own evconnlistener feeds evhttp (evhttp_bind_listener), so the
 * listener can be paused; evhttp asks us for each new connection's
 * bufferevent (evhttp_set_bevcb), so we see it at accept.  Right after the
 * accept callback returns, a deferred event finds the connection that owns
 * the bufferevent (the argument evhttp gave its callbacks, checked against
 * evhttp_connection_get_bufferevent) and sets a close callback on it; a
 * reference held until then keeps the bufferevent valid should evhttp drop
 * the connection first.
 *
 * Owns: the listener, the conn list, the pauses.  Does not own what a
 * request asks (server.c).
 */
#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <event2/util.h>

#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"
#include "engine/serve/serve_int.h"

#define TAG "server"
#define RATELOG_NS 10000000000ull        /* one line per 10 s */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
#define FD_RESERVE 64                    /* descriptors kept for the model, shoald, logs */

/* ---- rate-limited log lines ----------------------------------------------------- */

void server_ratelog_note(server_ratelog *rl, const char *tag, const char *fmt, ...)
{
    uint64_t now = shoal_now_ns();
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(rl->last, sizeof rl->last, fmt, ap);
    va_end(ap);
    rl->tag = tag;
    if (rl->window_ns && now - rl->window_ns < RATELOG_NS) {
        rl->suppressed++;
        return;
    }
    server_ratelog_flush(rl);
    LOG_WARN(tag, "%s", rl->last);
    rl->window_ns = now;
}

void server_ratelog_flush(server_ratelog *rl)
{
    if (rl->suppressed && shoal_now_ns() - rl->window_ns >= RATELOG_NS) {
        LOG_WARN(rl->tag, "%s (%llu times in the last 10 s, the last one given)", rl->last,
                 (unsigned long long)rl->suppressed);
        rl->suppressed = 0;
        rl->window_ns = 0;
    }
}

/* ---- the listener ---------------------------------------------------------------- */

/* Enabled exactly when nothing holds it paused. */
static void listener_update(server *srv)
{
    int want = !srv->closing && !srv->paused_cap && !srv->paused_err;
    if (!srv->lev)
        return;
    if (want && srv->lev_off)
        evconnlistener_enable(srv->lev);
    else if (!want && !srv->lev_off) {
        evconnlistener_disable(srv->lev);
        srv->listener_pauses++;
    }
    srv->lev_off = !want;
}

static void close_with(server *srv, conn *c, int status);

/* At the cap: make room by closing the connection that has waited longest
 * for its request; pause the listener if every one is being answered. */
static conn *longest_waiting(server *srv)
{
    conn *oldest = NULL;
    for (conn *c = srv->conns; c; c = c->next)
        if (!c->answering && c->evcon && (!oldest || c->since_ns < oldest->since_ns))
            oldest = c;
    return oldest;
}

static void cap_check(server *srv)
{
    size_t cap = srv->cfg.max_connections;
    conn *oldest;

    if (srv->in_cap)           /* closing one below comes back here */
        return;
    srv->in_cap = 1;
    while (srv->n_conns > cap && (oldest = longest_waiting(srv)) != NULL) {
        server_ratelog_note(&srv->cap_log, TAG, "%zu connections open (the limit): closing the "
                            "one that waited longest for its request", cap);
        srv->evictions++;
        close_with(srv, oldest, 503);
    }
    srv->in_cap = 0;
    /* at the limit with one to close, the next comes in and takes its place */
    oldest = srv->n_conns >= cap ? longest_waiting(srv) : NULL;
    if (srv->n_conns >= cap && !oldest && !srv->paused_cap)
        server_ratelog_note(&srv->cap_log, TAG, "%zu connections open (the limit), all being "
                            "answered: new ones wait until one closes", srv->n_conns);
    srv->paused_cap = srv->n_conns >= cap && !oldest;
    listener_update(srv);
}

static void on_resume(evutil_socket_t fd, short what, void *arg)
{
    server *srv = arg;
    (void)fd;
    (void)what;
    srv->paused_err = 0;
    listener_update(srv);
}

/* The server whose listener this is.  The listener's error callback gets
 * the listener's user data, which evhttp_bind_listener made evhttp's own
 * (its accept callback's): the server is found here instead.  One server
 * per process listens at a time. */
static server *t_listening;

/* accept failed with something else than EAGAIN/EINTR/ECONNABORTED. */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
    server *srv = t_listening;
    int e = EVUTIL_SOCKET_ERROR();
    struct timeval tv;
    conn *c;
    (void)lev;
    (void)arg;

    if (!srv || srv->lev != lev)
        return;

    srv->accept_errors++;
    srv->backoff_ms = srv->backoff_ms ? srv->backoff_ms * 2 : BACKOFF_MIN_MS;
    if (srv->backoff_ms > BACKOFF_MAX_MS)
        srv->backoff_ms = BACKOFF_MAX_MS;
    /* out of descriptors below the cap (something else holds them): make
     * room as at the cap, so the next accept can take a waiting client */
    if ((e == EMFILE || e == ENFILE) && (c = longest_waiting(srv)) != NULL) {
        srv->evictions++;
        close_with(srv, c, 503);
        srv->backoff_ms = 0;
        server_ratelog_note(&srv->accept_log, TAG, "accept: %s (%zu connections open): closed the "
                            "one that waited longest for its request", strerror(e), srv->n_conns);
        return;                 /* a descriptor is free: the next accept takes a client */
    }
    server_ratelog_note(&srv->accept_log, TAG, "accept: %s (%zu connections open): new "
                        "connections paused for %llu ms", strerror(e), srv->n_conns,
                        (unsigned long long)srv->backoff_ms);
    srv->paused_err = 1;
    listener_update(srv);
    tv.tv_sec = (time_t)(srv->backoff_ms / 1000);
    tv.tv_usec = (suseconds_t)(srv->backoff_ms % 1000) * 1000;
    event_add(srv->resume, &tv);
}

/* ---- connections ------------------------------------------------------------------- */

static void conn_unlink(conn *c, conn **list)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        *list = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static void conn_push(conn **list, conn *c)
{
    c->prev = NULL;
    c->next = *list;
    if (*list)
        (*list)->prev = c;
    *list = c;
}

static void conn_gone(server *srv, conn *c)
{
    if (c->out_cb)
        evbuffer_remove_cb_entry(bufferevent_get_output(c->bev), c->out_cb);
    free(c);
    srv->n_conns--;
    if (!srv->closing)
        cap_check(srv);
}

static void on_close(struct evhttp_connection *evcon, void *arg)
{
    conn *c = arg;
    server *srv = c->srv;
    evhttp_connection_set_closecb(evcon, NULL, NULL);
    if (c->job)
        server_job_conn_closed(srv, c->job);
    conn_unlink(c, &srv->conns);
    conn_gone(srv, c);
}

/* Bytes went into a connection's output while no request of it was being
 * answered: libevent's own error reply (evhttp answers a header or body
 * past the limits, or a request it cannot parse, without calling us).
 * Counted once per connection (evhttp closes it after such a reply). */
static void on_out(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg)
{
    conn *c = arg;
    char h[12];
    if (!info->n_added || c->answering || c->refused ||
        evbuffer_copyout(buf, h, sizeof h) != (ev_ssize_t)sizeof h || memcmp(h, "HTTP/1.", 7) != 0)
        return;
    c->refused = 1;
    if (memcmp(h + 8, " 413", 4) == 0)
        c->srv->refused_too_large++;
    else if (memcmp(h + 8, " 400", 4) == 0)
        c->srv->refused_bad_request++;
}

/* evhttp's new connection: our bufferevent, so we see it. */
static struct bufferevent *on_bev(struct event_base *base, void *arg)
{
    server *srv = arg;
    struct bufferevent *bev = bufferevent_socket_new(base, -1, 0);
    conn *c = bev ? calloc(1, sizeof *c) : NULL;

    srv->conns_accepted++;
    srv->backoff_ms = 0;
    if (!c)
        return bev;    /* untracked, still served */
    c->srv = srv;
    c->bev = bev;
    c->since_ns = shoal_now_ns();
    c->out_cb = evbuffer_add_cb(bufferevent_get_output(bev), on_out, c);
    bufferevent_incref(bev);
    conn_push(&srv->pending, c);
    srv->n_conns++;
    event_active(srv->resolve, EV_READ, 0);
    cap_check(srv);
    return bev;
}

/* After the accept callbacks: find each new bufferevent's connection. */
static void on_resolve(evutil_socket_t fd, short what, void *arg)
{
    server *srv = arg;
    (void)fd;
    (void)what;
    while (srv->pending) {
        conn *c = srv->pending;
        bufferevent_data_cb rd, wr;
        bufferevent_event_cb ev;
        void *owner = NULL;
        struct evhttp_connection *evcon;

        conn_unlink(c, &srv->pending);
        bufferevent_getcb(c->bev, &rd, &wr, &ev, &owner);
        evcon = owner;
        if (!ev || !evcon || evhttp_connection_get_bufferevent(evcon) != c->bev) {
            /* evhttp dropped it already (callbacks cleared), or this
             * libevent does not work as the header says */
            if (ev && !srv->warned_untracked) {
                LOG_WARN(TAG, "cannot track connections with this libevent: the connection "
                         "limit and request deadline do not apply");
                srv->warned_untracked = 1;
            }
            bufferevent_decref(c->bev);
            conn_gone(srv, c);
            continue;
        }
        c->evcon = evcon;
        evhttp_connection_set_closecb(evcon, on_close, c);
        conn_push(&srv->conns, c);
        bufferevent_decref(c->bev);
    }
    if (!srv->closing)
        cap_check(srv);        /* the new ones can now make room, or be made room for */
}

conn *server_conn_of(server *srv, struct evhttp_request *req)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(req);
    for (conn *c = srv->conns; evcon && c; c = c->next)
        if (c->evcon == evcon)
            return c;
    return NULL;
}

/* The reply is written: the next request's deadline starts now. */
static void on_reply_done(struct evhttp_request *req, void *arg)
{
    conn *c = server_conn_of(arg, req);
    if (c) {
        c->answering = 0;
        c->since_ns = shoal_now_ns();
    }
}

void server_conn_answering(server *srv, struct evhttp_request *req)
{
    conn *c = server_conn_of(srv, req);
    if (!c)
        return;
    c->answering = 1;
    evhttp_request_set_on_complete_cb(req, on_reply_done, srv);
}

/* Close a connection that is not being answered with a reply written
 * straight to the socket (evhttp holds no request we could answer: it is
 * still reading one): 408 past the deadline, 503 to make room at the cap.
 * A client still sending may see only the close. */
static void close_with(server *srv, conn *c, int status)
{
    char body[256], msg[512];
    int n;
    evutil_socket_t fd = bufferevent_getfd(c->bev);

    snprintf(body, sizeof body, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
             "\"code\":\"%s\"}}\n",
             status == 408 ? "The request did not arrive in time"
                           : "Too many connections: this one waited longest; retry",
             status == 408 ? "invalid_request_error" : "server_error",
             status == 408 ? "request_timeout" : "too_many_connections");
    n = snprintf(msg, sizeof msg, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                 "Connection: close\r\n%sContent-Length: %zu\r\n\r\n%s", status,
                 status == 408 ? "Request Timeout" : "Service Unavailable",
                 status == 408 ? "" : "Retry-After: 1\r\n", strlen(body), body);
    if (fd >= 0 && send(fd, msg, (size_t)n, MSG_DONTWAIT | SHOAL_MSG_NOSIGNAL) < 0)
        LOG_DEBUG(TAG, "%d: %s", status, strerror(errno));
    if (status == 408)
        srv->request_timeouts++;
    server_count(srv, EP_OTHER, status);
    evhttp_connection_free(c->evcon);      /* runs on_close */
}

void server_conn_sweep(server *srv)
{
    uint64_t now = shoal_now_ns(), limit = (uint64_t)srv->cfg.request_timeout_s * 1000000000ull;
    conn *next;
    for (conn *c = srv->conns; c; c = next) {
        next = c->next;
        if (!c->answering && c->evcon && limit && now - c->since_ns > limit)
            close_with(srv, c, 408);
    }
    server_ratelog_flush(&srv->accept_log);
    server_ratelog_flush(&srv->cap_log);
}

size_t server_conn_unsent(server *srv)
{
    size_t n = 0;
    for (conn *c = srv->conns; c; c = c->next)
        n += evbuffer_get_length(bufferevent_get_output(c->bev));
    return n;
}

void server_conn_stop_accepting(server *srv)
{
    srv->closing = 1;
    listener_update(srv);
}

void server_conn_release(server *srv)
{
    if (t_listening == srv)
        t_listening = NULL;
    srv->closing = 1;
    srv->lev = NULL;              /* evhttp_free frees it */
    while (srv->pending) {
        conn *c = srv->pending;
        conn_unlink(c, &srv->pending);
        bufferevent_decref(c->bev);
        conn_gone(srv, c);
    }
}

/* At most half of what the descriptor limit leaves once FD_RESERVE are
 * kept for the model, shoald and logs: an hf:// model's RAM tier may hold
 * a descriptor per expert, and a flood of connections must not starve it. */
static void cap_from_rlimit(server *srv)
{
    struct rlimit rl;
    size_t room;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return;
    room = rl.rlim_cur > 2 * FD_RESERVE ? (size_t)(rl.rlim_cur - FD_RESERVE) / 2
                                        : (size_t)rl.rlim_cur / 4;
    if (room < 4)
        room = 4;
    if (srv->cfg.max_connections > room) {
        LOG_INFO(TAG, "at most %zu connections (not %zu): the descriptor limit is %llu", room,
                 srv->cfg.max_connections, (unsigned long long)rl.rlim_cur);
        srv->cfg.max_connections = room;
    }
}

int server_conn_listen(server *srv, shoal_err *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE };
    struct addrinfo *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    struct timeval idle = { srv->cfg.idle_timeout_s, 0 };
    char port[16];
    int rc;

    snprintf(port, sizeof port, "%d", srv->cfg.port);
    if ((rc = getaddrinfo(srv->cfg.host, port, &hints, &ai)) != 0)
        return shoal_err_set(err, SHOAL_EIO, "cannot listen on %s:%d: %s", srv->cfg.host,
                             srv->cfg.port, gai_strerror(rc));
    srv->lev = evconnlistener_new_bind(srv->base, NULL, NULL,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE |
                                       LEV_OPT_CLOSE_ON_EXEC, 128, ai->ai_addr,
                                       (int)ai->ai_addrlen);
    freeaddrinfo(ai);
    if (!srv->lev)
        return shoal_err_set(err, SHOAL_EIO, "cannot listen on %s:%d: %s", srv->cfg.host,
                             srv->cfg.port, strerror(errno));
    evconnlistener_set_error_cb(srv->lev, on_accept_error);
    t_listening = srv;
    if (!evhttp_bind_listener(srv->http, srv->lev)) {
        evconnlistener_free(srv->lev);
        srv->lev = NULL;
        return shoal_err_set(err, SHOAL_ENOMEM, "libevent: cannot serve the listener");
    }
    if (getsockname(evconnlistener_get_fd(srv->lev), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            srv->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            srv->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    srv->resolve = event_new(srv->base, -1, 0, on_resolve, srv);
    srv->resume = event_new(srv->base, -1, 0, on_resume, srv);
    if (!srv->resolve || !srv->resume)
        return shoal_err_set(err, SHOAL_ENOMEM, "libevent: cannot create events");
    cap_from_rlimit(srv);
    evhttp_set_bevcb(srv->http, on_bev, srv);
    evhttp_set_max_headers_size(srv->http, (ev_ssize_t)srv->cfg.max_header);
    evhttp_set_max_body_size(srv->http, (ev_ssize_t)srv->cfg.max_body);
    if (srv->cfg.idle_timeout_s > 0)
        evhttp_set_timeout_tv(srv->http, &idle);
    return 0;
}
