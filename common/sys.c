/* sys.c — clocks and all-or-error I/O. */
#include "common/sys.h"
#include "common/path.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

uint64_t shoal_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int64_t shoal_wall_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

int shoal_write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return shoal_err_from_errno(errno);
        }
        if (w == 0)
            return SHOAL_EIO;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int shoal_pread_all(int fd, void *p, size_t n, off_t off)
{
    char *c = p;
    while (n > 0) {
        ssize_t r = pread(fd, c, n, off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return shoal_err_from_errno(errno);
        }
        if (r == 0)
            return SHOAL_ERANGE;
        c += r;
        n -= (size_t)r;
        off += r;
    }
    return 0;
}

int shoal_read_file(const char *path, size_t max, shoal_buf *out, shoal_err *err)
{
    char chunk[65536];
    int fd = open(path, O_RDONLY | O_CLOEXEC), rc = 0;
    size_t total = 0;

    if (fd < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", path, strerror(errno));
    for (;;) {
        ssize_t r = read(fd, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", path, strerror(errno));
            break;
        }
        if (r == 0)
            break;
        total += (size_t)r;
        if (max && total > max) {
            rc = shoal_err_set(err, SHOAL_ETOOBIG, "%s: larger than %zu bytes", path, max);
            break;
        }
        if (shoal_buf_append(out, chunk, (size_t)r)) {
            rc = shoal_err_set(err, SHOAL_ENOMEM, "%s: out of memory", path);
            break;
        }
    }
    close(fd);
    return rc;
}

int shoal_write_file_atomic(const char *path, const void *p, size_t n, shoal_err *err)
{
    char tmp[SHOAL_PATH_MAX], dir[SHOAL_PATH_MAX];
    int fd, rc;

    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return shoal_err_set(err, SHOAL_ETOOBIG, "path too long: %s", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", tmp, strerror(errno));
    rc = shoal_write_all(fd, p, n);
    if (!rc && fsync(fd) != 0)
        rc = shoal_err_from_errno(errno);
    close(fd);
    if (!rc && rename(tmp, path) != 0)
        rc = shoal_err_from_errno(errno);
    if (rc) {
        unlink(tmp);
        return shoal_err_set(err, rc, "write %s: %s", path, shoal_strerror(rc));
    }
    snprintf(dir, sizeof dir, "%s", path);
    fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    return 0;
}

int shoal_is_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}
