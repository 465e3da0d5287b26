/* spine_stream.c — the part of the spine the memory plan cannot keep
 * resident, read from disk every token (docs/engine.md, "Smaller
 * machines"; engine/plan/ decides which layers).
 *
 * At load each streamed matrix is written, as model.c derives it, to an
 * unlinked file: one region per layer starting at a multiple of 4 KiB,
 * each matrix's weights and then its scales at a multiple of
 * PLAN_STREAM_ALIGN (plan_stream_mat_bytes), the file's pages dropped
 * after each layer so the page cache holds no second copy.  Then two
 * buffers of the largest region (anonymous memory in huge pages from 2 MiB
 * on: plan_stream_buffer_bytes) and one
 * reader thread: when layer L is bound to one buffer, layer L+1 (after the
 * last, the first streamed layer of the next token) is read into the other
 * with O_DIRECT while L computes — the experts' approach, one layer ahead.
 * A layer asked for out of that order is read at once (counted as
 * sync_reads).  Where O_DIRECT is refused (tmpfs) the reads are buffered
 * and the pages dropped after each.
 *
 * In place (a spine pack held in one anonymous buffer, remote.c): the
 * pack's streamed layers are never read at load; each pass reads layer
 * L+1's bytes (O_DIRECT, from the pack's file in shoald's cache) where the
 * pack keeps them while layer L runs, and releases layer L-1's whole pages
 * (MADV_DONTNEED): no pointer moves but the routers', copied out first
 * (the lookahead reads the next layer's router during this one).
 *
 * Checked (in place; docs/engine.md "Checked reads"): the load hashed each
 * streamed layer's file range [off, off + need) on the way through the
 * whole pack's check (remote.c) and hands the hashes in
 * (spine_stream_expect); every layer read is hashed against its own, by
 * a hasher thread that follows the reader a 4 MiB part behind (so a
 * checked read takes its read plus one part's hash, not read plus hash).  A mismatch is read once more (a bad read);
 * bytes that are still wrong fail the pass with SHOAL_ECORRUPT naming the
 * layer, after telling the owner (spine_stream_on_damaged: remote.c
 * REPORTs the pack damaged, so the next load rebuilds it).
 *
 * Owns: the file, the buffers, the thread.  The matrices stay the model's:
 * only their pointers are rebound.
 */
#include "engine/forward/stream_int.h"

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
#include "engine/plan/plan.h"

#define ST_ALIGN ((size_t)2 << 20)
#define ST_HASH_PART ((size_t)4 << 20)   /* checked reads: the hasher follows in parts */

typedef struct stream_ref {
    engine_mat *dst;
    k3_fmt fmt;
    size_t rows, cols;
    uint64_t w_off, s_off;       /* in the layer's region */
} stream_ref;

typedef struct stream_layer {
    uint64_t off, len;           /* the region: file offset, bytes (4 KiB multiples) */
    uint64_t need;               /* of them, up to its last byte (the file may end before len) */
    size_t ref0, nref;
    uint8_t *place;              /* in place: where the region is read to */
    uint8_t *drop0, *drop1;      /* in place: its whole pages, released after it ran */
    int loaded;                  /* in place: its bytes are there */
    int checked;                 /* in place: xxh holds its bytes' XXH3-128 */
    int damaged;                 /* ... and the last read did not match it */
    uint8_t xxh[16];
} stream_layer;

struct spine_stream {
    int fd, rfd, direct;
    int n, first, cur;           /* layers; the first streamed; the one being written */
    uint64_t pos;                /* the file's end while writing */
    stream_layer *layers;        /* [n] */
    stream_ref *refs;
    size_t nrefs, caprefs;
    uint8_t *slot[2];
    size_t slot_cap;
    int slot_layer[2];           /* held (-1: none or being read) */
    pthread_t th;
    int th_up;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy, busy_layer, busy_slot, quit, read_rc;
    int inplace, bound;          /* a pack read in place (no buffers); the layer bound last */
    void **keeps;                /* in place: the routers' copies */
    size_t nkeeps;
    engine_stream_damaged_fn on_damaged;
    void *damaged_ctx;
    /* in place, checked: the hasher thread, a part behind the reads */
    pthread_t hth;
    int h_up, h_quit, h_busy;    /* h_busy: the hasher is in an update */
    pthread_mutex_t hmu;
    pthread_cond_t hcv;
    XXH3_state_t *hst;
    const uint8_t *h_base;       /* the region being read */
    size_t h_avail, h_done;      /* bytes of it read; hashed */
    engine_stream_stats st;
};

static size_t up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

int spine_stream_open(const char *dir, int n_layers, int first, spine_stream **out,
                      shoal_err *err)
{
    char path[4096];
    const char *d = dir && *dir ? dir : "/var/tmp";    /* on disk; /tmp may be RAM (tmpfs) */
    spine_stream *s = calloc(1, sizeof *s);

    *out = NULL;
    if (!s || !(s->layers = calloc((size_t)n_layers, sizeof *s->layers))) {
        free(s);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    s->n = n_layers;
    s->first = first;
    s->cur = -1;
    s->fd = s->rfd = -1;
    s->slot_layer[0] = s->slot_layer[1] = -1;
    s->st.first_layer = first;
    snprintf(path, sizeof path, "%s/shoal-spine-stream.XXXXXX", d);
    if ((s->fd = mkstemp(path)) < 0) {
        int e = errno;
        free(s->layers);
        free(s);
        return shoal_err_set(err, SHOAL_EIO, "the streamed spine's file %s: %s (it needs a "
                             "writable directory on a disk with room for the streamed part)",
                             path, strerror(e));
    }
    unlink(path);                /* gone with the process */
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    *out = s;
    return 0;
}

static int write_all(int fd, const void *b, size_t n, uint64_t off, shoal_err *err)
{
    const uint8_t *p = b;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return shoal_err_set(err, errno == ENOSPC ? SHOAL_ENOSPC : SHOAL_EIO,
                                 "writing the streamed spine: %s", strerror(errno));
        p += w;
        off += (uint64_t)w;
        n -= (size_t)w;
    }
    return 0;
}

/* The layer just written: its region's end rounded, its pages dropped. */
static void layer_close(spine_stream *s)
{
    stream_layer *l;
    if (s->cur < 0)
        return;
    l = &s->layers[s->cur];
    s->pos = up(s->pos, 4096);
    l->len = l->need = s->pos - l->off;
    if (l->len > s->slot_cap)
        s->slot_cap = l->len;
    (void)shoal_fdatasync(s->fd);
    shoal_cache_drop(s->fd, (off_t)l->off, (off_t)l->len);
}

int spine_stream_put(spine_stream *s, int layer, engine_mat *dst, k3_fmt fmt, const void *w,
                     size_t wb, const void *sc, size_t sb, shoal_err *err)
{
    stream_ref *r;
    int rc;

    if (layer < s->first || layer >= s->n || layer < s->cur)
        return shoal_err_set(err, SHOAL_EINTERNAL, "streamed spine: layer %d out of order", layer);
    if (layer != s->cur) {
        layer_close(s);
        s->cur = layer;
        s->layers[layer].off = s->pos = up(s->pos, 4096);
        s->layers[layer].ref0 = s->nrefs;
    }
    if (s->nrefs == s->caprefs) {
        size_t cap = s->caprefs ? s->caprefs * 2 : 64;
        stream_ref *nr = realloc(s->refs, cap * sizeof *nr);
        if (!nr)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        s->refs = nr;
        s->caprefs = cap;
    }
    r = &s->refs[s->nrefs];
    *r = (stream_ref){ .dst = dst, .fmt = fmt, .rows = dst->rows, .cols = dst->cols };
    r->w_off = s->pos - s->layers[layer].off;
    if ((rc = write_all(s->fd, w, wb, s->pos, err)) != 0)
        return rc;
    s->pos += up(wb, PLAN_STREAM_ALIGN);
    r->s_off = s->pos - s->layers[layer].off;
    if (sb && (rc = write_all(s->fd, sc, sb, s->pos, err)) != 0)
        return rc;
    s->pos += up(sb, PLAN_STREAM_ALIGN);
    s->layers[layer].nref++;
    s->nrefs++;
    *dst = (engine_mat){ .rows = r->rows, .cols = r->cols };   /* bound before each use */
    return 0;
}

/* Read layer's region into slot (in place: into its place); 0 or an
 * error code. */
/* The hasher (in place, checked): hashes [done, avail) of the region
 * being read as the reader's parts come in, in order, so a layer's check
 * costs its read plus the hash of its last part, not read plus hash. */
static void *hasher_main(void *arg)
{
    spine_stream *s = arg;
    pthread_mutex_lock(&s->hmu);
    for (;;) {
        while (!s->h_quit && s->h_done >= s->h_avail)
            pthread_cond_wait(&s->hcv, &s->hmu);
        if (s->h_quit)
            break;
        size_t a = s->h_done, b = s->h_avail;
        s->h_busy = 1;
        pthread_mutex_unlock(&s->hmu);
        uint64_t t0 = shoal_now_ns();
        shoal_xxh3_update(s->hst, s->h_base + a, b - a);
        __atomic_add_fetch(&s->st.check_ns, shoal_now_ns() - t0, __ATOMIC_RELAXED);
        pthread_mutex_lock(&s->hmu);
        s->h_busy = 0;
        s->h_done = b;
        pthread_cond_broadcast(&s->hcv);
    }
    pthread_mutex_unlock(&s->hmu);
    return NULL;
}

/* Bytes [0, n) of the region being read are there: hand what is new of
 * [0, need) to the hasher. */
static void hash_avail(spine_stream *s, size_t n, size_t need)
{
    pthread_mutex_lock(&s->hmu);
    s->h_avail = n < need ? n : need;
    pthread_cond_broadcast(&s->hcv);
    pthread_mutex_unlock(&s->hmu);
}

/* Read layer's region into slot (in place: into its place), checked
 * against its hash when it has one; 0, SHOAL_ECORRUPT or an error code. */
static int region_read(spine_stream *s, int layer, int slot)
{
    const stream_layer *l = &s->layers[layer];
    uint8_t *dst = s->inplace ? l->place : s->slot[slot];
    int check = s->inplace && l->checked && s->h_up;
    size_t got = 0, part = check ? ST_HASH_PART : (size_t)l->len;
    int rc = 0;

    if (check) {
        pthread_mutex_lock(&s->hmu);
        shoal_xxh3_reset(s->hst);
        s->h_base = dst;
        s->h_done = s->h_avail = 0;
        pthread_mutex_unlock(&s->hmu);
    }
    while (got < l->len) {
        size_t want = l->len - got < part ? (size_t)l->len - got : part;
        ssize_t r = pread(s->rfd, dst + got, want, (off_t)(l->off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0 && got >= l->need)
            break;                       /* the pack's last layer: the file ends in its block */
        if (r <= 0) {
            rc = SHOAL_EIO;
            break;
        }
        got += (size_t)r;
        if (check)
            hash_avail(s, got, (size_t)l->need);
    }
    if (check) {                         /* the hasher's last part, then the verdict */
        XXH128_canonical_t can;
        pthread_mutex_lock(&s->hmu);
        if (rc != 0)
            s->h_avail = s->h_done;      /* nothing more comes */
        while (s->h_done < s->h_avail || s->h_busy)
            pthread_cond_wait(&s->hcv, &s->hmu);
        pthread_mutex_unlock(&s->hmu);
        shoal_xxh3_digest(s->hst, can.digest);
        if (rc == 0 && memcmp(can.digest, l->xxh, 16) != 0)
            rc = SHOAL_ECORRUPT;
    }
    if (!s->direct)
        shoal_cache_drop(s->rfd, (off_t)l->off, (off_t)l->len);
    return rc;
}

static void *reader_main(void *arg)
{
    spine_stream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->quit && !s->busy)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->quit)
            break;
        int layer = s->busy_layer, slot = s->busy_slot;
        pthread_mutex_unlock(&s->mu);
        int rc = region_read(s, layer, slot);
        pthread_mutex_lock(&s->mu);
        if (s->inplace) {
            s->layers[layer].loaded = rc == 0;
            s->layers[layer].damaged = rc == SHOAL_ECORRUPT;
        }
        else
            s->slot_layer[slot] = rc == 0 ? layer : -1;
        s->read_rc = rc;
        s->st.reads++;
        s->st.bytes += rc == 0 ? s->layers[layer].len : 0;
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int spine_stream_seal(spine_stream *s, shoal_err *err)
{
    void *b;

    layer_close(s);
    s->cur = s->n;
    if (ftruncate(s->fd, (off_t)s->pos) != 0)
        return shoal_err_set(err, SHOAL_EIO, "streamed spine: %s", strerror(errno));
    s->st.file_bytes = s->pos;
    size_t bytes = (size_t)plan_stream_buffer_bytes(s->slot_cap);
    s->st.buffer_bytes = 2 * bytes;
    for (int i = 0; i < 2; i++) {
        if (posix_memalign(&b, bytes >= ST_ALIGN ? ST_ALIGN : 4096, bytes) != 0)
            return shoal_err_set(err, SHOAL_ENOMEM, "streamed spine: no memory for a buffer of "
                                 "%zu bytes (the plan counted two)", s->slot_cap);
        if (bytes >= ST_ALIGN)
            shoal_hugepage_hint(b, bytes);
        s->slot[i] = b;
    }
    s->rfd = shoal_fd_open_uncached(s->fd);
    s->direct = s->rfd >= 0;
    if (s->direct && region_read(s, s->first, 0) != 0) {   /* O_DIRECT opens but cannot read */
        close(s->rfd);
        s->direct = 0;
    }
    if (!s->direct)
        s->rfd = s->fd;
    else {
        s->slot_layer[0] = s->first;      /* that probe read is the first pass's read */
        s->st.reads++;
        s->st.bytes += s->layers[s->first].len;
    }
    s->st.direct = s->direct;
    if (pthread_create(&s->th, NULL, reader_main, s) != 0)
        return shoal_err_set(err, SHOAL_ENOMEM, "streamed spine: cannot start its reader");
    s->th_up = 1;
    return 0;
}

static void layer_bind(spine_stream *s, int layer, int slot)
{
    const stream_layer *l = &s->layers[layer];
    for (size_t i = l->ref0; i < l->ref0 + l->nref; i++) {
        const stream_ref *r = &s->refs[i];
        const uint8_t *w = s->slot[slot] + r->w_off, *sc = s->slot[slot] + r->s_off;
        engine_mat *d = r->dst;
        *d = (engine_mat){ .rows = r->rows, .cols = r->cols };
        if (r->fmt == K3_FMT_INT8)
            d->q8 = (kernels_q8){ (const int8_t *)w, (const float *)sc, r->rows, r->cols };
        else if (r->fmt == K3_FMT_INT4)
            d->q4 = (kernels_q4){ w, sc, r->rows, r->cols };
        else
            d->f32 = (kernels_f32){ (const float *)w, r->rows, r->cols };
    }
}

/* In place: layer's bytes read where the pack keeps them, the layer
 * bound before it released (its whole pages), the next one read ahead. */
static int ready_inplace(spine_stream *s, int layer)
{
    uint64_t t0 = shoal_now_ns();
    stream_layer *l = &s->layers[layer];
    int next, rc = 0;

    pthread_mutex_lock(&s->mu);
    while (s->busy && s->busy_layer == layer)
        pthread_cond_wait(&s->cv, &s->mu);
    if (!l->loaded) {
        while (s->busy)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
        rc = region_read(s, layer, 0);   /* damaged ahead: read once more */
        pthread_mutex_lock(&s->mu);
        s->st.reads++;
        s->st.sync_reads++;
        s->st.bytes += rc == 0 ? l->len : 0;
        l->loaded = rc == 0;
        l->damaged = rc == SHOAL_ECORRUPT;
    }
    s->st.wait_ns += shoal_now_ns() - t0;
    if (s->bound >= s->first && s->bound != layer && s->layers[s->bound].loaded) {
        stream_layer *b = &s->layers[s->bound];
        if (b->drop1 > b->drop0)
            (void)madvise(b->drop0, (size_t)(b->drop1 - b->drop0), MADV_DONTNEED);
        b->loaded = 0;
    }
    s->bound = layer;
    next = layer + 1 < s->n ? layer + 1 : s->first;
    if (rc == 0 && next != layer && !s->layers[next].loaded && !s->busy) {
        s->busy = 1;
        s->busy_layer = next;
        s->busy_slot = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int spine_stream_ready(spine_stream *s, int layer, shoal_err *err)
{
    uint64_t t0;
    int slot, next, rc = 0;

    if (!s || layer < s->first || layer >= s->n)
        return 0;
    if (s->inplace) {
        rc = ready_inplace(s, layer);
        if (rc == SHOAL_ECORRUPT) {
            if (s->on_damaged)
                s->on_damaged(s->damaged_ctx, layer);
            return shoal_err_set(err, SHOAL_ECORRUPT, "layer %d of the streamed spine read back "
                                 "damaged from the spine pack in shoald's cache (its XXH3-128 "
                                 "does not match the one the load checked, twice): the pack was "
                                 "reported damaged; restart the engine, which builds it again "
                                 "(`shoal verify --deep` checks the rest of the cache)", layer);
        }
        if (rc != 0)
            return shoal_err_set(err, SHOAL_EIO, "reading layer %d of the streamed spine "
                                 "(in the pack) failed", layer);
        return 0;
    }
    t0 = shoal_now_ns();
    pthread_mutex_lock(&s->mu);
    while (s->busy && s->busy_layer == layer)
        pthread_cond_wait(&s->cv, &s->mu);
    slot = s->slot_layer[0] == layer ? 0 : s->slot_layer[1] == layer ? 1 : -1;
    if (slot < 0) {                       /* not read ahead: read it now */
        while (s->busy)
            pthread_cond_wait(&s->cv, &s->mu);
        slot = 0;
        s->slot_layer[0] = -1;
        pthread_mutex_unlock(&s->mu);
        rc = region_read(s, layer, 0);
        pthread_mutex_lock(&s->mu);
        s->st.reads++;
        s->st.sync_reads++;
        if (rc == 0) {
            s->st.bytes += s->layers[layer].len;
            s->slot_layer[0] = layer;
        }
    }
    s->st.wait_ns += shoal_now_ns() - t0;
    if (rc == 0) {
        layer_bind(s, layer, slot);
        next = layer + 1 < s->n ? layer + 1 : s->first;
        if (next != layer && s->slot_layer[1 - slot] != next && !s->busy) {
            s->slot_layer[1 - slot] = -1;
            s->busy = 1;
            s->busy_layer = next;
            s->busy_slot = 1 - slot;
            pthread_cond_broadcast(&s->cv);
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (rc != 0)
        return shoal_err_set(err, SHOAL_EIO, "reading layer %d of the streamed spine: %s", layer,
                             strerror(errno ? errno : EIO));
    return 0;
}

int spine_stream_inplace(int fd, uint64_t file_off, uint8_t *pack, int n_layers, int first,
                         uint8_t *const *lo, uint8_t *const *hi, spine_stream **out,
                         shoal_err *err)
{
    spine_stream *s = calloc(1, sizeof *s);

    *out = NULL;
    if (!s || !(s->layers = calloc((size_t)n_layers, sizeof *s->layers))) {
        free(s);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    s->inplace = 1;
    s->n = n_layers;
    s->first = s->st.first_layer = first;
    s->bound = -1;
    s->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    s->rfd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int i = first; i < n_layers; i++) {
        stream_layer *l = &s->layers[i];
        uint64_t a = file_off + (uint64_t)(lo[i] - pack), b = file_off + (uint64_t)(hi[i] - pack);
        uint64_t a0 = a / 4096 * 4096, b1 = up(b, 4096);
        l->off = a0;
        l->len = b1 - a0;
        l->need = b - a0;
        l->place = pack + (a0 - file_off);
        l->drop0 = pack + (up(a, 4096) - file_off);
        l->drop1 = pack + (b / 4096 * 4096 - file_off);
        if (l->len > s->slot_cap)
            s->slot_cap = l->len;
    }
    s->st.file_bytes = 0;
    s->st.buffer_bytes = 2 * s->slot_cap;
    if (s->fd < 0) {
        spine_stream_free(s);
        return shoal_err_set(err, SHOAL_EIO, "streamed spine: %s", strerror(errno));
    }
    s->rfd = shoal_fd_open_uncached(s->fd);
    s->direct = s->rfd >= 0;
    if (!s->direct)
        s->rfd = s->fd;
    s->st.direct = s->direct;
    if (pthread_create(&s->th, NULL, reader_main, s) != 0) {
        spine_stream_free(s);
        return shoal_err_set(err, SHOAL_ENOMEM, "streamed spine: cannot start its reader");
    }
    s->th_up = 1;
    *out = s;
    return 0;
}

int spine_stream_keep(spine_stream *s, engine_mat *m, uint64_t file_off, const uint8_t *pack,
                      shoal_err *err)
{
    const uint8_t *w = m->q8.q ? (const uint8_t *)m->q8.q : m->q4.packed ? m->q4.packed
                       : (const uint8_t *)m->f32.w;
    const uint8_t *sc = m->q8.q ? (const uint8_t *)m->q8.scale : m->q4.packed ? m->q4.scale : NULL;
    size_t wb = m->q8.q ? m->rows * m->cols : m->q4.packed ? m->rows * m->cols / 2
                : m->rows * m->cols * 4;
    size_t sb = m->q8.q ? m->rows * 4 : m->q4.packed ? m->rows * (m->cols / 32) * 2 : 0;
    const uint8_t *lo = sc && sc < w ? sc : w, *hi = sc && sc + sb > w + wb ? sc + sb : w + wb;
    uint64_t a = file_off + (uint64_t)(lo - pack), a0 = a / 4096 * 4096;
    size_t len = up((size_t)(file_off + (uint64_t)(hi - pack) - a0), 4096), got = 0;
    void *buf = NULL, **nk;

    if (posix_memalign(&buf, 4096, len) != 0 ||
        !(nk = realloc(s->keeps, (s->nkeeps + 1) * sizeof *nk))) {
        free(buf);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    s->keeps = nk;
    s->keeps[s->nkeeps++] = buf;
    while (got < len) {
        ssize_t r = pread(s->rfd, (uint8_t *)buf + got, len - got, (off_t)(a0 + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    if (got < (size_t)(file_off + (uint64_t)(hi - pack) - a0))
        return shoal_err_set(err, SHOAL_EIO, "streamed spine: reading a router failed");
    /* the same bytes, now at buf + (their file offset - a0) */
    const uint8_t *nw = (const uint8_t *)buf + (file_off + (uint64_t)(w - pack) - a0);
    const uint8_t *ns = sc ? (const uint8_t *)buf + (file_off + (uint64_t)(sc - pack) - a0) : NULL;
    if (m->q8.q)
        m->q8 = (kernels_q8){ (const int8_t *)nw, (const float *)ns, m->rows, m->cols };
    else if (m->q4.packed)
        m->q4 = (kernels_q4){ nw, ns, m->rows, m->cols };
    else
        m->f32 = (kernels_f32){ (const float *)nw, m->rows, m->cols };
    return 0;
}

int spine_stream_region(const spine_stream *s, int layer, uint64_t *off, uint64_t *len)
{
    if (!s || !s->inplace || layer < s->first || layer >= s->n)
        return SHOAL_EINVAL;
    *off = s->layers[layer].off;
    *len = s->layers[layer].need;
    return 0;
}

void spine_stream_expect(spine_stream *s, int layer, const uint8_t xxh[16])
{
    if (!s || !s->inplace || layer < s->first || layer >= s->n)
        return;
    pthread_mutex_lock(&s->mu);
    while (s->busy)                       /* not while the reader checks it */
        pthread_cond_wait(&s->cv, &s->mu);
    if (!s->h_up && (s->hst = shoal_xxh3_new()) != NULL) {
        pthread_mutex_init(&s->hmu, NULL);
        pthread_cond_init(&s->hcv, NULL);
        if (pthread_create(&s->hth, NULL, hasher_main, s) == 0) {
            s->h_up = 1;
        } else {
            pthread_mutex_destroy(&s->hmu);
            pthread_cond_destroy(&s->hcv);
            shoal_xxh3_free(s->hst);
            s->hst = NULL;
        }
    }
    if (s->h_up) {                        /* no hasher (no memory, no thread): unchecked */
        memcpy(s->layers[layer].xxh, xxh, 16);
        s->layers[layer].checked = 1;
    }
    pthread_mutex_unlock(&s->mu);
}

void spine_stream_on_damaged(spine_stream *s, engine_stream_damaged_fn fn, void *ctx)
{
    if (!s)
        return;
    s->on_damaged = fn;
    s->damaged_ctx = ctx;
}

void spine_stream_stats(const spine_stream *s, engine_stream_stats *out)
{
    if (!s)
        return;
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    *out = s->st;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
}

void spine_stream_free(spine_stream *s)
{
    if (!s)
        return;
    if (s->th_up) {
        pthread_mutex_lock(&s->mu);
        s->quit = 1;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->th, NULL);
    }
    if (s->h_up) {
        pthread_mutex_lock(&s->hmu);
        s->h_quit = 1;
        pthread_cond_broadcast(&s->hcv);
        pthread_mutex_unlock(&s->hmu);
        pthread_join(s->hth, NULL);
        pthread_mutex_destroy(&s->hmu);
        pthread_cond_destroy(&s->hcv);
        shoal_xxh3_free(s->hst);
    }
    if (s->rfd >= 0 && s->rfd != s->fd)
        close(s->rfd);
    if (s->fd >= 0)
        close(s->fd);
    free(s->slot[0]);
    free(s->slot[1]);
    for (size_t i = 0; i < s->nkeeps; i++)
        free(s->keeps[i]);
    free(s->keeps);
    free(s->refs);
    free(s->layers);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
