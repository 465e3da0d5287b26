/* integrity.c — checking what upstream sent: every file against its
 * upstream hash once its every byte is cached, in the background, and
 * damaged objects a client reports (docs/daemon.md "Integrity").
 *
 * Owns: the queue of etags whose objects were committed since their last
 * check (the cache's commit hook adds to it, on the loop); one check job
 * at a time on a worker (cache_file_check_run on a side handle: the
 * complete files are hashed, sha256 or git sha1, with no snapshot held);
 * applying its results on the loop (cache_file_verified marks a match's
 * objects verified; cache_file_quarantine removes a mismatch's objects so
 * they are never served again, and a warm job of the open models that
 * name the file fetches them again, at most INTEGRITY_RETRIES times per
 * file while this daemon runs); damaged objects a client read (REPORT
 * "damaged": the engine's reader hashes every expert as it reads it and
 * reports a mismatch) removed so the client's next GET fetches them again.
 * Does not own hashing (cache/deep.c), nor warm jobs (warm.c).
 *
 * Cost: a file is read back once after it completes (a K3 shard, ~5 GB:
 * sha256 at 0.5-2 GB/s on one worker, at nice 5); a check of a file not
 * complete yet is two short index queries.
 */
#include "daemon/daemon_int.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INTEGRITY_RETRIES 2       /* re-fetches of one file after mismatches */
#define INTEGRITY_BATCH   64      /* etags one job checks */
#define INTEGRITY_QUEUE   65536   /* etags waiting; more are dropped (logged) */

typedef struct etag_str {
    char s[CACHE_ETAG_MAX + 1];
} etag_str;

typedef struct retry_count {
    etag_str etag;
    unsigned n;                    /* re-fetches started */
    int      refused;              /* failed after the last one: not fetched again */
    char     path[CACHE_STR_MAX];
} retry_count;

struct integrity {
    etag_str *q;                   /* waiting for a check, no duplicates */
    size_t    nq, capq;
    int       running;             /* a check job is out */
    retry_count *rc;               /* re-fetches started per file */
    size_t    nrc, caprc;
    uint64_t  dropped;
    integrity_counts n;
};

typedef struct check_job {
    work       w;                  /* first */
    etag_str  *etags;
    size_t     n;
    cache_file_check *res;
    int        rc;
    shoal_err  err;
} check_job;

static void post_check(shoald *d);

/* ---- the queue --------------------------------------------------------------------- */

static int queued(const struct integrity *g, const char *etag)
{
    for (size_t i = 0; i < g->nq; i++)
        if (strcmp(g->q[i].s, etag) == 0)
            return 1;
    return 0;
}

static void on_commit(void *ctx, const char *etag, int kind, uint64_t offset, uint64_t length)
{
    shoald *d = ctx;
    struct integrity *g = d->integrity;
    (void)offset;
    (void)length;
    if (!g || kind == CACHE_KIND_DERIVED || strlen(etag) > CACHE_ETAG_MAX || queued(g, etag))
        return;
    if (g->nq == g->capq) {
        size_t nc = g->capq ? g->capq * 2 : 64;
        etag_str *p = nc <= INTEGRITY_QUEUE ? realloc(g->q, nc * sizeof *p) : NULL;
        if (!p) {
            if (g->dropped++ == 0)
                LOG_WARN("integrity", "too many files wait for their check: some are left to "
                         "`shoal verify --deep`");
            return;
        }
        g->q = p;
        g->capq = nc;
    }
    snprintf(g->q[g->nq++].s, sizeof g->q[0].s, "%s", etag);
    post_check(d);
}

/* ---- the check job ---------------------------------------------------------------------- */

static int check_progress(void *ctx, uint64_t done, uint64_t total)
{
    check_job *j = ctx;
    work_progress_set(&j->w.prog, "hash", done, total);
    return atomic_load(&j->w.stop) ? 1 : 0;
}

/* Worker: check each etag on a side handle. */
static void check_run(work *w)
{
    check_job *j = (check_job *)w;
    cache *side = NULL;

    if ((j->rc = work_side_open(w->d, &side, &j->err)) != 0)
        return;
    for (size_t i = 0; i < j->n && !atomic_load(&w->stop); i++) {
        shoal_err e = { 0 };
        if (cache_file_check_run(side, j->etags[i].s, check_progress, j, &j->res[i], &e) != 0) {
            LOG_WARN("integrity", "checking %s: %s", j->etags[i].s, e.msg);
            j->res[i].result = -1;
        }
    }
    cache_close(side);
}

static retry_count *retries(struct integrity *g, const char *etag)
{
    for (size_t i = 0; i < g->nrc; i++)
        if (strcmp(g->rc[i].etag.s, etag) == 0)
            return &g->rc[i];
    if (g->nrc == g->caprc) {
        size_t nc = g->caprc ? g->caprc * 2 : 16;
        retry_count *p = realloc(g->rc, nc * sizeof *p);
        if (!p)
            return NULL;
        g->rc = p;
        g->caprc = nc;
    }
    memset(&g->rc[g->nrc], 0, sizeof g->rc[0]);
    snprintf(g->rc[g->nrc].etag.s, sizeof g->rc[0].etag.s, "%s", etag);
    return &g->rc[g->nrc++];
}

/* Fetch a quarantined file's objects again: a warm job on each open model
 * naming the file (its experts by list; its spine tensors and small files
 * by selection 1, which skips what is cached).  A model not open fetches
 * them when next asked for. */
static void refetch(shoald *d, const char *etag, const cache_file_check *r)
{
    const char *path = r->path;
    unsigned started = 0;
    for (size_t i = 0; i < DAEMON_MODELS_MAX; i++) {
        model *m = d->models[i];
        const manifest *man = m ? m->man : NULL;
        shoal_key *keys = NULL;
        size_t nk = 0, spine = 0;
        long f = -1;
        for (size_t k = 0; man && k < man->nfiles; k++)
            if (man->files[k].etag && strcmp(man->files[k].etag, etag) == 0)
                f = (long)k;
        if (f < 0) {
            /* a file the manifest does not list: selection 1 of the model
             * it came with (small files) */
            if (!man || !man->repo || !man->commit || strcmp(man->repo, r->repo) != 0 ||
                strcmp(man->commit, r->commit) != 0)
                continue;
            spine = 1;
        }
        for (size_t t = 0; f >= 0 && t < man->ntensors; t++)
            spine += man->tensors[t].file == (uint32_t)f;
        keys = calloc(man->nexperts ? man->nexperts : 1, sizeof *keys);
        for (size_t e = 0; keys && f >= 0 && e < man->nexperts; e++) {
            if (man->experts[e].file != (uint32_t)f)
                continue;
            keys[nk].kind = SHOAL_KEY_EXPERT;
            keys[nk].layer = (uint16_t)man->experts[e].layer;
            keys[nk].expert = man->experts[e].id;
            nk++;
        }
        if (spine == 0 && nk == 0)
            spine = 1;   /* a whole small file: selection 1 has it */
        for (int pass = 0; pass < 2; pass++) {
            uint64_t job = 0;
            shoal_err e = { 0 };
            if (pass == 0 ? nk == 0 : spine == 0)
                continue;
            if (warm_start(d->warm, m, pass == 0 ? 4 : 1, SHOAL_WARM_F_FIT, 0, 0,
                           pass == 0 ? keys : NULL, pass == 0 ? nk : 0, &job, &e) == 0) {
                LOG_WARN("integrity", "%s: fetching it again for %s (warm job %llu)", path,
                         m->spec, (unsigned long long)job);
                started++;
                d->integrity->n.refetches++;
            } else {
                LOG_WARN("integrity", "%s: cannot fetch it again for %s: %s", path, m->spec,
                         e.msg);
            }
        }
        free(keys);
    }
    if (!started)
        LOG_WARN("integrity", "%s: no open model names it: its objects are fetched again when "
                 "next asked for", path);
}

static void apply(shoald *d, const char *etag, cache_file_check *r)
{
    struct integrity *g = d->integrity;
    shoal_err e = { 0 };

    if (r->result == 1) {
        retry_count *t = retries(g, etag);
        if (t)
            t->refused = 0;
        if (cache_file_verified(d->cache, etag, &r->objs, &e) != 0) {
            LOG_WARN("integrity", "%s: checked ok, not recorded: %s", r->path, e.msg);
            return;
        }
        g->n.files_ok++;
        g->n.bytes_hashed += r->bytes;
        LOG_INFO("integrity", "%s: %llu bytes match the upstream hash", r->path,
                 (unsigned long long)r->size);
    } else if (r->result == 0) {
        uint64_t failures = 0, bytes = 0;
        retry_count *tries = retries(g, etag);
        g->n.files_bad++;
        g->n.bytes_hashed += r->bytes;
        if (cache_file_quarantine(d->cache, etag, r->path, r->size, &r->objs, &failures, &bytes,
                                  &e) != 0) {
            LOG_ERROR("integrity", "%s does not match its upstream hash, and quarantining it "
                      "failed: %s", r->path, e.msg);
            return;
        }
        g->n.quarantined_bytes += bytes;
        if (tries)
            snprintf(tries->path, sizeof tries->path, "%s", r->path);
        if (tries && tries->n < INTEGRITY_RETRIES) {
            tries->n++;
            refetch(d, etag, r);
        } else {
            if (tries)
                tries->refused = 1;
            LOG_ERROR("integrity", "%s: upstream sent bytes that do not hash to its etag %u "
                      "times: its objects are refused (GET: ECORRUPT) until shoald restarts; "
                      "check the upstream or mirror", r->path, tries ? tries->n + 1 : 1);
        }
    }
}

static void check_done(work *w)
{
    check_job *j = (check_job *)w;
    shoald *d = w->d;
    struct integrity *g = d->integrity;

    if (j->rc)
        LOG_WARN("integrity", "file checks: %s", j->err.msg);
    for (size_t i = 0; i < j->n; i++) {
        if (g && !d->stopping && j->rc == 0)
            apply(d, j->etags[i].s, &j->res[i]);
        cache_verify_list_free(&j->res[i].objs);
    }
    free(j->etags);
    free(j->res);
    free(j);
    if (g) {
        g->running = 0;
        post_check(d);
    }
}

static void post_check(shoald *d)
{
    struct integrity *g = d->integrity;
    check_job *j;
    size_t n;

    if (!g || g->running || g->nq == 0 || d->stopping || !d->workers)
        return;
    n = g->nq < INTEGRITY_BATCH ? g->nq : INTEGRITY_BATCH;
    if (!(j = calloc(1, sizeof *j)) || !(j->etags = malloc(n * sizeof *j->etags)) ||
        !(j->res = calloc(n, sizeof *j->res))) {
        if (j)
            free(j->etags);
        free(j);
        return;   /* the next commit tries again */
    }
    memcpy(j->etags, g->q, n * sizeof *j->etags);
    memmove(g->q, g->q + n, (g->nq - n) * sizeof *g->q);
    g->nq -= n;
    j->n = n;
    j->w.run = check_run;
    j->w.done = check_done;
    g->running = 1;
    g->n.checks++;
    work_post(d, &j->w);
}

int integrity_refused(shoald *d, const char *etag, shoal_err *err)
{
    struct integrity *g = d->integrity;
    for (size_t i = 0; g && i < g->nrc; i++)
        if (g->rc[i].refused && strcmp(g->rc[i].etag.s, etag) == 0)
            return shoal_err_set(err, SHOAL_ECORRUPT, "upstream sent bytes of %s that do not hash "
                                 "to its etag %u times: refused until shoald restarts (check the "
                                 "upstream or mirror; `shoal verify --deep` names the file)",
                                 g->rc[i].path, g->rc[i].n + 1);
    return 0;
}

/* ---- damaged objects a client read --------------------------------------------------- */

int integrity_damaged(shoald *d, model *m, const shoal_json *list, shoal_err *err)
{
    size_t n = shoal_json_array_size(list);
    if (n > DAEMON_INTEGRITY_DAMAGED_MAX)
        return shoal_err_set(err, SHOAL_ETOOBIG, "REPORT: at most %d damaged objects per report",
                             DAEMON_INTEGRITY_DAMAGED_MAX);
    for (size_t i = 0; i < n; i++) {
        const shoal_json *o = shoal_json_array_at(list, i);
        int64_t layer = -1, expert = -1;
        const char *name = NULL;
        char etag[CACHE_ETAG_MAX + 1];
        shoal_key k;
        objref r;
        memset(&k, 0, sizeof k);
        const char *kn = shoal_json_get(o, "tensor") ? "tensor" : shoal_json_get(o, "file")
                         ? "file" : shoal_json_get(o, "derived") ? "derived" : NULL;
        if (kn) {
            /* a spine tensor, a small file, or a derived object (the spine pack) */
            k.kind = kn[0] == 't' ? SHOAL_KEY_TENSOR : kn[0] == 'f' ? SHOAL_KEY_FILE
                                                                    : SHOAL_KEY_DERIVED;
            name = shoal_json_str_value(shoal_json_get(o, kn));
            if (!name || !*name || strlen(name) > SHOAL_PROTO_MAX_STR)
                return shoal_err_set(err, SHOAL_EINVAL, "REPORT: \"damaged\" names a tensor, file or "
                                     "derived object by a string of 1-%d bytes",
                                     SHOAL_PROTO_MAX_STR);
            k.name = name;
            k.name_len = (uint16_t)strlen(name);
            int rc = k.kind != SHOAL_KEY_DERIVED
                         ? model_key_resolve(m, &k, &r, err)
                         : derived_resolve(d, m, &k, &r, etag, sizeof etag, err);
            if (rc == SHOAL_ENOTFOUND && k.kind == SHOAL_KEY_DERIVED) {
                shoal_err_clear(err);   /* not cached any more */
                continue;
            }
            if (rc != 0)
                return rc;
        } else {
            if (shoal_json_int(o, "layer", &layer, err) != 0 ||
                shoal_json_int(o, "expert", &expert, err) != 0 || layer < 0 || expert < 0 ||
                layer > UINT16_MAX || expert > UINT32_MAX)
                return shoal_err_set(err, SHOAL_EINVAL, "REPORT: \"damaged\" lists objects as "
                                     "{\"layer\":L,\"expert\":E}, {\"tensor\":NAME}, "
                                     "{\"file\":NAME} or {\"derived\":NAME}");
            k.kind = SHOAL_KEY_EXPERT;
            k.layer = (uint16_t)layer;
            k.expert = (uint32_t)expert;
            if (model_key_resolve(m, &k, &r, err) != 0)
                return err ? err->code : SHOAL_ENOTFOUND;
        }
        /* The client read bytes that do not hash to the index's XXH3-128:
         * the blob is damaged (disk, or a writer behind shoald's back).
         * Removed, it is fetched again by the next GET. */
        if (cache_remove(d->cache, &r.key, err) == 0) {
            if (name)
                LOG_ERROR("integrity", "%s %s %s: a client read bytes that do not match the "
                          "object's checksum: removed, %s", m->spec,
                          kn, name, k.kind != SHOAL_KEY_DERIVED ? "fetched again when next asked "
                          "for" : "the client makes it again");
            else
                LOG_ERROR("integrity", "%s layer %lld expert %lld: a client read bytes that do "
                          "not match the object's checksum: removed, fetched again when next "
                          "asked for", m->spec, (long long)layer, (long long)expert);
            if (d->integrity)
                d->integrity->n.damaged++;
        } else if (err && err->code == SHOAL_ENOTFOUND) {
            shoal_err_clear(err);   /* removed already (another reader, evicted) */
            peer_damaged(d, m, &r); /* or read in place from the HF cache */
        } else {
            return err ? err->code : SHOAL_EIO;
        }
    }
    return 0;
}

/* ---- start, stop, figures -------------------------------------------------------------- */

int integrity_init(shoald *d, shoal_err *err)
{
    if (!(d->integrity = calloc(1, sizeof *d->integrity)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    cache_set_commit_hook(d->cache, on_commit, d);
    return 0;
}

void integrity_shutdown(shoald *d)
{
    struct integrity *g = d->integrity;
    if (!g)
        return;
    if (d->cache)
        cache_set_commit_hook(d->cache, NULL, NULL);
    free(g->q);
    free(g->rc);
    free(g);
    d->integrity = NULL;
}

void integrity_get(const shoald *d, integrity_counts *out)
{
    memset(out, 0, sizeof *out);
    if (!d->integrity)
        return;
    *out = d->integrity->n;
    out->queued = d->integrity->nq;
    out->running = (unsigned)d->integrity->running;
}
