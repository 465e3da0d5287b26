/* xfer_curl.c — the libcurl plumbing of a fetch session: range requests
 * on easy handles in one multi handle driven by the caller's loop, the
 * header, body and progress callbacks (the strict 206 check before any
 * byte is written), retries with backoff and jitter, resume from the last
 * byte received, stall detection, re-resolving an expired CDN location
 * with a HEAD on the multi handle, and the loop's entry points
 * (fetch_session_io, fetch_session_timeout).  Does not own the queues
 * (xfer_sched.c), request sizes (xfer_parts.c) nor the cache writers
 * (xfer_store.c).  Invariants: fetcher/xfer_int.h.
 */
#include "fetcher/xfer_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/sys.h"

static void start_request(xfer *x);
static void start_resolve(fetch_session *s, uint32_t file);

/* ---- the transfer callbacks (invariant 4: no multi calls in here) --------------- */

static size_t on_xfer_header(char *data, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    http_headers_line(&x->hdr, data, size * n);
    return size * n;
}

static size_t on_xfer_body(char *p, size_t size, size_t n, void *arg)
{
    xfer *x = arg;
    fetch_session *s = x->s;
    size_t len = size * n;

    if (!x->checked) {
        long status = 0;
        int rc;
        x->checked = 1;
        curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &status);
        rc = http_range_check(status, &x->hdr, x->req_first, x->last,
                              s->m->files[x->file].size, &x->xerr);
        if (rc < 0) {
            x->refused = 1;
            return 0;   /* abort: invariant 1, not a byte written */
        }
        if (rc == 1)
            x->status_err = (int)status;
    }
    if (x->status_err)
        return len;     /* an error page: read and dropped */
    return xf_body_write(x, p, len) == 0 ? len : 0;
}

/* Stall detection per transfer (see hub.c: the low-speed window alone
 * notices silence after a burst late), and the low-speed limit: fewer
 * than low_speed_rate x low_speed_secs bytes in a window of
 * low_speed_secs is a stall too, so a server that drips a byte now and
 * then (each one progress) cannot hold a transfer forever. */
static uint64_t low_speed_rate(const fetch_session *s)
{
    return s->u->o.low_speed_rate ? s->u->o.low_speed_rate : FETCH_DEFAULT_LOW_SPEED_RATE;
}

static long low_speed_secs(const fetch_session *s)
{
    return s->u->o.low_speed_secs > 0 ? s->u->o.low_speed_secs : FETCH_DEFAULT_LOW_SPEED_SECS;
}

static int on_xfer_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                            curl_off_t ulnow)
{
    xfer *x = arg;
    uint64_t now = shoal_now_ns();
    (void)dltotal;
    (void)ultotal;
    (void)ulnow;
    if (low_speed_rate(x->s) != FETCH_LOW_SPEED_OFF &&
        now - x->ls_ns >= (uint64_t)low_speed_secs(x->s) * 1000000000ull) {
        uint64_t want = low_speed_rate(x->s) * (uint64_t)low_speed_secs(x->s);
        if ((uint64_t)(dlnow - x->ls_bytes) < want) {
            x->stalled = x->slow = 1;
            return 1;
        }
        x->ls_ns = now;
        x->ls_bytes = dlnow;
    }
    if (dlnow != x->stall_bytes) {
        x->stall_bytes = dlnow;
        x->stall_ns = now;
        return 0;
    }
    if (now - x->stall_ns > (uint64_t)x->s->u->o.stall_secs * 1000000000ull) {
        x->stalled = 1;
        return 1;
    }
    return 0;
}

/* ---- transfers ------------------------------------------------------------------ */

xfer *xf_new(fetch_session *s)
{
    xfer *x = calloc(1, sizeof *x);
    if (!x || !(x->h = curl_easy_init())) {
        free(x);
        return NULL;
    }
    x->kind = K_XFER;
    x->s = s;
    x->next = s->xfers;
    s->xfers = x;
    s->nxfers++;
    return x;
}

static void easy_common(fetch_session *s, CURL *h, const char *url, struct curl_slist **hl,
                        int *sent_token)
{
    curl_easy_reset(h);
    *hl = http_request_headers(url, s->u->endpoint, s->u->token_line, sent_token);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hl);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, s->ua);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, s->u->o.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
}

static void start_request(xfer *x)
{
    fetch_session *s = x->s;
    const up_file *uf = s->files[x->file].uf;
    char range[64];
    CURLMcode mc;

    /* invariant 3: from the first unfinished segment's next byte */
    while (x->cur < x->nobj && (s->objs[x->segs[x->cur].obj].done
                                || x->segs[x->cur].next >= x->segs[x->cur].hi))
        x->cur++;
    if (x->cur >= x->nobj) {
        xf_free(s, x);   /* every object was already there: nothing to ask */
        return;
    }
    {
        seg *g = &x->segs[x->cur];
        x->pos = s->objs[g->obj].it.offset + g->next;
    }
    if (x->pos > x->last) {
        x->pos = x->last;
    }
    x->req_first = x->pos;
    x->pos_at_start = x->pos;
    x->checked = x->refused = x->status_err = x->fatal = x->stalled = x->slow = 0;
    shoal_err_clear(&x->xerr);
    memset(&x->hdr, 0, sizeof x->hdr);
    snprintf(range, sizeof range, "%" PRIu64 "-%" PRIu64, x->req_first, x->last);
    curl_slist_free_all(x->hl);
    easy_common(s, x->h, uf->hf.location, &x->hl, &x->sent_token);
    curl_easy_setopt(x->h, CURLOPT_RANGE, range);
    curl_easy_setopt(x->h, CURLOPT_HEADERFUNCTION, on_xfer_header);
    curl_easy_setopt(x->h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_xfer_body);
    curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(x->h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(x->h, CURLOPT_XFERINFOFUNCTION, on_xfer_progress);
    curl_easy_setopt(x->h, CURLOPT_XFERINFODATA, x);
    /* Also arms libcurl's own wake-ups, so a silent socket still gets the
     * progress callback above. */
    curl_easy_setopt(x->h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(x->h, CURLOPT_LOW_SPEED_TIME, s->u->o.stall_secs + 1);
    curl_easy_setopt(x->h, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
    if (x->fresh) {   /* after a slow answer: not the same connection again */
        curl_easy_setopt(x->h, CURLOPT_FRESH_CONNECT, 1L);
        x->fresh = 0;
    }
    x->stall_ns = x->ls_ns = shoal_now_ns();
    x->stall_bytes = x->ls_bytes = 0;
    x->state = X_RUNNING;
    s->u->st.requests++;
    mc = curl_multi_add_handle(s->multi, x->h);
    if (mc != CURLM_OK)
        xf_session_fail(s, SHOAL_EINTERNAL, curl_multi_strerror(mc));
}

/* Make sure file is usable; 1 if ready now, 0 if a resolve is under way. */
static int file_ready(fetch_session *s, uint32_t file)
{
    sfile *f = &s->files[file];
    up_file *uf;

    if (f->state == F_READY && f->uf && f->uf->ready)
        return 1;
    if (f->state == F_RESOLVING)
        return 0;
    if (up_cached(s->u, s->m->files[file].path, &uf) == 0) {
        f->uf = uf;
        if (strcmp(uf->hf.etag, s->m->files[file].etag) != 0 || uf->hf.size != s->m->files[file].size) {
            xf_session_fail(s, SHOAL_EPROTO, "a file's etag or size differs from the manifest's");
            return 0;
        }
        f->state = F_READY;
        return 1;
    }
    f->uf = uf;
    start_resolve(s, file);
    return 0;
}

void xf_go(xfer *x)
{
    fetch_session *s = x->s;
    x->state = X_WAIT_RESOLVE;   /* before file_ready: it may fail the session and free x */
    if (file_ready(s, x->file))
        start_request(x);
}

/* ---- resolving on the multi handle ---------------------------------------------- */

static size_t on_res_header(char *data, size_t size, size_t n, void *arg)
{
    resolver *r = arg;
    http_headers_line(&r->hdr, data, size * n);
    return size * n;
}

static size_t on_discard(char *p, size_t size, size_t n, void *arg)
{
    (void)p;
    (void)arg;
    return size * n;
}

static void resolve_launch(resolver *r)
{
    fetch_session *s = r->s;
    curl_slist_free_all(r->hl);
    memset(&r->hdr, 0, sizeof r->hdr);
    easy_common(s, r->h, r->url, &r->hl, &r->sent_token);
    curl_easy_setopt(r->h, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(r->h, CURLOPT_HEADERFUNCTION, on_res_header);
    curl_easy_setopt(r->h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(r->h, CURLOPT_WRITEFUNCTION, on_discard);
    curl_easy_setopt(r->h, CURLOPT_PRIVATE, r);
    r->waiting = 0;
    s->u->st.requests++;
    s->u->st.resolves++;
    if (curl_multi_add_handle(s->multi, r->h) != CURLM_OK)
        xf_session_fail(s, SHOAL_EINTERNAL, "adding a resolve to the multi handle failed");
}

static void start_resolve(fetch_session *s, uint32_t file)
{
    sfile *f = &s->files[file];
    resolver *r = &f->r;

    f->state = F_RESOLVING;
    r->kind = K_RESOLVE;
    r->s = s;
    r->file = file;
    r->attempts = 0;
    if (!r->h && !(r->h = curl_easy_init())) {
        xf_session_fail(s, SHOAL_ENOMEM, "out of memory");
        return;
    }
    if (hub_url_resolve(s->u->endpoint, s->u->spec.repo, s->u->commit, s->m->files[file].path,
                        r->url, sizeof r->url)) {
        xf_session_fail(s, SHOAL_ETOOBIG, "resolve URL too long");
        return;
    }
    LOG_DEBUG("fetch", "resolving %s", s->m->files[file].path);
    resolve_launch(r);
}

static void wake_file(fetch_session *s, uint32_t file)
{
    for (xfer *x = s->xfers, *nx; s->rc == 0 && x; x = nx) {
        nx = x->next;
        if (x->file == file && x->state == X_WAIT_RESOLVE)
            start_request(x);
    }
}

/* A resolve HEAD finished. */
static void resolve_done(resolver *r, CURLcode cc)
{
    fetch_session *s = r->s;
    sfile *f = &s->files[r->file];
    const manifest_file *mf = &s->m->files[r->file];
    const http_headers *h = &r->hdr;
    long status = 0;
    hub_file hf;
    shoal_err e;

    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &status);
    if (cc != CURLE_OK && http_curl_unreachable(cc) && r->attempts + 1 >= HTTP_UNREACHABLE_ATTEMPTS) {
        shoal_err_set(&e, SHOAL_EOFFLINE, "resolving %s: the Hub cannot be reached (%s) and "
                      "it is not in the cache", mf->path, curl_easy_strerror(cc));
        xf_session_fail(s, e.code, e.msg);
        return;
    }
    if (cc != CURLE_OK || http_status_retryable(status)) {
        if (++r->attempts >= s->u->o.max_attempts) {
            shoal_err_set(&e, SHOAL_ENET, "resolving %s: %s; giving up after %d attempts "
                          "(too many failures)", mf->path,
                          cc != CURLE_OK ? http_curl_strerror(cc, NULL) : "busy", r->attempts);
            xf_session_fail(s, e.code, e.msg);
            return;
        }
        s->u->st.retries++;
        r->waiting = 1;
        r->retry_at_ns = shoal_now_ns()
                         + (uint64_t)up_backoff_ms(s->u, r->attempts,
                                                   status ? http_wait_hint(h) : -1) * 1000000ull;
        return;
    }
    if (status >= 400) {
        http_status_error((int)status, h, s->u->endpoint, r->sent_token, r->url, s->u->spec.repo,
                          s->u->commit, mf->path, &e);
        xf_session_fail(s, e.code, e.msg);
        return;
    }
    if (status < 300 || status >= 400 || !h->location[0] || !strstr(h->location, "://")) {
        /* A small file (200) or a relative redirect: the blocking path
         * knows those; they are rare here (their locations never expire). */
        up_file *uf;
        if (up_resolve(s->u, mf->path, 1, &uf, &e) != 0) {
            xf_session_fail(s, e.code, e.msg);
            return;
        }
        f->uf = uf;
    } else {
        memset(&hf, 0, sizeof hf);
        hf.is_lfs = 1;
        hf.size = 0;
        if (!http_is_commit(h->commit) || strcmp(h->commit, s->u->commit) != 0
            || http_etag_clean(h->linked_etag[0] ? h->linked_etag : h->etag, hf.etag,
                               sizeof hf.etag)
            || http_parse_u64(h->linked_size, &hf.size) || strlen(h->location) >= sizeof hf.location) {
            shoal_err_set(&e, SHOAL_EPROTO, "HEAD %s: missing or wrong X-Repo-Commit, "
                          "X-Linked-Etag, X-Linked-Size or Location", r->url);
            xf_session_fail(s, e.code, e.msg);
            return;
        }
        memcpy(hf.commit, h->commit, 41);
        memcpy(hf.location, h->location, strlen(h->location) + 1);
        up_file_store(s->u, f->uf, &hf);
    }
    if (strcmp(f->uf->hf.etag, mf->etag) != 0 || f->uf->hf.size != mf->size) {
        shoal_err_set(&e, SHOAL_EPROTO, "%s changed under the pinned commit %s (etag %s, "
                      "manifest %s)", mf->path, s->u->commit, f->uf->hf.etag, mf->etag);
        xf_session_fail(s, e.code, e.msg);
        return;
    }
    LOG_DEBUG("fetch", "resolved %s", mf->path);
    f->state = F_READY;
    wake_file(s, r->file);
}

/* ---- transfers finishing -------------------------------------------------------- */

void xf_free(fetch_session *s, xfer *x)
{
    xfer **pp = &s->xfers;
    while (*pp && *pp != x)
        pp = &(*pp)->next;
    if (*pp)
        *pp = x->next;
    s->nxfers--;
    /* The writers stay with their objects (invariant 5): other parts may
     * still be running, and stop_all / cancel pause them. */
    for (size_t i = 0; i < x->nobj; i++) {
        obj *o = &s->objs[x->segs[i].obj];
        o->running--;
        if (s->rc == 0 && !o->done && o->running == 0 && o->assigned == o->it.length && o->w
            && x->segs[i].next >= x->segs[i].hi)
            s->orphan = 1;   /* every part ended, yet no commit: checked in xf_after() */
    }
    if (x->h)
        curl_easy_cleanup(x->h);
    curl_slist_free_all(x->hl);
    free(x->segs);
    free(x);
}

void xf_drop(fetch_session *s, xfer *x)
{
    if (x->state == X_RUNNING)
        curl_multi_remove_handle(s->multi, x->h);
    xf_free(s, x);
}

static void xfer_retry(xfer *x, long hint_s, const char *why)
{
    fetch_session *s = x->s;
    seg *g = &x->segs[x->cur];
    long ms;

    if (x->pos > x->pos_at_start && !x->slow)
        x->attempts = 0;   /* progress: the failure count starts again */
    if (x->slow) {         /* a drip is not progress: this attempt counts */
        s->u->st.slow++;
        x->fresh = 1;
    }
    if (++x->attempts >= s->u->o.max_attempts) {
        shoal_err e;
        shoal_err_set(&e, SHOAL_ENET, "%s bytes %" PRIu64 "-%" PRIu64 ": %s; giving up after "
                      "%d attempts without progress (too many failures)",
                      s->m->files[x->file].path, x->pos, x->last, why, x->attempts);
        xf_session_fail(s, e.code, e.msg);
        return;
    }
    s->u->st.retries++;
    if (g->next > g->lo)
        s->u->st.resumed++;
    ms = up_backoff_ms(s->u, x->attempts, hint_s);
    LOG_INFO("fetch", "%s bytes %" PRIu64 "-%" PRIu64 ": %s; retry %d in %ld ms",
             s->m->files[x->file].path, x->pos, x->last, why, x->attempts, ms);
    x->state = X_WAIT_RETRY;
    x->retry_at_ns = shoal_now_ns() + (uint64_t)ms * 1000000ull;
}

static void xfer_done(xfer *x, CURLcode cc)
{
    fetch_session *s = x->s;
    char why[SHOAL_ERR_MSG_MAX + 32];

    curl_multi_remove_handle(s->multi, x->h);
    while (x->cur < x->nobj && (s->objs[x->segs[x->cur].obj].done
                                || x->segs[x->cur].next >= x->segs[x->cur].hi))
        x->cur++;
    if (x->fatal) {
        xf_session_fail(s, x->fatal, x->xerr.msg);
        return;
    }
    if (x->cur >= x->nobj) {
        xf_free(s, x);
        return;
    }
    if (x->refused) {
        s->u->st.refused++;
        xfer_retry(x, -1, x->xerr.msg);
    } else if (x->status_err == 403 && s->files[x->file].uf->hf.is_lfs) {
        if (++x->forced_resolves > XF_MAX_RESOLVES) {
            xf_session_fail(s, SHOAL_EAUTH, "the CDN keeps refusing fresh locations (HTTP 403)");
            return;
        }
        LOG_INFO("fetch", "%s: the CDN refused the location (expired?); resolving again",
                 s->m->files[x->file].path);
        x->state = X_WAIT_RESOLVE;
        if (s->files[x->file].state != F_RESOLVING)
            start_resolve(s, x->file);
    } else if (x->status_err && http_status_retryable(x->status_err)) {
        snprintf(why, sizeof why, "HTTP %d", x->status_err);
        xfer_retry(x, http_wait_hint(&x->hdr), why);
    } else if (x->status_err) {
        shoal_err e;
        http_status_error(x->status_err, &x->hdr, s->u->endpoint, x->sent_token,
                          s->files[x->file].uf->hf.location, NULL, NULL, NULL, &e);
        xf_session_fail(s, e.code, e.msg);
    } else if (cc != CURLE_OK && !x->stalled && http_curl_unreachable(cc)
               && x->attempts + 1 >= HTTP_UNREACHABLE_ATTEMPTS) {
        shoal_err e;
        shoal_err_set(&e, SHOAL_EOFFLINE, "%s bytes %" PRIu64 "-%" PRIu64 ": the upstream "
                      "cannot be reached (%s) and they are not in the cache",
                      s->m->files[x->file].path, x->pos, x->last, curl_easy_strerror(cc));
        xf_session_fail(s, e.code, e.msg);
    } else {
        if (x->slow)
            snprintf(why, sizeof why, "stalled (below the low-speed limit: fewer than %llu "
                     "bytes/s over %ld s)", (unsigned long long)low_speed_rate(s),
                     low_speed_secs(s));
        else
            snprintf(why, sizeof why, "%s", x->stalled ? "stalled (no byte for the stall timeout)"
                                       : cc != CURLE_OK ? http_curl_strerror(cc, NULL)
                                       : "the body ended early");
        xfer_retry(x, -1, why);
    }
}

void xf_process(fetch_session *s)
{
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(s->multi, &left)) != NULL) {
        void *p = NULL;
        if (msg->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&p);
        if (!p)
            continue;
        if (*(int *)p == K_XFER) {
            xfer_done(p, msg->data.result);
        } else {
            resolver *r = p;
            CURLcode cc = msg->data.result;
            curl_multi_remove_handle(s->multi, r->h);
            resolve_done(r, cc);
        }
    }
}

/* ---- the loop's entry points ---------------------------------------------------- */

void fetch_session_io(fetch_session *s, int fd, unsigned what)
{
    int running, ev = 0;
    if (what & FETCH_WATCH_IN)
        ev |= CURL_CSELECT_IN;
    if (what & FETCH_WATCH_OUT)
        ev |= CURL_CSELECT_OUT;
    curl_multi_socket_action(s->multi, fd, ev, &running);
    xf_after(s);
}

void fetch_session_timeout(fetch_session *s)
{
    uint64_t now = shoal_now_ns();
    int running;

    if (s->curl_timer_ns && s->curl_timer_ns <= now) {
        s->curl_timer_ns = 0;
        curl_multi_socket_action(s->multi, CURL_SOCKET_TIMEOUT, 0, &running);
        xf_process(s);
    }
    /* xf_go may free x (or, failing, every transfer): take next first and
     * stop on a failure. */
    for (xfer *x = s->xfers, *nx; s->rc == 0 && x; x = nx) {
        nx = x->next;
        if (x->state == X_WAIT_RETRY && x->retry_at_ns <= now)
            xf_go(x);
    }
    for (size_t i = 0; s->rc == 0 && i < s->m->nfiles; i++)
        if (s->files[i].r.waiting && s->files[i].r.retry_at_ns <= now)
            resolve_launch(&s->files[i].r);
    if (s->u->local)
        xf_local_step(s);
    xf_after(s);
}

/* libcurl -> the loop */
static int on_socket(CURL *e, curl_socket_t fd, int what, void *arg, void *sockp)
{
    fetch_session *s = arg;
    unsigned w = 0;
    (void)e;
    (void)sockp;
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT)
        w |= FETCH_WATCH_IN;
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT)
        w |= FETCH_WATCH_OUT;
    if (what == CURL_POLL_REMOVE)
        w = FETCH_WATCH_NONE;
    return s->ops->watch(s->loop, fd, w) == 0 ? 0 : -1;
}

static int on_timer(CURLM *m, long timeout_ms, void *arg)
{
    fetch_session *s = arg;
    (void)m;
    s->curl_timer_ns = timeout_ms < 0 ? 0 : shoal_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    if (timeout_ms >= 0 && s->curl_timer_ns == 0)
        s->curl_timer_ns = 1;
    return 0;
}

int xf_curl_init(fetch_session *s)
{
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || !(s->multi = curl_multi_init()))
        return -1;
    curl_multi_setopt(s->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(s->multi, CURLMOPT_SOCKETDATA, s);
    curl_multi_setopt(s->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(s->multi, CURLMOPT_TIMERDATA, s);
    curl_multi_setopt(s->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    return 0;
}

void xf_curl_stop(fetch_session *s)
{
    while (s->xfers)
        xf_drop(s, s->xfers);
    for (size_t i = 0; i < s->m->nfiles; i++) {
        resolver *r = &s->files[i].r;
        if (s->files[i].state == F_RESOLVING && !r->waiting && r->h)
            curl_multi_remove_handle(s->multi, r->h);
        r->waiting = 0;
        if (s->files[i].state == F_RESOLVING)
            s->files[i].state = F_UNKNOWN;
    }
}

void xf_curl_free(fetch_session *s)
{
    for (size_t i = 0; s->files && i < s->m->nfiles; i++) {
        if (s->files[i].r.h)
            curl_easy_cleanup(s->files[i].r.h);
        curl_slist_free_all(s->files[i].r.hl);
    }
    if (s->multi) {
        curl_multi_cleanup(s->multi);
        curl_global_cleanup();
    }
}
