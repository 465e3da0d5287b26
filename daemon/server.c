/* server.c — shoald's listening socket.
 *
 * Owns: creating $SHOAL_HOME/shoald.sock (mode 0600, set through the
 * umask so there is no window where another user could connect), telling
 * a stale socket (left by a crash: nothing accepts) from a live daemon's,
 * and accepting connections onto conn.c.  Does not own the lock that keeps
 * a second daemon off the cache (cache_open takes it first, so by the time
 * we get here a socket that refuses connections is stale).
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/platform.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <string.h>
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

static void server_on_accept(evutil_socket_t lfd, short what, void *arg)
{
    shoald *d = arg;
    (void)what;
    for (int i = 0; i < 64; i++) {
        int fd = shoal_accept(lfd, SHOAL_FD_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                LOG_WARN("server", "accept: %s", strerror(errno));
            return;
        }
        if (d->stopping || conn_new(d, fd) != 0)
            close(fd);
    }
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
    d->ev_accept = event_new(d->base, fd, EV_READ | EV_PERSIST, server_on_accept, d);
    if (!d->ev_accept || event_add(d->ev_accept, NULL) != 0) {
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
    if (d->listen_fd >= 0) {
        close(d->listen_fd);
        d->listen_fd = -1;
        unlink(d->cfg.socket_path);
    }
}
