/* client.h — the client side of shoald's socket protocol: what an engine
 * or the CLI links to talk to the daemon (docs/protocol.md).
 *
 * Owns: one connection (connect with a timeout, HELLO), request ids, and
 * the demultiplexing of replies that may come out of order: GET items are
 * queued for shoal_client_next() while a control call (STATS, WARM, ...)
 * waits for its own reply.  Does not own what the descriptors point at:
 * each successful item hands its descriptor to the caller.
 *
 * Threads: one thread at a time per client.  Blocking calls take a timeout
 * from the connect options; a daemon that dies mid-call gives SHOAL_ENET
 * with a message saying so, never a hang.  The timeout runs from the last
 * message the daemon sent: a long call (OPEN of a large model, PUT,
 * VERIFY, GC) gets PROGRESS frames while its work advances, each of which
 * starts the wait afresh, so it never times out while the daemon works.
 */
#ifndef SHOAL_CLIENT_H
#define SHOAL_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/proto.h"

typedef struct shoal_client shoal_client;

typedef struct shoal_client_opts {
    const char *home;         /* cache directory; the socket is home/shoald.sock */
    const char *socket_path;  /* overrides home when set */
    const char *name;         /* program name sent in HELLO ("shoal-engine") */
    int connect_timeout_ms;   /* default 2000 */
    int call_timeout_ms;      /* control calls; default 60000, <0 forever */
} shoal_client_opts;

/* Connect and say HELLO.  When nothing listens, fails with SHOAL_ENET and a
 * message that says how to start shoald for that home.  *out is NULL on
 * failure. */
int shoal_client_connect(const shoal_client_opts *opts, shoal_client **out, shoal_err *err);

/* Close the connection and every queued descriptor.  Accepts NULL. */
void shoal_client_close(shoal_client *c);

/* Progress of the call in flight (PROGRESS frames, docs/protocol.md): fn
 * is called from inside the blocking call each time one arrives (at most
 * every SHOAL_PROGRESS_MS).  NULL fn: progress is only used to keep the
 * call alive.  `total` 0: not known yet. */
typedef struct shoal_progress {
    uint64_t request;         /* the request it is about */
    uint64_t done, total;     /* in the phase's unit (bytes, files, requests) */
    char     phase[SHOAL_PROGRESS_PHASE_MAX + 1];
} shoal_progress;
typedef void (*shoal_progress_fn)(const shoal_progress *p, void *ctx);
void shoal_client_on_progress(shoal_client *c, shoal_progress_fn fn, void *ctx);

uint64_t shoal_client_session(const shoal_client *c);
const char *shoal_client_daemon_version(const shoal_client *c);

/* OPEN a model ("hf://org/name[@rev]" or a directory). */
typedef struct shoal_model_info {
    uint32_t handle;
    char     commit[64];
    uint16_t layers;
    uint32_t experts_per_layer;
    uint64_t expert_bytes;
    int      manifest_fd;     /* caller closes; -1 if none */
    uint64_t manifest_len;
    uint8_t  upstream;        /* SHOAL_UPSTREAM_* (common/proto.h) */
} shoal_model_info;

int shoal_client_open(shoal_client *c, const char *model, shoal_model_info *out, shoal_err *err);
int shoal_client_release(shoal_client *c, uint32_t handle, shoal_err *err);

/* One reply of a GET.  On status 0, fd is the blob (the caller owns it and
 * must close it) and [offset, offset+length) is the object in it. */
typedef struct shoal_item {
    uint64_t request;         /* the GET's request id */
    uint16_t index;           /* position of the key in the GET */
    int32_t  status;          /* 0 or a negative SHOAL_E* code */
    uint8_t  source;          /* SHOAL_SRC_HIT / MISS / JOIN */
    int      last;            /* the final item of its GET */
    int      fd;
    uint64_t offset, length;
    uint8_t  xxh128[16];
} shoal_item;

/* An item's object mapped read-only.  `data` points at the object's first
 * byte; base/maplen are the page-aligned mapping underneath. */
typedef struct shoal_view {
    const uint8_t *data;
    uint64_t       length;
    void          *base;
    size_t         maplen;
} shoal_view;

/* Map item it (status 0) read-only; populate: fault every page in now (one
 * call instead of a fault per page).  The descriptor stays the item's.
 * 0, or SHOAL_EINVAL (a failed item) / a code from errno. */
int shoal_item_map(const shoal_item *it, int populate, shoal_view *out, shoal_err *err);

/* Release an item: unmap its view (v may be NULL or unmapped) and close
 * its descriptor (fd set to -1).  Safe to call twice. */
void shoal_item_release(shoal_item *it, shoal_view *v);

/* Send a GET of n keys (1..SHOAL_PROTO_MAX_KEYS); returns at once with the
 * request id in *request.  priority: 0 demand, 1 prefetch. */
int shoal_client_get_send(shoal_client *c, uint32_t handle, int priority,
                          const shoal_key *keys, size_t n, uint64_t *request, shoal_err *err);

/* Wait up to timeout_ms (<0: forever) for the next GET item of any request.
 * SHOAL_ETIMEOUT when none came. */
int shoal_client_next(shoal_client *c, int timeout_ms, shoal_item *out, shoal_err *err);

/* The next GET item if one is queued or has started arriving, without
 * waiting for one that has not: 0 with *out, 1 when none is there yet, or
 * the negative codes of shoal_client_next. */
int shoal_client_poll_item(shoal_client *c, shoal_item *out, shoal_err *err);

/* Cancel a GET's prefetches (items not yet sent come back ECANCELED). */
int shoal_client_cancel(shoal_client *c, uint64_t request, shoal_err *err);

/* Blocking convenience: GET n keys and call fn for each item as it comes
 * (in arrival order) until all n are in.  fn owns item->fd. */
typedef void (*shoal_item_fn)(const shoal_item *item, void *ctx);
int shoal_client_get(shoal_client *c, uint32_t handle, int priority, const shoal_key *keys,
                     size_t n, shoal_item_fn fn, void *ctx, shoal_err *err);

/* WARM: selection per docs/protocol.md; args: (A, B) for layers, (N, 0)
 * for top N.  selection | SHOAL_WARM_F_FIT (common/proto.h): a selection
 * that does not fit the budget is trimmed (hottest first kept) instead of
 * refused (SHOAL_ENOSPC, the message says what to do). */
enum { SHOAL_WARM_ALL = 0, SHOAL_WARM_SPINE = 1, SHOAL_WARM_LAYERS = 2, SHOAL_WARM_TOP = 3 };
int shoal_client_warm(shoal_client *c, uint32_t handle, int selection, uint32_t a, uint32_t b,
                      uint64_t *job, shoal_err *err);
/* The plan of that WARM ("shoal.warm.plan" JSON appended to out, docs/
 * stats-json.md): what it would keep, fetch, not fit and evict.  Nothing
 * starts. */
int shoal_client_warm_plan(shoal_client *c, uint32_t handle, int selection, uint32_t a,
                           uint32_t b, shoal_buf *out, shoal_err *err);

/* WARM selection 4: a list of 1..SHOAL_PROTO_MAX_KEYS expert keys. */
enum { SHOAL_WARM_LIST = 4 };
int shoal_client_warm_keys(shoal_client *c, uint32_t handle, const shoal_key *keys, size_t n,
                           uint64_t *job, shoal_err *err);

typedef struct shoal_job_status {
    uint8_t  state;           /* 0 queued, 1 running, 2 done, 3 failed, 4 cancelled */
    uint64_t bytes_done, bytes_total;
    uint32_t objects_done, objects_total, errors;
    char     last_error[256];
    int      last_code;       /* the last error's code (common/err.h), 0: none */
} shoal_job_status;

int shoal_client_job(shoal_client *c, uint64_t job, shoal_job_status *out, shoal_err *err);

/* STATS / GC / VERIFY answer JSON text, appended to out. */
int shoal_client_stats(shoal_client *c, const char *query_json, shoal_buf *out, shoal_err *err);
int shoal_client_gc(shoal_client *c, uint64_t max_bytes, shoal_buf *out, shoal_err *err);
int shoal_client_verify(shoal_client *c, const char *model, int deep, shoal_buf *out,
                        shoal_err *err);
/* RM (protocol 3): remove every cached object of the models matching
 * spec (docs/protocol.md); JSON "shoal.rm" appended to out.  EBUSY while
 * a client or a warm job holds the model. */
int shoal_client_rm(shoal_client *c, const char *spec, shoal_buf *out, shoal_err *err);
/* REPORT a client's own counters (JSON object). */
int shoal_client_report(shoal_client *c, const char *json, shoal_err *err);
/* PIN (on=1) or UNPIN (on=0) keys of an open model. */
int shoal_client_pin(shoal_client *c, uint32_t handle, int on, const shoal_key *keys, size_t n,
                     shoal_err *err);

/* PUT a derived object (docs/protocol.md): the first `length` bytes of
 * `fd` (a regular file: a memfd or an unlinked temp file; the caller keeps
 * it) stored under `name` for the model `handle` names, with its XXH3-128
 * (canonical, big-endian).  SHOAL_EEXIST when another client stored it
 * first (GET it), SHOAL_ENOSPC when it does not fit the cache's budget,
 * SHOAL_ECORRUPT when the bytes do not match the hash.  The daemon copies
 * the bytes on a worker thread before it answers (PROGRESS meanwhile): the
 * call takes as long as that copy and the hash. */
int shoal_client_put(shoal_client *c, uint32_t handle, const char *name, int fd, uint64_t length,
                     const uint8_t xxh128[16], shoal_err *err);

/* PUT without a copy (PUT_BEGIN / PUT_COMMIT): the daemon reserves room
 * for `length` bytes in its budget, creates the object's file (allocated
 * up front, so a full disk fails here, SHOAL_ENOSPC) and hands back a
 * writable descriptor of it in out->fd.  The caller writes the content
 * into [0, length) of that descriptor (pwrite, or any writes that leave
 * the file exactly `length` bytes long), then commits: commit closes
 * out->fd first (never write through a copy of it afterwards: the file
 * becomes the cached object), and the daemon hashes the file (PROGRESS
 * meanwhile), fsyncs it and stores it, or refuses with SHOAL_ECORRUPT
 * (the hash differs) or SHOAL_ERANGE (the file is not `length` bytes) and
 * deletes it.  Abort deletes it at once.  A client that disconnects or
 * dies before committing leaves nothing behind.  Errors of begin as
 * shoal_client_put's. */
typedef struct shoal_put {
    uint64_t id;              /* the daemon's name for this PUT */
    int      fd;              /* writable; -1 once closed */
    uint64_t length;
} shoal_put;
int shoal_client_put_begin(shoal_client *c, uint32_t handle, const char *name, uint64_t length,
                           shoal_put *out, shoal_err *err);
int shoal_client_put_commit(shoal_client *c, shoal_put *p, const uint8_t xxh128[16],
                            shoal_err *err);
int shoal_client_put_abort(shoal_client *c, shoal_put *p, shoal_err *err);

#endif
