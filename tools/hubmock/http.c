/* http.c — a small HTTP/1.1 server on bufferevents, with body faults.
 *
 * Owns: listening sockets, connections, request parsing (request line and
 * headers; request bodies are read and dropped), sending a response with its
 * Content-Length, streaming file bodies with sendfile, keep-alive, and the
 * body faults a handler asked for: stall before the answer, stall mid-body,
 * stop after N bytes with a clean close (truncation) or a TCP reset, and a
 * per-connection bandwidth cap (libevent token bucket, 100 ms ticks).
 * Does not own routing (hub.c, cdn.c) or deciding faults (the handlers).
 *
 * One connection answers one request at a time; pipelined requests wait in
 * the input buffer.  Connection states:
 *
 *   READ --request--> [WAIT (stall before)] --> SEND <--> PAUSE (stall mid)
 *   SEND --body done, drained--> READ (keep-alive) | closed (cut, close)
 */
#include "tools/hubmock/hubmock_int.h"
#include "common/sys.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/log.h"

#define HTTP_MAX_HEADER  (64 * 1024)
#define HTTP_MAX_REQBODY (1024 * 1024)
#define HTTP_CHUNK       (4u << 20)   /* body bytes queued per refill */

typedef enum { C_READ, C_WAIT, C_SEND, C_PAUSE } conn_state;

typedef struct hm_conn {
    hm_server          *srv;
    hm_port             port;
    struct bufferevent *bev;
    struct event       *timer;
    struct hm_conn     *next, *prev;
    conn_state          state;
    int                 keep_alive;
    hm_request          req;
    hm_response         res;
    int                 file_fd;
    struct evbuffer_file_segment *seg;
    uint64_t            body_len;   /* what Content-Length announced */
    uint64_t            stop_at;    /* body bytes we will send */
    uint64_t            pause_at;   /* HM_NONE, or where the mid stall is */
    uint64_t            queued;     /* body bytes added to the output */
    uint64_t            t0_us;      /* when the answer started (request log) */
    struct ev_token_bucket_cfg *rl;  /* the connection's cap, kept across its requests */
    uint64_t            rl_bw;      /* the rate rl was made for */
} hm_conn;

static void conn_read_cb(struct bufferevent *bev, void *arg);
static void conn_write_cb(struct bufferevent *bev, void *arg);

/* ---- small helpers shared with the handlers ---------------------------- */

void hm_response_header(hm_response *r, const char *name, const char *fmt, ...)
{
    va_list ap;
    char v[4096];
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    shoal_buf_appendf(&r->headers, "%s: %s\r\n", name, v);
}

void hm_response_error(hm_response *r, int status, const char *code, const char *fmt, ...)
{
    va_list ap;
    char msg[1024];
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->status = status;
    if (code)
        hm_response_header(r, "X-Error-Code", "%s", code);
    hm_response_header(r, "X-Error-Message", "%s", msg);
    hm_response_header(r, "Content-Type", "application/json; charset=utf-8");
    shoal_buf_reset(&r->mem);
    shoal_buf_append_str(&r->mem, "{\"error\":\"");
    for (const char *p = msg; *p; p++) {
        if (*p == '"' || *p == '\\')
            shoal_buf_append_u8(&r->mem, '\\');
        shoal_buf_append_u8(&r->mem, (uint8_t)*p);
    }
    shoal_buf_append_str(&r->mem, "\"}");
    r->file_path[0] = '\0';
}

void hm_response_fault(hm_response *r, const char *name)
{
    size_t n = strlen(r->fault);
    snprintf(r->fault + n, sizeof r->fault - n, "%s%s", n ? "+" : "", name);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

char *hm_pct_decode(const char *src, size_t n)
{
    char *out = malloc(n + 1);
    size_t j = 0;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)src[i];
        if (c == '%') {
            int hi = i + 2 < n ? hexval((unsigned char)src[i + 1]) : -1;
            int lo = i + 2 < n ? hexval((unsigned char)src[i + 2]) : -1;
            if (hi < 0 || lo < 0) {
                free(out);
                return NULL;
            }
            c = hi * 16 + lo;
            i += 2;
        }
        if (c == 0) {
            free(out);
            return NULL;
        }
        out[j++] = (char)c;
    }
    out[j] = '\0';
    return out;
}

char *hm_query_get(const char *query, const char *key)
{
    size_t klen = strlen(key);
    const char *p = query;
    while (p && *p) {
        const char *amp = strchr(p, '&');
        size_t len = amp ? (size_t)(amp - p) : strlen(p);
        if (len > klen && strncmp(p, key, klen) == 0 && p[klen] == '=')
            return hm_pct_decode(p + klen + 1, len - klen - 1);
        if (len == klen && strncmp(p, key, klen) == 0)
            return hm_pct_decode("", 0);
        p = amp ? amp + 1 : NULL;
    }
    return NULL;
}

static const char *status_reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 206: return "Partial Content";
    case 302: return "Found";
    case 307: return "Temporary Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 416: return "Range Not Satisfiable";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default:  return "Unknown";
    }
}

/* ---- connections --------------------------------------------------------- */

static void req_clear(hm_request *q)
{
    free(q->target);
    free(q->path);
    free(q->query);
    free(q->range);
    free(q->authorization);
    memset(q, 0, sizeof *q);
}

static void res_init(hm_response *r)
{
    memset(r, 0, sizeof *r);
    shoal_buf_init(&r->headers, 0);
    shoal_buf_init(&r->mem, 0);
    r->cut_after = HM_NONE;
}

static void res_clear(hm_response *r)
{
    shoal_buf_free(&r->headers);
    shoal_buf_free(&r->mem);
    res_init(r);
}

static void conn_body_release(hm_conn *c)
{
    if (c->seg) {
        evbuffer_file_segment_free(c->seg);   /* refcounted: safe while queued */
        c->seg = NULL;
    }
    if (c->file_fd >= 0) {
        close(c->file_fd);
        c->file_fd = -1;
    }
}

static void conn_free(hm_conn *c, int reset)
{
    if (!c)
        return;
    if (reset) {
        /* SO_LINGER 0 makes close() send a RST instead of a FIN. */
        struct linger lg = { 1, 0 };
        setsockopt(bufferevent_getfd(c->bev), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        c->srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    if (c->rl)
        bufferevent_set_rate_limit(c->bev, NULL);
    bufferevent_free(c->bev);   /* closes the socket (BEV_OPT_CLOSE_ON_FREE) */
    if (c->rl)
        ev_token_bucket_cfg_free(c->rl);
    c->rl = NULL;
    if (c->seg)
        evbuffer_file_segment_free(c->seg);
    c->seg = NULL;
    if (c->file_fd >= 0)
        close(c->file_fd);
    event_free(c->timer);
    req_clear(&c->req);
    res_clear(&c->res);
    free(c);
}

static void conn_log(hm_conn *c, uint64_t bytes)
{
    hm_reqlog_write(c->srv->log, c->port == HM_PORT_HUB ? "hub" : "cdn", c->req.method,
                    c->req.target, c->req.range, c->res.status, bytes,
                    c->req.authorization != NULL, c->res.fault, c->t0_us,
                    shoal_now_ns() / 1000);
}

/* Queue body bytes up to the next stop (the pause point or the end). */
static void conn_fill(hm_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    uint64_t limit = c->pause_at != HM_NONE ? c->pause_at : c->stop_at;

    while (c->queued < limit && evbuffer_get_length(out) < 2 * HTTP_CHUNK) {
        uint64_t n = limit - c->queued;
        if (n > HTTP_CHUNK)
            n = HTTP_CHUNK;
        if (c->seg)
            evbuffer_add_file_segment(out, c->seg, (ev_off_t)c->queued, (ev_off_t)n);
        else
            evbuffer_add(out, c->res.mem.data + c->queued, (size_t)n);
        c->queued += n;
    }
}

static void conn_pause_done(evutil_socket_t fd, short what, void *arg)
{
    hm_conn *c = arg;
    (void)fd;
    (void)what;
    c->pause_at = HM_NONE;
    c->state = C_SEND;
    conn_fill(c);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        conn_write_cb(c->bev, c);
}

static int conn_open_body(hm_conn *c)
{
    struct stat st;
    c->file_fd = open(c->res.file_path, O_RDONLY | O_CLOEXEC);
    if (c->file_fd < 0 || fstat(c->file_fd, &st) != 0
        || (uint64_t)st.st_size < c->res.file_off + c->res.file_len) {
        LOG_ERROR("hubmock", "cannot serve %s: %s", c->res.file_path,
                  c->file_fd < 0 ? strerror(errno) : "file changed on disk");
        return -1;
    }
    if (c->res.file_len == 0)
        return 0;
    /* libevent's sendfile path writes a whole chain whatever the rate
     * limit allows, so a capped body goes through mmap/read instead. */
    c->seg = evbuffer_file_segment_new(c->file_fd, (ev_off_t)c->res.file_off,
                                       (ev_off_t)c->res.file_len,
                                       c->res.bw > 0 ? EVBUF_FS_DISABLE_SENDFILE : 0);
    return c->seg ? 0 : -1;
}

static void conn_start_send(hm_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    hm_response *r = &c->res;

    if (r->file_path[0] && !c->req.is_head && conn_open_body(c) != 0) {
        conn_body_release(c);
        res_clear(r);
        hm_response_error(r, 500, NULL, "hubmock could not read the file");
    }
    c->body_len = r->file_path[0] ? r->file_len : r->mem.len;
    c->t0_us = shoal_now_ns() / 1000;
    c->stop_at = c->req.is_head ? 0 : c->body_len;
    if (!c->req.is_head && r->cut_after != HM_NONE && r->cut_after < c->body_len)
        c->stop_at = r->cut_after;
    c->pause_at = HM_NONE;
    if (!c->req.is_head && r->stall_mid > 0)
        c->pause_at = c->stop_at / 2;
    c->queued = 0;
    if (r->bw > 0 && !c->req.is_head && c->rl_bw != r->bw) {
        /* Token bucket per 100 ms so a cap shows within a fraction of a second.
         * It stays on the connection for its later requests: a fresh, full
         * bucket per response would let a client that asks for many small
         * ranges on one connection beat the cap (a CDN caps the connection). */
        struct timeval tick = { 0, 100000 };
        size_t per_tick = r->bw / 10 ? (size_t)(r->bw / 10) : 1;
        struct ev_token_bucket_cfg *rl = ev_token_bucket_cfg_new(EV_RATE_LIMIT_MAX,
                                                                 EV_RATE_LIMIT_MAX, per_tick,
                                                                 per_tick, &tick);
        if (rl) {
            bufferevent_set_rate_limit(c->bev, rl);
            if (c->rl)
                ev_token_bucket_cfg_free(c->rl);
            c->rl = rl;
            c->rl_bw = r->bw;
        }
    } else if (r->bw == 0 && c->rl && !c->req.is_head) {
        bufferevent_set_rate_limit(c->bev, NULL);    /* the cap was cleared */
        ev_token_bucket_cfg_free(c->rl);
        c->rl = NULL;
        c->rl_bw = 0;
    }
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", r->status, status_reason(r->status));
    if (r->headers.len)
        evbuffer_add(out, r->headers.data, r->headers.len);
    evbuffer_add_printf(out, "Content-Length: %llu\r\nConnection: %s\r\n\r\n",
                        (unsigned long long)c->body_len, c->keep_alive ? "keep-alive" : "close");
    c->state = C_SEND;
    conn_fill(c);
}

static void conn_stall_done(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    conn_start_send(arg);
}

/* Parse one request from the input; 1 if one was taken, 0 if more bytes are
 * needed, -1 if the connection must close (an answer may be queued). */
static int conn_parse(hm_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, NULL);
    char *head, *line, *next, *sp1, *sp2;
    uint64_t body = 0;
    int http10 = 0, conn_close = 0, conn_keep = 0;

    if (end.pos < 0)
        return evbuffer_get_length(in) > HTTP_MAX_HEADER ? -1 : 0;
    if ((size_t)end.pos > HTTP_MAX_HEADER)
        return -1;
    head = malloc((size_t)end.pos + 1);
    if (!head)
        return -1;
    evbuffer_copyout(in, head, (size_t)end.pos);
    head[end.pos] = '\0';

    req_clear(&c->req);
    c->req.port = c->port;
    line = head;
    next = strstr(line, "\r\n");
    if (next) {
        *next = '\0';
        next += 2;
    }
    sp1 = strchr(line, ' ');
    sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp2 || (size_t)(sp1 - line) >= sizeof c->req.method || strncmp(sp2 + 1, "HTTP/1.", 7) != 0) {
        free(head);
        return -1;
    }
    memcpy(c->req.method, line, (size_t)(sp1 - line));
    c->req.method[sp1 - line] = '\0';
    http10 = strcmp(sp2 + 1, "HTTP/1.0") == 0;
    c->req.target = strndup(sp1 + 1, (size_t)(sp2 - sp1 - 1));
    while ((line = next) != NULL) {
        char *colon, *v;
        next = strstr(line, "\r\n");
        if (next) {
            *next = '\0';
            next += 2;
        }
        colon = strchr(line, ':');
        if (!colon)
            continue;
        *colon = '\0';
        for (v = colon + 1; *v == ' ' || *v == '\t'; v++)
            ;
        if (strcasecmp(line, "range") == 0 && !c->req.range)
            c->req.range = strdup(v);
        else if (strcasecmp(line, "authorization") == 0 && !c->req.authorization)
            c->req.authorization = strdup(v);
        else if (strcasecmp(line, "content-length") == 0)
            body = strtoull(v, NULL, 10);
        else if (strcasecmp(line, "connection") == 0) {
            conn_close |= strcasestr(v, "close") != NULL;
            conn_keep |= strcasestr(v, "keep-alive") != NULL;
        }
    }
    free(head);
    if (body > HTTP_MAX_REQBODY)
        return -1;
    if (evbuffer_get_length(in) < (size_t)end.pos + 4 + body)
        return 0;   /* re-parsed when the body has arrived */
    evbuffer_drain(in, (size_t)end.pos + 4 + body);
    c->keep_alive = http10 ? conn_keep : !conn_close;
    c->req.is_head = strcmp(c->req.method, "HEAD") == 0;
    if (!c->req.target)
        return -1;
    {
        char *q = strchr(c->req.target, '?');
        size_t plen = q ? (size_t)(q - c->req.target) : strlen(c->req.target);
        c->req.path = strndup(c->req.target, plen);
        c->req.query = strdup(q ? q + 1 : "");
    }
    return c->req.path && c->req.query ? 1 : -1;
}

static void conn_dispatch(hm_conn *c)
{
    hm_response *r = &c->res;
    int control = 0;

    res_clear(r);
    if (strcmp(c->req.method, "GET") != 0 && strcmp(c->req.method, "HEAD") != 0
        && strcmp(c->req.method, "POST") != 0) {
        hm_response_error(r, 405, NULL, "method %s not allowed", c->req.method);
    } else if (c->port == HM_PORT_HUB) {
        control = hm_hub_handle(c->srv, &c->req, r);
    } else {
        hm_cdn_handle(c->srv, &c->req, r);
    }
    if (control)
        r->fault[0] = '\0';
    if (r->stall_before > 0) {
        struct timeval tv;
        tv.tv_sec = (time_t)r->stall_before;
        tv.tv_usec = (suseconds_t)((r->stall_before - (double)tv.tv_sec) * 1e6);
        c->state = C_WAIT;
        evtimer_assign(c->timer, c->srv->base, conn_stall_done, c);
        evtimer_add(c->timer, &tv);
        return;
    }
    conn_start_send(c);
}

/* The response is fully handed to the kernel: log it and go on. */
static void conn_finish(hm_conn *c)
{
    int cut = c->stop_at < c->body_len;
    int reset = cut && c->res.cut_reset;
    int keep = c->keep_alive && !cut;

    if (c->req.target && strncmp(c->req.path, "/_mock/", 7) != 0)
        conn_log(c, c->queued);
    if (!keep) {
        conn_free(c, reset);
        return;
    }
    conn_body_release(c);
    res_clear(&c->res);
    req_clear(&c->req);
    c->state = C_READ;
    conn_read_cb(c->bev, c);
}

static void conn_write_cb(struct bufferevent *bev, void *arg)
{
    hm_conn *c = arg;
    (void)bev;
    if (c->state != C_SEND)
        return;
    conn_fill(c);
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) != 0)
        return;
    if (c->pause_at != HM_NONE && c->queued == c->pause_at) {
        struct timeval tv;
        tv.tv_sec = (time_t)c->res.stall_mid;
        tv.tv_usec = (suseconds_t)((c->res.stall_mid - (double)tv.tv_sec) * 1e6);
        c->state = C_PAUSE;
        evtimer_assign(c->timer, c->srv->base, conn_pause_done, c);
        evtimer_add(c->timer, &tv);
        return;
    }
    if (c->queued == c->stop_at)
        conn_finish(c);
}

static void conn_read_cb(struct bufferevent *bev, void *arg)
{
    hm_conn *c = arg;
    int rc;
    (void)bev;
    if (c->state != C_READ)
        return;
    rc = conn_parse(c);
    if (rc < 0) {
        conn_free(c, 0);
        return;
    }
    if (rc == 1)
        conn_dispatch(c);
}

static void conn_event_cb(struct bufferevent *bev, short what, void *arg)
{
    hm_conn *c = arg;
    (void)bev;
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    if (c->state != C_READ && c->req.target && strncmp(c->req.path, "/_mock/", 7) != 0) {
        /* The client went away mid-answer: log what it got. */
        size_t left = evbuffer_get_length(bufferevent_get_output(c->bev));
        hm_response_fault(&c->res, "client_closed");
        conn_log(c, c->queued > left ? c->queued - left : 0);
    }
    conn_free(c, 0);
}

static void conn_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                        int salen, void *arg)
{
    hm_server *s = arg;
    hm_conn *c = calloc(1, sizeof *c);
    (void)sa;
    (void)salen;
    if (!c) {
        close(fd);
        return;
    }
    c->srv = s;
    c->port = evconnlistener_get_fd(l) == evconnlistener_get_fd(s->listeners[HM_PORT_HUB])
                  ? HM_PORT_HUB : HM_PORT_CDN;
    c->file_fd = -1;
    res_init(&c->res);
    c->bev = bufferevent_socket_new(s->base, fd, BEV_OPT_CLOSE_ON_FREE);
    c->timer = evtimer_new(s->base, conn_stall_done, c);
    if (!c->bev || !c->timer) {
        if (c->bev)
            bufferevent_free(c->bev);
        else
            close(fd);
        if (c->timer)
            event_free(c->timer);
        free(c);
        return;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    bufferevent_setcb(c->bev, conn_read_cb, conn_write_cb, conn_event_cb, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

int hm_http_listen(hm_server *s, hm_port which, int port, int *bound, shoal_err *err)
{
    struct sockaddr_in sin;
    socklen_t len = sizeof sin;
    struct evconnlistener *l;

    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sin.sin_port = htons((uint16_t)port);
    l = evconnlistener_new_bind(s->base, conn_accept, s,
                                LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_CLOSE_ON_EXEC,
                                128, (struct sockaddr *)&sin, sizeof sin);
    if (!l)
        return shoal_err_set(err, SHOAL_ENET, "cannot listen on 127.0.0.1:%d: %s", port,
                             strerror(errno));
    s->listeners[which] = l;
    if (getsockname(evconnlistener_get_fd(l), (struct sockaddr *)&sin, &len) != 0)
        return shoal_err_set(err, SHOAL_ENET, "getsockname: %s", strerror(errno));
    *bound = ntohs(sin.sin_port);
    return 0;
}

void hm_http_shutdown(hm_server *s)
{
    while (s->conns)
        conn_free(s->conns, 0);
    for (int i = 0; i < 2; i++) {
        if (s->listeners[i])
            evconnlistener_free(s->listeners[i]);
        s->listeners[i] = NULL;
    }
}
