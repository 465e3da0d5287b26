/* sys.h — small system helpers: clocks, whole reads and writes, files.
 *
 * Owns: retrying EINTR and short transfers so callers see all-or-error.
 */
#ifndef SHOAL_SYS_H
#define SHOAL_SYS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/buf.h"
#include "common/err.h"

/* Monotonic nanoseconds, for durations. */
uint64_t shoal_now_ns(void);
/* Wall-clock milliseconds since the epoch, for records people read. */
int64_t shoal_wall_ms(void);

/* Write all n bytes (retrying EINTR and short writes).  0 or a negative
 * code from errno (SHOAL_ENOSPC for a full disk). */
int shoal_write_all(int fd, const void *p, size_t n);
/* 1 when s is exactly n lowercase hex digits (a sha256 or git sha1 etag),
 * else 0. */
int shoal_is_hex(const char *s, size_t n);
/* Read exactly n bytes at off.  0, SHOAL_ERANGE on early end of file, or
 * a code from errno. */
int shoal_pread_all(int fd, void *p, size_t n, off_t off);

/* Append a whole file (at most max bytes, 0 = no limit) to out. */
int shoal_read_file(const char *path, size_t max, shoal_buf *out, shoal_err *err);

/* Write a file atomically: tmp beside it, fsync, rename, fsync the dir. */
int shoal_write_file_atomic(const char *path, const void *p, size_t n, shoal_err *err);

#endif
