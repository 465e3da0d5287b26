/* io.c — the system-call table of the write path (see cache_test.h).
 *
 * Owns: the process-wide table and small wrappers that retry EINTR and
 * short writes.  Every call in cache/ that changes the disk goes through
 * here, so tests can inject faults at any of them.
 */
#include "cache/cache_int.h"
#include "common/platform.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

static int sys_open(const char *path, int flags, mode_t mode) { return open(path, flags, mode); }
static ssize_t sys_write(int fd, const void *p, size_t n) { return write(fd, p, n); }
static ssize_t sys_pwrite(int fd, const void *p, size_t n, off_t off) { return pwrite(fd, p, n, off); }
static int sys_fsync(int fd) { return fsync(fd); }
static int sys_fdatasync(int fd) { return shoal_fdatasync(fd); }
static int sys_rename(const char *a, const char *b) { return rename(a, b); }
static int sys_unlink(const char *p) { return unlink(p); }
static int sys_ftruncate(int fd, off_t len) { return ftruncate(fd, len); }
static int sys_fallocate(int fd, int mode, off_t off, off_t len) { return shoal_fallocate(fd, mode, off, len); }

static const cache_io io_real = {
    sys_open, sys_write, sys_pwrite, sys_fsync, sys_fdatasync,
    sys_rename, sys_unlink, sys_ftruncate, sys_fallocate,
};

cache_io cache_io_now = {
    sys_open, sys_write, sys_pwrite, sys_fsync, sys_fdatasync,
    sys_rename, sys_unlink, sys_ftruncate, sys_fallocate,
};

void cache_test_io_default(cache_io *out)
{
    *out = io_real;
}

void cache_test_io_set(const cache_io *io)
{
    cache_io_now = io ? *io : io_real;
}

int cache_io_write_all(int fd, const void *p, size_t n)
{
    const char *q = p;
    while (n > 0) {
        ssize_t k = cache_io_now.write(fd, q, n);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (k == 0) {
            errno = EIO;
            return -1;
        }
        q += k;
        n -= (size_t)k;
    }
    return 0;
}
