/* platform.h — what the operating system says about this process's
 * machine: for now, how much memory it may use.  The seed of the platform
 * layer: every /proc and /sys read the programs make lives here (a later
 * issue adds the CPU, the disks and macOS), so callers get numbers, not
 * files.
 *
 * Owns: reopening a descriptor with other flags (O_DIRECT), reading /proc/meminfo, the process's memory cgroup (v2
 * memory.max and memory.high, v1 memory.limit_in_bytes, over its group and
 * every ancestor, found through /proc/self/cgroup and
 * /proc/self/mountinfo) and RLIMIT_AS / RLIMIT_DATA, and naming which of
 * them is the smallest.  Does not own what a program does with the
 * numbers (engine/plan/ plans the engine's memory with them).
 */
#ifndef SHOAL_PLATFORM_H
#define SHOAL_PLATFORM_H

#include <stdint.h>

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

#endif
