/* expert_source_shoald.c — the expert source backed by shoald (DESIGN.md
 * decision 9, docs/protocol.md, docs/performance.md).
 *
 * Every expert of every MoE layer has a slot.  A slot is resident when its
 * bytes are in the engine (a read-only mapping of the cache blob, or an
 * O_DIRECT copy); requests in flight are GETs on the one client connection.
 *
 *   - request(prefetch 0): the MoE layer, right after routing, asks for the
 *     experts it is about to use (one demand GET for those not resident or
 *     already asked for) and then computes its shared experts while they
 *     come; fetch() then calls back each expert the moment it is resident.
 *   - request(prefetch 1): a guess for a later layer (lookahead.c predicts),
 *     a priority-1 GET.  When that layer's real fetch comes, its open
 *     prefetches are CANCELled (what shoald has not sent yet is dropped) and
 *     whatever it still needs goes out as demand; shoald joins a transfer
 *     the prefetch already started, so nothing moves twice upstream.
 *   - the RAM tier: after a fetch, the layer keeps at most `quota` experts
 *     resident (least recently used out first); an expert still resident at
 *     its next use is a RAM hit, counted and REPORTed to shoald.
 *   - the reads: an arrived expert's bytes are read by IO_THREADS reader
 *     threads in parts of `read_part` bytes (page-aligned sub-ranges of its
 *     mapping or buffer), handed out in order, so the readers work on the
 *     first expert's parts together and experts become ready one after
 *     another at the disk's full rate (docs/performance.md "Parallel reads").
 *
 *     A guess the layer's real set does not name stops there: its parts
 *     not started yet are skipped (io_skip) and it is dropped at once if no
 *     reader holds a part of it (else at the trim), so a wrong guess costs
 *     at most the parts already being read, not a whole expert of disk
 *     time; a later demand resumes them.
 *   - the pool (engine/plan's PLAN_EXPERT_POOL buffers, what the memory
 *     plan counts): the experts held outside the RAM tier — being read,
 *     read but not delivered yet, guesses — plus the spare O_DIRECT
 *     buffers are at most the pool.  A reader starts an expert's first
 *     part only while the pool has room (guesses in at most half of it),
 *     and a delivered expert the quota does not keep is let go right
 *     after its callback, not at the end of the fetch: a prefill chunk's
 *     union of experts (hundreds for K3) streams through the pool instead
 *     of being held whole.
 *
 * Invariants of a slot's read (io mutex held to change or test them;
 * 5 is about all slots):
 *   1. parts [0, io_next) were handed to readers, io_left of the io_parts
 *      are not done; ready = 1 exactly when io_left reached 0; the parts a
 *      reader holds are io_next + io_left - io_parts;
 *   2. a slot is unloaded (unmapped / freed) only when no reader holds a
 *      part of it (ready, or slot_dropped_idle) or after the readers were
 *      joined;
 *   3. a slot sits at most once in each ring (io_queued bit r), so a ring
 *      of one entry per slot never overflows; an entry with no part to hand
 *      out (all handed out, skipped, or unloaded) is dropped when reached;
 *   4. io_fd (EXPERT_PC_DIRECT) is open from arrival until the last part is
 *      done (or the slot is unloaded); the reader that finishes the last
 *      part closes it;
 *   5. io.live counts the slots with io_live set (io.live_guess those with
 *      io_guess too), and io.live + io.nspare <= PLAN_EXPERT_POOL, except
 *      that a fresh demand start may wait for the fetch to free a spare
 *      (pool_make_room).
 *
 * Owns: slots, mappings and buffers, open GETs.  Does not own the client
 * connection nor the model handle (both borrowed).
 */
#include "engine/source/source.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/client.h"
#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"

typedef struct slot {
    const uint8_t *data;       /* resident bytes, NULL when not */
    void *base;                /* mapping (or aligned buffer for O_DIRECT) */
    size_t maplen;
    int fd;                    /* kept for DONTNEED until unload; -1 otherwise */
    uint64_t offset;           /* of the object in fd */
    uint64_t last_use;         /* fetch clock of the last use (LRU) */
    uint64_t arrived;          /* fetch clock when it became resident */
    int32_t status;            /* a failed demand item: its code, until fetched */
    uint16_t inflight;         /* open GETs naming it */
    uint8_t tier;              /* where its bytes came from (disk / network) */
    uint8_t demand;            /* a demand GET for it is open */
    uint8_t prefetched;        /* came through a prefetch, not used yet */
    uint8_t kept;              /* survived a trim of its layer: the RAM tier holds it */
    uint8_t wanted;            /* scratch of shoald_request: in the layer's real set */
    uint8_t pend;              /* the fetch running now has yet to deliver it */
    /* the read, in parts (invariants 1-4 above): data is set at arrival,
     * the bytes are there once ready; io_rc the first failed part's code.
     * Guarded by the source's io mutex. */
    int ready, io_rc;
    uint32_t io_parts, io_next, io_left;
    uint8_t io_queued;         /* bit r: in ring r */
    uint8_t io_skip;           /* a dropped guess: hand out no further part */
    uint8_t io_live;           /* holds a pool buffer: started (or given a spare), not kept */
    uint8_t io_guess;          /* ... and it was started as a guess */
    uint8_t io_direct;         /* io_fd is an O_DIRECT descriptor (else the tmpfs fallback) */
    int io_fd;                 /* EXPERT_PC_DIRECT: the descriptor the parts read */
    uint64_t io_off;           /* of the object in io_fd */
    /* the parts are hashed as they are read (checked_read.c) against the
     * index's XXH3-128; a mismatch fails the read with SHOAL_ECORRUPT */
    uint8_t xxh[16];
    checked_read *chk;
    uint8_t refetched;         /* read back damaged once: reported and asked again */
} slot;

/* Reader threads and the default part size (docs/performance.md "Parallel
 * reads", measured on this VM's virtio disk): the reads of every arrived
 * expert run in parallel with each other and with the compute, one
 * synchronous request per reader.  16 readers of 1 MiB parts kept the
 * disk's queue fuller than 8 of 2 MiB (O_DIRECT 1.69 against 1.76 of the
 * bound, mmap the same); 512 KiB parts made the page cache's requests
 * half as large and were slower with mmap. */
#define IO_THREADS 16
#define READ_PART_DEFAULT (1u << 20)
/* O_DIRECT parts are larger: each is one request the disk serves while
 * the reader waits, and 4 MiB requests from 8-16 readers read this VM's
 * disk at 1.6-1.8 GB/s against 1.1 GB/s with 1 MiB (and 1.2-1.4 GB/s for
 * buffered preads); docs/performance.md. */
#define READ_PART_DIRECT (4u << 20)
/* O_DIRECT buffers are 2 MiB-aligned transparent huge pages, kept for
 * reuse.  An O_DIRECT read pins its buffer's pages: with 4 KiB pages that
 * pinning cost this VM 0.8 s of system time per GB and held the reads at
 * 1.0-1.5 GB/s; the same reads into huge pages ran at 2.1-2.3 GB/s.  A
 * fresh huge-page buffer costs its zeroing, so up to DIRECT_SPARES freed
 * buffers are kept: a layer's experts and the next layer's guesses (2 x 16
 * for K3), the most that are resident at once without a RAM tier, so
 * keeping them does not raise the peak. */
#define DIRECT_SPARES 32
#define DIRECT_ALIGN ((size_t)2 << 20)

typedef struct io_ring {
    slot **q;
    size_t head, len, cap;
} io_ring;

typedef struct io_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    io_ring ring[2];           /* slots to read: [0] demand first, then [1] guesses */
    int dactive;               /* demand reads running */
    /* The guess budget (docs/performance.md "Guesses fill the gap"): a
     * guess is read only in a gap (no demand read to do), and only as many
     * bytes as the disk reads in a typical gap: the gap's length (from the
     * moment the demand reads run out to the next layer's demand) times
     * the rate of the demand reads, both running means.  Guesses read past
     * the gap would only compete with the next layer's demand, and the
     * wrong ones (a third at recall 0.7) are bytes the disk did not have
     * to move. */
    int64_t gap_t0, busy_t0;   /* ns: the current gap / demand period began (0: none) */
    double gap_ns;             /* running mean of the gap */
    double rate;               /* bytes/ns of the demand reads, running mean */
    uint64_t busy_bytes;       /* read by demand in the current period */
    int64_t gbudget;           /* guess bytes left in this gap; < 0 unlimited */
    /* the pool (invariant 5): slots holding a buffer outside the RAM
     * tier, of them guesses, and the spare buffers */
    int live, live_guess, nspare;
    int peak;                  /* most of live + nspare seen (--stats) */
    /* for --stats: bytes read (and as guesses), time any read ran */
    int nactive;
    int64_t active_t0;
    uint64_t read_bytes, guess_bytes, busy_ns;
    int stop, nth;
    pthread_t th[IO_THREADS];
} io_pool;

typedef struct req {
    uint64_t id;
    int layer;
    int prefetch;
    int cancelled;
    size_t n, left;
    int32_t *ids;
} req;

typedef struct shoald_src {
    expert_source_shoald_link own;   /* the link of expert_source_shoald_new */
    const expert_source_shoald_link *link;   /* borrowed: the client and handle */
    uint64_t epoch;            /* the link's epoch the open GETs belong to */
    expert_source_shoald_options o;
    size_t quota;              /* experts kept per layer */
    uint64_t *file_order;      /* [n_layers][experts_per_layer] (options.file_order), or NULL */
    slot *slots;               /* [n_layers][experts_per_layer] */
    size_t *resident;          /* [n_layers] */
    req *reqs;
    size_t n_reqs, cap_reqs;
    uint64_t clock;
    long page;
    size_t part;               /* bytes per read part: a multiple of the page */
    size_t dbuf_len;           /* O_DIRECT: every buffer's size */
    void *spare[DIRECT_SPARES];/* O_DIRECT buffers to reuse (count: io.nspare) */
    /* counters */
    uint64_t prefetch_sent, prefetch_used, prefetch_early;
    uint64_t ram_hits, ram_misses, ram_bytes_hit, res_count, res_bytes;
    uint64_t rep_hits, rep_misses, rep_bytes, last_report_ns;
    io_pool io;
} shoald_src;

static slot *slot_at(shoald_src *s, int layer, int32_t e)
{
    return &s->slots[(size_t)layer * (size_t)s->o.experts_per_layer + (size_t)e];
}

/* A slot lets go of its pool buffer (kept by the tier, or unloaded).
 * Mutex held. */
static void slot_unlive(shoald_src *s, slot *sl)
{
    if (!sl->io_live)
        return;
    s->io.live--;
    s->io.live_guess -= sl->io_guess;
    sl->io_live = sl->io_guess = 0;
}

static void slot_unload(shoald_src *s, int layer, slot *sl)
{
    if (!sl->data)
        return;
    if (s->o.page_cache == EXPERT_PC_DIRECT) {
        /* a pool buffer stays a spare; a tier buffer only where the pool
         * has room for it (invariant 5) */
        int keep;
        pthread_mutex_lock(&s->io.mu);
        keep = s->io.nspare < DIRECT_SPARES &&
               (sl->io_live || s->io.live + s->io.nspare < PLAN_EXPERT_POOL);
        slot_unlive(s, sl);
        if (keep)
            s->spare[s->io.nspare++] = sl->base;
        pthread_cond_broadcast(&s->io.work);
        pthread_mutex_unlock(&s->io.mu);
        if (!keep)
            free(sl->base);
    } else {
        munmap(sl->base, sl->maplen);
        /* why: the blob's pages would otherwise stay cached and push the
         * spine out of RAM on a memory-tight machine */
        if (sl->fd >= 0)
            shoal_cache_drop(sl->fd, (off_t)sl->offset, (off_t)s->o.expert_bytes);
    }
    if (sl->fd >= 0)
        close(sl->fd);
    if (sl->io_fd >= 0)
        close(sl->io_fd);
    sl->fd = sl->io_fd = -1;
    sl->data = NULL;
    pthread_mutex_lock(&s->io.mu);
    slot_unlive(s, sl);
    if (s->o.page_cache != EXPERT_PC_DIRECT)
        pthread_cond_broadcast(&s->io.work);   /* room in the pool */
    sl->ready = 0;
    checked_read_free(sl->chk);
    sl->chk = NULL;
    sl->io_next = sl->io_parts;                /* a ring entry left is inert (3.) */
    sl->io_left = 0;
    sl->io_skip = 0;
    pthread_mutex_unlock(&s->io.mu);
    sl->base = NULL;
    sl->prefetched = 0;
    s->resident[layer]--;
    s->res_count--;
    s->res_bytes -= s->o.expert_bytes;
}

/* Part `part` of a slot's read: bytes [*b0, *b1) of its mapping or buffer,
 * which begins at the page (4096-byte block for O_DIRECT) holding the
 * object's first byte; *lo, *hi: the object's bytes within the part. */
static void part_range(const shoald_src *s, const slot *sl, uint32_t part, size_t *b0,
                       size_t *b1, size_t *lo, size_t *hi)
{
    size_t lead = (size_t)(sl->data - (const uint8_t *)sl->base);
    size_t end = lead + (size_t)s->o.expert_bytes;

    *b0 = (size_t)part * s->part;
    *b1 = sl->maplen - *b0 > s->part ? *b0 + s->part : sl->maplen;
    *lo = *b0 > lead ? *b0 : lead;
    *hi = *b1 < end ? *b1 : end;
    if (*hi < *lo)
        *hi = *lo;
}

/* Read one part into the slot's aligned buffer with O_DIRECT (whole
 * blocks: the part's range is block-aligned; the file's last block may
 * come short).  Without O_DIRECT (tmpfs: io_direct 0), a plain read of the
 * object's bytes in the part, then dropped from the page cache. */
static int part_read_direct(const shoald_src *s, const slot *sl, uint32_t part)
{
    uint64_t start = sl->io_off / 4096 * 4096;
    uint8_t *buf = sl->base;
    size_t b0, b1, lo, hi, got = 0;

    part_range(s, sl, part, &b0, &b1, &lo, &hi);
    if (!sl->io_direct) {
        int rc = shoal_pread_all(sl->io_fd, buf + lo, hi - lo, (off_t)(start + lo));
        shoal_cache_drop(sl->io_fd, (off_t)(start + lo), (off_t)(hi - lo));
        return rc == 0 ? 0 : SHOAL_EIO;
    }
    while (got < b1 - b0) {
        ssize_t r = pread(sl->io_fd, buf + b0 + got, b1 - b0 - got, (off_t)(start + b0 + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return b0 + got >= hi ? 0 : SHOAL_EIO;
}

/* Read one part: fault its range of the mapping in (or the O_DIRECT read). */
static int part_read(const shoald_src *s, const slot *sl, uint32_t part)
{
    size_t b0, b1, lo, hi;

    if (s->o.page_cache == EXPERT_PC_DIRECT)
        return part_read_direct(s, sl, part);
    part_range(s, sl, part, &b0, &b1, &lo, &hi);
    if (b1 > b0 && shoal_populate_read((uint8_t *)sl->base + b0, b1 - b0) != 0) {
        volatile const uint8_t *p = sl->base;      /* kernels before 5.14: touch its pages */
        size_t pg = (size_t)s->page;
        uint8_t sum = 0;
        for (size_t i = lo; i < hi; i = (i / pg + 1) * pg)
            sum ^= p[i];
        (void)sum;
    }
    return 0;
}

static double io_mean(double old, double v)
{
    return old > 0 ? 0.75 * old + 0.25 * v : v;
}

/* The demand reads ran out (mutex held): a gap begins; its guess budget
 * is the mean gap times the demand reads' rate (unlimited until both are
 * known). */
static void io_gap_begin(io_pool *io)
{
    int64_t now = (int64_t)shoal_now_ns();
    if (io->busy_t0 && now > io->busy_t0 && io->busy_bytes > 0)
        io->rate = io_mean(io->rate, (double)io->busy_bytes / (double)(now - io->busy_t0));
    io->busy_t0 = 0;
    io->busy_bytes = 0;
    io->gap_t0 = now;
    io->gbudget = io->gap_ns > 0 && io->rate > 0 ? (int64_t)(io->gap_ns * io->rate) : -1;
}

/* A layer's demand arrived (mutex held): the gap, if one ran, ends. */
static void io_demand_begin(io_pool *io)
{
    int64_t now = (int64_t)shoal_now_ns();
    if (io->gap_t0) {
        io->gap_ns = io_mean(io->gap_ns, (double)(now - io->gap_t0));
        io->gap_t0 = 0;
    }
    if (!io->busy_t0) {
        io->busy_t0 = now;
        io->busy_bytes = 0;
    }
}

/* Next part to read, in ring order (a slot's parts one after another),
 * demand before guesses, and a guess only while no demand read runs: a
 * guess fills the disk's idle time instead of slowing the reads a layer
 * waits for (docs/performance.md).  NULL when none (mutex held); *demand
 * says which kind, *part which part of the slot. */
static slot *io_take(io_pool *io, int *demand, uint32_t *part)
{
    for (int r = 0; r < 2; r++) {
        io_ring *q = &io->ring[r];
        if (r == 1 && (io->dactive > 0 || io->gbudget == 0))
            return NULL;
        /* entries with nothing left leave from the head */
        while (q->len > 0) {
            slot *sl = q->q[q->head];
            if (!sl->io_skip && sl->io_next < sl->io_parts)
                break;
            q->head = (q->head + 1) % q->cap;
            q->len--;
            sl->io_queued &= (uint8_t)~(1u << r);
        }
        /* the first entry that may go: one holding a pool buffer already,
         * or a new expert while the pool has room (guesses in half of it) */
        int room = io->live + io->nspare < PLAN_EXPERT_POOL &&
                   (r == 0 || io->live_guess < PLAN_EXPERT_POOL / 2);
        for (size_t k = 0; k < q->len; k++) {
            slot *sl = q->q[(q->head + k) % q->cap];
            if (sl->io_skip || sl->io_next >= sl->io_parts || (!sl->io_live && !room))
                continue;
            if (!sl->io_live) {
                sl->io_live = 1;
                sl->io_guess = r == 1;
                io->live++;
                io->live_guess += r == 1;
                if (io->live + io->nspare > io->peak)
                    io->peak = io->live + io->nspare;
            }
            *part = sl->io_next++;
            *demand = r == 0;
            return sl;
        }
    }
    return NULL;
}

/* One reader thread: part after part; the reader that finishes a slot's
 * last part makes it ready (and closes its O_DIRECT descriptor). */
static void *io_main(void *arg)
{
    shoald_src *s = arg;
    io_pool *io = &s->io;

    pthread_mutex_lock(&io->mu);
    for (;;) {
        slot *sl = NULL;
        int demand = 0, fd = -1;
        uint32_t part = 0;
        while (!io->stop && !(sl = io_take(io, &demand, &part)))
            pthread_cond_wait(&io->work, &io->mu);
        if (io->stop)
            break;
        size_t b0, b1, lo, hi;
        part_range(s, sl, part, &b0, &b1, &lo, &hi);
        int64_t nb = (int64_t)(b1 - b0);       /* what this part reads (the last is short) */
        io->dactive += demand;
        if (io->nactive++ == 0)
            io->active_t0 = (int64_t)shoal_now_ns();
        io->read_bytes += (uint64_t)nb;
        io->guess_bytes += demand ? 0 : (uint64_t)nb;
        if (!demand && io->gbudget > 0)
            io->gbudget = io->gbudget > nb ? io->gbudget - nb : 0;
        pthread_mutex_unlock(&io->mu);
        int rc = part_read(s, sl, part);
        if (rc == 0 && sl->chk)
            checked_read_part(sl->chk, part, (const uint8_t *)sl->base + lo, hi - lo);
        pthread_mutex_lock(&io->mu);
        io->dactive -= demand;
        if (--io->nactive == 0)
            io->busy_ns += (uint64_t)((int64_t)shoal_now_ns() - io->active_t0);
        if (demand) {
            io->busy_bytes += (uint64_t)nb;
            if (io->dactive == 0 && io->ring[0].len == 0)
                io_gap_begin(io);
        }
        if (rc != 0 && sl->io_rc == 0)
            sl->io_rc = rc;                        /* a failed part fails the slot */
        assert(sl->io_left > 0);
        if (--sl->io_left == 0) {
            if (sl->chk && sl->io_rc == 0 && checked_read_result(sl->chk) != 1)
                sl->io_rc = SHOAL_ECORRUPT;        /* the bytes are not the object's */
            checked_read_free(sl->chk);
            sl->chk = NULL;
            fd = sl->io_fd;
            sl->io_fd = -1;
            sl->ready = 1;
            pthread_cond_broadcast(&io->done);
        }
        if (demand && io->dactive == 0)
            pthread_cond_broadcast(&io->work);     /* guesses may go now */
        if (fd >= 0) {
            pthread_mutex_unlock(&io->mu);
            close(fd);
            pthread_mutex_lock(&io->mu);
        }
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

/* Queue a slot's parts (prefetch: behind every demand read); `fresh`: a
 * newly loaded slot, else a promotion of one queued as a guess: its parts
 * not handed out yet are read as demand now. */
static void io_submit(shoald_src *s, slot *sl, int prefetch, int fresh)
{
    io_pool *io = &s->io;
    int r = prefetch ? 1 : 0;
    io_ring *q = &io->ring[r];

    pthread_mutex_lock(&io->mu);
    if (fresh) {
        size_t n = (sl->maplen + s->part - 1) / s->part;
        sl->ready = 0;
        sl->io_rc = 0;
        sl->io_parts = sl->io_left = n > 0 ? (uint32_t)n : 1;
        checked_read_free(sl->chk);
        sl->chk = checked_read_new(sl->xxh, sl->io_parts);   /* NULL (no memory): unchecked */
        sl->io_next = 0;
        sl->io_skip = 0;
    }
    if (!prefetch) {
        sl->io_skip = 0;                           /* demanded after all: resume */
        io_demand_begin(io);
    }
    if (sl->io_next < sl->io_parts && !(sl->io_queued & (1u << r))) {
        assert(q->len < q->cap);                   /* invariant 3 */
        q->q[(q->head + q->len) % q->cap] = sl;
        q->len++;
        sl->io_queued |= (uint8_t)(1u << r);
        pthread_cond_broadcast(&io->work);         /* a reader per part */
    }
    pthread_mutex_unlock(&io->mu);
}

static int slot_ready(shoald_src *s, slot *sl)
{
    int r;
    pthread_mutex_lock(&s->io.mu);
    r = sl->ready;
    pthread_mutex_unlock(&s->io.mu);
    return r;
}

/* A dropped guess, not fully read, that no reader holds a part of:
 * unloadable (invariant 2).  One read to the end is an expert like any
 * other (the quota decides). */
static int slot_dropped_idle(shoald_src *s, slot *sl)
{
    int r;
    pthread_mutex_lock(&s->io.mu);
    r = sl->io_skip && !sl->ready && sl->io_next + sl->io_left == sl->io_parts;
    pthread_mutex_unlock(&s->io.mu);
    return r;
}

/* An aligned buffer for the item's object and the descriptor its parts
 * read with O_DIRECT: a fresh open file description (/proc/self/fd), so
 * the daemon's descriptor keeps its flags; opened once per slot. */
static int slot_load_direct(shoald_src *s, slot *sl, shoal_item *it, int prefetch,
                            shoal_err *err)
{
    uint64_t start = it->offset / 4096 * 4096;
    size_t len = (size_t)((it->offset - start + it->length + 4095) / 4096 * 4096);
    void *buf = NULL;

    if (len > s->dbuf_len)     /* slot_load checked the length: cannot happen */
        return shoal_err_set(err, SHOAL_EPROTO, "an expert larger than its buffer");
    pthread_mutex_lock(&s->io.mu);
    /* a spare's pages are the pool's: the slot holds them now.  Only a
     * demand's: guesses take the pool only as their reads start, within
     * their half (io_take), or they could fill it ahead of the demand */
    if (s->io.nspare > 0 && !prefetch) {
        buf = s->spare[--s->io.nspare];
        sl->io_live = 1;
        s->io.live++;
    }
    pthread_mutex_unlock(&s->io.mu);
    if (buf)
        ;
    else if (posix_memalign(&buf, DIRECT_ALIGN, s->dbuf_len) != 0)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory for an expert");
    else
        shoal_hugepage_hint(buf, s->dbuf_len);   /* a hint: 4 KiB pages work too */
    sl->base = buf;
    sl->maplen = len;
    sl->data = (const uint8_t *)buf + (it->offset - start);
    sl->io_off = it->offset;
    sl->io_fd = shoal_fd_open_uncached(it->fd);
    sl->io_direct = sl->io_fd >= 0;
    if (!sl->io_direct) {      /* a file system without O_DIRECT (tmpfs): plain reads */
        sl->io_fd = it->fd;
        it->fd = -1;
    }
    return 0;
}

/* Make the item's object resident in sl (takes the item's descriptor);
 * its bytes are read by the io threads. */
static int slot_load(shoald_src *s, int layer, slot *sl, shoal_item *it, int prefetch,
                     shoal_err *err)
{
    int rc = 0;

    if (it->length != s->o.expert_bytes) {
        rc = shoal_err_set(err, SHOAL_EPROTO, "layer %d: an expert of %llu bytes, expected %llu",
                           layer, (unsigned long long)it->length,
                           (unsigned long long)s->o.expert_bytes);
    } else if (s->o.page_cache == EXPERT_PC_DIRECT) {
        rc = slot_load_direct(s, sl, it, prefetch, err);
    } else {
        shoal_view v;
        rc = shoal_item_map(it, 0, &v, err);
        if (rc == 0) {
            sl->base = v.base;
            sl->maplen = v.maplen;
            sl->data = v.data;
            if (s->o.page_cache == EXPERT_PC_DONTNEED) {
                sl->fd = it->fd;       /* kept for the fadvise at unload */
                sl->offset = it->offset;
                it->fd = -1;
            }
        }
    }
    memcpy(sl->xxh, it->xxh128, sizeof sl->xxh);
    shoal_item_release(it, NULL);
    if (rc != 0)
        return rc;
    sl->tier = it->source == SHOAL_SRC_HIT ? EXPERT_TIER_DISK : EXPERT_TIER_NETWORK;
    sl->arrived = s->clock;
    sl->kept = 0;
    s->resident[layer]++;
    s->res_count++;
    s->res_bytes += s->o.expert_bytes;
    io_submit(s, sl, prefetch, 1);
    return 0;
}

static req *req_find(shoald_src *s, uint64_t id, size_t *at)
{
    for (size_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i].id == id) {
            *at = i;
            return &s->reqs[i];
        }
    return NULL;
}

static void req_drop(shoald_src *s, size_t at)
{
    free(s->reqs[at].ids);
    s->reqs[at] = s->reqs[--s->n_reqs];
}

/* Take one GET item (blocking: wait up to the timeout for it; otherwise
 * only one already there, returning 1 when there is none) and apply it. */
static int pump(shoald_src *s, int blocking, shoal_err *err)
{
    shoal_item it;
    size_t at;
    req *r;
    int rc = blocking ? shoal_client_next(s->link->client, s->o.timeout_ms, &it, err)
                      : shoal_client_poll_item(s->link->client, &it, err);

    if (rc != 0)
        return rc;
    if (!(r = req_find(s, it.request, &at))) {
        shoal_item_release(&it, NULL);
        return 0;
    }
    if (it.index >= r->n) {            /* the whole GET failed: every key with it */
        for (size_t i = 0; i < r->n; i++) {
            slot *sl = slot_at(s, r->layer, r->ids[i]);
            sl->inflight--;
            if (!r->prefetch) {
                sl->demand = 0;
                if (!sl->data)
                    sl->status = it.status ? it.status : SHOAL_EPROTO;
            }
        }
        shoal_item_release(&it, NULL);
        req_drop(s, at);
        return 0;
    }
    int layer = r->layer;
    slot *sl = slot_at(s, layer, r->ids[it.index]);
    sl->inflight--;
    if (!r->prefetch)
        sl->demand = 0;
    if (it.status == 0 && !sl->data && !(r->prefetch && r->cancelled)) {
        shoal_err lerr = { 0 };
        int lr = slot_load(s, layer, sl, &it, r->prefetch, &lerr);   /* releases the item */
        if (lr == 0 && r->prefetch)
            sl->prefetched = 1;
        else if (lr != 0 && !r->prefetch)
            sl->status = lr;          /* the fetch reports it for this expert */
    } else {
        if (it.status != 0 && !r->prefetch && !sl->data)
            sl->status = it.status;
        shoal_item_release(&it, NULL);
    }
    if (--r->left == 0 || it.last)
        req_drop(s, at);
    return 0;
}

/* Apply every item already there (their reads start at once). */
static int drain(shoald_src *s, shoal_err *err)
{
    int rc;
    while ((rc = pump(s, 0, err)) == 0)
        ;
    return rc > 0 ? 0 : rc;
}

/* Send a GET of ids[0..n) of `layer` (n <= SHOAL_PROTO_MAX_KEYS). */
static int send_get(shoald_src *s, int layer, const int32_t *ids, size_t n, int prefetch,
                    shoal_err *err)
{
    shoal_key keys[64] = { { 0 } };
    shoal_key *k = n <= 64 ? keys : calloc(n, sizeof *k);
    uint64_t id;
    int rc;

    if (!k)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        k[i] = (shoal_key){ .kind = SHOAL_KEY_EXPERT, .layer = (uint16_t)layer,
                            .expert = (uint32_t)ids[i] };
    rc = shoal_client_get_send(s->link->client, s->link->handle, prefetch, k, n, &id, err);
    if (k != keys)
        free(k);
    if (rc != 0)
        return shoal_err_wrap(err, rc, "shoald GET of %zu experts of layer %d", n, layer);
    if (s->n_reqs == s->cap_reqs) {
        size_t cap = s->cap_reqs ? 2 * s->cap_reqs : 16;
        req *nr = realloc(s->reqs, cap * sizeof *nr);
        if (!nr)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        s->reqs = nr;
        s->cap_reqs = cap;
    }
    req *r = &s->reqs[s->n_reqs];
    *r = (req){ .id = id, .layer = layer, .prefetch = prefetch, .n = n, .left = n };
    if (!(r->ids = malloc(n * sizeof *r->ids)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    memcpy(r->ids, ids, n * sizeof *ids);
    s->n_reqs++;
    for (size_t i = 0; i < n; i++) {
        slot *sl = slot_at(s, layer, ids[i]);
        sl->inflight++;
        if (!prefetch)
            sl->demand = 1;
    }
    if (prefetch)
        s->prefetch_sent += n;
    return 0;
}

static int check_ids(shoald_src *s, int layer, const int32_t *ids, size_t n, shoal_err *err)
{
    if (layer < 0 || layer >= s->o.n_layers)
        return shoal_err_set(err, SHOAL_EINVAL, "no layer %d", layer);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->o.experts_per_layer)
            return shoal_err_set(err, SHOAL_ERANGE, "layer %d: no expert %d", layer, (int)ids[i]);
    return 0;
}

/* The link was given a new connection (source.h): the GETs open on the old
 * one will never answer.  Forget them, and what slots expected of them;
 * resident experts stay (their bytes outlive the connection). */
static void link_follow(shoald_src *s)
{
    size_t nslots = (size_t)s->o.n_layers * (size_t)s->o.experts_per_layer;
    if (s->epoch == s->link->epoch)
        return;
    for (size_t i = 0; i < s->n_reqs; i++)
        free(s->reqs[i].ids);
    s->n_reqs = 0;
    for (size_t i = 0; i < nslots; i++) {
        s->slots[i].inflight = 0;
        s->slots[i].demand = 0;
        s->slots[i].status = 0;
    }
    s->epoch = s->link->epoch;
}

/* Ask for what is neither resident nor (for demand: demanded already;
 * for a prefetch: in flight at all). */
static int shoald_request(void *impl, int layer, const int32_t *ids, size_t n, int prefetch,
                          shoal_err *err)
{
    shoald_src *s = impl;
    int32_t *want = malloc((n ? n : 1) * sizeof *want);
    size_t nw = 0;
    int rc = check_ids(s, layer, ids, n, err);

    if (!want)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    link_follow(s);
    if (!prefetch) {
        pthread_mutex_lock(&s->io.mu);
        io_demand_begin(&s->io);
        pthread_mutex_unlock(&s->io.mu);
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
        slot *sl = slot_at(s, layer, ids[i]);
        if (!sl->data && !(prefetch ? sl->inflight : sl->demand))
            want[nw++] = ids[i];
        else if (sl->data && !prefetch)
            io_submit(s, sl, 0, 0);    /* a guess still queued: read it first now */
    }
    for (size_t b = 0; rc == 0 && b < nw; b += SHOAL_PROTO_MAX_KEYS)
        rc = send_get(s, layer, want + b, nw - b < SHOAL_PROTO_MAX_KEYS ? nw - b
                                                                       : SHOAL_PROTO_MAX_KEYS,
                      prefetch, err);
    free(want);
    if (rc == 0)
        rc = drain(s, err);
    if (rc != 0 || prefetch)
        return rc;
    /* the layer's real set is known: its guesses are no longer needed, and
     * a guess outside it reads no further part (dropped at the trim) */
    for (size_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i].layer == layer && s->reqs[i].prefetch && !s->reqs[i].cancelled) {
            s->reqs[i].cancelled = 1;
            shoal_client_cancel(s->link->client, s->reqs[i].id, NULL);
        }
    for (size_t i = 0; i < n; i++)
        slot_at(s, layer, ids[i])->wanted = 1;
    pthread_mutex_lock(&s->io.mu);
    for (int e = 0; e < s->o.experts_per_layer; e++) {
        slot *sl = slot_at(s, layer, e);
        if (sl->data && sl->prefetched && !sl->wanted && !sl->ready)
            sl->io_skip = 1;
        sl->wanted = 0;
    }
    pthread_mutex_unlock(&s->io.mu);
    /* a dropped guess no reader holds a part of gives its buffer back now */
    for (int e = 0; e < s->o.experts_per_layer; e++) {
        slot *sl = slot_at(s, layer, e);
        if (sl->data && sl->io_skip && slot_dropped_idle(s, sl))
            slot_unload(s, layer, sl);
    }
    return 0;
}

/* Keep at most quota experts of the layer (LRU out), and nothing a guess
 * brought that this fetch did not use. */
static void layer_trim(shoald_src *s, int layer)
{
    int E = s->o.experts_per_layer;
    for (int e = 0; e < E; e++) {
        slot *sl = slot_at(s, layer, e);
        sl->prefetched = 0;                        /* a guess this fetch did not use */
        if (sl->data && slot_dropped_idle(s, sl))
            slot_unload(s, layer, sl);
    }
    while (s->resident[layer] > s->quota) {
        slot *victim = NULL;
        for (int e = 0; e < E; e++) {
            slot *sl = slot_at(s, layer, e);
            if (sl->data && slot_ready(s, sl) && (!victim || sl->last_use < victim->last_use))
                victim = sl;
        }
        if (!victim)
            break;
        slot_unload(s, layer, victim);
    }
    /* why a flag and not "arrived before this fetch": a late duplicate or a
     * cancelled guess can land after the trim; only what the quota kept is
     * the RAM tier.  A slot still being read could not be trimmed, so it is
     * not something the quota kept: counting it as a RAM hit next time would
     * show a tier (even with a quota of 0) that did not serve it. */
    for (int e = 0; e < E; e++) {
        slot *sl = slot_at(s, layer, e);
        sl->kept = sl->data != NULL && slot_ready(s, sl);
        if (sl->kept && sl->io_live) {             /* the tier's now, not the pool's */
            pthread_mutex_lock(&s->io.mu);
            slot_unlive(s, sl);
            pthread_cond_broadcast(&s->io.work);
            pthread_mutex_unlock(&s->io.mu);
        }
    }
}

/* After one expert of a fetch was delivered (sl): the layer keeps at most
 * `quota` of its ready experts that the fetch has delivered or does not
 * need (least recently used out first, so older ones before this
 * fetch's), now rather than at the fetch's end, and what stays is the
 * tier's, not the pool's: a prefill chunk's hundreds of experts stream
 * through the pool instead of being held at once. */
static void layer_trim_one(shoald_src *s, int layer, slot *just)
{
    int E = s->o.experts_per_layer;
    while (s->resident[layer] > s->quota) {
        slot *victim = NULL;
        size_t held = 0;
        pthread_mutex_lock(&s->io.mu);             /* once for the scan: ready is read */
        for (int e = 0; e < E; e++) {
            slot *sl = slot_at(s, layer, e);
            if (!sl->data || sl->pend || !sl->ready)
                continue;
            held++;
            if (!victim || sl->last_use < victim->last_use ||
                (sl == just && sl->last_use == victim->last_use))
                victim = sl;
        }
        pthread_mutex_unlock(&s->io.mu);
        if (held <= s->quota || !victim)
            break;
        slot_unload(s, layer, victim);
    }
    if (just->data) {
        just->kept = 1;
        pthread_mutex_lock(&s->io.mu);
        slot_unlive(s, just);
        pthread_cond_broadcast(&s->io.work);
        pthread_mutex_unlock(&s->io.mu);
    }
}

/* A demand read waits for a pool buffer while spares fill the pool and no
 * read runs (invariant 5): free spares until it can start.  Mutex held;
 * the buffers are freed by the caller. */
static int pool_make_room(shoald_src *s, void **freed)
{
    io_pool *io = &s->io;
    int n = 0;
    while (io->nactive == 0 && io->ring[0].len > 0 && io->nspare > 0 &&
           io->live + io->nspare >= PLAN_EXPERT_POOL)
        freed[n++] = s->spare[--io->nspare];
    if (n)
        pthread_cond_broadcast(&io->work);
    return n;
}

static void report(shoald_src *s, int force)
{
    uint64_t now = shoal_now_ns();
    char json[256];

    if (s->ram_hits == s->rep_hits && s->ram_misses == s->rep_misses)
        return;
    if (!force && now - s->last_report_ns < 1000000000ull)
        return;
    snprintf(json, sizeof json, "{\"tier\":\"ram\",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64
             ",\"bytes\":%" PRIu64 ",\"handle\":%u}", s->ram_hits - s->rep_hits,
             s->ram_misses - s->rep_misses, s->ram_bytes_hit - s->rep_bytes, s->link->handle);
    if (shoal_client_report(s->link->client, json, NULL) == 0) {
        s->rep_hits = s->ram_hits;
        s->rep_misses = s->ram_misses;
        s->rep_bytes = s->ram_bytes_hit;
    }
    s->last_report_ns = now;
}

static int shoald_fetch(void *impl, int layer, const int32_t *ids, size_t n,
                        expert_ready_fn fn, void *ctx, shoal_err *err)
{
    shoald_src *s = impl;
    uint8_t *done = calloc(n ? n : 1, 1);
    uint64_t clock = ++s->clock;
    size_t left = n;
    int rc;

    if (!done)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    rc = shoald_request(impl, layer, ids, n, 0, err);
    for (size_t j = 0; rc == 0 && j < n; j++)
        slot_at(s, layer, ids[j])->pend = 1;
    while (rc == 0 && left > 0) {
        size_t i = n;
        int read_rc = 0, read_done = 0;
        if ((rc = drain(s, err)) != 0) {
            rc = shoal_err_wrap(err, rc, "shoald: layer %d, %zu of %zu experts received", layer,
                                n - left, n);
            break;
        }
        int pending = 0;
        pthread_mutex_lock(&s->io.mu);
        for (size_t j = 0; j < n && i == n; j++) {
            slot *sj = slot_at(s, layer, ids[j]);
            if (done[j])
                continue;
            if (sj->status || (sj->data && sj->ready)) {
                i = j;
                read_done = sj->data && sj->ready;
                read_rc = read_done ? sj->io_rc : 0;
            } else if (sj->data)
                pending = 1;
        }
        void *freed[DIRECT_SPARES];
        int nfreed = 0;
        if (i == n)
            nfreed = pool_make_room(s, freed);
        if (i == n && pending) {       /* arrived, being read: wait for a read a moment */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 2000000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->io.done, &s->io.mu, &ts);
        }
        pthread_mutex_unlock(&s->io.mu);
        while (nfreed > 0)
            free(freed[--nfreed]);
        if (i == n) {
            if (!pending && (rc = pump(s, 1, err)) != 0)   /* wait for the next item */
                rc = shoal_err_wrap(err, rc, "shoald: layer %d, %zu of %zu experts received",
                                    layer, n - left, n);
            continue;
        }
        slot *sl = slot_at(s, layer, ids[i]);
        if (read_done && read_rc == SHOAL_ECORRUPT && !sl->refetched) {
            /* damaged on disk: shoald removes it, and it is asked again */
            slot_unload(s, layer, sl);
            sl->refetched = 1;
            if ((rc = checked_read_report(s->link->client, s->link->handle, layer, ids[i],
                                          err)) == 0)
                rc = send_get(s, layer, &ids[i], 1, 0, err);   /* the layer's set stays */
            continue;
        }
        done[i] = 1;
        sl->pend = 0;
        left--;
        if (!sl->status && read_rc)
            sl->status = read_rc;
        if (!read_rc)
            sl->refetched = 0;
        if (sl->status) {
            shoal_err d = { 0 };
            int st = sl->status;
            sl->status = 0;
            shoal_err_set(&d, st, "shoald could not deliver layer %d expert %d: %s", layer,
                          (int)ids[i], shoal_strerror(st));
            if (read_done && read_rc)      /* a failed read: not an expert to keep */
                slot_unload(s, layer, sl);
            rc = fn(ctx, layer, ids[i], NULL, 0, EXPERT_TIER_DISK, st, &d);
            continue;
        }
        expert_tier tier = sl->kept ? EXPERT_TIER_RAM : (expert_tier)sl->tier;
        if (sl->prefetched) {
            s->prefetch_used++;
            s->prefetch_early += sl->arrived < clock;
            sl->prefetched = 0;
        }
        if (tier == EXPERT_TIER_RAM) {
            s->ram_hits++;
            s->ram_bytes_hit += s->o.expert_bytes;
        } else {
            s->ram_misses++;
        }
        sl->last_use = clock;
        rc = fn(ctx, layer, ids[i], sl->data, (size_t)s->o.expert_bytes, tier, 0, NULL);
        layer_trim_one(s, layer, sl);
    }
    for (size_t j = 0; j < n; j++)
        slot_at(s, layer, ids[j])->pend = 0;
    free(done);
    layer_trim(s, layer);
    if (rc == 0)
        report(s, 0);
    return rc;
}

/* File order (options.file_order): the layer-major prefill asks for a
 * layer's whole set at once, so shoald serves it, and the readers read it,
 * in the upstream files' order. */
static int order_cmp(const void *a, const void *b, void *arg)
{
    const uint64_t *key = arg;
    uint64_t x = key[*(const int32_t *)a], y = key[*(const int32_t *)b];
    return x < y ? -1 : x > y;
}

static void shoald_order(void *impl, int layer, int32_t *ids, size_t n)
{
    shoald_src *s = impl;
    shoal_err e;

    if (!s->file_order || check_ids(s, layer, ids, n, &e) != 0)
        return;                        /* fetch names the bad id */
    shoal_qsort_r(ids, n, sizeof *ids, order_cmp,
            s->file_order + (size_t)layer * (size_t)s->o.experts_per_layer);
}

static void shoald_stats(void *impl, expert_source_stats *out)
{
    shoald_src *s = impl;
    out->prefetch_sent = s->prefetch_sent;
    out->prefetch_used = s->prefetch_used;
    out->prefetch_early = s->prefetch_early;
    out->ram_resident = s->res_count;
    out->ram_bytes = s->res_bytes;
    out->ram_quota = s->quota;
    pthread_mutex_lock(&s->io.mu);
    out->read_bytes = s->io.read_bytes;
    out->read_guess_bytes = s->io.guess_bytes;
    out->read_busy_ns = s->io.busy_ns;
    out->pool_peak = (uint64_t)s->io.peak;
    out->pool_max = PLAN_EXPERT_POOL;
    pthread_mutex_unlock(&s->io.mu);
}

static void shoald_free(void *impl)
{
    shoald_src *s = impl;
    if (!s)
        return;
    report(s, 1);
    if (s->io.nth > 0) {
        pthread_mutex_lock(&s->io.mu);
        s->io.stop = 1;
        pthread_cond_broadcast(&s->io.work);
        pthread_mutex_unlock(&s->io.mu);
        for (int i = 0; i < s->io.nth; i++)
            pthread_join(s->io.th[i], NULL);
    }
    for (int l = 0; s->slots && l < s->o.n_layers; l++)
        for (int e = 0; e < s->o.experts_per_layer; e++)
            slot_unload(s, l, slot_at(s, l, e));
    for (size_t i = 0; i < s->n_reqs; i++)
        free(s->reqs[i].ids);
    free(s->reqs);
    while (s->io.nspare > 0)
        free(s->spare[--s->io.nspare]);
    free(s->slots);
    free(s->file_order);
    free(s->resident);
    free(s->io.ring[0].q);
    free(s->io.ring[1].q);
    if (s->io.ring[0].cap) {
        pthread_mutex_destroy(&s->io.mu);
        pthread_cond_destroy(&s->io.work);
        pthread_cond_destroy(&s->io.done);
    }
    free(s);
}

/* copy: keep a copy of *link (it never changes); else borrow it */
static expert_source *shoald_new(const expert_source_shoald_link *link,
                                 const expert_source_shoald_options *o, int copy)
{
    static const expert_source_ops ops = { shoald_fetch, shoald_free };
    static const expert_source_more_ops more = { shoald_request, shoald_stats, shoald_order };
    shoald_src *s = calloc(1, sizeof *s);
    size_t nslots = (size_t)o->n_layers * (size_t)o->experts_per_layer;

    if (!s)
        return NULL;
    s->own = *link;
    s->link = copy ? &s->own : link;
    s->epoch = link->epoch;
    s->o = *o;
    if (s->o.timeout_ms <= 0)
        s->o.timeout_ms = 60000;
    s->page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    /* parts: whole pages for madvise, whole 4096-byte blocks for O_DIRECT */
    size_t align = s->page > 4096 ? (size_t)s->page : 4096;
    size_t part = o->read_part ? (size_t)o->read_part
                  : o->page_cache == EXPERT_PC_DIRECT ? READ_PART_DIRECT : READ_PART_DEFAULT;
    s->part = (part + align - 1) / align * align;
    /* room for the expert at any offset: a 4096-aligned start before it */
    s->dbuf_len = ((size_t)o->expert_bytes + 4096 + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    if (o->expert_bytes && o->moe_layers > 0)
        s->quota = (size_t)(o->ram_bytes / o->expert_bytes / (uint64_t)o->moe_layers);
    s->slots = calloc(nslots ? nslots : 1, sizeof *s->slots);
    s->resident = calloc((size_t)o->n_layers + 1, sizeof *s->resident);
    if (o->file_order && (s->file_order = malloc((nslots ? nslots : 1) * sizeof *s->file_order)))
        memcpy(s->file_order, o->file_order, nslots * sizeof *s->file_order);
    s->o.file_order = NULL;            /* the copy is s->file_order */
    for (int r = 0; r < 2; r++) {
        s->io.ring[r].cap = nslots + 1;            /* invariant 3 */
        s->io.ring[r].q = calloc(s->io.ring[r].cap, sizeof *s->io.ring[r].q);
    }
    if (!s->slots || !s->resident || !s->io.ring[0].q || !s->io.ring[1].q ||
        (o->file_order && !s->file_order)) {
        s->io.ring[0].cap = 0;
        shoald_free(s);
        return NULL;
    }
    pthread_mutex_init(&s->io.mu, NULL);
    s->io.gbudget = -1;                            /* no gap measured yet */
    pthread_cond_init(&s->io.work, NULL);
    pthread_cond_init(&s->io.done, NULL);
    for (size_t i = 0; i < nslots; i++)
        s->slots[i].fd = s->slots[i].io_fd = -1;
    for (int i = 0; i < IO_THREADS; i++) {
        if (pthread_create(&s->io.th[i], NULL, io_main, s) != 0)
            break;
        s->io.nth++;
    }
    if (s->io.nth == 0) {
        shoald_free(s);
        return NULL;
    }
    s->last_report_ns = shoal_now_ns();
    return expert_source_new_more(&ops, &more, s);
}

expert_source *expert_source_shoald_new(shoal_client *client, uint32_t handle,
                                        const expert_source_shoald_options *o)
{
    expert_source_shoald_link l = { .client = client, .handle = handle };
    return shoald_new(&l, o, 1);
}

expert_source *expert_source_shoald_new_link(const expert_source_shoald_link *link,
                                             const expert_source_shoald_options *o)
{
    return shoald_new(link, o, 0);
}
