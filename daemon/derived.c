/* derived.c — objects a client made from a model's objects and stored back
 * (PUT, or PUT_BEGIN / PUT_COMMIT), found again by name (SHOAL_KEY_DERIVED):
 * the engine's int8 spine pack is the first (docs/protocol.md,
 * docs/engine.md).
 *
 * Owns: the cache key of a derived object and the three ways in.  The
 * key's etag is
 *   "derived:" + 16 hex digits of XXH3-64(endpoint \0 repo \0 commit) + ":"
 *   + commit (at most 64 bytes) + ":" + name
 * so another commit, or another name (the client puts its format and
 * quantizer versions in the name), is another object.  offset 0, length the
 * object's (an indexed lookup by etag finds it: cache_lookup_length).
 *
 * Nothing slow happens on the loop (DESIGN decision 12; K3's pack is 58 GB
 * int8): the loop checks the request and begins the cache writer (budget,
 * eviction, the tmp file, unallocated), a worker does the rest
 * (cache/cache.h rule 4) and the loop commits:
 *   PUT         worker: allocate, copy the client's descriptor into the
 *               tmp file, hash it, fsync.  One copy, never in memory.
 *   PUT_BEGIN   worker: allocate (a full disk fails now); then the loop
 *               hands the client a writable descriptor of the tmp file.
 *   PUT_COMMIT  worker: hash what the client wrote, fsync; the loop
 *               commits, or refuses (ECORRUPT, ERANGE) and drops the file.
 * PROGRESS frames go out while the copy and the hash advance.  A client
 * that leaves before PUT_COMMIT leaves nothing (its writers are aborted,
 * the tmp files unlinked); one that leaves after it has its object stored
 * anyway (its content and hash were complete).
 *
 * Also owns the rule that makes a spine pack pay for itself on disk: once
 * a derived object named spine-* (the engine's pack, SPINE_PACK_NAME in
 * engine/forward/forward.h) exists for a commit, the BF16 matrices it
 * replaces lose the pin they have as spine tensors (cache_pin_lift): they
 * stay cached until space is needed, then leave like any other object.
 * K3's are 111 GB — room for ~6,300 experts.  shoald --keep-spine keeps
 * them pinned.
 */
#include "daemon/daemon_int.h"
#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define DERIVED_CHUNK (4u << 20)
#define DERIVED_SPINE_PREFIX "spine-"
#define DERIVED_EMBEDDING "model.embed_tokens.weight"

enum { PUT_ALLOC = 0, PUT_READY = 1, PUT_HASH = 2 };

struct put {
    work      w;                   /* first: the job */
    shoald   *d;
    model    *m;                   /* a reference, held until the put ends */
    put      *next;                /* c->puts (PUT_BEGIN only) */
    conn     *c;                   /* on c->puts; NULL once it left */
    pending  *pend;                /* the request waiting for the job */
    uint64_t  id;                  /* PUT_READY's put id */
    int       state;
    cache_writer *wr;
    char      etag[CACHE_ETAG_MAX + 1];
    char      name[SHOAL_PROTO_MAX_DERIVED + 1];
    char      spec[128];           /* for the log */
    uint64_t  length;
    int       src_fd;              /* PUT: the client's content, else -1 */
    uint8_t   xxh[16];             /* announced */
    int       rc;
    shoal_err err;
};

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
    uint64_t len = 0;
    int rc;

    memset(o, 0, sizeof *o);
    o->layer = -1;
    o->expert = -1;
    o->kind = CACHE_KIND_DERIVED;
    if ((rc = derived_etag(m, k->name, k->name_len, etag, cap, err)) != 0)
        return rc;
    if (cache_lookup_length(d->cache, etag, 0, &len, NULL) != 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "no derived object %.*s for %s",
                             (int)k->name_len, k->name, m->spec);
    o->key = (cache_key){ etag, 0, len };
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

/* ---- the job ---------------------------------------------------------------------- */

static uint64_t next_put_id = 1;

static void put_free(put *p)
{
    if (!p)
        return;
    cache_write_abort(p->wr);   /* accepts NULL: committed ones are NULL */
    if (p->src_fd >= 0)
        close(p->src_fd);
    if (p->m)
        model_release(p->d, p->m);
    free(p);
}

static void put_unlist(put *p)
{
    if (!p->c)
        return;
    for (put **pp = &p->c->puts; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            p->c->nputs--;
            break;
        }
    }
    p->c = NULL;
}

static int put_progress(void *ctx, uint64_t done, uint64_t total)
{
    put *p = ctx;
    work_progress_set(&p->w.prog, "hash", done, total);
    return atomic_load(&p->w.stop) ? 1 : 0;
}

/* Copy [0, length) of the client's descriptor into the tmp file. */
static int put_copy(put *p, int dst, shoal_err *err)
{
    uint64_t off = 0;
    uint8_t *buf = NULL;
    int rc = 0;

    while (off < p->length && rc == 0) {
        size_t n = p->length - off < DERIVED_CHUNK ? (size_t)(p->length - off) : DERIVED_CHUNK;
        off_t in = (off_t)off, out = (off_t)off;
        ssize_t k = buf ? -1 : shoal_copy_range(p->src_fd, &in, dst, &out, n);
        if (k < 0 && !buf && (errno == EXDEV || errno == EINVAL || errno == ENOSYS ||
                              errno == EOPNOTSUPP)) {
            if (!(buf = malloc(DERIVED_CHUNK)))
                return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
            continue;   /* another filesystem: read and write */
        }
        if (buf) {
            if (shoal_pread_all(p->src_fd, buf, n, (off_t)off) != 0)
                rc = shoal_err_set(err, SHOAL_EINVAL, "PUT: reading the descriptor at %llu: %s",
                                   (unsigned long long)off, strerror(errno));
            else if (pwrite(dst, buf, n, (off_t)off) != (ssize_t)n)
                rc = shoal_err_set(err, shoal_err_from_errno(errno), "PUT: writing the cache: %s",
                                   strerror(errno));
            k = (ssize_t)n;
        } else if (k <= 0) {
            rc = shoal_err_set(err, k == 0 ? SHOAL_EINVAL : shoal_err_from_errno(errno),
                               "PUT: copying at %llu: %s", (unsigned long long)off,
                               k == 0 ? "the descriptor ended early" : strerror(errno));
        }
        if (rc == 0) {
            off += (uint64_t)k;
            work_progress_set(&p->w.prog, "copy", off, p->length);
            if (atomic_load(&p->w.stop))
                rc = shoal_err_set(err, SHOAL_ECANCELED, "PUT: stopped");
        }
    }
    free(buf);
    return rc;
}

/* Worker: allocate; (PUT: copy in); hash and sync; compare. */
static void put_run(work *w)
{
    put *p = (put *)w;
    uint8_t got[16];
    int fd = -1;

    p->rc = cache_writer_allocate(p->wr, &p->err);
    if (p->rc || p->state == PUT_ALLOC)
        return;
    if (p->src_fd >= 0) {
        p->rc = cache_writer_open_fd(p->wr, O_WRONLY, &fd, &p->err);
        if (p->rc == 0)
            p->rc = put_copy(p, fd, &p->err);
        if (fd >= 0)
            close(fd);
        if (p->rc)
            return;
    }
    work_progress_set(&w->prog, "hash", 0, p->length);
    p->rc = cache_writer_adopt(p->wr, put_progress, p, &p->err);
    if (p->rc == SHOAL_ERANGE)
        shoal_err_wrap(&p->err, p->rc, "PUT %s", p->name);
    if (p->rc)
        return;
    cache_writer_xxh(p->wr, got);
    if (memcmp(got, p->xxh, 16) != 0)
        p->rc = shoal_err_set(&p->err, SHOAL_ECORRUPT, "PUT %s: the content does not match its "
                              "XXH3-128 (changed while written?); not stored", p->name);
}

static void put_reply_error(shoald *d, put *p)
{
    LOG_WARN("derived", "%s %s: %s", p->spec, p->name, p->err.msg);
    if (p->pend && p->pend->c)
        ops_fail(p->pend->c, p->pend->id, &p->err);
    pending_end(d, p->pend);
    p->pend = NULL;
}

/* Loop: the allocation of a PUT_BEGIN ended. */
static void put_ready(shoald *d, put *p)
{
    conn *c = p->pend ? p->pend->c : NULL;
    shoal_msg_builder *b;
    int fd = -1;

    if (p->rc == 0 && (!c || !p->c || d->stopping))
        p->rc = shoal_err_set(&p->err, SHOAL_ECANCELED, "the client left");
    if (p->rc == 0)
        p->rc = cache_writer_open_fd(p->wr, O_WRONLY, &fd, &p->err);
    if (p->rc) {
        put_reply_error(d, p);
        put_unlist(p);
        put_free(p);
        return;
    }
    p->state = PUT_READY;
    b = conn_builder(c);
    shoal_msg_begin(b, SHOAL_MSG_PUT_READY, SHOAL_MSG_F_FD | SHOAL_MSG_F_LAST, p->pend->id);
    shoal_msg_put_u64(b, p->id);
    shoal_msg_put_u64(b, p->length);
    if (shoal_msg_end(b) == 0)
        conn_send(c, b->buf.data, b->buf.len, fd);   /* takes fd */
    else
        close(fd);
    pending_end(d, p->pend);
    p->pend = NULL;
}

/* Loop: a PUT's or PUT_COMMIT's hash ended: commit, or drop. */
static void put_finish(shoald *d, put *p)
{
    cache_key key = { p->etag, 0, p->length };
    cache_writer *wr = p->wr;

    if (p->rc == 0 && d->stopping)
        p->rc = shoal_err_set(&p->err, SHOAL_ECANCELED, "shoald is stopping");
    if (p->rc == 0) {
        p->wr = NULL;
        p->rc = cache_write_commit(wr, NULL, &p->err);
    }
    put_unlist(p);
    if (p->rc) {
        put_reply_error(d, p);
        put_free(p);
        return;
    }
    /* like the spine it replaces: evicting it costs a full re-quantization */
    if (cache_pin(d->cache, &key, 1, NULL) != 0)
        LOG_WARN("derived", "%s: stored but could not pin", p->name);
    LOG_INFO("derived", "%s: stored %s (%llu bytes)", p->spec, p->name,
             (unsigned long long)p->length);
    if (derived_is_spine_pack(p->name, strlen(p->name))) {
        size_t lifted;
        shoal_err e = { 0 };
        if (derived_spine_release(d, p->m, &lifted, &e) != 0)
            LOG_WARN("derived", "%s: %s", p->spec, e.msg);
    }
    if (p->pend && p->pend->c)
        conn_send_ok(p->pend->c, p->pend->id);
    pending_end(d, p->pend);
    p->pend = NULL;
    put_free(p);
}

static void put_done(work *w)
{
    put *p = (put *)w;
    if (p->state == PUT_ALLOC)
        put_ready(w->d, p);
    else
        put_finish(w->d, p);
}

/* ---- requests ------------------------------------------------------------------------ */

/* The checks every way in shares, and the writer: 0 with *out (caller
 * posts it), or an error (err set). */
static int put_new(conn *c, model *m, const char *name, uint64_t length, int state, put **out,
                   shoal_err *err)
{
    shoald *d = c->d;
    const manifest *man = m->man;
    cache_names names = CACHE_NAMES_NONE;
    cache_key key;
    uint64_t have = 0;
    put *p;
    int rc;

    *out = NULL;
    if (!(p = calloc(1, sizeof *p)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    p->src_fd = -1;
    p->d = d;
    p->m = m;
    m->refs++;
    p->state = state;
    p->length = length;
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->spec, sizeof p->spec, "%.120s", m->spec);
    if ((rc = derived_etag(m, name, strlen(name), p->etag, sizeof p->etag, err)) != 0)
        goto fail;
    /* one object per name: another length would be another key */
    if (cache_lookup_length(d->cache, p->etag, 0, &have, NULL) == 0) {
        rc = shoal_err_set(err, SHOAL_EEXIST, "PUT: %s is stored already (%llu bytes): GET it",
                           name, (unsigned long long)have);
        goto fail;
    }
    key = (cache_key){ p->etag, 0, length };
    names.endpoint = man->endpoint;
    names.repo = man->repo;
    names.revision = man->revision;
    names.commit = man->commit;
    names.file = name;
    rc = cache_write_begin_flags(d->cache, &key, CACHE_KIND_DERIVED, &names, CACHE_BEGIN_NO_ALLOC,
                                 &p->wr, err);
    if (rc == SHOAL_EBUSY)
        shoal_err_wrap(err, rc, "PUT %s: another client is storing it now; GET it when it is done",
                       name);
    if (rc == SHOAL_ENOSPC) {   /* the whole length could not be reserved: say with what */
        cache_usage u;
        char l[32], b[32], pn[32], r[32];
        if (cache_usage_get(d->cache, &u, NULL) == 0)
            shoal_err_wrap(err, rc, "%s %s (%s) does not fit beside what the cache must keep "
                           "(budget %s, %s pinned, %s being written)",
                           state == PUT_ALLOC ? "PUT_BEGIN" : "PUT", name,
                           shoal_size_format(length, l, sizeof l),
                           shoal_size_format(u.budget, b, sizeof b),
                           shoal_size_format(u.pinned, pn, sizeof pn),
                           shoal_size_format(u.reserved, r, sizeof r));
    }
    if (rc)
        goto fail;
    if (cache_writer_offset(p->wr) != 0) {   /* a stale partial: start over */
        cache_write_abort(p->wr);
        p->wr = NULL;
        rc = shoal_err_set(err, SHOAL_EBUSY, "PUT: a partial copy of %s existed; retry", name);
        goto fail;
    }
    p->w.run = put_run;
    p->w.done = put_done;
    *out = p;
    return 0;
fail:
    put_free(p);
    return rc;
}

int derived_put(conn *c, model *m, const daemon_request *rq)
{
    shoal_err err = { 0 };
    struct stat st;
    put *p = NULL;
    int rc;

    /* a regular file (memfd or temp file) of at least the length: a pipe or
     * a socket could block a worker for ever */
    if (fstat(rq->fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = shoal_err_set(&err, SHOAL_EINVAL, "PUT: the descriptor must be a regular file "
                           "(memfd or temp file)");
    else if ((uint64_t)st.st_size < rq->u64)
        rc = shoal_err_set(&err, SHOAL_EINVAL, "PUT: the descriptor holds %lld bytes, not %llu",
                           (long long)st.st_size, (unsigned long long)rq->u64);
    else
        rc = put_new(c, m, rq->text, rq->u64, PUT_HASH, &p, &err);
    if (rc == 0 && !(p->pend = pending_new(c, rq->id, &p->w.prog)))
        rc = shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
    if (rc) {
        close(rq->fd);
        put_free(p);
        LOG_WARN("derived", "PUT %s: %s", rq->text, err.msg);
        return ops_fail(c, rq->id, &err), 0;
    }
    p->src_fd = rq->fd;
    memcpy(p->xxh, rq->xxh128, 16);
    work_post(c->d, &p->w);
    return 0;
}

int derived_put_begin(conn *c, model *m, const daemon_request *rq)
{
    shoal_err err = { 0 };
    put *p = NULL;
    int rc = 0;

    if (c->nputs >= DAEMON_CONN_MAX_PUTS)
        rc = shoal_err_set(&err, SHOAL_EBUSY, "PUT_BEGIN: %d PUTs are open on this connection: "
                           "commit or abort one first", DAEMON_CONN_MAX_PUTS);
    if (rc == 0)
        rc = put_new(c, m, rq->text, rq->u64, PUT_ALLOC, &p, &err);
    if (rc == 0 && !(p->pend = pending_new(c, rq->id, NULL)))
        rc = shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
    if (rc) {
        put_free(p);
        LOG_WARN("derived", "PUT_BEGIN %s: %s", rq->text, err.msg);
        return ops_fail(c, rq->id, &err), 0;
    }
    p->id = next_put_id++;
    p->c = c;
    p->next = c->puts;
    c->puts = p;
    c->nputs++;
    work_post(c->d, &p->w);
    return 0;
}

int derived_put_commit(conn *c, const daemon_request *rq)
{
    shoal_err err = { 0 };
    put *p = c->puts;

    while (p && p->id != rq->u64)
        p = p->next;
    if (!p || p->state != PUT_READY) {
        shoal_err_set(&err, SHOAL_ENOTFOUND, "no PUT %llu waits for its commit on this connection",
                      (unsigned long long)rq->u64);
        return ops_fail(c, rq->id, &err), 0;
    }
    if (!rq->priority) {   /* abandon */
        put_unlist(p);
        put_free(p);
        return conn_send_ok(c, rq->id), 0;
    }
    if (!(p->pend = pending_new(c, rq->id, &p->w.prog))) {
        shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
        return ops_fail(c, rq->id, &err), 0;
    }
    p->state = PUT_HASH;
    memcpy(p->xxh, rq->xxh128, 16);
    work_post(c->d, &p->w);
    return 0;
}

void derived_conn_gone(conn *c)
{
    while (c->puts) {
        put *p = c->puts;
        int idle = p->state == PUT_READY;   /* no job holds it */
        put_unlist(p);
        if (idle)
            put_free(p);   /* never committed: the tmp file goes */
    }
}
