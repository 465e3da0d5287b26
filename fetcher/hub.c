/* hub.c — blocking Hub client over one libcurl easy handle.
 *
 * Owns: spec parsing, resolve URLs, the resolve HEAD with manual redirects,
 * strict GETs, Hub error mapping, and the token's origin rule.  See hub.h
 * for the contract and specs/hf-hub.md for the protocol.
 *
 * Why by hand: with CURLOPT_FOLLOWLOCATION the X-Linked-* headers of the 302
 * are lost and the decision who sees the token is libcurl's.  So nothing is
 * followed automatically; relative redirects (small files, renamed repos)
 * are resolved with RFC 3986 rules by curl's URL parser (which keeps the
 * redirect's query) and followed here; an absolute one ends the resolve.
 * The Authorization header is added per request only when the request URL
 * has the endpoint's origin; CURLOPT_UNRESTRICTED_AUTH is never set.
 */
#include "fetcher/hub.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/log.h"
#include "common/sys.h"
#include "common/version.h"

#define HUB_MAX_HOPS 5

/* Headers of the current response that the client reads.  Reset at each
 * status line, so after a perform they belong to the last response. */
typedef struct hub_headers {
    char commit[64];
    char linked_etag[HUB_ETAG_MAX + 8];
    char etag[HUB_ETAG_MAX + 8];
    char linked_size[32];
    char content_length[32];
    char content_range[128];
    char location[HUB_URL_MAX];
    char error_code[64];
    char error_message[256];
    char retry_after[32];
    char ratelimit[128];
    int  too_long;            /* a header we need did not fit */
} hub_headers;

/* Where body bytes go, and what a body must look like to be accepted. */
typedef struct hub_sink {
    hub_client *c;
    uint8_t    *buf;          /* or */
    int         fd;           /* -1 when buf is used */
    int         ranged;       /* 1: expect 206 + exact Content-Range */
    uint64_t    first, last;
    uint64_t    total;        /* the file size */
    uint64_t    expected, received;
    int         checked;      /* sink_check ran (at the first body byte) */
    int         verdict;      /* 0 ok, 1 error answer, < 0 refused (err set) */
    shoal_err  *err;
} hub_sink;

struct hub_client {
    CURL       *h;
    char        endpoint[HUB_URL_MAX];
    char       *auth;         /* "Authorization: Bearer ..." or NULL */
    char        user_agent[128];
    long        connect_timeout_ms, stall_secs;
    uint64_t    progress_ns;  /* when the byte count last moved */
    curl_off_t  progress_bytes;
    int         stalled;      /* the progress callback gave up */
    char        errbuf[CURL_ERROR_SIZE];
    hub_headers hdr;
    int         last_status;
    long        retry_after;
};

/* ---- specs and URLs ------------------------------------------------------ */

static int repo_char_ok(int c)
{
    return isalnum(c) || c == '-' || c == '_' || c == '.';
}

int hub_spec_parse(const char *text, hub_spec *out, shoal_err *err)
{
    const char *p, *at, *slash;
    size_t rlen;
    hub_spec s;

    if (!text || strncmp(text, "hf://", 5) != 0)
        return shoal_err_set(err, SHOAL_EINVAL,
                             "upstream '%s' must look like hf://org/name[@revision]",
                             text ? text : "");
    p = text + 5;
    if (strncmp(p, "datasets/", 9) == 0 || strncmp(p, "spaces/", 7) == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "'%s': only model repos are supported", text);
    at = strchr(p, '@');
    rlen = at ? (size_t)(at - p) : strlen(p);
    slash = memchr(p, '/', rlen);
    if (!slash || slash == p || (size_t)(slash - p) + 1 == rlen || rlen >= sizeof s.repo)
        return shoal_err_set(err, SHOAL_EINVAL, "'%s': the repo must be org/name", text);
    for (size_t i = 0; i < rlen; i++) {
        int c = (unsigned char)p[i];
        if (!(repo_char_ok(c) || (p + i == slash)))
            return shoal_err_set(err, SHOAL_EINVAL,
                                 "'%s': repo names use letters, digits, '-', '_' and '.'", text);
    }
    memcpy(s.repo, p, rlen);
    s.repo[rlen] = '\0';
    if (!at) {
        snprintf(s.revision, sizeof s.revision, "main");
    } else {
        const char *r = at + 1;
        size_t n = strlen(r);
        if (n == 0 || n >= sizeof s.revision)
            return shoal_err_set(err, SHOAL_EINVAL, "'%s': empty or too long revision", text);
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)r[i] <= ' ' || (unsigned char)r[i] >= 0x7f)
                return shoal_err_set(err, SHOAL_EINVAL,
                                     "'%s': the revision has a space or control character", text);
        memcpy(s.revision, r, n + 1);
    }
    *out = s;
    return 0;
}

/* Percent-encode s into b (keeping '/' when keep_slash), as Python's quote. */
static int url_encode(shoal_buf *b, const char *s, int keep_slash)
{
    int rc = 0;
    for (; *s && rc == 0; s++) {
        unsigned char c = (unsigned char)*s;
        if (isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/'))
            rc = shoal_buf_append_u8(b, c);
        else
            rc = shoal_buf_appendf(b, "%%%02X", c);
    }
    return rc;
}

int hub_url_resolve(const char *endpoint, const char *repo, const char *revision,
                    const char *file, char *out, size_t cap)
{
    shoal_buf b;
    size_t elen = strlen(endpoint);
    int rc;

    while (elen > 0 && endpoint[elen - 1] == '/')
        elen--;
    shoal_buf_init(&b, cap);
    rc = shoal_buf_append(&b, endpoint, elen);
    rc = rc ? rc : shoal_buf_appendf(&b, "/%s/resolve/", repo);
    rc = rc ? rc : url_encode(&b, revision, 0);
    rc = rc ? rc : shoal_buf_append_u8(&b, '/');
    rc = rc ? rc : url_encode(&b, file, 1);
    if (rc == 0 && b.len + 1 > cap)
        rc = SHOAL_ETOOBIG;
    if (rc == 0)
        memcpy(out, b.data, b.len + 1);
    shoal_buf_free(&b);
    return rc ? SHOAL_ETOOBIG : 0;
}

typedef struct origin {
    char *scheme, *host, *port;
} origin;

static int origin_get(const char *url, origin *o)
{
    CURLU *u = curl_url();
    int ok = u && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK
             && curl_url_get(u, CURLUPART_SCHEME, &o->scheme, 0) == CURLUE_OK
             && curl_url_get(u, CURLUPART_HOST, &o->host, 0) == CURLUE_OK
             && curl_url_get(u, CURLUPART_PORT, &o->port, CURLU_DEFAULT_PORT) == CURLUE_OK;
    curl_url_cleanup(u);
    return ok;
}

static void origin_free(origin *o)
{
    curl_free(o->scheme);
    curl_free(o->host);
    curl_free(o->port);
}

int hub_url_same_origin(const char *a, const char *b)
{
    origin x = { 0 }, y = { 0 };
    int same = origin_get(a, &x) && origin_get(b, &y) && strcasecmp(x.scheme, y.scheme) == 0
               && strcasecmp(x.host, y.host) == 0 && strcmp(x.port, y.port) == 0;
    origin_free(&x);
    origin_free(&y);
    return same;
}

/* ---- the client ---------------------------------------------------------- */

int hub_client_new(const hub_options *opt, hub_client **out, shoal_err *err)
{
    hub_client *c;
    const char *ep = opt && opt->endpoint && opt->endpoint[0] ? opt->endpoint : HUB_DEFAULT_ENDPOINT;
    size_t n = strlen(ep);

    while (n > 0 && ep[n - 1] == '/')
        n--;
    if (n == 0 || n >= HUB_URL_MAX - 1024)
        return shoal_err_set(err, SHOAL_EINVAL, "bad Hub endpoint '%s'", ep);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return shoal_err_set(err, SHOAL_EINTERNAL, "libcurl initialisation failed");
    c = calloc(1, sizeof *c);
    if (!c) {
        curl_global_cleanup();
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    memcpy(c->endpoint, ep, n);
    c->endpoint[n] = '\0';
    c->h = curl_easy_init();
    if (opt && opt->token && opt->token[0]) {
        size_t tl = strlen(opt->token) + 32;
        c->auth = malloc(tl);
        if (c->auth)
            snprintf(c->auth, tl, "Authorization: Bearer %s", opt->token);
    }
    if (!c->h || (opt && opt->token && opt->token[0] && !c->auth)) {
        hub_client_free(c);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory creating the Hub client");
    }
    snprintf(c->user_agent, sizeof c->user_agent, "shoal/%s; libcurl/%s", SHOAL_VERSION,
             curl_version_info(CURLVERSION_NOW)->version);
    c->connect_timeout_ms = opt && opt->connect_timeout_ms > 0 ? opt->connect_timeout_ms : 10000;
    c->stall_secs = opt && opt->stall_secs > 0 ? opt->stall_secs : 30;
    c->retry_after = -1;
    *out = c;
    return 0;
}

void hub_client_free(hub_client *c)
{
    if (!c)
        return;
    if (c->h)
        curl_easy_cleanup(c->h);
    if (c->auth) {
        memset(c->auth, 0, strlen(c->auth));
        free(c->auth);
    }
    free(c);
    curl_global_cleanup();
}

int hub_client_last_status(const hub_client *c)
{
    return c ? c->last_status : 0;
}

long hub_client_retry_after(const hub_client *c)
{
    return c ? c->retry_after : -1;
}

static void hdr_copy(char *dst, size_t cap, const char *v, size_t n, int *too_long)
{
    if (n >= cap) {
        *too_long = 1;
        n = cap - 1;
    }
    memcpy(dst, v, n);
    dst[n] = '\0';
}

static size_t on_header(char *data, size_t size, size_t nitems, void *arg)
{
    hub_client *c = arg;
    hub_headers *h = &c->hdr;
    size_t len = size * nitems, nlen, vlen;
    const char *colon, *v;

    if (len >= 5 && strncmp(data, "HTTP/", 5) == 0) {
        memset(h, 0, sizeof *h);
        return len;
    }
    colon = memchr(data, ':', len);
    if (!colon)
        return len;
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
    return len;
}

/* Parse an unsigned decimal header value. */
static int parse_u64(const char *s, uint64_t *out)
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

/* Seconds to wait from "RateLimit: ...;t=N" (preferred) or Retry-After. */
static long wait_hint(const hub_headers *h)
{
    const char *t = strstr(h->ratelimit, "t=");
    uint64_t v;
    if (t) {
        char num[32];
        size_t n = strspn(t + 2, "0123456789");
        if (n > 0 && n < sizeof num) {
            memcpy(num, t + 2, n);
            num[n] = '\0';
            if (parse_u64(num, &v) == 0)
                return (long)v;
        }
    }
    if (parse_u64(h->retry_after, &v) == 0)
        return (long)v;
    return -1;
}

/* Stall detection: CURLOPT_LOW_SPEED_* averages over a window of seconds,
 * so a burst followed by silence goes unnoticed for a long time; this gives
 * up when the byte count has not moved for stall_secs. */
static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    hub_client *c = arg;
    uint64_t now = shoal_now_ns();
    (void)dltotal;
    (void)ultotal;
    (void)ulnow;
    if (dlnow != c->progress_bytes) {
        c->progress_bytes = dlnow;
        c->progress_ns = now;
        return 0;
    }
    if (now - c->progress_ns > (uint64_t)c->stall_secs * 1000000000ull) {
        c->stalled = 1;
        return 1;   /* abort: CURLE_ABORTED_BY_CALLBACK */
    }
    return 0;
}

/* Reset the handle and set what every request shares.  The header list is
 * built here and must be freed by the caller after the transfer. */
static struct curl_slist *hub_prepare(hub_client *c, const char *url, const char *range)
{
    CURL *h = c->h;
    struct curl_slist *hl = NULL, *t;

    curl_easy_reset(h);   /* keeps live connections, drops options */
    memset(&c->hdr, 0, sizeof c->hdr);
    c->errbuf[0] = '\0';
    c->last_status = 0;
    c->retry_after = -1;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, c->user_agent);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, c->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
    c->progress_ns = shoal_now_ns();
    c->progress_bytes = 0;
    c->stalled = 0;
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);   /* fewer, larger writes */
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, c);
    if (range)
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    t = curl_slist_append(hl, "Accept-Encoding: identity");
    if (t)
        hl = t;
    if (c->auth && hub_url_same_origin(url, c->endpoint)) {
        t = curl_slist_append(hl, c->auth);
        if (t)
            hl = t;
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    return hl;
}

static int curl_code_map(CURLcode cc)
{
    switch (cc) {
    case CURLE_OPERATION_TIMEDOUT: return SHOAL_ETIMEOUT;
    case CURLE_PARTIAL_FILE:       return SHOAL_EPROTO;
    case CURLE_OUT_OF_MEMORY:      return SHOAL_ENOMEM;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL: return SHOAL_EINVAL;
    default:                       return SHOAL_ENET;
    }
}

/* Run the prepared transfer; 0 when an HTTP answer came back (any status). */
static int hub_perform(hub_client *c, const char *what, const char *url, shoal_err *err)
{
    CURLcode cc = curl_easy_perform(c->h);
    long status = 0;

    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    c->last_status = (int)status;
    c->retry_after = wait_hint(&c->hdr);
    if (cc != CURLE_OK) {
        int code = curl_code_map(cc);
        if (c->stalled)
            return shoal_err_set(err, SHOAL_ETIMEOUT, "%s %s: no progress for %ld s (stalled)",
                                 what, url, c->stall_secs);
        return shoal_err_set(err, code, "%s %s: %s", what, url,
                             c->errbuf[0] ? c->errbuf : curl_easy_strerror(cc));
    }
    if (c->hdr.too_long)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%s %s: a response header is too long", what, url);
    return 0;
}

/* Map an error answer of the Hub to a code and a message that says what to
 * do.  repo/rev/file may be NULL (CDN requests). */
static int hub_status_error(hub_client *c, const char *url, const char *repo, const char *rev,
                            const char *file, shoal_err *err)
{
    const hub_headers *h = &c->hdr;
    int st = c->last_status;
    const char *code = h->error_code, *msg = h->error_message[0] ? h->error_message : "no message";

    if (strcmp(code, "GatedRepo") == 0)
        return shoal_err_set(err, SHOAL_EAUTH,
                             "model %s is gated (HTTP %d): set HF_TOKEN to a token of an account "
                             "that has accepted the licence on the model page %s/%s (hub: %s)",
                             repo ? repo : "?", st, c->endpoint, repo ? repo : "", msg);
    if (strcmp(code, "RepoNotFound") == 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND,
                             "repository %s not found on %s: check the name; a private repo "
                             "needs HF_TOKEN (hub: %s)", repo ? repo : "?", c->endpoint, msg);
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
        return shoal_err_set(err, SHOAL_EAUTH,
                             "%s: HTTP 401 (%s): %s", url, msg,
                             c->auth ? "the token in HF_TOKEN was refused; check it"
                                     : "this needs a token; set HF_TOKEN");
    if (st == 403)
        return shoal_err_set(err, SHOAL_EAUTH,
                             "%s: HTTP 403 (%s): %s", url, msg,
                             repo ? "access denied; check the token's permissions"
                                  : "the CDN refused the signed URL (expired?); resolve the file again");
    if (st == 404)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "%s: HTTP 404 (%s)", url, msg);
    if ((st == 429 || st == 503) && c->retry_after >= 0)
        return shoal_err_set(err, SHOAL_EBUSY, "%s: HTTP %d (%s); retry after %ld s", url, st, msg,
                             c->retry_after);
    if (st == 429 || st == 503)
        return shoal_err_set(err, SHOAL_EBUSY, "%s: HTTP %d (%s); retry later", url, st, msg);
    if (st == 416)
        return shoal_err_set(err, SHOAL_ERANGE, "%s: HTTP 416, server has Content-Range '%s'", url,
                             h->content_range);
    return shoal_err_set(err, st >= 500 ? SHOAL_ENET : SHOAL_EPROTO, "%s: unexpected HTTP %d (%s)",
                         url, st, msg);
}

static size_t on_discard(char *p, size_t size, size_t n, void *arg)
{
    (void)p;
    (void)arg;
    return size * n;
}

/* Strip W/ and quotes from an etag into out. */
static int etag_clean(const char *in, char *out, size_t cap)
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

static int is_commit(const char *s)
{
    size_t i;
    for (i = 0; s[i]; i++)
        if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
            return 0;
    return i == 40;
}

/* Absolute means it has a scheme: "http:", "https:" ... before any '/'. */
static int url_is_absolute(const char *u)
{
    const char *colon = strchr(u, ':'), *slash = strchr(u, '/');
    return colon && (!slash || colon < slash) && colon > u;
}

static int url_join(const char *base, const char *rel, char *out, size_t cap)
{
    CURLU *u = curl_url();
    char *s = NULL;
    int ok = u && curl_url_set(u, CURLUPART_URL, base, 0) == CURLUE_OK
             && curl_url_set(u, CURLUPART_URL, rel, 0) == CURLUE_OK
             && curl_url_get(u, CURLUPART_URL, &s, 0) == CURLUE_OK && strlen(s) < cap;
    if (ok)
        memcpy(out, s, strlen(s) + 1);
    curl_free(s);
    curl_url_cleanup(u);
    return ok ? 0 : -1;
}

int hub_file_resolve(hub_client *c, const hub_spec *spec, const char *file, hub_file *out,
                     shoal_err *err)
{
    char url[HUB_URL_MAX];
    hub_file r;
    int rc = 0, hop, redirected = 0;
    const hub_headers *h = &c->hdr;

    memset(&r, 0, sizeof r);
    if (hub_url_resolve(c->endpoint, spec->repo, spec->revision, file, url, sizeof url))
        return shoal_err_set(err, SHOAL_ETOOBIG, "resolve URL too long for %s", file);
    for (hop = 0; hop <= HUB_MAX_HOPS; hop++) {
        struct curl_slist *hl = hub_prepare(c, url, NULL);
        curl_easy_setopt(c->h, CURLOPT_NOBODY, 1L);
        curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_discard);
        rc = hub_perform(c, "HEAD", url, err);
        curl_slist_free_all(hl);
        if (rc)
            return rc;
        if (c->last_status >= 300 && c->last_status < 400 && h->location[0]
            && !url_is_absolute(h->location)) {
            char next[HUB_URL_MAX];
            if (url_join(url, h->location, next, sizeof next))
                return shoal_err_set(err, SHOAL_EPROTO, "HEAD %s: bad redirect Location '%s'", url,
                                     h->location);
            LOG_DEBUG("hub", "%d -> %s", c->last_status, next);
            memcpy(url, next, strlen(next) + 1);
            redirected = 1;
            continue;
        }
        break;
    }
    if (hop > HUB_MAX_HOPS)
        return shoal_err_set(err, SHOAL_EPROTO, "HEAD %s: more than %d redirects", url, HUB_MAX_HOPS);
    if (c->last_status >= 400)
        return hub_status_error(c, url, spec->repo, spec->revision, file, err);
    r.is_lfs = c->last_status >= 300;
    if (r.is_lfs && !h->location[0])
        return shoal_err_set(err, SHOAL_EPROTO, "HEAD %s: HTTP %d without Location", url, c->last_status);
    if (c->last_status != 200 && !r.is_lfs)
        return shoal_err_set(err, SHOAL_EPROTO, "HEAD %s: unexpected HTTP %d", url, c->last_status);
    if (!is_commit(h->commit))
        return shoal_err_set(err, SHOAL_EPROTO,
                             "HEAD %s: missing or malformed X-Repo-Commit ('%s'); is %s a Hub?",
                             url, h->commit, c->endpoint);
    memcpy(r.commit, h->commit, 41);
    if (etag_clean(h->linked_etag[0] ? h->linked_etag : h->etag, r.etag, sizeof r.etag))
        return shoal_err_set(err, SHOAL_EPROTO, "HEAD %s: no X-Linked-Etag or ETag", url);
    if (parse_u64(h->linked_size, &r.size) != 0
        && (r.is_lfs || parse_u64(h->content_length, &r.size) != 0))
        return shoal_err_set(err, SHOAL_EPROTO, "HEAD %s: no X-Linked-Size%s", url,
                             r.is_lfs ? " on the redirect" : " or Content-Length");
    if (r.is_lfs) {
        if (strlen(h->location) >= sizeof r.location)
            return shoal_err_set(err, SHOAL_ETOOBIG, "HEAD %s: Location too long", url);
        memcpy(r.location, h->location, strlen(h->location) + 1);
    } else if (redirected) {
        memcpy(r.location, url, strlen(url) + 1);
    } else if (hub_url_resolve(c->endpoint, spec->repo, r.commit, file, r.location,
                               sizeof r.location)) {
        return shoal_err_set(err, SHOAL_ETOOBIG, "resolve URL too long for %s", file);
    }
    *out = r;
    return 0;
}

/* ---- GETs ------------------------------------------------------------------ */

/* Is this the answer we asked for?  0: yes; 1: an error answer (mapped
 * after the transfer); negative: refused, with the reason in s->err. */
static int sink_check(hub_sink *s)
{
    hub_client *c = s->c;
    long status = 0;
    char want[128];

    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    if (s->ranged) {
        if (status == 200)
            return shoal_err_set(s->err, SHOAL_EPROTO,
                                 "GET bytes=%" PRIu64 "-%" PRIu64 ": the server ignored the Range "
                                 "and answered 200 with the whole file; refused",
                                 s->first, s->last);
        if (status != 206)
            return 1;
        snprintf(want, sizeof want, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, s->first, s->last,
                 s->total);
        if (strcmp(c->hdr.content_range, want) != 0)
            return shoal_err_set(s->err, SHOAL_EPROTO,
                                 "GET bytes=%" PRIu64 "-%" PRIu64 ": Content-Range '%s', "
                                 "expected '%s'; refused", s->first, s->last,
                                 c->hdr.content_range, want);
        return 0;
    }
    if (status != 200)
        return 1;
    if (c->hdr.content_length[0]) {
        uint64_t cl;
        if (parse_u64(c->hdr.content_length, &cl) != 0 || cl != s->expected)
            return shoal_err_set(s->err, SHOAL_EPROTO,
                                 "GET: Content-Length '%s', expected %" PRIu64 "; refused",
                                 c->hdr.content_length, s->expected);
    }
    return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    hub_sink *s = arg;
    size_t len = size * n;

    if (!s->checked) {
        s->checked = 1;
        s->verdict = sink_check(s);
        if (s->verdict != 0)
            return 0;   /* abort the transfer */
    }
    if (len > s->expected - s->received) {
        s->verdict = shoal_err_set(s->err, SHOAL_EPROTO,
                                   "GET: the body is longer than the %" PRIu64
                                   " bytes expected; refused", s->expected);
        return 0;
    }
    if (s->buf) {
        memcpy(s->buf + s->received, p, len);
    } else {
        int rc = shoal_write_all(s->fd, p, len);
        if (rc) {
            s->verdict = shoal_err_set(s->err, rc, "writing the body: %s", strerror(errno));
            return 0;
        }
    }
    s->received += len;
    return len;
}

static int hub_get(hub_client *c, const hub_file *f, hub_sink *s, shoal_err *err)
{
    char range[64];
    struct curl_slist *hl;
    const char *url = f->location;
    off_t start = -1;
    struct stat st;
    shoal_err perr;
    int rc, prc;

    s->c = c;
    s->err = err;
    s->total = f->size;
    if (s->ranged) {
        if (s->first > s->last || s->last >= f->size)
            return shoal_err_set(err, SHOAL_ERANGE,
                                 "range %" PRIu64 "-%" PRIu64 " is outside the file (%" PRIu64
                                 " bytes)", s->first, s->last, f->size);
        s->expected = s->last - s->first + 1;
        snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, s->first, s->last);
    } else {
        s->expected = f->size;
    }
    if (s->fd >= 0 && fstat(s->fd, &st) == 0 && S_ISREG(st.st_mode))
        start = lseek(s->fd, 0, SEEK_CUR);
    hl = hub_prepare(c, url, s->ranged ? range : NULL);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, s);
    shoal_err_clear(&perr);
    prc = hub_perform(c, "GET", url, &perr);
    curl_slist_free_all(hl);
    if (!s->checked && c->last_status != 0)
        s->verdict = sink_check(s);   /* an answer without a body */
    if (s->verdict < 0) {
        rc = s->verdict;
    } else if (s->verdict == 1) {
        rc = hub_status_error(c, url, NULL, NULL, NULL, err);
    } else if (prc) {
        rc = shoal_err_set(err, prc, "%s", perr.msg);
        if (c->last_status / 100 == 2)
            shoal_err_wrap(err, rc, "body ended after %" PRIu64 " of %" PRIu64 " bytes",
                           s->received, s->expected);
    } else if (s->received != s->expected) {
        rc = shoal_err_set(err, SHOAL_EPROTO, "GET %s: got %" PRIu64 " of %" PRIu64
                           " bytes; refused", url, s->received, s->expected);
    } else {
        rc = 0;
    }
    if (rc && start >= 0 && s->received > 0) {
        /* Nothing kept: cut the file back to where this GET started. */
        if (ftruncate(s->fd, start) == 0)
            lseek(s->fd, start, SEEK_SET);
    }
    return rc;
}

int hub_range_read(hub_client *c, const hub_file *f, uint64_t first, uint64_t last, void *dst,
                   shoal_err *err)
{
    hub_sink s = { .buf = dst, .fd = -1, .ranged = 1, .first = first, .last = last };
    return hub_get(c, f, &s, err);
}

int hub_range_write(hub_client *c, const hub_file *f, uint64_t first, uint64_t last, int fd,
                    shoal_err *err)
{
    hub_sink s = { .fd = fd, .ranged = 1, .first = first, .last = last };
    return hub_get(c, f, &s, err);
}

int hub_file_read(hub_client *c, const hub_file *f, void *dst, shoal_err *err)
{
    hub_sink s = { .buf = dst, .fd = -1, .ranged = f->is_lfs, .first = 0, .last = f->size - 1 };
    if (f->size == 0)
        return 0;
    return hub_get(c, f, &s, err);
}

int hub_file_write(hub_client *c, const hub_file *f, int fd, shoal_err *err)
{
    hub_sink s = { .fd = fd, .ranged = f->is_lfs, .first = 0, .last = f->size - 1 };
    if (f->size == 0)
        return 0;
    return hub_get(c, f, &s, err);
}
