/* cache.h — shoal's blob cache: objects on disk, indexed by SQLite.
 *
 * Owns: one cache directory (blobs/, tmp/, index.db, lock), the write path
 * (begin, append, commit/abort/pause), lookups that hand out descriptors,
 * the byte budget and eviction, pins, request counters and sessions,
 * checksum verification, repair at open, and the per-file / per-model
 * metadata the fetcher keeps (etag, size, CDN location, commit).
 * Does not own: the network, the event loop, scheduling or single-flight
 * (the daemon composes this library), or the engine's RAM tier (it only
 * reports counters here, with tier = CACHE_TIER_RAM).
 *
 * On-disk format, invariants and the eviction policy: docs/cache-format.md.
 *
 * Threads (docs/cache-format.md, "Threads"):
 *   1. A handle is used by one thread at a time.
 *   2. In shoald the writer handle belongs to the loop thread.  A worker
 *      thread never calls it (one exception, rule 4); it opens a side
 *      handle of its own (cache_config.read_only = CACHE_OPEN_SIDE): its
 *      own SQLite connection, which in WAL mode reads a consistent
 *      snapshot while the writer commits.  On it a worker reads everything
 *      (lookups, lists, verify scans, reports) and checkpoints the WAL,
 *      and writes no row: a write takes SQLite's write lock, and a writer
 *      that finds it taken sleeps in the busy handler (0.87 s measured
 *      while a K3 build recorded 94 resolutions).  What a worker would
 *      record, it hands back (cache_files_put in one transaction).
 *   3. Whatever changes objects — begin and commit, pins, eviction,
 *      removal — is the writer's, on the loop thread, in steps of one
 *      short transaction (cache_verify_remove, cache_gc_step), from
 *      results a worker handed back.
 *   4. A writer's bytes may be produced on another thread: the loop
 *      begins it, hands it over, and takes it back for commit or abort;
 *      meanwhile it calls nothing on it, and the worker calls only
 *      cache_writer_allocate, cache_writer_open_fd and cache_writer_adopt,
 *      which touch the writer's own file and hash, never the index, the
 *      budget or the table.
 * Several processes may open the same directory read-only beside the one
 * writer.  No function here prints; diagnostics go through common/log.h.
 *
 * Errors: 0 or a negative SHOAL_E* code, with detail in `err` (may be NULL).
 */
#ifndef SHOAL_CACHE_H
#define SHOAL_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"

typedef struct cache cache;
typedef struct cache_writer cache_writer;

/* What an object is.  The value is stored in the index: never renumber. */
typedef enum cache_kind {
    CACHE_KIND_EXPERT  = 0,   /* one routed expert's span */
    CACHE_KIND_SPINE   = 1,   /* one non-expert tensor */
    CACHE_KIND_SMALL   = 2,   /* a whole small file (config, tokenizer) */
    CACHE_KIND_DERIVED = 3,   /* made here from other objects (int8 pack) */
    CACHE_KIND_COUNT_  = 4
} cache_kind;

#define CACHE_PIN_KIND(k) (1u << (k))

/* Where a counted request was served.  Stored: never renumber. */
typedef enum cache_tier {
    CACHE_TIER_DISK = 0,      /* this cache (the daemon) */
    CACHE_TIER_RAM  = 1,      /* the engine's own RAM tier, via REPORT */
    CACHE_TIER_COUNT_ = 2
} cache_tier;

/* Object identity: a byte range of an upstream file.  For a derived object
 * `etag` names its source and format ("<etag>:<off>:<len>|int8v1"). */
typedef struct cache_key {
    const char *etag;         /* borrowed; 1..CACHE_ETAG_MAX bytes */
    uint64_t    offset;
    uint64_t    length;       /* > 0 */
} cache_key;

#define CACHE_ETAG_MAX 256

/* The names that make an object findable.  Every field may be NULL / -1.
 * The model is (endpoint, repo, revision, commit). */
typedef struct cache_names {
    const char *endpoint;
    const char *repo;
    const char *revision;
    const char *commit;
    const char *file;         /* path inside the repo */
    const char *tensor;       /* tensor name (spine) */
    int32_t     layer;        /* -1: none */
    int32_t     expert;       /* -1: none */
} cache_names;

#define CACHE_NAMES_NONE { NULL, NULL, NULL, NULL, NULL, NULL, -1, -1 }

typedef struct cache_config {
    /* Byte budget.  0 = default: free_share of (free space + what the cache
     * already holds), but never leaving less than floor_bytes free. */
    uint64_t max_bytes;
    double   free_share;      /* default 0.90 */
    uint64_t floor_bytes;     /* default 10 GiB */
    /* 1: refuse (SHOAL_EINVAL, with the figures) a max_bytes larger than
     * the disk can give: its free space + what the cache holds.  shoald
     * sets it; tests that want a budget past a small disk leave it 0. */
    int      budget_fits_disk;
    uint32_t pin_kinds;       /* CACHE_PIN_KIND bits; default spine|small */
    /* 0: the writer.  CACHE_OPEN_READER: beside a writer, no lock, no
     * repair, nothing written.  CACHE_OPEN_SIDE: a worker thread's handle
     * beside its own process's writer: as a reader, and it can checkpoint
     * the WAL ("Threads" above). */
    int      read_only;
    /* Counter flushes: due after this many recorded events or this many
     * milliseconds since the last flush, whichever comes first. */
    uint32_t flush_events;    /* default 4096 */
    uint32_t flush_ms;        /* default 2000 */
    /* A long write is made durable (fsync + row) every this many bytes so a
     * crash can resume from there.  Default 64 MiB. */
    uint64_t checkpoint_bytes;
    /* Partial writes older than this are dropped at open (nobody came back
     * for them; their bytes are not in the budget).  Default 7 days; 0:
     * keep them for ever. */
    uint32_t partial_max_age_s;
    /* A file of this size is kept allocated in the cache directory and
     * given back when the disk is so full that the index cannot record a
     * deletion, so a full disk can always be emptied.  Default 1 MiB. */
    uint64_t reserve_bytes;
    /* 0 (default): fsync every blob before it becomes visible.  1: skip the
     * fsyncs (bulk imports and benchmarks; a power loss may then lose
     * recent objects — recovery still drops them, verify catches them). */
    int      no_fsync;
    /* 0 (default): the writer's SQLite connection checkpoints its WAL
     * itself when it grows (an fsync of index.db on the writer's thread,
     * which waits behind every other write of the disk: 0.3 s while a PUT
     * streams GBs).  1: it never does; the owner calls
     * cache_wal_checkpoint() now and then from another thread, on a side
     * handle (shoald: a worker every 2 s). */
    int      manual_wal_checkpoint;
} cache_config;

enum { CACHE_OPEN_READER = 1, CACHE_OPEN_SIDE = 2 };

/* Copy the WAL's committed frames into index.db and sync it, without
 * waiting for the writer or for readers (SQLite's PASSIVE checkpoint).  On
 * a side handle or the writer; a reader cannot.  0, or SHOAL_EBUSY when
 * another checkpoint runs. */
int cache_wal_checkpoint(cache *c, shoal_err *err);

/* Fill cfg with the defaults above.  Cannot fail. */
void cache_config_default(cache_config *cfg);

/* What the repair at open found and did. */
typedef struct cache_open_report {
    uint64_t objects;            /* rows kept */
    uint64_t bytes;              /* their total length */
    uint64_t tmp_removed;        /* tmp/ files with no usable partial */
    uint64_t partials_kept;      /* resumable partial writes */
    uint64_t partials_dropped;   /* partial rows whose file was unusable */
    uint64_t orphans_removed;    /* blobs without a row */
    uint64_t rows_missing;       /* rows whose blob was gone (dropped) */
    uint64_t rows_bad_size;      /* rows whose blob had the wrong size */
    uint64_t scan_ns;            /* time the repair took */
} cache_open_report;

/* Open (creating if needed) the cache in `dir`.  A writer takes dir/lock;
 * if another process holds it this fails with SHOAL_ELOCKED and a message
 * naming that pid.  A writer repairs the directory first (report filled
 * when not NULL).  Read-only opens need an existing index.  On failure
 * *out is NULL and nothing is left open. */
int cache_open(const char *dir, const cache_config *cfg, cache **out,
               cache_open_report *report, shoal_err *err);

/* Flush counters, close everything, release the lock.  Active writers are
 * aborted (their partial files are kept if checkpointed).  Accepts NULL. */
void cache_close(cache *c);

/* ---- write path ---------------------------------------------------------- */

/* Start (or resume) writing the object `key`.  Reserves key->length bytes
 * of the budget, evicting first if needed; fails with SHOAL_ENOSPC (and
 * changes nothing) when it cannot fit even after evicting every unpinned
 * object.  SHOAL_EEXIST if the object is already cached (add names with
 * cache_names_add), SHOAL_EBUSY if a writer for it is active.  If a
 * paused or checkpointed partial write exists it continues from its
 * durable length: see cache_writer_offset().  The names are copied. */
int cache_write_begin(cache *c, const cache_key *key, cache_kind kind,
                      const cache_names *names, cache_writer **out, shoal_err *err);

/* cache_write_begin with flags: CACHE_BEGIN_NO_ALLOC leaves the file's
 * blocks unallocated (fallocate of tens of GB takes ~0.1 s); the thread
 * that fills the writer calls cache_writer_allocate first. */
enum { CACHE_BEGIN_NO_ALLOC = 1 };
int cache_write_begin_flags(cache *c, const cache_key *key, cache_kind kind,
                            const cache_names *names, unsigned flags, cache_writer **out,
                            shoal_err *err);

/* ---- filling a writer from another thread or process (rule 4) ----------
 * These three touch only the writer's tmp file and hash, so a worker may
 * call them while the thread that began w waits. */

/* Allocate the file's blocks (fallocate, KEEP_SIZE): SHOAL_ENOSPC when the
 * disk cannot hold the object.  A no-op when begin allocated already. */
int cache_writer_allocate(cache_writer *w, shoal_err *err);

/* A new descriptor of the tmp file, opened with `flags` (O_WRONLY: for a
 * client to fill it; close-on-exec).  Caller closes. */
int cache_writer_open_fd(cache_writer *w, int flags, int *fd, shoal_err *err);

/* Progress of a long cache operation: done of total (bytes); a nonzero
 * return asks it to stop (SHOAL_ECANCELED). */
typedef int (*cache_progress_fn)(void *ctx, uint64_t done, uint64_t total);

/* The tmp file holds the whole object, written through another descriptor
 * (cache_writer_open_fd): check that it is exactly the key's length
 * (SHOAL_ERANGE saying what it holds), hash it in order from the prefix on
 * into the writer's XXH3-128, and fsync it (unless no_fsync), so that a
 * commit only renames and records.  fn (may be NULL) every 4 MiB.  On
 * failure the writer can only be aborted. */
int cache_writer_adopt(cache_writer *w, cache_progress_fn fn, void *ctx, shoal_err *err);

/* The writer's XXH3-128 so far, canonical (a commit stores the final
 * one): the hash of the prefix. */
void cache_writer_xxh(const cache_writer *w, uint8_t out[16]);

/* The contiguous prefix written so far (where the next append lands:
 * resume from here).  Bytes written ahead by cache_write_at are not
 * counted until the prefix reaches them. */
uint64_t cache_writer_offset(const cache_writer *w);

/* Append n bytes (any size; never held in memory): cache_write_at at
 * cache_writer_offset().  SHOAL_ERANGE past the key's length.  On an I/O
 * failure the writer is unusable: abort it. */
int cache_write_append(cache_writer *w, const void *p, size_t n, shoal_err *err);

/* Write n bytes at object position pos (several parts of one object
 * arriving out of order).  pos == cache_writer_offset() is an append;
 * bytes further on are written into the tmp file and remembered, and the
 * prefix moves over them (hashing them in order) once it reaches them.
 * SHOAL_ERANGE, and nothing written, when any byte of [pos, pos+n) was
 * written already (the prefix or an earlier write_at) or lies past the
 * length.  Only the prefix is durable: a pause, checkpoint or crash keeps
 * cache_writer_offset() bytes and loses what lay ahead.  On an I/O failure
 * the writer is unusable: abort it. */
int cache_write_at(cache_writer *w, uint64_t pos, const void *p, size_t n, shoal_err *err);

/* ---- syncing off the owner's thread (shoald's loop never waits on one) ----
 * A writer's fsyncs are the slow part of writing it (~11 ms for a 17.55 MB
 * K3 expert here, hundreds behind another writer's GBs).  An owner with
 * other threads takes them off its own: */

/* Checkpoints of w become the owner's: cache_write_at no longer fdatasyncs
 * every checkpoint_bytes, it only notes that one is due. */
void cache_writer_defer_checkpoints(cache_writer *w);
/* 1 once per due checkpoint, with the prefix to make durable and the
 * writer's id: the owner fdatasyncs a descriptor of the file
 * (cache_writer_open_fd) with cache_sync_fd on another thread, then calls
 * cache_checkpoint_record on its own. */
int cache_writer_checkpoint_due(cache_writer *w, uint64_t *durable, uint64_t *writer_id);
/* Record that writer_id's first `durable` bytes are on disk (its partial
 * row), if that writer is still active and its row says less; 0 and
 * nothing done when it was committed, paused or aborted meanwhile. */
int cache_checkpoint_record(cache *c, uint64_t writer_id, uint64_t durable, shoal_err *err);
/* fdatasync(fd) unless the cache is no_fsync.  Any thread. */
int cache_sync_fd(const cache *c, int fd, shoal_err *err);
/* Rule 4: fsync the tmp file of a writer whose every byte is written, so
 * that cache_write_commit only renames and records.  Another thread may
 * call it while the owner leaves w alone. */
int cache_writer_sync(cache_writer *w, shoal_err *err);

/* Finish: fsync, rename into blobs/, insert the index row in one
 * transaction.  Always consumes the writer.  On failure the temporary file
 * is removed and the index is as before the call.  id_out may be NULL. */
int cache_write_commit(cache_writer *w, uint64_t *id_out, shoal_err *err);

/* Drop the write and its temporary file.  Accepts NULL. */
void cache_write_abort(cache_writer *w);

/* Stop for now but keep what was written (fsync + partial row), so a later
 * cache_write_begin of the same key — in this process or after a restart —
 * continues from here.  Always consumes the writer. */
int cache_write_pause(cache_writer *w, shoal_err *err);

/* Add names (another revision, model or file path) to a cached object. */
int cache_names_add(cache *c, const cache_key *key, const cache_names *names,
                    shoal_err *err);

/* ---- read path ----------------------------------------------------------- */

/* Who asks, for counting.  Any field may be -1 (session, model: 0). */
typedef struct cache_req {
    uint64_t session;         /* from cache_session_open, 0: none */
    int64_t  model;           /* from cache_model_put, 0: none */
    int32_t  layer;
    int32_t  expert;
    cache_tier tier;
} cache_req;

typedef struct cache_obj {
    int        fd;            /* O_RDONLY, close-on-exec; caller closes */
    uint64_t   length;        /* the blob is [0, length) of fd */
    uint64_t   id;
    cache_kind kind;
    int        pinned;        /* effective: per object or per kind */
    uint8_t    xxh128[16];    /* canonical (big-endian) XXH3-128 */
} cache_obj;

/* Look `key` up.  0 with out filled (a hit), or SHOAL_ENOTFOUND (a miss).
 * With req, the hit or miss and bytes out are counted in memory (joins,
 * wait time and bytes in are the caller's: cache_stats_add).  Never waits
 * for an SQLite write.  The descriptor stays valid after eviction. */
int cache_lookup(cache *c, const cache_key *key, const cache_req *req,
                 cache_obj *out, shoal_err *err);

/* The first cached object of this kind whose etag starts with `prefix`
 * (derived objects: their etag names their source and format, so a
 * prefix asks "is any version of it cached?").  0 with *out filled (its
 * etag copied into etag, cap >= CACHE_ETAG_MAX + 1) or SHOAL_ENOTFOUND.
 * A writer scans its table in memory (K3's 82,432 objects: ~1 ms). */
int cache_find_prefix(cache *c, const char *prefix, cache_kind kind, cache_key *out, char *etag,
                      size_t cap, shoal_err *err);
/* The length of the cached object (etag, offset, ?) when there is one:
 * an indexed query, for keys whose length the asker does not know (a
 * derived object by name).  SHOAL_ENOTFOUND otherwise.  Any handle. */
int cache_lookup_length(cache *c, const char *etag, uint64_t offset, uint64_t *length,
                        shoal_err *err);

/* Where unlinks of blobs and of aborted tmp files go.  By default they are
 * done at once; shoald hands them to a worker, because freeing a large
 * file's extents takes long (0.2 s for 58 GB here).  fn gets a copy of the
 * path and must unlink it soon; the index no longer names the file
 * (invariant 7), so a crash before it leaves only what the repair at open
 * removes.  NULL restores the default.  (When the disk is so full that a
 * deletion needs the reserve, the blobs are unlinked at once anyway, so the
 * reserve can be taken back.) */
typedef void (*cache_unlink_fn)(const char *path, void *ctx);
void cache_set_unlinker(cache *c, cache_unlink_fn fn, void *ctx);

/* Called by the writer's thread after every object it commits (etag
 * borrowed for the call), so the owner can check the object's file once
 * it is complete (shoald: daemon/integrity.c).  It must not call back
 * into the cache.  NULL: none. */
typedef void (*cache_commit_fn)(void *ctx, const char *etag, int kind, uint64_t offset,
                                uint64_t length);
void cache_set_commit_hook(cache *c, cache_commit_fn fn, void *ctx);

/* Pin or unpin one object (pinned objects are never evicted). */
int cache_pin(cache *c, const cache_key *key, int on, shoal_err *err);

/* Lift (lift = 1) or restore (0) the pin n objects have by their kind,
 * in one transaction.  A lifted object is evictable like any unpinned one
 * and stays until space is needed — the BF16 spine matrices a derived pack
 * replaces (shoald, docs/daemon.md).  Objects pinned by cache_pin stay
 * pinned; keys not cached are skipped.  *changed (may be NULL): objects
 * whose state changed.  Stored (objects.pinned = 2). */
int cache_pin_lift(cache *c, const cache_key *keys, size_t n, int lift, size_t *changed,
                   shoal_err *err);

/* Restore the kind pin of every lifted object (shoald --keep-spine). */
int cache_pin_lift_clear(cache *c, size_t *changed, shoal_err *err);

/* What storing a selection of objects would do to the budget: every warm
 * job is planned before it starts, and `shoal warm --dry-run` shows it. */
typedef struct cache_plan {
    uint64_t budget, used, reserved, pinned;   /* now */
    uint64_t held_back;            /* the caller's: bytes other plans still fetch */
    uint64_t objects, bytes;       /* the selection */
    uint64_t cached_objects, cached_bytes;     /* already cached: kept */
    uint64_t kept;                 /* of those, the unpinned bytes (they take room) */
    uint64_t fetch_objects, fetch_bytes;       /* to fetch: they fit */
    uint64_t over_objects, over_bytes;         /* would not fit */
    uint64_t over_pinned;          /* of those, objects pinned by kind (spine, small) */
    uint64_t room;                 /* for the selection's new objects: budget - pinned
                                      - reserved - held_back - kept */
    uint64_t evict_objects, evict_bytes;       /* what making room takes */
    uint64_t evict_kind[CACHE_KIND_COUNT_];    /* ... its bytes by kind */
} cache_plan;

/* fate[i] of a plan (may be NULL). */
enum { CACHE_PLAN_OVER = 0, CACHE_PLAN_FETCH = 1, CACHE_PLAN_CACHED = 2 };

/* Plan storing keys[0..n) (kinds[i]: what each would be; NULL: experts),
 * in priority order: the objects not cached take the room in that order
 * and the first that does not fit ends the fitting part (so a trimmed
 * selection is a prefix: the hottest experts first).  Eviction is what
 * the policy would take to make room — the least valuable unpinned
 * objects outside the selection.  touch: refresh the access time of the
 * selection's cached objects, so evictions while it is fetched take
 * others first.  Needs a writer; changes nothing else. */
int cache_plan_make(cache *c, const cache_key *keys, const cache_kind *kinds, size_t n,
                    uint64_t held_back, int touch, cache_plan *out, uint8_t *fate,
                    shoal_err *err);

/* Remove one object now.  SHOAL_ENOTFOUND if absent. */
int cache_remove(cache *c, const cache_key *key, shoal_err *err);

typedef struct cache_usage {
    uint64_t budget;
    uint64_t used;            /* committed objects */
    uint64_t reserved;        /* active writers */
    uint64_t pinned;          /* bytes of pinned objects */
    uint64_t lifted;          /* bytes whose kind pin is lifted (cache_pin_lift) */
    uint64_t objects;
    uint64_t evicted;         /* objects evicted since open */
    uint64_t evicted_bytes;
    /* writer handles only (memory, as the rest): bytes of upstream objects
     * whose whole file matched its upstream hash, and of those only
     * checked on transfer (derived objects are in neither) */
    uint64_t verified, trusted;
} cache_usage;

int cache_usage_get(cache *c, cache_usage *out, shoal_err *err);

/* One object with one of its names, for listings. */
typedef struct cache_entry {
    uint64_t   id;
    const char *etag;         /* borrowed for the callback's duration */
    uint64_t   offset, length;
    cache_kind kind;
    int        pinned;
    int64_t    model;         /* 0 if unnamed */
    const char *file, *tensor;
    int32_t    layer, expert;
    int64_t    last_access_ms;
    uint64_t   hits;
} cache_entry;

/* Calls fn once per (object, name) — objects without names once — of
 * `model` (0: all).  fn returns 0 to go on; another value stops the walk
 * and is returned. */
typedef int (*cache_entry_fn)(const cache_entry *e, void *ctx);
int cache_list(cache *c, int64_t model, cache_entry_fn fn, void *ctx, shoal_err *err);

/* ---- verify ---------------------------------------------------------------- */

typedef struct cache_verify_report {
    uint64_t checked;
    uint64_t bytes;
    uint64_t bad;             /* wrong checksum or size: removed */
    uint64_t missing;         /* blob gone: row removed */
} cache_verify_report;

/* Recompute the checksum of every object (model 0) or of a model's.  A bad
 * object is logged, reported and removed, so it is never served again.
 * Needs a writer handle: it is cache_verify_scan then cache_verify_remove. */
int cache_verify(cache *c, int64_t model, cache_verify_report *rep, shoal_err *err);

/* What a scan found wrong: object ids, and whether each was missing (no
 * blob) rather than bad (wrong size or checksum). */
typedef struct cache_verify_list {
    uint64_t *ids;
    uint8_t  *missing;
    size_t    n, cap;
} cache_verify_list;
void cache_verify_list_free(cache_verify_list *l);

/* The half of verify that reads: hash the blob of every object of the
 * models matching `spec` (NULL or "": every object) and add the counts to
 * rep and the failures to bad, removing nothing.  Any handle (a worker's
 * side handle: rule 2); the object list is read first, in one short
 * query, so no snapshot is held while blobs are read.  fn: bytes hashed of
 * the total.  SHOAL_ENOTFOUND when spec matches no model. */
int cache_verify_scan(cache *c, const char *spec, cache_verify_report *rep,
                      cache_verify_list *bad, cache_progress_fn fn, void *ctx, shoal_err *err);

/* The half that writes (the writer, its thread): remove bad->ids[from ..
 * from + n) that are still cached (an object evicted since the scan is
 * skipped, and not counted: *gone_bad / *gone_missing (may be NULL) are
 * incremented for those, so the caller can correct the scan's counts).
 * One transaction. */
int cache_verify_remove(cache *c, const cache_verify_list *bad, size_t from, size_t n,
                        uint64_t *gone_bad, uint64_t *gone_missing, shoal_err *err);

/* ---- counters and sessions ---------------------------------------------------- */

typedef enum cache_outcome {
    CACHE_HIT = 0, CACHE_MISS = 1, CACHE_JOIN = 2, CACHE_NONE = 3  /* NONE: bytes/wait only */
} cache_outcome;

typedef struct cache_counts {
    uint64_t hits, misses, joins;
    uint64_t bytes_in, bytes_out;
    uint64_t wait_ns;
} cache_counts;

/* hits / (hits + misses + joins), 0 when there were no requests. */
double cache_counts_hit_rate(const cache_counts *c);

/* Open a session for a client (pid, program name).  One SQLite write, at
 * connect time. */
int cache_session_open(cache *c, int64_t pid, const char *program,
                       uint64_t *session, shoal_err *err);
int cache_session_close(cache *c, uint64_t session, shoal_err *err);

/* Count one event in memory (no SQLite write).  A read-only handle cannot
 * flush, so it counts nothing (readers report through the daemon). */
void cache_stats_add(cache *c, const cache_req *req, cache_outcome outcome,
                     uint64_t bytes_in, uint64_t bytes_out, uint64_t wait_ns);

/* Add a batch of counts at once (a client's report, or a fixture): the
 * same rows as cache_stats_add, n's fields added as they are; one event
 * towards the flush threshold. */
void cache_stats_add_counts(cache *c, const cache_req *req, const cache_counts *n);

/* One tier's totals counted by this handle since it was opened, from
 * memory (no SQLite): the daemon's /metrics.  Zeros for a reader. */
void cache_stats_since_open(const cache *c, int tier, cache_counts *out);

/* Nonzero when enough events or time have gathered for a flush. */
int cache_flush_due(const cache *c);
/* A daemon's cache (budget_fits_disk): recompute the budget from the free
 * disk space now (the default share, or --max-size cut to what the disk
 * can give); the next write evicts down to it.  Cheap (one statvfs). */
int cache_budget_refresh(cache *c, shoal_err *err);

/* Write pending counters and access times in one transaction.  The daemon
 * calls it from a timer; commits and close also flush when due. */
int cache_flush(cache *c, shoal_err *err);

/* Experts of `model` by requests (hits + misses + joins, both tiers, every
 * count so far), most first (ties: lower layer, then lower id); experts
 * never asked for are left out.  max 0: all.  *out (caller frees) holds
 * *n rows.  A writer ranks from a table kept in memory (no SQLite: K3's
 * 82,432 experts in a few ms); a reader asks the index. */
typedef struct cache_heat {
    int32_t  layer, expert;
    uint64_t requests;
} cache_heat;
int cache_heat_top(cache *c, int64_t model, size_t max, cache_heat **out, size_t *n,
                   shoal_err *err);

typedef enum cache_stats_level {
    CACHE_STATS_TOTAL = 0,    /* one row per tier */
    CACHE_STATS_SESSION,      /* per session and tier */
    CACHE_STATS_MODEL,        /* per model and tier */
    CACHE_STATS_LAYER,        /* per (model, layer) and tier */
    CACHE_STATS_EXPERT        /* per (model, layer, expert) and tier */
} cache_stats_level;

typedef struct cache_stats_row {
    uint64_t   session;       /* CACHE_STATS_SESSION */
    int64_t    model;         /* MODEL, LAYER, EXPERT */
    int32_t    layer, expert;
    cache_tier tier;
    cache_counts counts;
    /* Sessions only (borrowed for the callback's duration): */
    int64_t    pid;
    const char *program;
    int64_t    started_ms, ended_ms;   /* ended 0: still open */
} cache_stats_row;

typedef int (*cache_stats_fn)(const cache_stats_row *row, void *ctx);

/* Walk flushed counters at `level`, restricted to `model` (0: all).  A
 * writer flushes first, so the figures include everything counted. */
int cache_stats_query(cache *c, cache_stats_level level, int64_t model,
                      cache_stats_fn fn, void *ctx, shoal_err *err);

/* Sum over tiers (tier -1) or of one tier at CACHE_STATS_TOTAL. */
int cache_stats_total(cache *c, int tier, cache_counts *out, shoal_err *err);

/* ---- upstream metadata (for the fetcher) ------------------------------------ */

#define CACHE_STR_MAX 1024
#define CACHE_URL_MAX 4096

/* Record that (endpoint, repo, revision) resolved to `commit` now; *id gets
 * the model's id (stable for that commit).  Strings are copied. */
int cache_model_put(cache *c, const char *endpoint, const char *repo,
                    const char *revision, const char *commit, int64_t *id,
                    shoal_err *err);

typedef struct cache_model {
    int64_t id;
    char    endpoint[CACHE_STR_MAX];
    char    repo[CACHE_STR_MAX];
    char    revision[CACHE_STR_MAX];
    char    commit[CACHE_STR_MAX];
    int64_t resolved_ms;
} cache_model;

/* The latest commit (endpoint, repo, revision) resolved to.  SHOAL_ENOTFOUND
 * if never recorded. */
int cache_model_get(cache *c, const char *endpoint, const char *repo,
                    const char *revision, cache_model *out, shoal_err *err);

/* What the fetcher knows of one upstream file at one commit. */
typedef struct cache_file {
    char     endpoint[CACHE_STR_MAX];
    char     repo[CACHE_STR_MAX];
    char     commit[CACHE_STR_MAX];
    char     path[CACHE_STR_MAX];
    char     etag[CACHE_ETAG_MAX + 1];
    uint64_t size;
    char     location[CACHE_URL_MAX];    /* CDN URL, "" if none */
    int64_t  location_expires_ms;        /* 0: unknown */
    int64_t  updated_ms;                 /* set by cache_file_put */
} cache_file;

/* Insert or replace the record for (endpoint, repo, commit, path). */
int cache_file_put(cache *c, const cache_file *f, shoal_err *err);
/* n records in one transaction (what a worker resolved, written by the
 * writer's thread in one step). */
int cache_files_put(cache *c, const cache_file *f, size_t n, shoal_err *err);
/* SHOAL_ENOTFOUND if absent. */
int cache_file_get(cache *c, const char *endpoint, const char *repo,
                   const char *commit, const char *path, cache_file *out,
                   shoal_err *err);

/* ---- reports and maintenance for tools (report.c, deep.c, maint.c) --------
 *
 * What `shoal` shows and does, built here so the daemon (live, through the
 * socket) and the CLI (on the index, read-only, when no daemon runs) give
 * the same answer.  The JSON schemas are in docs/stats-json.md.
 */

/* The file name under which the fetcher records a model's manifest
 * (fetcher/fetch.h FETCH_MANIFEST_PATH): a derived object named by it. */
#define CACHE_MANIFEST_FILE ".shoal/manifest-v1"

/* Every model the index knows, by id.  The record is borrowed for the
 * callback's duration; fn returns 0 to go on. */
typedef int (*cache_model_fn)(const cache_model *m, void *ctx);
int cache_models_list(cache *c, cache_model_fn fn, void *ctx, shoal_err *err);

/* Does model m answer to `spec`?  Specs: "hf://org/name[@rev]",
 * "org/name[@rev]" (any endpoint), or an absolute directory (a local
 * snapshot).  NULL or "" matches every model.  1 or 0. */
int cache_model_matches(const cache_model *m, const char *spec);

typedef enum cache_report_by {
    CACHE_REPORT_BY_NONE = 0,  /* totals, models, layers, recent sessions */
    CACHE_REPORT_BY_LAYER,     /* + a row per (model, layer) (the default adds
                                  them too; this names the intent) */
    CACHE_REPORT_BY_EXPERT,    /* + a row per (model, layer, expert) */
    CACHE_REPORT_BY_SESSION    /* every session, not only the recent ones */
} cache_report_by;

/* What only a running daemon knows (upstream transfers since it started).
 * A reader of the index passes NULL. */
typedef struct cache_report_live {
    int64_t  started_ms;           /* when the daemon started */
    uint64_t transfers_started, transfers_completed, transfers_failed;
    uint64_t upstream_bytes;       /* bytes received from upstream */
    uint64_t upstream_ns;          /* summed transfer durations */
    uint32_t clients;              /* connections now */
    uint32_t jobs_running;         /* warm jobs not finished */
} cache_report_live;

typedef struct cache_report_opts {
    const char *model;             /* a spec (cache_model_matches), NULL: all */
    cache_report_by by;
    unsigned    max_sessions;      /* most recent sessions listed; 0: 10 */
    const char *source;            /* "daemon" or "index"; NULL: "index" */
    uint64_t    budget;            /* the daemon's budget; 0: unknown (reader)
                                      or take it from cache_usage_get */
    const cache_report_live *live; /* may be NULL */
} cache_report_opts;

/* The stats report (docs/stats-json.md, "shoal.stats" schema 1) as one
 * JSON object appended to out.  Works on a writer (counters are flushed
 * first) and on a read-only handle.  SHOAL_ENOTFOUND when a model spec
 * matches no model. */
int cache_report_stats(cache *c, const cache_report_opts *o, shoal_buf *out, shoal_err *err);

/* The models listing (`shoal ls`, "shoal.models" schema 1): per model its
 * revision, commit, cached bytes and objects, and — when its manifest is
 * cached — coverage: experts cached of the total, spine tensors cached of
 * the total. */
int cache_report_models(cache *c, const char *spec, shoal_buf *out, shoal_err *err);

/* Append the encoded manifest (common/manifest.h: manifest_decode) of the
 * newest model matching `spec` that has one cached.  SHOAL_ENOTFOUND
 * otherwise. */
int cache_model_manifest(cache *c, const char *spec, shoal_buf *out, shoal_err *err);

/* Whole-file check: for every upstream file of the matching models whose
 * every byte is cached (its objects' ranges cover [0, size)), hash the
 * bytes in order and compare with the etag: 64 hex digits = sha256 (an LFS
 * file), 40 = a git blob sha1 (small files).  Read-only handles work.
 * Nothing is removed (a bad file means upstream sent bytes that do not
 * hash to its etag: the objects' own checksums already passed). */
typedef struct cache_deep_report {
    uint64_t files;                /* files known for the models */
    uint64_t complete;             /* every byte cached */
    uint64_t ok, bad;              /* of the complete ones with a hash etag */
    uint64_t unhashable;           /* complete, but the etag is not a hash */
    uint64_t bytes;                /* hashed */
    uint64_t quarantined;          /* failed shoald's automatic check last time
                                      (cache_file_quarantine): listed as bad
                                      files too, "(quarantined)" */
} cache_deep_report;

/* A file that does not hash to its etag (VERIFY logs it; shoald's own
 * automatic checks quarantine: cache_file_check_run below).  Borrowed
 * strings. */
typedef void (*cache_bad_file_fn)(void *ctx, const char *path, const char *etag);

typedef struct cache_deep_opts {
    cache_progress_fn progress;    /* bytes hashed of the complete files' */
    cache_bad_file_fn on_bad;
    void *ctx;                     /* for both */
} cache_deep_opts;

/* bad_files (may be NULL) gets the repo path of each bad file, one per
 * line.  opts may be NULL.  Any handle (a worker's side handle too): the
 * file list and each file's ranges are read in short queries before the
 * blobs are hashed. */
int cache_verify_deep(cache *c, const char *spec, const cache_deep_opts *opts,
                      cache_deep_report *rep, shoal_buf *bad_files, shoal_err *err);

/* ---- automatic whole-file checks (deep.c) -----------------------------------
 *
 * shoald checks each upstream file against its etag's hash as soon as its
 * every byte is cached: cache_file_check on a worker's side handle, then
 * on the writer cache_file_verified (objects marked verified) or
 * cache_file_quarantine (the file's objects removed, the failure kept in
 * the index so `shoal verify --deep` and `shoal stats` name it).
 * docs/cache-format.md "Integrity".
 */
typedef struct cache_file_check {
    int      known;            /* a file record has this etag */
    int      complete;         /* every byte cached */
    int      hashable;         /* the etag is a sha256 / git sha1 */
    int      already;          /* complete, and every object verified already */
    int      result;           /* 1 match, 0 mismatch, -1 not checked */
    char     path[CACHE_STR_MAX];  /* of the file record (its first model) */
    char     repo[CACHE_STR_MAX];
    char     commit[CACHE_STR_MAX];
    uint64_t size;
    uint64_t bytes;            /* hashed */
    cache_verify_list objs;    /* match: the objects hashed; mismatch: every
                                  object of the etag but a shard's header
                                  range (to quarantine) */
} cache_file_check;

/* Check the file whose etag is `etag` (any handle; short queries, then the
 * blobs hashed with no snapshot held).  A blob that vanished meanwhile
 * (evicted) makes the file incomplete, not bad.  fn: bytes hashed of the
 * file's size.  cache_verify_list_free(&out->objs) after. */
int cache_file_check_run(cache *c, const char *etag, cache_progress_fn fn, void *ctx,
                         cache_file_check *out, shoal_err *err);

/* Writer: mark the objects of a match verified (those still cached) and
 * the file's failure record, if any, as checked ok.  One transaction. */
int cache_file_verified(cache *c, const char *etag, const cache_verify_list *objs,
                        shoal_err *err);

/* Writer: remove the objects of a mismatch (those still cached) and count
 * the failure for etag; *failures (may be NULL) gets the file's count so
 * far, *bytes (may be NULL) the bytes removed.  One transaction. */
int cache_file_quarantine(cache *c, const char *etag, const char *path, uint64_t size,
                          const cache_verify_list *objs, uint64_t *failures, uint64_t *bytes,
                          shoal_err *err);

/* What the index says of integrity (any handle; an index made before these
 * records reads as zeros). */
typedef struct cache_integrity {
    uint64_t verified_objects, verified_bytes;   /* matched a whole-file hash */
    uint64_t trusted_objects, trusted_bytes;     /* upstream objects not (yet) so checked:
                                                    trusted on their transfer */
    uint64_t derived_objects, derived_bytes;     /* made here */
    uint64_t bad_files;                          /* failed their last check */
    uint64_t failures;                           /* mismatches ever recorded */
    uint64_t quarantined_bytes;                  /* removed for them, summed */
} cache_integrity;
int cache_integrity_get(cache *c, cache_integrity *out, shoal_err *err);

/* Verify (cache_verify on each matching model, or all) and optionally the
 * deep check; the result as JSON ("shoal.verify" schema 1).  Needs a
 * writer.  Returns 0 even when objects were bad: the JSON says so. */
int cache_report_verify(cache *c, const char *spec, int deep, shoal_buf *out, shoal_err *err);

/* The "shoal.verify" document from results gathered elsewhere (shoald: a
 * worker's scan and deep check, the loop's removals).  deep NULL: not
 * asked.  bad_files: one path per line, or NULL. */
int cache_verify_json(cache *c, const char *spec, const cache_verify_report *objs,
                      const cache_deep_report *deep, const shoal_buf *bad_files, shoal_buf *out,
                      shoal_err *err);

/* Evict unpinned objects, least valuable first (the eviction policy), until
 * the cache holds at most max_bytes (0: the budget).  Pinned objects stay,
 * so the result may stay above; the JSON ("shoal.gc" schema 1) says how
 * much was freed and what is left.  Needs a writer; the budget is
 * unchanged afterwards. */
int cache_report_gc(cache *c, uint64_t max_bytes, shoal_buf *out, shoal_err *err);

/* The same GC in steps, so the daemon's loop serves others between them:
 * each step is one eviction round of at most step_bytes (plus the policy's
 * slack) — a sort of the candidates and one transaction.  Start with a
 * zeroed state; call until *done; then cache_gc_json.  st->freed and
 * st->goal say how far it is. */
typedef struct cache_gc_state {
    int      started;
    uint64_t target, before, evicted0, pinned;
    uint64_t goal, freed;          /* bytes to free, freed so far */
} cache_gc_state;
int cache_gc_step(cache *c, cache_gc_state *st, uint64_t max_bytes, uint64_t step_bytes,
                  int *done, shoal_err *err);
int cache_gc_json(cache *c, const cache_gc_state *st, shoal_buf *out, shoal_err *err);

/* Remove every object of the models matching `spec` (objects that another
 * model also names are kept, losing only this model's names), with the
 * models' rows, file records and counters.  JSON ("shoal.rm" schema 1).
 * SHOAL_ENOTFOUND when no model matches.  Needs a writer. */
int cache_report_rm(cache *c, const char *spec, shoal_buf *out, shoal_err *err);

/* Pin (on=1) or unpin every cached object of the matching models, or only
 * their experts of layers [layer_first, layer_last] (-1: every object).
 * *changed gets the number of objects touched. */
int cache_model_pin(cache *c, const char *spec, int on, int32_t layer_first, int32_t layer_last,
                    uint64_t *changed, shoal_err *err);

#endif
