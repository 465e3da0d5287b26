/* synth_repo.c — synthesized repos: `--synth org/name=PRESET[,...]`.
 *
 * Owns: parsing the spec, building the model (synth/), finding every
 * file's etag, the deliberate breakages, and handing finished snapshots to
 * repo.c.  Does not own serving the bytes (http.c reads them through
 * synth_read) nor the cache file format (etag_cache.c).
 *
 * An etag is the sha256 of exactly the bytes served.  For each file, in
 * this order: the table committed for the full k3 preset
 * (synth/k3_etags.inc, when the generator version matches), the cache file,
 * else hashing — every missing file of every --synth repo in one pool of
 * worker threads, before the ports open; the results go to the cache file.
 *
 * Breakages (`bad=`), always on the first shard, model-00001-of-...:
 *   header  the file is served cut short: its header and the first
 *           min(data/2, 1 MiB) data bytes, so the header claims more bytes
 *           than the file holds (its etag and size are those of the cut
 *           file, as a truncated upload would have)
 *   sha     X-Linked-Etag (and the CDN URL and ETag) carry a valid-looking
 *           sha256 that is not the sha256 of the bytes: sha256 of
 *           "hubmock bad=sha " + the real one
 */
#include "tools/hubmock/hubmock_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/log.h"
#include "common/path.h"
#include "common/progress.h"

enum { BAD_NONE = 0, BAD_HEADER = 1, BAD_SHA = 2 };

struct hm_synth_pending {
    char   id[256], ref[256];
    synth_model *model;
    int    bad;
    long   bad_file;           /* the shard the breakage applies to */
    hm_snapshot *snap;         /* files filled, digests pending */
    struct hm_synth_pending *next;
};

static int parse_int(const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return -1;
    *out = x;
    return 0;
}

/* PRESET[,layers=N][,experts=N][,seed=N][,bad=header|sha] into cfg/bad. */
static int parse_options(char *opts, synth_config *cfg, int *bad, shoal_err *err)
{
    char *tok = opts, *next = strchr(opts, ',');
    long layers = 0, experts = 0, v;
    synth_preset p;

    if (next)
        *next++ = '\0';
    if (synth_preset_parse(tok, &p))
        return shoal_err_set(err, SHOAL_EINVAL, "--synth: unknown preset '%s' (tiny, slice, k3 or oracle)",
                             tok);
    synth_config_init(cfg, p);
    while ((tok = next)) {
        char *eq = strchr(tok, '=');
        if ((next = strchr(tok, ',')))
            *next++ = '\0';
        const char *val = eq ? eq + 1 : "";
        if (eq)
            *eq = '\0';
        if (!strcmp(tok, "layers") && !parse_int(val, 1, SYNTH_MAX_LAYERS, &v))
            layers = v;
        else if (!strcmp(tok, "experts") && !parse_int(val, 1, SYNTH_MAX_EXPERTS, &v))
            experts = v;
        else if (!strcmp(tok, "seed") && !parse_int(val, 0, INT64_MAX, &v))
            cfg->seed = (uint64_t)v;
        else if (!strcmp(tok, "bad") && (!strcmp(val, "header") || !strcmp(val, "sha")))
            *bad = !strcmp(val, "header") ? BAD_HEADER : BAD_SHA;
        else
            return shoal_err_set(err, SHOAL_EINVAL, "--synth: bad option '%s%s%s' (layers=1..%d, "
                                 "experts=1..%d, seed=N, bad=header|sha)", tok, eq ? "=" : "",
                                 val, SYNTH_MAX_LAYERS, SYNTH_MAX_EXPERTS);
    }
    return synth_config_finish(cfg, (int)layers, (int)experts, err);
}

/* The served size of file i: the breakage cuts the bad shard short. */
static uint64_t served_size(const hm_synth_pending *p, size_t i)
{
    uint64_t size = synth_file_size(p->model, i), hdr = synth_file_header_size(p->model, i);
    uint64_t cut = (size - hdr) / 2 < (1u << 20) ? (size - hdr) / 2 : (1u << 20);

    return p->bad == BAD_HEADER && (long)i == p->bad_file ? hdr + cut : size;
}

static int snapshot_skeleton(hm_synth_pending *p, uint64_t lfs_threshold, shoal_err *err)
{
    size_t n = synth_file_count(p->model);
    hm_snapshot *s = calloc(1, sizeof *s);

    if (!s || !(s->files = calloc(n, sizeof *s->files))) {
        free(s);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    s->synth = p->model;
    p->snap = s;
    for (size_t i = 0; i < n; i++) {
        hm_file *f = &s->files[s->nfiles];
        if (!(f->path = strdup(synth_file_name(p->model, i))))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        s->nfiles++;
        f->size = served_size(p, i);
        f->synth_file = i;
        f->is_lfs = hm_path_is_lfs(f->path, f->size, lfs_threshold);
    }
    return 0;
}

int hm_synth_parse(const char *spec, hm_synth_pending **list, shoal_err *err)
{
    const char *eq = strchr(spec, '='), *at;
    hm_synth_pending *p = calloc(1, sizeof *p), **tail;
    char opts[512];
    synth_config cfg;
    size_t idlen;
    int rc;

    if (!p)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    if (!eq || eq == spec || !eq[1] || strlen(eq + 1) >= sizeof opts) {
        free(p);
        return shoal_err_set(err, SHOAL_EINVAL, "--synth wants org/name[@REV]=PRESET[,layers=N]"
                             "[,experts=N][,seed=N][,bad=header|sha], got '%s'", spec);
    }
    at = memchr(spec, '@', (size_t)(eq - spec));
    idlen = (size_t)((at ? at : eq) - spec);
    snprintf(p->id, sizeof p->id, "%.*s", (int)idlen, spec);
    snprintf(p->ref, sizeof p->ref, "%.*s", at ? (int)(eq - at - 1) : 4, at ? at + 1 : "main");
    if (!strchr(p->id, '/') || strchr(strchr(p->id, '/') + 1, '/') || !p->ref[0]) {
        free(p);
        return shoal_err_set(err, SHOAL_EINVAL, "--synth: repo id must be org/name[@REV], "
                             "got '%.*s'", (int)(eq - spec), spec);
    }
    snprintf(opts, sizeof opts, "%s", eq + 1);
    if ((rc = parse_options(opts, &cfg, &p->bad, err)) ||
        (rc = synth_model_new(&cfg, &p->model, err))) {
        synth_model_free(p->model);
        free(p);
        return rc;
    }
    for (p->bad_file = 0; !synth_file_is_shard(p->model, (size_t)p->bad_file); p->bad_file++)
        ;                                     /* the first shard */
    for (tail = list; *tail; tail = &(*tail)->next)
        ;
    *tail = p;
    return 0;
}

void hm_synth_pending_free(hm_synth_pending *list)
{
    while (list) {
        hm_synth_pending *next = list->next;
        hm_snapshot_free(list->snap);
        synth_model_free(list->model);
        free(list);
        list = next;
    }
}

/* The valid-looking wrong sha256 of bad=sha. */
static void bad_sha(const char *real, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    char text[96];
    int len = snprintf(text, sizeof text, "hubmock bad=sha %s", real);

    EVP_Digest(text, (size_t)len, md, &n, EVP_sha256(), NULL);
    hm_hex(md, n, out);
}

/* Look every file up; collect the misses as jobs, one per distinct
 * (model key, file, size): two repos of one model hash it once.  file_job[k]
 * is the job of files[k] (or -1 when known).  Returns the job count. */
static size_t lookup(hm_synth_pending *list, const hm_etag_cache *cache, synth_digest_job *jobs,
                     hm_file **files, long *file_job)
{
    size_t nj = 0, nf = 0;
    for (hm_synth_pending *p = list; p; p = p->next)
        for (size_t i = 0; i < p->snap->nfiles; i++, nf++) {
            hm_file *f = &p->snap->files[i];
            const char *key = synth_model_key(p->model);
            synth_digest d;
            files[nf] = f;
            file_job[nf] = -1;
            if (synth_known_digest(p->model, i, f->size, &d) ||
                hm_etag_cache_get(cache, key, f->path, f->size, !f->is_lfs, &d)) {
                memcpy(f->sha256, d.sha256, sizeof f->sha256);
                memcpy(f->gitsha1, d.sha1, sizeof f->gitsha1);
                continue;
            }
            for (size_t j = 0; j < nj && file_job[nf] < 0; j++)
                if (jobs[j].file == i && jobs[j].len == f->size &&
                    strcmp(synth_model_key(jobs[j].m), key) == 0) {
                    file_job[nf] = (long)j;
                    jobs[j].want_sha1 |= !f->is_lfs;
                }
            if (file_job[nf] >= 0)
                continue;
            jobs[nj] = (synth_digest_job){ .m = p->model, .file = i, .len = f->size,
                                           .want_sha1 = !f->is_lfs };
            file_job[nf] = (long)nj++;
        }
    return nj;
}

static void hash_progress(void *ctx, uint64_t done, uint64_t total)
{
    shoal_meter_update(ctx, "hashed", done, total, NULL);
}

/* Hash the misses; store them in the snapshots and the cache. */
static int hash_missing(hm_synth_pending *list, hm_etag_cache *cache, int jobs,
                        shoal_meter *meter, shoal_err *err)
{
    size_t nf = 0, nj, known = 0;
    uint64_t bytes = 0;
    synth_digest_job *job;
    hm_file **files;
    long *file_job;
    int rc = 0;

    for (hm_synth_pending *p = list; p; p = p->next)
        nf += p->snap->nfiles;
    job = calloc(nf + 1, sizeof *job);
    files = calloc(nf + 1, sizeof *files);
    file_job = calloc(nf + 1, sizeof *file_job);
    if (!job || !files || !file_job) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto out;
    }
    nj = lookup(list, cache, job, files, file_job);
    for (size_t i = 0; i < nj; i++)
        bytes += job[i].len;
    for (size_t k = 0; k < nf; k++)
        known += file_job[k] < 0;
    LOG_INFO("hubmock", "synthesized files: %zu etags known (committed table or cache), %zu to hash",
             known, nj);
    if (bytes > ((uint64_t)4 << 30)) {
        char sz[32];
        fprintf(stderr, "hubmock: hashing %zu synthesized files (%s) on %d threads for their "
                "etags%s\n", nj, shoal_size_format(bytes, sz, sizeof sz), jobs,
                cache ? "; they are cached for the next start" : "");
    }
    /* the meter only for a long hash: a test's start stays quiet */
    if (bytes <= ((uint64_t)4 << 30))
        meter = NULL;
    if ((rc = synth_digest_run(job, nj, jobs, meter ? hash_progress : NULL, meter, err)))
        goto out;
    if (meter)
        shoal_meter_end(meter, NULL);
    for (size_t k = 0; k < nf; k++) {
        const synth_digest_job *j = file_job[k] >= 0 ? &job[file_job[k]] : NULL;
        if (!j)
            continue;
        memcpy(files[k]->sha256, j->out.sha256, sizeof files[k]->sha256);
        memcpy(files[k]->gitsha1, j->out.sha1, sizeof files[k]->gitsha1);
    }
    for (size_t i = 0; i < nj && cache && !rc; i++)
        rc = hm_etag_cache_put(cache, synth_model_key(job[i].m), synth_file_name(job[i].m, job[i].file),
                               job[i].len, &job[i].out);
    if (rc)
        shoal_err_set(err, rc, "out of memory");
    else if (cache && nj && (rc = hm_etag_cache_save(cache, err)))
        shoal_err_wrap(err, rc, "saving the etag cache: ");
out:
    free(job);
    free(files);
    free(file_job);
    return rc;
}

/* Apply bad=sha and the LFS pointer ETags, then hand the snapshot over. */
static int register_repo(hm_server *s, hm_synth_pending *p, shoal_err *err)
{
    hm_snapshot *snap = p->snap;
    hm_repos *rs = &s->repos;
    synth_model **nm = realloc(rs->models, (rs->nmodels + 1) * sizeof *nm);

    if (!nm)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    rs->models = nm;
    rs->models[rs->nmodels++] = p->model;    /* owned by the repos from here */
    p->model = NULL;
    for (size_t i = 0; i < snap->nfiles; i++) {
        hm_file *f = &snap->files[i];
        if (p->bad == BAD_SHA && (long)f->synth_file == p->bad_file) {
            char wrong[65];
            bad_sha(f->sha256, wrong);
            memcpy(f->sha256, wrong, sizeof f->sha256);
        }
        if (f->is_lfs)
            hm_lfs_pointer_sha1(f->sha256, f->size, f->gitsha1);
    }
    qsort(snap->files, snap->nfiles, sizeof *snap->files, hm_file_cmp);
    hm_snapshot_commit(snap);
    p->snap = NULL;                           /* hm_repos_put owns it, even on failure */
    return hm_repos_put(rs, p->id, p->ref, snap, err);
}

int hm_synth_finish(hm_server *s, hm_synth_pending *list, const char *cache_path, int jobs,
                    shoal_meter *meter, shoal_err *err)
{
    hm_etag_cache *cache = NULL;
    int rc = 0;

    if (!list)
        return 0;
    for (hm_synth_pending *p = list; p && !rc; p = p->next)
        rc = snapshot_skeleton(p, s->repos.lfs_threshold, err);
    if (!rc && cache_path && (rc = hm_etag_cache_load(cache_path, &cache, err)))
        shoal_err_wrap(err, rc, "etag cache: ");
    if (!rc)
        rc = hash_missing(list, cache, jobs > 0 ? jobs : 1, meter, err);
    for (hm_synth_pending *p = list; p && !rc; p = p->next)
        rc = register_repo(s, p, err);
    hm_etag_cache_free(cache);
    hm_synth_pending_free(list);
    return rc;
}
