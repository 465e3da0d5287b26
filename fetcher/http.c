/* http.c — response headers, the strict range check, error mapping and
 * request headers shared by every HTTP path of the fetcher (http_int.h).
 */
#include "fetcher/http_int.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/version.h"

static void hdr_copy(char *dst, size_t cap, const char *v, size_t n, int *too_long)
{
    if (n >= cap) {
        *too_long = 1;
        n = cap - 1;
    }
    memcpy(dst, v, n);
    dst[n] = '\0';
}

void http_headers_line(http_headers *h, const char *data, size_t len)
{
    size_t nlen, vlen;
    const char *colon, *v;

    if (len >= 5 && strncmp(data, "HTTP/", 5) == 0) {
        memset(h, 0, sizeof *h);
        return;
    }
    colon = memchr(data, ':', len);
    if (!colon)
        return;
    nlen = (size_t)(colon - data);
    v = colon + 1;
    vlen = len - nlen - 1;
    while (vlen > 0 && (*v == ' ' || *v == '\t')) {
        v++;
        vlen--;
    }
    while (vlen > 0 && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n' || v[vlen - 1] == ' '))
        vlen--;
#define HDR(name, field) \
    if (nlen == sizeof name - 1 && strncasecmp(data, name, nlen) == 0) \
        hdr_copy(h->field, sizeof h->field, v, vlen, &h->too_long)
    HDR("X-Repo-Commit", commit);
    else HDR("X-Linked-Etag", linked_etag);
    else HDR("ETag", etag);
    else HDR("X-Linked-Size", linked_size);
    else HDR("Content-Length", content_length);
    else HDR("Content-Range", content_range);
    else HDR("Location", location);
    else HDR("X-Error-Code", error_code);
    else if (nlen == 15 && strncasecmp(data, "X-Error-Message", 15) == 0) {
        int ignore = 0;   /* a long message is cut, not an error */
        hdr_copy(h->error_message, sizeof h->error_message, v, vlen, &ignore);
    }
    else HDR("Retry-After", retry_after);
    else HDR("RateLimit", ratelimit);
#undef HDR
}

int http_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;
    if (!isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

long http_wait_hint(const http_headers *h)
{
    const char *t = strstr(h->ratelimit, "t=");
    uint64_t v;
    if (t) {
        char num[32];
        size_t n = strspn(t + 2, "0123456789");
        if (n > 0 && n < 10) {
            memcpy(num, t + 2, n);
            num[n] = '\0';
            if (http_parse_u64(num, &v) == 0)
                return (long)v;
        }
    }
    if (strlen(h->retry_after) < 10 && http_parse_u64(h->retry_after, &v) == 0)
        return (long)v;
    return -1;
}

int http_etag_clean(const char *in, char *out, size_t cap)
{
    size_t n;
    if (strncmp(in, "W/", 2) == 0)
        in += 2;
    n = strlen(in);
    if (n >= 2 && in[0] == '"' && in[n - 1] == '"') {
        in++;
        n -= 2;
    }
    if (n == 0 || n >= cap)
        return -1;
    memcpy(out, in, n);
    out[n] = '\0';
    return 0;
}

int http_is_commit(const char *s)
{
    size_t i;
    for (i = 0; s[i]; i++)
        if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
            return 0;
    return i == 40;
}

int http_range_check(long status, const http_headers *h, uint64_t first, uint64_t last,
                     uint64_t total, shoal_err *err)
{
    char want[128];
    uint64_t cl;

    if (status == 200)
        return shoal_err_set(err, SHOAL_EPROTO,
                             "GET bytes=%" PRIu64 "-%" PRIu64 ": the server ignored the Range "
                             "and answered 200 with the whole file; refused", first, last);
    if (status != 206)
        return 1;
    snprintf(want, sizeof want, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, first, last, total);
    if (strcmp(h->content_range, want) != 0)
        return shoal_err_set(err, SHOAL_EPROTO,
                             "GET bytes=%" PRIu64 "-%" PRIu64 ": Content-Range '%s', "
                             "expected '%s'; refused", first, last, h->content_range, want);
    if (http_parse_u64(h->content_length, &cl) != 0 || cl != last - first + 1)
        return shoal_err_set(err, SHOAL_EPROTO,
                             "GET bytes=%" PRIu64 "-%" PRIu64 ": Content-Length '%s', expected %"
                             PRIu64 "; refused", first, last, h->content_length, last - first + 1);
    return 0;
}

int http_status_error(int st, const http_headers *h, const char *endpoint, int has_token,
                      const char *url, const char *repo, const char *rev, const char *file,
                      shoal_err *err)
{
    const char *code = h->error_code, *msg = h->error_message[0] ? h->error_message : "no message";
    long wait = http_wait_hint(h);

    if (strcmp(code, "GatedRepo") == 0)
        return shoal_err_set(err, SHOAL_EAUTH,
                             "model %s is gated (HTTP %d): set HF_TOKEN to a token of an account "
                             "that has accepted the licence on the model page %s/%s (hub: %s)",
                             repo ? repo : "?", st, endpoint, repo ? repo : "", msg);
    if (strcmp(code, "RepoNotFound") == 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND,
                             "repository %s not found on %s: check the name; a private repo "
                             "needs HF_TOKEN (hub: %s)", repo ? repo : "?", endpoint, msg);
    if (strcmp(code, "RevisionNotFound") == 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND,
                             "revision '%s' not found in %s: check the branch, tag or commit "
                             "(hub: %s)", rev ? rev : "?", repo ? repo : "?", msg);
    if (strcmp(code, "EntryNotFound") == 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND,
                             "file '%s' not found in %s at revision '%s'%s%s (hub: %s)",
                             file ? file : "?", repo ? repo : "?", rev ? rev : "?",
                             h->commit[0] ? ", commit " : "", h->commit, msg);
    if (st == 401)
        return shoal_err_set(err, SHOAL_EAUTH, "%s: HTTP 401 (%s): %s", url, msg,
                             has_token ? "the token in HF_TOKEN was refused; check it"
                                       : "this needs a token; set HF_TOKEN");
    if (st == 403)
        return shoal_err_set(err, SHOAL_EAUTH, "%s: HTTP 403 (%s): %s", url, msg,
                             repo ? "access denied; check the token's permissions"
                                  : "the CDN refused the signed URL (expired?); resolve the file again");
    if (st == 404)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "%s: HTTP 404 (%s)", url, msg);
    if ((st == 429 || st == 503) && wait >= 0)
        return shoal_err_set(err, SHOAL_EBUSY, "%s: HTTP %d (%s); retry after %ld s", url, st, msg,
                             wait);
    if (st == 429 || st == 503)
        return shoal_err_set(err, SHOAL_EBUSY, "%s: HTTP %d (%s); retry later", url, st, msg);
    if (st == 416)
        return shoal_err_set(err, SHOAL_ERANGE, "%s: HTTP 416, server has Content-Range '%s'", url,
                             h->content_range);
    return shoal_err_set(err, st >= 500 || st == 408 ? SHOAL_ENET : SHOAL_EPROTO,
                         "%s: unexpected HTTP %d (%s)", url, st, msg);
}

int http_status_retryable(long st)
{
    return st == 408 || st == 429 || (st >= 500 && st <= 599);
}

int http_curl_unreachable(CURLcode cc)
{
    return cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST
           || cc == CURLE_COULDNT_RESOLVE_PROXY;
}

int http_curl_code_map(CURLcode cc)
{
    switch (cc) {
    case CURLE_OPERATION_TIMEDOUT: return SHOAL_ETIMEOUT;
    case CURLE_PARTIAL_FILE:       return SHOAL_EPROTO;
    /* libcurl 7.x says "Out of memory" for a header past CURL_MAX_HTTP_HEADER:
     * a property of the answer, not worth retrying, and not our memory */
    case CURLE_OUT_OF_MEMORY:      return SHOAL_ETOOBIG;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL: return SHOAL_EINVAL;
    default:                       return SHOAL_ENET;
    }
}

const char *http_curl_strerror(CURLcode cc, const char *errbuf)
{
    if (cc == CURLE_OUT_OF_MEMORY
#if LIBCURL_VERSION_NUM >= 0x080600
        || cc == CURLE_TOO_LARGE
#endif
       )
        return "the answer's header is too large (a header line over libcurl's 100 KB limit; "
               "libcurl says \"Out of memory\"): the server or a proxy in between sent it";
    return errbuf && errbuf[0] ? errbuf : curl_easy_strerror(cc);
}

void http_user_agent(char *out, size_t cap)
{
    snprintf(out, cap, "shoal/%s; libcurl/%s", SHOAL_VERSION,
             curl_version_info(CURLVERSION_NOW)->version);
}

struct curl_slist *http_request_headers(const char *url, const char *endpoint,
                                        const char *auth_line, int *sent_token)
{
    struct curl_slist *hl = curl_slist_append(NULL, "Accept-Encoding: identity"), *t;
    *sent_token = 0;
    if (hl && auth_line && hub_url_same_origin(url, endpoint)) {
        t = curl_slist_append(hl, auth_line);
        if (!t) {
            curl_slist_free_all(hl);
            return NULL;
        }
        hl = t;
        *sent_token = 1;
    }
    return hl;
}

/* Value of query parameter `key` into out, or -1. */
static int query_param(const char *url, const char *key, char *out, size_t cap)
{
    const char *q = strchr(url, '?');
    size_t kl = strlen(key);
    while (q) {
        q++;
        if (strncmp(q, key, kl) == 0 && q[kl] == '=') {
            const char *v = q + kl + 1;
            size_t n = strcspn(v, "&#");
            if (n == 0 || n >= cap)
                return -1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 0;
        }
        q = strchr(q, '&');
    }
    return -1;
}

int64_t http_url_expiry_ms(const char *url)
{
    char v[32], d[32];
    uint64_t e;
    struct tm tm;

    if (query_param(url, "Expires", v, sizeof v) == 0 && http_parse_u64(v, &e) == 0
        && e < (uint64_t)INT64_MAX / 1000)
        return (int64_t)e * 1000;
    if (query_param(url, "X-Amz-Expires", v, sizeof v) == 0 && http_parse_u64(v, &e) == 0
        && e < 1000000000ull && query_param(url, "X-Amz-Date", d, sizeof d) == 0
        && strlen(d) == 16) {
        memset(&tm, 0, sizeof tm);
        if (sscanf(d, "%4d%2d%2dT%2d%2d%2dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
                   &tm.tm_min, &tm.tm_sec) == 6) {
            tm.tm_year -= 1900;
            tm.tm_mon -= 1;
            return ((int64_t)timegm(&tm) + (int64_t)e) * 1000;
        }
    }
    return 0;
}
