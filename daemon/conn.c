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
 * Bounds (docs/daemon.md, "Limits"): the input holds one frame; reading
 * stops while DAEMON_CONN_MAX_CONTROL control replies, DAEMON_CONN_MAX_KEYS
 * messages or DAEMON_CONN_OUT_PAUSE bytes wait, so a client that sends
 * requests without reading replies cannot grow the queue; the GETs already
 * accepted add at most DAEMON_CONN_MAX_KEYS items (ops.c bounds
 * outstanding keys).  Across connections (d->lim): descriptors queued on
 * one connection and on all, bytes held (input buffers and queued
 * replies) by all, and a deadline for each frame once its first byte came
 * (and for HELLO from the connect).  Over one, the connection responsible
 * (the one that grew, or the one holding the most) is dropped: its queue
 * emptied at once, an ERROR naming the limit, then closed.  At the
 * connection cap a newcomer takes the place of a connection that never
 * said HELLO or of one of a user (SO_PEERCRED uid) who holds more
 * connections than the newcomer's does, so one user cannot keep another
 * out; otherwise the newcomer is refused (server.c).
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/sys.h"

#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
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
static shoal_log_limit conn_log_refuse, conn_log_drop, conn_log_evict, conn_log_fds,
    conn_log_bytes, conn_log_frame;
static void conn_drop_as(conn *c, shoal_log_limit *lim, int code, const char *why);

/* ---- per-uid counts ------------------------------------------------------------ */

static struct daemon_user *user_slot(shoald *d, uint32_t uid, int add)
{
    struct daemon_user *free_slot = NULL;
    size_t n = sizeof d->users / sizeof d->users[0];
    for (size_t i = 0; i < n; i++) {
        if (d->users[i].n && d->users[i].uid == uid)
            return &d->users[i];
        if (!d->users[i].n && !free_slot)
            free_slot = &d->users[i];
    }
    if (!add)
        return NULL;
    if (!free_slot)
        free_slot = &d->users[n - 1];   /* more users than slots: the last one is shared */
    else
        free_slot->uid = uid;
    return free_slot;
}

static unsigned user_count(shoald *d, uint32_t uid)
{
    struct daemon_user *u = user_slot(d, uid, 0);
    return u ? u->n : 0;
}

static void held_in(conn *c)
{
    shoald *d = c->d;
    d->buffered -= c->in_held;
    c->in_held = c->in.cap;
    d->buffered += c->in_held;
}

enum { CONN_OPEN = 0, CONN_CLOSING = 1, CONN_DEAD = 2 };

static void conn_free(conn *c)
{
    shoald *d = c->d;
    struct daemon_user *u = c->user;
    session_close(c);
    for (outmsg *m = c->out_head, *n; m; m = n) {
        n = m->next;
        if (m->fd >= 0)
            close(m->fd);
        free(m);
    }
    d->out_fds -= c->out_fds;
    d->buffered -= c->out_bytes + c->in_held;
    if (u && u->n)
        u->n--;
    if (c->ev_read)
        event_free(c->ev_read);
    if (c->ev_write)
        event_free(c->ev_write);
    if (c->ev_frame)
        event_free(c->ev_frame);
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
    event_del(c->ev_frame);
    event_active(c->ev_write, EV_WRITE, 0);
}

static void conn_update_read(conn *c)
{
    int want = c->closing == CONN_OPEN && c->out_control < DAEMON_CONN_MAX_CONTROL &&
               c->out_count < DAEMON_CONN_MAX_KEYS && c->out_bytes < DAEMON_CONN_OUT_PAUSE;
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
        w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
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
            c->out_fds--;
            c->d->out_fds--;
        }
        m->off += (size_t)w;
        c->out_bytes -= (size_t)w;
        c->d->buffered -= (uint64_t)w;
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

/* The connection holding the most of what a limit counts. */
static conn *conn_biggest(shoald *d, int fds)
{
    conn *best = NULL;
    uint64_t most = 0;
    for (conn *o = d->conns; o; o = o->next) {
        uint64_t v = fds ? o->out_fds : o->out_bytes + o->in_held;
        if (!o->dropped && o->closing != CONN_DEAD && v >= most) {
            most = v;
            best = o;
        }
    }
    return best;
}

/* Before queueing len bytes and (fd) a descriptor on c: 0 to go on, or
 * SHOAL_ETOOBIG when c itself was dropped for it. */
static int conn_limits(conn *c, size_t len, int fd)
{
    shoald *d = c->d;
    char why[SHOAL_ERR_MSG_MAX];
    if (fd >= 0 && c->out_fds + 1 > d->lim.conn_fds) {
        snprintf(why, sizeof why, "%u descriptors wait for this client to read them (at most "
                 "%u per connection, --max-conn-fds): read replies as they come", c->out_fds,
                 d->lim.conn_fds);
        d->bounds.dropped_fds++;
        conn_drop_as(c, &conn_log_fds, SHOAL_ETOOBIG, why);
        return SHOAL_ETOOBIG;
    }
    while (fd >= 0 && d->out_fds + 1 > d->lim.fds) {
        conn *v = conn_biggest(d, 1);
        if (!v)
            break;
        snprintf(why, sizeof why, "descriptors queued on all connections reached %u "
                 "(--max-fds); this one held the most (%u) unread", d->lim.fds, v->out_fds);
        d->bounds.dropped_fds++;
        conn_drop_as(v, &conn_log_fds, SHOAL_ETOOBIG, why);
        if (v == c)
            return SHOAL_ETOOBIG;
    }
    while (d->buffered + len > d->lim.buffered) {
        conn *v = conn_biggest(d, 0);
        if (!v)
            break;
        snprintf(why, sizeof why, "bytes held for all connections reached %llu MiB "
                 "(--max-buffered); this one held the most (%zu bytes)",
                 (unsigned long long)(d->lim.buffered >> 20), v->out_bytes + v->in_held);
        d->bounds.dropped_bytes++;
        conn_drop_as(v, &conn_log_bytes, SHOAL_ETOOBIG, why);
        if (v == c)
            return SHOAL_ETOOBIG;
    }
    return 0;
}

int conn_send(conn *c, const uint8_t *msg, size_t len, int fd)
{
    outmsg *m;
    int was_empty;

    /* dropped 2: conn_drop's own ERROR, which the limits let through */
    if (c->closing == CONN_DEAD || c->dropped == 1 ||
        (!c->dropped && conn_limits(c, len, fd) != 0)) {
        if (fd >= 0)
            close(fd);
        return SHOAL_ENET;
    }
    was_empty = c->out_head == NULL;
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
    c->out_bytes += len;
    c->d->buffered += len;
    if (fd >= 0) {
        c->out_fds++;
        c->d->out_fds++;
    }
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
    LOG_WARN_LIMITED(&conn_log_refuse, "conn", "session %llu (%s, pid %lld, uid %u): %s; "
                     "closing the connection", (unsigned long long)c->session,
                     c->program[0] ? c->program : "?", (long long)c->pid, (unsigned)c->uid, msg);
    conn_send_error(c, id, code, msg);
    conn_close(c, 1);
}

void conn_drop(conn *c, int code, const char *why)
{
    conn_drop_as(c, &conn_log_drop, code, why);
}

/* Each kind of drop has its own limiter: a flood of one cannot hide another. */
static void conn_drop_as(conn *c, shoal_log_limit *lim, int code, const char *why)
{
    shoald *d = c->d;
    outmsg *keep;
    if (c->dropped || c->closing == CONN_DEAD)
        return;
    LOG_WARN_LIMITED(lim, "conn", "session %llu (%s, pid %lld, uid %u) dropped: %s",
                     (unsigned long long)c->session, c->program[0] ? c->program : "?",
                     (long long)c->pid, (unsigned)c->uid, why);
    /* Everything queued goes now, but a message already partly written
     * (the client would see half a frame) */
    keep = c->out_head && c->out_head->off > 0 ? c->out_head : NULL;
    for (outmsg *m = keep ? keep->next : c->out_head, *n; m; m = n) {
        n = m->next;
        if (m->fd >= 0) {
            close(m->fd);
            c->out_fds--;
            d->out_fds--;
        }
        c->out_bytes -= m->len;
        d->buffered -= m->len;
        c->out_count--;
        if (m->control)
            c->out_control--;
        free(m);
    }
    if (keep)
        keep->next = NULL;
    c->out_head = c->out_tail = keep;
    if (!c->processing) {   /* else the request being handled borrows from it */
        shoal_buf_free(&c->in);
        held_in(c);
    }
    if (c->in_fd >= 0) {
        close(c->in_fd);
        c->in_fd = -1;
    }
    c->dropped = 2;
    conn_send_error(c, 0, code, why);
    c->dropped = 1;
    conn_close(c, 1);
}

/* The frame deadline: armed when a frame's first byte is in and not the
 * rest (and from the connect until HELLO), disarmed when the buffer is
 * empty again. */
static void conn_on_frame_timeout(evutil_socket_t fd, short what, void *arg)
{
    conn *c = arg;
    char why[160];
    (void)fd;
    (void)what;
    if (c->closing != CONN_OPEN)
        return;
    c->d->bounds.frame_timeouts++;
    if (c->in.len == 0 && !c->hello)
        snprintf(why, sizeof why, "no HELLO within %u s of connecting (--frame-timeout)",
                 c->d->lim.frame_secs);
    else
        snprintf(why, sizeof why, "a frame begun %u s ago has not ended (%zu bytes of it came; "
                 "--frame-timeout)", c->d->lim.frame_secs, c->in.len);
    conn_drop_as(c, &conn_log_frame, SHOAL_ETIMEOUT, why);
}

static void conn_frame_arm(conn *c, int restart)
{
    struct timeval tv = { (time_t)c->d->lim.frame_secs, 0 };
    if (c->closing != CONN_OPEN)
        return;
    if (c->in.len == 0 && c->hello) {
        event_del(c->ev_frame);
        return;
    }
    if (c->read_paused && c->in.len)   /* whole frames wait on us, not on the client */
        restart = 1;
    if (restart || !event_pending(c->ev_frame, EV_TIMEOUT, NULL))
        event_add(c->ev_frame, &tv);
}

/* Handle every complete frame in c->in.  Stops when reading is paused. */
static void conn_process(conn *c)
{
    size_t pos = 0;
    c->processing = 1;
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
    c->processing = 0;
    shoal_buf_consume(&c->in, pos);
    if (c->dropped)
        shoal_buf_reset(&c->in);
    if (c->closing == CONN_OPEN && !c->read_paused && c->in.len == 0 && c->in_fd >= 0)
        conn_refuse(c, 0, SHOAL_EPROTO, "a descriptor came without a PUT");
    if (c->in.len == 0 && (c->dropped || c->in.cap > 2 * CONN_READ_CHUNK + 1)) {
        shoal_buf_free(&c->in);   /* an idle connection holds no frame buffer */
        held_in(c);
    }
    conn_frame_arm(c, pos > 0);
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
    if (c->in.cap != c->in_held) {
        held_in(c);
        if (conn_limits(c, 0, -1) != 0)
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
    c->active_ms = shoal_wall_ms();
    if (extra_fd || (mh.msg_flags & MSG_CTRUNC)) {
        conn_refuse(c, 0, SHOAL_EPROTO, "one descriptor at a time, and only with PUT");
        return;
    }
    conn_process(c);
}

int conn_new(shoald *d, int fd, uint32_t uid)
{
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return SHOAL_ENOMEM;
    c->d = d;
    c->fd = fd;
    c->in_fd = -1;
    c->uid = uid;
    c->started_ms = c->active_ms = shoal_wall_ms();
    shoal_buf_init(&c->in, SHOAL_PROTO_HEADER + SHOAL_PROTO_MAX_BODY + 2 * CONN_READ_CHUNK);
    c->ev_read = event_new(d->base, fd, EV_READ | EV_PERSIST, conn_on_read, c);
    c->ev_write = event_new(d->base, fd, EV_WRITE, conn_on_write, c);
    c->ev_frame = evtimer_new(d->base, conn_on_frame_timeout, c);
    if (!c->ev_read || !c->ev_write || !c->ev_frame || event_add(c->ev_read, NULL) != 0) {
        if (c->ev_read)
            event_free(c->ev_read);
        if (c->ev_write)
            event_free(c->ev_write);
        if (c->ev_frame)
            event_free(c->ev_frame);
        free(c);
        return SHOAL_ENOMEM;
    }
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    d->nconns++;
    c->user = user_slot(d, uid, 1);
    c->user->n++;
    conn_frame_arm(c, 1);   /* HELLO's deadline */
    return 0;
}

int conn_admit(shoald *d, uint32_t uid)
{
    unsigned mine = user_count(d, uid), live = 0;
    conn *v = NULL;
    char why[200];

    for (conn *o = d->conns; o; o = o->next)
        live += !o->dropped && o->closing == CONN_OPEN;
    if (live < d->lim.conns)
        return 1;
    /* a connection that never said HELLO, the oldest first; else one of
     * the user holding the most connections, when that is more than the
     * newcomer's user holds: the one idle longest */
    for (conn *o = d->conns; o; o = o->next)
        if (!o->dropped && o->closing == CONN_OPEN && !o->hello &&
            (!v || o->started_ms < v->started_ms))
            v = o;
    if (!v) {
        unsigned most = 0;
        for (conn *o = d->conns; o; o = o->next) {
            unsigned n;
            if (o->dropped || o->closing != CONN_OPEN || o->uid == uid)
                continue;
            n = user_count(d, o->uid);
            if (n > mine + 1 && (n > most || (n == most && o->active_ms < v->active_ms))) {
                most = n;
                v = o;
            }
        }
    }
    if (!v)
        return 0;
    snprintf(why, sizeof why, "shoald serves its cap of %u connections (--max-conns) and a "
             "newcomer (uid %u) takes this %s", d->lim.conns, (unsigned)uid,
             v->hello ? "one: its user holds the most" : "one, which never said HELLO");
    d->bounds.evicted++;
    conn_drop_as(v, &conn_log_evict, SHOAL_EBUSY, why);
    return 1;
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
