/* http.c — a small HTTP/1.1 server on bufferevents, with body faults.
 *
 * Owns: listening sockets, connections, request parsing (request line and
 * headers; request bodies are read and dropped), sending a response with its
 * Content-Length, streaming bodies, keep-alive, and the body faults a
 * handler asked for: a delay before the answer (stall, latency, hub_stall),
 * stall mid-body, stop after N bytes with a clean close (truncation) or a
 * TCP reset, one byte every N seconds (drip), changed bytes (corrupt), and
 * a per-connection bandwidth cap (libevent token bucket, 100 ms ticks).
 * Does not own routing (hub.c, cdn.c) or deciding faults (the handlers).
 *
 * Bodies: files on disk go out with sendfile (file segments) unless a fault
 * must see or pace the bytes; then they are pread, as synthesized files are
 * generated (synth_read), in GEN_CHUNK pieces as the connection drains, with
 * at most GEN_QUEUE + GEN_CHUNK bytes queued: a connection holds at most
 * 3 MiB of body whatever the file size (plus the kernel's socket buffer).
 *
 * One connection answers one request at a time; pipelined requests wait in
 * the input buffer.  Connection states:
 *
 *   READ --request--> [WAIT (delay)] --> SEND <--> PAUSE (stall mid)
 *                                        SEND <--> DRIP (a byte per tick)
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
#define HTTP_CHUNK       (4u << 20)   /* file-segment bytes queued per refill */
#define GEN_CHUNK        (1u << 20)   /* bytes read or generated per refill */
#define GEN_QUEUE        (2u << 20)   /* refill while less than this is queued */

typedef enum { C_READ, C_WAIT, C_SEND, C_PAUSE, C_DRIP } conn_state;

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
    r->body = HM_BODY_MEM;
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

/* The byte of body offset `pos` that corrupt_mode=drift changes in the
 * request numbered seq, and how: both move from one request to the next. */
static uint64_t drift_pos(uint64_t seq, uint64_t body_len)
{
    uint64_t z = (seq + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ULL;
    return body_len ? (z ^ (z >> 29)) % body_len : 0;
}

static void corrupt_apply(const hm_conn *c, uint64_t boff, size_t n, uint8_t *p)
{
    const hm_response *r = &c->res;
    uint64_t pos;

    switch (r->corrupt) {
    case HM_CORRUPT_ALL:
        for (size_t i = 0; i < n; i++)
            p[i] ^= 0xFF;
        return;
    case HM_CORRUPT_ONE:
        pos = c->body_len / 2;
        if (pos >= boff && pos - boff < n)
            p[pos - boff] ^= 0xFF;
        return;
    case HM_CORRUPT_DRIFT:
        pos = drift_pos(r->corrupt_seq, c->body_len);
        if (pos >= boff && pos - boff < n)
            p[pos - boff] ^= (uint8_t)(1 + r->corrupt_seq % 255);
        return;
    default:
        return;
    }
}

/* Body bytes [boff, boff+n) into p, as the faults want them.  0 or -1. */
static int body_read(hm_conn *c, uint64_t boff, size_t n, uint8_t *p)
{
    const hm_response *r = &c->res;
    int rc = 0;

    if (r->body == HM_BODY_FILE)
        rc = shoal_pread_all(c->file_fd, p, n, (off_t)(r->file_off + boff));
    else if (r->body == HM_BODY_SYNTH)
        rc = synth_read(r->synth, r->synth_file, r->file_off + boff, n, p);
    else
        memcpy(p, r->mem.data + boff, n);
    if (rc) {
        LOG_ERROR("hubmock", "reading the body of %s: %s", c->req.target, shoal_strerror(rc));
        return -1;
    }
    corrupt_apply(c, boff, n, p);
    return 0;
}

/* Append n body bytes at c->queued to the output.  0 or -1. */
static int conn_add(hm_conn *c, size_t n)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    struct evbuffer_iovec v;

    if (evbuffer_reserve_space(out, (ev_ssize_t)n, &v, 1) < 1 || v.iov_len < n ||
        body_read(c, c->queued, n, v.iov_base) != 0)
        return -1;
    v.iov_len = n;
    if (evbuffer_commit_space(out, &v, 1) != 0)
        return -1;
    c->queued += n;
    return 0;
}

/* Queue body bytes up to the next stop (the pause point or the end).
 * -1 if the body cannot be read (the connection must be dropped). */
static int conn_fill(hm_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    uint64_t limit = c->pause_at != HM_NONE ? c->pause_at : c->stop_at;

    while (c->seg && c->queued < limit && evbuffer_get_length(out) < 2 * HTTP_CHUNK) {
        uint64_t n = limit - c->queued < HTTP_CHUNK ? limit - c->queued : HTTP_CHUNK;
        evbuffer_add_file_segment(out, c->seg, (ev_off_t)c->queued, (ev_off_t)n);
        c->queued += n;
    }
    while (!c->seg && c->queued < limit && evbuffer_get_length(out) < GEN_QUEUE) {
        uint64_t n = limit - c->queued < GEN_CHUNK ? limit - c->queued : GEN_CHUNK;
        if (conn_add(c, (size_t)n) != 0)
            return -1;
    }
    return 0;
}

static void conn_pause_done(evutil_socket_t fd, short what, void *arg)
{
    hm_conn *c = arg;
    (void)fd;
    (void)what;
    c->pause_at = HM_NONE;
    c->state = C_SEND;
    if (conn_fill(c) != 0) {
        conn_free(c, 1);
        return;
    }
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        conn_write_cb(c->bev, c);
}

static void timer_in(hm_conn *c, double secs, event_callback_fn fn)
{
    struct timeval tv;
    tv.tv_sec = (time_t)secs;
    tv.tv_usec = (suseconds_t)((secs - (double)tv.tv_sec) * 1e6);
    evtimer_assign(c->timer, c->srv->base, fn, c);
    evtimer_add(c->timer, &tv);
}

/* drip: one more body byte, then wait again (or finish as usual). */
static void conn_drip(evutil_socket_t fd, short what, void *arg)
{
    hm_conn *c = arg;
    (void)fd;
    (void)what;
    if (conn_add(c, 1) != 0) {
        conn_free(c, 1);
        return;
    }
    if (c->queued < c->stop_at)
        timer_in(c, c->res.drip, conn_drip);
    else
        c->state = C_SEND;      /* conn_write_cb finishes once it drained */
}

static int conn_open_body(hm_conn *c)
{
    struct stat st;
    if (c->res.body == HM_BODY_SYNTH) {
        if (c->res.file_off + c->res.file_len > synth_file_size(c->res.synth, c->res.synth_file))
            return -1;
        return 0;
    }
    if (c->res.body != HM_BODY_FILE)
        return 0;
    c->file_fd = open(c->res.file_path, O_RDONLY | O_CLOEXEC);
    if (c->file_fd < 0 || fstat(c->file_fd, &st) != 0
        || (uint64_t)st.st_size < c->res.file_off + c->res.file_len) {
        LOG_ERROR("hubmock", "cannot serve %s: %s", c->res.file_path,
                  c->file_fd < 0 ? strerror(errno) : "file changed on disk");
        return -1;
    }
    if (c->res.file_len == 0 || c->res.corrupt || c->res.drip > 0)
        return 0;               /* these bodies are pread: the faults see the bytes */
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

    if (r->body != HM_BODY_MEM && !c->req.is_head && conn_open_body(c) != 0) {
        conn_body_release(c);
        res_clear(r);
        hm_response_error(r, 500, NULL, "hubmock could not read the file");
    }
    c->body_len = r->body != HM_BODY_MEM ? r->file_len : r->mem.len;
    c->t0_us = shoal_now_ns() / 1000;
    c->stop_at = c->req.is_head ? 0 : c->body_len;
    if (!c->req.is_head && r->cut_after != HM_NONE && r->cut_after < c->body_len)
        c->stop_at = r->cut_after;
    c->pause_at = HM_NONE;
    if (!c->req.is_head && r->stall_mid > 0 && r->drip <= 0)
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
    if (r->drip > 0 && c->stop_at > 0) {
        c->state = C_DRIP;
        timer_in(c, r->drip, conn_drip);
        return;
    }
    c->state = C_SEND;
    if (conn_fill(c) != 0)
        conn_free(c, 1);
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
    else
        hm_faults_every(c->srv, c->port, r);
    if (r->stall_before > 0) {
        c->state = C_WAIT;
        timer_in(c, r->stall_before, conn_stall_done);
        return;
    }
    conn_start_send(c);
}

/* The response is fully handed to the kernel: log it and go on. */
static void conn_finish(hm_conn *c)
{
    int cut = !c->req.is_head && c->stop_at < c->body_len;   /* a HEAD sends no body */
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
    if (conn_fill(c) != 0) {
        conn_free(c, 1);
        return;
    }
    if (evbuffer_get_length(bufferevent_get_output(c->bev)) != 0)
        return;
    if (c->pause_at != HM_NONE && c->queued == c->pause_at) {
        c->state = C_PAUSE;
        timer_in(c, c->res.stall_mid, conn_pause_done);
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
