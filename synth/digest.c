/* digest.c — sha256 (and git blob sha1) of synthesized files.
 *
 * Owns: hashing a file (or a prefix of it) through synth_read in 4 MiB
 * chunks, running many such jobs on worker threads, the probe fingerprint,
 * and the committed table of the full k3 preset's digests
 * (synth/k3_etags.inc, written by `mkmodel --preset k3 --print-etags`).
 * Does not own where digests are cached between runs (tools/hubmock).
 *
 * Hashing the full K3 (1.56 TB) is bounded by SHA-256 (~1.6 GB/s a core
 * with SHA-NI): about 10-20 minutes on two cores, which is why the table
 * is committed and hubmock keeps a cache file.
 */
#include "synth/synth_int.h"
#include "common/platform.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

#define DIGEST_CHUNK (4u << 20)
#define PROBE_PART   (1u << 20)

static void hex(const unsigned char *p, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[p[i] >> 4];
        out[2 * i + 1] = d[p[i] & 15];
    }
    out[2 * n] = '\0';
}

/* Feed bytes [off, off+len) of a file to the contexts (c1 may be NULL). */
static int digest_range(const synth_model *m, size_t file, uint64_t off, uint64_t len,
                        uint8_t *buf, EVP_MD_CTX *c256, EVP_MD_CTX *c1, uint64_t *progress)
{
    while (len > 0) {
        size_t k = len < DIGEST_CHUNK ? (size_t)len : DIGEST_CHUNK;
        int rc = synth_read(m, file, off, k, buf);
        if (rc)
            return rc;
        if (!EVP_DigestUpdate(c256, buf, k) || (c1 && !EVP_DigestUpdate(c1, buf, k)))
            return SHOAL_EINTERNAL;
        off += k;
        len -= k;
        if (progress)
            __atomic_add_fetch(progress, k, __ATOMIC_RELAXED);
    }
    return 0;
}

static int digest_file(const synth_model *m, size_t file, uint64_t len, int want_sha1,
                       synth_digest *out, uint64_t *progress, shoal_err *err)
{
    EVP_MD_CTX *c256 = EVP_MD_CTX_new(), *c1 = want_sha1 ? EVP_MD_CTX_new() : NULL;
    uint8_t *buf = malloc(DIGEST_CHUNK);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    char blob[64];
    int rc = 0;

    memset(out, 0, sizeof *out);
    if (!c256 || !buf || (want_sha1 && !c1)) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory hashing %s",
                           synth_file_name(m, file));
        goto out;
    }
    if (len > synth_file_size(m, file)) {
        rc = shoal_err_set(err, SHOAL_ERANGE, "%s has %llu bytes, not %llu",
                           synth_file_name(m, file), (unsigned long long)synth_file_size(m, file),
                           (unsigned long long)len);
        goto out;
    }
    snprintf(blob, sizeof blob, "blob %llu", (unsigned long long)len);
    if (!EVP_DigestInit_ex(c256, EVP_sha256(), NULL) ||
        (c1 && (!EVP_DigestInit_ex(c1, EVP_sha1(), NULL) ||
                !EVP_DigestUpdate(c1, blob, strlen(blob) + 1)))) {
        rc = shoal_err_set(err, SHOAL_EINTERNAL, "digest init failed");
        goto out;
    }
    if ((rc = digest_range(m, file, 0, len, buf, c256, c1, progress))) {
        shoal_err_set(err, rc, "hashing %s: %s", synth_file_name(m, file), shoal_strerror(rc));
        goto out;
    }
    EVP_DigestFinal_ex(c256, md, &mdlen);
    hex(md, mdlen, out->sha256);
    if (c1) {
        EVP_DigestFinal_ex(c1, md, &mdlen);
        hex(md, mdlen, out->sha1);
    }
out:
    EVP_MD_CTX_free(c256);
    EVP_MD_CTX_free(c1);
    free(buf);
    return rc;
}

int synth_digest_file(const synth_model *m, size_t file, uint64_t len, int want_sha1,
                      synth_digest *out, shoal_err *err)
{
    return digest_file(m, file, len, want_sha1, out, NULL, err);
}

int synth_probe(const synth_model *m, size_t file, char out[65], shoal_err *err)
{
    uint64_t size = synth_file_size(m, file), mid = (size / 2) & ~(uint64_t)4095;
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    uint8_t *buf = malloc(DIGEST_CHUNK);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int rc = 0;

    if (!c || !buf || !EVP_DigestInit_ex(c, EVP_sha256(), NULL)) {
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        goto out;
    }
    if (size < 3 * PROBE_PART)
        rc = digest_range(m, file, 0, size, buf, c, NULL, NULL);
    else if (!(rc = digest_range(m, file, 0, PROBE_PART, buf, c, NULL, NULL)) &&
             !(rc = digest_range(m, file, mid, PROBE_PART, buf, c, NULL, NULL)))
        rc = digest_range(m, file, size - PROBE_PART, PROBE_PART, buf, c, NULL, NULL);
    if (rc) {
        shoal_err_set(err, rc, "probing %s: %s", synth_file_name(m, file), shoal_strerror(rc));
        goto out;
    }
    EVP_DigestFinal_ex(c, md, &mdlen);
    hex(md, mdlen, out);
out:
    EVP_MD_CTX_free(c);
    free(buf);
    return rc;
}

int synth_header_sha256(const synth_model *m, size_t file, char out[65], shoal_err *err)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    uint8_t *buf = malloc(DIGEST_CHUNK);
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    int rc = 0;

    out[0] = '\0';
    if (!c || !buf || !EVP_DigestInit_ex(c, EVP_sha256(), NULL))
        rc = shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    else if (synth_file_is_shard(m, file) &&
             (rc = digest_range(m, file, 0, synth_file_header_size(m, file), buf, c, NULL, NULL)))
        shoal_err_set(err, rc, "hashing the header of %s", synth_file_name(m, file));
    else if (synth_file_is_shard(m, file)) {
        EVP_DigestFinal_ex(c, md, &mdlen);
        hex(md, mdlen, out);
    }
    EVP_MD_CTX_free(c);
    free(buf);
    return rc;
}

/* ---- worker threads ----------------------------------------------------- */

typedef struct pool {
    pthread_mutex_t   mu;
    pthread_cond_t    cv;
    synth_digest_job *jobs;
    size_t           *order;       /* job indices, biggest first */
    size_t            n, next;
    int               running;
    uint64_t          done_bytes;  /* atomic */
    int               rc;
    shoal_err        *err;
} pool;

static void *pool_worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        size_t j;
        pthread_mutex_lock(&p->mu);
        if (p->next == p->n || p->rc) {
            p->running--;
            pthread_cond_broadcast(&p->cv);
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        j = p->order[p->next++];
        pthread_mutex_unlock(&p->mu);
        synth_digest_job *job = &p->jobs[j];
        shoal_err e = { 0 };
        job->rc = digest_file(job->m, job->file, job->len, job->want_sha1, &job->out,
                              &p->done_bytes, &e);
        if (job->rc) {
            pthread_mutex_lock(&p->mu);
            if (!p->rc) {
                p->rc = job->rc;
                *p->err = e;
            }
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static int job_cmp(const void *a, const void *b, void *arg)
{
    const synth_digest_job *jobs = arg;
    uint64_t x = jobs[*(const size_t *)a].len, y = jobs[*(const size_t *)b].len;
    return x > y ? -1 : x < y;
}

int synth_digest_run(synth_digest_job *jobs, size_t n, int threads, synth_progress_fn progress,
                     void *ctx, shoal_err *err)
{
    pool p;
    pthread_t *tid = NULL;
    uint64_t total = 0;
    int started = 0;

    if (n == 0)
        return 0;
    memset(&p, 0, sizeof p);
    p.jobs = jobs;
    p.n = n;
    p.err = err;
    p.order = malloc(n * sizeof *p.order);
    tid = calloc((size_t)(threads > 0 ? threads : 1), sizeof *tid);
    if (!p.order || !tid) {
        free(p.order);
        free(tid);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        p.order[i] = i;
        total += jobs[i].len;
    }
    shoal_qsort_r(p.order, n, sizeof *p.order, job_cmp, jobs);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    pthread_mutex_lock(&p.mu);
    for (int i = 0; i < (threads > 0 ? threads : 1) && (size_t)i < n; i++)
        if (pthread_create(&tid[i], NULL, pool_worker, &p) == 0) {
            started++;
            p.running++;
        }
    if (started == 0) {
        pthread_mutex_unlock(&p.mu);
        p.rc = shoal_err_set(err, SHOAL_EINTERNAL, "cannot start a hashing thread");
        goto out;
    }
    while (p.running > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&p.cv, &p.mu, &ts);
        if (progress && p.running > 0) {
            pthread_mutex_unlock(&p.mu);
            progress(ctx, __atomic_load_n(&p.done_bytes, __ATOMIC_RELAXED), total);
            pthread_mutex_lock(&p.mu);
        }
    }
    pthread_mutex_unlock(&p.mu);
out:
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
    free(tid);
    free(p.order);
    return p.rc;
}

/* ---- the committed table -------------------------------------------------- */

#define SYNTH_KNOWN_ROW(file, size, sha256, sha1, probe, header) \
    { file, size, sha256, sha1, probe, header },
static const synth_known known_rows[] = {
#include "synth/k3_etags.inc"
    { NULL, 0, NULL, NULL, NULL, NULL }
};

const synth_known *synth_known_table(size_t *n)
{
    *n = sizeof known_rows / sizeof known_rows[0] - 1;
    return *n ? known_rows : NULL;
}

const char *synth_known_key(void)
{
    return SYNTH_KNOWN_KEY;
}

const char *synth_known_family(void)
{
    return SYNTH_KNOWN_FAMILY;
}

static int known_take(const synth_known *k, synth_digest *out)
{
    snprintf(out->sha256, sizeof out->sha256, "%s", k->sha256);
    snprintf(out->sha1, sizeof out->sha1, "%s", k->sha1);
    return 1;
}

int synth_known_digest(const synth_model *m, size_t file, uint64_t len, synth_digest *out)
{
    size_t n;
    const synth_known *k = synth_known_table(&n);
    char hdr[65] = "";

    if (len != synth_file_size(m, file))
        return 0;
    if (strcmp(synth_model_key(m), SYNTH_KNOWN_KEY) == 0) {
        for (size_t i = 0; i < n; i++)
            if (k[i].size == len && strcmp(k[i].file, synth_file_name(m, file)) == 0)
                return known_take(&k[i], out);
        return 0;
    }
    if (!synth_file_is_shard(m, file) || strcmp(synth_model_family(m), SYNTH_KNOWN_FAMILY) != 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i].size != len || !k[i].header[0])
            continue;
        if (!hdr[0] && synth_header_sha256(m, file, hdr, &(shoal_err){ 0 }) != 0)
            return 0;
        if (strcmp(hdr, k[i].header) == 0)
            return known_take(&k[i], out);
    }
    return 0;
}
