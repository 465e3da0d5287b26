/* cache_test.h — FOR TESTS ONLY: the system calls of the cache's write path.
 *
 * Owns: the table through which cache/ makes every system call that
 * changes the disk (open, write, pwrite, fsync, fdatasync, rename, unlink,
 * ftruncate, fallocate), the way SQLite's os_unix.c routes its calls
 * through aSyscall[], so a test can make one of them fail (ENOSPC, EIO) at
 * a chosen moment.  The table is process-wide and not locked: change it
 * only while no cache handle is in use on another thread.  Programs other
 * than tests never include this header.
 */
#ifndef SHOAL_CACHE_TEST_H
#define SHOAL_CACHE_TEST_H

#include <sys/types.h>

typedef struct cache_io {
    int     (*open)(const char *path, int flags, mode_t mode);
    ssize_t (*write)(int fd, const void *p, size_t n);
    ssize_t (*pwrite)(int fd, const void *p, size_t n, off_t off);
    int     (*fsync)(int fd);
    int     (*fdatasync)(int fd);
    int     (*rename)(const char *from, const char *to);
    int     (*unlink)(const char *path);
    int     (*ftruncate)(int fd, off_t len);
    int     (*fallocate)(int fd, int mode, off_t off, off_t len);
} cache_io;

/* The real calls. */
void cache_test_io_default(cache_io *out);
/* Replace the table (a copy is taken); NULL restores the real calls. */
void cache_test_io_set(const cache_io *io);

#endif
