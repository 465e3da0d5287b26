/* fetch.h — upstreams, the model manifest builder, and range transfers
 * into the cache, driven by any event loop.
 *
 * Owns: opening an upstream (hf://org/name[@revision] on a Hub or mirror,
 * or a local snapshot directory), pinning the revision to its commit,
 * per-file resolution (etag, size, CDN location and its expiry, kept in the
 * cache index), building the model manifest (common/manifest.h) from
 * config.json, the index and the shards' safetensors headers and keeping it
 * in the cache, choosing what to fetch, and the transfers themselves:
 * libcurl multi, at most N at once, adjacent small ranges coalesced, large
 * objects split into parts over several connections (guided
 * self-scheduling), priorities, cancelling one object, strict 206
 * checks before any byte is written, retries with backoff and jitter that
 * honour Retry-After / RateLimit, resume from the last byte received, stall
 * detection, re-resolve of expired CDN locations, the token kept off the
 * CDN.  Does not own the event loop (the caller's, through fetch_loop_ops;
 * fetch_poll is a blocking one for tools and tests), scheduling between
 * clients (the daemon), nor reading the environment (the program does).
 *
 * No libcurl or libevent type appears here.  A session and its upstream are
 * used from one thread at a time; a manifest build reads the shards'
 * headers on several threads of its own (each with its own Hub client), so
 * the upstream may be opened and built on a worker thread and then handed
 * to the thread that runs its sessions (fetch_upstream_set_cache).
 * docs/fetcher.md describes the behaviour.
 */
#ifndef SHOAL_FETCHER_FETCH_H
#define SHOAL_FETCHER_FETCH_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "cache/cache.h"
#include "common/err.h"
#include "common/manifest.h"

#define FETCH_DEFAULT_PARALLEL   8
#define FETCH_DEFAULT_COALESCE   (64ull << 20)
#define FETCH_DEFAULT_ATTEMPTS   8
/* Smallest part of a split object: one request round trip (0.1-30 ms)
 * against 20-40 ms of transfer at 50-100 MB/s per connection
 * (docs/fetcher.md, "Parts"). */
#define FETCH_DEFAULT_SPLIT_MIN  (2ull << 20)
/* fetch_options.split_min: never split an object. */
#define FETCH_SPLIT_NEVER        UINT64_MAX
/* The low-speed limit: a transfer below 10 KB/s over 30 s is a stall. */
#define FETCH_DEFAULT_LOW_SPEED_RATE (10u << 10)
#define FETCH_DEFAULT_LOW_SPEED_SECS 30
#define FETCH_LOW_SPEED_OFF      UINT64_MAX

/* Item priorities: a free connection serves the best (lowest) first. */
enum { FETCH_PRIO_DEMAND = 0, FETCH_PRIO_PREFETCH = 1, FETCH_PRIO_WARM = 2, FETCH_PRIO_COUNT = 3 };
/* The name under which a model's manifest is recorded (cache_file_get). */
#define FETCH_MANIFEST_PATH      ".shoal/manifest-v1"

typedef struct fetch_options {
    const char *model;           /* hf://org/name[@rev], DIR or file://DIR */
    const char *endpoint;        /* NULL: https://huggingface.co */
    const char *token;           /* NULL or "": anonymous */
    int         parallel;        /* transfers (connections) at once; 0: 8 */
    uint64_t    coalesce_bytes;  /* longest merged request; 0: 64 MiB;
                                    1: never merge */
    uint64_t    split_min;       /* smallest part when one object goes over
                                    several connections; 0: 2 MiB;
                                    FETCH_SPLIT_NEVER: one request per run */
    int         split_ways;      /* P of the part size max(split_min,
                                    unassigned bytes / P); 0: parallel */
    int         demand_headroom; /* extra transfers for demand items while a
                                    prefetch or warm one runs; 0: none */
    int         max_attempts;    /* failures in a row without a byte of
                                    progress before giving up; 0: 8 */
    long        stall_secs;      /* no byte for this long: retry; 0: 30 */
    uint64_t    low_speed_rate;  /* slower than this many bytes/s over
                                    low_speed_secs: a stall, retried on a fresh
                                    connection, counted as a failed attempt;
                                    0: FETCH_DEFAULT_LOW_SPEED_RATE;
                                    FETCH_LOW_SPEED_OFF: never */
    long        low_speed_secs;  /* 0: FETCH_DEFAULT_LOW_SPEED_SECS */
    long        connect_timeout_ms;   /* 0: 10000 */
    long        backoff_ms;      /* first backoff step; 0: 1000 */
    long        backoff_max_ms;  /* cap; 0: 8000 */
    long        max_wait_s;      /* cap on a server's Retry-After; 0: 60 */
    uint32_t    seed;            /* jitter PRNG seed; 0: from the clock */
    int         defer_records;   /* 1: record nothing in the cache (the pin,
                                    resolutions) until fetch_upstream_set_cache
                                    writes it all in one transaction: the
                                    cache handle given to open is a worker's
                                    side handle, which only reads */
    const char *hf_cache;        /* a huggingface_hub cache (common/hfenv.h
                                    shoal_hf_hub_cache) used as a peer for
                                    hf:// models: NULL, none */
    const char *peer_memo;       /* file remembering the HF cache blobs that
                                    hashed to their etag (NULL: hash at
                                    every open) */
    int         offline;         /* 1 (HF_HUB_OFFLINE): never ask the Hub;
                                    resolve from the cache index only, a
                                    missing file or object is SHOAL_EOFFLINE */
    const _Atomic int *stop;     /* when *stop becomes nonzero, the blocking
                                    metadata calls (open, manifest build) give
                                    up soon with SHOAL_ECANCELED: a request
                                    in flight is abandoned, a backoff cut
                                    short.  NULL: never */
} fetch_options;

/* ---- upstreams ------------------------------------------------------------ */

typedef struct fetch_upstream fetch_upstream;

/* Open an upstream and pin it: a Hub revision is resolved to its commit
 * (one HEAD of config.json; recorded with cache_model_put), a directory is
 * identified by its files.  c may be NULL (nothing recorded or reused).
 * Errors are typed (hub.h): SHOAL_EAUTH for a gated repo (the message says
 * to set HF_TOKEN and accept the licence), SHOAL_ENOTFOUND naming the repo,
 * revision or file, SHOAL_EINVAL for a bad spec. */
int fetch_upstream_open(const fetch_options *o, cache *c, fetch_upstream **out, shoal_err *err);
void fetch_upstream_free(fetch_upstream *u);

/* From now on use c (may be NULL) for reading and recording resolutions:
 * the upstream was opened on a worker thread's side handle and goes on in
 * a session on the writer's thread (cache/cache.h, "Threads").  With
 * defer_records and a c that is not NULL, what was deferred (the model's
 * pin, every resolution so far) is written to c now, in one transaction,
 * and later resolutions are recorded as they come. */
int fetch_upstream_set_cache(fetch_upstream *u, cache *c, shoal_err *err);

/* The pinned commit ("local-<hex>" for a directory); borrowed. */
const char *fetch_upstream_commit(const fetch_upstream *u);
int fetch_upstream_is_local(const fetch_upstream *u);
/* How the upstream was pinned: FETCH_ONLINE (the Hub answered, or a commit
 * or a directory needed no request), FETCH_OFFLINE (fetch_options.offline:
 * from the cache, no request will be made) or FETCH_UNREACHABLE (the Hub
 * could not be reached or kept failing: the revision is its last known
 * commit from the cache; transfers are still tried, and fail soon with
 * SHOAL_EOFFLINE when the Hub stays unreachable).  docs/fetcher.md,
 * "Offline". */
enum { FETCH_ONLINE = 0, FETCH_OFFLINE = 1, FETCH_UNREACHABLE = 2 };
int fetch_upstream_offline(const fetch_upstream *u);

/* The Hugging Face cache as a peer (docs/fetcher.md, "The Hugging Face
 * cache").  scan: check every file of m against the HF cache's blobs
 * (hashing a blob not verified before; may take long: run it where a
 * manifest build runs), then prune the memo; returns how many files are
 * served from it.  blob: 0 and the path of the verified blob holding
 * path's bytes, read in place, and (st, may be NULL) the blob's stat when
 * it was verified — its bytes are the verified ones only while its stat
 * is still that; -1 when the file is not in the HF cache (or not
 * verified, or dropped).  drop: the blob changed since it was verified;
 * path is no longer read from it (blob says -1, reads go to the Hub): 0,
 * or -1 when it was not in use. */
typedef struct fetch_peer_stat {
    uint64_t size, ino;
    int64_t  mtime_ns;
    int64_t  ctime_s;            /* a write with the mtime set back still moves it */
} fetch_peer_stat;
int fetch_upstream_peer_scan(fetch_upstream *u, const manifest *m);
int fetch_upstream_peer_blob(const fetch_upstream *u, const char *path, char *out, size_t cap,
                             fetch_peer_stat *st);
int fetch_upstream_peer_drop(fetch_upstream *u, const char *path);

/* Counters of what the upstream did (both the blocking metadata calls
 * and the sessions' transfers). */
typedef struct fetch_stats {
    uint64_t objects_total;      /* asked for */
    uint64_t objects_cached;     /* already in the cache */
    uint64_t objects_fetched;    /* written by this run */
    uint64_t bytes_total;        /* bytes of the objects asked for */
    uint64_t bytes_fetched;      /* bytes written into the cache */
    uint64_t requests;           /* HTTP requests (ranges and HEADs) */
    uint64_t resolves;           /* HEADs of /resolve/ */
    uint64_t retries;            /* requests repeated after a failure */
    uint64_t refused;            /* answers refused by the 206 check */
    uint64_t resumed;            /* retries that continued mid-object */
    uint64_t slow;               /* transfers stopped below the low-speed limit */
    uint64_t peer_hashed;        /* bytes of HF cache blobs hashed */
} fetch_stats;

void fetch_upstream_stats(const fetch_upstream *u, fetch_stats *out);

/* ---- the manifest ------------------------------------------------------------ */

/* The manifest of the pinned model: from the cache if it was built before
 * (*from_cache = 1), else built from config.json, the index and every
 * language shard's header (read by range, several at once) and stored in
 * the cache as a derived object, with what fetch_keep lists.  Refuses, naming the tensor or file: index file names
 * with "..", absolute paths or control bytes; tensors missing from their
 * shard; hostile safetensors headers (common/safetensors.h); an expert
 * whose six records are missing, out of checkpoint order, not back to
 * back, of the wrong size, or whose span differs from the config's
 * expert_bytes; an MoE layer missing an expert.  Vision tensors are
 * skipped.  Caller frees *out.  c may be NULL (always built). */
int fetch_manifest_get(fetch_upstream *u, cache *c, manifest **out, int *from_cache,
                       shoal_err *err);

/* What a manifest build read that is worth keeping in the cache, for a
 * caller whose handle may not write objects (a worker thread's side
 * handle): the encoded manifest (a derived object, pinned, recorded under
 * FETCH_MANIFEST_PATH) and, per language shard, its safetensors header
 * [0, 8+N) and the bytes of any tensor outside the language model (small-
 * file objects), so that a shard whose tensors are all cached is cached
 * from byte 0 to its end and `verify --deep` can hash it against its
 * sha256 etag.  Bytes outside the language model are kept only up to
 * FETCH_KEEP_GAP_MAX per shard (a shard with a larger vision part stays
 * unchecked; K3's vision shards hold no language tensor at all). */
#define FETCH_KEEP_GAP_MAX (16u << 20)

typedef struct fetch_keep_item {
    cache_key   key;             /* key.etag points into the item */
    cache_kind  kind;
    cache_names names;           /* borrowed from the list */
    const uint8_t *data;         /* key.length bytes, owned by the list */
    int         pin;             /* pin after commit (kind pins cover the rest) */
} fetch_keep_item;

typedef struct fetch_keep fetch_keep;
size_t fetch_keep_count(const fetch_keep *k);
const fetch_keep_item *fetch_keep_at(const fetch_keep *k, size_t i);
/* Item i is cached (committed now, or found cached at begin): pin it if it
 * asks and record what makes it findable (the manifest's file record).
 * On the writer's thread. */
int fetch_keep_done(fetch_keep *k, size_t i, cache *c, shoal_err *err);
/* Store every item through a writer handle (begin, append, commit,
 * done); failures are logged and skipped (the next build reads again). */
void fetch_keep_store(fetch_keep *k, cache *c);
void fetch_keep_free(fetch_keep *k);

/* Progress of a build: phase "resolve", "index", "headers" (done of total
 * shards) or "build".  May be called from several threads at once. */
typedef void (*fetch_phase_fn)(void *ctx, const char *phase, uint64_t done, uint64_t total);

typedef struct fetch_build_opts {
    int            parallel;     /* header reads at once; 0: the upstream's
                                    parallel (each reader its own connection) */
    fetch_phase_fn progress;     /* may be NULL */
    void          *ctx;
} fetch_build_opts;

/* fetch_manifest_get for a handle that may only read objects: the
 * manifest from c (may be a side handle or NULL) or built, with the shard
 * headers read `parallel` at once; nothing is stored, and when it was
 * built *keep (caller frees) lists what to store (NULL when it came from
 * the cache).  o may be NULL. */
int fetch_manifest_build(fetch_upstream *u, cache *c, const fetch_build_opts *o, manifest **out,
                         int *from_cache, fetch_keep **keep, shoal_err *err);

/* ---- what to fetch --------------------------------------------------------------- */

typedef struct fetch_item {
    cache_kind  kind;            /* EXPERT, SPINE or SMALL */
    uint32_t    file;            /* index into the manifest's files */
    uint64_t    offset, length;  /* absolute range in that file */
    int32_t     layer, expert;   /* -1 if not an expert */
    const char *tensor;          /* spine tensor name (borrowed), or NULL */
    int         priority;        /* FETCH_PRIO_*: 0 demand (default), 1
                                    prefetch, 2 warm */
} fetch_item;

typedef struct fetch_selection {
    int      spine;              /* every spine tensor */
    int      small;              /* the small files (config, index, tokenizer) */
    int      all_experts;
    int32_t  layer_first, layer_last;   /* experts of these layers (-1: none) */
    const int32_t *pairs;        /* (layer, expert) pairs, 2*npairs values */
    size_t   npairs;
} fetch_selection;

/* Items for a selection, in file order.  Caller frees *items.  A pair the
 * manifest lacks is SHOAL_ENOTFOUND. */
int fetch_select(const manifest *m, const fetch_selection *sel, fetch_item **items, size_t *n,
                 shoal_err *err);

/* ---- the event loop interface ------------------------------------------------------ */

enum { FETCH_WATCH_NONE = 0, FETCH_WATCH_IN = 1, FETCH_WATCH_OUT = 2 };

/* What a session needs from an event loop.  The loop calls
 * fetch_session_io() when a watched descriptor is ready and
 * fetch_session_timeout() when the timer fires. */
typedef struct fetch_loop_ops {
    /* Watch fd for FETCH_WATCH_IN|OUT (replacing the earlier request);
     * FETCH_WATCH_NONE: forget fd.  0 or a negative code. */
    int  (*watch)(void *loop, int fd, unsigned what);
    /* Fire once after ms milliseconds (replacing an earlier timer);
     * ms < 0 cancels it. */
    void (*timer)(void *loop, long ms);
    /* Optional (NULL: the session syncs on the loop's thread).  A loop with
     * other threads takes the fsyncs off its own (cache/cache.h, "syncing
     * off the owner's thread"):
     * commit: every byte of it's object is in w: the loop owns w from now
     * on — makes it durable elsewhere (cache_writer_sync), commits it, and
     * reports the item's end itself (the session does not call its done
     * function for it).
     * checkpoint: the first `durable` bytes of writer `writer_id` (w, still
     * the session's) are to be made durable: sync a descriptor of its
     * file elsewhere, then cache_checkpoint_record. */
    void (*commit)(void *loop, cache_writer *w, const fetch_item *it);
    void (*checkpoint)(void *loop, cache_writer *w, uint64_t writer_id, uint64_t durable);
} fetch_loop_ops;

/* Progress for a CLI's bars: called at most every interval while work is
 * under way, and once (finished = 1) each time the session becomes idle. */
typedef struct fetch_progress {
    uint64_t bytes_done, bytes_total;     /* of the objects asked for */
    uint64_t objects_done, objects_total;
    double   rate;                        /* bytes/s, recent */
    uint64_t retries;
    int      finished;                    /* the last call */
} fetch_progress;

typedef void (*fetch_progress_fn)(const fetch_progress *p, void *ctx);
/* One object finished: rc 0 (stored, or already cached), SHOAL_EBUSY
 * (another writer has it), or its error.  item is borrowed for the call. */
typedef void (*fetch_done_fn)(const fetch_item *item, int rc, void *ctx);

typedef struct fetch_session fetch_session;

/* A session fetches items of manifest m (borrowed: must outlive it) from u
 * into c, using loop through ops.  Caller frees. */
int fetch_session_new(fetch_upstream *u, cache *c, const manifest *m, const fetch_loop_ops *ops,
                      void *loop, fetch_session **out, shoal_err *err);
void fetch_session_free(fetch_session *s);

void fetch_session_on_progress(fetch_session *s, fetch_progress_fn fn, void *ctx, long interval_ms);
void fetch_session_on_done(fetch_session *s, fetch_done_fn fn, void *ctx);

/* Queue items (copied).  Objects already cached finish at once. */
int fetch_session_add(fetch_session *s, const fetch_item *items, size_t n, shoal_err *err);

/* Change the priority of the unfinished item (file, offset, length): its
 * parts not yet started are then served as prio.  SHOAL_ENOTFOUND when
 * no such item is unfinished.  Not from inside a session callback. */
int fetch_session_set_priority(fetch_session *s, uint32_t file, uint64_t offset, uint64_t length,
                               int prio);

/* Cancel the unfinished item (file, offset, length): its parts not yet
 * started are dropped, its running parts stopped, its writer paused (the
 * contiguous prefix is kept for a later resume), and its done callback
 * fires with SHOAL_ECANCELED before this returns.  Other items go on.
 * SHOAL_ENOTFOUND when no such item is unfinished.  Not from inside a
 * session callback. */
int fetch_session_cancel(fetch_session *s, uint32_t file, uint64_t offset, uint64_t length);

/* Loop callbacks. */
void fetch_session_io(fetch_session *s, int fd, unsigned what);
void fetch_session_timeout(fetch_session *s);

/* 1 when nothing is queued, running or waiting. */
int fetch_session_idle(const fetch_session *s);
/* 0, or the first fatal error (too many failures, disk full, not found,
 * refused credentials ...) with its message.  After a fatal error the
 * session stops: running writes are paused (resumable), the queue dropped. */
int fetch_session_status(const fetch_session *s, shoal_err *err);
/* Stop now (Ctrl-C): pause the writers so a later run resumes, drop the
 * queue.  The status becomes SHOAL_ECANCELED. */
void fetch_session_stop(fetch_session *s);

/* ---- the blocking loop ---------------------------------------------------------------- */

typedef struct fetch_poll fetch_poll;

/* A poll(2) loop implementing fetch_loop_ops, for tools and tests. */
int fetch_poll_new(fetch_poll **out, shoal_err *err);
void fetch_poll_free(fetch_poll *p);
const fetch_loop_ops *fetch_poll_ops(void);
/* Run s until it is idle, it fails, or *stop becomes non-zero (then the
 * session is stopped).  Returns fetch_session_status(). */
int fetch_poll_run(fetch_poll *p, fetch_session *s, volatile sig_atomic_t *stop, shoal_err *err);

#endif
