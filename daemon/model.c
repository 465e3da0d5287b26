/* model.c — the daemon's table of open models.
 *
 * Owns: one entry per distinct model spec (a snapshot directory or
 * hf://org/name[@rev]) shared by every connection and warm job that holds
 * it (reference counted; handle = slot + 1), its manifest and that
 * manifest's encoding (what OPEN hands out), and turning a protocol key
 * (expert, tensor, file) into the object it names.  Does not own loading
 * a manifest from upstream (upstream.c) nor what is cached (cache/).
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/sys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int model_acquire(shoald *d, const char *spec, model **out, shoal_err *err)
{
    int slot = -1, idle = -1, rc;
    int64_t now = shoal_wall_ms();
    model *m;

    *out = NULL;
    for (int i = 0; i < DAEMON_MODELS_MAX; i++) {
        m = d->models[i];
        if (m && m->refs == 0 && now - m->idle_ms > MODEL_LINGER_MS) {
            d->models[i] = NULL;
            model_free(m);
            m = NULL;
        }
        if (m && strcmp(m->spec, spec) == 0) {
            m->refs++;
            *out = m;
            return 0;
        }
        if (!m && slot < 0)
            slot = i;
        if (m && m->refs == 0 && (idle < 0 || m->idle_ms < d->models[idle]->idle_ms))
            idle = i;
    }
    if (slot < 0 && idle >= 0) {   /* full: drop the longest idle */
        model_free(d->models[idle]);
        d->models[idle] = NULL;
        slot = idle;
    }
    if (slot < 0)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%d models are open: release some first",
                             DAEMON_MODELS_MAX);
    if (strlen(spec) == 0 || strlen(spec) > SHOAL_PROTO_MAX_STR)
        return shoal_err_set(err, SHOAL_EINVAL, "empty or overlong model name");
    m = calloc(1, sizeof *m);
    if (!m)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    snprintf(m->spec, sizeof m->spec, "%s", spec);
    shoal_buf_init(&m->encoded, MANIFEST_ENCODED_MAX);
    m->handle = (uint32_t)slot + 1;
    rc = upstream_model_load(d, m, err);
    if (rc)
        goto fail;
    rc = cache_model_put(d->cache, m->man->endpoint, m->man->repo, m->man->revision,
                         m->man->commit, &m->model_id, err);
    if (rc)
        goto fail;
    rc = manifest_encode(m->man, &m->encoded, err);
    if (rc)
        goto fail;
    m->refs = 1;
    d->models[slot] = m;
    *out = m;
    LOG_INFO("model", "opened %s: commit %s, %zu files, %zu tensors, %zu experts (handle %u)",
             spec, m->man->commit, m->man->nfiles, m->man->ntensors, m->man->nexperts,
             m->handle);
    return 0;
fail:
    model_free(m);
    return rc;
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
