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
#include "fetcher/http_int.h"

#define HUB_MAX_HOPS 5

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
    int         stopped;      /* ... because *stop was set */
    const _Atomic int *stop;
    char        errbuf[CURL_ERROR_SIZE];
    http_headers hdr;
    int         sent_token;   /* the last request carried the token */
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
    http_user_agent(c->user_agent, sizeof c->user_agent);
    c->connect_timeout_ms = opt && opt->connect_timeout_ms > 0 ? opt->connect_timeout_ms : 10000;
    c->stall_secs = opt && opt->stall_secs > 0 ? opt->stall_secs : 30;
    c->stop = opt ? opt->stop : NULL;
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

static size_t on_header(char *data, size_t size, size_t nitems, void *arg)
{
    hub_client *c = arg;
    http_headers_line(&c->hdr, data, size * nitems);
    return size * nitems;
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
    if (c->stop && atomic_load(c->stop)) {
        c->stopped = 1;
        return 1;
    }
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
    struct curl_slist *hl;

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
    c->stopped = 0;
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->errbuf);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);   /* fewer, larger writes */
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, c);
    if (range)
        curl_easy_setopt(h, CURLOPT_RANGE, range);
    hl = http_request_headers(url, c->endpoint, c->auth, &c->sent_token);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    return hl;
}

/* Run the prepared transfer; 0 when an HTTP answer came back (any status). */
static int hub_perform(hub_client *c, const char *what, const char *url, shoal_err *err)
{
    CURLcode cc = curl_easy_perform(c->h);
    long status = 0;

    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    c->last_status = (int)status;
    c->retry_after = http_wait_hint(&c->hdr);
    if (cc != CURLE_OK) {
        int code = http_curl_unreachable(cc) ? SHOAL_EOFFLINE : http_curl_code_map(cc);
        if (c->stopped)
            return shoal_err_set(err, SHOAL_ECANCELED, "%s %s: stopped", what, url);
        if (c->stalled)
            return shoal_err_set(err, SHOAL_ETIMEOUT, "%s %s: no progress for %ld s (stalled)",
                                 what, url, c->stall_secs);
        return shoal_err_set(err, code, "%s %s: %s", what, url,
                             http_curl_strerror(cc, c->errbuf));
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
    return http_status_error(c->last_status, &c->hdr, c->endpoint, c->sent_token, url, repo, rev,
                             file, err);
}

static size_t on_discard(char *p, size_t size, size_t n, void *arg)
{
    (void)p;
    (void)arg;
    return size * n;
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
    const http_headers *h = &c->hdr;

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
    if (!http_is_commit(h->commit))
        return shoal_err_set(err, SHOAL_EPROTO,
                             "HEAD %s: missing or malformed X-Repo-Commit ('%s'); is %s a Hub?",
                             url, h->commit, c->endpoint);
    memcpy(r.commit, h->commit, 41);
    if (http_etag_clean(h->linked_etag[0] ? h->linked_etag : h->etag, r.etag, sizeof r.etag))
        return shoal_err_set(err, SHOAL_EPROTO, "HEAD %s: no X-Linked-Etag or ETag", url);
    if (http_parse_u64(h->linked_size, &r.size) != 0
        && (r.is_lfs || http_parse_u64(h->content_length, &r.size) != 0))
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

    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    if (s->ranged)
        return http_range_check(status, &c->hdr, s->first, s->last, s->total, s->err);
    if (status != 200)
        return 1;
    if (c->hdr.content_length[0]) {
        uint64_t cl;
        if (http_parse_u64(c->hdr.content_length, &cl) != 0 || cl != s->expected)
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
