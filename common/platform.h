/* platform.h — the platform layer: every call that differs between
 * Linux and macOS (or exists on one only) is made here, so the rest of
 * shoal is POSIX C11 and `make lint` (scripts/lint.sh) refuses a
 * Linux-only header or call anywhere else.
 *
 * Owns: what the system says about the machine (memory and its limits:
 * /proc/meminfo, the memory cgroup v1 and v2, RLIMIT_AS / RLIMIT_DATA;
 * macOS: sysctl hw.memsize and host_statistics64), descriptors (reopening
 * one uncached: O_DIRECT / F_NOCACHE; anonymous and unlinked files:
 * memfd / O_TMPFILE / mkstemp; fallocate, fdatasync, copy_file_range;
 * sockets and pipes with their flags), memory hints (MADV_POPULATE_READ,
 * MADV_HUGEPAGE, MAP_POPULATE, posix_fadvise), and process facts (the
 * descriptor limit, per-thread nice, the binary's path, resident memory,
 * random bytes, qsort_r).  Each has a portable path: `make PORTABLE=1`
 * builds it on Linux so the suite tests what a Mac would run
 * (docs/macos.md).  Does not own what a program does with the numbers
 * (engine/plan/ plans the engine's memory with them).
 *
 * platform.c: memory limits and reopening; platform_os.c: the rest.
 */
#ifndef SHOAL_PLATFORM_H
#define SHOAL_PLATFORM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "common/err.h"

/* Bytes; 0 where the source is absent or unlimited. */
typedef struct shoal_mem_limits {
    uint64_t mem_total;          /* /proc/meminfo MemTotal */
    uint64_t mem_available;      /* /proc/meminfo MemAvailable (not a limit: reported) */
    uint64_t cgroup_max;         /* smallest memory.max (v2) or memory.limit_in_bytes (v1) */
    uint64_t cgroup_high;        /* smallest memory.high (v2) */
    int      cgroup_version;     /* 2, 1, or 0 when no memory cgroup was found */
    uint64_t rlimit_as;          /* RLIMIT_AS soft limit */
    uint64_t rlimit_data;        /* RLIMIT_DATA soft limit */
    /* the smallest of mem_total, cgroup_max, cgroup_high, rlimit_as and
     * rlimit_data that is set, and which one it was ("MemTotal",
     * "cgroup memory.max", "cgroup memory.high",
     * "cgroup memory.limit_in_bytes", "RLIMIT_AS", "RLIMIT_DATA") */
    uint64_t limit;
    char     limit_by[40];
    char     cgroup_file[256];   /* the file that set cgroup_max or cgroup_high */
} shoal_mem_limits;

/* Read the limits.  root: "" or NULL for the real system; a directory
 * holding proc/ and sys/ trees in tests (rlimits always come from
 * getrlimit).  0, or SHOAL_EIO when /proc/meminfo cannot be read (a cgroup
 * that cannot be read is skipped: its limit is then unknown, not zero). */
int shoal_mem_limits_read(const char *root, shoal_mem_limits *out, shoal_err *err);

/* A fresh open file description of the file fd refers to, opened with
 * `flags` (O_RDONLY | O_DIRECT, say) so that fd's own flags and offset stay
 * as they are (Linux: /proc/self/fd).  A new descriptor, or -1 with errno. */
int shoal_fd_reopen(int fd, int flags);


/* ---- which paths this build takes ------------------------------------------
 * SHOAL_PLATFORM_LINUX is 1 on Linux unless the build is PORTABLE
 * (-DSHOAL_PORTABLE, `make PORTABLE=1`): then every Linux fast path below
 * is replaced by the POSIX fallback macOS takes, so the fallbacks run under
 * the same tests here.  __APPLE__ adds the few calls only macOS has
 * (F_NOCACHE, F_PREALLOCATE, sysctl, host_statistics64, F_FULLFSYNC);
 * those are written but have not been compiled or run on a Mac. */
#if defined(__linux__) && !defined(SHOAL_PORTABLE)
#define SHOAL_PLATFORM_LINUX 1
#else
#define SHOAL_PLATFORM_LINUX 0
#endif
/* "linux", "linux-portable", "macos" or "posix": which paths this build
 * takes, for messages and tests. */
const char *shoal_platform_name(void);

/* ---- files ------------------------------------------------------------------ */

/* An unlinked read-write file in memory, close-on-exec, for a descriptor
 * passed to another process or a buffer too large for the heap (Linux:
 * memfd_create).  Elsewhere an unlinked file in $TMPDIR (else /tmp):
 * macOS's shm_open objects take no write(), so they would not do.  fd or
 * -1 with errno. */
int shoal_anon_file(const char *name);
/* The same, holding the n bytes p, read-only from then on (Linux: a memfd
 * sealed against writes, growth and shrinking; elsewhere a read-only
 * descriptor of the unlinked file), its offset at 0.  fd or -1. */
int shoal_sealed_file(const char *name, const void *p, size_t n);
/* An unlinked read-write file on the file system of dir (Linux:
 * O_TMPFILE; elsewhere mkstemp + unlink).  fd or -1 with errno. */
int shoal_tmpfile(const char *dir);

/* A new descriptor for reading fd's file that bypasses the page cache
 * where the system can (Linux: O_DIRECT, whose reads need 4096-aligned
 * buffers, offsets and lengths; macOS: F_NOCACHE with read-ahead off).
 * The PORTABLE build reopens without either: reads are cached.  -1 with
 * errno where the file system refuses (tmpfs: EINVAL): read fd itself. */
int shoal_fd_open_uncached(int fd);
/* Advice that [off, off+len) of fd will not be read again soon: its
 * cached pages may go (posix_fadvise DONTNEED; nothing on macOS, whose
 * posix_fadvise does not exist). */
void shoal_cache_drop(int fd, off_t off, off_t len);

/* mode for shoal_fallocate: keep the file's size (Linux FALLOC_FL_KEEP_SIZE) */
#define SHOAL_FALLOC_KEEP_SIZE 1
/* Allocate blocks for [off, off+len) of fd (mode 0: and grow the file to
 * cover them).  Linux: fallocate; macOS: F_PREALLOCATE (then ftruncate for
 * mode 0); PORTABLE: posix_fallocate for mode 0, and EOPNOTSUPP for
 * KEEP_SIZE (callers then write without reserving, as on a file system
 * without fallocate).  0 or -1 with errno. */
int shoal_fallocate(int fd, int mode, off_t off, off_t len);
/* fdatasync (Linux); macOS: F_FULLFSYNC, since its fsync leaves the data
 * in the drive's cache; else fsync. */
int shoal_fdatasync(int fd);
/* Copy n bytes from in_fd at *in to out_fd at *out in the kernel (Linux:
 * copy_file_range), advancing both.  Bytes copied, or -1 with errno:
 * ENOSYS where there is no such call (read and write instead). */
ssize_t shoal_copy_range(int in_fd, off_t *in, int out_fd, off_t *out, size_t n);
/* Whether dir is on a RAM file system (tmpfs, ramfs): 1, 0, or 0 where
 * it cannot be told (PORTABLE). */
int shoal_fs_in_ram(const char *dir);
/* A file's modification time, nanoseconds since the epoch. */
int64_t shoal_stat_mtime_ns(const struct stat *st);

/* ---- memory ------------------------------------------------------------------ */

/* MAP_POPULATE where there is one (0 elsewhere: pages fault in on use). */
#if SHOAL_PLATFORM_LINUX
#define SHOAL_MAP_POPULATE MAP_POPULATE
#else
#define SHOAL_MAP_POPULATE 0
#endif
/* Fault the pages of [p, p+n) in for reading (MADV_POPULATE_READ; on
 * kernels before 5.14 and elsewhere: a read of each page).  0, or -1 with
 * errno when the kernel reports an error (an I/O error on the file). */
int shoal_populate_read(const void *p, size_t n);
/* Ask for transparent huge pages for [p, p+n) (MADV_HUGEPAGE): a hint,
 * nothing where there are none (macOS, PORTABLE). */
void shoal_hugepage_hint(void *p, size_t n);

/* ---- processes -------------------------------------------------------------- */

/* Raise the soft descriptor limit as far as the hard one allows (macOS:
 * and no further than kern.maxfilesperproc / OPEN_MAX, the values its
 * setrlimit takes).  The soft limit after, 0 when unknown. */
uint64_t shoal_fd_limit_raise(void);
/* Lower the calling thread's priority by nice (Linux's nice value is per
 * thread).  Elsewhere nice values are per process: -1 with ENOTSUP. */
int shoal_thread_nice(int nice);
/* The running binary's path (Linux /proc/self/exe; macOS
 * _NSGetExecutablePath).  0, or -1 (out empty). */
int shoal_exe_path(char *out, size_t cap);
/* Resident and peak resident bytes of process pid (0: this one); anon:
 * the anonymous part of rss where known (Linux RssAnon), else rss.
 * Linux: /proc/PID/status; elsewhere getrusage for this process (rss and
 * anon then unknown: 0) and -1 with ENOTSUP for another. */
int shoal_proc_mem(pid_t pid, uint64_t *rss, uint64_t *anon, uint64_t *peak);
/* Fill p with n random bytes from the kernel (getrandom / getentropy).
 * 0 or -1. */
int shoal_random(void *p, size_t n);
/* qsort_r with glibc's argument order (cmp(a, b, arg)); macOS's qsort_r
 * takes them the other way round, so the portable path sorts itself. */
void shoal_qsort_r(void *base, size_t n, size_t size,
                   int (*cmp)(const void *, const void *, void *), void *arg);

/* ---- descriptors and sockets -------------------------------------------------- */

/* flags for shoal_socket, shoal_accept and shoal_pipe (close-on-exec is
 * always set on sockets; on pipes when SHOAL_FD_CLOEXEC is given). */
#define SHOAL_FD_NONBLOCK 1
#define SHOAL_FD_CLOEXEC  2
/* socket(2), close-on-exec (SOCK_CLOEXEC, or fcntl after), non-blocking
 * with SHOAL_FD_NONBLOCK, and on macOS SO_NOSIGPIPE (where MSG_NOSIGNAL
 * may be missing). */
int shoal_socket(int domain, int type, int protocol, int flags);
/* accept(2) the same way (accept4 on Linux). */
int shoal_accept(int lfd, int flags);
/* The user id of a Unix socket's peer: SO_PEERCRED on Linux (in PORTABLE
 * builds too: it is what Linux has, not a fast path), getpeereid(3) on
 * macOS and the BSDs.  -1 with errno when it cannot be told. */
int shoal_peer_uid(int fd, uint32_t *uid);
/* pipe(2) with the flags (pipe2 on Linux). */
int shoal_pipe(int p[2], int flags);
/* MSG_NOSIGNAL where the system has it; 0 elsewhere (sockets from
 * shoal_socket/shoal_accept then carry SO_NOSIGPIPE). */
#ifdef MSG_NOSIGNAL
#define SHOAL_MSG_NOSIGNAL MSG_NOSIGNAL
#else
#define SHOAL_MSG_NOSIGNAL 0
#endif

#endif
