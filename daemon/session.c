/* session.c — what one connection holds: its session and counters, the
 * model handles it opened, and its open GET requests.
 *
 * Owns: the session row in the cache (opened at HELLO, closed at
 * disconnect), the GET bookkeeping (which keys are answered, which one
 * carries LAST), and letting go of everything when the client leaves:
 * its waiters are detached (so its prefetches are dropped, while transfers
 * that others or the cache still want go on) and its handles released.
 * Does not own the socket (conn.c) or scheduling (sched.c).
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/sys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int session_open(conn *c, const daemon_request *rq, shoal_err *err)
{
    int rc;
    c->pid = rq->pid;
    snprintf(c->program, sizeof c->program, "%s", rq->name[0] ? rq->name : "?");
    rc = cache_session_open(c->d->cache, c->pid, c->program, &c->session, err);
    if (rc)
        return rc;
    c->hello = 1;
    LOG_INFO("session", "session %llu: %s (pid %lld) connected",
             (unsigned long long)c->session, c->program, (long long)c->pid);
    return 0;
}

void session_get_free(conn *c, getreq *g)
{
    for (getreq **pp = &c->gets; *pp; pp = &(*pp)->next) {
        if (*pp == g) {
            *pp = g->next;
            c->ngets--;
            break;
        }
    }
    for (unsigned i = 0; i < g->nkeys; i++) {
        if (g->w[i].x)
            sched_detach(c->d->sched, &g->w[i]);
        if (!g->w[i].answered)
            c->outstanding--;
    }
    free(g->w);
    free(g);
}

getreq *session_get_find(conn *c, uint64_t id)
{
    for (getreq *g = c->gets; g; g = g->next)
        if (g->id == id)
            return g;
    return NULL;
}

void session_close(conn *c)
{
    shoald *d = c->d;
    shoal_err err = { 0 };

    while (c->gets)
        session_get_free(c, c->gets);
    pending_conn_gone(c);   /* jobs go on; their ends answer nobody */
    derived_conn_gone(c);   /* PUTs never committed leave nothing */
    for (unsigned i = 0; i < c->nhandles; i++) {
        model *m = model_by_handle(d, c->handles[i]);
        if (m)
            model_release(d, m);
    }
    c->nhandles = 0;
    if (!c->hello)
        return;
    if (cache_session_close(d->cache, c->session, &err) != 0)
        LOG_WARN("session", "closing session %llu: %s", (unsigned long long)c->session, err.msg);
    LOG_INFO("session", "session %llu: %s (pid %lld) left: %llu hits, %llu misses, %llu joins",
             (unsigned long long)c->session, c->program, (long long)c->pid,
             (unsigned long long)c->counts.hits, (unsigned long long)c->counts.misses,
             (unsigned long long)c->counts.joins);
    c->hello = 0;
}

int session_handle_add(conn *c, uint32_t handle)
{
    if (c->nhandles == DAEMON_CONN_MAX_HANDLES)
        return SHOAL_ETOOBIG;
    c->handles[c->nhandles++] = handle;
    return 0;
}

/* 0 if the connection held handle (one reference dropped), else ENOTFOUND. */
int session_handle_drop(conn *c, uint32_t handle)
{
    for (unsigned i = 0; i < c->nhandles; i++) {
        if (c->handles[i] == handle) {
            c->handles[i] = c->handles[--c->nhandles];
            return 0;
        }
    }
    return SHOAL_ENOTFOUND;
}

static void item_send(conn *c, getreq *g, uint16_t i, int status, int source,
                      const cache_obj *obj, uint64_t offset);

void session_item_send(conn *c, getreq *g, uint16_t i, int status, int source,
                       const cache_obj *obj)
{
    item_send(c, g, i, status, source, obj, 0);
}

void session_item_send_at(conn *c, getreq *g, uint16_t i, int source, const cache_obj *obj,
                          uint64_t offset)
{
    item_send(c, g, i, 0, source, obj, offset);
}

static void item_send(conn *c, getreq *g, uint16_t i, int status, int source,
                      const cache_obj *obj, uint64_t offset)
{
    shoal_msg_builder *m = conn_builder(c);
    static const uint8_t zero[16];
    int fd = status == 0 ? obj->fd : -1;
    uint16_t flags;

    if (g->w[i].answered) {   /* cannot happen; never send a key twice */
        if (fd >= 0)
            close(fd);
        return;
    }
    g->w[i].answered = 1;
    g->remaining--;
    c->outstanding--;
    flags = (uint16_t)((fd >= 0 ? SHOAL_MSG_F_FD : 0) | (g->remaining == 0 ? SHOAL_MSG_F_LAST : 0));
    shoal_msg_begin(m, SHOAL_MSG_GET_ITEM, flags, g->id);
    shoal_msg_put_u16(m, i);
    shoal_msg_put_i32(m, status);
    shoal_msg_put_u8(m, (uint8_t)source);
    shoal_msg_put_u64(m, status == 0 ? offset : 0);
    shoal_msg_put_u64(m, status == 0 ? obj->length : 0);
    shoal_msg_put_bytes(m, status == 0 ? obj->xxh128 : zero, 16);
    if (shoal_msg_end(m) != 0) {
        if (fd >= 0)
            close(fd);
        conn_close(c, 0);
        return;
    }
    if (status == 0) {
        c->counts.bytes_out += obj->length;
        c->d->bytes_served += obj->length;
    }
    conn_send(c, m->buf.data, m->buf.len, fd);
    if (g->remaining == 0)
        session_get_free(c, g);
}
