/* xfer.c — fetch sessions: range transfers into cache writers over libcurl
 * multi, driven by the caller's event loop (fetch_loop_ops).
 *
 * Owns: the queues (one per priority, objects sorted by file and offset),
 * coalescing adjacent small objects of one file into one request,
 * splitting large objects into parts over several connections (guided
 * self-scheduling, see schedule()), the strict 206 check before any
 * byte is written, streaming bytes into cache writers (nothing is held
 * beyond libcurl's receive buffer), retries with backoff and jitter,
 * resume from the last byte received, stall detection, re-resolving an
 * expired CDN location with a HEAD on the multi handle, and fatal errors.
 * Local snapshot directories are read with pread in bounded steps from the
 * timer, so the loop stays responsive.
 *
 * Invariants:
 *   1. A transfer writes bytes only after http_range_check() accepted the
 *      response's status, Content-Range and Content-Length.
 *   2. A transfer carries segments: [lo, hi) of an object, written from
 *      the segment's own next byte.  Byte p of a response goes to object o
 *      only when it is exactly its segment's next byte, written with
 *      cache_write_at at that position; segments of one object are
 *      disjoint (an object's bytes are handed out once, from o->assigned
 *      up), so a retried, coalesced or split request never writes a byte
 *      twice, and a part never writes a byte of another part.
 *   3. A request always starts at the first unfinished segment's next
 *      byte: what a broken response delivered is kept and not asked again.
 *   5. One writer per object, held by the object (not by its transfers):
 *      the object commits when the writer's contiguous prefix reaches its
 *      length, whichever part lands last; it is paused or aborted only by
 *      obj_pause (stop, failure, cancel), which forgets it, so exactly
 *      once.
 *   4. Library callbacks (write, header, progress) never call back into
 *      the multi handle; failures are acted on when the transfer completes.
 */
#include "fetcher/fetch_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "common/log.h"
#include "common/sys.h"
#include "fetcher/http_int.h"

#define XF_MAX_RUN          256            /* objects in one coalesced request */
#define XF_LOCAL_CHUNK      (4u << 20)     /* pread size for local upstreams */
#define XF_LOCAL_STEP       (64ull << 20)  /* bytes per timer tick, local */
#define XF_MAX_RESOLVES     4              /* CDN refusals in a row per transfer */
#define XF_MAX_HOPS         5

enum { K_XFER = 1, K_RESOLVE = 2 };
enum { X_RUNNING, X_WAIT_RETRY, X_WAIT_RESOLVE };
enum { F_UNKNOWN, F_READY, F_RESOLVING };

typedef struct obj {
    fetch_item    it;
    cache_writer *w;
    int           done;
    uint64_t      assigned;         /* [0, assigned) is in the writer or handed
                                       to a transfer; the rest is queued */
    int           running;          /* transfers carrying a segment of it */
    unsigned      inq;              /* bit p: an entry on queue p */
} obj;

/* Bytes [lo, hi) of object `obj` in one response; next: the next byte to
 * write (object-relative; bytes below it arrived before and are skipped). */
typedef struct seg {
    size_t   obj;                   /* index into s->objs */
    uint64_t lo, hi, next;
} seg;

typedef struct xfer {
    int           kind;             /* K_XFER: first, for CURLINFO_PRIVATE */
    fetch_session *s;
    CURL         *h;
    struct curl_slist *hl;
    uint32_t      file;
    int           prio;             /* of the object it was taken for */
    seg          *segs;             /* in offset order, back to back */
    size_t        nobj, cur;        /* nobj: number of segs */
    uint64_t      req_first, last;  /* the request's range, inclusive */
    uint64_t      pos;              /* next absolute byte expected */
    uint64_t      pos_at_start;
    http_headers  hdr;
    int           checked, refused, status_err, fatal, sent_token;
    shoal_err     xerr;
    int           attempts, forced_resolves, state;
    uint64_t      retry_at_ns;
    uint64_t      stall_ns;
    curl_off_t    stall_bytes;
    int           stalled;
    struct xfer  *next;
} xfer;

typedef struct resolver {
    int           kind;             /* K_RESOLVE */
    fetch_session *s;
    uint32_t      file;
    CURL         *h;
    struct curl_slist *hl;
    http_headers  hdr;
    char          url[HUB_URL_MAX];
    int           sent_token, attempts, waiting;
    uint64_t      retry_at_ns;
} resolver;

typedef struct sfile {
    int       state;
    up_file  *uf;
    resolver  r;
    int       local_fd;
} sfile;

struct fetch_session {
    fetch_upstream *u;
    cache          *c;
    const manifest *m;
    const fetch_loop_ops *ops;
    void           *loop;
    CURLM          *multi;
    char            ua[128];
    obj            *objs;
    size_t          nobjs, cap_objs;
    size_t         *queue[FETCH_PRIO_COUNT];   /* sorted by (file, offset) */
    size_t          qhead[FETCH_PRIO_COUNT], qlen[FETCH_PRIO_COUNT];
    size_t          nwaiting;        /* objects with unassigned bytes */
    uint64_t        unassigned;      /* their unassigned bytes */
    uint64_t        split_min;       /* 0: never split */
    int             split_ways;
    xfer           *xfers;
    int             nxfers;
    sfile          *files;
    uint64_t        curl_timer_ns;   /* 0: none */
    int             rc;
    shoal_err       err;
    uint8_t        *buf;             /* local reads */
    fetch_progress_fn pfn;
    void           *pctx;
    uint64_t        pinterval_ns, plast_ns, plast_bytes;
    double          rate;
    fetch_done_fn   dfn;
    void           *dctx;
    uint64_t        bytes_done, bytes_total, objects_done;
    int             final_sent;      /* the finished progress call went out */
    int             orphan;          /* an object lost its parts (a bug) */
};

static void session_fail(fetch_session *s, int rc, const char *msg);
static void start_request(xfer *x);
static void xfer_free(fetch_session *s, xfer *x);

/* ---- objects ------------------------------------------------------------------ */

static const char *obj_etag(const fetch_session *s, const obj *o)
{
    return s->m->files[o->it.file].etag;
}

/* Hand n more bytes of o to a transfer (or to what its writer holds). */
static void obj_take(fetch_session *s, obj *o, uint64_t n)
{
    if (n == 0 || o->assigned >= o->it.length)
        return;
    if (n > o->it.length - o->assigned)
        n = o->it.length - o->assigned;
    o->assigned += n;
    s->unassigned -= n;
    if (o->assigned == o->it.length)
        s->nwaiting--;
}

static void obj_finish(fetch_session *s, obj *o, int rc)
{
    if (o->done)
        return;
    obj_take(s, o, o->it.length - o->assigned);   /* nothing of it stays queued */
    o->done = 1;
    s->objects_done++;
    if (s->dfn)
        s->dfn(&o->it, rc, s->dctx);
}

/* Open (or resume) o's writer.  1: already cached (done); 0: writer open;
 * negative: error in err. */
static int obj_open(fetch_session *s, obj *o, shoal_err *err)
{
    const manifest *m = s->m;
    cache_key key = { obj_etag(s, o), o->it.offset, o->it.length };
    cache_names names = CACHE_NAMES_NONE;
    int rc;

    if (o->done)
        return 1;
    names.endpoint = m->endpoint;   /* the model as the manifest (and the daemon) name it */
    names.repo = m->repo;
    names.revision = m->revision;
    names.commit = m->commit;
    names.file = m->files[o->it.file].path;
    names.tensor = o->it.tensor;
    names.layer = o->it.layer;
    names.expert = o->it.expert;
    rc = cache_write_begin(s->c, &key, o->it.kind, &names, &o->w, err);
    if (rc == SHOAL_EEXIST) {
        s->bytes_done += o->it.length;
        s->u->st.objects_cached++;
        obj_finish(s, o, 0);
        return 1;
    }
    if (rc == SHOAL_EBUSY) {
        /* Another writer has it (the same object asked twice): not this
         * session's to fetch, and no reason to stop the others.  Callers
         * that need single-flight (the daemon) do it above the session. */
        s->bytes_done += o->it.length;
        obj_finish(s, o, SHOAL_EBUSY);
        return 1;
    }
    if (rc == 0) {
        s->bytes_done += cache_writer_offset(o->w);
        obj_take(s, o, cache_writer_offset(o->w));   /* resumed: from the durable prefix */
    }
    return rc;
}

static int obj_commit(fetch_session *s, obj *o, shoal_err *err)
{
    int rc = cache_write_commit(o->w, NULL, err);
    o->w = NULL;
    if (rc == 0) {
        s->u->st.objects_fetched++;
        obj_finish(s, o, 0);
    }
    return rc;
}

/* Keep what a writer has (resumable: its contiguous prefix) unless it is
 * empty.  Forgets the writer, so it happens once (invariant 5). */
static void obj_pause(obj *o)
{
    if (!o->w)
        return;
    if (cache_writer_offset(o->w) > 0)
        cache_write_pause(o->w, NULL);
    else
        cache_write_abort(o->w);
    o->w = NULL;
}

/* ---- the transfer callbacks (invariant 4: no multi calls in here) ------------- */

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
    size_t len = size * n, left = len;

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
    while (left > 0) {
        seg *g;
        obj *o;
        uint64_t end, take, rel;
        if (x->cur >= x->nobj) {
            x->refused = 1;
            shoal_err_set(&x->xerr, SHOAL_EPROTO, "the body is longer than the range");
            return 0;
        }
        g = &x->segs[x->cur];
        o = &s->objs[g->obj];
        end = o->it.offset + g->hi;
        take = end - x->pos < left ? end - x->pos : left;
        rel = x->pos - o->it.offset;
        if (o->w && !o->done && g->next < rel + take) {
            size_t skip;
            int rc;
            if (g->next < rel) {   /* a hole: invariant 3 broken */
                x->fatal = shoal_err_set(&x->xerr, SHOAL_EINTERNAL, "a part skipped bytes");
                return 0;
            }
            skip = (size_t)(g->next - rel);
            rc = cache_write_at(o->w, g->next, p + skip, (size_t)take - skip, &x->xerr);
            if (rc) {
                x->fatal = rc;
                return 0;
            }
            g->next += take - skip;
            s->bytes_done += take - skip;
            s->u->st.bytes_fetched += take - skip;
            if (cache_writer_offset(o->w) == o->it.length) {   /* the last byte landed */
                rc = obj_commit(s, o, &x->xerr);
                if (rc) {
                    x->fatal = rc;
                    return 0;
                }
            }
        }
        x->pos += take;
        p += take;
        left -= (size_t)take;
        if (x->pos == end) {
            if (o->w && !o->done && g->next != g->hi) {
                x->fatal = shoal_err_set(&x->xerr, SHOAL_EINTERNAL, "a part ended short");
                return 0;
            }
            x->cur++;
        }
    }
    return len;
}

/* Stall detection per transfer (see hub.c: the low-speed window alone
 * notices silence after a burst late). */
static int on_xfer_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                            curl_off_t ulnow)
{
    xfer *x = arg;
    uint64_t now = shoal_now_ns();
    (void)dltotal;
    (void)ultotal;
    (void)ulnow;
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

/* ---- starting requests ---------------------------------------------------------- */

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
        xfer_free(s, x);   /* every object was already there: nothing to ask */
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
    x->checked = x->refused = x->status_err = x->fatal = x->stalled = 0;
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
    x->stall_ns = shoal_now_ns();
    x->stall_bytes = 0;
    x->state = X_RUNNING;
    s->u->st.requests++;
    mc = curl_multi_add_handle(s->multi, x->h);
    if (mc != CURLM_OK)
        session_fail(s, SHOAL_EINTERNAL, curl_multi_strerror(mc));
}

static void start_resolve(fetch_session *s, uint32_t file);

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
            session_fail(s, SHOAL_EPROTO, "a file's etag or size differs from the manifest's");
            return 0;
        }
        f->state = F_READY;
        return 1;
    }
    f->uf = uf;
    start_resolve(s, file);
    return 0;
}

static void xfer_go(xfer *x)
{
    fetch_session *s = x->s;
    x->state = X_WAIT_RESOLVE;   /* before file_ready: it may fail the session and free x */
    if (file_ready(s, x->file))
        start_request(x);
}

/* ---- resolving on the multi handle ------------------------------------------------- */

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
        session_fail(s, SHOAL_EINTERNAL, "adding a resolve to the multi handle failed");
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
        session_fail(s, SHOAL_ENOMEM, "out of memory");
        return;
    }
    if (hub_url_resolve(s->u->endpoint, s->u->spec.repo, s->u->commit, s->m->files[file].path,
                        r->url, sizeof r->url)) {
        session_fail(s, SHOAL_ETOOBIG, "resolve URL too long");
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
    if (cc != CURLE_OK || http_status_retryable(status)) {
        if (++r->attempts >= s->u->o.max_attempts) {
            shoal_err_set(&e, SHOAL_ENET, "resolving %s: %s; giving up after %d attempts "
                          "(too many failures)", mf->path,
                          cc != CURLE_OK ? curl_easy_strerror(cc) : "busy", r->attempts);
            session_fail(s, e.code, e.msg);
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
        session_fail(s, e.code, e.msg);
        return;
    }
    if (status < 300 || status >= 400 || !h->location[0] || !strstr(h->location, "://")) {
        /* A small file (200) or a relative redirect: the blocking path
         * knows those; they are rare here (their locations never expire). */
        up_file *uf;
        if (up_resolve(s->u, mf->path, 1, &uf, &e) != 0) {
            session_fail(s, e.code, e.msg);
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
            session_fail(s, e.code, e.msg);
            return;
        }
        memcpy(hf.commit, h->commit, 41);
        memcpy(hf.location, h->location, strlen(h->location) + 1);
        up_file_store(s->u, f->uf, &hf);
    }
    if (strcmp(f->uf->hf.etag, mf->etag) != 0 || f->uf->hf.size != mf->size) {
        shoal_err_set(&e, SHOAL_EPROTO, "%s changed under the pinned commit %s (etag %s, "
                      "manifest %s)", mf->path, s->u->commit, f->uf->hf.etag, mf->etag);
        session_fail(s, e.code, e.msg);
        return;
    }
    LOG_DEBUG("fetch", "resolved %s", mf->path);
    f->state = F_READY;
    wake_file(s, r->file);
}

/* ---- transfers finishing --------------------------------------------------------------- */

static void xfer_free(fetch_session *s, xfer *x)
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
            s->orphan = 1;   /* every part ended, yet no commit: checked in after() */
    }
    if (x->h)
        curl_easy_cleanup(x->h);
    curl_slist_free_all(x->hl);
    free(x->segs);
    free(x);
}

static void xfer_retry(xfer *x, long hint_s, const char *why)
{
    fetch_session *s = x->s;
    seg *g = &x->segs[x->cur];
    long ms;

    if (x->pos > x->pos_at_start)
        x->attempts = 0;   /* progress: the failure count starts again */
    if (++x->attempts >= s->u->o.max_attempts) {
        shoal_err e;
        shoal_err_set(&e, SHOAL_ENET, "%s bytes %" PRIu64 "-%" PRIu64 ": %s; giving up after "
                      "%d attempts without progress (too many failures)",
                      s->m->files[x->file].path, x->pos, x->last, why, x->attempts);
        session_fail(s, e.code, e.msg);
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
        session_fail(s, x->fatal, x->xerr.msg);
        return;
    }
    if (x->cur >= x->nobj) {
        xfer_free(s, x);
        return;
    }
    if (x->refused) {
        s->u->st.refused++;
        xfer_retry(x, -1, x->xerr.msg);
    } else if (x->status_err == 403 && s->files[x->file].uf->hf.is_lfs) {
        if (++x->forced_resolves > XF_MAX_RESOLVES) {
            session_fail(s, SHOAL_EAUTH, "the CDN keeps refusing fresh locations (HTTP 403)");
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
        session_fail(s, e.code, e.msg);
    } else {
        snprintf(why, sizeof why, "%s", x->stalled ? "stalled (no byte for the stall timeout)"
                                   : cc != CURLE_OK ? curl_easy_strerror(cc)
                                   : "the body ended early");
        xfer_retry(x, -1, why);
    }
}

static void process(fetch_session *s)
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

/* ---- scheduling ------------------------------------------------------------------------- */

/* 1 when o can be handed out: not finished, bytes still unassigned, on
 * queue p for its priority. */
static int obj_queued(const obj *o, int p)
{
    return !o->done && o->assigned < o->it.length && o->it.priority == p;
}

/* The first object of the best non-empty priority (ties: queue order),
 * dropping stale heads; NULL when nothing waits.  *prio gets its queue. */
static obj *queue_pick(fetch_session *s, int *prio)
{
    for (int p = 0; p < FETCH_PRIO_COUNT; p++) {
        while (s->qhead[p] < s->qlen[p]) {
            obj *o = &s->objs[s->queue[p][s->qhead[p]]];
            if (obj_queued(o, p)) {
                *prio = p;
                return o;
            }
            o->inq &= ~(1u << p);
            s->qhead[p]++;
        }
    }
    return NULL;
}

static int big_object(const fetch_session *s, const obj *o)
{
    return s->split_min && o->it.length >= 2 * s->split_min;
}

/* Guided self-scheduling: the part is max(split_min, ceil(U / P)) of all
 * unassigned bytes U, clipped to the object's rest, and the whole rest
 * when less than split_min would remain.  With much queued (U / P at least
 * an object) whole objects go out, one request each; as the queue drains
 * parts shrink, so every connection finishes at about the same time.  A
 * prefetch always goes in split_min parts: a demand arriving behind it
 * then waits at most one small part for a connection. */
static uint64_t part_length(const fetch_session *s, const obj *o)
{
    uint64_t rest = o->it.length - o->assigned;
    uint64_t p = s->split_ways > 0 ? (uint64_t)s->split_ways : 1;
    uint64_t n = (s->unassigned + p - 1) / p;
    if (n < s->split_min || o->it.priority == FETCH_PRIO_PREFETCH)
        n = s->split_min;
    if (n >= rest || rest - n < s->split_min)
        n = rest;
    return n;
}

static int seg_add(xfer *x, size_t *cap, size_t oi, uint64_t lo, uint64_t hi, uint64_t next)
{
    if (x->nobj == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        seg *ng;
        if (nc > XF_MAX_RUN)
            return SHOAL_ETOOBIG;
        ng = realloc(x->segs, nc * sizeof *ng);
        if (!ng)
            return SHOAL_ENOMEM;
        x->segs = ng;
        *cap = nc;
    }
    x->segs[x->nobj++] = (seg){ oi, lo, hi, next };
    return 0;
}

/* Open o's writer if needed.  1: o finished (cached, busy, or resumed
 * complete and committed); 0: ready; negative: the session failed. */
static int obj_ready(fetch_session *s, obj *o)
{
    shoal_err e;
    int rc;
    if (o->done)
        return 1;
    if (!o->w) {
        rc = obj_open(s, o, &e);
        if (rc < 0) {
            if (rc == SHOAL_ENOSPC)
                shoal_err_wrap(&e, rc, "disk full or over the cache budget: free space or "
                               "raise the budget");
            session_fail(s, rc, e.msg);
            return rc;
        }
        if (rc == 1)
            return 1;
    }
    if (cache_writer_offset(o->w) == o->it.length && o->running == 0) {
        /* a paused write that had every byte: nothing to fetch */
        if ((rc = obj_commit(s, o, &e)) != 0) {
            session_fail(s, rc, e.msg);
            return rc;
        }
        return 1;
    }
    return 0;
}

/* Fill x from the best queued object: a part of a big object, or a run of
 * adjacent small objects of one file (up to coalesce bytes).  0 with
 * x->nobj == 0 when nothing is queued. */
static int take_work(fetch_session *s, xfer *x)
{
    size_t cap = 0;
    uint64_t total = 0, end;
    int p = 0, rc;
    obj *o;

    for (;;) {
        if (!(o = queue_pick(s, &p)))
            return 0;
        rc = obj_ready(s, o);
        if (rc < 0)
            return rc;
        if (rc == 0 && o->assigned < o->it.length)
            break;
    }
    x->file = o->it.file;
    x->prio = p;
    if (big_object(s, o)) {
        uint64_t n = part_length(s, o);
        if ((rc = seg_add(x, &cap, (size_t)(o - s->objs), o->assigned, o->assigned + n,
                          o->assigned)) != 0)
            return rc;
        obj_take(s, o, n);
        o->running++;
        return 0;
    }
    /* A small object goes whole (from what its writer holds), then its
     * neighbours on the same queue while they are adjacent and small. */
    if ((rc = seg_add(x, &cap, (size_t)(o - s->objs), o->assigned, o->it.length, o->assigned)) != 0)
        return rc;
    total = o->it.length - o->assigned;
    obj_take(s, o, o->it.length - o->assigned);
    o->running++;
    end = o->it.offset + o->it.length;
    for (size_t i = s->qhead[p] + 1; i < s->qlen[p] && x->nobj < XF_MAX_RUN; i++) {
        obj *n = &s->objs[s->queue[p][i]];
        if (!obj_queued(n, p) || n->assigned != 0 || n->it.file != x->file
            || n->it.offset != end || big_object(s, n)
            || total + n->it.length > s->u->o.coalesce_bytes)
            break;
        rc = obj_ready(s, n);
        if (rc < 0)
            return rc;
        if (rc == 1)
            break;
        /* the response covers all of n; what its writer holds is skipped */
        if ((rc = seg_add(x, &cap, (size_t)(n - s->objs), 0, n->it.length, n->assigned)) != 0)
            return rc == SHOAL_ETOOBIG ? 0 : rc;
        total += n->it.length;
        obj_take(s, n, n->it.length - n->assigned);
        n->running++;
        end = n->it.offset + n->it.length;
    }
    return 0;
}

/* May another transfer start?  Up to `parallel`; beyond that, up to
 * demand_headroom more for a demand item while a warm transfer holds a
 * connection (background warming never delays an engine by a whole part).
 * A prefetch gets no such pass: it is the engine's own guess, kept inside
 * the connection budget, and its parts are small (part_length) so a demand
 * waits at most one small part for a connection. */
static int slot_free(fetch_session *s)
{
    int p = 0;
    if (s->nxfers < s->u->o.parallel)
        return 1;
    if (s->nxfers >= s->u->o.parallel + s->u->o.demand_headroom || !queue_pick(s, &p)
        || p != FETCH_PRIO_DEMAND)
        return 0;
    for (xfer *x = s->xfers; x; x = x->next)
        if (x->prio == FETCH_PRIO_WARM)
            return 1;
    return 0;
}

static void schedule(fetch_session *s)
{
    while (s->rc == 0 && !s->u->local && s->nwaiting > 0 && slot_free(s)) {
        xfer *x = calloc(1, sizeof *x);
        int rc;
        if (!x || !(x->h = curl_easy_init())) {
            free(x);
            session_fail(s, SHOAL_ENOMEM, "out of memory");
            return;
        }
        x->kind = K_XFER;
        x->s = s;
        x->next = s->xfers;
        s->xfers = x;
        s->nxfers++;
        rc = take_work(s, x);
        if (rc < 0 || s->rc) {
            if (s->rc == 0)
                session_fail(s, rc, "out of memory");
            return;   /* session_fail's stop_all freed x */
        }
        if (x->nobj == 0) {   /* nothing queued after all */
            xfer_free(s, x);
            break;
        }
        {
            seg *g = &x->segs[x->nobj - 1];
            x->last = s->objs[g->obj].it.offset + g->hi - 1;
        }
        xfer_go(x);
    }
}

/* ---- local upstreams ------------------------------------------------------------------------ */

/* Copy up to XF_LOCAL_STEP bytes of queued objects with pread, best
 * priority first.  1 if work remains. */
static int local_step(fetch_session *s)
{
    uint64_t budget = XF_LOCAL_STEP;
    shoal_err e;
    obj *o;
    int p;

    while (s->rc == 0 && budget > 0 && (o = queue_pick(s, &p)) != NULL) {
        sfile *f = &s->files[o->it.file];
        int rc;
        if (f->local_fd < 0) {
            char full[PATH_MAX];
            if (up_local_path(s->u, s->m->files[o->it.file].path, full, sizeof full)
                || (f->local_fd = open(full, O_RDONLY | O_CLOEXEC)) < 0) {
                session_fail(s, SHOAL_ENOTFOUND, "cannot open a snapshot file");
                return 0;
            }
        }
        if (obj_ready(s, o) != 0)
            continue;   /* finished, or the session failed */
        while (budget > 0 && cache_writer_offset(o->w) < o->it.length) {
            uint64_t off = cache_writer_offset(o->w), n = o->it.length - off;
            if (n > XF_LOCAL_CHUNK)
                n = XF_LOCAL_CHUNK;
            rc = shoal_pread_all(f->local_fd, s->buf, (size_t)n, (off_t)(o->it.offset + off));
            if (rc) {
                shoal_err_set(&e, rc, "reading %s at %" PRIu64 ": %s",
                              s->m->files[o->it.file].path, o->it.offset + off,
                              rc == SHOAL_ERANGE ? "the file is shorter than the manifest says"
                                                 : strerror(errno));
                session_fail(s, rc, e.msg);
                return 0;
            }
            if ((rc = cache_write_append(o->w, s->buf, (size_t)n, &e)) != 0) {
                session_fail(s, rc, e.msg);
                return 0;
            }
            s->bytes_done += n;
            s->u->st.bytes_fetched += n;
            budget -= n < budget ? n : budget;
        }
        if (cache_writer_offset(o->w) == o->it.length) {
            if ((rc = obj_commit(s, o, &e)) != 0) {
                session_fail(s, rc, e.msg);
                return 0;
            }
        }
    }
    return s->rc == 0 && s->nwaiting > 0;
}

/* ---- timers and progress ---------------------------------------------------------------------- */

static void progress(fetch_session *s, int final)
{
    uint64_t now = shoal_now_ns();
    fetch_progress p;
    if (!s->pfn || (!final && now - s->plast_ns < s->pinterval_ns))
        return;
    if (now > s->plast_ns && s->plast_ns) {
        double inst = (double)(s->u->st.bytes_fetched - s->plast_bytes) * 1e9
                      / (double)(now - s->plast_ns);
        s->rate = s->rate == 0 ? inst : 0.6 * s->rate + 0.4 * inst;
    }
    s->plast_ns = now;
    s->plast_bytes = s->u->st.bytes_fetched;
    p = (fetch_progress){ s->bytes_done, s->bytes_total, s->objects_done, s->nobjs, s->rate,
                          s->u->st.retries, final };
    s->pfn(&p, s->pctx);
}

static void rearm(fetch_session *s)
{
    uint64_t now = shoal_now_ns(), next = UINT64_MAX;
    long ms;

    if (s->curl_timer_ns)
        next = s->curl_timer_ns;
    for (xfer *x = s->xfers; x; x = x->next)
        if (x->state == X_WAIT_RETRY && x->retry_at_ns < next)
            next = x->retry_at_ns;
    for (size_t i = 0; s->files && i < s->m->nfiles; i++)
        if (s->files[i].r.waiting && s->files[i].r.retry_at_ns < next)
            next = s->files[i].r.retry_at_ns;
    if (s->u->local && s->rc == 0 && s->nwaiting > 0)
        next = now;
    if (s->pfn && !fetch_session_idle(s) && s->plast_ns + s->pinterval_ns < next)
        next = s->plast_ns + s->pinterval_ns;
    if (next == UINT64_MAX)
        ms = -1;
    else if (next <= now)
        ms = 0;
    else
        ms = (long)((next - now + 999999) / 1000000);
    s->ops->timer(s->loop, ms);
}

static void after(fetch_session *s)
{
    process(s);
    schedule(s);
    process(s);
    if (s->orphan && s->rc == 0)
        session_fail(s, SHOAL_EINTERNAL, "an object's parts all ended before its last byte");
    if (fetch_session_idle(s)) {
        if (!s->final_sent)
            progress(s, 1);
        s->final_sent = 1;
    } else {
        progress(s, 0);
    }
    rearm(s);
}

void fetch_session_io(fetch_session *s, int fd, unsigned what)
{
    int running, ev = 0;
    if (what & FETCH_WATCH_IN)
        ev |= CURL_CSELECT_IN;
    if (what & FETCH_WATCH_OUT)
        ev |= CURL_CSELECT_OUT;
    curl_multi_socket_action(s->multi, fd, ev, &running);
    after(s);
}

void fetch_session_timeout(fetch_session *s)
{
    uint64_t now = shoal_now_ns();
    int running;

    if (s->curl_timer_ns && s->curl_timer_ns <= now) {
        s->curl_timer_ns = 0;
        curl_multi_socket_action(s->multi, CURL_SOCKET_TIMEOUT, 0, &running);
        process(s);
    }
    /* xfer_go may free x (or, failing, every transfer): take next first and
     * stop on a failure. */
    for (xfer *x = s->xfers, *nx; s->rc == 0 && x; x = nx) {
        nx = x->next;
        if (x->state == X_WAIT_RETRY && x->retry_at_ns <= now)
            xfer_go(x);
    }
    for (size_t i = 0; s->rc == 0 && i < s->m->nfiles; i++)
        if (s->files[i].r.waiting && s->files[i].r.retry_at_ns <= now)
            resolve_launch(&s->files[i].r);
    if (s->u->local)
        local_step(s);
    after(s);
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

/* ---- the session ---------------------------------------------------------------------------------- */

static void stop_all(fetch_session *s)
{
    while (s->xfers) {
        xfer *x = s->xfers;
        if (x->state == X_RUNNING)
            curl_multi_remove_handle(s->multi, x->h);
        xfer_free(s, x);
    }
    for (size_t i = 0; i < s->m->nfiles; i++) {
        resolver *r = &s->files[i].r;
        if (s->files[i].state == F_RESOLVING && !r->waiting && r->h)
            curl_multi_remove_handle(s->multi, r->h);
        r->waiting = 0;
        if (s->files[i].state == F_RESOLVING)
            s->files[i].state = F_UNKNOWN;
    }
    for (size_t i = 0; i < s->nobjs; i++) {
        obj_pause(&s->objs[i]);   /* once per object, whatever its parts did */
        if (!s->objs[i].done)     /* everyone waiting hears why */
            obj_finish(s, &s->objs[i], s->rc ? s->rc : SHOAL_ECANCELED);
    }
    for (int p = 0; p < FETCH_PRIO_COUNT; p++)
        s->qhead[p] = s->qlen[p];
}

static void session_fail(fetch_session *s, int rc, const char *msg)
{
    if (s->rc)
        return;
    s->rc = rc;
    shoal_err_set(&s->err, rc, "%s", msg);
    LOG_DEBUG("fetch", "session failed: %s", msg);   /* the caller reports it */
    stop_all(s);
}

int fetch_session_new(fetch_upstream *u, cache *c, const manifest *m, const fetch_loop_ops *ops,
                      void *loop, fetch_session **out, shoal_err *err)
{
    fetch_session *s = calloc(1, sizeof *s);

    *out = NULL;
    if (!s)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    s->u = u;
    s->c = c;
    s->m = m;
    s->ops = ops;
    s->loop = loop;
    s->pinterval_ns = 250000000ull;
    s->split_min = u->o.split_min == 0 ? FETCH_DEFAULT_SPLIT_MIN
                   : u->o.split_min == FETCH_SPLIT_NEVER ? 0 : u->o.split_min;
    s->split_ways = u->o.split_ways > 0 ? u->o.split_ways : u->o.parallel;
    http_user_agent(s->ua, sizeof s->ua);
    s->files = calloc(m->nfiles ? m->nfiles : 1, sizeof *s->files);
    if (!s->files) {
        free(s);
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < m->nfiles; i++)
        s->files[i].local_fd = -1;
    if (u->local) {
        s->buf = malloc(XF_LOCAL_CHUNK);
        if (!s->buf) {
            fetch_session_free(s);
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        }
    } else {
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK || !(s->multi = curl_multi_init())) {
            fetch_session_free(s);
            return shoal_err_set(err, SHOAL_EINTERNAL, "libcurl multi initialisation failed");
        }
        curl_multi_setopt(s->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
        curl_multi_setopt(s->multi, CURLMOPT_SOCKETDATA, s);
        curl_multi_setopt(s->multi, CURLMOPT_TIMERFUNCTION, on_timer);
        curl_multi_setopt(s->multi, CURLMOPT_TIMERDATA, s);
        curl_multi_setopt(s->multi, CURLMOPT_PIPELINING, (long)CURLPIPE_MULTIPLEX);
    }
    *out = s;
    return 0;
}

void fetch_session_free(fetch_session *s)
{
    if (!s)
        return;
    if (s->files)
        stop_all(s);
    for (size_t i = 0; s->files && i < s->m->nfiles; i++) {
        if (s->files[i].r.h)
            curl_easy_cleanup(s->files[i].r.h);
        curl_slist_free_all(s->files[i].r.hl);
        if (s->files[i].local_fd >= 0)
            close(s->files[i].local_fd);
    }
    if (s->multi) {
        curl_multi_cleanup(s->multi);
        curl_global_cleanup();
    }
    free(s->files);
    free(s->objs);
    for (int p = 0; p < FETCH_PRIO_COUNT; p++)
        free(s->queue[p]);
    free(s->buf);
    free(s);
}

void fetch_session_on_progress(fetch_session *s, fetch_progress_fn fn, void *ctx, long interval_ms)
{
    s->pfn = fn;
    s->pctx = ctx;
    s->pinterval_ns = (uint64_t)(interval_ms > 0 ? interval_ms : 250) * 1000000ull;
}

void fetch_session_on_done(fetch_session *s, fetch_done_fn fn, void *ctx)
{
    s->dfn = fn;
    s->dctx = ctx;
}

static const fetch_session *sort_session;   /* qsort has no context argument */

static int queue_cmp(const void *a, const void *b)
{
    const obj *x = &sort_session->objs[*(const size_t *)a];
    const obj *y = &sort_session->objs[*(const size_t *)b];
    if (x->it.file != y->it.file)
        return x->it.file < y->it.file ? -1 : 1;
    return x->it.offset < y->it.offset ? -1 : x->it.offset > y->it.offset;
}

/* Make room for n more entries on queue p, dropping its consumed head. */
static int queue_reserve(fetch_session *s, int p, size_t n)
{
    size_t live = s->qlen[p] - s->qhead[p];
    size_t *q;
    if (live > 0 && s->qhead[p] > 0)
        memmove(s->queue[p], s->queue[p] + s->qhead[p], live * sizeof *s->queue[p]);
    s->qlen[p] = live;
    s->qhead[p] = 0;
    q = realloc(s->queue[p], (live + n + 1) * sizeof *q);
    if (!q)
        return SHOAL_ENOMEM;
    s->queue[p] = q;
    return 0;
}

static void queue_sort(fetch_session *s, int p)
{
    sort_session = s;
    qsort(s->queue[p] + s->qhead[p], s->qlen[p] - s->qhead[p], sizeof *s->queue[p], queue_cmp);
    sort_session = NULL;
}

int fetch_session_add(fetch_session *s, const fetch_item *items, size_t n, shoal_err *err)
{
    size_t per[FETCH_PRIO_COUNT] = { 0 };
    if (s->rc)
        return fetch_session_status(s, err);
    for (size_t i = 0; i < n; i++) {
        if (items[i].priority < 0 || items[i].priority >= FETCH_PRIO_COUNT)
            return shoal_err_set(err, SHOAL_EINVAL, "item priority %d out of range",
                                 items[i].priority);
        per[items[i].priority]++;
    }
    if (s->nobjs + n > s->cap_objs) {
        size_t nc = s->nobjs + n + 64;
        obj *p = realloc(s->objs, nc * sizeof *p);
        if (!p)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
        s->objs = p;
        s->cap_objs = nc;
    }
    for (int p = 0; p < FETCH_PRIO_COUNT; p++)
        if (per[p] && queue_reserve(s, p, per[p]) != 0)
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const fetch_item *it = &items[i];
        cache_key key;
        cache_obj co;
        obj *o;
        if (it->file >= s->m->nfiles || it->length == 0
            || it->offset + it->length > s->m->files[it->file].size)
            return shoal_err_set(err, SHOAL_ERANGE, "item outside its file");
        o = &s->objs[s->nobjs];
        memset(o, 0, sizeof *o);
        o->it = *it;
        s->bytes_total += it->length;
        s->u->st.objects_total++;
        s->u->st.bytes_total += it->length;
        key = (cache_key){ s->m->files[it->file].etag, it->offset, it->length };
        if (cache_lookup(s->c, &key, NULL, &co, NULL) == 0) {
            close(co.fd);
            s->nobjs++;
            s->bytes_done += it->length;
            s->u->st.objects_cached++;
            o->assigned = it->length;
            obj_finish(s, o, 0);
            continue;
        }
        s->nwaiting++;
        s->unassigned += it->length;
        o->inq = 1u << it->priority;
        s->queue[it->priority][s->qlen[it->priority]++] = s->nobjs++;
    }
    s->final_sent = 0;
    for (int p = 0; p < FETCH_PRIO_COUNT; p++)
        if (per[p])
            queue_sort(s, p);
    after(s);
    return 0;
}

/* The unfinished object (file, offset, length), newest first; NULL if none. */
static obj *obj_find(fetch_session *s, uint32_t file, uint64_t offset, uint64_t length)
{
    for (size_t i = s->nobjs; i-- > 0;) {
        obj *o = &s->objs[i];
        if (!o->done && o->it.file == file && o->it.offset == offset && o->it.length == length)
            return o;
    }
    return NULL;
}

int fetch_session_set_priority(fetch_session *s, uint32_t file, uint64_t offset, uint64_t length,
                               int prio)
{
    obj *o;
    if (prio < 0 || prio >= FETCH_PRIO_COUNT)
        return SHOAL_EINVAL;
    if (!(o = obj_find(s, file, offset, length)))
        return SHOAL_ENOTFOUND;
    if (o->it.priority == prio)
        return 0;
    o->it.priority = prio;
    if (o->assigned < o->it.length && !(o->inq & (1u << prio))) {
        /* the entry on the old queue goes stale (queue_pick drops it) */
        if (queue_reserve(s, prio, 1) != 0)
            return SHOAL_ENOMEM;
        s->queue[prio][s->qlen[prio]++] = (size_t)(o - s->objs);
        o->inq |= 1u << prio;
        queue_sort(s, prio);
    }
    after(s);
    return 0;
}

int fetch_session_cancel(fetch_session *s, uint32_t file, uint64_t offset, uint64_t length)
{
    obj *o = obj_find(s, file, offset, length);
    size_t oi;
    if (!o)
        return SHOAL_ENOTFOUND;
    oi = (size_t)(o - s->objs);
    obj_pause(o);   /* keeps the contiguous prefix (invariant 5) */
    obj_finish(s, o, SHOAL_ECANCELED);
    /* Stop the transfers that carry only this object; a coalesced run
     * with others goes on and drops its bytes (the object is done). */
    for (xfer *x = s->xfers, *nx; x; x = nx) {
        int mine = 0, others = 0;
        nx = x->next;
        for (size_t i = 0; i < x->nobj; i++) {
            if (x->segs[i].obj == oi)
                mine = 1;
            else if (!s->objs[x->segs[i].obj].done)
                others = 1;
        }
        if (!mine || others)
            continue;
        if (x->state == X_RUNNING)
            curl_multi_remove_handle(s->multi, x->h);
        xfer_free(s, x);
    }
    after(s);
    return 0;
}

int fetch_session_idle(const fetch_session *s)
{
    return s->nwaiting == 0 && s->nxfers == 0;
}

int fetch_session_status(const fetch_session *s, shoal_err *err)
{
    if (s->rc && err)
        *err = s->err;
    return s->rc;
}

void fetch_session_stop(fetch_session *s)
{
    if (s->rc == 0) {
        s->rc = SHOAL_ECANCELED;
        shoal_err_set(&s->err, SHOAL_ECANCELED, "stopped; partial objects are kept and a "
                      "later run resumes them");
    }
    stop_all(s);
    rearm(s);
}
