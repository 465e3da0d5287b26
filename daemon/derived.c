/* derived.c — objects a client made from a model's objects and stored back
 * (PUT), found again by name (SHOAL_KEY_DERIVED): the engine's int8 spine
 * pack is the first (docs/protocol.md, docs/engine.md).
 *
 * Owns: the cache key of a derived object and copying a client's
 * descriptor into the cache.  The key's etag is
 *   "derived:" + 16 hex digits of XXH3-64(endpoint \0 repo \0 commit) + ":"
 *   + commit (at most 64 bytes) + ":" + name
 * so another commit, or another name (the client puts its format and
 * quantizer versions in the name), is another object.  offset 0, length the
 * object's.  The length is not known to a GET, so a lookup walks the
 * model's objects for the etag (one indexed query per engine start).
 *
 * Memory: the copy goes through one DERIVED_CHUNK buffer, hashed as it is
 * written, never the whole object.  It runs on the loop: other clients wait
 * for the copy (a memfd read, disk-speed); see docs/daemon.md.
 *
 * Also owns the rule that makes a spine pack pay for itself on disk: once
 * a derived object named spine-* (the engine's int8 pack, SPINE_PACK_NAME
 * in engine/spine_pack.h) exists for a commit, the BF16 matrices it
 * replaces lose the pin they have as spine tensors (cache_pin_lift): they
 * stay cached until space is needed, then leave like any other object.
 * K3's are 111 GB — room for ~6,300 experts.  shoald --keep-spine keeps
 * them pinned.
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/sys.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#define DERIVED_CHUNK (1u << 20)
#define DERIVED_SPINE_PREFIX "spine-"
#define DERIVED_EMBEDDING "model.embed_tokens.weight"

static int derived_etag(const model *m, const char *name, size_t n, char *etag, size_t cap,
                        shoal_err *err)
{
    const manifest *man = m->man;
    const char *ep = man->endpoint ? man->endpoint : "", *repo = man->repo ? man->repo : "";
    XXH3_state_t *xs = XXH3_createState();
    uint64_t h;
    int w;

    if (!xs)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    XXH3_64bits_reset(xs);
    XXH3_64bits_update(xs, ep, strlen(ep) + 1);       /* NULs keep the fields apart */
    XXH3_64bits_update(xs, repo, strlen(repo) + 1);
    XXH3_64bits_update(xs, man->commit, strlen(man->commit));
    h = XXH3_64bits_digest(xs);
    XXH3_freeState(xs);
    w = snprintf(etag, cap, "derived:%016llx:%.64s:%.*s", (unsigned long long)h, man->commit,
                 (int)n, name);
    if (w < 0 || (size_t)w >= cap || (size_t)w > CACHE_ETAG_MAX)
        return shoal_err_set(err, SHOAL_ETOOBIG, "derived object name too long");
    return 0;
}

typedef struct find_ctx {
    const char *etag;
    uint64_t length;
    int found;
} find_ctx;

static int find_cb(const cache_entry *e, void *ctx)
{
    find_ctx *f = ctx;
    if (e->kind != CACHE_KIND_DERIVED || strcmp(e->etag, f->etag) != 0)
        return 0;
    f->length = e->length;
    f->found = 1;
    return 1;
}

int derived_replaces(const manifest_tensor *t)
{
    /* The pack holds every matrix the engine derives at load (int8, or f32
     * for routers and gate paths): the 2-D spine tensors with more than one
     * row and column, but the token embedding, which the engine maps as it
     * is.  Vectors, norms, the 1 x N AttnRes projections, the 3-D conv
     * taps and the embedding are GET'd by name at every load
     * (engine/remote.c: what spine_pack_covers() says no to). */
    return t->is_spine && t->ndim == 2 && t->shape[0] > 1 && t->shape[1] > 1 &&
           strcmp(t->name, DERIVED_EMBEDDING) != 0;
}

int derived_is_spine_pack(const char *name, size_t n)
{
    size_t p = sizeof DERIVED_SPINE_PREFIX - 1;
    return n > p && memcmp(name, DERIVED_SPINE_PREFIX, p) == 0;
}

int derived_spine_pack_cached(shoald *d, const model *m)
{
    char prefix[CACHE_ETAG_MAX + 1], etag[CACHE_ETAG_MAX + 1];
    cache_key k;
    /* the etag of any spine-* name, up to the name's variable part */
    if (derived_etag(m, DERIVED_SPINE_PREFIX, sizeof DERIVED_SPINE_PREFIX - 1, prefix,
                     sizeof prefix, NULL) != 0)
        return 0;
    return cache_find_prefix(d->cache, prefix, CACHE_KIND_DERIVED, &k, etag, sizeof etag,
                             NULL) == 0;
}

int derived_spine_release(shoald *d, const model *m, size_t *lifted, shoal_err *err)
{
    const manifest *man = m->man;
    cache_key *keys;
    size_t n = 0;
    int rc;

    *lifted = 0;
    if (d->cfg.keep_spine)
        return 0;
    if (!(keys = malloc((man->ntensors ? man->ntensors : 1) * sizeof *keys)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < man->ntensors; i++) {
        const manifest_tensor *t = &man->tensors[i];
        if (derived_replaces(t))
            keys[n++] = (cache_key){ man->files[t->file].etag, t->offset, t->length };
    }
    rc = cache_pin_lift(d->cache, keys, n, 1, lifted, err);
    free(keys);
    if (rc == 0 && *lifted)
        LOG_INFO("derived", "%s: its spine pack exists: %zu BF16 matrices it replaces are "
                 "evictable now (--keep-spine keeps them)", m->spec, *lifted);
    return rc;
}

int derived_resolve(shoald *d, const model *m, const shoal_key *k, objref *o, char *etag,
                    size_t cap, shoal_err *err)
{
    find_ctx f = { etag, 0, 0 };
    int rc;

    memset(o, 0, sizeof *o);
    o->layer = -1;
    o->expert = -1;
    o->kind = CACHE_KIND_DERIVED;
    if ((rc = derived_etag(m, k->name, k->name_len, etag, cap, err)) != 0)
        return rc;
    rc = cache_list(d->cache, m->model_id, find_cb, &f, err);
    if (rc < 0)
        return rc;
    if (!f.found)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "no derived object %.*s for %s",
                             (int)k->name_len, k->name, m->spec);
    o->key = (cache_key){ etag, 0, f.length };
    if (derived_is_spine_pack(k->name, k->name_len)) {
        /* an engine maps the pack: matrices cached since (a warm, an
         * engine that could not use it) become evictable too */
        size_t lifted;
        shoal_err e = { 0 };
        if (derived_spine_release(d, m, &lifted, &e) != 0)
            LOG_WARN("derived", "%s: %s", m->spec, e.msg);
    }
    return 0;
}

static int put_copy(shoald *d, cache_writer *w, int fd, uint64_t len, uint8_t out[16],
                    shoal_err *err)
{
    uint8_t *buf = malloc(DERIVED_CHUNK);
    XXH3_state_t *xs = XXH3_createState();
    XXH128_canonical_t can;
    int rc = 0;

    (void)d;
    if (!buf || !xs) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto done;
    }
    XXH3_128bits_reset(xs);
    for (uint64_t off = 0; off < len && rc == 0;) {
        size_t n = len - off < DERIVED_CHUNK ? (size_t)(len - off) : DERIVED_CHUNK;
        if (shoal_pread_all(fd, buf, n, (off_t)off) != 0) {
            rc = shoal_err_set(err, SHOAL_EIO, "PUT: reading the descriptor at %llu: %s",
                               (unsigned long long)off, strerror(errno));
            break;
        }
        XXH3_128bits_update(xs, buf, n);
        rc = cache_write_append(w, buf, n, err);
        off += n;
    }
    if (rc == 0) {
        XXH128_canonicalFromHash(&can, XXH3_128bits_digest(xs));
        memcpy(out, can.digest, 16);
    }
done:
    XXH3_freeState(xs);
    free(buf);
    return rc;
}

int derived_put(shoald *d, model *m, const daemon_request *rq, shoal_err *err)
{
    char etag[CACHE_ETAG_MAX + 1];
    const manifest *man = m->man;
    cache_names names = CACHE_NAMES_NONE;
    cache_writer *w = NULL;
    struct stat st;
    uint8_t got[16];
    cache_key key;
    int rc;

    if ((rc = derived_etag(m, rq->text, strlen(rq->text), etag, sizeof etag, err)) != 0)
        return rc;
    /* a regular file (memfd or temp file) of at least the length: a pipe or
     * a socket could block the loop */
    if (fstat(rq->fd, &st) != 0 || !S_ISREG(st.st_mode))
        return shoal_err_set(err, SHOAL_EINVAL, "PUT: the descriptor must be a regular file "
                             "(memfd or temp file)");
    if ((uint64_t)st.st_size < rq->u64)
        return shoal_err_set(err, SHOAL_EINVAL, "PUT: the descriptor holds %lld bytes, not %llu",
                             (long long)st.st_size, (unsigned long long)rq->u64);
    {   /* one object per name: another length would be another key */
        find_ctx f = { etag, 0, 0 };
        if ((rc = cache_list(d->cache, m->model_id, find_cb, &f, err)) < 0)
            return rc;
        if (f.found)
            return shoal_err_set(err, SHOAL_EEXIST, "PUT: %s is stored already (%llu bytes): "
                                 "GET it", rq->text, (unsigned long long)f.length);
    }
    key = (cache_key){ etag, 0, rq->u64 };
    names.endpoint = man->endpoint;
    names.repo = man->repo;
    names.revision = man->revision;
    names.commit = man->commit;
    names.file = rq->text;
    if ((rc = cache_write_begin(d->cache, &key, CACHE_KIND_DERIVED, &names, &w, err)) != 0)
        return rc;
    if (cache_writer_offset(w) != 0) {   /* a stale partial: start over */
        cache_write_abort(w);
        return shoal_err_set(err, SHOAL_EBUSY, "PUT: a partial copy of %s existed; retry",
                             rq->text);
    }
    if ((rc = put_copy(d, w, rq->fd, rq->u64, got, err)) != 0) {
        cache_write_abort(w);
        return rc;
    }
    if (memcmp(got, rq->xxh128, 16) != 0) {
        cache_write_abort(w);
        return shoal_err_set(err, SHOAL_ECORRUPT, "PUT %s: the content does not match its "
                             "XXH3-128 (changed while copied?); not stored", rq->text);
    }
    if ((rc = cache_write_commit(w, NULL, err)) != 0)
        return rc;
    /* like the spine it replaces: evicting it costs a full re-quantization */
    if (cache_pin(d->cache, &key, 1, NULL) != 0)
        LOG_WARN("derived", "%s: stored but could not pin", rq->text);
    LOG_INFO("derived", "%s: stored %s (%llu bytes)", m->spec, rq->text,
             (unsigned long long)rq->u64);
    if (derived_is_spine_pack(rq->text, strlen(rq->text))) {
        size_t lifted;
        shoal_err e = { 0 };
        if (derived_spine_release(d, m, &lifted, &e) != 0)
            LOG_WARN("derived", "%s: %s", m->spec, e.msg);
    }
    return 0;
}
