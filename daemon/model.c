/* model.c — the daemon's table of open models.
 *
 * Owns: one entry per distinct model spec (a snapshot directory or
 * hf://org/name[@rev]) shared by every connection and warm job that holds
 * it (reference counted; handle = slot + 1), its manifest and that
 * manifest's encoding (what OPEN hands out), opening a model, and turning
 * a protocol key (expert, tensor, file) into the object it names.  Does
 * not own loading a manifest from upstream (upstream.c) nor what is cached
 * (cache/).
 *
 * Opening runs on a worker (work.c): the pin, the manifest from the cache
 * or built from the index and 96 shard headers read in parallel (K3: ~290
 * requests, seconds against a real Hub), and its encoding, all on a side
 * handle of the cache.  Meanwhile the loop answers everyone else, and an
 * OPEN of the same spec joins the one running (the `openings` list); when
 * the job ends the loop installs the model in one step and answers every
 * waiter, then stores what the build kept (keep.c).  A waiter that left
 * meanwhile just releases its reference: the model lingers for the next
 * one.
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/sys.h"
#include "fetcher/fetch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct owaiter {
    struct owaiter *next;
    model_ready_fn  fn;
    void           *ctx;
} owaiter;

struct opening {
    work      w;                   /* first: the job */
    opening  *next;
    char      spec[SHOAL_PROTO_MAX_STR + 1];
    owaiter  *waiters;
    /* what run() produced */
    int       rc;
    shoal_err err;
    struct upstream_model *um;
    manifest *man;
    int       from_cache;
    struct fetch_keep *keep;
    shoal_buf encoded;
};

model *model_by_handle(shoald *d, uint32_t handle)
{
    if (handle == 0 || handle > DAEMON_MODELS_MAX)
        return NULL;
    return d->models[handle - 1];
}

static void model_free(model *m)
{
    if (!m)
        return;
    upstream_model_free(m);
    manifest_free(m->man);
    shoal_buf_free(&m->encoded);
    free(m);
}

/* A model nobody holds stays loaded for MODEL_LINGER_MS, so an engine
 * that reconnects (or STATS) does not resolve it again; after that a
 * moving revision ("main") is resolved afresh. */
#define MODEL_LINGER_MS (10 * 60 * 1000)

/* The open model for spec (dropping the idle ones past their linger). */
static model *model_find(shoald *d, const char *spec)
{
    int64_t now = shoal_wall_ms();
    for (int i = 0; i < DAEMON_MODELS_MAX; i++) {
        model *m = d->models[i];
        if (m && m->refs == 0 && now - m->idle_ms > MODEL_LINGER_MS) {
            d->models[i] = NULL;
            model_free(m);
            continue;
        }
        if (m && strcmp(m->spec, spec) == 0)
            return m;
    }
    return NULL;
}

/* A free slot, dropping the longest idle model when the table is full. */
static int model_slot(shoald *d, shoal_err *err)
{
    int idle = -1;
    for (int i = 0; i < DAEMON_MODELS_MAX; i++) {
        model *m = d->models[i];
        if (!m)
            return i;
        if (m->refs == 0 && (idle < 0 || m->idle_ms < d->models[idle]->idle_ms))
            idle = i;
    }
    if (idle < 0)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%d models are open: release some first",
                             DAEMON_MODELS_MAX);
    model_free(d->models[idle]);
    d->models[idle] = NULL;
    return idle;
}

/* Worker: everything slow about an open, on a side handle of the cache. */
static void open_run(work *w)
{
    opening *op = (opening *)w;
    shoald *d = w->d;
    cache *side = NULL;

    work_progress_set(&w->prog, "resolve", 0, 0);
    op->rc = work_side_open(d, &side, &op->err);
    if (op->rc == 0)
        op->rc = upstream_model_prepare(&d->cfg, op->spec, side, &w->stop, &w->prog, &op->um,
                                        &op->man, &op->from_cache, &op->keep, &op->err);
    if (op->rc == 0) {
        work_progress_set(&w->prog, "encode", 0, 0);
        op->rc = manifest_encode(op->man, &op->encoded, &op->err);
    }
    cache_close(side);
}

static void opening_free(opening *op)
{
    upstream_model_discard(op->um);
    manifest_free(op->man);
    fetch_keep_free(op->keep);
    shoal_buf_free(&op->encoded);
    while (op->waiters) {
        owaiter *x = op->waiters;
        op->waiters = x->next;
        free(x);
    }
    free(op);
}

/* Loop: the model built from op's results, installed in slot. */
static model *open_install(shoald *d, opening *op, shoal_err *err)
{
    model *m;
    int slot = model_slot(d, err), rc;

    if (slot < 0)
        return NULL;
    m = calloc(1, sizeof *m);
    if (!m) {
        shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(m->spec, sizeof m->spec, "%s", op->spec);
    m->handle = (uint32_t)slot + 1;
    m->man = op->man;
    op->man = NULL;
    m->encoded = op->encoded;
    shoal_buf_init(&op->encoded, 0);
    rc = upstream_model_attach(d, m, op->um, err);
    op->um = NULL;
    if (rc == 0)
        rc = cache_model_put(d->cache, m->man->endpoint, m->man->repo, m->man->revision,
                             m->man->commit, &m->model_id, err);
    if (rc) {
        model_free(m);
        return NULL;
    }
    d->models[slot] = m;
    m->idle_ms = shoal_wall_ms();
    LOG_INFO("model", "opened %s: commit %s, %zu files, %zu tensors, %zu experts (handle %u%s)",
             m->spec, m->man->commit, m->man->nfiles, m->man->ntensors, m->man->nexperts,
             m->handle, op->from_cache ? ", manifest from the cache" : "");
    return m;
}

static void open_done(work *w)
{
    opening *op = (opening *)w;
    shoald *d = w->d;
    model *m = NULL;

    for (opening **pp = &d->openings; *pp; pp = &(*pp)->next) {
        if (*pp == op) {
            *pp = op->next;
            break;
        }
    }
    if (op->rc == 0 && d->stopping)
        op->rc = shoal_err_set(&op->err, SHOAL_ECANCELED, "shoald is stopping");
    if (op->rc == 0 && !(m = open_install(d, op, &op->err)))
        op->rc = op->err.code ? op->err.code : SHOAL_EINTERNAL;
    if (op->rc)
        LOG_WARN("model", "OPEN %s: %s", op->spec, op->err.msg);
    while (op->waiters) {
        owaiter *x = op->waiters;
        op->waiters = x->next;
        if (m)
            m->refs++;
        x->fn(d, x->ctx, m, &op->err);
        free(x);
    }
    if (m && op->keep && !d->stopping) {
        keep_store(d, op->keep);   /* the manifest and the shard headers */
        op->keep = NULL;
    }
    opening_free(op);
}

int model_open(shoald *d, const char *spec, model_ready_fn ready, void *ctx,
               const work_progress **prog, model **out, shoal_err *err)
{
    model *m;
    opening *op;
    owaiter *x;

    *out = NULL;
    if (prog)
        *prog = NULL;
    if (strlen(spec) == 0 || strlen(spec) > SHOAL_PROTO_MAX_STR)
        return shoal_err_set(err, SHOAL_EINVAL, "empty or overlong model name");
    if ((m = model_find(d, spec)) != NULL) {
        m->refs++;
        *out = m;
        return 0;
    }
    if (d->stopping)
        return shoal_err_set(err, SHOAL_ECANCELED, "shoald is stopping");
    for (op = d->openings; op; op = op->next)
        if (strcmp(op->spec, spec) == 0)
            break;
    x = calloc(1, sizeof *x);
    if (!x)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    x->fn = ready;
    x->ctx = ctx;
    if (!op) {
        op = calloc(1, sizeof *op);
        if (!op) {
            free(x);
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        }
        snprintf(op->spec, sizeof op->spec, "%s", spec);
        shoal_buf_init(&op->encoded, MANIFEST_ENCODED_MAX);
        op->w.run = open_run;
        op->w.done = open_done;
        op->next = d->openings;
        d->openings = op;
        LOG_INFO("model", "opening %s on a worker", spec);
        work_post(d, &op->w);
    }
    x->next = op->waiters;
    op->waiters = x;
    if (prog)
        *prog = &op->w.prog;
    return 1;
}

void model_release(shoald *d, model *m)
{
    (void)d;
    if (!m || --m->refs > 0)
        return;
    m->idle_ms = shoal_wall_ms();
    LOG_DEBUG("model", "%s is idle", m->spec);
}

void model_free_all(shoald *d)
{
    for (int i = 0; i < DAEMON_MODELS_MAX; i++) {
        model_free(d->models[i]);
        d->models[i] = NULL;
    }
}

int model_key_resolve(const model *m, const shoal_key *k, objref *o, shoal_err *err)
{
    const manifest *man = m->man;
    char name[SHOAL_PROTO_MAX_STR + 1];

    memset(o, 0, sizeof *o);
    o->layer = -1;
    o->expert = -1;
    if (k->kind == SHOAL_KEY_EXPERT) {
        const manifest_expert *e = manifest_expert_find(man, k->layer, k->expert);
        if (!e)
            return shoal_err_set(err, SHOAL_ENOTFOUND, "no expert %u of layer %u in %s",
                                 k->expert, k->layer, m->spec);
        o->file = e->file;
        o->key.offset = e->offset;
        o->key.length = man->expert_bytes;
        o->kind = CACHE_KIND_EXPERT;
        o->layer = (int32_t)e->layer;
        o->expert = (int32_t)e->id;
    } else {
        memcpy(name, k->name, k->name_len);
        name[k->name_len] = '\0';
        if (k->kind == SHOAL_KEY_TENSOR) {
            const manifest_tensor *t = manifest_tensor_find(man, name);
            if (!t)
                return shoal_err_set(err, SHOAL_ENOTFOUND, "no tensor %s in %s", name, m->spec);
            o->file = t->file;
            o->key.offset = t->offset;
            o->key.length = t->length;
            o->kind = CACHE_KIND_SPINE;
            o->tensor = t->name;
        } else {
            long f = manifest_file_find(man, name);
            if (f < 0)
                return shoal_err_set(err, SHOAL_ENOTFOUND, "no file %s in %s", name, m->spec);
            o->file = (uint32_t)f;
            o->key.offset = 0;
            o->key.length = man->files[f].size;
            o->kind = CACHE_KIND_SMALL;
        }
    }
    if (o->key.length == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "%s: an empty object, nothing to cache",
                             man->files[o->file].path);
    o->key.etag = man->files[o->file].etag;
    return 0;
}

int model_drop_idle(shoald *d, const char *spec, shoal_err *err)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < DAEMON_MODELS_MAX; i++) {
            model *m = d->models[i];
            cache_model cm;
            if (!m || !m->man)
                continue;
            memset(&cm, 0, sizeof cm);
            snprintf(cm.repo, sizeof cm.repo, "%s", m->man->repo);
            snprintf(cm.revision, sizeof cm.revision, "%s", m->man->revision);
            snprintf(cm.commit, sizeof cm.commit, "%s", m->man->commit);
            if (!cache_model_matches(&cm, spec))
                continue;
            /* First pass: refuse if any is held; second: drop them all. */
            if (pass == 0 && m->refs > 0)
                return shoal_err_set(err, SHOAL_EBUSY, "%s is in use in shoald (%u holders: "
                                     "engines, warm jobs or transfers); stop them (or wait for "
                                     "the job) and run `shoal rm` again", m->spec, m->refs);
            if (pass == 1) {
                d->models[i] = NULL;
                model_free(m);
            }
        }
    }
    return 0;
}
