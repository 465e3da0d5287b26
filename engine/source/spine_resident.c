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
 * Checked (docs/engine.md "Checked reads"): every byte of the object is
 * hashed (XXH3-128) as it is read, in order, by whichever reader
 * completes the part the hash waits for (it hashes that part and every
 * later one already read, while the others go on reading: the bytes are
 * still in its cache), across the calls that read the object in pieces
 * (read_part, fill, and the streamed tail that is read only to be
 * hashed).  spine_resident_check compares the result with the index's
 * hash once every byte went through.  Ranges of the tail (the streamed
 * layers) get their own hashes on the way, for the per-pass checks.
 *
 * Owns: the buffer or mapping, the reads and their hash.  Does not own
 * the descriptor.
 */
#include "engine/source/source.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <xxhash.h>
#include "common/xxh3.h"

#include "common/platform.h"
#include "common/sys.h"

#define RES_ALIGN  ((size_t)2 << 20)
#define RES_PART   ((size_t)8 << 20)
#define RES_THREADS_MAX 16

/* The ordered hash of one job's parts: part k covers object bytes
 * file bytes [foff[k], foff[k] + flen[k]) at ptr[k]; the object's hash
 * takes what it has not taken yet of them; parts [0, next) are hashed. */
typedef struct res_hash {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    XXH3_state_t *st;          /* the object's, borrowed (the resident's) */
    const spine_resident_range *rg;   /* ranges hashed on their own; may be NULL */
    size_t nrg;
    XXH3_state_t **rst;        /* [nrg] */
    uint64_t pos, end;         /* file offsets: the hash stands at pos; the object ends at end */
    size_t nparts, next;
    int hashing;
    const uint8_t **ptr;       /* per part, once read (NULL: not yet) */
    uint64_t *foff;            /* per part: the file offset of ptr[k] */
    size_t *flen;              /* ... and its bytes read */
} res_hash;

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
    res_hash *h;               /* NULL: not hashed */
    int scratch;               /* read into per-thread buffers only to be hashed */
} res_job;

/* The object bytes of part k that the hash has not taken yet, into the
 * object's state; and each range's bytes in it into the range's. */
static void hash_one(res_hash *h, size_t k)
{
    uint64_t f0 = h->foff[k], f1 = f0 + h->flen[k];
    uint64_t x0 = f0 > h->pos ? f0 : h->pos, x1 = f1 < h->end ? f1 : h->end;

    if (x1 > x0 && x0 == h->pos) {
        shoal_xxh3_update(h->st, h->ptr[k] + (x0 - f0), (size_t)(x1 - x0));
        h->pos = x1;
    }
    for (size_t i = 0; i < h->nrg; i++) {     /* in file offsets, each in order */
        uint64_t r0 = h->rg[i].off, r1 = r0 + h->rg[i].len;
        uint64_t y0 = r0 > f0 ? r0 : f0, y1 = r1 < f1 ? r1 : f1;
        if (y1 > y0)
            shoal_xxh3_update(h->rst[i], h->ptr[k] + (y0 - f0), (size_t)(y1 - y0));
    }
}

/* Part k was read (p: its bytes, at file offset foff, n of them): hash
 * from where the hash stands while the next part is there.  A scratch
 * part's buffer is reused once this returns: it waits until hashed. */
static void hash_part(res_hash *h, size_t k, const uint8_t *p, uint64_t foff, size_t n,
                      int wait)
{
    pthread_mutex_lock(&h->mu);
    h->ptr[k] = p;
    h->foff[k] = foff;
    h->flen[k] = n;
    while (!h->hashing && h->next < h->nparts && h->ptr[h->next]) {
        size_t q = h->next;
        h->hashing = 1;
        pthread_mutex_unlock(&h->mu);
        hash_one(h, q);
        pthread_mutex_lock(&h->mu);
        h->hashing = 0;
        h->next = q + 1;
        pthread_cond_broadcast(&h->cv);
    }
    while (wait && h->next <= k)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

static void *res_main(void *arg)
{
    res_job *j = arg;
    uint8_t *scratch = NULL;

    if (j->scratch && posix_memalign((void **)&scratch, 4096, RES_PART) != 0) {
        __atomic_store_n(&j->rc, SHOAL_ENOMEM, __ATOMIC_RELAXED);
        scratch = NULL;
    }
    for (;;) {
        size_t p = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        size_t b0 = p * RES_PART, b1;
        if (b0 >= j->len)
            break;
        b1 = j->len - b0 > RES_PART ? b0 + RES_PART : j->len;
        /* a part claimed is always handed to the hash (empty after a
         * failure), so no later part waits for it in vain */
        if (__atomic_load_n(&j->rc, __ATOMIC_RELAXED)) {
            if (j->h)
                hash_part(j->h, p, (const uint8_t *)"", j->start + b0, 0, 0);
            continue;
        }
        if (j->map) {
            if (shoal_populate_read(j->buf + b0, b1 - b0) != 0) {
                volatile const uint8_t *q = j->buf;   /* kernels before 5.14 */
                uint8_t sum = 0;
                for (size_t i = b0; i < b1; i += 4096)
                    sum ^= q[i];
                (void)sum;
            }
            if (j->h)
                hash_part(j->h, p, j->buf + b0, j->start + b0, b1 - b0, 0);
            continue;
        }
        uint8_t *dst = j->scratch ? scratch : j->buf + b0;
        size_t got = 0, want = (b1 < j->file_end ? b1 : j->file_end) - b0;
        while (dst && got < b1 - b0) {
            ssize_t r = pread(j->fd, dst + got, b1 - b0 - got, (off_t)(j->start + b0 + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (got < want)
            __atomic_store_n(&j->rc, SHOAL_EIO, __ATOMIC_RELAXED);
        if (j->h)
            hash_part(j->h, p, dst ? dst : (const uint8_t *)"", j->start + b0,
                      got < want ? 0 : want, j->scratch);
    }
    free(scratch);
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

static int hash_new(res_hash *h, XXH3_state_t *st, uint64_t pos, uint64_t end, size_t len);
static void hash_free(res_hash *h);

static int res_map(int fd, uint64_t off, uint64_t len, int threads, XXH3_state_t *st,
                   spine_resident *out, shoal_err *err)
{
    res_hash h;
    long pg = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    uint64_t start = off / (uint64_t)pg * (uint64_t)pg;
    size_t maplen = (size_t)(off - start + len);
    res_job j = { .fd = fd, .map = 1, .len = maplen };
    void *m = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, (off_t)start);

    if (m == MAP_FAILED)
        return shoal_err_set(err, SHOAL_EIO, "spine pack: mmap of %llu bytes: %s",
                             (unsigned long long)len, strerror(errno));
    j.buf = m;
    j.start = start;
    if (st && hash_new(&h, st, off, off + len, maplen) == 0)
        j.h = &h;
    res_run(&j, threads);
    if (j.h) {
        out->hash_pos = h.pos;
        hash_free(&h);
    }
    out->base = m;
    out->maplen = maplen;
    out->data = (const uint8_t *)m + (off - start);
    out->mapped = 1;
    out->locked = mlock(m, maplen) == 0;
    return 0;
}

static int hash_new(res_hash *h, XXH3_state_t *st, uint64_t pos, uint64_t end, size_t len)
{
    memset(h, 0, sizeof *h);
    h->nparts = (len + RES_PART - 1) / RES_PART;
    h->st = st;
    h->pos = pos;
    h->end = end;
    h->ptr = calloc(h->nparts ? h->nparts : 1, sizeof *h->ptr);
    h->foff = calloc(h->nparts ? h->nparts : 1, sizeof *h->foff);
    h->flen = calloc(h->nparts ? h->nparts : 1, sizeof *h->flen);
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    if (!h->ptr || !h->foff || !h->flen) {
        hash_free(h);
        return SHOAL_ENOMEM;
    }
    return 0;
}

static void hash_free(res_hash *h)
{
    free(h->ptr);
    free(h->foff);
    free(h->flen);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    memset(h, 0, sizeof *h);
}

/* Read [b0, b1) of the buffer (whole blocks) from the file at start +
 * b0, hashing into r's state what it has not taken yet; 0 or an error
 * code.  O_DIRECT on a fresh description where it works, else buffered
 * with the file's pages dropped after.  buf NULL: read into scratch
 * buffers, only to hash (with the ranges rg[0..nrg) into rst). */
static int res_fill(spine_resident *r, int fd, uint8_t *buf, uint64_t start, size_t b0,
                    size_t b1, size_t file_end, int threads, int *direct,
                    const spine_resident_range *rg, size_t nrg, XXH3_state_t **rst)
{
    res_job j = { .start = start + b0, .len = b1 - b0, .scratch = buf == NULL,
                  .file_end = file_end > b0 ? file_end - b0 : 0, .buf = buf ? buf + b0 : NULL };
    XXH3_state_t *st = r->hash, *save = NULL;
    res_hash h;
    int rc;

    if (st && (!(save = shoal_xxh3_new()) ||
               hash_new(&h, st, r->hash_pos, r->file_start + r->lead + r->length, j.len) != 0)) {
        shoal_xxh3_free(save);
        return SHOAL_ENOMEM;
    }
    if (st) {
        XXH3_copyState(save, st);              /* a failed O_DIRECT run hashed some */
        h.rg = rg;
        h.nrg = nrg;
        h.rst = rst;
        j.h = &h;
    }
    j.fd = shoal_fd_open_uncached(fd);
    j.direct = j.fd >= 0;
    if (!j.direct)
        j.fd = fd;
    rc = res_run(&j, threads);
    if (rc != 0 && j.direct) {             /* a file system that takes O_DIRECT opens but not reads */
        close(j.fd);
        j = (res_job){ .fd = fd, .buf = buf ? buf + b0 : NULL, .start = start + b0,
                       .len = b1 - b0, .scratch = buf == NULL,
                       .file_end = file_end > b0 ? file_end - b0 : 0 };
        if (st) {
            XXH3_copyState(st, save);
            for (size_t i = 0; i < nrg; i++)
                shoal_xxh3_reset(rst[i]);
            hash_free(&h);
            if (hash_new(&h, st, r->hash_pos, r->file_start + r->lead + r->length, j.len) != 0) {
                shoal_xxh3_free(save);
                return SHOAL_ENOMEM;
            }
            h.rg = rg;
            h.nrg = nrg;
            h.rst = rst;
            j.h = &h;
        }
        rc = res_run(&j, threads);
    }
    if (j.direct)
        close(j.fd);
    else        /* buffered reads left the pack in the page cache: a second copy */
        shoal_cache_drop(fd, (off_t)(start + b0), (off_t)(b1 - b0));
    *direct = j.direct;
    if (st) {
        r->hash_pos = h.pos;
        hash_free(&h);
        shoal_xxh3_free(save);
    }
    return rc;
}

int spine_resident_read(int fd, uint64_t off, uint64_t len, spine_load_mode mode, int threads,
                        const uint8_t want[16], spine_resident *out, shoal_err *err)
{
    return spine_resident_read_part(fd, off, len, len, mode, threads, want, out, err);
}

int spine_resident_read_part(int fd, uint64_t off, uint64_t len, uint64_t fill,
                             spine_load_mode mode, int threads, const uint8_t want[16],
                             spine_resident *out, shoal_err *err)
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
    if (want) {
        if (!(out->hash = shoal_xxh3_new()))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        shoal_xxh3_reset(out->hash);
        memcpy(out->want, want, 16);
        out->hash_pos = off;
    }
    out->file_start = start;
    out->lead = lead;
    out->length = len;
    if (mode == SPINE_LOAD_MAP) {
        rc = res_map(fd, off, len, threads, out->hash, out, err);
        out->ms = (double)(shoal_now_ns() - t0) / 1e6;
        if (rc != 0)
            spine_resident_free(out);
        return rc;
    }
    if (posix_memalign(&buf, RES_ALIGN, buflen) != 0) {
        spine_resident_free(out);
        return shoal_err_set(err, SHOAL_ENOMEM, "spine pack: no memory for %llu bytes (the "
                             "plan counted them: is something else holding memory?)",
                             (unsigned long long)len);
    }
    /* a hint (small pages work too); not over a part streamed later, whose pages come
     * and go a layer at a time */
    shoal_hugepage_hint(buf, fill < len ? fill_blocks / RES_ALIGN * RES_ALIGN : buflen);
    rc = res_fill(out, fd, buf, start, 0, fill_blocks, lead + (size_t)len, threads, &direct,
                  NULL, 0, NULL);
    if (rc != 0) {
        free(buf);
        spine_resident_free(out);
        return shoal_err_set(err, SHOAL_EIO, "spine pack: reading %llu bytes failed",
                             (unsigned long long)len);
    }
    out->base = buf;
    out->maplen = buflen;
    out->data = (const uint8_t *)buf + lead;
    out->direct = direct;
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
    if (res_fill(r, fd, r->base, r->file_start, b0, b1, r->lead + (size_t)r->length, threads,
                 &direct, NULL, 0, NULL) != 0)
        return shoal_err_set(err, SHOAL_EIO, "spine pack: reading %llu bytes failed",
                             (unsigned long long)(to - from));
    return 0;
}

int spine_resident_hash_rest(spine_resident *r, int fd, const spine_resident_range *rg,
                             size_t nrg, uint8_t (*xxh)[16], int threads, shoal_err *err)
{
    uint64_t t0 = shoal_now_ns();
    size_t b0, b1 = r->lead + (size_t)r->length;
    XXH3_state_t **rst = calloc(nrg ? nrg : 1, sizeof *rst);
    int rc = rst ? 0 : SHOAL_ENOMEM, direct;

    if (!r->hash) {
        free(rst);
        return 0;                          /* unchecked */
    }
    for (size_t i = 0; rc == 0 && i < nrg; i++)
        if (!(rst[i] = shoal_xxh3_new()) || shoal_xxh3_reset(rst[i]) != 0)
            rc = SHOAL_ENOMEM;
    /* from the first range's start when it begins before the hash's
     * position (the block the resident part ends in) */
    uint64_t from = r->hash_pos;
    for (size_t i = 0; i < nrg; i++)
        if (rg[i].off < from && rg[i].off >= r->file_start)
            from = rg[i].off;
    b0 = (size_t)(from - r->file_start) / 4096 * 4096;
    if (rc == 0 && b1 > b0)
        rc = res_fill(r, fd, NULL, r->file_start, b0, (b1 + 4095) / 4096 * 4096, b1, threads,
                      &direct, rg, nrg, rst);
    for (size_t i = 0; rc == 0 && i < nrg; i++) {
        XXH128_canonical_t can;
        shoal_xxh3_digest(rst[i], can.digest);
        memcpy(xxh[i], can.digest, 16);
    }
    for (size_t i = 0; rst && i < nrg; i++)
        shoal_xxh3_free(rst[i]);
    free(rst);
    r->hash_ms += (double)(shoal_now_ns() - t0) / 1e6;
    if (rc != 0)
        return shoal_err_set(err, rc == SHOAL_ENOMEM ? SHOAL_ENOMEM : SHOAL_EIO,
                             "spine pack: reading its streamed part to check it failed");
    return 0;
}

int spine_resident_check(const spine_resident *r)
{
    XXH128_canonical_t can;

    if (!r->hash)
        return 0;
    if (r->hash_pos != r->file_start + r->lead + r->length)
        return 0;
    shoal_xxh3_digest(r->hash, can.digest);
    return memcmp(can.digest, r->want, 16) == 0 ? 1 : -1;
}

void spine_resident_free(spine_resident *r)
{
    if (!r)
        return;
    if (r->hash)
        shoal_xxh3_free(r->hash);
    r->hash = NULL;
    if (!r->base) {
        memset(r, 0, sizeof *r);
        return;
    }
    if (r->mapped) {
        if (r->locked)
            munlock(r->base, r->maplen);
        munmap(r->base, r->maplen);
    } else {
        free(r->base);
    }
    memset(r, 0, sizeof *r);
}
