/* poll.c — a blocking event loop over poll(2) that implements
 * fetch_loop_ops, for tools and tests (the daemon brings libevent).
 *
 * Owns: the watched descriptors, one timer, and the run loop that stops
 * when the session is idle or failed, or when the caller's stop flag is
 * raised (a signal handler sets it; poll wakes up at least every 200 ms to
 * look).
 */
#include "fetcher/fetch.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "common/sys.h"

#define POLL_TICK_MS 200

struct fetch_poll {
    struct pollfd *fds;
    size_t         n, cap;
    int            timer_set;
    uint64_t       timer_at_ns;
};

static int poll_watch(void *loop, int fd, unsigned what)
{
    fetch_poll *p = loop;
    size_t i;
    for (i = 0; i < p->n && p->fds[i].fd != fd; i++)
        ;
    if (what == FETCH_WATCH_NONE) {
        if (i < p->n)
            p->fds[i] = p->fds[--p->n];
        return 0;
    }
    if (i == p->n) {
        if (p->n == p->cap) {
            size_t nc = p->cap ? p->cap * 2 : 16;
            struct pollfd *q = realloc(p->fds, nc * sizeof *q);
            if (!q)
                return SHOAL_ENOMEM;
            p->fds = q;
            p->cap = nc;
        }
        p->n++;
    }
    p->fds[i].fd = fd;
    p->fds[i].events = (short)(((what & FETCH_WATCH_IN) ? POLLIN : 0)
                               | ((what & FETCH_WATCH_OUT) ? POLLOUT : 0));
    p->fds[i].revents = 0;
    return 0;
}

static void poll_timer(void *loop, long ms)
{
    fetch_poll *p = loop;
    p->timer_set = ms >= 0;
    p->timer_at_ns = ms >= 0 ? shoal_now_ns() + (uint64_t)ms * 1000000ull : 0;
}

static const fetch_loop_ops poll_ops = { poll_watch, poll_timer, NULL, NULL };  /* syncs inline */

const fetch_loop_ops *fetch_poll_ops(void)
{
    return &poll_ops;
}

int fetch_poll_new(fetch_poll **out, shoal_err *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
}

void fetch_poll_free(fetch_poll *p)
{
    if (!p)
        return;
    free(p->fds);
    free(p);
}

int fetch_poll_run(fetch_poll *p, fetch_session *s, volatile sig_atomic_t *stop, shoal_err *err)
{
    struct pollfd *ready = NULL;
    size_t ready_cap = 0;

    while (!fetch_session_idle(s) && fetch_session_status(s, NULL) == 0) {
        int timeout = POLL_TICK_MS, n;
        uint64_t now = shoal_now_ns();
        if (stop && *stop) {
            fetch_session_stop(s);
            break;
        }
        if (p->timer_set) {
            uint64_t ms = p->timer_at_ns > now ? (p->timer_at_ns - now + 999999) / 1000000 : 0;
            if (ms < (uint64_t)timeout)
                timeout = (int)ms;
        }
        n = poll(p->fds, (nfds_t)p->n, timeout);
        if (n < 0 && errno != EINTR) {
            free(ready);
            return shoal_err_set(err, SHOAL_EIO, "poll: %s", strerror(errno));
        }
        if (n > 0) {
            /* Copy first: the callbacks change the watched set. */
            size_t k = 0;
            if (ready_cap < p->n) {
                struct pollfd *q = realloc(ready, p->n * sizeof *q);
                if (!q) {
                    free(ready);
                    return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
                }
                ready = q;
                ready_cap = p->n;
            }
            for (size_t i = 0; i < p->n; i++)
                if (p->fds[i].revents)
                    ready[k++] = p->fds[i];
            for (size_t i = 0; i < k; i++) {
                unsigned what = 0;
                if (ready[i].revents & (POLLIN | POLLHUP | POLLERR))
                    what |= FETCH_WATCH_IN;
                if (ready[i].revents & (POLLOUT | POLLERR))
                    what |= FETCH_WATCH_OUT;
                fetch_session_io(s, ready[i].fd, what);
            }
        }
        if (p->timer_set && p->timer_at_ns <= shoal_now_ns()) {
            p->timer_set = 0;
            fetch_session_timeout(s);
        }
    }
    free(ready);
    return fetch_session_status(s, err);
}
