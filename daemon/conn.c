/* conn.c — one client connection: framing in, (bytes, descriptor) out.
 *
 * Owns: the non-blocking socket, reading frames into a buffer bounded to
 * one frame, refusing a malformed one (ERROR reply, then close after the
 * queue drains), and the output queue.
 *
 * Why not bufferevents for output: a GET item's descriptor must travel in
 * the same sendmsg as its header's first byte (SCM_RIGHTS), and an evbuffer
 * cannot carry ancillary data.  So the output is a FIFO of messages, each
 * with its descriptor; the head goes out with sendmsg (descriptor attached
 * to its first byte), a partial write keeps the rest for the next EV_WRITE,
 * and the descriptor is closed here once the kernel has it.
 *
 * Lifetime: a connection is never freed inside a call that another file
 * made (a transfer completing may send to many); failures mark it dead and
 * the write callback, run by the loop, frees it.
 *
 * Bounds (docs/daemon.md): the input holds one frame; reading stops while
 * DAEMON_CONN_MAX_CONTROL control replies or DAEMON_CONN_MAX_KEYS messages
 * wait, so a client that sends requests without reading replies cannot
 * grow the queue; the GETs already accepted add at most
 * DAEMON_CONN_MAX_KEYS items (ops.c bounds outstanding keys).
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"

#include <errno.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define CONN_READ_CHUNK  (64u << 10)
#define CONN_FLUSH_SECS  5          /* a closing client that does not read */

typedef struct outmsg {
    struct outmsg *next;
    int    fd;                    /* to attach to byte 0; -1 none */
    int    control;               /* counts against DAEMON_CONN_MAX_CONTROL */
    size_t len, off;
    uint8_t data[];
} outmsg;

static daemon_request conn_rq;    /* decoded request: big, and one at a time */

enum { CONN_OPEN = 0, CONN_CLOSING = 1, CONN_DEAD = 2 };

static void conn_free(conn *c)
{
    shoald *d = c->d;
    session_close(c);
    for (outmsg *m = c->out_head, *n; m; m = n) {
        n = m->next;
        if (m->fd >= 0)
            close(m->fd);
        free(m);
    }
    if (c->ev_read)
        event_free(c->ev_read);
    if (c->ev_write)
        event_free(c->ev_write);
    if (c->fd >= 0)
        close(c->fd);
    if (c->in_fd >= 0)
        close(c->in_fd);
    shoal_buf_free(&c->in);
    shoal_msg_builder_free(&c->msg);
    if (c->prev)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    d->nconns--;
    free(c);
}

/* Mark dead; the loop frees it from the write callback. */
static void conn_kill(conn *c)
{
    if (c->closing == CONN_DEAD)
        return;
    c->closing = CONN_DEAD;
    event_del(c->ev_read);
    event_active(c->ev_write, EV_WRITE, 0);
}

static void conn_update_read(conn *c)
{
    int want = c->closing == CONN_OPEN && c->out_control < DAEMON_CONN_MAX_CONTROL &&
               c->out_count < DAEMON_CONN_MAX_KEYS;
    if (want && c->read_paused) {
        c->read_paused = 0;
        event_add(c->ev_read, NULL);
        event_active(c->ev_read, EV_READ, 0);   /* frames may be buffered */
    } else if (!want && !c->read_paused) {
        c->read_paused = 1;
        event_del(c->ev_read);
    }
}

/* Write what the socket takes.  0 (drained or would block) or -1 (dead). */
static int conn_flush(conn *c)
{
    while (c->out_head) {
        outmsg *m = c->out_head;
        struct iovec iov = { m->data + m->off, m->len - m->off };
        union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } ctl;
        struct msghdr mh = { 0 };
        ssize_t w;

        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        if (m->fd >= 0) {
            struct cmsghdr *cm;
            memset(&ctl, 0, sizeof ctl);
            mh.msg_control = ctl.b;
            mh.msg_controllen = sizeof ctl.b;
            cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &m->fd, sizeof(int));
        }
        w = sendmsg(c->fd, &mh, SHOAL_MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            LOG_DEBUG("conn", "session %llu: send: %s", (unsigned long long)c->session,
                      strerror(errno));
            return -1;
        }
        if (m->fd >= 0 && w > 0) {   /* the kernel holds its own reference now */
            close(m->fd);
            m->fd = -1;
        }
        m->off += (size_t)w;
        if (m->off < m->len)
            continue;
        c->out_head = m->next;
        if (!c->out_head)
            c->out_tail = NULL;
        c->out_count--;
        if (m->control)
            c->out_control--;
        free(m);
    }
    return 0;
}

static void conn_on_write(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    struct timeval tv = { CONN_FLUSH_SECS, 0 };
    (void)fd;
    if (c->closing == CONN_DEAD || (what & EV_TIMEOUT)) {
        conn_free(c);
        return;
    }
    if (conn_flush(c) != 0) {
        conn_free(c);
        return;
    }
    if (c->out_head) {
        event_add(c->ev_write, c->closing ? &tv : NULL);
        return;
    }
    if (c->closing == CONN_CLOSING) {
        conn_free(c);
        return;
    }
    conn_update_read(c);
}

int conn_send(conn *c, const uint8_t *msg, size_t len, int fd)
{
    outmsg *m;
    int was_empty = c->out_head == NULL;

    if (c->closing == CONN_DEAD) {
        if (fd >= 0)
            close(fd);
        return SHOAL_ENET;
    }
    m = malloc(sizeof *m + len);
    if (!m) {
        if (fd >= 0)
            close(fd);
        conn_kill(c);
        return SHOAL_ENOMEM;
    }
    m->next = NULL;
    m->fd = fd;
    m->len = len;
    m->off = 0;
    m->control = len >= 10 && (msg[8] | msg[9] << 8) != SHOAL_MSG_GET_ITEM;
    memcpy(m->data, msg, len);
    if (c->out_tail)
        c->out_tail->next = m;
    else
        c->out_head = m;
    c->out_tail = m;
    c->out_count++;
    if (m->control)
        c->out_control++;
    if (was_empty) {
        /* Try at once: most replies fit the socket buffer. */
        if (conn_flush(c) != 0) {
            conn_kill(c);
            return SHOAL_ENET;
        }
        if (c->out_head)
            event_add(c->ev_write, NULL);
    }
    conn_update_read(c);
    return 0;
}

shoal_msg_builder *conn_builder(conn *c) { return &c->msg; }

int conn_send_error(conn *c, uint64_t id, int code, const char *msg)
{
    size_t n = strlen(msg);
    shoal_msg_begin(&c->msg, SHOAL_MSG_ERROR, SHOAL_MSG_F_LAST, id);
    shoal_msg_put_i32(&c->msg, code < 0 ? code : SHOAL_EINTERNAL);
    shoal_msg_put_str(&c->msg, msg, n > SHOAL_PROTO_MAX_STR ? SHOAL_PROTO_MAX_STR : n);
    if (shoal_msg_end(&c->msg) != 0)
        return SHOAL_EINTERNAL;
    return conn_send(c, c->msg.buf.data, c->msg.buf.len, -1);
}

int conn_send_ok(conn *c, uint64_t id)
{
    shoal_msg_begin(&c->msg, SHOAL_MSG_OK, SHOAL_MSG_F_LAST, id);
    if (shoal_msg_end(&c->msg) != 0)
        return SHOAL_EINTERNAL;
    return conn_send(c, c->msg.buf.data, c->msg.buf.len, -1);
}

/* A JSON text longer than one body goes out as several JSON messages, each
 * the next piece of the text, the last one with LAST (docs/protocol.md,
 * "JSON replies"): the receiver concatenates them.  One document built
 * once, so the pieces are one consistent snapshot. */
int conn_send_json(conn *c, uint64_t id, const shoal_buf *json)
{
    const size_t piece = SHOAL_PROTO_MAX_BODY - 4;   /* the str32 length word */
    size_t off = 0, frames = 0;
    int rc = 0;

    do {
        size_t n = json->len - off < piece ? json->len - off : piece;
        int last = off + n >= json->len;
        shoal_msg_begin(&c->msg, SHOAL_MSG_JSON, last ? SHOAL_MSG_F_LAST : 0, id);
        shoal_msg_put_str32(&c->msg, json->data ? (const char *)json->data + off : "", n);
        if ((rc = shoal_msg_end(&c->msg)) != 0)
            return conn_send_error(c, id, SHOAL_ETOOBIG, "the JSON answer cannot be framed");
        if ((rc = conn_send(c, c->msg.buf.data, c->msg.buf.len, -1)) != 0)
            return rc;
        off += n;
        frames++;
    } while (off < json->len);
    if (frames > 1)
        LOG_DEBUG("conn", "JSON reply of %zu bytes in %zu frames (largest %zu)", json->len, frames,
                  piece);
    return 0;
}

void conn_close(conn *c, int flush)
{
    if (!flush || !c->out_head) {
        conn_kill(c);
        return;
    }
    if (c->closing == CONN_OPEN) {
        struct timeval tv = { CONN_FLUSH_SECS, 0 };
        c->closing = CONN_CLOSING;
        conn_update_read(c);
        event_add(c->ev_write, &tv);
    }
}

/* Refuse the frame: ERROR naming why, then close after the queue drains. */
static void conn_refuse(conn *c, uint64_t id, int code, const char *msg)
{
    LOG_WARN("conn", "session %llu (%s, pid %lld): %s; closing the connection",
             (unsigned long long)c->session, c->program[0] ? c->program : "?",
             (long long)c->pid, msg);
    conn_send_error(c, id, code, msg);
    conn_close(c, 1);
}

/* Handle every complete frame in c->in.  Stops when reading is paused. */
static void conn_process(conn *c)
{
    size_t pos = 0;
    while (c->closing == CONN_OPEN && !c->read_paused && c->in.len - pos >= SHOAL_PROTO_HEADER) {
        shoal_msg_header h;
        shoal_err err = { 0 };
        int rc = shoal_msg_header_decode(c->in.data + pos, &h, &err);
        if (rc) {
            conn_refuse(c, shoal_rd_le64(c->in.data + pos + 16), rc, err.msg);
            break;
        }
        if (c->in.len - pos - SHOAL_PROTO_HEADER < h.len)
            break;
        rc = daemon_request_parse(&h, c->in.data + pos + SHOAL_PROTO_HEADER, h.len, &conn_rq, &err);
        pos += SHOAL_PROTO_HEADER + h.len;
        if (rc) {
            conn_refuse(c, h.id, rc, err.msg);
            break;
        }
        conn_rq.fd = -1;
        if (h.type == SHOAL_MSG_PUT) {
            /* the descriptor came with the PUT's first byte (the client
             * sends one PUT at a time), so it is the one waiting */
            if (c->in_fd < 0) {
                conn_refuse(c, h.id, SHOAL_EPROTO, "PUT without a descriptor");
                break;
            }
            conn_rq.fd = c->in_fd;
            c->in_fd = -1;
        }
        if (!c->hello != (h.type == SHOAL_MSG_HELLO)) {
            if (conn_rq.fd >= 0)
                close(conn_rq.fd);
            conn_refuse(c, h.id, SHOAL_EPROTO, c->hello ? "HELLO was already said"
                                                        : "the first message must be HELLO");
            break;
        }
        rc = ops_dispatch(c, &conn_rq);   /* takes conn_rq.fd */
        if (rc != 0) {
            conn_close(c, 1);
            break;
        }
    }
    shoal_buf_consume(&c->in, pos);
    if (c->closing == CONN_OPEN && !c->read_paused && c->in.len == 0 && c->in_fd >= 0)
        conn_refuse(c, 0, SHOAL_EPROTO, "a descriptor came without a PUT");
}

static void conn_on_read(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    union { struct cmsghdr h; char b[CMSG_SPACE(8 * sizeof(int))]; } ctl;
    struct msghdr mh = { 0 };
    struct iovec iov;
    ssize_t r;
    int extra_fd = 0;
    (void)what;

    conn_process(c);   /* frames left over from a pause */
    if (c->closing != CONN_OPEN || c->read_paused)
        return;
    if (c->in.len >= SHOAL_PROTO_HEADER + SHOAL_PROTO_MAX_BODY + CONN_READ_CHUNK)
        return;   /* cannot happen: process consumed every whole frame */
    if (shoal_buf_reserve(&c->in, CONN_READ_CHUNK) != 0) {
        conn_kill(c);
        return;
    }
    iov.iov_base = c->in.data + c->in.len;
    iov.iov_len = CONN_READ_CHUNK;
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.b;
    mh.msg_controllen = sizeof ctl.b;
    r = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); r >= 0 && cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k; i++) {
                int pfd;
                memcpy(&pfd, CMSG_DATA(cm) + i * sizeof(int), sizeof pfd);
                if (c->in_fd < 0 && i == 0) {
                    c->in_fd = pfd;   /* PUT's content: conn_process hands it over */
                } else {
                    close(pfd);
                    extra_fd = 1;
                }
            }
        }
    }
    if (r < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        conn_kill(c);
        return;
    }
    if (r == 0) {   /* the client left */
        LOG_DEBUG("conn", "session %llu closed by the client", (unsigned long long)c->session);
        conn_kill(c);
        return;
    }
    c->in.len += (size_t)r;
    if (extra_fd || (mh.msg_flags & MSG_CTRUNC)) {
        conn_refuse(c, 0, SHOAL_EPROTO, "one descriptor at a time, and only with PUT");
        return;
    }
    conn_process(c);
}

int conn_new(shoald *d, int fd)
{
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return SHOAL_ENOMEM;
    c->d = d;
    c->fd = fd;
    c->in_fd = -1;
    c->started_ms = shoal_wall_ms();
    shoal_buf_init(&c->in, SHOAL_PROTO_HEADER + SHOAL_PROTO_MAX_BODY + 2 * CONN_READ_CHUNK);
    c->ev_read = event_new(d->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
    c->ev_write = event_new(d->base, fd, EV_WRITE, conn_on_write, c);
    if (!c->ev_read || !c->ev_write || event_add(c->ev_read, NULL) != 0) {
        if (c->ev_read)
            event_free(c->ev_read);
        if (c->ev_write)
            event_free(c->ev_write);
        free(c);
        return SHOAL_ENOMEM;
    }
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->nconns++;
    return 0;
}

void conn_close_all(shoald *d)
{
    for (conn *c = d->conns; c; c = c->next)
        if (c->closing == CONN_OPEN)
            conn_close(c, 1);
}

void conn_free_all(shoald *d)
{
    while (d->conns)
        conn_free(d->conns);
}
