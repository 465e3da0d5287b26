/* warm.c — background warm jobs that outlive their client and the daemon.
 *
 * Owns: jobs of WARM selections — planned first (plan.c: a selection that
 * cannot fit the budget is refused or, with FIT, trimmed; the plan is
 * kept with the job) — feeding their objects to the scheduler at warm
 * priority through a small window (so a job of 82,432 experts holds
 * WARM_WINDOW transfers, not 82,432), progress for JOB, and
 * persistence: each job is a small JSON file $SHOAL_HOME/jobs/<id>.json,
 * rewritten atomically on state changes and every WARM_SAVE_EVERY objects.
 * After a restart (or a crash) every job not finished is resumed: its
 * list is rebuilt and the objects already cached are skipped, so it costs
 * one lookup per object done before.  Opening the job's model and the top-N
 * selection (a sort of every expert's counters) run on workers (work.c).
 *
 * Does not own transfers (sched.c) or the job's counters in the cache.
 */
#include "daemon/daemon_int.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sys.h"
#include "fetcher/fetch.h"

#include <dirent.h>
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WARM_WINDOW      16      /* transfers one job keeps asked for */
#define WARM_SAVE_EVERY  64      /* objects between progress saves */
#define WARM_RETRY_SECS  10      /* a job whose model cannot be opened */
#define WARM_MAX_LIST    SHOAL_PROTO_MAX_KEYS

enum { JOB_QUEUED = 0, JOB_RUNNING = 1, JOB_DONE = 2, JOB_FAILED = 3, JOB_CANCELLED = 4 };

struct warm_job {
    warm_job *next;
    struct warm *W;
    uint64_t id;
    int      state;
    char     spec[SHOAL_PROTO_MAX_STR + 1];
    int      selection;
    int      fit;                  /* SHOAL_WARM_F_FIT: trimmed to the budget */
    uint32_t a, b;
    int32_t *pairs;                /* selection 4 (experts) or 3 (resolved) */
    size_t   npairs;
    model   *m;                    /* NULL until (re)opened */
    int      opening;              /* its model is being opened on a worker */
    objref  *items;
    size_t   nitems, cursor;
    waiter   w[WARM_WINDOW];
    uint8_t  busy[WARM_WINDOW];
    unsigned inflight;
    uint64_t bytes_done, bytes_total;
    uint32_t objs_done, objs_total, errors, since_save;
    char     last_error[SHOAL_ERR_MSG_MAX];
    int      last_code;            /* the last error's code (common/err.h) */
    int64_t  created_ms, finished_ms;
    /* the plan made when it (re)started (plan.c) */
    cache_plan plan;
    uint64_t left_objects;         /* spine matrices left out: their pack is cached */
    uint64_t peer_objects, peer_bytes;   /* read in place from the HF cache: not fetched */
};

struct warm {
    shoald   *d;
    warm_job *jobs;
    unsigned  njobs;
    uint64_t  next_id;
    char      dir[SHOAL_PATH_MAX];
    struct event *ev_retry;
};

static void job_pump(struct warm *W, warm_job *j);
static void job_begin(struct warm *W, warm_job *j);
static void job_save(struct warm *W, warm_job *j);

/* What the job's plan said (STATS jobs[].plan, the job file). */
static shoal_json *job_plan_json(const warm_job *j)
{
    shoal_json *o = shoal_json_object();
    if (!o)
        return NULL;
    shoal_json_set_int(o, "cached_objects", (int64_t)j->plan.cached_objects);
    shoal_json_set_int(o, "fetch_objects", (int64_t)j->plan.fetch_objects);
    shoal_json_set_int(o, "fetch_bytes", (int64_t)j->plan.fetch_bytes);
    shoal_json_set_int(o, "not_fitting_objects", (int64_t)j->plan.over_objects);
    shoal_json_set_int(o, "not_fitting_bytes", (int64_t)j->plan.over_bytes);
    shoal_json_set_int(o, "evict_bytes", (int64_t)j->plan.evict_bytes);
    shoal_json_set_int(o, "left_out_objects", (int64_t)j->left_objects);
    shoal_json_set_int(o, "hfcache_objects", (int64_t)j->peer_objects);
    shoal_json_set_int(o, "hfcache_bytes", (int64_t)j->peer_bytes);
    return o;
}

/* ---- persistence ------------------------------------------------------------- */

/* A job file written (tmp, fsync, rename, fsync of jobs/: each sync can
 * wait behind another writer's GBs) or removed off the loop, on the quick
 * lane: one thread, first in first out, so the file ends as asked last.
 * Before the workers start and once they are gone, here. */
typedef struct file_job {
    work wk;                       /* first: work.c casts */
    char path[SHOAL_PATH_MAX];
    shoal_buf data;
    int  remove;
} file_job;

static void file_run(work *w)
{
    file_job *f = (file_job *)w;
    shoal_err err = { 0 };
    if (f->remove) {
        if (unlink(f->path) != 0 && errno != ENOENT)
            LOG_WARN("warm", "removing %s: %s", f->path, strerror(errno));
    } else if (shoal_write_file_atomic(f->path, f->data.data, f->data.len, &err) != 0) {
        LOG_WARN("warm", "saving %s: %s", f->path, err.msg);
    }
}

static void file_done(work *w)
{
    file_job *f = (file_job *)w;
    shoal_buf_free(&f->data);
    free(f);
}

/* Write `data` (taken; NULL: remove the file) to jobs/<name>. */
static void file_post(struct warm *W, const char *name, shoal_buf *data)
{
    file_job *f = calloc(1, sizeof *f);
    if (!f || shoal_path_join(f->path, sizeof f->path, W->dir, name) != 0) {
        LOG_WARN("warm", "%s: %s", name, f ? "path too long" : "out of memory");
        free(f);
        if (data)
            shoal_buf_free(data);
        return;
    }
    f->remove = data == NULL;
    if (data)
        f->data = *data;
    else
        shoal_buf_init(&f->data, 0);
    f->wk.run = file_run;
    f->wk.done = file_done;
    if (!W->d->workers || W->d->stopping) {
        file_run(&f->wk);
        file_done(&f->wk);
        return;
    }
    work_post_quick(W->d, &f->wk);
}

static void job_save(struct warm *W, warm_job *j)
{
    char name[64];
    shoal_json *o = shoal_json_object(), *pairs = shoal_json_array();
    shoal_buf out;

    if (!o || !pairs)
        goto done;
    shoal_json_set_int(o, "id", (int64_t)j->id);
    shoal_json_set_str(o, "model", j->spec);
    shoal_json_set_int(o, "selection", j->selection);
    shoal_json_set_int(o, "fit", j->fit);
    shoal_json_set_take(o, "plan", job_plan_json(j));
    shoal_json_set_int(o, "a", j->a);
    shoal_json_set_int(o, "b", j->b);
    shoal_json_set_int(o, "state", j->state);
    shoal_json_set_int(o, "objects_done", j->objs_done);
    shoal_json_set_int(o, "objects_total", j->objs_total);
    shoal_json_set_int(o, "bytes_done", (int64_t)j->bytes_done);
    shoal_json_set_int(o, "bytes_total", (int64_t)j->bytes_total);
    shoal_json_set_int(o, "errors", j->errors);
    shoal_json_set_str(o, "last_error", j->last_error);
    shoal_json_set_int(o, "last_code", j->last_code);
    shoal_json_set_int(o, "created_ms", j->created_ms);
    shoal_json_set_int(o, "finished_ms", j->finished_ms);
    for (size_t i = 0; j->selection == 4 && i < 2 * j->npairs; i++)
        shoal_json_append_take(pairs, shoal_json_new_int(j->pairs[i]));
    shoal_json_set_take(o, "pairs", pairs);
    pairs = NULL;
    shoal_buf_init(&out, 0);
    snprintf(name, sizeof name, "%llu.json", (unsigned long long)j->id);
    if (shoal_json_dump(o, 0, &out) == 0)
        file_post(W, name, &out);   /* takes out */
    else
        shoal_buf_free(&out);
done:
    shoal_json_free(pairs);
    shoal_json_free(o);
    j->since_save = 0;
}

static void job_free(struct warm *W, warm_job *j)
{
    for (unsigned i = 0; i < WARM_WINDOW; i++)
        if (j->busy[i])
            sched_detach(W->d->sched, &j->w[i]);
    if (j->m)
        model_release(W->d, j->m);
    free(j->items);
    free(j->pairs);
    free(j);
}

/* ---- the object list ------------------------------------------------------------ */

/* Bytes the other unfinished jobs still fetch: planned room they hold. */
static uint64_t held_back(const struct warm *W, const warm_job *self)
{
    uint64_t n = 0;
    for (const warm_job *j = W->jobs; j; j = j->next)
        if (j != self && j->state < JOB_DONE && j->bytes_total > j->bytes_done)
            n += j->bytes_total - j->bytes_done;
    return n;
}

/* Plan the job's selection and take its objects.  SHOAL_ENOSPC, saying
 * what to do, when it cannot fit (and FIT does not allow trimming it). */
static int job_plan(struct warm *W, warm_job *j, shoal_err *err)
{
    warm_sel s;
    int rc = plan_select(W->d, j->m, j->selection, j->a, j->b, j->pairs, j->npairs, j->fit, 1,
                         held_back(W, j), &s, err);
    if (rc)
        return rc;
    if (s.refused) {
        rc = shoal_err_set(err, SHOAL_ENOSPC, "%s: %s", j->spec, s.why);
        plan_free(&s);
        return rc;
    }
    free(j->items);
    j->items = s.items;
    j->nitems = s.n;
    if (j->selection == 3) {       /* the top N as ranked now */
        free(j->pairs);
        j->pairs = s.pairs;
        j->npairs = s.npairs;
        s.pairs = NULL;
    }
    j->plan = s.plan;
    j->left_objects = s.left_objects;
    j->peer_objects = s.peer_objects;
    j->peer_bytes = s.peer_bytes;
    j->bytes_total = 0;
    for (size_t i = 0; i < j->nitems; i++)
        j->bytes_total += j->items[i].key.length;
    j->objs_total = (uint32_t)j->nitems;
    j->cursor = 0;
    j->objs_done = 0;
    j->bytes_done = 0;
    j->errors = 0;
    s.items = NULL;
    plan_free(&s);
    return 0;
}

/* ---- running ------------------------------------------------------------------------- */

static void job_finish(struct warm *W, warm_job *j)
{
    /* Done means every object asked for is cached; any error is a failed
     * job (its last error and code say why), whatever else it cached. */
    j->state = j->errors ? JOB_FAILED : JOB_DONE;
    j->finished_ms = shoal_wall_ms();
    LOG_INFO("warm", "job %llu %s: %u of %u objects, %llu bytes, %u errors",
             (unsigned long long)j->id, j->state == JOB_DONE ? "done" : "failed", j->objs_done,
             j->objs_total, (unsigned long long)j->bytes_done, j->errors);
    job_save(W, j);
    if (j->m) {
        model_release(W->d, j->m);
        j->m = NULL;
    }
    free(j->items);
    j->items = NULL;
}

static void job_pump(struct warm *W, warm_job *j)
{
    shoald *d = W->d;
    while (j->state == JOB_RUNNING && j->inflight < WARM_WINDOW && j->cursor < j->nitems) {
        const objref *o = &j->items[j->cursor++];
        shoal_err err = { 0 };
        cache_obj obj;
        unsigned s = 0;

        if (!sched_find(d->sched, &o->key) && cache_lookup(d->cache, &o->key, NULL, &obj, NULL) == 0) {
            close(obj.fd);
            j->objs_done++;
            j->bytes_done += o->key.length;
            continue;
        }
        if (peer_has(j->m, o)) {   /* read in place from the HF cache: nothing to copy */
            j->objs_done++;
            j->bytes_done += o->key.length;
            continue;
        }
        while (j->busy[s])
            s++;
        memset(&j->w[s], 0, sizeof j->w[s]);
        j->w[s].job = j;
        j->w[s].prio = PRIO_WARM;
        j->busy[s] = 1;
        j->inflight++;
        if (sched_attach(d->sched, j->m, o, &j->w[s], &err) != 0) {
            j->busy[s] = 0;
            j->inflight--;
            j->errors++;
            j->last_code = err.code ? err.code : SHOAL_EINTERNAL;
            snprintf(j->last_error, sizeof j->last_error, "%s", err.msg);
        }
    }
    if (j->state == JOB_RUNNING && j->inflight == 0 && j->cursor >= j->nitems)
        job_finish(W, j);
    else if (j->since_save >= WARM_SAVE_EVERY)
        job_save(W, j);
}

void warm_waiter_done(warm_job *j, waiter *w, int rc, const char *msg, uint64_t bytes)
{
    unsigned s = (unsigned)(w - j->w);
    j->busy[s] = 0;
    j->inflight--;
    j->since_save++;
    if (rc == 0) {
        j->objs_done++;
        j->bytes_done += bytes;
    } else {
        j->errors++;
        j->last_code = rc;
        snprintf(j->last_error, sizeof j->last_error, "%s", msg ? msg : shoal_strerror(rc));
    }
    job_pump(j->W, j);
}

static void job_begin(struct warm *W, warm_job *j);

static void job_retry_later(struct warm *W, warm_job *j, const shoal_err *err)
{
    struct timeval tv = { WARM_RETRY_SECS, 0 };
    snprintf(j->last_error, sizeof j->last_error, "%s", err->msg);
    j->last_code = err->code;
    LOG_WARN("warm", "job %llu: cannot open %s (retrying in %d s): %s",
             (unsigned long long)j->id, j->spec, WARM_RETRY_SECS, err->msg);
    event_add(W->ev_retry, &tv);
}

/* The job's model, opened on a worker (model.c). */
static void job_model_ready(shoald *d, void *ctx, model *m, const shoal_err *err)
{
    warm_job *j = ctx;
    j->opening = 0;
    if (d->stopping) {
        model_release(d, m);
        return;
    }
    if (!m) {
        job_retry_later(j->W, j, err);
        return;
    }
    j->m = m;
    job_begin(j->W, j);
}

/* Open the job's model and build its list; on failure retry later. */
static void job_begin(struct warm *W, warm_job *j)
{
    shoal_err err = { 0 };
    if (!j->m) {
        int rc;
        if (j->opening)
            return;
        rc = model_open(W->d, j->spec, job_model_ready, j, NULL, &j->m, &err);
        if (rc == 1) {
            j->opening = 1;   /* job_model_ready goes on */
            return;
        }
        if (rc < 0) {
            job_retry_later(W, j, &err);
            return;
        }
    }
    if (job_plan(W, j, &err) != 0) {
        /* e.g. the budget shrank since it was planned: say why it stopped */
        j->errors++;
        snprintf(j->last_error, sizeof j->last_error, "%s", err.msg);
        LOG_WARN("warm", "job %llu not resumed: %s", (unsigned long long)j->id, err.msg);
        j->state = JOB_FAILED;
        j->finished_ms = shoal_wall_ms();
        job_save(W, j);
        model_release(W->d, j->m);
        j->m = NULL;
        return;
    }
    j->state = JOB_RUNNING;
    job_save(W, j);
    job_pump(W, j);
}

static void warm_on_retry(evutil_socket_t fd, short what, void *arg)
{
    struct warm *W = arg;
    (void)fd;
    (void)what;
    for (warm_job *j = W->jobs; j; j = j->next)
        if (j->state == JOB_QUEUED)
            job_begin(W, j);
}

static warm_job *job_alloc(struct warm *W, uint64_t id, const char *spec)
{
    warm_job *j;
    if (W->njobs >= DAEMON_JOBS_MAX) {
        /* Forget the oldest finished job (the smallest id: the files load in
         * any order), its file too, so jobs/ holds what is remembered. */
        warm_job **pp, **old = NULL;
        char name[32];
        for (pp = &W->jobs; *pp; pp = &(*pp)->next)
            if ((*pp)->state >= JOB_DONE && (!old || (*pp)->id < (*old)->id))
                old = pp;
        if (!old)
            return NULL;
        j = *old;
        *old = j->next;
        W->njobs--;
        snprintf(name, sizeof name, "%llu.json", (unsigned long long)j->id);
        file_post(W, name, NULL);   /* after its queued saves */
        job_free(W, j);
    }
    j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->W = W;
    j->id = id;
    snprintf(j->spec, sizeof j->spec, "%s", spec);
    j->created_ms = shoal_wall_ms();
    j->next = W->jobs;
    W->jobs = j;
    W->njobs++;
    if (id >= W->next_id)
        W->next_id = id + 1;
    return j;
}

/* Refuse WARM list keys that are not experts (selection 4). */
static int keys_check(int selection, const shoal_key *keys, size_t nkeys, shoal_err *err)
{
    for (size_t i = 0; selection == 4 && i < nkeys; i++)
        if (keys[i].kind != SHOAL_KEY_EXPERT)
            return shoal_err_set(err, SHOAL_EUNSUPPORTED, "WARM lists name experts only (key %zu "
                                 "does not): warm tensors and files with selection 1", i);
    return 0;
}

/* Selection 4's pairs from its keys (caller frees). */
static int32_t *keys_pairs(const shoal_key *keys, size_t nkeys)
{
    int32_t *p = calloc(2 * nkeys + 1, sizeof *p);
    for (size_t i = 0; p && i < nkeys; i++) {
        p[2 * i] = keys[i].layer;
        p[2 * i + 1] = (int32_t)keys[i].expert;
    }
    return p;
}

int warm_plan(struct warm *W, model *m, int selection, int flags, uint32_t a, uint32_t b,
              const shoal_key *keys, size_t nkeys, shoal_buf *out, shoal_err *err)
{
    int32_t *pairs = NULL;
    shoal_json *j;
    warm_sel s;
    int rc = keys_check(selection, keys, nkeys, err);

    if (rc)
        return rc;
    if (selection == 4 && !(pairs = keys_pairs(keys, nkeys)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    rc = plan_select(W->d, m, selection, a, b, pairs, nkeys, (flags & SHOAL_WARM_F_FIT) != 0, 0,
                     held_back(W, NULL), &s, err);
    free(pairs);
    if (rc)
        return rc;
    j = plan_json(&s, m, selection, a, b, (flags & SHOAL_WARM_F_FIT) != 0);
    if (!j || shoal_json_dump(j, SHOAL_JSON_COMPACT, out) != 0)
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    shoal_json_free(j);
    plan_free(&s);
    return rc;
}

int warm_start(struct warm *W, model *m, int selection, int flags, uint32_t a, uint32_t b,
               const shoal_key *keys, size_t nkeys, uint64_t *job, shoal_err *err)
{
    warm_job *j;
    int rc;

    if ((rc = keys_check(selection, keys, nkeys, err)) != 0)
        return rc;
    j = job_alloc(W, W->next_id, m->spec);
    if (!j)
        return shoal_err_set(err, SHOAL_EBUSY, "%d warm jobs are running: wait for one to end",
                             DAEMON_JOBS_MAX);
    j->selection = selection;
    j->fit = (flags & SHOAL_WARM_F_FIT) != 0;
    j->a = a;
    j->b = b;
    if (selection == 4) {
        if (!(j->pairs = keys_pairs(keys, nkeys)))
            rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        j->npairs = nkeys;
    }
    j->m = m;
    m->refs++;
    if (rc == 0)
        rc = job_plan(W, j, err);
    if (rc) {
        /* planned and refused: no job (its id is given again) */
        W->jobs = j->next;
        W->njobs--;
        if (W->next_id == j->id + 1)
            W->next_id = j->id;
        job_free(W, j);
        return rc;
    }
    *job = j->id;
    LOG_INFO("warm", "job %llu: %s selection %d (%u, %u)%s: %llu objects cached, %llu to fetch "
             "(%llu bytes), %llu left out as not fitting, ~%llu bytes to evict",
             (unsigned long long)j->id, m->spec, selection, a, b, j->fit ? " fit" : "",
             (unsigned long long)j->plan.cached_objects, (unsigned long long)j->plan.fetch_objects,
             (unsigned long long)j->plan.fetch_bytes, (unsigned long long)j->plan.over_objects,
             (unsigned long long)j->plan.evict_bytes);
    j->state = JOB_RUNNING;
    job_save(W, j);   /* on the quick lane too: a crash within its ms loses the new job */
    job_pump(W, j);
    return 0;
}

int warm_status(struct warm *W, uint64_t id, uint8_t *state, uint64_t *bytes_done,
                uint64_t *bytes_total, uint32_t *objs_done, uint32_t *objs_total,
                uint32_t *errors, int *last_code, char *last_error, size_t cap)
{
    for (warm_job *j = W->jobs; j; j = j->next) {
        if (j->id != id)
            continue;
        *state = (uint8_t)j->state;
        *bytes_done = j->bytes_done;
        *bytes_total = j->bytes_total;
        *objs_done = j->objs_done;
        *objs_total = j->objs_total;
        *errors = j->errors;
        *last_code = j->last_code;
        snprintf(last_error, cap, "%s", j->last_error);
        return 0;
    }
    return SHOAL_ENOTFOUND;
}

void warm_save_all(struct warm *W)
{
    for (warm_job *j = W->jobs; j; j = j->next)
        if (j->state < JOB_DONE)
            job_save(W, j);
}

/* ---- loading ------------------------------------------------------------------------- */

static void job_load(struct warm *W, const char *path)
{
    shoal_err err = { 0 };
    shoal_json *o = shoal_json_load_file(path, 1u << 20, &err);
    const char *spec = NULL, *last = NULL;
    int64_t id = 0, v = 0;
    shoal_json *pairs;
    warm_job *j;

    if (!o || shoal_json_int(o, "id", &id, &err) || shoal_json_str(o, "model", &spec, &err)) {
        LOG_WARN("warm", "ignoring job file %s: %s", path, err.msg);
        shoal_json_free(o);
        return;
    }
    j = job_alloc(W, (uint64_t)id, spec);
    if (!j) {
        shoal_json_free(o);
        return;
    }
#define GETI(key, field) do { if (shoal_json_int(o, key, &v, NULL) == 0) field = v; } while (0)
    GETI("selection", j->selection);
    GETI("fit", j->fit);
    GETI("a", j->a);
    GETI("b", j->b);
    GETI("state", j->state);
    GETI("objects_done", j->objs_done);
    GETI("objects_total", j->objs_total);
    GETI("bytes_done", j->bytes_done);
    GETI("bytes_total", j->bytes_total);
    GETI("errors", j->errors);
    GETI("last_code", j->last_code);
    GETI("created_ms", j->created_ms);
    GETI("finished_ms", j->finished_ms);
#undef GETI
    if (shoal_json_str(o, "last_error", &last, NULL) == 0)
        snprintf(j->last_error, sizeof j->last_error, "%s", last);
    pairs = shoal_json_get(o, "pairs");
    if (j->selection == 4 && pairs) {
        size_t n = shoal_json_array_size(pairs) / 2;
        j->pairs = calloc(2 * n + 1, sizeof *j->pairs);
        for (size_t i = 0; j->pairs && i < 2 * n; i++)
            j->pairs[i] = (int32_t)shoal_json_int_value(shoal_json_array_at(pairs, i));
        j->npairs = j->pairs ? n : 0;
    }
    if (j->selection < 0 || j->selection > 4)
        j->state = JOB_FAILED;
    if (j->state < JOB_DONE)
        j->state = JOB_QUEUED;   /* resumed by warm_resume_all */
    shoal_json_free(o);
}

int warm_new(shoald *d, struct warm **out, shoal_err *err)
{
    struct warm *W = calloc(1, sizeof *W);
    DIR *dir;
    struct dirent *e;
    int rc;

    *out = NULL;
    if (!W)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    W->d = d;
    W->next_id = 1;
    if (shoal_path_join(W->dir, sizeof W->dir, d->cfg.home, "jobs") != 0) {
        free(W);
        return shoal_err_set(err, SHOAL_ETOOBIG, "home path too long");
    }
    rc = shoal_mkdir_p(W->dir, 0700, err);
    W->ev_retry = rc ? NULL : event_new(d->base, -1, 0, warm_on_retry, W);
    if (rc || !W->ev_retry) {
        free(W);
        return rc ? rc : shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    dir = opendir(W->dir);
    while (dir && (e = readdir(dir)) != NULL) {
        char path[SHOAL_PATH_MAX];
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".json") != 0)
            continue;
        if (shoal_path_join(path, sizeof path, W->dir, e->d_name) == 0)
            job_load(W, path);
    }
    if (dir)
        closedir(dir);
    *out = W;
    return 0;
}

void warm_resume_all(struct warm *W)
{
    for (warm_job *j = W->jobs; j; j = j->next) {
        if (j->state == JOB_QUEUED) {
            LOG_INFO("warm", "resuming job %llu (%s): %u of %u objects were done",
                     (unsigned long long)j->id, j->spec, j->objs_done, j->objs_total);
            job_begin(W, j);
        }
    }
}

void warm_free(struct warm *W)
{
    if (!W)
        return;
    while (W->jobs) {
        warm_job *j = W->jobs;
        W->jobs = j->next;
        job_free(W, j);
    }
    if (W->ev_retry)
        event_free(W->ev_retry);
    free(W);
}

unsigned warm_running(const struct warm *W)
{
    unsigned n = 0;
    for (const warm_job *j = W->jobs; j; j = j->next)
        n += j->state < JOB_DONE;
    return n;
}

void warm_stats_json(struct warm *W, void *json_array)
{
    shoal_json *arr = json_array;
    for (warm_job *j = W->jobs; j; j = j->next) {
        shoal_json *o = shoal_json_object();
        static const char *const names[] = { "queued", "running", "done", "failed", "cancelled" };
        if (!o)
            return;
        shoal_json_set_int(o, "id", (int64_t)j->id);
        shoal_json_set_str(o, "model", j->spec);
        shoal_json_set_str(o, "state", names[j->state >= 0 && j->state <= 4 ? j->state : 3]);
        shoal_json_set_int(o, "objects_done", j->objs_done);
        shoal_json_set_int(o, "objects_total", j->objs_total);
        shoal_json_set_int(o, "bytes_done", (int64_t)j->bytes_done);
        shoal_json_set_int(o, "bytes_total", (int64_t)j->bytes_total);
        shoal_json_set_int(o, "errors", j->errors);
        shoal_json_set_str(o, "last_error", j->last_error);
        shoal_json_set_take(o, "fit", shoal_json_new_bool(j->fit));
        shoal_json_set_take(o, "plan", job_plan_json(j));
        shoal_json_append_take(arr, o);
    }
}
