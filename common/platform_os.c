/* platform_os.c — the platform layer's descriptors, memory hints and
 * process facts (see platform.h).  Each function has its Linux path
 * (SHOAL_PLATFORM_LINUX), the macOS additions (__APPLE__: written, not yet
 * built on a Mac) and the POSIX path both the PORTABLE build and macOS
 * take, so what a Mac runs is what `make test PORTABLE=1` tests.
 */
#include "common/platform.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/path.h"
#include "common/sys.h"

#if SHOAL_PLATFORM_LINUX
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#elif defined(__APPLE__)
#include <mach-o/dyld.h>
#include <sys/random.h>
#include <sys/sysctl.h>
#endif

const char *shoal_platform_name(void)
{
#if SHOAL_PLATFORM_LINUX
    return "linux";
#elif defined(__linux__)
    return "linux-portable";
#elif defined(__APPLE__)
    return "macos";
#else
    return "posix";
#endif
}

/* ---- files ------------------------------------------------------------------ */

/* mkstemp in dir, unlinked; *path_out (cap bytes) keeps the name it had
 * when path_out is given (the caller unlinks then). */
static int tmp_in(const char *dir, char *path_out, size_t cap)
{
    char path[SHOAL_PATH_MAX];
    int fd;

    if ((size_t)snprintf(path, sizeof path, "%s/.shoal-XXXXXX", dir) >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    fd = mkstemp(path);
    if (fd < 0)
        return -1;
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    if (path_out)
        snprintf(path_out, cap, "%s", path);
    else
        unlink(path);
    return fd;
}

#if !SHOAL_PLATFORM_LINUX
static const char *tmp_dir(void)
{
    const char *t = getenv("TMPDIR");   /* lint: allow (where temp files go is the system's) */
    return t && *t ? t : "/tmp";
}
#endif

int shoal_anon_file(const char *name)
{
#if SHOAL_PLATFORM_LINUX
    return memfd_create(name, MFD_CLOEXEC);
#else
    (void)name;
    return tmp_in(tmp_dir(), NULL, 0);
#endif
}

int shoal_sealed_file(const char *name, const void *p, size_t n)
{
#if SHOAL_PLATFORM_LINUX
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (shoal_write_all(fd, p, n) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    lseek(fd, 0, SEEK_SET);
    return fd;
#else
    /* no seals: the receiver gets a read-only descriptor of a file that
     * no longer has a name, so nobody can write it */
    char path[SHOAL_PATH_MAX];
    int wfd, rfd;
    (void)name;
    if ((wfd = tmp_in(tmp_dir(), path, sizeof path)) < 0)
        return -1;
    rfd = open(path, O_RDONLY | O_CLOEXEC);
    unlink(path);
    if (rfd < 0 || shoal_write_all(wfd, p, n) != 0) {
        int e = errno;
        close(wfd);
        if (rfd >= 0)
            close(rfd);
        errno = e;
        return -1;
    }
    close(wfd);
    return rfd;
#endif
}

int shoal_tmpfile(const char *dir)
{
#if SHOAL_PLATFORM_LINUX
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL))
        return fd;   /* a file system without O_TMPFILE: the portable way */
#endif
    return tmp_in(dir, NULL, 0);
}

int shoal_fd_open_uncached(int fd)
{
#if SHOAL_PLATFORM_LINUX
    return shoal_fd_reopen(fd, O_RDONLY | O_DIRECT);
#elif defined(__APPLE__)
    int nfd = shoal_fd_reopen(fd, O_RDONLY);
    if (nfd < 0)
        return -1;
    if (fcntl(nfd, F_NOCACHE, 1) != 0 || fcntl(nfd, F_RDAHEAD, 0) != 0) {
        close(nfd);
        errno = EINVAL;
        return -1;
    }
    return nfd;
#else
    return shoal_fd_reopen(fd, O_RDONLY);
#endif
}

void shoal_cache_drop(int fd, off_t off, off_t len)
{
#if SHOAL_PLATFORM_LINUX
    (void)posix_fadvise(fd, off, len, POSIX_FADV_DONTNEED);
#else
    (void)fd;
    (void)off;
    (void)len;
#endif
}

int shoal_fallocate(int fd, int mode, off_t off, off_t len)
{
#if SHOAL_PLATFORM_LINUX
    return fallocate(fd, mode & SHOAL_FALLOC_KEEP_SIZE ? FALLOC_FL_KEEP_SIZE : 0, off, len);
#elif defined(__APPLE__)
    struct stat st;
    fstore_t fs;
    if (fstat(fd, &st) != 0)
        return -1;
    memset(&fs, 0, sizeof fs);   /* from the end of what is allocated: past the size */
    fs.fst_flags = F_ALLOCATECONTIG;
    fs.fst_posmode = F_PEOFPOSMODE;
    fs.fst_length = off + len > st.st_size ? off + len - st.st_size : 0;
    if (fs.fst_length && fcntl(fd, F_PREALLOCATE, &fs) != 0) {
        fs.fst_flags = F_ALLOCATEALL;             /* not contiguous, then */
        if (fcntl(fd, F_PREALLOCATE, &fs) != 0)
            return -1;
    }
    if (!(mode & SHOAL_FALLOC_KEEP_SIZE) && off + len > st.st_size)
        return ftruncate(fd, off + len);
    return 0;
#else
    int rc;
    if (mode & SHOAL_FALLOC_KEEP_SIZE) {
        errno = EOPNOTSUPP;
        return -1;
    }
    rc = posix_fallocate(fd, off, len);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return 0;
#endif
}

int shoal_fdatasync(int fd)
{
#if SHOAL_PLATFORM_LINUX
    return fdatasync(fd);
#elif defined(__APPLE__)
    return fcntl(fd, F_FULLFSYNC) == 0 ? 0 : fsync(fd);
#else
    return fsync(fd);
#endif
}

ssize_t shoal_copy_range(int in_fd, off_t *in, int out_fd, off_t *out, size_t n)
{
#if SHOAL_PLATFORM_LINUX
    loff_t i = (loff_t)*in, o = (loff_t)*out;
    ssize_t k = copy_file_range(in_fd, &i, out_fd, &o, n, 0);
    *in = (off_t)i;
    *out = (off_t)o;
    return k;
#else
    (void)in_fd;
    (void)in;
    (void)out_fd;
    (void)out;
    (void)n;
    errno = ENOSYS;
    return -1;
#endif
}

int shoal_fs_in_ram(const char *dir)
{
#if SHOAL_PLATFORM_LINUX
    struct statfs sf;
    return statfs(dir, &sf) == 0 &&
           ((unsigned long)sf.f_type == 0x01021994ul ||     /* TMPFS_MAGIC */
            (unsigned long)sf.f_type == 0x858458f6ul);      /* RAMFS_MAGIC */
#else
    (void)dir;
    return 0;
#endif
}

int64_t shoal_stat_mtime_ns(const struct stat *st)
{
#if defined(__APPLE__)
    return (int64_t)st->st_mtimespec.tv_sec * 1000000000 + st->st_mtimespec.tv_nsec;
#else
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
#endif
}

/* ---- memory ------------------------------------------------------------------ */

static int touch(const void *p, size_t n)
{
    volatile const unsigned char *c = p;
    long pg = sysconf(_SC_PAGESIZE);
    size_t step = pg > 0 ? (size_t)pg : 4096;
    unsigned char sum = 0;
    uintptr_t first = (uintptr_t)p / step * step;

    if (n == 0)
        return 0;
    sum ^= c[0];
    for (uintptr_t a = first + step; a < (uintptr_t)p + n; a += step)
        sum ^= c[a - (uintptr_t)p];
    (void)sum;
    return 0;
}

int shoal_populate_read(const void *p, size_t n)
{
#if SHOAL_PLATFORM_LINUX && defined(MADV_POPULATE_READ)
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t step = pg > 0 ? (uintptr_t)pg : 4096;
    uintptr_t a = (uintptr_t)p / step * step, e = (uintptr_t)p + n;
    if (n == 0)
        return 0;
    if (madvise((void *)a, e - a, MADV_POPULATE_READ) == 0)
        return 0;
    if (errno != EINVAL)
        return -1;   /* EFAULT, EIO, ENOMEM: what the caller must hear */
#endif
    return touch(p, n);   /* kernels before 5.14, and elsewhere */
}

void shoal_hugepage_hint(void *p, size_t n)
{
#if SHOAL_PLATFORM_LINUX
    (void)madvise(p, n, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

/* ---- processes -------------------------------------------------------------- */

uint64_t shoal_fd_limit_raise(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = rl;
        want.rlim_cur = rl.rlim_max;
#if defined(__APPLE__)
        {   /* macOS refuses a soft limit past kern.maxfilesperproc */
            int mf = 0;
            size_t len = sizeof mf;
            rlim_t cap = OPEN_MAX;
            if (sysctlbyname("kern.maxfilesperproc", &mf, &len, NULL, 0) == 0 && mf > 0)
                cap = (rlim_t)mf;
            if (want.rlim_cur > cap)
                want.rlim_cur = cap;
        }
#endif
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl = want;
    }
    return rl.rlim_cur == RLIM_INFINITY ? 0 : (uint64_t)rl.rlim_cur;
}

int shoal_thread_nice(int nice)
{
#if SHOAL_PLATFORM_LINUX
    return setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice);
#else
    (void)nice;
    errno = ENOTSUP;
    return -1;
#endif
}

int shoal_exe_path(char *out, size_t cap)
{
#if defined(__APPLE__)
    char raw[PATH_MAX], real[PATH_MAX];
    uint32_t sz = sizeof raw;
    if (cap && _NSGetExecutablePath(raw, &sz) == 0 && realpath(raw, real) &&
        strlen(real) < cap) {
        memcpy(out, real, strlen(real) + 1);
        return 0;
    }
#elif defined(__linux__)
    /* the PORTABLE build too: there is no POSIX way, and only doctor asks */
    ssize_t n = cap > 1 ? readlink("/proc/self/exe", out, cap - 1) : -1;
    if (n > 0) {
        out[n] = 0;
        return 0;
    }
#endif
    if (cap)
        out[0] = 0;
    return -1;
}

#if SHOAL_PLATFORM_LINUX
static uint64_t status_kb(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    return p ? strtoull(p + strlen(key), NULL, 10) * 1024 : 0;
}
#endif

int shoal_proc_mem(pid_t pid, uint64_t *rss, uint64_t *anon, uint64_t *peak)
{
    *rss = *anon = *peak = 0;
#if SHOAL_PLATFORM_LINUX
    char path[64];
    shoal_buf b;
    int rc = -1;
    snprintf(path, sizeof path, "/proc/%d/status", pid ? (int)pid : (int)getpid());
    shoal_buf_init(&b, 0);
    if (shoal_read_file(path, 1u << 20, &b, NULL) == 0 && shoal_buf_append_u8(&b, 0) == 0) {
        *rss = status_kb((const char *)b.data, "\nVmRSS:");
        *anon = status_kb((const char *)b.data, "\nRssAnon:");
        *peak = status_kb((const char *)b.data, "\nVmHWM:");
        rc = 0;
    }
    shoal_buf_free(&b);
    return rc;
#else
    struct rusage ru;
    if (pid && pid != getpid()) {
        errno = ENOTSUP;
        return -1;
    }
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return -1;
#if defined(__APPLE__)
    *peak = (uint64_t)ru.ru_maxrss;          /* bytes on macOS */
#else
    *peak = (uint64_t)ru.ru_maxrss * 1024;   /* KiB elsewhere */
#endif
    return 0;
#endif
}

int shoal_random(void *p, size_t n)
{
    unsigned char *c = p;
#if SHOAL_PLATFORM_LINUX
    while (n > 0) {
        ssize_t k = getrandom(c, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        c += k;
        n -= (size_t)k;
    }
    return 0;
#else
    while (n > 0) {   /* getentropy: POSIX 2024, glibc 2.25, macOS 10.12 */
        size_t k = n < 256 ? n : 256;
        if (getentropy(c, k) != 0)
            return -1;
        c += k;
        n -= k;
    }
    return 0;
#endif
}

#if !SHOAL_PLATFORM_LINUX
/* qsort with a context through a thread-local: macOS's qsort_r passes
 * (arg, a, b), glibc's (a, b, arg); qsort itself is the same everywhere. */
typedef struct sort_ctx_t {
    int (*cmp)(const void *, const void *, void *);
    void *arg;
} sort_ctx_t;
static _Thread_local sort_ctx_t sort_ctx;

static int sort_tramp(const void *a, const void *b)
{
    return sort_ctx.cmp(a, b, sort_ctx.arg);
}
#endif

void shoal_qsort_r(void *base, size_t n, size_t size,
                   int (*cmp)(const void *, const void *, void *), void *arg)
{
#if SHOAL_PLATFORM_LINUX
    qsort_r(base, n, size, cmp, arg);
#else
    sort_ctx_t saved = sort_ctx;   /* a comparator that sorts too */
    sort_ctx.cmp = cmp;
    sort_ctx.arg = arg;
    qsort(base, n, size, sort_tramp);
    sort_ctx = saved;
#endif
}

/* ---- descriptors and sockets -------------------------------------------------- */

#if !SHOAL_PLATFORM_LINUX
/* Set close-on-exec / non-blocking on fd (flags as for shoal_socket), and
 * SO_NOSIGPIPE on a socket where the system has it.  fd, or -1 (closed). */
static int fd_flags(int fd, int flags, int sock)
{
    if (fd < 0)
        return -1;
    if (((flags & SHOAL_FD_CLOEXEC) && fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) ||
        ((flags & SHOAL_FD_NONBLOCK) &&
         fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
#ifdef SO_NOSIGPIPE
    if (sock) {
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
    }
#else
    (void)sock;
#endif
    return fd;
}
#endif

int shoal_socket(int domain, int type, int protocol, int flags)
{
#if SHOAL_PLATFORM_LINUX
    return socket(domain, type | SOCK_CLOEXEC | (flags & SHOAL_FD_NONBLOCK ? SOCK_NONBLOCK : 0),
                  protocol);
#else
    return fd_flags(socket(domain, type, protocol), flags | SHOAL_FD_CLOEXEC, 1);
#endif
}

int shoal_accept(int lfd, int flags)
{
#if SHOAL_PLATFORM_LINUX
    return accept4(lfd, NULL, NULL, SOCK_CLOEXEC | (flags & SHOAL_FD_NONBLOCK ? SOCK_NONBLOCK : 0));
#else
    /* macOS: an accepted socket does not inherit O_NONBLOCK; set it */
    return fd_flags(accept(lfd, NULL, NULL), flags | SHOAL_FD_CLOEXEC, 1);
#endif
}

int shoal_peer_uid(int fd, uint32_t *uid)
{
#ifdef __linux__
    struct ucred cr = { 0 };
    socklen_t cl = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) != 0)
        return -1;
    *uid = (uint32_t)cr.uid;
#else
    uid_t u;
    gid_t g;
    if (getpeereid(fd, &u, &g) != 0)
        return -1;
    *uid = (uint32_t)u;
#endif
    return 0;
}

int shoal_pipe(int p[2], int flags)
{
#if SHOAL_PLATFORM_LINUX
    return pipe2(p, (flags & SHOAL_FD_CLOEXEC ? O_CLOEXEC : 0) |
                    (flags & SHOAL_FD_NONBLOCK ? O_NONBLOCK : 0));
#else
    if (pipe(p) != 0)
        return -1;
    if (fd_flags(p[0], flags, 0) < 0) {
        close(p[1]);
        return -1;
    }
    if (fd_flags(p[1], flags, 0) < 0) {
        close(p[0]);
        return -1;
    }
    return 0;
#endif
}
