/* client.c — shoald client: connection, request ids, reply demultiplexing.
 *
 * Replies come in any order.  GET items go to a FIFO that
 * shoal_client_next() drains; a control call sends its request and reads
 * until the reply with its id arrives, queueing any GET items on the way.
 * PROGRESS frames are consumed on the way too (handed to the progress
 * callback): each message received starts the call's timeout afresh, so a
 * long call whose work advances never times out.
 */
#include "common/client.h"
#include "common/path.h"
#include "common/platform.h"
#include "common/version.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define CLIENT_QUEUE_MAX 65536   /* items waiting; a runaway daemon is an error */
#define CLIENT_JSON_MAX (256u << 20)   /* one JSON reply, all its frames */

struct shoal_client {
    int         sock;
    uint64_t    next_id;
    uint64_t    session;
    char        daemon_version[64];
    int         call_timeout_ms;
    int         dead;            /* the connection failed: every call fails */
    uint16_t    reply_flags;     /* of the last reply a call took */
    shoal_item *queue;           /* FIFO of received GET items */
    size_t      q_head, q_len, q_cap;
    shoal_buf   body;
    shoal_msg_builder msg;
    char        where[SHOAL_PATH_MAX];
    shoal_progress_fn on_progress;
    void       *progress_ctx;
};

/* ---- item queue ------------------------------------------------------------ */

static int queue_push(shoal_client *c, const shoal_item *it)
{
    if (c->q_len == c->q_cap) {
        size_t ncap = c->q_cap ? c->q_cap * 2 : 64;
        shoal_item *nq;
        if (ncap > CLIENT_QUEUE_MAX)
            return SHOAL_ETOOBIG;
        nq = malloc(ncap * sizeof *nq);
        if (!nq)
            return SHOAL_ENOMEM;
        for (size_t i = 0; i < c->q_len; i++)
            nq[i] = c->queue[(c->q_head + i) % c->q_cap];
        free(c->queue);
        c->queue = nq;
        c->q_cap = ncap;
        c->q_head = 0;
    }
    c->queue[(c->q_head + c->q_len) % c->q_cap] = *it;
    c->q_len++;
    return 0;
}

static int queue_pop(shoal_client *c, shoal_item *out)
{
    if (c->q_len == 0)
        return 0;
    *out = c->queue[c->q_head];
    c->q_head = (c->q_head + 1) % c->q_cap;
    c->q_len--;
    return 1;
}

/* ---- receiving ------------------------------------------------------------- */

static int client_fail(shoal_client *c, int rc, shoal_err *err)
{
    c->dead = 1;
    if (rc == SHOAL_ENET)
        return shoal_err_set(err, SHOAL_ENET,
                             "shoald closed the connection (%s): it may have stopped; check its log",
                             c->where);
    return shoal_err_wrap(err, rc, "talking to shoald (%s)", c->where);
}

static int decode_item(const shoal_msg_header *h, shoal_msg_reader *r, int fd, shoal_item *it)
{
    const uint8_t *sum;
    memset(it, 0, sizeof *it);
    it->request = h->id;
    it->last = (h->flags & SHOAL_MSG_F_LAST) != 0;
    it->index = shoal_rd_u16(r);
    it->status = shoal_rd_i32(r);
    it->source = shoal_rd_u8(r);
    it->offset = shoal_rd_u64(r);
    it->length = shoal_rd_u64(r);
    sum = shoal_rd_bytes(r, 16);
    if (sum)
        memcpy(it->xxh128, sum, 16);
    it->fd = fd;
    if (shoal_rd_finish(r))
        return SHOAL_EPROTO;
    if ((it->status == 0) != (fd >= 0) || it->status > 0)
        return SHOAL_EPROTO;
    return 0;
}

/* A PROGRESS frame: to the callback.  0, or EPROTO for a malformed one. */
static int progress_frame(shoal_client *c, const shoal_msg_header *h, int fd)
{
    shoal_msg_reader r;
    shoal_progress p;
    if (fd >= 0 || (h->flags & SHOAL_MSG_F_LAST))
        return SHOAL_EPROTO;
    memset(&p, 0, sizeof p);
    p.request = h->id;
    shoal_rd_init(&r, c->body.data, c->body.len);
    p.done = shoal_rd_u64(&r);
    p.total = shoal_rd_u64(&r);
    shoal_rd_str_copy(&r, p.phase, sizeof p.phase);
    if (shoal_rd_finish(&r))
        return SHOAL_EPROTO;
    if (c->on_progress)
        c->on_progress(&p, c->progress_ctx);
    return 0;
}

/* Receive one message.  GET items (and ERROR replies to GETs, which end
 * that GET) are queued and *queued set, PROGRESS frames consumed (*queued
 * set too); anything else is left in c->body with its header in *h and
 * descriptor in *fd. */
static int client_recv(shoal_client *c, int timeout_ms, shoal_msg_header *h, int *fd,
                       int *queued, shoal_err *err)
{
    shoal_msg_reader r;
    shoal_item it;
    int rc;

    *queued = 0;
    *fd = -1;
    if (c->dead)
        return shoal_err_set(err, SHOAL_ENET, "connection to shoald (%s) is closed", c->where);
    rc = shoal_msg_recv(c->sock, h, &c->body, fd, timeout_ms, err);
    if (rc == SHOAL_ETIMEOUT)
        return rc;
    if (rc)
        return client_fail(c, rc, err);
    if (h->type == SHOAL_MSG_PROGRESS) {
        if (progress_frame(c, h, *fd) != 0) {
            if (*fd >= 0)
                close(*fd);
            *fd = -1;
            return client_fail(c, SHOAL_EPROTO, err);
        }
        *queued = 1;
        return 0;
    }
    if (h->type != SHOAL_MSG_GET_ITEM)
        return 0;
    shoal_rd_init(&r, c->body.data, c->body.len);
    rc = decode_item(h, &r, *fd, &it);
    if (!rc)
        rc = queue_push(c, &it);
    if (rc) {
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return client_fail(c, rc == SHOAL_EPROTO ? SHOAL_EPROTO : rc, err);
    }
    *fd = -1;
    *queued = 1;
    return 0;
}

/* The ERROR body (code, message) into err. */
static int error_reply(shoal_client *c, shoal_err *err)
{
    shoal_msg_reader r;
    char msg[SHOAL_ERR_MSG_MAX];
    int32_t code;
    shoal_rd_init(&r, c->body.data, c->body.len);
    code = shoal_rd_i32(&r);
    shoal_rd_str_copy(&r, msg, sizeof msg);
    if (shoal_rd_finish(&r) || code >= 0)
        return client_fail(c, SHOAL_EPROTO, err);
    return shoal_err_set(err, code, "shoald: %s", msg);
}

/* Send the message in c->msg and wait for the reply to it, of type `want`.
 * On success the reply body is in c->body and its descriptor in *fd_out
 * (if fd_out is NULL a descriptor is an error). */
/* Send the built request (with pass_fd attached when >= 0) and wait for
 * its reply of type `want`. */
static int client_call_fd(shoal_client *c, uint16_t want, int pass_fd, int *fd_out,
                          shoal_err *err)
{
    uint64_t id = c->next_id - 1;   /* begin() took it (HELLO: 0) */
    int rc = shoal_msg_end(&c->msg);
    if (rc)
        return shoal_err_set(err, rc, "request too large");
    if (c->dead)
        return shoal_err_set(err, SHOAL_ENET, "connection to shoald (%s) is closed", c->where);
    rc = shoal_msg_send(c->sock, c->msg.buf.data, c->msg.buf.len, pass_fd);
    if (rc)
        return client_fail(c, rc == SHOAL_EIO ? SHOAL_ENET : rc, err);
    for (;;) {
        shoal_msg_header h;
        int fd, queued;
        rc = client_recv(c, c->call_timeout_ms, &h, &fd, &queued, err);
        if (rc == SHOAL_ETIMEOUT)
            return shoal_err_set(err, rc, "shoald did not answer within %d ms", c->call_timeout_ms);
        if (rc)
            return rc;
        if (queued)
            continue;
        if (h.id != id) {
            if (fd >= 0)
                close(fd);
            return client_fail(c, SHOAL_EPROTO, err);
        }
        if (h.type == SHOAL_MSG_ERROR) {
            if (fd >= 0)
                close(fd);
            return error_reply(c, err);
        }
        if (h.type != want || (fd >= 0 && !fd_out)) {
            if (fd >= 0)
                close(fd);
            return client_fail(c, SHOAL_EPROTO, err);
        }
        if (fd_out)
            *fd_out = fd;
        c->reply_flags = h.flags;
        return 0;
    }
}

static int client_call(shoal_client *c, uint16_t want, int *fd_out, shoal_err *err)
{
    return client_call_fd(c, want, -1, fd_out, err);
}

static void begin(shoal_client *c, uint16_t type)
{
    shoal_msg_begin(&c->msg, type, 0, c->next_id++);
}

static int json_call(shoal_client *c, shoal_buf *out, shoal_err *err);

/* ---- connect ---------------------------------------------------------------- */

static int client_hello(shoal_client *c, const char *name, int timeout_ms, shoal_err *err)
{
    shoal_msg_reader r;
    uint16_t version;
    int rc, saved = c->call_timeout_ms;

    shoal_msg_begin(&c->msg, SHOAL_MSG_HELLO, 0, 0);
    shoal_msg_put_u16(&c->msg, SHOAL_PROTO_VERSION);
    shoal_msg_put_str(&c->msg, name, strlen(name));
    shoal_msg_put_u32(&c->msg, (uint32_t)getpid());
    c->call_timeout_ms = timeout_ms;
    rc = client_call(c, SHOAL_MSG_HELLO_OK, NULL, err);
    c->call_timeout_ms = saved;
    if (rc)
        return rc;
    shoal_rd_init(&r, c->body.data, c->body.len);
    version = shoal_rd_u16(&r);
    shoal_rd_str_copy(&r, c->daemon_version, sizeof c->daemon_version);
    c->session = shoal_rd_u64(&r);
    shoal_rd_u32(&r);   /* the daemon's body limit: ours is the same constant */
    if (shoal_rd_finish(&r))
        return client_fail(c, SHOAL_EPROTO, err);
    if (version != SHOAL_PROTO_VERSION)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "shoald speaks protocol %u, this client %u: use matching versions",
                             version, SHOAL_PROTO_VERSION);
    return 0;
}

int shoal_client_connect(const shoal_client_opts *opts, shoal_client **out, shoal_err *err)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    shoal_client *c;
    int rc, n;

    *out = NULL;
    c = calloc(1, sizeof *c);
    if (!c)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    c->sock = -1;
    c->next_id = 1;
    c->call_timeout_ms = opts->call_timeout_ms ? opts->call_timeout_ms : 60000;
    shoal_buf_init(&c->body, 0);
    if (opts->socket_path)
        n = snprintf(c->where, sizeof c->where, "%s", opts->socket_path);
    else
        n = snprintf(c->where, sizeof c->where, "%s/shoald.sock", opts->home ? opts->home : ".");
    if (n < 0 || (size_t)n >= sizeof sa.sun_path) {
        rc = shoal_err_set(err, SHOAL_ETOOBIG, "socket path too long for a Unix socket: %s", c->where);
        goto fail;
    }
    memcpy(sa.sun_path, c->where, (size_t)n + 1);
    c->sock = shoal_socket(AF_UNIX, SOCK_STREAM, 0, 0);
    if (c->sock < 0) {
        rc = shoal_err_set(err, shoal_err_from_errno(errno), "socket: %s", strerror(errno));
        goto fail;
    }
    if (connect(c->sock, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        if (e == ENOENT || e == ECONNREFUSED)
            rc = shoal_err_set(err, SHOAL_ENET,
                               "shoald is not running (nothing listens on %s); start it with "
                               "`shoald --home %s --detach`", c->where,
                               opts->home ? opts->home : "DIR");
        else
            rc = shoal_err_set(err, shoal_err_from_errno(e), "connect %s: %s", c->where, strerror(e));
        goto fail;
    }
    rc = client_hello(c, opts->name ? opts->name : "shoal-client",
                      opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 2000, err);
    if (rc)
        goto fail;
    *out = c;
    return 0;
fail:
    shoal_client_close(c);
    return rc;
}

void shoal_client_close(shoal_client *c)
{
    shoal_item it;
    if (!c)
        return;
    while (queue_pop(c, &it))
        if (it.fd >= 0)
            close(it.fd);
    free(c->queue);
    if (c->sock >= 0)
        close(c->sock);
    shoal_buf_free(&c->body);
    shoal_msg_builder_free(&c->msg);
    free(c);
}

uint64_t shoal_client_session(const shoal_client *c) { return c->session; }

void shoal_client_on_progress(shoal_client *c, shoal_progress_fn fn, void *ctx)
{
    c->on_progress = fn;
    c->progress_ctx = ctx;
}
const char *shoal_client_daemon_version(const shoal_client *c) { return c->daemon_version; }

/* ---- operations --------------------------------------------------------------- */

int shoal_client_open(shoal_client *c, const char *model, shoal_model_info *out, shoal_err *err)
{
    shoal_msg_reader r;
    int fd = -1, rc;

    memset(out, 0, sizeof *out);
    out->manifest_fd = -1;
    begin(c, SHOAL_MSG_OPEN);
    shoal_msg_put_str(&c->msg, model, strlen(model));
    rc = client_call(c, SHOAL_MSG_OPEN_OK4, &fd, err);
    if (rc)
        return rc;
    shoal_rd_init(&r, c->body.data, c->body.len);
    out->handle = shoal_rd_u32(&r);
    shoal_rd_str_copy(&r, out->commit, sizeof out->commit);
    out->manifest_len = shoal_rd_u64(&r);
    out->layers = shoal_rd_u16(&r);
    out->experts_per_layer = shoal_rd_u32(&r);
    out->expert_bytes = shoal_rd_u64(&r);
    out->upstream = shoal_rd_u8(&r);
    if (shoal_rd_finish(&r)) {
        if (fd >= 0)
            close(fd);
        return client_fail(c, SHOAL_EPROTO, err);
    }
    out->manifest_fd = fd;
    return 0;
}

int shoal_client_release(shoal_client *c, uint32_t handle, shoal_err *err)
{
    begin(c, SHOAL_MSG_RELEASE);
    shoal_msg_put_u32(&c->msg, handle);
    return client_call(c, SHOAL_MSG_OK, NULL, err);
}

static int put_keys(shoal_client *c, const shoal_key *keys, size_t n, shoal_err *err)
{
    if (n == 0 || n > SHOAL_PROTO_MAX_KEYS)
        return shoal_err_set(err, SHOAL_EINVAL, "a request carries 1..%d keys, not %zu",
                             SHOAL_PROTO_MAX_KEYS, n);
    shoal_msg_put_u16(&c->msg, (uint16_t)n);
    for (size_t i = 0; i < n; i++)
        shoal_msg_put_key(&c->msg, &keys[i]);
    return 0;
}

int shoal_client_get_send(shoal_client *c, uint32_t handle, int priority,
                          const shoal_key *keys, size_t n, uint64_t *request, shoal_err *err)
{
    int rc;
    *request = c->next_id;
    begin(c, SHOAL_MSG_GET);
    shoal_msg_put_u32(&c->msg, handle);
    shoal_msg_put_u8(&c->msg, (uint8_t)priority);
    rc = put_keys(c, keys, n, err);
    if (rc)
        return rc;
    rc = shoal_msg_end(&c->msg);
    if (rc)
        return shoal_err_set(err, rc, "GET request too large");
    if (c->dead)
        return shoal_err_set(err, SHOAL_ENET, "connection to shoald (%s) is closed", c->where);
    rc = shoal_msg_send(c->sock, c->msg.buf.data, c->msg.buf.len, -1);
    return rc ? client_fail(c, rc, err) : 0;
}

/* Bytes waiting on the socket (or a dead connection, which next() reports)? */
static int sock_readable(shoal_client *c)
{
    struct pollfd pfd = { c->sock, POLLIN, 0 };
    int r;
    if (c->dead)
        return 1;
    do {
        r = poll(&pfd, 1, 0);
    } while (r < 0 && errno == EINTR);
    return r != 0;
}

/* next() and poll_item(): nonblock returns 1 instead of waiting for a
 * message that has not started arriving. */
static int next_item(shoal_client *c, int timeout_ms, int nonblock, shoal_item *out,
                     shoal_err *err)
{
    for (;;) {
        shoal_msg_header h;
        int fd, queued, rc;
        if (queue_pop(c, out))
            return 0;
        if (nonblock && !sock_readable(c))
            return 1;
        rc = client_recv(c, timeout_ms, &h, &fd, &queued, err);
        if (rc == SHOAL_ETIMEOUT)
            return shoal_err_set(err, rc, "no reply from shoald within %d ms", timeout_ms);
        if (rc)
            return rc;
        if (queued)
            continue;
        if (fd >= 0)
            close(fd);
        if (h.type == SHOAL_MSG_ERROR) {
            /* The whole GET failed (bad handle, ...): one item that ends it. */
            shoal_err e = { 0 };
            error_reply(c, &e);
            memset(out, 0, sizeof *out);
            out->request = h.id;
            out->index = UINT16_MAX;
            out->status = e.code ? e.code : SHOAL_EPROTO;
            out->last = 1;
            out->fd = -1;
            shoal_err_set(err, out->status, "%s", e.msg);
            return 0;
        }
        if (h.type == SHOAL_MSG_OK)   /* a late CANCEL acknowledgement */
            continue;
        return client_fail(c, SHOAL_EPROTO, err);
    }
}

int shoal_client_next(shoal_client *c, int timeout_ms, shoal_item *out, shoal_err *err)
{
    return next_item(c, timeout_ms, 0, out, err);
}

int shoal_client_poll_item(shoal_client *c, shoal_item *out, shoal_err *err)
{
    return next_item(c, c->call_timeout_ms, 1, out, err);
}

int shoal_item_map(const shoal_item *it, int populate, shoal_view *out, shoal_err *err)
{
    long page = sysconf(_SC_PAGESIZE);
    uint64_t start;
    void *p;

    memset(out, 0, sizeof *out);
    if (it->status != 0 || it->fd < 0 || it->length == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "item %u has no bytes to map (status %d)",
                             it->index, it->status);
    if (page <= 0)
        page = 4096;
    start = it->offset / (uint64_t)page * (uint64_t)page;
    if (it->offset + it->length < it->offset || it->offset - start + it->length > SIZE_MAX)
        return shoal_err_set(err, SHOAL_ERANGE, "item %u: range too large to map", it->index);
    out->maplen = (size_t)(it->offset - start + it->length);
    p = mmap(NULL, out->maplen, PROT_READ, MAP_SHARED | (populate ? SHOAL_MAP_POPULATE : 0), it->fd,
             (off_t)start);
    if (p == MAP_FAILED) {
        int e = errno;
        out->maplen = 0;
        return shoal_err_set(err, shoal_err_from_errno(e), "mapping item %u: %s", it->index,
                             strerror(e));
    }
    out->base = p;
    out->data = (const uint8_t *)p + (it->offset - start);
    out->length = it->length;
    return 0;
}

void shoal_item_release(shoal_item *it, shoal_view *v)
{
    if (v && v->base) {
        munmap(v->base, v->maplen);
        memset(v, 0, sizeof *v);
    }
    if (it && it->fd >= 0) {
        close(it->fd);
        it->fd = -1;
    }
}

int shoal_client_cancel(shoal_client *c, uint64_t request, shoal_err *err)
{
    begin(c, SHOAL_MSG_CANCEL);
    shoal_msg_put_u64(&c->msg, request);
    return client_call(c, SHOAL_MSG_OK, NULL, err);
}

int shoal_client_get(shoal_client *c, uint32_t handle, int priority, const shoal_key *keys,
                     size_t n, shoal_item_fn fn, void *ctx, shoal_err *err)
{
    shoal_item *other = NULL;   /* items of other GETs in flight: kept for next() */
    size_t got = 0, nother = 0, cap = 0;
    uint64_t req;
    int rc = shoal_client_get_send(c, handle, priority, keys, n, &req, err);

    while (rc == 0 && got < n) {
        shoal_item it;
        rc = shoal_client_next(c, c->call_timeout_ms, &it, err);
        if (rc)
            break;
        if (it.request != req) {
            if (nother == cap) {
                size_t nc = cap ? cap * 2 : 16;
                shoal_item *p = realloc(other, nc * sizeof *p);
                if (!p) {
                    if (it.fd >= 0)
                        close(it.fd);
                    rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
                    break;
                }
                other = p;
                cap = nc;
            }
            other[nother++] = it;
            continue;
        }
        if (it.index == UINT16_MAX) {
            rc = it.status;
            break;
        }
        fn(&it, ctx);
        got++;
    }
    for (size_t i = 0; i < nother; i++) {
        if (queue_push(c, &other[i]) != 0 && other[i].fd >= 0)
            close(other[i].fd);
    }
    free(other);
    return rc;
}

/* WARM's body for a selection (its byte may carry SHOAL_WARM_F_* flags). */
static void warm_body(shoal_client *c, uint32_t handle, int selection, uint32_t a, uint32_t b)
{
    int sel = selection & SHOAL_WARM_SEL_MASK;
    begin(c, SHOAL_MSG_WARM);
    shoal_msg_put_u32(&c->msg, handle);
    shoal_msg_put_u8(&c->msg, (uint8_t)selection);
    if (sel == SHOAL_WARM_LAYERS) {
        shoal_msg_put_u16(&c->msg, (uint16_t)a);
        shoal_msg_put_u16(&c->msg, (uint16_t)b);
    } else if (sel == SHOAL_WARM_TOP) {
        shoal_msg_put_u32(&c->msg, a);
    }
}

int shoal_client_warm_plan(shoal_client *c, uint32_t handle, int selection, uint32_t a,
                           uint32_t b, shoal_buf *out, shoal_err *err)
{
    warm_body(c, handle, selection | SHOAL_WARM_F_PLAN, a, b);
    return json_call(c, out, err);
}

int shoal_client_warm(shoal_client *c, uint32_t handle, int selection, uint32_t a, uint32_t b,
                      uint64_t *job, shoal_err *err)
{
    shoal_msg_reader r;
    int rc;
    warm_body(c, handle, selection & ~SHOAL_WARM_F_PLAN, a, b);
    rc = client_call(c, SHOAL_MSG_JOB_OK, NULL, err);
    if (rc)
        return rc;
    shoal_rd_init(&r, c->body.data, c->body.len);
    *job = shoal_rd_u64(&r);
    return shoal_rd_finish(&r) ? client_fail(c, SHOAL_EPROTO, err) : 0;
}

int shoal_client_warm_keys(shoal_client *c, uint32_t handle, const shoal_key *keys, size_t n,
                           uint64_t *job, shoal_err *err)
{
    shoal_msg_reader r;
    int rc;
    begin(c, SHOAL_MSG_WARM);
    shoal_msg_put_u32(&c->msg, handle);
    shoal_msg_put_u8(&c->msg, SHOAL_WARM_LIST);
    rc = put_keys(c, keys, n, err);
    rc = rc ? rc : client_call(c, SHOAL_MSG_JOB_OK, NULL, err);
    if (rc)
        return rc;
    shoal_rd_init(&r, c->body.data, c->body.len);
    *job = shoal_rd_u64(&r);
    return shoal_rd_finish(&r) ? client_fail(c, SHOAL_EPROTO, err) : 0;
}

int shoal_client_job(shoal_client *c, uint64_t job, shoal_job_status *out, shoal_err *err)
{
    shoal_msg_reader r;
    int rc;
    begin(c, SHOAL_MSG_JOB);
    shoal_msg_put_u64(&c->msg, job);
    rc = client_call(c, SHOAL_MSG_JOB_STATUS3, NULL, err);
    if (rc)
        return rc;
    shoal_rd_init(&r, c->body.data, c->body.len);
    out->state = shoal_rd_u8(&r);
    out->bytes_done = shoal_rd_u64(&r);
    out->bytes_total = shoal_rd_u64(&r);
    out->objects_done = shoal_rd_u32(&r);
    out->objects_total = shoal_rd_u32(&r);
    out->errors = shoal_rd_u32(&r);
    shoal_rd_str_copy(&r, out->last_error, sizeof out->last_error);
    out->last_code = shoal_rd_i32(&r);
    return shoal_rd_finish(&r) ? client_fail(c, SHOAL_EPROTO, err) : 0;
}

/* Append the text of the JSON message in c->body to out. */
static int json_piece(shoal_client *c, shoal_buf *out, size_t before, shoal_err *err)
{
    shoal_msg_reader r;
    const char *s;
    size_t n;
    shoal_rd_init(&r, c->body.data, c->body.len);
    s = shoal_rd_str32(&r, &n);
    if (shoal_rd_finish(&r))
        return client_fail(c, SHOAL_EPROTO, err);
    if (out->len - before + n > CLIENT_JSON_MAX)
        return client_fail(c, SHOAL_ETOOBIG, err);
    return shoal_buf_append(out, s, n) ? shoal_err_set(err, SHOAL_ENOMEM, "out of memory") : 0;
}

/* A call answered by JSON text, appended to out.  A text longer than one
 * body comes as several JSON messages, LAST on the final one
 * (docs/protocol.md): the pieces are concatenated. */
static int json_call(shoal_client *c, shoal_buf *out, shoal_err *err)
{
    uint64_t id = c->next_id - 1;
    size_t before = out->len;
    int rc = client_call(c, SHOAL_MSG_JSON, NULL, err);
    if (rc == 0)
        rc = json_piece(c, out, before, err);
    while (rc == 0 && !(c->reply_flags & SHOAL_MSG_F_LAST)) {
        shoal_msg_header h;
        int fd, queued;
        rc = client_recv(c, c->call_timeout_ms, &h, &fd, &queued, err);
        if (rc == SHOAL_ETIMEOUT)
            return shoal_err_set(err, rc, "shoald did not answer within %d ms", c->call_timeout_ms);
        if (rc || queued)
            continue;
        if (fd >= 0)
            close(fd);
        if (h.id != id || h.type != SHOAL_MSG_JSON || fd >= 0)
            return client_fail(c, SHOAL_EPROTO, err);
        c->reply_flags = h.flags;
        rc = json_piece(c, out, before, err);
    }
    return rc;
}

int shoal_client_stats(shoal_client *c, const char *query_json, shoal_buf *out, shoal_err *err)
{
    const char *q = query_json ? query_json : "{}";
    begin(c, SHOAL_MSG_STATS);
    shoal_msg_put_str(&c->msg, q, strlen(q));
    return json_call(c, out, err);
}

int shoal_client_gc(shoal_client *c, uint64_t max_bytes, shoal_buf *out, shoal_err *err)
{
    begin(c, SHOAL_MSG_GC);
    shoal_msg_put_u64(&c->msg, max_bytes);
    return json_call(c, out, err);
}

int shoal_client_rm(shoal_client *c, const char *spec, shoal_buf *out, shoal_err *err)
{
    begin(c, SHOAL_MSG_RM);
    shoal_msg_put_str(&c->msg, spec, strlen(spec));
    return json_call(c, out, err);
}

int shoal_client_verify(shoal_client *c, const char *model, int deep, shoal_buf *out,
                        shoal_err *err)
{
    const char *m = model ? model : "";
    begin(c, SHOAL_MSG_VERIFY);
    shoal_msg_put_str(&c->msg, m, strlen(m));
    shoal_msg_put_u8(&c->msg, (uint8_t)(deep != 0));
    return json_call(c, out, err);
}

int shoal_client_report(shoal_client *c, const char *json, shoal_err *err)
{
    begin(c, SHOAL_MSG_REPORT);
    shoal_msg_put_str32(&c->msg, json, strlen(json));
    return client_call(c, SHOAL_MSG_OK, NULL, err);
}

int shoal_client_pin(shoal_client *c, uint32_t handle, int on, const shoal_key *keys, size_t n,
                     shoal_err *err)
{
    int rc;
    begin(c, SHOAL_MSG_PIN);
    shoal_msg_put_u32(&c->msg, handle);
    shoal_msg_put_u8(&c->msg, (uint8_t)(on != 0));
    rc = put_keys(c, keys, n, err);
    return rc ? rc : client_call(c, SHOAL_MSG_OK, NULL, err);
}

int shoal_client_put(shoal_client *c, uint32_t handle, const char *name, int fd, uint64_t length,
                     const uint8_t xxh128[16], shoal_err *err)
{
    size_t n = name ? strlen(name) : 0;
    if (!shoal_derived_name_ok(name, n) || fd < 0 || length == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "PUT: a name of 1..%d [A-Za-z0-9._-], a "
                             "descriptor and a length > 0", SHOAL_PROTO_MAX_DERIVED);
    shoal_msg_begin(&c->msg, SHOAL_MSG_PUT, SHOAL_MSG_F_FD, c->next_id++);
    shoal_msg_put_u32(&c->msg, handle);
    shoal_msg_put_str(&c->msg, name, n);
    shoal_msg_put_u64(&c->msg, length);
    shoal_msg_put_bytes(&c->msg, xxh128, 16);
    return client_call_fd(c, SHOAL_MSG_OK, fd, NULL, err);
}

int shoal_client_put_begin(shoal_client *c, uint32_t handle, const char *name, uint64_t length,
                           shoal_put *out, shoal_err *err)
{
    size_t n = name ? strlen(name) : 0;
    shoal_msg_reader r;
    int fd = -1, rc;

    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (!shoal_derived_name_ok(name, n) || length == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "PUT_BEGIN: a name of 1..%d [A-Za-z0-9._-] and a "
                             "length > 0", SHOAL_PROTO_MAX_DERIVED);
    begin(c, SHOAL_MSG_PUT_BEGIN);
    shoal_msg_put_u32(&c->msg, handle);
    shoal_msg_put_str(&c->msg, name, n);
    shoal_msg_put_u64(&c->msg, length);
    rc = client_call(c, SHOAL_MSG_PUT_READY, &fd, err);
    if (rc)
        return rc;
    shoal_rd_init(&r, c->body.data, c->body.len);
    out->id = shoal_rd_u64(&r);
    out->length = shoal_rd_u64(&r);
    if (shoal_rd_finish(&r) || fd < 0 || out->length != length) {
        if (fd >= 0)
            close(fd);
        return client_fail(c, SHOAL_EPROTO, err);
    }
    out->fd = fd;
    return 0;
}

/* PUT_COMMIT with keep 1 (store) or 0 (abandon). */
static int put_finish(shoal_client *c, shoal_put *p, int keep, const uint8_t xxh128[16],
                      shoal_err *err)
{
    static const uint8_t zero[16];
    if (p->fd >= 0) {   /* the file becomes the object: no writes after this */
        close(p->fd);
        p->fd = -1;
    }
    begin(c, SHOAL_MSG_PUT_COMMIT);
    shoal_msg_put_u64(&c->msg, p->id);
    shoal_msg_put_u8(&c->msg, (uint8_t)keep);
    shoal_msg_put_bytes(&c->msg, xxh128 ? xxh128 : zero, 16);
    return client_call(c, SHOAL_MSG_OK, NULL, err);
}

int shoal_client_put_commit(shoal_client *c, shoal_put *p, const uint8_t xxh128[16],
                            shoal_err *err)
{
    return put_finish(c, p, 1, xxh128, err);
}

int shoal_client_put_abort(shoal_client *c, shoal_put *p, shoal_err *err)
{
    return put_finish(c, p, 0, NULL, err);
}
