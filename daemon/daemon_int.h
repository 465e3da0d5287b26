/* daemon_int.h — shoald's internal interfaces, shared by the files of
 * daemon/ and by nothing else.
 *
 * The daemon is one loop thread running one libevent loop, and a few
 * worker threads (work.c) for whatever could hold the loop up: opening a
 * model, storing and checking large objects, scans (DESIGN decision 12).
 * It composes the cache (cache/cache.h: blobs, index, counters) and the
 * fetcher (upstream transfers) around a Unix socket server that speaks
 * docs/protocol.md.  Only the loop thread touches connections, sched,
 * models and the cache's writer handle; a job hands its results back to
 * the loop, which applies them in short steps.
 *
 *   main.c     flags, config, detach, pid file, signals: the program's edge
 *   server.c   the listening socket: stale-socket detection, mode 0600
 *   conn.c     one connection: framing, bounded input, an output queue of
 *              (bytes, descriptor) messages flushed with sendmsg
 *   request.c  decoding a request body into a daemon_request (pure; fuzzed)
 *   session.c  per-connection state: session counters, handles, GETs
 *   model.c    the table of open models (manifest, key -> object); opening
 *              one on a worker, with the OPENs that join it
 *   work.c     worker threads, loop steps, pending requests and PROGRESS
 *   keep.c     storing what a manifest build kept (headers, the manifest)
 *   sched.c    single-flight transfer table, priority queues, waiters
 *   upstream.c running one transfer: the fetcher, or a local snapshot
 *   warm.c     warm jobs, persisted under $SHOAL_HOME/jobs/
 *   derived.c  derived objects: PUT, PUT_BEGIN / PUT_COMMIT, lookup by name
 *   ops.c      the request handlers
 *   stats.c    the STATS JSON (docs/stats-json.md)
 *   integrity.c files checked against their upstream hash once complete,
 *              quarantine and re-fetch; damaged objects clients report
 *   peer.c     objects read in place from the Hugging Face cache: their
 *              hashes on workers, remembered; served only as verified
 *   metrics.c  --metrics: the counters in Prometheus's text format over HTTP
 *
 * Memory bound (docs/daemon.md): per connection, input is at most one frame
 * (24 + 1 MiB); outstanding GET keys are at most DAEMON_CONN_MAX_KEYS;
 * reading stops while DAEMON_CONN_MAX_KEYS messages or
 * DAEMON_CONN_MAX_CONTROL control replies are queued, so the output queue
 * holds at most 2 x DAEMON_CONN_MAX_KEYS + DAEMON_CONN_MAX_CONTROL messages.
 * Transfers stream into cache writers through buffers of at most
 * UPSTREAM_CHUNK bytes each, DAEMON_PARALLEL_MAX at once.
 */
#ifndef SHOAL_DAEMON_INT_H
#define SHOAL_DAEMON_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"
#include "common/buf.h"
#include "common/err.h"
#include "common/manifest.h"
#include "common/path.h"
#include "common/proto.h"

struct event_base;
struct event;
struct evhttp;

#define DAEMON_CONN_MAX_KEYS     8192   /* outstanding GET keys per connection */
#define DAEMON_CONN_MAX_CONTROL  64     /* queued non-GET replies before reading pauses */
#define DAEMON_CONN_MAX_GETS     256    /* open GET requests per connection */
#define DAEMON_CONN_MAX_HANDLES  64     /* models one connection may hold open */
#define DAEMON_PARALLEL_MAX      64
#define DAEMON_MODELS_MAX        256
#define DAEMON_JOBS_MAX          256
#define DAEMON_RECENT_SESSIONS   16
#define DAEMON_JSON_MAX          (64u << 20)   /* a JSON reply, sent as several frames */
#define DAEMON_CONN_MAX_PUTS     4      /* PUT_BEGINs not yet committed, per connection */
#define DAEMON_WORKERS           4      /* worker threads */
#define DAEMON_GC_STEP           (1ull << 30)   /* bytes one GC step may evict */
#define DAEMON_REMOVE_STEP       256    /* objects one verify step removes */
#define DAEMON_INTEGRITY_DAMAGED_MAX 1024  /* damaged objects one REPORT may name */

typedef struct shoald shoald;
typedef struct conn conn;
typedef struct model model;
typedef struct xfer xfer;
typedef struct waiter waiter;
typedef struct warm_job warm_job;
typedef struct getreq getreq;
typedef struct work work;
typedef struct pending pending;
typedef struct opening opening;
typedef struct put put;

/* Priorities, lowest value first.  PRIO_WARM is never on the wire. */
enum { PRIO_DEMAND = 0, PRIO_PREFETCH = 1, PRIO_WARM = 2, PRIO_COUNT = 3 };

/* Settings kept in HOME/shoald.conf (settings.c), and where each came from. */
enum { DSET_MAX_SIZE = 0, DSET_PARALLEL, DSET_SPLIT_MIN, DSET_KEEP_SPINE, DSET_MAX_CONNS,
       DSET_MAX_CONN_FDS, DSET_MAX_FDS, DSET_MAX_BUFFERED, DSET_FRAME_TIMEOUT, DSET_LOW_SPEED,
       DSET_COUNT };
enum { DSET_DEFAULT = 0, DSET_FILE = 1, DSET_ARGS = 2 };
typedef struct daemon_setting {
    uint8_t from;                  /* DSET_DEFAULT / _FILE / _ARGS */
    char    text[64];              /* the value as written */
} daemon_setting;

/* What connections may hold (docs/daemon.md, "Limits"): the settings, and
 * in shoald.lim the same cut to the descriptors the process may open. */
typedef struct daemon_limits {
    unsigned conns;                /* connections at once */
    unsigned conn_fds;             /* descriptors queued to one connection */
    unsigned fds;                  /* descriptors queued to all of them */
    uint64_t buffered;             /* bytes of frames and replies held for all */
    unsigned frame_secs;           /* a frame once started ends within this;
                                      HELLO comes within this of the connect */
} daemon_limits;

/* Defaults (docs/daemon.md, "Limits"; each a setting). */
#define DAEMON_DEFAULT_CONNS          1024
#define DAEMON_DEFAULT_CONN_FDS       4096
#define DAEMON_DEFAULT_FDS            16384
#define DAEMON_DEFAULT_BUFFERED       (256ull << 20)
#define DAEMON_DEFAULT_FRAME_SECS     30
#define DAEMON_DEFAULT_LOW_SPEED_RATE (10u << 10)
#define DAEMON_DEFAULT_LOW_SPEED_SECS 30
#define DAEMON_CONN_OUT_PAUSE    (4u << 20)    /* queued reply bytes before reading pauses */
#define DAEMON_FD_RESERVE        64            /* descriptors kept for the cache, transfers */

typedef struct daemon_config {
    char     home[SHOAL_PATH_MAX];
    char     socket_path[108];
    uint64_t max_size;             /* 0: the cache's default budget */
    int      parallel;             /* transfers (and connections) at once */
    uint64_t split_min;            /* smallest part of a split object; 0:
                                      the fetcher's default (2 MiB);
                                      UINT64_MAX: never split */
    int      keep_spine;           /* BF16 spine matrices stay pinned after
                                      their derived pack exists */
    daemon_limits lim;
    uint64_t low_speed_rate;       /* bytes/s below which a transfer stalls; 0 off */
    unsigned low_speed_secs;       /* ... over this window */
    daemon_setting set[DSET_COUNT];
    char     conf_path[SHOAL_PATH_MAX];   /* HOME/shoald.conf */
    int      settings_given;       /* the command line gave a setting: save */
    const char *endpoint;          /* HF endpoint (NULL: default) */
    int         offline;           /* HF_HUB_OFFLINE: the cache only */
    char        hf_cache[SHOAL_PATH_MAX];  /* huggingface_hub's cache, a peer
                                      of the Hub ("" none) */
    char        peer_memo[SHOAL_PATH_MAX]; /* HOME/hfcache-verified.txt */
    const char *token;             /* NULL: anonymous */
    uint32_t flush_ms;             /* counter flush timer */
    const char *metrics;           /* --metrics ADDR:PORT, NULL: off */
    int      no_fsync;             /* tests and benchmarks only */
} daemon_config;

/* Upstream counters since start (the cache keeps disk-tier counters). */
typedef struct daemon_upstream_counts {
    uint64_t started, completed, failed, parked, cancelled;
    uint64_t bytes;
    uint64_t wait_ns;              /* summed transfer durations */
} daemon_upstream_counts;

struct shoald {
    daemon_config cfg;
    struct event_base *base;
    cache *cache;
    int    listen_fd;
    struct event *ev_accept, *ev_flush;
    struct event *ev_sig[4];
    conn  *conns;                  /* doubly linked */
    unsigned nconns;
    daemon_limits lim;             /* in force (cfg.lim cut to RLIMIT_NOFILE) */
    unsigned out_fds;              /* descriptors queued on every connection */
    uint64_t buffered;             /* input buffers + queued reply bytes, all */
    struct event *ev_resume;       /* the listener's back-off timer */
    unsigned accept_backoff_ms;
    struct daemon_user { uint32_t uid; unsigned n; } users[32];   /* connections per uid */
    struct daemon_bounds {         /* since start (STATS "limits", /metrics) */
        uint64_t accepted;         /* connections accepted */
        uint64_t refused;          /* newcomers refused at the connection cap */
        uint64_t evicted;          /* connections dropped to make room for one */
        uint64_t dropped_fds;      /* ... over a descriptor cap */
        uint64_t dropped_bytes;    /* ... over the buffered-bytes cap */
        uint64_t frame_timeouts;   /* ... at the frame (or HELLO) deadline */
        uint64_t accept_errors;    /* accept failures, each a listener pause */
    } bounds;
    model *models[DAEMON_MODELS_MAX];
    struct sched *sched;
    struct warm *warm;
    daemon_upstream_counts up;
    uint64_t bytes_served;
    int    stopping;
    int64_t started_ms;
    struct workers *workers;       /* work.c */
    work  *work_live;              /* jobs posted and not done (loop thread) */
    opening *openings;             /* models being opened (model.c) */
    struct evhttp *metrics;        /* --metrics (metrics.c), or NULL */
    struct integrity *integrity;   /* integrity.c */
    struct peer_state *peer;       /* peer.c: hashes of HF cache objects, NULL until used */
    uint64_t get_serial;           /* the last getreq.serial given */
    char   metrics_url[160];
};

/* ---- work.c ------------------------------------------------------------------- */

/* A job's progress: written by its run() (any thread), read by the loop. */
typedef struct work_progress {
    _Atomic uint64_t done, total;
    _Atomic(const char *) phase;   /* a string literal */
    _Atomic uint64_t ticks;        /* bumped by every update */
} work_progress;

void work_progress_set(work_progress *p, const char *phase, uint64_t done, uint64_t total);

typedef void (*work_fn)(work *w);

/* Embedded in each job's own struct (first member, so run/done cast). */
struct work {
    work   *next;                  /* queue links (work.c) */
    work   *live_next;
    int     live;
    shoald *d;                     /* set by work_post / work_step */
    work_fn run;                   /* worker thread; may be NULL */
    work_fn done;                  /* loop thread, after run */
    _Atomic int stop;              /* the loop asks run() to end soon */
    work_progress prog;
};

int  work_init(shoald *d, shoal_err *err);
/* Queue w: run() on a worker, then done() on the loop.  Cannot fail. */
void work_post(shoald *d, work *w);
/* The same on the quick lane: one thread of its own, for short waits on
 * the disk (an fsync) that must not queue behind long jobs. */
void work_post_quick(shoald *d, work *w);
/* Call w->done() again on a later loop turn, after the loop polled its
 * sockets: work done on the loop in bounded slices. */
void work_step(shoald *d, work *w);
/* Set stop on every job (shutdown). */
void work_stop_all(shoald *d);
/* A worker's own read-only handle on the cache (CACHE_OPEN_SIDE: it never
 * takes the writer's lock nor waits for the loop); cache_close when done. */
int  work_side_open(shoald *d, cache **side, shoal_err *err);
/* After the loop ended: join the threads and let each job's done() clean
 * up (it sees d->stopping). */
void work_shutdown(shoald *d);
/* Jobs queued or running. */
unsigned work_busy(const shoald *d);

/* A request a client waits on while a job runs.  The connection may leave
 * meanwhile (c becomes NULL: the job goes on, its end answers nobody).
 * PROGRESS frames go out from prog while it advances (work.c rule 4). */
struct pending {
    pending *prev, *next;          /* every pending (work.c) */
    pending *cnext;                /* the connection's */
    conn    *c;
    uint64_t id;                   /* the request's id */
    const work_progress *prog;     /* may be NULL */
    uint64_t sent_ticks;
    int64_t  sent_ms;
};
pending *pending_new(conn *c, uint64_t id, const work_progress *prog);
void pending_end(shoald *d, pending *p);
/* The connection leaves: its pendings forget it. */
void pending_conn_gone(conn *c);

/* ---- server.c ------------------------------------------------------------- */

/* Create the listening socket at cfg.socket_path: replace a stale socket
 * (nothing accepts on it), refuse a live one, mode 0600. */
int server_listen(shoald *d, shoal_err *err);
void server_close(shoald *d);

/* ---- conn.c ----------------------------------------------------------------- */

/* A new connection from uid; the caller checked conn_admit first. */
int  conn_new(shoald *d, int fd, uint32_t uid);
/* At the connection cap: make room for a newcomer of uid (a connection
 * that never said HELLO, or one of a user holding more than uid does, is
 * dropped).  1 when room was made or there was room, 0 when the newcomer
 * must be refused. */
int  conn_admit(shoald *d, uint32_t uid);
/* Drop c for going over a limit: its queue is emptied (descriptors
 * closed), an ERROR naming the limit goes out, then the connection
 * closes. */
void conn_drop(conn *c, int code, const char *why);
/* Close (now, or after flushing its queue when `flush` is set). */
void conn_close(conn *c, int flush);
/* Queue a built message, with a descriptor (taken: closed on failure) or
 * -1.  0, or a negative code (the connection is then being closed). */
int  conn_send(conn *c, const uint8_t *msg, size_t len, int fd);
int  conn_send_error(conn *c, uint64_t id, int code, const char *msg);
int  conn_send_ok(conn *c, uint64_t id);
int  conn_send_json(conn *c, uint64_t id, const shoal_buf *json);
/* Shoal protocol builder shared by a connection's replies. */
shoal_msg_builder *conn_builder(conn *c);
/* Stop accepting input on every connection; close them after flushing. */
void conn_close_all(shoald *d);
/* Free every connection now (the loop has stopped). */
void conn_free_all(shoald *d);

/* Per-connection state that ops.c, session.c and sched.c reach. */
struct conn {
    shoald  *d;
    conn    *prev, *next;
    int      fd;
    struct event *ev_read, *ev_write;
    shoal_buf in;                  /* at most one frame */
    struct outmsg *out_head, *out_tail;
    size_t   out_count, out_control;
    int      closing;              /* flush then close */
    int      read_paused;
    int      in_fd;                /* a PUT's descriptor received, -1 none */
    int      dropped;              /* over a limit: nothing more is queued */
    int      processing;           /* conn_process runs: c->in is borrowed */
    uint32_t uid;                  /* SO_PEERCRED */
    struct daemon_user *user;      /* its slot in d->users */
    size_t   in_held;              /* in.cap as counted in d->buffered */
    size_t   out_bytes;            /* queued reply bytes not yet written */
    unsigned out_fds;              /* descriptors among them */
    struct event *ev_frame;        /* the frame (or HELLO) deadline */
    int64_t  active_ms;            /* last byte received */
    /* session */
    int      hello;
    unsigned version;              /* the protocol version said at HELLO */
    pending *pending;              /* requests waiting on a job */
    put     *puts;                 /* PUT_BEGINs not committed (derived.c) */
    unsigned nputs;
    uint64_t session;
    int64_t  pid;
    char     program[64];
    int64_t  started_ms;
    cache_counts counts;
    uint32_t handles[DAEMON_CONN_MAX_HANDLES];
    unsigned nhandles;
    getreq  *gets;                 /* open GETs, linked */
    unsigned ngets;
    size_t   outstanding;          /* keys not yet answered */
    shoal_msg_builder msg;
};

/* ---- request.c (pure) ---------------------------------------------------------- */

typedef struct daemon_request {
    uint16_t type;
    uint64_t id;
    /* HELLO */
    uint16_t version;
    char     name[64];
    uint32_t pid;
    /* OPEN, VERIFY (model), STATS (query) */
    char     text[SHOAL_PROTO_MAX_STR + 1];
    /* GET, PIN, WARM, RELEASE */
    uint32_t handle;
    uint8_t  priority;             /* GET; PIN: on/off; VERIFY: deep */
    uint8_t  selection;            /* WARM (the low 6 bits of its byte) */
    uint8_t  warm_flags;           /* WARM: SHOAL_WARM_F_FIT, SHOAL_WARM_F_PLAN */
    uint32_t a, b;                 /* WARM arguments */
    uint16_t nkeys;
    shoal_key keys[SHOAL_PROTO_MAX_KEYS];   /* names borrowed from the body */
    /* CANCEL (request id), JOB (job id), GC (max size) */
    uint64_t u64;
    /* REPORT: JSON text borrowed from the body */
    const char *json;
    size_t   json_len;
    /* PUT: name in text, length in u64, content hash and descriptor (set
     * by conn.c; the handler owns it).  PUT_BEGIN: handle, name in text,
     * length in u64.  PUT_COMMIT: put id in u64, keep in priority, hash. */
    uint8_t  xxh128[16];
    int      fd;
} daemon_request;

/* Decode the body of a request of type h->type.  SHOAL_EPROTO with a
 * message when it does not parse, is a reply type, or has trailing bytes. */
int daemon_request_parse(const shoal_msg_header *h, const uint8_t *body, size_t len,
                         daemon_request *out, shoal_err *err);

/* ---- model.c ----------------------------------------------------------------- */

/* One object a key names: where it lives upstream and how it is cached. */
typedef struct objref {
    cache_key  key;                /* etag borrowed from the model's manifest */
    cache_kind kind;
    uint32_t   file;               /* index into the manifest's files */
    int32_t    layer, expert;
    const char *tensor;            /* borrowed, or NULL */
} objref;

struct model {
    uint32_t handle;               /* index + 1 in d->models */
    unsigned refs;                 /* connections, jobs and transfers holding it */
    int64_t  idle_ms;              /* when refs fell to 0 */
    char     spec[SHOAL_PROTO_MAX_STR + 1];   /* as opened */
    manifest *man;
    int64_t  model_id;             /* cache_model_put */
    int      local;                /* a snapshot directory */
    char     dir[SHOAL_PATH_MAX];  /* local: the directory */
    shoal_buf encoded;             /* the manifest's encoding (OPEN replies) */
    struct upstream_model *up;     /* upstream.c's per-model state */
};

/* The end of an open: m is a reference for the waiter (NULL on failure,
 * err says why).  On the loop thread. */
typedef void (*model_ready_fn)(shoald *d, void *ctx, model *m, const shoal_err *err);

/* Open (or share) the model `spec`: a directory or hf://org/name[@rev].
 * Open already: 0 with *out (a reference).  Otherwise the open runs on a
 * worker (resolve, manifest, shard headers) and this returns 1: ready(d,
 * ctx, ...) follows on the loop when it ends; an OPEN of the same spec
 * while one runs joins it.  *prog (may be NULL) gets the open's progress.
 * < 0 for a request that cannot start. */
int  model_open(shoald *d, const char *spec, model_ready_fn ready, void *ctx,
                const work_progress **prog, model **out, shoal_err *err);
void model_release(shoald *d, model *m);
model *model_by_handle(shoald *d, uint32_t handle);
/* RM's check: the open models whose repo is spec's (hf://org/name[@rev],
 * org/name or a directory) must be idle; they are dropped.  SHOAL_EBUSY
 * (naming who holds one) otherwise. */
int  model_drop_idle(shoald *d, const char *spec, shoal_err *err);
/* Resolve a protocol key to an object.  SHOAL_ENOTFOUND naming it. */
int  model_key_resolve(const model *m, const shoal_key *k, objref *out, shoal_err *err);
void model_free_all(shoald *d);

/* ---- sched.c ------------------------------------------------------------------- */

/* Who waits for a transfer: a GET key of a connection, or a warm job. */
struct waiter {
    waiter  *prev, *next;          /* on the transfer */
    xfer    *x;
    int      prio;
    uint64_t t0_ns;
    /* one of: */
    conn    *c;
    getreq  *g;
    uint16_t index;
    uint8_t  answered;             /* GET key: its item was sent */
    uint8_t  source;               /* GET key: SHOAL_SRC_MISS or _JOIN */
    warm_job *job;
};

struct sched;
int  sched_new(shoald *d, struct sched **out);
void sched_free(struct sched *s);
/* Is a transfer of this object in flight (queued or running)? */
xfer *sched_find(struct sched *s, const cache_key *key);
/* Attach w to the transfer of o (creating and queueing it when absent).
 * m gets a reference for the transfer's life. */
int  sched_attach(struct sched *s, model *m, const objref *o, waiter *w, shoal_err *err);
/* Detach a waiter (disconnect, cancel).  A transfer nobody waits for any
 * more is dropped if queued and cancelled if it was only a prefetch or
 * warm; a demand transfer already running finishes for the cache. */
void sched_detach(struct sched *s, waiter *w);
/* Park every running transfer (shutdown): writers paused, resumable. */
void sched_park_all(struct sched *s);
/* Fail every running transfer of m (its upstream session died). */
void sched_fail_model(struct sched *s, model *m, int rc, const char *msg);
size_t sched_running(const struct sched *s);
size_t sched_queued(const struct sched *s, int prio);

/* Called by upstream.c when a transfer ends (rc 0: committed). */
void sched_xfer_done(struct sched *s, xfer *x, int rc, const char *msg, uint64_t bytes);

/* The transfer record (sched.c owns it; upstream.c reads and fills it). */
struct xfer {
    xfer    *hnext;                /* hash chain */
    xfer    *qprev, *qnext;        /* queue */
    int      state;                /* XFER_QUEUED / XFER_RUNNING / XFER_DONE */
    int      prio;                 /* best of its waiters */
    int      qprio;                /* the queue it is on */
    int      had_demand;           /* a demand asked: finish even if abandoned */
    char     etag[CACHE_ETAG_MAX + 1];
    cache_key key;                 /* key.etag -> etag above */
    objref   obj;
    model   *m;
    waiter  *waiters;
    unsigned nwaiters;
    uint64_t t0_ns;
    struct upstream_xfer *up;      /* upstream.c's state while running */
};
enum { XFER_QUEUED = 0, XFER_RUNNING = 1, XFER_DONE = 2 };

/* ---- upstream.c ---------------------------------------------------------------- */

struct upstream_model;
struct fetch_keep;
int  upstream_init(shoald *d, shoal_err *err);
void upstream_shutdown(shoald *d);
/* On a worker: open spec's upstream on the side handle and get its
 * manifest (from the cache, or built with the shard headers read
 * cfg->parallel at once; *keep then lists what to store).  Touches
 * nothing of the loop's. */
int  upstream_model_prepare(const daemon_config *cfg, const char *spec, cache *side,
                            const _Atomic int *stop, work_progress *prog,
                            struct upstream_model **out, manifest **man, int *from_cache,
                            struct fetch_keep **keep, shoal_err *err);
/* On the loop: m takes um (its events, the writer handle for what the
 * session records). */
int  upstream_model_attach(shoald *d, model *m, struct upstream_model *um, shoal_err *err);
/* An um that was never attached (a failed or abandoned open). */
void upstream_model_discard(struct upstream_model *um);
void upstream_model_free(model *m);
/* Start x: open its cache writer and stream bytes into it; calls
 * sched_xfer_done() later (never from inside this call). */
int  upstream_start(shoald *d, xfer *x, shoal_err *err);
/* Stop x: pause (keep the partial, resumable) or abort its writer.  No
 * sched_xfer_done() follows. */
void upstream_stop(shoald *d, xfer *x, int keep_partial);
/* Should sched park warm transfers for a demand (upstream_stop, then
 * requeue)?  When not, demand gets upstream_headroom() extra slots. */
int  upstream_can_park(void);
/* Can upstream_stop() stop one transfer (a prefetch nobody waits for)? */
int  upstream_can_cancel(void);
/* x (running) changed priority (a demand joined a prefetch): its parts not
 * yet started are served at x->prio. */
void upstream_set_priority(shoald *d, xfer *x);
int  upstream_headroom(const shoald *d);
/* Shutdown: pause every writer so the next run resumes. */
void upstream_park_all(shoald *d);
struct fetch_stats;
struct fetch_peer_stat;
void upstream_stats(const model *m, struct fetch_stats *out);
/* 0 and the path of the verified Hugging Face cache blob holding the bytes
 * of m's file `file` (read in place) and (st, may be NULL) its stat when it
 * was verified, else -1.  drop: that blob is no longer used (it changed):
 * 0, or -1 when it was not in use. */
int  upstream_peer_blob(const model *m, uint32_t file, char *out, size_t cap,
                        struct fetch_peer_stat *st);
int  upstream_peer_drop(model *m, uint32_t file);
/* "online", "offline" (HF_HUB_OFFLINE: the cache only) or "unreachable"
 * (the Hub did not answer at open: the revision is its last known commit),
 * "local" for a directory. */
int upstream_state(const model *m);             /* SHOAL_UPSTREAM_* */
const char *upstream_state_name(const model *m);

/* ---- peer.c: objects served in place from the Hugging Face cache ---- */
/* 1 when o's bytes are in a verified HF cache blob whose stat is still the
 * verified one: key i of g is answered now (its hash remembered) or when a
 * worker has hashed it (a hit: the blob's descriptor, the object's offset
 * in it, its XXH3-128) — or, if the blob turns out changed, it goes the
 * miss path then (ops_get_fetch).  0: not in the HF cache (nothing sent;
 * the caller fetches it). */
int  peer_serve(conn *c, model *m, getreq *g, uint16_t i, const objref *o);
/* 1 when o is in a verified HF cache blob (warm has nothing to fetch). */
int  peer_has(const model *m, const objref *o);
/* A client reported o damaged (REPORT): when it was read from the HF
 * cache, that blob is not used again (its bytes are fetched from the Hub;
 * the stat did not show the change). */
void peer_damaged(shoald *d, model *m, const objref *o);
/* Since start (docs/fetcher.md, "The Hugging Face cache"). */
typedef struct peer_counts {
    uint64_t objects, bytes;       /* served from verified blobs */
    uint64_t jobs;                 /* hash jobs posted */
    uint64_t hashed_objects, hashed_bytes;   /* read on a worker to hash */
    uint64_t joins;                /* keys that joined a hash in flight */
    uint64_t memo_hits;            /* keys answered from a remembered hash */
    uint64_t memo_entries, memo_bytes, memo_replaced;
    uint64_t hashing;              /* jobs in flight now */
    uint64_t dropped_files;        /* blobs changed since verified: fetched instead */
} peer_counts;
void  peer_get(const shoald *d, peer_counts *out);
/* STATS "daemon.hfcache" (a shoal_json *). */
void *peer_json(const shoald *d);
/* Free the memo (work_shutdown, after the last job's done()). */
void  peer_shutdown(shoald *d);

/* ---- session.c ----------------------------------------------------------------- */

struct getreq {
    getreq  *next;
    uint64_t id;
    uint64_t serial;               /* unique while shoald runs (ids are reused) */
    uint16_t nkeys, remaining;
    uint8_t  prio;
    waiter  *w;                    /* nkeys waiters, w[i].x NULL when not waiting */
};

int  session_open(conn *c, const daemon_request *rq, shoal_err *err);
void session_close(conn *c);
int  session_handle_add(conn *c, uint32_t handle);
int  session_handle_drop(conn *c, uint32_t handle);
/* Send GET item i of g (status, source, descriptor taken) and drop g when
 * it was the last. */
/* The same for a descriptor that is not a cache blob (the HF cache's, peer.c):
 * the object is [offset, offset + obj->length) of obj->fd. */
void session_item_send_at(conn *c, getreq *g, uint16_t i, int source, const cache_obj *obj,
                          uint64_t offset);
void session_item_send(conn *c, getreq *g, uint16_t i, int status, int source,
                       const cache_obj *obj);
void session_get_free(conn *c, getreq *g);
getreq *session_get_find(conn *c, uint64_t id);

/* ---- derived.c (objects made by clients: PUT, SHOAL_KEY_DERIVED) ------------- */

/* The object derived key k (SHOAL_KEY_DERIVED) of m names, when cached:
 * o->key.etag points into etag (cap >= CACHE_ETAG_MAX + 1).  SHOAL_ENOTFOUND
 * when nothing was stored under that name for m's commit. */
int  derived_resolve(shoald *d, const model *m, const shoal_key *k, objref *o, char *etag,
                     size_t cap, shoal_err *err);
/* The request handlers: each answers (now or when its job ends) and
 * returns 0; rq->fd is taken. */
int  derived_put(conn *c, model *m, const daemon_request *rq);
int  derived_put_begin(conn *c, model *m, const daemon_request *rq);
int  derived_put_commit(conn *c, const daemon_request *rq);
/* The connection leaves: uncommitted PUT_BEGINs are dropped (tmp files
 * removed). */
void derived_conn_gone(conn *c);

/* ---- keep.c --------------------------------------------------------------------- */

/* Store what a manifest build kept (the manifest, shard headers): writers
 * begun on the loop, filled and synced on a worker, committed on the
 * loop.  Takes keep. */
void keep_store(shoald *d, struct fetch_keep *keep);
/* Is name[0..n) a spine pack's (the engine's "spine-int8-p1-q1")? */
int  derived_is_spine_pack(const char *name, size_t n);
/* Does a spine pack replace tensor t (a BF16 matrix the engine derives)? */
int  derived_replaces(const manifest_tensor *t);
/* m's spine pack exists: lift the pin of every cached matrix it replaces
 * (unless --keep-spine).  *lifted: objects changed. */
int  derived_spine_release(shoald *d, const model *m, size_t *lifted, shoal_err *err);
/* Does a spine pack of m's commit exist in the cache? */
int  derived_spine_pack_cached(shoald *d, const model *m);

/* ---- ops.c ----------------------------------------------------------------------- */

/* Handle one decoded request.  0, or a negative code after which the
 * connection is closed (a protocol error; the reply is already queued). */
int ops_dispatch(conn *c, const daemon_request *rq);
/* The model a handle of this connection names, or NULL (err set). */
model *ops_handle_model(conn *c, uint32_t handle, shoal_err *err);
/* ERROR for a request that failed (err's code and message). */
int ops_fail(conn *c, uint64_t id, const shoal_err *err);
/* A transfer ended: answer the waiters of x. */
void ops_xfer_finished(shoald *d, xfer *x, int rc, const char *msg);
/* Key i of g (its waiter's c, g, index and prio set), not cached: join
 * the transfer of o in flight or start one (counted as a join or a miss);
 * an error is answered at once. */
void ops_get_fetch(conn *c, model *m, getreq *g, uint16_t i, const objref *o);

/* ---- plan.c ---------------------------------------------------------------------- */

/* A warm selection as objects, planned against the budget. */
typedef struct warm_sel {
    objref  *items;                /* to warm, in file order (etags borrowed from
                                      the model's manifest) */
    size_t   n;
    int32_t *pairs;                /* selection 3: the top N, resolved */
    size_t   npairs;
    cache_plan plan;               /* of the whole selection, in priority order */
    uint64_t left_objects, left_bytes;   /* spine matrices its cached pack replaces */
    uint64_t peer_objects, peer_bytes;   /* in the HF cache, read in place: first in
                                            items (a job counts them done at once),
                                            never in plan (nothing to fetch or hold) */
    uint64_t pinned_need;          /* bytes to fetch that would be pinned (spine, small) */
    int      trimmed;              /* fit: what did not fit was dropped from items */
    int      refused;              /* it cannot start: why says what to do */
    char     why[SHOAL_ERR_MSG_MAX];
} warm_sel;

/* Build and plan a selection (WARM's selection, a, b; pairs for 4) of m.
 * fit: drop what does not fit (hottest first kept) instead of refusing;
 * touch: refresh the selection's cached objects (a job starts);
 * held_back: bytes other jobs still fetch.  0 with *s filled (s->refused
 * when it must not start), or a negative code.  plan_free releases it. */
int   plan_select(shoald *d, model *m, int selection, uint32_t a, uint32_t b,
                  const int32_t *pairs, size_t npairs, int fit, int touch, uint64_t held_back,
                  warm_sel *s, shoal_err *err);
void  plan_free(warm_sel *s);
/* "shoal.warm.plan" (docs/stats-json.md) as a shoal_json *. */
void *plan_json(const warm_sel *s, const model *m, int selection, uint32_t a, uint32_t b, int fit);

/* ---- warm.c ---------------------------------------------------------------------- */

struct warm;
int  warm_new(shoald *d, struct warm **out, shoal_err *err);
void warm_free(struct warm *w);
/* Resume the jobs of a previous run (after the loop and sched exist). */
void warm_resume_all(struct warm *w);
/* Start a job (flags: SHOAL_WARM_F_FIT) after planning it: SHOAL_ENOSPC
 * with what to do when the selection cannot fit. */
int  warm_start(struct warm *w, model *m, int selection, int flags, uint32_t a, uint32_t b,
                const shoal_key *keys, size_t nkeys, uint64_t *job, shoal_err *err);
/* WARM with SHOAL_WARM_F_PLAN: the plan as JSON into out, no job. */
int  warm_plan(struct warm *w, model *m, int selection, int flags, uint32_t a, uint32_t b,
               const shoal_key *keys, size_t nkeys, shoal_buf *out, shoal_err *err);
int  warm_status(struct warm *w, uint64_t job, uint8_t *state, uint64_t *bytes_done,
                 uint64_t *bytes_total, uint32_t *objs_done, uint32_t *objs_total,
                 uint32_t *errors, int *last_code, char *last_error, size_t cap);
/* A warm waiter's transfer ended. */
void warm_waiter_done(warm_job *j, waiter *w, int rc, const char *msg, uint64_t bytes);
/* Persist progress (shutdown). */
void warm_save_all(struct warm *w);
void warm_stats_json(struct warm *w, void *json_array);
/* Jobs not finished. */
unsigned warm_running(const struct warm *w);

/* ---- integrity.c ------------------------------------------------------------------ */

/* Figures since start (the index keeps the totals: cache_integrity_get). */
typedef struct integrity_counts {
    uint64_t checks;               /* check jobs run */
    uint64_t files_ok, files_bad;  /* complete files hashed: matched / not */
    uint64_t bytes_hashed;
    uint64_t quarantined_bytes;    /* removed after mismatches */
    uint64_t refetches;            /* warm jobs started to fetch them again */
    uint64_t damaged;              /* objects clients reported damaged, removed */
    uint64_t queued;               /* files waiting for a check now */
    unsigned running;              /* a check job is out */
} integrity_counts;

struct shoal_json;
/* Started by work_init (the cache's commit hook), ended by work_shutdown. */
int  integrity_init(shoald *d, shoal_err *err);
void integrity_shutdown(shoald *d);
void integrity_get(const shoald *d, integrity_counts *out);
/* SHOAL_ECORRUPT naming the file when etag's file failed its check after
 * every re-fetch (sched_attach: no new transfer of it while shoald runs). */
int  integrity_refused(shoald *d, const char *etag, shoal_err *err);
/* REPORT's "damaged": [{"layer":L,"expert":E}, ...] of model m: each
 * object is removed (its next GET fetches it again). */
int  integrity_damaged(shoald *d, model *m, const struct shoal_json *list, shoal_err *err);

/* ---- settings.c ------------------------------------------------------------------- */

/* Read cfg->home's shoald.conf, put args over it (args[k]: the command
 * line's value of setting k, NULL when not given) and fill cfg's settings.
 * 0, or SHOAL_EINVAL naming the file's line or the flag. */
int   settings_apply(daemon_config *cfg, const char *const args[DSET_COUNT], shoal_err *err);
/* Write the file back when the command line gave a setting (called once
 * the cache's lock is held: a second shoald must not rewrite it). */
int   settings_save(const daemon_config *cfg, shoal_err *err);
/* The settings and their sources as a JSON object (a shoal_json *). */
void *settings_json(const daemon_config *cfg);

/* ---- stats.c ---------------------------------------------------------------------- */

int stats_json(shoald *d, const char *query, size_t qlen, shoal_buf *out, shoal_err *err);

/* ---- metrics.c -------------------------------------------------------------------- */

/* Serve /metrics on addr ("PORT", "ADDR:PORT", "[V6]:PORT"; a bare port
 * is loopback's) from the loop; addr NULL: nothing.  d->metrics_url says
 * where (the port a 0 got). */
int  metrics_start(shoald *d, const char *addr, shoal_err *err);
void metrics_stop(shoald *d);
/* The page, appended to out (from memory only: never SQLite). */
int  metrics_render(shoald *d, shoal_buf *out);

#endif
