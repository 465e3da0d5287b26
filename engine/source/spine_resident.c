/* spine_resident.c — a spine pack brought into the engine's memory so
 * that decode never reads it from disk again (docs/engine.md, "Resident
 * means resident").
 *
 * SPINE_LOAD_READ (the default): anonymous memory, 2 MiB-aligned with
 * MADV_HUGEPAGE, filled by several threads with O_DIRECT reads in parts
 * (a fresh open file description, shoal_fd_reopen, so the daemon's
 * descriptor keeps its flags); where O_DIRECT is refused (tmpfs), plain
 * preads, and the file's pages dropped after (they would be a second
 * copy).  Anonymous pages are never reclaimed into re-reads: without swap
 * they stay; a mapping's clean file pages are the first thing a memory
 * cgroup under pressure drops, and each comes back as a major fault in the
 * middle of a token (measured: docs/engine.md).
 *
 * SPINE_LOAD_MAP: mmap, MADV_POPULATE_READ in parallel, then mlock when
 * RLIMIT_MEMLOCK allows (it rarely does for a user: 8 MiB by default).
 * Kept for the measurement and for machines where huge anonymous buffers
 * are refused.
 *
 * Owns: the buffer or mapping and the reads.  Does not own the descriptor.
 */
#include "engine/source/source_int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/platform.h"
#include "common/sys.h"

#define RES_ALIGN  ((size_t)2 << 20)
#define RES_PART   ((size_t)8 << 20)
#define RES_THREADS_MAX 16

typedef struct res_job {
    int fd;                    /* the descriptor the parts read */
    int direct;
    uint8_t *buf;              /* READ: the buffer; MAP: the mapping */
    uint64_t start;            /* file offset of buf[0] */
    size_t len;                /* bytes of buf to fill (READ: whole blocks) */
    size_t file_end;           /* bytes of buf that exist in the file */
    size_t next;               /* next part, atomically */
    int map;
    int rc;
} res_job;

static void *res_main(void *arg)
{
    res_job *j = arg;
    for (;;) {
        size_t p = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        size_t b0 = p * RES_PART, b1;
        if (b0 >= j->len || __atomic_load_n(&j->rc, __ATOMIC_RELAXED))
            break;
        b1 = j->len - b0 > RES_PART ? b0 + RES_PART : j->len;
        if (j->map) {
            if (madvise(j->buf + b0, b1 - b0, MADV_POPULATE_READ) != 0) {
                volatile const uint8_t *q = j->buf;   /* kernels before 5.14 */
                uint8_t sum = 0;
                for (size_t i = b0; i < b1; i += 4096)
                    sum ^= q[i];
                (void)sum;
            }
            continue;
        }
        size_t got = 0, want = (b1 < j->file_end ? b1 : j->file_end) - b0;
        while (got < b1 - b0) {
            ssize_t r = pread(j->fd, j->buf + b0 + got, b1 - b0 - got,
                              (off_t)(j->start + b0 + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (got < want)
            __atomic_store_n(&j->rc, SHOAL_EIO, __ATOMIC_RELAXED);
    }
    return NULL;
}

static int res_run(res_job *j, int threads)
{
    pthread_t th[RES_THREADS_MAX];
    int n = 0;

    if (threads < 1)
        threads = 1;
    if (threads > RES_THREADS_MAX)
        threads = RES_THREADS_MAX;
    for (int i = 1; i < threads; i++)
        if (pthread_create(&th[n], NULL, res_main, j) == 0)
            n++;
    res_main(j);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    return j->rc;
}

static int res_map(int fd, uint64_t off, uint64_t len, int threads, spine_resident *out,
                   shoal_err *err)
{
    long pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    uint64_t start = off / (uint64_t)pg * (uint64_t)pg;
    size_t maplen = (size_t)(off - start + len);
    res_job j = { .fd = fd, .map = 1, .len = maplen };
    void *m = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, (off_t)start);

    if (m == MAP_FAILED)
        return shoal_err_set(err, SHOAL_EIO, "spine pack: mmap of %llu bytes: %s",
                             (unsigned long long)len, strerror(errno));
    j.buf = m;
    res_run(&j, threads);
    out->base = m;
    out->maplen = maplen;
    out->data = (const uint8_t *)m + (off - start);
    out->mapped = 1;
    out->locked = mlock(m, maplen) == 0;
    return 0;
}

/* Read [b0, b1) of the buffer (whole blocks) from the file at start +
 * b0; 0 or an error code.  O_DIRECT on a fresh description where it
 * works, else buffered with the file's pages dropped after. */
static int res_fill(int fd, uint8_t *buf, uint64_t start, size_t b0, size_t b1, size_t file_end,
                    int threads, int *direct)
{
    res_job j = { .start = start + b0, .len = b1 - b0,
                  .file_end = file_end > b0 ? file_end - b0 : 0, .buf = buf + b0 };
    int rc;

    j.fd = shoal_fd_reopen(fd, O_RDONLY | O_DIRECT);
    j.direct = j.fd >= 0;
    if (!j.direct)
        j.fd = fd;
    rc = res_run(&j, threads);
    if (rc != 0 && j.direct) {             /* a file system that takes O_DIRECT opens but not reads */
        close(j.fd);
        j = (res_job){ .fd = fd, .buf = buf + b0, .start = start + b0, .len = b1 - b0,
                       .file_end = file_end > b0 ? file_end - b0 : 0 };
        rc = res_run(&j, threads);
    }
    if (j.direct)
        close(j.fd);
    else        /* buffered reads left the pack in the page cache: a second copy */
        posix_fadvise(fd, (off_t)(start + b0), (off_t)(b1 - b0), POSIX_FADV_DONTNEED);
    *direct = j.direct;
    return rc;
}

int spine_resident_read(int fd, uint64_t off, uint64_t len, spine_load_mode mode, int threads,
                        spine_resident *out, shoal_err *err)
{
    return spine_resident_read_part(fd, off, len, len, mode, threads, out, err);
}

int spine_resident_read_part(int fd, uint64_t off, uint64_t len, uint64_t fill,
                             spine_load_mode mode, int threads, spine_resident *out,
                             shoal_err *err)
{
    uint64_t t0 = shoal_now_ns(), start = off / 4096 * 4096;
    size_t lead = (size_t)(off - start), blocks = (lead + (size_t)len + 4095) / 4096 * 4096;
    size_t buflen = (blocks + RES_ALIGN - 1) / RES_ALIGN * RES_ALIGN;
    size_t fill_blocks = (lead + (size_t)(fill < len ? fill : len) + 4095) / 4096 * 4096;
    void *buf = NULL;
    int rc, direct = 0;

    memset(out, 0, sizeof *out);
    if (len == 0 || len > (uint64_t)SIZE_MAX / 2)
        return shoal_err_set(err, SHOAL_EINVAL, "spine pack: %llu bytes",
                             (unsigned long long)len);
    if (mode == SPINE_LOAD_MAP) {
        rc = res_map(fd, off, len, threads, out, err);
        out->length = len;
        out->ms = (double)(shoal_now_ns() - t0) / 1e6;
        return rc;
    }
    if (posix_memalign(&buf, RES_ALIGN, buflen) != 0)
        return shoal_err_set(err, SHOAL_ENOMEM, "spine pack: no memory for %llu bytes (the "
                             "plan counted them: is something else holding memory?)",
                             (unsigned long long)len);
    /* a hint (small pages work too); not over a part streamed later, whose pages come
     * and go a layer at a time */
    (void)madvise(buf, fill < len ? fill_blocks / RES_ALIGN * RES_ALIGN : buflen, MADV_HUGEPAGE);
    rc = res_fill(fd, buf, start, 0, fill_blocks, lead + (size_t)len, threads, &direct);
    if (rc != 0) {
        free(buf);
        return shoal_err_set(err, SHOAL_EIO, "spine pack: reading %llu bytes failed",
                             (unsigned long long)len);
    }
    out->base = buf;
    out->maplen = buflen;
    out->data = (const uint8_t *)buf + lead;
    out->length = len;
    out->direct = direct;
    out->file_start = start;
    out->lead = lead;
    out->ms = (double)(shoal_now_ns() - t0) / 1e6;
    return 0;
}

int spine_resident_fill(spine_resident *r, int fd, uint64_t from, uint64_t to, int threads,
                        shoal_err *err)
{
    size_t b0 = (r->lead + (size_t)from) / 4096 * 4096;
    size_t b1 = (r->lead + (size_t)to + 4095) / 4096 * 4096;
    int direct;

    if (r->mapped || to <= from)
        return 0;                          /* a mapping is populated whole */
    if (b1 > r->maplen)
        b1 = r->maplen;
    if (res_fill(fd, r->base, r->file_start, b0, b1, r->lead + (size_t)r->length, threads,
                 &direct) != 0)
        return shoal_err_set(err, SHOAL_EIO, "spine pack: reading %llu bytes failed",
                             (unsigned long long)(to - from));
    return 0;
}

void spine_resident_free(spine_resident *r)
{
    if (!r || !r->base)
        return;
    if (r->mapped) {
        if (r->locked)
            munlock(r->base, r->maplen);
        munmap(r->base, r->maplen);
    } else {
        free(r->base);
    }
    memset(r, 0, sizeof *r);
}
