/* keep.c — storing what a manifest build kept: the encoded manifest and
 * each shard's header (fetch.h, fetch_keep), so the next OPEN loads the
 * manifest from the cache and `verify --deep` can check whole shards.
 *
 * Owns: the three steps of storing objects the daemon holds in memory
 * without the loop touching their bytes: (1) on the loop, begin a writer
 * per item (the budget and the table are the loop's; an item cached
 * already is only recorded); (2) on a worker, allocate, write and fsync
 * each file (cache.h rule 4: only the writers' own files); (3) on the
 * loop, commit each and record it (pin, the manifest's file record).  A
 * failure costs one item: it is logged and the next build reads it again.
 * Does not own building (fetcher/model.c) nor the model (model.c).
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/sys.h"
#include "fetcher/fetch.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct keep_job {
    work          w;               /* first */
    fetch_keep   *k;
    size_t        n;
    cache_writer **wr;             /* per item; NULL: nothing to write */
    int          *rc;              /* per item, from the worker */
    char        (*msg)[SHOAL_ERR_MSG_MAX];
} keep_job;

static void keep_free(keep_job *j)
{
    for (size_t i = 0; i < j->n; i++)
        cache_write_abort(j->wr[i]);   /* accepts NULL */
    fetch_keep_free(j->k);
    free(j->wr);
    free(j->rc);
    free(j->msg);
    free(j);
}

/* Worker: write every item's bytes into its writer's file and sync it. */
static void keep_run(work *w)
{
    keep_job *j = (keep_job *)w;
    for (size_t i = 0; i < j->n; i++) {
        const fetch_keep_item *it = fetch_keep_at(j->k, i);
        shoal_err e = { 0 };
        int fd = -1, rc;
        if (!j->wr[i])
            continue;
        if (atomic_load(&w->stop)) {
            j->rc[i] = SHOAL_ECANCELED;
            continue;
        }
        rc = cache_writer_allocate(j->wr[i], &e);
        if (rc == 0)
            rc = cache_writer_open_fd(j->wr[i], O_WRONLY, &fd, &e);
        if (rc == 0 && shoal_write_all(fd, it->data, (size_t)it->key.length) != 0)
            rc = shoal_err_set(&e, SHOAL_EIO, "writing %s: short write", it->names.file);
        if (fd >= 0)
            close(fd);
        if (rc == 0)
            rc = cache_writer_adopt(j->wr[i], NULL, NULL, &e);
        j->rc[i] = rc;
        if (rc)
            memcpy(j->msg[i], e.msg, sizeof j->msg[i]);
        work_progress_set(&w->prog, "store", i + 1, j->n);
    }
}

/* Loop: commit what was written, record everything that is cached. */
static void keep_done(work *w)
{
    keep_job *j = (keep_job *)w;
    shoald *d = w->d;
    size_t stored = 0;

    for (size_t i = 0; i < j->n && !d->stopping; i++) {
        const fetch_keep_item *it = fetch_keep_at(j->k, i);
        shoal_err e = { 0 };
        int rc = j->rc[i];
        if (j->wr[i]) {
            cache_writer *wr = j->wr[i];
            j->wr[i] = NULL;
            if (rc) {
                cache_write_abort(wr);
                snprintf(e.msg, sizeof e.msg, "%s", j->msg[i]);
            } else {
                rc = cache_write_commit(wr, NULL, &e);
                stored += rc == 0;
            }
        } else if (rc) {
            snprintf(e.msg, sizeof e.msg, "%s", j->msg[i]);
        }
        if (rc == 0)
            rc = fetch_keep_done(j->k, i, d->cache, &e);
        if (rc)
            LOG_WARN("keep", "%s [%llu, +%llu): %s", it->names.file,
                     (unsigned long long)it->key.offset, (unsigned long long)it->key.length,
                     e.msg);
    }
    if (stored)
        LOG_INFO("keep", "stored %zu objects a manifest build read (manifest, shard headers)",
                 stored);
    keep_free(j);
}

void keep_store(shoald *d, struct fetch_keep *k)
{
    keep_job *j = calloc(1, sizeof *j);
    size_t n = fetch_keep_count(k), writes = 0;

    if (j) {
        j->k = k;
        j->n = n;
        j->wr = calloc(n ? n : 1, sizeof *j->wr);
        j->rc = calloc(n ? n : 1, sizeof *j->rc);
        j->msg = calloc(n ? n : 1, sizeof *j->msg);
    }
    if (!j || !j->wr || !j->rc || !j->msg) {
        LOG_WARN("keep", "out of memory: the manifest is built again next time");
        if (j) {
            j->n = 0;
            keep_free(j);
        } else {
            fetch_keep_free(k);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const fetch_keep_item *it = fetch_keep_at(k, i);
        shoal_err e = { 0 };
        int rc = cache_write_begin_flags(d->cache, &it->key, it->kind, &it->names,
                                         CACHE_BEGIN_NO_ALLOC, &j->wr[i], &e);
        if (rc == SHOAL_EEXIST) {
            j->rc[i] = 0;   /* cached already: only recorded */
        } else if (rc == 0 && cache_writer_offset(j->wr[i]) != 0) {
            /* a partial of the same range (a warm transfer paused): leave it */
            cache_write_pause(j->wr[i], NULL);
            j->wr[i] = NULL;
            j->rc[i] = SHOAL_EBUSY;
            snprintf(j->msg[i], sizeof j->msg[i], "a partial write exists");
        } else if (rc) {
            j->wr[i] = NULL;
            j->rc[i] = rc;
            snprintf(j->msg[i], sizeof j->msg[i], "%s", e.msg);
        } else {
            writes++;
        }
    }
    j->w.run = keep_run;
    j->w.done = keep_done;
    LOG_DEBUG("keep", "storing %zu of %zu objects on a worker", writes, n);
    work_post(d, &j->w);
}
