/* xfer_int.h — what the four files of a fetch session share: the session,
 * its objects, transfers and resolvers.  Private to fetcher/xfer_*.c.
 *
 * A fetch session moves range transfers into cache writers over libcurl
 * multi, driven by the caller's event loop (fetch_loop_ops, fetch.h).  Its
 * work is split by responsibility:
 *   xfer_sched.c  the session and its queues (one per priority, objects
 *                 sorted by file and offset): what goes on a connection
 *                 and when, priorities, cancel, stop, progress, timers;
 *   xfer_parts.c  cutting queued work into requests: a part of a large
 *                 object (guided self-scheduling) or a coalesced run of
 *                 adjacent small objects of one file;
 *   xfer_curl.c   the libcurl plumbing: requests, the callbacks and the
 *                 strict 206 check, retries with backoff and jitter, stall
 *                 detection, re-resolving an expired CDN location with a
 *                 HEAD on the multi handle, the loop's entry points;
 *   xfer_store.c  the cache side: writers opened (or resumed), committed
 *                 and paused, a response's bytes into their objects, and
 *                 local snapshot directories read with pread in bounded
 *                 steps from the timer, so the loop stays responsive.
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
 *   4. Library callbacks (write, header, progress) never call back into
 *      the multi handle; failures are acted on when the transfer completes.
 *   5. One writer per object, held by the object (not by its transfers):
 *      the object commits when the writer's contiguous prefix reaches its
 *      length, whichever part lands last; it is paused or aborted only by
 *      xf_obj_pause (stop, failure, cancel), which forgets it, so exactly
 *      once.
 */
#ifndef SHOAL_FETCHER_XFER_INT_H
#define SHOAL_FETCHER_XFER_INT_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "fetcher/fetch_int.h"
#include "fetcher/http_int.h"

#define XF_MAX_RUN          256            /* objects in one coalesced request */
#define XF_LOCAL_CHUNK      (4u << 20)     /* pread size for local upstreams */
#define XF_LOCAL_STEP       (64ull << 20)  /* bytes per timer tick, local */
#define XF_MAX_RESOLVES     4              /* CDN refusals in a row per transfer */

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
    int           slow;             /* stopped below the low-speed limit */
    int           fresh;            /* the next request on a new connection */
    uint64_t      ls_ns;            /* the low-speed window's start */
    curl_off_t    ls_bytes;         /* ... and the bytes then */
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

/* ---- xfer_sched.c ---------------------------------------------------------- */

/* Fail the session once: record why, stop everything (every waiter hears
 * the code).  Later failures are ignored. */
void xf_session_fail(fetch_session *s, int rc, const char *msg);
/* 1 when o can be handed out from queue p. */
int xf_obj_queued(const obj *o, int p);
/* The first object of the best non-empty priority; NULL when nothing
 * waits.  *prio gets its queue. */
obj *xf_queue_pick(fetch_session *s, int *prio);
/* After any event: finished transfers, new ones, progress, the timer. */
void xf_after(fetch_session *s);

/* ---- xfer_parts.c ---------------------------------------------------------- */

/* Fill x (empty) from the best queued object.  0 with x->nobj == 0 when
 * nothing is queued; negative: the session failed or no memory. */
int xf_take_work(fetch_session *s, xfer *x);

/* ---- xfer_curl.c ----------------------------------------------------------- */

/* A new transfer with its easy handle, on the session's list; NULL when
 * out of memory. */
xfer *xf_new(fetch_session *s);
/* Start x once its file's location is usable (resolving it first if
 * needed).  May free x. */
void xf_go(xfer *x);
/* Unlink and free x (its objects keep their writers, invariant 5). */
void xf_free(fetch_session *s, xfer *x);
/* Take x off the multi handle if it runs, then free it. */
void xf_drop(fetch_session *s, xfer *x);
/* Act on every finished transfer and resolve. */
void xf_process(fetch_session *s);
/* The multi handle for a Hub upstream: 0 or -1. */
int xf_curl_init(fetch_session *s);
/* Every transfer and resolve off the multi handle (transfers freed). */
void xf_curl_stop(fetch_session *s);
/* The resolvers' handles and the multi handle. */
void xf_curl_free(fetch_session *s);

/* ---- xfer_store.c ---------------------------------------------------------- */

/* Hand n more bytes of o to a transfer (or to what its writer holds). */
void xf_obj_take(fetch_session *s, obj *o, uint64_t n);
/* o is finished with rc: counted, and the done callback told. */
void xf_obj_finish(fetch_session *s, obj *o, int rc);
/* Open o's writer if needed.  1: o finished; 0: ready; negative: the
 * session failed. */
int xf_obj_ready(fetch_session *s, obj *o);
/* Keep what o's writer has (or drop it if empty) and forget it. */
void xf_obj_pause(obj *o);
/* Bytes p[0..len) of x's response at x->pos into their objects
 * (invariants 2, 3).  0, or -1 to abort the transfer (x->xerr says why). */
int xf_body_write(xfer *x, const char *p, size_t len);
/* Local upstream: copy up to XF_LOCAL_STEP queued bytes.  1 if work remains. */
int xf_local_step(fetch_session *s);

#endif
