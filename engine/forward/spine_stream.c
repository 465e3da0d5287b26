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

#include "common/platform.h"
#include "common/sys.h"
#include "engine/plan/plan.h"

#define ST_ALIGN ((size_t)2 << 20)

typedef struct stream_ref {
    engine_mat *dst;
    k3_fmt fmt;
    size_t rows, cols;
    uint64_t w_off, s_off;       /* in the layer's region */
} stream_ref;

typedef struct stream_layer {
    uint64_t off, len;           /* the region: file offset, bytes (4 KiB multiples) */
    size_t ref0, nref;
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
    l->len = s->pos - l->off;
    if (l->len > s->slot_cap)
        s->slot_cap = l->len;
    (void)fdatasync(s->fd);
    (void)posix_fadvise(s->fd, (off_t)l->off, (off_t)l->len, POSIX_FADV_DONTNEED);
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

/* Read layer's region into slot; 0 or an error code. */
static int region_read(spine_stream *s, int layer, int slot)
{
    const stream_layer *l = &s->layers[layer];
    size_t got = 0;

    while (got < l->len) {
        ssize_t r = pread(s->rfd, s->slot[slot] + got, l->len - got, (off_t)(l->off + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return SHOAL_EIO;
        got += (size_t)r;
    }
    if (!s->direct)
        (void)posix_fadvise(s->rfd, (off_t)l->off, (off_t)l->len, POSIX_FADV_DONTNEED);
    return 0;
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
            (void)madvise(b, bytes, MADV_HUGEPAGE);
        s->slot[i] = b;
    }
    s->rfd = shoal_fd_reopen(s->fd, O_RDONLY | O_DIRECT);
    s->direct = s->rfd >= 0;
    if (s->direct && region_read(s, s->first, 0) != 0) {   /* O_DIRECT opens but cannot read */
        close(s->rfd);
        s->direct = 0;
    }
    if (!s->direct)
        s->rfd = s->fd;
    else
        s->slot_layer[0] = s->first;
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

int spine_stream_ready(spine_stream *s, int layer, shoal_err *err)
{
    uint64_t t0;
    int slot, next, rc = 0;

    if (!s || layer < s->first || layer >= s->n)
        return 0;
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
    if (s->rfd >= 0 && s->rfd != s->fd)
        close(s->rfd);
    if (s->fd >= 0)
        close(s->fd);
    free(s->slot[0]);
    free(s->slot[1]);
    free(s->refs);
    free(s->layers);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
