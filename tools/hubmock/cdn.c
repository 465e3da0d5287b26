/* cdn.c — the CDN port: signed, expiring, content-addressed URLs and ranges.
 *
 * Owns: making and checking the signed URLs the Hub port redirects to,
 * Range parsing and the 200/206/416 answers (also used by the Hub port for
 * small files) for files on disk and synthesized ones alike, and deciding
 * the CDN body faults per request.  Does not own sending (http.c).
 *
 * URL form, like cas-bridge.xethub.hf.co:
 *   /xet-bridge-us/<24 hex of sha1(repo id)>/<sha256>?Expires=<epoch>&Signature=<64 hex>
 * Signature = sha256(secret || path || "\n" || Expires).  Expired (now >
 * Expires) or a bad signature -> 403 with an S3-style XML body.  The CDN
 * never asks for a token; a request that carries one is logged with auth.
 */
#include "tools/hubmock/hubmock_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

#include "common/path.h"

#define CDN_PREFIX "/xet-bridge-us/"

static void cdn_sign(const hm_server *s, const char *path, long long expires, char out[65])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    char exp[32];
    EVP_MD_CTX *c = EVP_MD_CTX_new();

    snprintf(exp, sizeof exp, "\n%lld", expires);
    EVP_DigestInit_ex(c, EVP_sha256(), NULL);
    EVP_DigestUpdate(c, s->secret, sizeof s->secret);
    EVP_DigestUpdate(c, path, strlen(path));
    EVP_DigestUpdate(c, exp, strlen(exp));
    EVP_DigestFinal_ex(c, md, &n);
    EVP_MD_CTX_free(c);
    for (unsigned int i = 0; i < 32; i++) {
        out[2 * i] = digits[md[i] >> 4];
        out[2 * i + 1] = digits[md[i] & 15];
    }
    out[64] = '\0';
}

void hm_cdn_url(hm_server *s, const hm_repo *repo, const hm_file *f, char *out, size_t cap)
{
    char path[256], sig[65];
    long long expires = (long long)time(NULL) + (long long)s->faults.cdn_ttl;

    snprintf(path, sizeof path, CDN_PREFIX "%s/%s", repo->bucket, f->sha256);
    cdn_sign(s, path, expires, sig);
    snprintf(out, cap, "http://127.0.0.1:%d%s?Expires=%lld&Signature=%s", s->cdn_port, path,
             expires, sig);
}

/* 1: one satisfiable range [*a, *b]; 0: no usable Range (serve all);
 * -1: syntactically fine but unsatisfiable. */
static int range_parse(const char *h, uint64_t total, uint64_t *a, uint64_t *b)
{
    char *end;
    unsigned long long x, y;

    if (!h || strncmp(h, "bytes=", 6) != 0 || strchr(h, ','))
        return 0;   /* multi-range is not served: answer the whole file */
    h += 6;
    if (*h == '-') {
        errno = 0;
        y = strtoull(h + 1, &end, 10);
        if (errno || end == h + 1 || *end)
            return 0;
        if (y == 0 || total == 0)
            return -1;
        *a = y >= total ? 0 : total - y;
        *b = total - 1;
        return 1;
    }
    errno = 0;
    x = strtoull(h, &end, 10);
    if (errno || end == h || *end != '-')
        return 0;
    h = end + 1;
    if (*h == '\0') {
        y = total ? total - 1 : 0;
    } else {
        y = strtoull(h, &end, 10);
        if (errno || *end || *h == '-')
            return 0;
        if (y < x)
            return 0;
    }
    if (x >= total)
        return -1;
    *a = x;
    *b = y >= total ? total - 1 : y;
    return 1;
}

void hm_serve_file(hm_response *res, const hm_snapshot *snap, const hm_file *f,
                   const char *range, int ignore_range)
{
    uint64_t a = 0, b = 0;
    int k = ignore_range ? 0 : range_parse(range, f->size, &a, &b);

    if (k < 0) {
        res->status = 416;
        hm_response_header(res, "Content-Range", "bytes */%llu", (unsigned long long)f->size);
        return;
    }
    hm_response_header(res, "Accept-Ranges", "bytes");
    if (snap->synth) {
        res->body = HM_BODY_SYNTH;
        res->synth = snap->synth;
        res->synth_file = f->synth_file;
    } else if (shoal_path_join(res->file_path, sizeof res->file_path, snap->dir, f->path)) {
        hm_response_error(res, 500, NULL, "path too long");
        return;
    } else {
        res->body = HM_BODY_FILE;
    }
    if (k == 1) {
        res->status = 206;
        res->file_off = a;
        res->file_len = b - a + 1;
        hm_response_header(res, "Content-Range", "bytes %llu-%llu/%llu", (unsigned long long)a,
                           (unsigned long long)b, (unsigned long long)f->size);
    } else {
        res->status = 200;
        res->file_off = 0;
        res->file_len = f->size;
    }
}

static void cdn_forbidden(hm_response *res, const char *code, const char *msg)
{
    res->status = 403;
    hm_response_header(res, "Content-Type", "application/xml");
    shoal_buf_appendf(&res->mem,
                      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"
                      "<Message>%s</Message></Error>\n", code, msg);
}

/* Decide the body faults for a file answer.  Every draw is made whatever
 * the rates, so the sequence depends only on the order of requests. */
static void cdn_body_faults(hm_server *s, const hm_request *req, hm_response *res,
                            int *ignore_range)
{
    const hm_faults *f = &s->faults;
    int reset = hm_rng_chance(&s->rng, f->rate_reset);
    int trunc = hm_rng_chance(&s->rng, f->rate_truncate);
    int ign = hm_rng_chance(&s->rng, f->rate_ignore_range);
    int stall = hm_rng_chance(&s->rng, f->rate_stall);
    int corrupt = hm_rng_chance(&s->rng2, f->rate_corrupt);

    *ignore_range = ign && req->range != NULL;
    if (*ignore_range)
        hm_response_fault(res, "ignore_range");
    if (stall && f->stall_secs > 0) {
        if (f->stall_at == HM_STALL_MID)
            res->stall_mid = f->stall_secs;
        else
            res->stall_before = f->stall_secs;
        hm_response_fault(res, f->stall_at == HM_STALL_MID ? "stall_mid" : "stall");
    }
    if (reset) {
        res->cut_after = f->reset_after;   /* 0: half the body, fixed up below */
        res->cut_reset = 1;
        hm_response_fault(res, "reset");
    } else if (trunc) {
        res->cut_after = f->truncate_after;
        res->cut_reset = 0;
        hm_response_fault(res, "truncate");
    }
    if (f->bw > 0) {
        res->bw = f->bw;
        hm_response_fault(res, "bw");
    }
    if (corrupt && s->faults.corrupt_count > 0 && --s->faults.corrupt_count == 0)
        s->faults.rate_corrupt = 0;   /* that was the last one asked for */
    if (corrupt) {
        res->corrupt = f->corrupt_mode;
        if (f->corrupt_mode == HM_CORRUPT_DRIFT)
            res->corrupt_seq = s->drift_seq++;
        hm_response_fault(res, f->corrupt_mode == HM_CORRUPT_ONE   ? "corrupt_one"
                               : f->corrupt_mode == HM_CORRUPT_ALL ? "corrupt_all"
                                                                   : "corrupt_drift");
    }
    if (f->drip_secs > 0) {
        res->drip = f->drip_secs;
        hm_response_fault(res, "drip");
    }
}

void hm_cdn_handle(hm_server *s, const hm_request *req, hm_response *res)
{
    char sha[65], bucket[25], path[256], sig[65];
    char *exp_s = NULL, *sig_s = NULL, *end;
    const hm_snapshot *snap = NULL;
    const hm_file *f;
    long long expires;
    int ignore_range = 0;
    const char *p = req->path;

    if (hm_faults_status(s, HM_PORT_CDN, res))
        return;
    if (strncmp(p, CDN_PREFIX, strlen(CDN_PREFIX)) != 0 || strlen(p) != strlen(CDN_PREFIX) + 24 + 1 + 64
        || p[strlen(CDN_PREFIX) + 24] != '/') {
        res->status = 404;
        hm_response_header(res, "Content-Type", "application/xml");
        shoal_buf_append_str(&res->mem, "<Error><Code>NoSuchKey</Code></Error>\n");
        return;
    }
    memcpy(bucket, p + strlen(CDN_PREFIX), 24);
    bucket[24] = '\0';
    memcpy(sha, p + strlen(CDN_PREFIX) + 25, 64);
    sha[64] = '\0';
    exp_s = hm_query_get(req->query, "Expires");
    sig_s = hm_query_get(req->query, "Signature");
    if (!exp_s || !sig_s) {
        cdn_forbidden(res, "AccessDenied", "Missing Key-Pair-Id query parameter or cookie value");
        goto out;
    }
    errno = 0;
    expires = strtoll(exp_s, &end, 10);
    snprintf(path, sizeof path, "%s", p);
    cdn_sign(s, path, expires, sig);
    if (errno || *end || strcmp(sig, sig_s) != 0) {
        cdn_forbidden(res, "AccessDenied", "Invalid signature");
        goto out;
    }
    if ((long long)time(NULL) > expires) {
        cdn_forbidden(res, "AccessDenied", "Request has expired");
        goto out;
    }
    f = hm_repos_blob(&s->repos, sha, &snap);
    if (!f) {
        res->status = 404;
        hm_response_header(res, "Content-Type", "application/xml");
        shoal_buf_append_str(&res->mem, "<Error><Code>NoSuchKey</Code></Error>\n");
        goto out;
    }
    cdn_body_faults(s, req, res, &ignore_range);
    hm_serve_file(res, snap, f, req->range, ignore_range);
    if (res->status == 200 || res->status == 206) {
        hm_response_header(res, "Content-Type", "application/octet-stream");
        hm_response_header(res, "ETag", "\"%s\"", f->sha256);
        hm_response_header(res, "Cache-Control", "public, max-age=604800, immutable");
        if (res->cut_after == 0)
            res->cut_after = res->file_len / 2;
    } else {
        res->cut_after = HM_NONE;
        res->stall_mid = 0;
        res->corrupt = HM_CORRUPT_NONE;
        res->drip = 0;
    }
out:
    free(exp_s);
    free(sig_s);
}
