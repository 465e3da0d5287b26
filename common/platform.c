/* platform.c — memory limits from /proc (macOS: sysctl and the Mach host
 * statistics; PORTABLE: sysconf), the memory cgroup and rlimits, and
 * reopening a descriptor (see platform.h).
 *
 * The cgroup: /proc/self/cgroup names the process's group per hierarchy
 * ("0::/path" for v2, "N:...memory...:/path" for v1); /proc/self/mountinfo
 * says where each hierarchy is mounted and which of its paths the mount
 * shows (a container's mount root is its own group).  A limit set on an
 * ancestor applies too, so every directory from the group up to the
 * mount's root is read and the smallest limit wins.  Machines differ: v2
 * alone (current distributions), v1 alone, or both at once (a v1 memory
 * controller beside a v2 mount without it, as on this project's VMs), so
 * both are read.
 */
#include "common/platform.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <limits.h>
#include <mach/mach.h>
#include <sys/sysctl.h>
#endif

#include "common/buf.h"
#include "common/path.h"
#include "common/sys.h"

/* "unlimited" as the kernels spell it: v2 writes "max", v1 a page-rounded
 * LONG_MAX (9223372036854771712). */
#define LIMIT_NONE ((uint64_t)1 << 62)

/* The whole small file root/rel, NUL-terminated, into b (reset first). */
static int read_text(const char *root, const char *rel, shoal_buf *b)
{
    char path[SHOAL_PATH_MAX];

    shoal_buf_reset(b);
    if ((size_t)snprintf(path, sizeof path, "%s%s", root, rel) >= sizeof path)
        return SHOAL_ETOOBIG;
    if (shoal_read_file(path, 8u << 20, b, NULL) != 0 || shoal_buf_append_u8(b, 0) != 0)
        return SHOAL_EIO;
    return 0;
}

/* "Key:   123 kB" in /proc/meminfo, in bytes (0 when absent). */
static uint64_t meminfo_get(const char *text, const char *key)
{
    const char *p = text;
    size_t kl = strlen(key);

    while ((p = strstr(p, key)) != NULL) {
        if ((p == text || p[-1] == '\n') && p[kl] == ':')
            return strtoull(p + kl + 1, NULL, 10) * 1024;
        p += kl;
    }
    return 0;
}

/* A limit file's value: a byte count, or 0 for "max" / absent / huge. */
static uint64_t limit_value(const char *text)
{
    char *end;
    unsigned long long v;

    if (strncmp(text, "max", 3) == 0)
        return 0;
    v = strtoull(text, &end, 10);
    if (end == text || v >= LIMIT_NONE)
        return 0;
    return (uint64_t)v;
}

/* mountinfo escapes spaces and the like as \ooo. */
static void unescape(char *s)
{
    char *o = s;
    for (char *p = s; *p; p++) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '7' && p[2] >= '0' && p[2] <= '7' &&
            p[3] >= '0' && p[3] <= '7') {
            *o++ = (char)((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 3;
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
}

/* The mount of hierarchy `fstype` ("cgroup2", or "cgroup" with the
 * `memory` super option): its mount point and the group path it shows.
 * 0 when found. */
static int mount_find(const char *mountinfo, const char *fstype, char *mnt, size_t mcap,
                      char *mroot, size_t rcap)
{
    const char *line = mountinfo;

    while (line && *line) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char buf[2048], *f[6] = { 0 }, *sep, *save = NULL;
        if (len < sizeof buf) {
            memcpy(buf, line, len);
            buf[len] = 0;
            sep = strstr(buf, " - ");
            if (sep) {
                char *after = sep + 3, *tok;
                int n = 0;
                *sep = 0;
                for (tok = strtok_r(buf, " ", &save); tok && n < 5; tok = strtok_r(NULL, " ", &save))
                    f[n++] = tok;
                char *ft = strtok_r(after, " ", &save);
                strtok_r(NULL, " ", &save);                 /* the source */
                char *super = strtok_r(NULL, " ", &save);
                int memory = 0;
                for (char *o = super; o && *o;) {
                    char *comma = strchr(o, ',');
                    size_t ol = comma ? (size_t)(comma - o) : strlen(o);
                    memory |= ol == 6 && strncmp(o, "memory", 6) == 0;
                    o = comma ? comma + 1 : NULL;
                }
                if (n == 5 && ft && strcmp(ft, fstype) == 0 &&
                    (strcmp(fstype, "cgroup2") == 0 || memory)) {
                    unescape(f[3]);
                    unescape(f[4]);
                    snprintf(mroot, rcap, "%s", f[3]);
                    snprintf(mnt, mcap, "%s", f[4]);
                    return 0;
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    return -1;
}

/* The process's group in hierarchy v (2: "0::", 1: the line naming the
 * memory controller), into path.  0 when found. */
static int group_find(const char *cgroup, int v, char *path, size_t cap)
{
    const char *line = cgroup;

    while (line && *line) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (c2) {
            size_t cl = (size_t)(c2 - c1 - 1), pl = len - (size_t)(c2 + 1 - line);
            int match = 0;
            if (v == 2)
                match = c1 - line == 1 && line[0] == '0' && cl == 0;
            else
                for (const char *o = c1 + 1; o < c2;) {
                    const char *comma = memchr(o, ',', (size_t)(c2 - o));
                    size_t ol = comma ? (size_t)(comma - o) : (size_t)(c2 - o);
                    match |= ol == 6 && strncmp(o, "memory", 6) == 0;
                    o = comma ? comma + 1 : c2;
                }
            if (match && pl < cap) {
                memcpy(path, c2 + 1, pl);
                path[pl] = 0;
                return 0;
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    return -1;
}

/* Smallest value of `file` in the group dir and each ancestor up to the
 * mount point; *where names the file that had it.  0 when none is set. */
static uint64_t walk_limit(const char *root, const char *mnt, const char *rel,
                           const char *file, shoal_buf *b, char *where, size_t wcap)
{
    char dir[SHOAL_PATH_MAX], f[SHOAL_PATH_MAX];
    size_t mlen = strlen(mnt);
    uint64_t best = 0;

    while (mlen > 1 && mnt[mlen - 1] == '/')
        mlen--;
    if ((size_t)snprintf(dir, sizeof dir, "%.*s%s", (int)mlen, mnt, rel) >= sizeof dir)
        return 0;
    for (;;) {
        size_t dl = strlen(dir);
        while (dl > mlen && dir[dl - 1] == '/')
            dir[--dl] = 0;
        if ((size_t)snprintf(f, sizeof f, "%s/%s", dir, file) < sizeof f &&
            read_text(root, f, b) == 0) {
            uint64_t v = limit_value((const char *)b->data);
            if (v && (!best || v < best)) {
                size_t fl = strlen(f) < wcap ? strlen(f) : wcap - 1;
                best = v;
                memcpy(where, f, fl);
                where[fl] = 0;
            }
        }
        char *slash = strrchr(dir, '/');
        if (dl <= mlen || !slash)
            break;
        if ((size_t)(slash - dir) < mlen)
            dir[mlen] = 0;                 /* the mount point itself, last */
        else
            *slash = 0;
    }
    return best;
}

/* One hierarchy: v2 (memory.max, memory.high) or v1 (memory.limit_in_bytes). */
static void cgroup_read(const char *root, const char *mountinfo, const char *cgroup, int v,
                        shoal_mem_limits *out, shoal_buf *b)
{
    char mnt[1024], mroot[1024], group[1024], where[256] = "";
    const char *rel;
    uint64_t max, high = 0;

    if (mount_find(mountinfo, v == 2 ? "cgroup2" : "cgroup", mnt, sizeof mnt, mroot,
                   sizeof mroot) != 0 ||
        group_find(cgroup, v, group, sizeof group) != 0)
        return;
    rel = group;
    if (strcmp(mroot, "/") != 0 && strncmp(group, mroot, strlen(mroot)) == 0)
        rel = group + strlen(mroot);      /* the mount shows the group as its root */
    if (v == 2)
        high = walk_limit(root, mnt, rel, "memory.high", b, where, sizeof where);
    max = walk_limit(root, mnt, rel, v == 2 ? "memory.max" : "memory.limit_in_bytes", b, where,
                     sizeof where);
    if (high && (!out->cgroup_high || high < out->cgroup_high))
        out->cgroup_high = high;
    if (max && (!out->cgroup_max || max < out->cgroup_max))
        out->cgroup_max = max;
    if (max || high) {
        out->cgroup_version = v;
        memcpy(out->cgroup_file, where, sizeof out->cgroup_file);
    }
}

static uint64_t rlimit_get(int which)
{
    struct rlimit rl;
    if (getrlimit(which, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return 0;
    return (uint64_t)rl.rlim_cur;
}

static void consider(shoal_mem_limits *out, uint64_t v, const char *by)
{
    if (v && (!out->limit || v < out->limit)) {
        out->limit = v;
        snprintf(out->limit_by, sizeof out->limit_by, "%s", by);
    }
}

#if !SHOAL_PLATFORM_LINUX
/* The machine's memory without /proc (macOS, the PORTABLE build): 0, or
 * -1 when the system will not say.  *by names the source. */
static int system_memory(shoal_mem_limits *out, const char **by)
{
#if defined(__APPLE__)
    uint64_t total = 0;
    size_t len = sizeof total;
    vm_statistics64_data_t vm;
    mach_msg_type_number_t n = HOST_VM_INFO64_COUNT;
    if (sysctlbyname("hw.memsize", &total, &len, NULL, 0) != 0 || total == 0)
        return -1;
    out->mem_total = total;
    /* free, inactive and purgeable pages: what can be had without paging
     * anything out, the nearest to Linux's MemAvailable */
    if (host_statistics64(mach_host_self(), HOST_VM_INFO64, (host_info64_t)&vm, &n) ==
        KERN_SUCCESS)
        out->mem_available = ((uint64_t)vm.free_count + vm.inactive_count + vm.purgeable_count) *
                             (uint64_t)vm_page_size;
    *by = "hw.memsize";
    return 0;
#else
    long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || pg <= 0)
        return -1;
    out->mem_total = (uint64_t)pages * (uint64_t)pg;
#ifdef _SC_AVPHYS_PAGES
    if ((pages = sysconf(_SC_AVPHYS_PAGES)) > 0)
        out->mem_available = (uint64_t)pages * (uint64_t)pg;
#endif
    *by = "physical memory";
    return 0;
#endif
}
#endif

int shoal_mem_limits_read(const char *root, shoal_mem_limits *out, shoal_err *err)
{
    const char *total_by = "MemTotal";
    shoal_buf b, mi, cg;
    int rc = 0;

    memset(out, 0, sizeof *out);
    if (!root)
        root = "";
    shoal_buf_init(&b, 0);
    shoal_buf_init(&mi, 0);
    shoal_buf_init(&cg, 0);
#if !SHOAL_PLATFORM_LINUX
    if (!*root) {   /* the real machine: no /proc/meminfo to read */
        if (system_memory(out, &total_by) != 0) {
            rc = shoal_err_set(err, SHOAL_EIO, "the system does not say how much memory it has");
            goto done;
        }
    } else
#endif
    {   /* Linux, and any build reading a test's tree */
        if (read_text(root, "/proc/meminfo", &b) != 0) {
            rc = shoal_err_set(err, SHOAL_EIO, "%s/proc/meminfo: cannot read it", root);
            goto done;
        }
        out->mem_total = meminfo_get((const char *)b.data, "MemTotal");
        out->mem_available = meminfo_get((const char *)b.data, "MemAvailable");
    }
#if !defined(__APPLE__)   /* cgroups: Linux's, read where their files are */
    if (read_text(root, "/proc/self/mountinfo", &mi) == 0 &&
        read_text(root, "/proc/self/cgroup", &cg) == 0) {
        cgroup_read(root, (const char *)mi.data, (const char *)cg.data, 2, out, &b);
        cgroup_read(root, (const char *)mi.data, (const char *)cg.data, 1, out, &b);
    }
#endif
    out->rlimit_as = rlimit_get(RLIMIT_AS);
    out->rlimit_data = rlimit_get(RLIMIT_DATA);
    consider(out, out->mem_total, total_by);
    consider(out, out->cgroup_max, out->cgroup_version == 2 ? "cgroup memory.max"
                                                            : "cgroup memory.limit_in_bytes");
    consider(out, out->cgroup_high, "cgroup memory.high");
    consider(out, out->rlimit_as, "RLIMIT_AS");
    consider(out, out->rlimit_data, "RLIMIT_DATA");
done:
    shoal_buf_free(&b);
    shoal_buf_free(&mi);
    shoal_buf_free(&cg);
    return rc;
}

int shoal_fd_reopen(int fd, int flags)
{
#if defined(__APPLE__)
    char path[PATH_MAX];
    if (fcntl(fd, F_GETPATH, path) != 0)
        return -1;
    return open(path, flags | O_CLOEXEC);
#else
    /* Linux, the PORTABLE build too: POSIX has no way to reopen a
     * descriptor, and /proc/self/fd is the only one Linux has */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    return open(path, flags | O_CLOEXEC);
#endif
}
