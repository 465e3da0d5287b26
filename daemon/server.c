/* server.c — shoald's listening socket.
 *
 * Owns: creating $SHOAL_HOME/shoald.sock (mode 0600, set through the
 * umask so there is no window where another user could connect), telling
 * a stale socket (left by a crash: nothing accepts) from a live daemon's,
 * and accepting connections onto conn.c.  Does not own the lock that keeps
 * a second daemon off the cache (cache_open takes it first, so by the time
 * we get here a socket that refuses connections is stale).
 *
 * Also owns: the limits in force (cfg.lim cut to what RLIMIT_NOFILE
 * leaves: half of the descriptors beyond DAEMON_FD_RESERVE for
 * connections, the rest for descriptors queued to them), refusing a
 * newcomer at the connection cap (an ERROR written straight to its
 * socket, then closed; conn_admit decides), and the accept back-off: when
 * accept fails for want of descriptors or memory the listener pauses 50
 * ms, doubling to 1 s while it keeps failing, instead of spinning on a
 * socket that stays readable; the failures are logged at most once per
 * 10 s with their count.
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/platform.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* Is something accepting on path?  1 yes, 0 no (stale or absent). */
static int socket_alive(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd, alive;

    fd = shoal_socket(AF_UNIX, SOCK_STREAM, 0, 0);
    if (fd < 0)
        return 0;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    alive = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return alive;
}

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000

static shoal_log_limit log_accept, log_refused;

static void server_on_resume(evutil_socket_t fd, short what, void *arg)
{
    shoald *d = arg;
    (void)fd;
    (void)what;
    if (d->ev_accept && !d->stopping)
        event_add(d->ev_accept, NULL);
}

/* accept failed for want of something that frees itself: pause. */
static void server_backoff(shoald *d, int e)
{
    struct timeval tv;
    d->bounds.accept_errors++;
    d->accept_backoff_ms = d->accept_backoff_ms ? d->accept_backoff_ms * 2 : BACKOFF_MIN_MS;
    if (d->accept_backoff_ms > BACKOFF_MAX_MS)
        d->accept_backoff_ms = BACKOFF_MAX_MS;
    LOG_WARN_LIMITED(&log_accept, "server", "accept: %s (%u connections, %u descriptors queued): "
                     "new connections paused for %u ms", strerror(e), d->nconns, d->out_fds,
                     d->accept_backoff_ms);
    event_del(d->ev_accept);
    tv.tv_sec = d->accept_backoff_ms / 1000;
    tv.tv_usec = (suseconds_t)(d->accept_backoff_ms % 1000) * 1000;
    event_add(d->ev_resume, &tv);
}

/* At the cap with nobody to make room for it: say so, close. */
static void server_refuse(shoald *d, int fd, uint32_t uid)
{
    shoal_msg_builder mb = { 0 };
    char msg[200];
    int n = snprintf(msg, sizeof msg, "shoald serves its cap of %u connections (--max-conns): "
                     "try again when one closes", d->lim.conns);
    d->bounds.refused++;
    LOG_WARN_LIMITED(&log_refused, "server", "connection from uid %u refused: %u connections "
                     "open (--max-conns %u)", (unsigned)uid, d->nconns, d->lim.conns);
    shoal_msg_begin(&mb, SHOAL_MSG_ERROR, SHOAL_MSG_F_LAST, 0);
    shoal_msg_put_i32(&mb, SHOAL_EBUSY);
    shoal_msg_put_str(&mb, msg, (size_t)n);
    if (shoal_msg_end(&mb) == 0 && send(fd, mb.buf.data, mb.buf.len, SHOAL_MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        LOG_DEBUG("server", "refusing a connection: %s", strerror(errno));
    shoal_msg_builder_free(&mb);
    close(fd);
}

static void server_on_accept(evutil_socket_t lfd, short what, void *arg)
{
    shoald *d = arg;
    (void)what;
    for (int i = 0; i < 64; i++) {
        uint32_t uid;
        int fd = shoal_accept(lfd, SHOAL_FD_NONBLOCK);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED)
                continue;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
                server_backoff(d, e);
            else if (e != EAGAIN && e != EWOULDBLOCK)
                LOG_WARN_LIMITED(&log_accept, "server", "accept: %s", strerror(e));
            return;
        }
        d->accept_backoff_ms = 0;
        d->bounds.accepted++;
        if (shoal_peer_uid(fd, &uid) != 0)
            uid = (uint32_t)-1;
        if (d->stopping) {
            close(fd);
        } else if (!conn_admit(d, uid)) {
            server_refuse(d, fd, uid);
        } else if (conn_new(d, fd, uid) != 0) {
            close(fd);
        }
    }
}

/* cfg.lim cut to the descriptors this process may open. */
static void server_limits(shoald *d)
{
    struct rlimit rl;
    uint64_t nofile = 1u << 20, spare;
    d->lim = d->cfg.lim;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        nofile = rl.rlim_cur;
    spare = nofile > DAEMON_FD_RESERVE + 4u * (unsigned)d->cfg.parallel + 32
                ? nofile - DAEMON_FD_RESERVE - 4u * (unsigned)d->cfg.parallel : 32;
    if (d->lim.conns > spare / 2)
        d->lim.conns = (unsigned)(spare / 2);
    if (d->lim.fds > spare - d->lim.conns)
        d->lim.fds = (unsigned)(spare - d->lim.conns);
    if (d->lim.conn_fds > d->lim.fds)
        d->lim.conn_fds = d->lim.fds;
    LOG_INFO("server", "limits: %u connections, %u descriptors queued (%u per connection), "
             "%llu MiB buffered, frames within %u s (%llu descriptors open at most)",
             d->lim.conns, d->lim.fds, d->lim.conn_fds,
             (unsigned long long)(d->lim.buffered >> 20), d->lim.frame_secs,
             (unsigned long long)nofile);
}

int server_listen(shoald *d, shoal_err *err)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    const char *path = d->cfg.socket_path;
    struct stat st;
    mode_t old;
    int fd, rc;

    if (strlen(path) >= sizeof sa.sun_path)
        return shoal_err_set(err, SHOAL_ETOOBIG,
                             "socket path %s is too long for a Unix socket (%zu bytes at most): "
                             "use a shorter --home", path, sizeof sa.sun_path - 1);
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return shoal_err_set(err, SHOAL_EEXIST, "%s exists and is not a socket: remove it",
                                 path);
        if (socket_alive(path))
            return shoal_err_set(err, SHOAL_ELOCKED,
                                 "another shoald already serves %s", path);
        LOG_INFO("server", "replacing stale socket %s (nothing was listening)", path);
        if (unlink(path) != 0 && errno != ENOENT)
            return shoal_err_set(err, shoal_err_from_errno(errno), "remove stale socket %s: %s",
                                 path, strerror(errno));
    }
    fd = shoal_socket(AF_UNIX, SOCK_STREAM, 0, SHOAL_FD_NONBLOCK);
    if (fd < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "socket: %s", strerror(errno));
    memcpy(sa.sun_path, path, strlen(path) + 1);
    old = umask(0177);
    rc = bind(fd, (struct sockaddr *)&sa, sizeof sa);
    umask(old);
    if (rc != 0 || chmod(path, 0600) != 0 || listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        return shoal_err_set(err, shoal_err_from_errno(e), "listen on %s: %s", path, strerror(e));
    }
    d->listen_fd = fd;
    server_limits(d);
    d->ev_accept = event_new(d->base, fd, EV_READ | EV_PERSIST, server_on_accept, d);
    d->ev_resume = evtimer_new(d->base, server_on_resume, d);
    if (!d->ev_accept || !d->ev_resume || event_add(d->ev_accept, NULL) != 0) {
        server_close(d);
        return shoal_err_set(err, SHOAL_ENOMEM, "cannot watch the listening socket");
    }
    LOG_INFO("server", "listening on %s", path);
    return 0;
}

void server_close(shoald *d)
{
    if (d->ev_accept) {
        event_free(d->ev_accept);
        d->ev_accept = NULL;
    }
    if (d->ev_resume) {
        event_free(d->ev_resume);
        d->ev_resume = NULL;
    }
    if (d->listen_fd >= 0) {
        close(d->listen_fd);
        d->listen_fd = -1;
        unlink(d->cfg.socket_path);
    }
}
